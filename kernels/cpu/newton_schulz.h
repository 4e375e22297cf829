// kernels/cpu/newton_schulz.h — Muon's Newton-Schulz iteration (kernels/newton_schulz.h) on
// the CPU, in float32 on a CBLAS's sgemm (Debian: OpenBLAS). The Muon rule (issue 36) will
// call it for each whole matrix it orthogonalizes; until then the tests and bench/ do.
#ifndef SHARDADAM_KERNELS_CPU_NEWTON_SCHULZ_H_
#define SHARDADAM_KERNELS_CPU_NEWTON_SCHULZ_H_

#include <stdint.h>

#include "../newton_schulz.h"

namespace sa {
namespace kernels {

// x (rows x cols, row-major float32; rows and cols in [1, INT32_MAX], the BLAS's int) :=
// its orthogonalization by `ns`.
// `work` holds ns_work_elems(rows, cols) floats, none of them in x. The GEMMs run on the
// BLAS's threads; the norm is summed in double, in element order. Deterministic for a
// given BLAS and thread count.
void newton_schulz_cpu(float* x, int64_t rows, int64_t cols, const NewtonSchulz& ns, float* work);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CPU_NEWTON_SCHULZ_H_
