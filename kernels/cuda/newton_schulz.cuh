// kernels/cuda/newton_schulz.cuh — Muon's Newton-Schulz iteration (kernels/newton_schulz.h) on
// the GPU: bfloat16 GEMMs with float32 accumulation on cuBLAS, as torch.optim.Muon runs it
// on CUDA (its tensors in bfloat16 throughout). The CUDA backend's matrices pass calls it
// for each whole matrix it orthogonalizes, with the cuBLAS the module loaded on first need
// (src/backends/cublas_api.hpp); the GPU tests and bench/ hand it cuBLAS's own functions.
#ifndef SHARDADAM_KERNELS_CUDA_NEWTON_SCHULZ_CUH_
#define SHARDADAM_KERNELS_CUDA_NEWTON_SCHULZ_CUH_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "../newton_schulz.h"

namespace sa {
namespace kernels {

// Device scratch bytes newton_schulz_cuda needs for a rows x cols matrix: X and the next X
// (m x n), A and B (m x m), all bfloat16, the norm's partial sums and cuBLAS's workspace
// (kNsCublasWorkspaceBytes).
size_t newton_schulz_cuda_work_bytes(int64_t rows, int64_t cols);

// The cuBLAS functions the iteration calls, as the caller resolved them.
// cublasGemmEx is the C function of this signature (C++ also sees an inline overload that
// takes a cudaDataType as the compute type, hence the spelled-out type).
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                        int, int, const void*, const void*, cudaDataType, int,
                                        const void*, cudaDataType, int, const void*, void*,
                                        cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
struct CublasCalls {
  decltype(&cublasSetStream_v2) set_stream;
  CublasGemmEx gemm_ex;
  decltype(&cublasSetWorkspace_v2) set_workspace;
};

// The cuBLAS workspace inside newton_schulz_cuda's work (cuBLAS's recommendation for Hopper):
// the GEMMs use it instead of cuBLAS's own pool, so that a step captured in a CUDA graph
// allocates nothing and replays on memory the optimizer owns.
constexpr size_t kNsCublasWorkspaceBytes = size_t{32} << 20;

// What failed, if anything: a launch or copy (cuda), or a cuBLAS call (blas).
struct NsStatus {
  cudaError_t cuda = cudaSuccess;
  cublasStatus_t blas = CUBLAS_STATUS_SUCCESS;
  bool ok() const { return cuda == cudaSuccess && blas == CUBLAS_STATUS_SUCCESS; }
};

// Enqueues on `stream`: x (rows x cols, row-major float32, device memory; rows, cols > 0
// and at most INT32_MAX, else CUBLAS_STATUS_INVALID_VALUE and nothing enqueued) := its
// orthogonalization by `ns`. x is rounded to bfloat16 first; the norm sums the
// rounded values in float32 in a fixed order (deterministic), the iteration keeps X, A and
// B in bfloat16 as torch does, and the result is widened back into x. Each step is three
// GEMMs: A = X X^T; B' = c A A + (b A + a I); X = B' X (a on B's diagonal, so the last GEMM
// writes the other buffer with no copy of X for its C input). `work` is device
// memory of newton_schulz_cuda_work_bytes(rows, cols) bytes, 256-byte aligned. `blas` is
// the caller's handle, of the cuBLAS `calls` come from; this sets its stream to `stream`.
NsStatus newton_schulz_cuda(const CublasCalls& calls, cublasHandle_t blas, float* x, int64_t rows,
                            int64_t cols, const NewtonSchulz& ns, void* work, cudaStream_t stream);

// newton_schulz_cuda in parts, for a caller that fuses its elementwise passes into the
// first and the last (kernels/cuda/muon_cuda.cu):
// - ns_input: where the first pass writes X, rounded to bfloat16 in the input's row-major
//   layout, and the kNsNormBlocks partial sums of its squares (ns_round.cuh's
//   ns_round_and_square_kernel), in `work`;
// - newton_schulz_cuda_rounded: the rest, from there (normalize, iterate); *result is then
//   the orthogonalized matrix, bfloat16 in the input's row-major layout, inside `work`.
// The shape limits are newton_schulz_cuda's (ns_dims_ok; the caller checks them first).
constexpr int kNsNormBlocks = 1024;
struct NsInput {
  __nv_bfloat16* x;
  float* partials;  // [kNsNormBlocks]
};
bool ns_dims_ok(int64_t rows, int64_t cols);
NsInput ns_input(void* work, int64_t rows, int64_t cols);
NsStatus newton_schulz_cuda_rounded(const CublasCalls& calls, cublasHandle_t blas, int64_t rows,
                                    int64_t cols, const NewtonSchulz& ns, void* work,
                                    cudaStream_t stream, const __nv_bfloat16** result);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_NEWTON_SCHULZ_CUH_
