// kernels/cuda/newton_schulz.cu — see newton_schulz.cuh.
#include <cuda_bf16.h>

#include <utility>

#include "grid.cuh"
#include "newton_schulz.cuh"
#include "ns_round.cuh"

namespace sa {
namespace kernels {
namespace {

constexpr int kThreads = kNsThreads;

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Where each part of the scratch starts, in bytes from `work` (256-byte aligned), and its
// size: newton_schulz_cuda_work_bytes and carve both read this one layout.
struct Layout {
  size_t x, y, a, b, partials, end;
};

Layout layout_of(const NsShape& s) {
  const size_t xn = static_cast<size_t>(s.m * s.n) * sizeof(__nv_bfloat16);
  const size_t mm = static_cast<size_t>(s.m * s.m) * sizeof(__nv_bfloat16);
  Layout l{};
  l.y = l.x + round_up(xn);
  l.a = l.y + round_up(xn);
  l.b = l.a + round_up(mm);
  l.partials = l.b + round_up(mm);
  l.end = l.partials + round_up(kNsNormBlocks * sizeof(float));
  return l;
}

// The scratch, carved from `work`.
struct Scratch {
  __nv_bfloat16* x;
  __nv_bfloat16* y;
  __nv_bfloat16* a;
  __nv_bfloat16* b;
  float* partials;  // [kNsNormBlocks]
};

Scratch carve(void* work, const NsShape& s) {
  char* at = static_cast<char*>(work);
  const Layout l = layout_of(s);
  return {reinterpret_cast<__nv_bfloat16*>(at + l.x), reinterpret_cast<__nv_bfloat16*>(at + l.y),
          reinterpret_cast<__nv_bfloat16*>(at + l.a), reinterpret_cast<__nv_bfloat16*>(at + l.b),
          reinterpret_cast<float*>(at + l.partials)};
}

// A plain float32 input, as ns_round_and_square_kernel's source.
struct FloatSource {
  const float* x;
  __device__ void begin() {}
  __device__ float operator()(int64_t i) const { return x[i]; }
};

// x /= max(sqrt(sum of the partials), eps), in bfloat16 as torch divides; every block
// folds the partials itself, in the same order.
__global__ void normalize_kernel(__nv_bfloat16* x, int64_t n, const float* partials, float eps) {
  __shared__ float inverse;
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int i = 0; i < kNsNormBlocks; ++i) total += partials[i];
    inverse = 1.0f / fmaxf(sqrtf(total), eps);
  }
  __syncthreads();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * inverse);
}

// B := b A + a I, each element in float32 rounded once to bfloat16: the part of
// B' = a I + b A + c A A to which the next GEMM adds c A A. With a on the diagonal, the
// iteration's X := a X + (b A + c A A) X is one GEMM, B' X, into the other buffer: no copy of
// X for a GEMM's C input, no read of it there.
__global__ void poly_init_kernel(const __nv_bfloat16* a_mat, __nv_bfloat16* b_out, int64_t m,
                                 float a, float b) {
  const int64_t n = m * m;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    b_out[i] = __float2bfloat16_rn(fmaf(b, __bfloat162float(a_mat[i]), i / m == i % m ? a : 0.0f));
}

__global__ void widen_kernel(const __nv_bfloat16* in, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    out[i] = __bfloat162float(in[i]);
}

// C := alpha op(A) op(B) + beta C, column-major, bfloat16 in and out, float32 accumulation.
cublasStatus_t gemm(const CublasCalls& calls, cublasHandle_t h, cublasOperation_t ta,
                    cublasOperation_t tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                    float beta, __nv_bfloat16* c, int64_t ldc) {
  return calls.gemm_ex(h, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                       &alpha, a, CUDA_R_16BF, static_cast<int>(lda), b, CUDA_R_16BF,
                       static_cast<int>(ldb), &beta, c, CUDA_R_16BF, static_cast<int>(ldc),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

}  // namespace

size_t newton_schulz_cuda_work_bytes(int64_t rows, int64_t cols) {
  return layout_of(ns_shape(rows, cols)).end;
}

bool ns_dims_ok(int64_t rows, int64_t cols) {  // cuBLAS takes int dimensions
  return rows > 0 && cols > 0 && ns_shape(rows, cols).n <= INT32_MAX;
}

NsInput ns_input(void* work, int64_t rows, int64_t cols) {
  const Scratch w = carve(work, ns_shape(rows, cols));
  return {w.x, w.partials};
}

NsStatus newton_schulz_cuda(const CublasCalls& calls, cublasHandle_t blas, float* x, int64_t rows,
                            int64_t cols, const NewtonSchulz& ns, void* work, cudaStream_t stream) {
  NsStatus st;
  if (!ns_dims_ok(rows, cols)) {
    st.blas = CUBLAS_STATUS_INVALID_VALUE;
    return st;
  }
  const int64_t elems = rows * cols;
  const NsInput in = ns_input(work, rows, cols);
  ns_round_and_square_kernel<<<kNsNormBlocks, kThreads, 0, stream>>>(FloatSource{x}, elems, in.x,
                                                                     in.partials);
  if ((st.cuda = cudaGetLastError()) != cudaSuccess) return st;
  const __nv_bfloat16* result = nullptr;
  st = newton_schulz_cuda_rounded(calls, blas, rows, cols, ns, work, stream, &result);
  if (!st.ok()) return st;
  widen_kernel<<<grid_for(elems, kThreads), kThreads, 0, stream>>>(result, elems, x);
  st.cuda = cudaGetLastError();
  return st;
}

NsStatus newton_schulz_cuda_rounded(const CublasCalls& calls, cublasHandle_t blas, int64_t rows,
                                    int64_t cols, const NewtonSchulz& ns, void* work,
                                    cudaStream_t stream, const __nv_bfloat16** result) {
  NsStatus st;
  if (!ns_dims_ok(rows, cols)) {
    st.blas = CUBLAS_STATUS_INVALID_VALUE;
    return st;
  }
  const NsShape s = ns_shape(rows, cols);
  const int64_t elems = rows * cols, m = s.m, n = s.n;
  Scratch w = carve(work, s);
  if ((st.blas = calls.set_stream(blas, stream)) != CUBLAS_STATUS_SUCCESS) return st;
  normalize_kernel<<<grid_for(elems, kThreads), kThreads, 0, stream>>>(w.x, elems, w.partials,
                                                                       ns.eps);
  if ((st.cuda = cudaGetLastError()) != cudaSuccess) return st;
  // cuBLAS is column-major. Not transposed: the buffer is X^T (n x m, ld n), so
  // A = X X^T = (X^T)^T X^T, and the next X^T = X^T B' (B' = a I + b A + c A A, symmetric).
  // Transposed: the buffer is X (m x n, ld m) itself, and the next X = B' X. Either way the
  // buffer is laid out as the row-major rows x cols input.
  for (int32_t step = 0; step < ns.steps; ++step) {
    st.blas = s.transposed ? gemm(calls, blas, CUBLAS_OP_N, CUBLAS_OP_T, m, m, n, 1.0f, w.x, m, w.x,
                                  m, 0.0f, w.a, m)
                           : gemm(calls, blas, CUBLAS_OP_T, CUBLAS_OP_N, m, m, n, 1.0f, w.x, n, w.x,
                                  n, 0.0f, w.a, m);
    if (st.blas != CUBLAS_STATUS_SUCCESS) return st;
    poly_init_kernel<<<grid_for(m * m, kThreads), kThreads, 0, stream>>>(w.a, w.b, m, ns.a, ns.b);
    if ((st.cuda = cudaGetLastError()) != cudaSuccess) return st;
    st.blas =
        gemm(calls, blas, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, ns.c, w.a, m, w.a, m, 1.0f, w.b, m);
    if (st.blas != CUBLAS_STATUS_SUCCESS) return st;
    st.blas = s.transposed ? gemm(calls, blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, m, 1.0f, w.b, m, w.x,
                                  m, 0.0f, w.y, m)
                           : gemm(calls, blas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, m, 1.0f, w.x, n, w.b,
                                  m, 0.0f, w.y, n);
    if (st.blas != CUBLAS_STATUS_SUCCESS) return st;
    std::swap(w.x, w.y);
  }
  *result = w.x;
  return st;
}

}  // namespace kernels
}  // namespace sa
