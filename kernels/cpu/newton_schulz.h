// kernels/cpu/newton_schulz.h — Muon's Newton-Schulz iteration (kernels/newton_schulz.h) on
// the CPU, in float32 on a CBLAS's sgemm (Debian: OpenBLAS). The sgemm is the caller's: the
// library loads a CBLAS when a Muon param first needs one (src/blas.hpp), so that it links
// none; the tests hand it cblas_sgemm itself.
#ifndef SHARDADAM_KERNELS_CPU_NEWTON_SCHULZ_H_
#define SHARDADAM_KERNELS_CPU_NEWTON_SCHULZ_H_

#include <stdint.h>

#include "../newton_schulz.h"

namespace sa {
namespace kernels {

// CBLAS's cblas_sgemm with its enums as the ints the CBLAS standard gives them (cblas.h's
// CBLAS_ORDER and CBLAS_TRANSPOSE are C enums of these values, passed as int) and an LP64
// BLAS's int sizes.
using CblasSgemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc);
constexpr int kCblasRowMajor = 101;
constexpr int kCblasColMajor = 102;
constexpr int kCblasNoTrans = 111;
constexpr int kCblasTrans = 112;

// x (rows x cols, row-major float32; rows and cols in [1, INT32_MAX], the BLAS's int) :=
// its orthogonalization by `ns`, its GEMMs on `sgemm`.
// `work` holds ns_work_elems(rows, cols) floats, none of them in x. The GEMMs run on the
// BLAS's threads; the norm is summed in double, in element order. Deterministic for a
// given BLAS and thread count.
void newton_schulz_cpu(CblasSgemm sgemm, float* x, int64_t rows, int64_t cols,
                       const NewtonSchulz& ns, float* work);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CPU_NEWTON_SCHULZ_H_
