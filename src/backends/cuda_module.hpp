// src/backends/cuda_module.hpp — the interface between the core library and the CUDA
// backend module (libshardadam-cuda.so, installed beside libshardadam.so). The core has no
// CUDA dependency: it loads the module at run time, the first time a CUDA tensor, an NCCL
// communicator or sa_build_info() needs it, so one build serves CPU-only and GPU machines.
//
// Core and module are C++ objects of one build (the loader refuses a module whose build
// stamp differs), so the table below passes C++ types and sa::Error may propagate through
// its functions; nothing else crosses.
#ifndef SHARDADAM_SRC_BACKENDS_CUDA_MODULE_HPP_
#define SHARDADAM_SRC_BACKENDS_CUDA_MODULE_HPP_

#include <cstdint>
#include <memory>
#include <string>

#include "../backend.hpp"
#include "../comm/comm.hpp"

namespace sa {

// Bumped when CudaModule changes shape. What its backends share with the core has its own
// version, kBackendInterface (backend.hpp).
constexpr uint32_t kCudaModuleInterface = 6;

// The module's file name, and the C symbol of its entry point.
#define SA_CUDA_MODULE_FILE "libshardadam-cuda.so"
#define SA_CUDA_MODULE_ENTRY "sa_cuda_module_v1"

struct CudaModule {
  uint32_t interface_version;  // kCudaModuleInterface of the module's build
  uint32_t backend_interface;  // kBackendInterface of the module's build
  const char* build_stamp;     // the build's stamp (build_stamp.h); the core's must equal it
  const char* description;     // for sa_build_info(): "device memory, one launch per bucket"
  // Devices this process sees; 0 (and no throw) when there is no driver or no device.
  int (*device_count)();
  // The backend of `device`; `host_step` makes the HostStep it steps host_cpu_step state
  // with, the first time a plan has some.
  std::unique_ptr<Backend> (*make_backend)(int device, HostStepFactory host_step);
  // NCCL, when the module was built with it (else these are NULL).
  void (*nccl_unique_id)(sa_nccl_unique_id& out);
  std::shared_ptr<Comm> (*make_nccl_comm)(const sa_nccl_unique_id& id, int32_t nranks, int32_t rank,
                                          int32_t device);
  std::shared_ptr<Comm> (*wrap_nccl_comm)(void* nccl_comm);
};

// The module's entry point: extern "C" const CudaModule* sa_cuda_module_v1(void).
using CudaModuleEntry = const CudaModule* (*)();

// ---- the module's side -----------------------------------------------------------------

// The CUDA backend on `device` (cuda_backend.cu).
std::unique_ptr<Backend> make_cuda_backend(int device, HostStepFactory host_step);

// ---- the core's side (module_loader.cpp) ------------------------------------------------

// The loaded module, or nullptr when there is none (cuda_module_status() says why). Loads
// on the first call; thread-safe. Where it looks: $SHARDADAM_CUDA_MODULE when set (a path,
// nothing else is tried), else SA_CUDA_MODULE_FILE beside the library that holds the core,
// else the dynamic loader's search path.
const CudaModule* cuda_module();

// "module <path> (device memory, one launch per bucket)", "not built", or why loading
// failed ("cannot load <path>: <dlerror>").
const std::string& cuda_module_status();

}  // namespace sa

#endif  // SHARDADAM_SRC_BACKENDS_CUDA_MODULE_HPP_
