// src/comm/host_comm.cpp — a communicator made of the caller's host callbacks.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "../errors.hpp"
#include "comm.hpp"

namespace sa {
namespace {

class HostComm final : public Comm {
 public:
  explicit HostComm(const sa_host_comm& callbacks) : callbacks_(callbacks) {}
  ~HostComm() override {
    if (callbacks_.release != nullptr) callbacks_.release(callbacks_.ctx);
  }
  HostComm(const HostComm&) = delete;
  HostComm& operator=(const HostComm&) = delete;

  std::string describe() const override { return "host-callback communicator"; }
  bool reduces_device_memory() const override { return false; }
  int device() const override { return -1; }
  int32_t rank() const override { return callbacks_.nranks > 0 ? callbacks_.rank : -1; }
  int32_t nranks() const override { return callbacks_.nranks > 0 ? callbacks_.nranks : -1; }

  void all_reduce(double* values, int32_t count, ReduceOp op, void*) override {
    const int rc = callbacks_.all_reduce(callbacks_.ctx, values, count,
                                         op == ReduceOp::sum ? SA_REDUCE_SUM : SA_REDUCE_MAX);
    if (rc != 0)
      fail(SA_ERR_COMM, "the host communicator's all_reduce (", count, " doubles, ",
           op == ReduceOp::sum ? "sum" : "max", ") returned ", rc);
  }

  // Through the caller's all_to_all: the sends packed into one block a peer, in rank
  // order, and what comes back unpacked into the receives. Without it, through all_reduce
  // (all_reduce_exchange).
  void exchange(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                void*) override {
    if (callbacks_.nranks <= 0)
      fail(SA_ERR_UNSUPPORTED, "an exchange on a host communicator that does not say its ranks");
    const auto ranks = static_cast<std::size_t>(callbacks_.nranks);
    std::vector<int64_t> send_counts(ranks, 0), recv_counts(ranks, 0);
    for (const Transfer& t : sends) send_counts[static_cast<std::size_t>(t.peer)] += t.count;
    for (const Transfer& t : recvs) recv_counts[static_cast<std::size_t>(t.peer)] += t.count;
    if (callbacks_.all_to_all == nullptr)
      return all_reduce_exchange(sends, recvs, send_counts, recv_counts);
    std::vector<double> out = pack(sends, send_counts), in(total(recv_counts));
    const int rc = callbacks_.all_to_all(callbacks_.ctx, out.data(), send_counts.data(), in.data(),
                                         recv_counts.data());
    if (rc != 0)
      fail(SA_ERR_COMM, "the host communicator's all_to_all (", out.size(), " doubles out, ",
           in.size(), " in) returned ", rc);
    unpack(in, recvs, recv_counts);
  }

 private:
  static std::size_t total(const std::vector<int64_t>& counts) {
    int64_t n = 0;
    for (const int64_t c : counts) n += c;
    return static_cast<std::size_t>(n);
  }

  // Where each peer's block starts in a buffer of blocks in rank order.
  static std::vector<std::size_t> starts(const std::vector<int64_t>& counts) {
    std::vector<std::size_t> at(counts.size(), 0);
    for (std::size_t r = 1; r < counts.size(); ++r)
      at[r] = at[r - 1] + static_cast<std::size_t>(counts[r - 1]);
    return at;
  }

  // The transfers to each peer, one after another in its block, in their order.
  static std::vector<double> pack(const std::vector<Transfer>& sends,
                                  const std::vector<int64_t>& counts) {
    std::vector<double> out(total(counts));
    std::vector<std::size_t> at = starts(counts);
    for (const Transfer& t : sends) {
      std::copy(t.values, t.values + t.count,
                out.begin() + static_cast<std::ptrdiff_t>(at[static_cast<std::size_t>(t.peer)]));
      at[static_cast<std::size_t>(t.peer)] += static_cast<std::size_t>(t.count);
    }
    return out;
  }

  static void unpack(const std::vector<double>& in, const std::vector<Transfer>& recvs,
                     const std::vector<int64_t>& counts) {
    std::vector<std::size_t> at = starts(counts);
    for (const Transfer& t : recvs) {
      const auto first =
          in.begin() + static_cast<std::ptrdiff_t>(at[static_cast<std::size_t>(t.peer)]);
      std::copy(first, first + t.count, t.values);
      at[static_cast<std::size_t>(t.peer)] += static_cast<std::size_t>(t.count);
    }
  }

  // all_reduce in pieces of at most INT32_MAX doubles (the callback's count).
  void reduce_all(double* values, std::size_t count) {
    for (std::size_t first = 0; first < count; first += INT32_MAX)
      all_reduce(values + first,
                 static_cast<int32_t>(std::min<std::size_t>(INT32_MAX, count - first)),
                 ReduceOp::sum, nullptr);
  }

  // An exchange through all_reduce, for callbacks without all_to_all: every rank's send
  // counts summed into a ranks x ranks table; then one buffer of every (sender, receiver)
  // block, each rank's own blocks written and zeros elsewhere, summed (x + 0 is exact), and
  // each rank's blocks read from it. Every rank holds every rank's blocks meanwhile.
  void all_reduce_exchange(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                           const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts) {
    const auto ranks = static_cast<std::size_t>(callbacks_.nranks);
    const auto me = static_cast<std::size_t>(callbacks_.rank);
    std::vector<double> table(ranks * ranks, 0.0);
    for (std::size_t q = 0; q < ranks; ++q)
      table[me * ranks + q] = static_cast<double>(send_counts[q]);
    reduce_all(table.data(), table.size());
    std::vector<int64_t> counts(table.size());  // (sender, receiver) blocks in row-major order
    for (std::size_t i = 0; i < table.size(); ++i) counts[i] = static_cast<int64_t>(table[i]);
    std::vector<double> all(total(counts), 0.0);
    const std::vector<std::size_t> at = starts(counts);
    std::vector<double> mine = pack(sends, send_counts);
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(at[me * ranks]));
    reduce_all(all.data(), all.size());
    for (std::size_t q = 0; q < ranks; ++q)
      if (counts[q * ranks + me] != recv_counts[q])
        fail(SA_ERR_MISMATCH, "rank ", q, " sends ", counts[q * ranks + me],
             " doubles to this rank (", me, "), which expects ", recv_counts[q]);
    std::vector<double> in;
    for (std::size_t q = 0; q < ranks; ++q)
      in.insert(in.end(), all.begin() + static_cast<std::ptrdiff_t>(at[q * ranks + me]),
                all.begin() + static_cast<std::ptrdiff_t>(
                                  at[q * ranks + me] + static_cast<std::size_t>(recv_counts[q])));
    unpack(in, recvs, recv_counts);
  }

  sa_host_comm callbacks_;
};

}  // namespace

std::shared_ptr<Comm> make_host_comm(const sa_host_comm& callbacks) {
  if (callbacks.all_reduce == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, "callbacks->all_reduce is NULL; a host communicator needs one");
  if (callbacks.nranks < 0 || (callbacks.nranks == 0 && callbacks.rank != 0) ||
      (callbacks.nranks > 0 && (callbacks.rank < 0 || callbacks.rank >= callbacks.nranks)))
    fail(SA_ERR_INVALID_ARGUMENT, "callbacks->rank is ", callbacks.rank, " and ->nranks ",
         callbacks.nranks, "; give 0 <= rank < nranks, or 0 for both (not said)");
  if (callbacks.all_to_all != nullptr && callbacks.nranks == 0)
    fail(SA_ERR_INVALID_ARGUMENT,
         "callbacks->all_to_all is set and ->nranks is 0; all_to_all needs rank and nranks");
  return std::make_shared<HostComm>(callbacks);
}

}  // namespace sa
