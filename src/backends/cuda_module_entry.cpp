// src/backends/cuda_module_entry.cpp — the entry point of the CUDA backend module: the
// table the core's loader (module_loader.cpp) reads.
#include <cuda_runtime.h>

#include "build_stamp.h"
#include "cuda_module.hpp"
#ifdef SHARDADAM_WITH_NCCL
#include "../comm/nccl_comm.hpp"
#endif

namespace sa {
namespace {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error for the caller
    return 0;
  }
  return count;
}

const CudaModule kModule = {
    kCudaModuleInterface, kBackendInterface,
    SA_BUILD_STAMP,       "device memory, one launch per bucket",
    device_count,         make_cuda_backend,
#ifdef SHARDADAM_WITH_NCCL
    nccl::unique_id,      nccl::make_comm,
    nccl::wrap_comm,
#else
    nullptr,
    nullptr,
    nullptr,
#endif
};

}  // namespace
}  // namespace sa

extern "C" __attribute__((visibility("default"))) const sa::CudaModule* sa_cuda_module_v1() {
  return &sa::kModule;
}
