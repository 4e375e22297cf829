// src/comm/nccl_comm.cpp — an NCCL communicator, owned (made from a unique id) or borrowed
// (the caller's ncclComm_t). Part of the CUDA backend module when it is built with NCCL
// (cuda_module_entry.cpp hands these functions to the core).
//
// NCCL is loaded on first use (dlopen of libnccl.so.2, or $SHARDADAM_NCCL_LIBRARY), not
// linked: the module then loads on a GPU machine without NCCL, and only a communicator
// needs it. A process that loaded NCCL already (torch does) shares that copy.
#include "nccl_comm.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../errors.hpp"

namespace sa {
namespace nccl {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(sa_nccl_unique_id),
              "sa_nccl_unique_id must hold an ncclUniqueId");

// The NCCL functions this file calls, with nccl.h's types.
#define SA_NCCL_FUNCTIONS(X) \
  X(ncclGetLastError)        \
  X(ncclGetErrorString)      \
  X(ncclGetUniqueId)         \
  X(ncclCommInitRank)        \
  X(ncclCommDestroy)         \
  X(ncclCommCount)           \
  X(ncclCommUserRank)        \
  X(ncclCommCuDevice)        \
  X(ncclAllReduce)           \
  X(ncclGroupStart)          \
  X(ncclGroupEnd)            \
  X(ncclSend)                \
  X(ncclRecv)

struct NcclApi {
#define SA_NCCL_MEMBER(name) decltype(&::name) name;  // NOLINT(bugprone-macro-parentheses)
  SA_NCCL_FUNCTIONS(SA_NCCL_MEMBER)
#undef SA_NCCL_MEMBER
};

NcclApi load_nccl() {
  const char* path = std::getenv("SHARDADAM_NCCL_LIBRARY");
  const char* file = path != nullptr && path[0] != '\0' ? path : "libnccl.so.2";
  void* lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);  // kept for the life of the process
  if (lib == nullptr)
    fail(SA_ERR_UNSUPPORTED, "NCCL communicators need NCCL, which could not be loaded (", dlerror(),
         "); install NCCL, or set SHARDADAM_NCCL_LIBRARY to its libnccl.so.2");
  NcclApi api{};
#define SA_NCCL_RESOLVE(name)                                                  \
  api.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name));           \
  if (api.name == nullptr)                                                     \
    fail(SA_ERR_UNSUPPORTED, "the NCCL loaded from ", file, " has no ", #name, \
         "; shardadam needs "                                                  \
         "NCCL ",                                                              \
         NCCL_MAJOR, ".", NCCL_MINOR, " or newer");
  SA_NCCL_FUNCTIONS(SA_NCCL_RESOLVE)
#undef SA_NCCL_RESOLVE
  return api;
}

// Loaded once, on first use (a failed load is tried again at the next use).
const NcclApi& nccl() {
  static const NcclApi api = load_nccl();
  return api;
}

void check_nccl(ncclResult_t result, ncclComm_t comm, const char* what) {
  if (result == ncclSuccess) return;
  const char* detail =
      comm != nullptr ? nccl().ncclGetLastError(comm) : nccl().ncclGetLastError(nullptr);
  fail(SA_ERR_COMM, what, ": ", nccl().ncclGetErrorString(result),
       (detail != nullptr && detail[0] != '\0') ? concat(" (", detail, ")") : std::string());
}

class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t comm, bool owned) : comm_(comm), owned_(owned) {
    check_nccl(nccl().ncclCommCount(comm_, &nranks_), comm_, "ncclCommCount");
    check_nccl(nccl().ncclCommUserRank(comm_, &rank_), comm_, "ncclCommUserRank");
    check_nccl(nccl().ncclCommCuDevice(comm_, &device_), comm_, "ncclCommCuDevice");
  }
  ~NcclComm() override {
    if (owned_) nccl().ncclCommDestroy(comm_);
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
    check_nccl(nccl().ncclAllReduce(values, values, static_cast<size_t>(count), ncclFloat64,
                                    op == ReduceOp::sum ? ncclSum : ncclMax, comm_,
                                    static_cast<cudaStream_t>(stream)),
               comm_, "ncclAllReduce");
  }

  // Point-to-point in one group: NCCL matches a pair's sends and receives in order.
  void exchange(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                void* stream) override {
    if (sends.empty() && recvs.empty()) return;
    const auto s = static_cast<cudaStream_t>(stream);
    check_nccl(nccl().ncclGroupStart(), comm_, "ncclGroupStart");
    ncclResult_t result = ncclSuccess;
    const char* what = "ncclSend";
    for (const Transfer& t : sends)
      if (result == ncclSuccess)
        result = nccl().ncclSend(t.data, static_cast<size_t>(t.bytes), ncclUint8, t.peer, comm_, s);
    if (result == ncclSuccess) what = "ncclRecv";
    for (const Transfer& t : recvs)
      if (result == ncclSuccess)
        result = nccl().ncclRecv(t.data, static_cast<size_t>(t.bytes), ncclUint8, t.peer, comm_, s);
    const ncclResult_t ended = nccl().ncclGroupEnd();  // also after a failed call: the group closes
    check_nccl(result, comm_, what);
    check_nccl(ended, comm_, "ncclGroupEnd");
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
  check_nccl(nccl().ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
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
  check_nccl(nccl().ncclCommInitRank(&comm, nranks, nccl_id, rank), nullptr, "ncclCommInitRank");
  try {
    return std::make_shared<NcclComm>(comm, true);
  } catch (...) {
    nccl().ncclCommDestroy(comm);
    throw;
  }
}

std::shared_ptr<Comm> wrap_comm(void* nccl_comm) {
  if (nccl_comm == nullptr) fail(SA_ERR_INVALID_ARGUMENT, "nccl_comm is NULL");
  return std::make_shared<NcclComm>(static_cast<ncclComm_t>(nccl_comm), false);
}

}  // namespace nccl
}  // namespace sa
