// src/blas.cpp — see blas.hpp.
#include "blas.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "errors.hpp"

namespace sa {
namespace {

kernels::CblasSgemm load_sgemm() {
  const char* chosen = std::getenv("SHARDADAM_BLAS_LIBRARY");
  std::vector<const char*> files{"libopenblas.so.0", "libcblas.so.3", "libblas.so.3"};
  if (chosen != nullptr && chosen[0] != '\0') files.assign(1, chosen);
  std::string tried;
  for (const char* file : files) {
    void* lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);  // kept for the life of the process
    if (lib == nullptr) {
      const char* why = dlerror();
      tried += concat(tried.empty() ? "" : "; ", why != nullptr ? why : file);
      continue;
    }
    if (void* f = dlsym(lib, "cblas_sgemm"); f != nullptr)
      return reinterpret_cast<kernels::CblasSgemm>(f);
    tried += concat(tried.empty() ? "" : "; ", file, " has no cblas_sgemm");
    dlclose(lib);
  }
  fail(SA_ERR_UNSUPPORTED,
       "Muon on the CPU runs Newton-Schulz on a CBLAS, and none could be loaded (", tried,
       "); install OpenBLAS (Debian: libopenblas0), or set SHARDADAM_BLAS_LIBRARY to a "
       "library with cblas_sgemm");
}

}  // namespace

kernels::CblasSgemm cpu_sgemm() {
  static const kernels::CblasSgemm sgemm = load_sgemm();
  return sgemm;
}

}  // namespace sa
