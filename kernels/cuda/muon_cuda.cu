// kernels/cuda/muon_cuda.cu — see muon_cuda.cuh.
#include "grid.cuh"
#include "muon_cuda.cuh"
#include "ns_round.cuh"

namespace sa {
namespace kernels {
namespace {

constexpr int kThreads = 256;

// The verdict's, or 1 with none.
__device__ float grad_scale_of(const StepVerdict* verdict) {
  return verdict != nullptr ? verdict->grad_multiplier : 1.0f;
}

__device__ bool skipped(const StepVerdict* verdict) {
  return verdict != nullptr && verdict->skip != 0;
}

// Muon's momentum as Newton-Schulz's first pass reads its input (ns_round.cuh): buf
// advanced, the direction u returned. A skipped step leaves buf as it was and gives zeros,
// whose orthogonalization apply_kernel does not read either.
struct MomentumSource {
  MuonCoeffs c;
  const StepVerdict* verdict;
  const float* grad;
  float* buf;
  bool skip = false;
  __device__ void begin() {
    skip = skipped(verdict);
    c.grad_scale = grad_scale_of(verdict);
  }
  __device__ float operator()(int64_t i) {
    if (skip) return 0.0f;
    float b = buf[i];
    const float u = muon_momentum(c, grad[i], b);
    buf[i] = b;
    return u;
  }
};

// The orthogonalized direction o (bfloat16, the matrix's row-major layout) applied.
__global__ void apply_kernel(MuonCoeffs c, const StepVerdict* verdict, float* param,
                             const __nv_bfloat16* o, int64_t n) {
  if (skipped(verdict)) return;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    param[i] = muon_apply(c, param[i], __bfloat162float(o[i]));
}

// A box's momentum: buf advanced and, with `dir`, the direction written there (row r of
// the box at dir + r * ld).
__global__ void box_momentum_kernel(MuonCoeffs c, MatrixBox box, const StepVerdict* verdict,
                                    const float* grad, float* buf, float* dir, int64_t ld) {
  if (skipped(verdict)) return;
  c.grad_scale = grad_scale_of(verdict);
  const int64_t n = box.box_rows * box.box_cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float b = buf[i];
    const float u = muon_momentum(c, grad[i], b);
    buf[i] = b;
    if (dir != nullptr) dir[i / box.box_cols * ld + i % box.box_cols] = u;
  }
}

// A box's orthogonalized direction (row r at dir + r * ld) applied to the box's param.
__global__ void box_apply_kernel(MuonCoeffs c, MatrixBox box, const StepVerdict* verdict,
                                 float* param, const float* dir, int64_t ld) {
  if (skipped(verdict)) return;
  const int64_t n = box.box_rows * box.box_cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    param[i] = muon_apply(c, param[i], dir[i / box.box_cols * ld + i % box.box_cols]);
}

}  // namespace

cudaError_t muon_box_momentum_cuda(const MuonHyper& h, const MatrixBox& box,
                                   const StepVerdict* verdict, const float* grad, float* buf,
                                   float* dir, int64_t ld, cudaStream_t stream) {
  const int64_t n = box.box_rows * box.box_cols;
  if (n == 0) return cudaSuccess;
  box_momentum_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      muon_coeffs(h, box.rows, box.cols), box, verdict, grad, buf, dir, ld);
  return cudaGetLastError();
}

cudaError_t muon_box_apply_cuda(const MuonHyper& h, const MatrixBox& box,
                                const StepVerdict* verdict, const float* dir, int64_t ld,
                                float* param, cudaStream_t stream) {
  const int64_t local = box.box_rows * box.box_cols;
  if (local == 0) return cudaSuccess;
  box_apply_kernel<<<grid_for(local, kThreads), kThreads, 0, stream>>>(
      muon_coeffs(h, box.rows, box.cols), box, verdict, param, dir, ld);
  return cudaGetLastError();
}

size_t muon_cuda_work_bytes(int64_t rows, int64_t cols) {
  return newton_schulz_cuda_work_bytes(rows, cols);
}

NsStatus muon_matrix_cuda(const CublasCalls& calls, cublasHandle_t blas, float* param,
                          const float* grad, float* buf, int64_t rows, int64_t cols,
                          const MuonHyper& h, const StepVerdict* verdict, void* work,
                          cudaStream_t stream) {
  NsStatus st;
  if (!ns_dims_ok(rows, cols)) {  // before anything changes
    st.blas = CUBLAS_STATUS_INVALID_VALUE;
    return st;
  }
  const MuonCoeffs c = muon_coeffs(h, rows, cols);
  const int64_t n = rows * cols;
  const NsInput in = ns_input(work, rows, cols);
  // Momentum fused into the first pass: u is rounded to bfloat16 where it is made.
  ns_round_and_square_kernel<<<kNsNormBlocks, kNsThreads, 0, stream>>>(
      MomentumSource{c, verdict, grad, buf}, n, in.x, in.partials);
  if ((st.cuda = cudaGetLastError()) != cudaSuccess) return st;
  const __nv_bfloat16* o = nullptr;
  st = newton_schulz_cuda_rounded(calls, blas, rows, cols, h.ns, work, stream, &o);
  if (!st.ok()) return st;
  apply_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(c, verdict, param, o, n);
  st.cuda = cudaGetLastError();
  return st;
}

}  // namespace kernels
}  // namespace sa
