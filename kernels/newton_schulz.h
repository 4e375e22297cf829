// kernels/newton_schulz.h — Muon's orthogonalization of one matrix (torch.optim.Muon's
// _zeropower_via_newtonschulz): its constants and how a matrix is laid out for it. The
// backends' implementations run it on real GEMM libraries: kernels/cpu/newton_schulz.h (a
// CBLAS), kernels/cuda/newton_schulz.cuh (cuBLAS).
//
// For a rows x cols matrix G, with X = G when rows <= cols and X = G^T otherwise (so X is
// m x n with m <= n, and the Gram matrices below are the small ones):
//
//   X := X / max(||X||_F, eps)
//   ns.steps times:  A := X X^T;  B := b A + c A A;  X := a X + B X
//
// and the result is X (or X^T). Both X and X^T are views of G's row-major buffer: a row-major
// rows x cols matrix is its transpose in column-major order, so an implementation runs the
// same GEMMs in row-major order (X = G) or column-major order (X = G^T) on the same memory.
#ifndef SHARDADAM_KERNELS_NEWTON_SCHULZ_H_
#define SHARDADAM_KERNELS_NEWTON_SCHULZ_H_

#include <stdint.h>

namespace sa {
namespace kernels {

// The iteration's constants; the defaults are torch.optim.Muon's (ns_coefficients,
// ns_steps, eps).
struct NewtonSchulz {
  float a = 3.4445f;
  float b = -4.7750f;
  float c = 2.0315f;
  int32_t steps = 5;
  float eps = 1e-7f;
};

// A rows x cols row-major matrix as the iteration sees it: X is m x n (m <= n), G itself
// in row-major order, or G^T (`transposed`) in column-major order; `ld` is X's leading
// dimension in that order (n row-major, m column-major: G's row length either way).
struct NsShape {
  int64_t m;
  int64_t n;
  bool transposed;
  int64_t ld;
};

constexpr NsShape ns_shape(int64_t rows, int64_t cols) {
  return rows <= cols ? NsShape{rows, cols, false, cols} : NsShape{cols, rows, true, cols};
}

// The scratch an implementation needs for a rows x cols matrix, in elements: A and B
// (m x m each) and the next X (m x n).
constexpr int64_t ns_work_elems(int64_t rows, int64_t cols) {
  const NsShape s = ns_shape(rows, cols);
  return 2 * s.m * s.m + s.m * s.n;
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_NEWTON_SCHULZ_H_
