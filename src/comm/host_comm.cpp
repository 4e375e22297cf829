// src/comm/host_comm.cpp — a communicator made of the caller's host callbacks.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
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
    std::vector<int64_t> send_bytes(ranks, 0), recv_bytes(ranks, 0);
    for (const Transfer& t : sends) send_bytes[static_cast<std::size_t>(t.peer)] += t.bytes;
    for (const Transfer& t : recvs) recv_bytes[static_cast<std::size_t>(t.peer)] += t.bytes;
    if (callbacks_.all_to_all == nullptr)
      return all_reduce_exchange(sends, recvs, send_bytes, recv_bytes);
    std::vector<unsigned char> out = pack(sends, send_bytes), in(total(recv_bytes));
    const int rc = callbacks_.all_to_all(callbacks_.ctx, out.data(), send_bytes.data(), in.data(),
                                         recv_bytes.data());
    if (rc != 0)
      fail(SA_ERR_COMM, "the host communicator's all_to_all (", out.size(), " bytes out, ",
           in.size(), " in) returned ", rc);
    unpack(in.data(), recvs, recv_bytes);
  }

 private:
  static std::size_t total(const std::vector<int64_t>& sizes) {
    int64_t n = 0;
    for (const int64_t c : sizes) n += c;
    return static_cast<std::size_t>(n);
  }

  // Where each peer's block starts in a buffer of blocks in rank order.
  static std::vector<std::size_t> starts(const std::vector<int64_t>& sizes) {
    std::vector<std::size_t> at(sizes.size(), 0);
    for (std::size_t r = 1; r < sizes.size(); ++r)
      at[r] = at[r - 1] + static_cast<std::size_t>(sizes[r - 1]);
    return at;
  }

  // The transfers to each peer, one after another in its block, in their order.
  static std::vector<unsigned char> pack(const std::vector<Transfer>& sends,
                                         const std::vector<int64_t>& sizes) {
    std::vector<unsigned char> out(total(sizes));
    std::vector<std::size_t> at = starts(sizes);
    for (const Transfer& t : sends) {
      std::size_t& next = at[static_cast<std::size_t>(t.peer)];
      std::memcpy(out.data() + next, t.data, static_cast<std::size_t>(t.bytes));
      next += static_cast<std::size_t>(t.bytes);
    }
    return out;
  }

  static void unpack(const unsigned char* in, const std::vector<Transfer>& recvs,
                     const std::vector<int64_t>& sizes) {
    std::vector<std::size_t> at = starts(sizes);
    for (const Transfer& t : recvs) {
      std::size_t& next = at[static_cast<std::size_t>(t.peer)];
      std::memcpy(t.data, in + next, static_cast<std::size_t>(t.bytes));
      next += static_cast<std::size_t>(t.bytes);
    }
  }

  // all_reduce (a sum) in pieces of at most INT32_MAX doubles (the callback's count).
  void sum_all(std::vector<double>& values) {
    for (std::size_t first = 0; first < values.size(); first += INT32_MAX)
      all_reduce(values.data() + first,
                 static_cast<int32_t>(std::min<std::size_t>(INT32_MAX, values.size() - first)),
                 ReduceOp::sum, nullptr);
  }

  // An exchange through all_reduce, for callbacks without all_to_all: every rank's send
  // sizes summed into a ranks x ranks table; then one buffer of every (sender, receiver)
  // block, each rank's own blocks written and zeros elsewhere, summed, and each rank's
  // blocks read from it. The blocks ride as doubles, 4 bytes (an unsigned integer, which a
  // double holds exactly, as it does its sum with zeros) in each. Every rank holds every
  // rank's blocks meanwhile.
  void all_reduce_exchange(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                           const std::vector<int64_t>& send_bytes,
                           const std::vector<int64_t>& recv_bytes) {
    const auto ranks = static_cast<std::size_t>(callbacks_.nranks);
    const auto me = static_cast<std::size_t>(callbacks_.rank);
    std::vector<double> table(ranks * ranks, 0.0);
    for (std::size_t q = 0; q < ranks; ++q)
      table[me * ranks + q] = static_cast<double>(send_bytes[q]);
    sum_all(table);
    std::vector<int64_t> sizes(table.size());  // (sender, receiver) blocks in row-major order
    for (std::size_t i = 0; i < table.size(); ++i) sizes[i] = static_cast<int64_t>(table[i]);
    for (std::size_t q = 0; q < ranks; ++q)
      if (sizes[q * ranks + me] != recv_bytes[q])
        fail(SA_ERR_MISMATCH, "rank ", q, " sends ", sizes[q * ranks + me], " bytes to this rank (",
             me, "), which expects ", recv_bytes[q]);
    const std::size_t words = total(sizes) / 4;
    if (words * 4 != total(sizes))
      fail(SA_ERR_INTERNAL, "an exchange through all_reduce of ", total(sizes),
           " bytes, not whole 4-byte words");
    const std::vector<std::size_t> at = starts(sizes);  // in bytes; every block whole words
    std::vector<double> all(words, 0.0);
    const std::vector<unsigned char> mine = pack(sends, send_bytes);
    for (std::size_t w = 0; w < mine.size() / 4; ++w) {
      uint32_t word = 0;
      std::memcpy(&word, mine.data() + 4 * w, 4);
      all[at[me * ranks] / 4 + w] = word;
    }
    sum_all(all);
    std::vector<unsigned char> in;
    for (std::size_t q = 0; q < ranks; ++q)
      for (std::size_t w = 0; w < static_cast<std::size_t>(recv_bytes[q]) / 4; ++w) {
        const auto word = static_cast<uint32_t>(all[at[q * ranks + me] / 4 + w]);
        const auto* b = reinterpret_cast<const unsigned char*>(&word);
        in.insert(in.end(), b, b + 4);
      }
    unpack(in.data(), recvs, recv_bytes);
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
