// src/comm/nccl_comm.cpp — an NCCL communicator, owned (made from a unique id) or borrowed
// (the caller's ncclComm_t). Part of the CUDA backend module when it is built with NCCL
// (cuda_module_entry.cpp hands these functions to the core).
#include "nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "../errors.hpp"

namespace sa {
namespace nccl {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(sa_nccl_unique_id),
              "sa_nccl_unique_id must hold an ncclUniqueId");

void check_nccl(ncclResult_t result, ncclComm_t comm, const char* what) {
  if (result == ncclSuccess) return;
  const char* detail = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  fail(SA_ERR_COMM, what, ": ", ncclGetErrorString(result),
       (detail != nullptr && detail[0] != '\0') ? concat(" (", detail, ")") : std::string());
}

class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t comm, bool owned) : comm_(comm), owned_(owned) {
    check_nccl(ncclCommCount(comm_, &nranks_), comm_, "ncclCommCount");
    check_nccl(ncclCommUserRank(comm_, &rank_), comm_, "ncclCommUserRank");
    check_nccl(ncclCommCuDevice(comm_, &device_), comm_, "ncclCommCuDevice");
  }
  ~NcclComm() override {
    if (owned_) ncclCommDestroy(comm_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  std::string describe() const override {
    return concat("NCCL communicator (rank ", rank_, " of ", nranks_, ", cuda:", device_, ")");
  }
  bool reduces_device_memory() const override { return true; }
  int device() const override { return device_; }
  int32_t rank() const override { return rank_; }
  int32_t nranks() const override { return nranks_; }

  void all_reduce(double* values, int32_t count, ReduceOp op, void* stream) override {
    check_nccl(ncclAllReduce(values, values, static_cast<size_t>(count), ncclFloat64,
                             op == ReduceOp::sum ? ncclSum : ncclMax, comm_,
                             static_cast<cudaStream_t>(stream)),
               comm_, "ncclAllReduce");
  }

 private:
  ncclComm_t comm_;
  bool owned_;
  int nranks_ = 0;
  int rank_ = 0;
  int device_ = 0;
};

// Makes `device` current for the scope of a call and restores the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    const cudaError_t set = cudaSetDevice(device);
    if (set != cudaSuccess)
      fail(SA_ERR_DEVICE, "cannot use cuda:", device, ": ", cudaGetErrorString(set));
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace

void unique_id(sa_nccl_unique_id& out) {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
  std::memcpy(out.internal, id.internal, sizeof out.internal);
}

std::shared_ptr<Comm> make_comm(const sa_nccl_unique_id& id, int32_t nranks, int32_t rank,
                                int32_t device) {
  if (nranks < 1) fail(SA_ERR_INVALID_ARGUMENT, "nranks is ", nranks, "; it must be >= 1");
  if (rank < 0 || rank >= nranks)
    fail(SA_ERR_INVALID_ARGUMENT, "rank is ", rank, " but nranks is ", nranks, "; use 0..",
         nranks - 1);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (device < 0 || device >= devices)
    fail(SA_ERR_INVALID_ARGUMENT, "device is ", device, " but this process sees ", devices,
         " CUDA devices");
  DeviceScope scope(device);
  ncclUniqueId nccl_id;
  std::memcpy(nccl_id.internal, id.internal, sizeof nccl_id.internal);
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, nranks, nccl_id, rank), nullptr, "ncclCommInitRank");
  try {
    return std::make_shared<NcclComm>(comm, true);
  } catch (...) {
    ncclCommDestroy(comm);
    throw;
  }
}

std::shared_ptr<Comm> wrap_comm(void* nccl_comm) {
  if (nccl_comm == nullptr) fail(SA_ERR_INVALID_ARGUMENT, "nccl_comm is NULL");
  return std::make_shared<NcclComm>(static_cast<ncclComm_t>(nccl_comm), false);
}

}  // namespace nccl
}  // namespace sa
