// src/blas.hpp — the CBLAS that Muon's Newton-Schulz iteration runs on in host memory
// (kernels/cpu/newton_schulz.h). The library links none: it loads one when a Muon param on
// the CPU first needs it, so that AdamW users and a build machine need no BLAS.
#ifndef SHARDADAM_SRC_BLAS_HPP_
#define SHARDADAM_SRC_BLAS_HPP_

#include "../kernels/cpu/newton_schulz.h"

namespace sa {

// cblas_sgemm of $SHARDADAM_BLAS_LIBRARY when set, else of the first of libopenblas.so.0,
// libcblas.so.3 and libblas.so.3 that loads and has it; loaded once, on first call (a
// failed load is tried again at the next call). Throws SA_ERR_UNSUPPORTED saying what to
// install when none has it.
kernels::CblasSgemm cpu_sgemm();

}  // namespace sa

#endif  // SHARDADAM_SRC_BLAS_HPP_
