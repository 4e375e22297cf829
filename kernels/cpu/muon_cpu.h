// kernels/cpu/muon_cpu.h — Muon's step of one whole matrix on the CPU (kernels/muon_math.h,
// on a slot's storage: kernels/muon_slot.h), its orthogonalization on OpenBLAS
// (newton_schulz.h) in float32.
#ifndef SHARDADAM_KERNELS_CPU_MUON_CPU_H_
#define SHARDADAM_KERNELS_CPU_MUON_CPU_H_

#include <stdint.h>

#include "../muon_math.h"
#include "../variants.h"
#include "newton_schulz.h"

namespace sa {
namespace kernels {

// The scratch muon_matrix_cpu needs for a rows x cols matrix, in floats.
int64_t muon_work_elems(int64_t rows, int64_t cols);

// Steps the whole matrix of a Muon slot (rows x cols, row-major): its grad times grad_scale
// into its momentum_buffer, the direction orthogonalized on `sgemm` (newton_schulz.h) and
// applied to the param, or to its float32 master and the param rounded from it
// (kernels/muon_slot.h). `v` is the slot's Variant; false, nothing changed, unless it is a
// Muon one (visit_muon_variant). `work` holds muon_work_elems(rows, cols) floats, none of
// them the slot's. The CPU backend's matrices pass calls it for each whole matrix.
bool muon_matrix_cpu(const Variant& v, CblasSgemm sgemm, const TensorSlot& slot, int64_t rows,
                     int64_t cols, const MuonHyper& h, float grad_scale, float* work);

// A split matrix's parts of the step (MatrixBox), as the CPU backend runs them on the slot
// of a box (row-major), `v` as muon_matrix_cpu takes it. A box's direction lies in floats at
// `dir`, element (r, k) of the box at dir[r * ld + k] (in its whole matrix: dir at the box's
// first element, ld = box.cols; on its own: ld = box_cols).
// - muon_box_momentum_cpu: the momentum_buffer advanced by the grad times grad_scale, and,
//   when `dir` is set, the direction written there;
// - (on the matrix's owner rank, the whole direction made of the boxes': newton_schulz_cpu
//   in place, its work muon_work_elems(rows, cols) floats;)
// - muon_box_apply_cpu: the box's orthogonalized direction at `dir` applied.
// With the same sgemm, a whole direction made of the boxes' gives every element the bits
// muon_matrix_cpu gives it.
bool muon_box_momentum_cpu(const Variant& v, const MuonHyper& h, const MatrixBox& box,
                           float grad_scale, const TensorSlot& slot, float* dir, int64_t ld);
bool muon_box_apply_cpu(const Variant& v, const MuonHyper& h, const MatrixBox& box,
                        const float* dir, int64_t ld, const TensorSlot& slot);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CPU_MUON_CPU_H_
