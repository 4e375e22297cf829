// tests/test_thread_comm.hpp — a host-callback communicator among ranks that run as
// threads of one test (sa_host_comm), for the tests of collective steps.
#ifndef SHARDADAM_TESTS_TEST_THREAD_COMM_HPP_
#define SHARDADAM_TESTS_TEST_THREAD_COMM_HPP_

#include <catch2/catch.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "shardadam/shardadam.h"

namespace sa_test {

// An all-reduce among `ranks` threads. Each rank deposits its values; the last to arrive
// combines them in rank order (so every run gives the same bits) and wakes the others.
class ThreadGroup {
 public:
  explicit ThreadGroup(int ranks)
      : ranks_(ranks),
        deposits_(static_cast<std::size_t>(ranks)),
        bytes_(static_cast<std::size_t>(ranks)) {}

  int all_reduce(int rank, double* values, int32_t count, sa_reduce_op op) {
    std::unique_lock<std::mutex> lock(mutex_);
    ++calls_;
    deposits_[static_cast<std::size_t>(rank)].assign(values, values + count);
    if (++arrived_ < ranks_) {
      const uint64_t generation = generation_;
      done_.wait(lock, [&] { return generation_ != generation; });
    } else {
      result_ = deposits_[0];
      for (int r = 1; r < ranks_; ++r)
        for (int32_t i = 0; i < count; ++i) {
          const double x = deposits_[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
          double& acc = result_[static_cast<std::size_t>(i)];
          acc = op == SA_REDUCE_SUM ? acc + x : std::max(acc, x);
        }
      last_op_ = op;
      arrived_ = 0;
      ++generation_;
      done_.notify_all();
    }
    std::copy(result_.begin(), result_.begin() + count, values);
    return 0;
  }

  // An all-to-all of bytes (sa_host_comm.all_to_all): the last rank to arrive cuts every
  // rank's blocks out of the deposits. Returns 1 when a rank's send sizes are not what
  // their receivers expect.
  int all_to_all(int rank, const void* send, const int64_t* send_counts, void* recv,
                 const int64_t* recv_counts) {
    std::unique_lock<std::mutex> lock(mutex_);
    ++calls_;
    const auto me = static_cast<std::size_t>(rank), n = static_cast<std::size_t>(ranks_);
    int64_t sent = 0;
    for (std::size_t q = 0; q < n; ++q) sent += send_counts[q];
    const auto* bytes = static_cast<const unsigned char*>(send);
    bytes_[me].assign(bytes, bytes + sent);
    send_counts_.resize(n);
    recv_counts_.resize(n);
    send_counts_[me].assign(send_counts, send_counts + n);
    recv_counts_[me].assign(recv_counts, recv_counts + n);
    if (++arrived_ < ranks_) {
      const uint64_t generation = generation_;
      done_.wait(lock, [&] { return generation_ != generation; });
    } else {
      blocks_.assign(n, {});
      failed_ = false;
      for (std::size_t q = 0; q < n; ++q) {  // q's blocks, in rank order, to each receiver r
        std::size_t at = 0;
        for (std::size_t r = 0; r < n; ++r) {
          const auto count = static_cast<std::size_t>(send_counts_[q][r]);
          failed_ = failed_ || send_counts_[q][r] != recv_counts_[r][q];
          blocks_[r].insert(blocks_[r].end(), bytes_[q].begin() + static_cast<std::ptrdiff_t>(at),
                            bytes_[q].begin() + static_cast<std::ptrdiff_t>(at + count));
          at += count;
        }
      }
      arrived_ = 0;
      ++generation_;
      done_.notify_all();
    }
    if (failed_) return 1;
    std::copy(blocks_[me].begin(), blocks_[me].end(), static_cast<unsigned char*>(recv));
    return 0;
  }

  int calls() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }
  sa_reduce_op last_op() {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_op_;
  }

 private:
  int ranks_;
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<std::vector<double>> deposits_;
  std::vector<double> result_;
  std::vector<std::vector<int64_t>> send_counts_, recv_counts_;  // all_to_all's, by rank
  std::vector<std::vector<unsigned char>> bytes_, blocks_;        // ... sent, and received
  bool failed_ = false;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  int calls_ = 0;
  sa_reduce_op last_op_ = SA_REDUCE_SUM;
};

struct RankEndpoint {
  ThreadGroup* group;
  int rank;
};

inline int thread_all_reduce(void* ctx, double* values, int32_t count, sa_reduce_op op) {
  auto* endpoint = static_cast<RankEndpoint*>(ctx);
  return endpoint->group->all_reduce(endpoint->rank, values, count, op);
}

inline int thread_all_to_all(void* ctx, const void* send, const int64_t* send_counts, void* recv,
                             const int64_t* recv_counts) {
  auto* endpoint = static_cast<RankEndpoint*>(ctx);
  return endpoint->group->all_to_all(endpoint->rank, send, send_counts, recv, recv_counts);
}

struct CommDeleter {
  void operator()(sa_comm* comm) const { sa_comm_destroy(comm); }
};
using CommPtr = std::unique_ptr<sa_comm, CommDeleter>;

inline CommPtr host_comm(sa_host_comm callbacks) {
  sa_comm* comm = nullptr;
  const sa_status status = sa_comm_create_host(&callbacks, &comm);
  INFO("sa_comm_create_host: " << sa_status_string(status) << ": " << sa_last_error());
  REQUIRE(status == SA_OK);
  return CommPtr(comm);
}

// The communicators of `ranks` thread ranks of one group; `said`: each says its rank and
// the rank count (sa_host_comm.rank, .nranks), else neither; `wrong_rank` >= 0: each says
// that number instead of its own (the tests of a wrong numbering); `all_to_all`: said ranks
// give sa_host_comm.all_to_all (else the library exchanges through all_reduce).
struct ThreadComms {
  explicit ThreadComms(int ranks, bool said = false, int wrong_rank = -1, bool all_to_all = true)
      : group(ranks) {
    endpoints.reserve(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      endpoints.push_back({&group, r});
      sa_host_comm callbacks = SA_HOST_COMM_INIT;
      callbacks.ctx = &endpoints.back();
      callbacks.all_reduce = thread_all_reduce;
      if (said) {
        callbacks.rank = wrong_rank >= 0 ? wrong_rank : r;
        callbacks.nranks = ranks;
        if (all_to_all) callbacks.all_to_all = thread_all_to_all;
      }
      comms.push_back(host_comm(callbacks));
    }
  }
  sa_comm* operator[](int rank) const { return comms[static_cast<std::size_t>(rank)].get(); }

  ThreadGroup group;
  std::vector<RankEndpoint> endpoints;
  std::vector<CommPtr> comms;
};

}  // namespace sa_test

#endif  // SHARDADAM_TESTS_TEST_THREAD_COMM_HPP_
