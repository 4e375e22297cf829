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
  explicit ThreadGroup(int ranks) : ranks_(ranks), deposits_(static_cast<std::size_t>(ranks)) {}

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
// that number instead of its own (the tests of a wrong numbering).
struct ThreadComms {
  explicit ThreadComms(int ranks, bool said = false, int wrong_rank = -1) : group(ranks) {
    endpoints.reserve(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      endpoints.push_back({&group, r});
      sa_host_comm callbacks = SA_HOST_COMM_INIT;
      callbacks.ctx = &endpoints.back();
      callbacks.all_reduce = thread_all_reduce;
      if (said) {
        callbacks.rank = wrong_rank >= 0 ? wrong_rank : r;
        callbacks.nranks = ranks;
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
