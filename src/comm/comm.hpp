// src/comm/comm.hpp — what a step needs from a communicator: an in-place all-reduce of a
// few doubles (the partial gradient norm and the found-inf count) across the ranks, and an
// exchange of doubles between pairs of ranks (split Muon matrices to their owners and back).
// The core calls them; backends never know which transport is behind them.
#ifndef SHARDADAM_SRC_COMM_COMM_HPP_
#define SHARDADAM_SRC_COMM_COMM_HPP_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardadam/shardadam.h"

namespace sa {

enum class ReduceOp { sum, max };

class Comm {
 public:
  virtual ~Comm() = default;

  // "nccl (rank 1 of 4, cuda:1)", "host callbacks", for error messages.
  virtual std::string describe() const = 0;

  // Whether all_reduce takes device memory and a stream (NCCL) or host memory (callbacks).
  virtual bool reduces_device_memory() const = 0;

  // The CUDA device a device communicator runs on; -1 for a host one.
  virtual int device() const = 0;

  virtual int32_t rank() const = 0;    // -1 when the transport is the caller's
  virtual int32_t nranks() const = 0;  // -1 when the transport is the caller's

  // values[0..count) := their element-wise `op` over all ranks, in place. Device
  // communicators enqueue on `stream` (a cudaStream_t) and return; host ones return when
  // done. Throws sa::Error(SA_ERR_COMM) on failure.
  virtual void all_reduce(double* values, int32_t count, ReduceOp op, void* stream) = 0;

  // One exchange among the ranks: each of `sends` (`bytes` at data, a multiple of 4) goes
  // to rank peer, and each of `recvs` is filled from rank peer, where the peer sends to
  // this rank the same sizes in the same order; no peer is this rank. Memory as
  // all_reduce's; device communicators enqueue on `stream`. Every rank calls it, with or
  // without transfers. Throws sa::Error(SA_ERR_COMM) on failure (SA_ERR_UNSUPPORTED: a
  // host communicator without ranks).
  struct Transfer {
    int32_t peer;
    void* data;
    int64_t bytes;
  };
  virtual void exchange(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                        void* stream) = 0;
};

// A communicator made of the caller's callbacks (validated; throws on a bad table).
std::shared_ptr<Comm> make_host_comm(const sa_host_comm& callbacks);

// NCCL communicators, from the CUDA backend module (src/backends/module_loader.cpp
// forwards to it). Without the module, or a module without NCCL, nccl_available() is false
// and the others throw sa::Error(SA_ERR_UNSUPPORTED) saying why.
bool nccl_available();
void nccl_unique_id(sa_nccl_unique_id& out);
std::shared_ptr<Comm> make_nccl_comm(const sa_nccl_unique_id& id, int32_t nranks, int32_t rank,
                                     int32_t device);
std::shared_ptr<Comm> wrap_nccl_comm(void* nccl_comm);

}  // namespace sa

#endif  // SHARDADAM_SRC_COMM_COMM_HPP_
