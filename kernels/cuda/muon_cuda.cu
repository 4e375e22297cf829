// kernels/cuda/muon_cuda.cu — see muon_cuda.cuh.
#include "grid.cuh"
#include "muon_cuda.cuh"

namespace sa {
namespace kernels {
namespace {

constexpr int kThreads = 256;

size_t direction_bytes(int64_t rows, int64_t cols) {
  return (static_cast<size_t>(rows * cols) * sizeof(float) + 255) / 256 * 256;
}

// The verdict's, or 1 with none.
__device__ float grad_scale_of(const StepVerdict* verdict) {
  return verdict != nullptr ? verdict->grad_multiplier : 1.0f;
}

__device__ bool skipped(const StepVerdict* verdict) {
  return verdict != nullptr && verdict->skip != 0;
}

// A skipped step leaves u as it was: Newton-Schulz then reads stale scratch, whose result
// apply_kernel does not read either.
__global__ void momentum_kernel(MuonCoeffs c, const StepVerdict* verdict, const float* grad,
                                float* buf, float* u, int64_t n) {
  if (skipped(verdict)) return;
  c.grad_scale = grad_scale_of(verdict);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float b = buf[i];
    u[i] = muon_momentum(c, grad[i], b);
    buf[i] = b;
  }
}

__global__ void apply_kernel(MuonCoeffs c, const StepVerdict* verdict, float* param, const float* o,
                             int64_t n) {
  if (skipped(verdict)) return;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    param[i] = muon_apply(c, param[i], o[i]);
}

}  // namespace

size_t muon_cuda_work_bytes(int64_t rows, int64_t cols) {
  return direction_bytes(rows, cols) + newton_schulz_cuda_work_bytes(rows, cols);
}

NsStatus muon_matrix_cuda(const CublasCalls& calls, cublasHandle_t blas, float* param,
                          const float* grad, float* buf, int64_t rows, int64_t cols,
                          const MuonHyper& h, const StepVerdict* verdict, void* work,
                          cudaStream_t stream) {
  const MuonCoeffs c = muon_coeffs(h, rows, cols);
  const int64_t n = rows * cols;
  auto* u = static_cast<float*>(work);
  momentum_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(c, verdict, grad, buf, u, n);
  NsStatus st;
  if ((st.cuda = cudaGetLastError()) != cudaSuccess) return st;
  st = newton_schulz_cuda(calls, blas, u, rows, cols, h.ns,
                          static_cast<char*>(work) + direction_bytes(rows, cols), stream);
  if (!st.ok()) return st;
  apply_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(c, verdict, param, u, n);
  st.cuda = cudaGetLastError();
  return st;
}

}  // namespace kernels
}  // namespace sa
