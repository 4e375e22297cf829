// tests/stale_cuda_module.cpp — a CUDA backend module as a build with another Backend
// interface would make it: the module table's shape is this build's, its
// backend_interface is not. test_backend_module's `stale` mode points the library at it,
// which must refuse it and say why, before calling anything in it.
#include "src/backends/cuda_module.hpp"

namespace {

const sa::CudaModule kStale = {
    sa::kCudaModuleInterface, sa::kBackendInterface + 1, "stale", "a module of another interface",
    nullptr, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const sa::CudaModule* sa_cuda_module_v1() {
  return &kStale;
}
