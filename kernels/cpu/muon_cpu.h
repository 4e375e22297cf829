// kernels/cpu/muon_cpu.h — Muon's step of one whole float32 matrix on the CPU
// (kernels/muon_math.h), its orthogonalization on OpenBLAS (newton_schulz.h).
#ifndef SHARDADAM_KERNELS_CPU_MUON_CPU_H_
#define SHARDADAM_KERNELS_CPU_MUON_CPU_H_

#include <stdint.h>

#include "../muon_math.h"
#include "newton_schulz.h"

namespace sa {
namespace kernels {

// The scratch muon_matrix_cpu needs for a rows x cols matrix, in floats.
int64_t muon_work_elems(int64_t rows, int64_t cols);

// Steps param (rows x cols, row-major float32) with grad times grad_scale and its momentum
// buffer `buf` (same layout, float32; updated) by `h`, the GEMMs on `sgemm`
// (newton_schulz.h). `work` holds muon_work_elems(rows, cols) floats, none of them in the
// other arrays. The CPU backend's matrices pass calls it for each whole matrix.
void muon_matrix_cpu(CblasSgemm sgemm, float* param, const float* grad, float* buf, int64_t rows,
                     int64_t cols, const MuonHyper& h, float grad_scale, float* work);

// A split matrix's parts of the step (MatrixBox), as the CPU backend runs them. A box's
// direction lies in floats at `dir`, element (r, k) of the box at dir[r * ld + k] (in its
// whole matrix: dir at the box's first element, ld = box.cols; on its own: ld = box_cols).
// - muon_box_momentum_cpu: buf (the box, row-major) advanced by grad times grad_scale, and,
//   when `dir` is set, the direction written there;
// - (on the matrix's owner rank, the whole direction made of the boxes': newton_schulz_cpu
//   in place, its work muon_work_elems(rows, cols) floats;)
// - muon_box_apply_cpu: the box's orthogonalized direction at `dir` applied to param (the
//   box, row-major).
// With the same sgemm, a whole direction made of the boxes' gives every element the bits
// muon_matrix_cpu gives it.
void muon_box_momentum_cpu(const MuonHyper& h, const MatrixBox& box, float grad_scale,
                           const float* grad, float* buf, float* dir, int64_t ld);
void muon_box_apply_cpu(const MuonHyper& h, const MatrixBox& box, const float* dir, int64_t ld,
                        float* param);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CPU_MUON_CPU_H_
