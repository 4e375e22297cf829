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

// A box's momentum: buf advanced and, with `whole`, the direction written at the box.
__global__ void box_momentum_kernel(MuonCoeffs c, MatrixBox box, const StepVerdict* verdict,
                                    const float* grad, float* buf, double* whole) {
  if (skipped(verdict)) return;
  c.grad_scale = grad_scale_of(verdict);
  const int64_t n = box.box_rows * box.box_cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float b = buf[i];
    const float u = muon_momentum(c, grad[i], b);
    buf[i] = b;
    if (whole != nullptr)
      whole[(box.row0 + i / box.box_cols) * box.cols + box.col0 + i % box.box_cols] = u;
  }
}

// The whole direction, summed in doubles, back to the floats it was made of.
__global__ void narrow_kernel(const double* whole, float* u, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    u[i] = static_cast<float>(whole[i]);
}

// The orthogonalized floats back into the whole (exact).
__global__ void widen_kernel(const float* u, double* whole, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    whole[i] = u[i];
}

// A box of the orthogonalized direction o (the whole matrix) applied to the box's param.
__global__ void box_apply_kernel(MuonCoeffs c, MatrixBox box, const StepVerdict* verdict,
                                 float* param, const double* o) {
  if (skipped(verdict)) return;
  const int64_t n = box.box_rows * box.box_cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    param[i] = muon_apply(
        c, param[i], o[(box.row0 + i / box.box_cols) * box.cols + box.col0 + i % box.box_cols]);
}

}  // namespace

cudaError_t muon_box_momentum_cuda(const MuonHyper& h, const MatrixBox& box,
                                   const StepVerdict* verdict, const float* grad, float* buf,
                                   double* whole, cudaStream_t stream) {
  const int64_t n = box.box_rows * box.box_cols;
  if (n == 0) return cudaSuccess;
  box_momentum_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      muon_coeffs(h, box.rows, box.cols), box, verdict, grad, buf, whole);
  return cudaGetLastError();
}

NsStatus muon_orthogonalize_cuda(const CublasCalls& calls, cublasHandle_t blas,
                                 const NewtonSchulz& ns, int64_t rows, int64_t cols, double* whole,
                                 void* work, cudaStream_t stream) {
  const int64_t n = rows * cols;
  auto* u = static_cast<float*>(work);
  NsStatus st;
  narrow_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(whole, u, n);
  if ((st.cuda = cudaGetLastError()) != cudaSuccess) return st;
  st = newton_schulz_cuda(calls, blas, u, rows, cols, ns,
                          static_cast<char*>(work) + direction_bytes(rows, cols), stream);
  if (!st.ok()) return st;
  widen_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(u, whole, n);
  st.cuda = cudaGetLastError();
  return st;
}

cudaError_t muon_box_apply_cuda(const MuonHyper& h, const MatrixBox& box,
                                const StepVerdict* verdict, const double* whole, float* param,
                                cudaStream_t stream) {
  const int64_t local = box.box_rows * box.box_cols;
  if (local == 0) return cudaSuccess;
  box_apply_kernel<<<grid_for(local, kThreads), kThreads, 0, stream>>>(
      muon_coeffs(h, box.rows, box.cols), box, verdict, param, whole);
  return cudaGetLastError();
}

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
