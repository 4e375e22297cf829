// src/comm/nccl_comm.hpp — NCCL communicators, inside the CUDA backend module. The core
// reaches them through the module's table (src/backends/cuda_module.hpp), never directly.
#ifndef SHARDADAM_SRC_COMM_NCCL_COMM_HPP_
#define SHARDADAM_SRC_COMM_NCCL_COMM_HPP_

#include <cstdint>
#include <memory>

#include "comm.hpp"

namespace sa {
namespace nccl {

void unique_id(sa_nccl_unique_id& out);
// Checks its arguments (nranks, rank, device), then ncclCommInitRank on `device`.
std::shared_ptr<Comm> make_comm(const sa_nccl_unique_id& id, int32_t nranks, int32_t rank,
                                int32_t device);
// Borrows the caller's ncclComm_t (never destroys it).
std::shared_ptr<Comm> wrap_comm(void* nccl_comm);

}  // namespace nccl
}  // namespace sa

#endif  // SHARDADAM_SRC_COMM_NCCL_COMM_HPP_
