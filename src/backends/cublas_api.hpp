// src/backends/cublas_api.hpp — the cuBLAS the CUDA module's Muon steps run Newton-Schulz on
// (kernels/cuda/newton_schulz.cuh). The module links none: it loads cuBLAS when a Muon param
// on the GPU first needs it, so that the module loads, and AdamW runs, where cuBLAS is not
// installed. A process that loaded cuBLAS already (torch does) shares that copy.
#ifndef SHARDADAM_SRC_BACKENDS_CUBLAS_API_HPP_
#define SHARDADAM_SRC_BACKENDS_CUBLAS_API_HPP_

#include <cublas_v2.h>

#include "../../kernels/cuda/newton_schulz.cuh"

namespace sa::cuda {

struct CublasApi {
  kernels::CublasCalls calls;
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
};

// cuBLAS of $SHARDADAM_CUBLAS_LIBRARY when set, else the first of libcublas.so.<this
// toolkit's major>, the same in the toolkit's library folder the module was built against;
// loaded once, on first call (a failed load is tried again at the next). Throws
// SA_ERR_UNSUPPORTED saying what to install when none loads.
const CublasApi& cublas();

}  // namespace sa::cuda

#endif  // SHARDADAM_SRC_BACKENDS_CUBLAS_API_HPP_
