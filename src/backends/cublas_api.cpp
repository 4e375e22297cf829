// src/backends/cublas_api.cpp — see cublas_api.hpp.
#include "cublas_api.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "../errors.hpp"

#ifndef SHARDADAM_CUBLAS_DIR
#define SHARDADAM_CUBLAS_DIR ""
#endif

namespace sa::cuda {
namespace {

// Resolves `name` from `lib` into *out, or adds it to what is missing.
template <class F>
void resolve(void* lib, const char* name, F* out, std::string& missing) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr) missing += concat(missing.empty() ? "" : ", ", name);
}

CublasApi load_cublas() {
  const std::string soname = concat("libcublas.so.", CUBLAS_VER_MAJOR);
  std::vector<std::string> files{soname};
  if (SHARDADAM_CUBLAS_DIR[0] != '\0') files.push_back(concat(SHARDADAM_CUBLAS_DIR, "/", soname));
  const char* chosen = std::getenv("SHARDADAM_CUBLAS_LIBRARY");
  if (chosen != nullptr && chosen[0] != '\0') files.assign(1, chosen);
  std::string tried;
  for (const std::string& file : files) {
    void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept for the life of the process
    if (lib == nullptr) {
      const char* why = dlerror();
      tried += concat(tried.empty() ? "" : "; ", why != nullptr ? why : file);
      continue;
    }
    CublasApi api{};
    std::string missing;
    resolve(lib, "cublasSetStream_v2", &api.calls.set_stream, missing);
    resolve(lib, "cublasGemmEx", &api.calls.gemm_ex, missing);
    resolve(lib, "cublasSetWorkspace_v2", &api.calls.set_workspace, missing);
    resolve(lib, "cublasCreate_v2", &api.create, missing);
    resolve(lib, "cublasDestroy_v2", &api.destroy, missing);
    if (missing.empty()) return api;
    tried += concat(tried.empty() ? "" : "; ", file, " lacks ", missing);
    dlclose(lib);
  }
  fail(SA_ERR_UNSUPPORTED, "Muon on CUDA runs Newton-Schulz on cuBLAS, which could not be loaded (",
       tried, "); install cuBLAS ", CUBLAS_VER_MAJOR,
       " (pip: nvidia-cublas; it comes with torch's CUDA wheels), or set "
       "SHARDADAM_CUBLAS_LIBRARY to its libcublas.so");
}

}  // namespace

const CublasApi& cublas() {
  static const CublasApi api = load_cublas();
  return api;
}

}  // namespace sa::cuda
