// kernels/cuda/muon_cuda.cuh — Muon's step of one whole matrix on the GPU (kernels/muon_math.h,
// on a slot's storage: kernels/muon_slot.h): the per-element parts as kernels, the
// orthogonalization on cuBLAS (newton_schulz.cuh).
#ifndef SHARDADAM_KERNELS_CUDA_MUON_CUDA_CUH_
#define SHARDADAM_KERNELS_CUDA_MUON_CUDA_CUH_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "../muon_math.h"
#include "../step_control.h"
#include "../variants.h"
#include "newton_schulz.cuh"

namespace sa {
namespace kernels {

// Device scratch bytes muon_matrix_cuda needs for a rows x cols matrix.
size_t muon_cuda_work_bytes(int64_t rows, int64_t cols);

// Enqueues on `stream` the step of a Muon slot's whole matrix (rows x cols, row-major,
// device memory) by `h`: its grad into its momentum_buffer, the direction orthogonalized and
// applied to the param, or to its float32 master and the param rounded from it
// (kernels/muon_slot.h). `v` is the slot's Variant: not a Muon one (visit_muon_variant),
// st.cuda is cudaErrorInvalidValue and nothing is enqueued. `verdict` (device memory, or
// NULL: step, grads as they are) is the step's fold's: when its skip is set nothing of the
// slot changes, else every grad is multiplied by its grad_multiplier. `work` is device
// memory of muon_cuda_work_bytes(rows, cols) bytes, 256-byte aligned; `blas` the caller's
// handle, of the cuBLAS `calls` come from (its stream is set to `stream`). The momentum is
// fused into Newton-Schulz's first pass (ns_round.cuh: u is rounded to bfloat16 where it is
// made) and the update reads the bfloat16 result: with float32 storage, 28 bytes of
// elementwise traffic an element (14 + normalize's 4 + 10), not the 44 of separate momentum,
// round, widen and apply passes. The passes take kNsGroup elements a thread, as vectors where
// the slot's arrays are aligned for them, with the same bits either way. The CUDA backend's
// matrices pass calls this for each whole matrix.
NsStatus muon_matrix_cuda(const Variant& v, const CublasCalls& calls, cublasHandle_t blas,
                          const TensorSlot& slot, int64_t rows, int64_t cols, const MuonHyper& h,
                          const StepVerdict* verdict, void* work, cudaStream_t stream);

// A split matrix's parts of the step (kernels/muon_math.h's MatrixBox) on the slot of a box
// (row-major), enqueued on `stream`, `v` and `verdict` as muon_matrix_cuda reads them (not a
// Muon Variant: cudaErrorInvalidValue, nothing enqueued). A box's direction lies in floats
// (device memory) at `dir`, element (r, k) of the box at dir[r * ld + k], as
// kernels/cpu/muon_cpu.h says.
// - muon_box_momentum_cuda: the momentum_buffer advanced by the grad, and with `dir` the
//   direction written there;
// - (on the matrix's owner rank, the whole direction made of the boxes': newton_schulz_cuda
//   in place, in muon_cuda_work_bytes(rows, cols) bytes of work;)
// - muon_box_apply_cuda: the box's orthogonalized direction at `dir` applied.
// A whole direction made of the boxes' gives every element the bits muon_matrix_cuda gives.
cudaError_t muon_box_momentum_cuda(const Variant& v, const MuonHyper& h, const MatrixBox& box,
                                   const StepVerdict* verdict, const TensorSlot& slot, float* dir,
                                   int64_t ld, cudaStream_t stream);
cudaError_t muon_box_apply_cuda(const Variant& v, const MuonHyper& h, const MatrixBox& box,
                                const StepVerdict* verdict, const float* dir, int64_t ld,
                                const TensorSlot& slot, cudaStream_t stream);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_MUON_CUDA_CUH_
