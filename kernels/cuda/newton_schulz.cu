// kernels/cuda/newton_schulz.cu — see newton_schulz.cuh.
#include <cuda_bf16.h>

#include <algorithm>
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
  size_t x, y, a, b, partials, cublas, end;
};

Layout layout_of(const NsShape& s) {
  const size_t xn = static_cast<size_t>(s.m * s.n) * sizeof(__nv_bfloat16);
  const size_t mm = static_cast<size_t>(s.m * s.m) * sizeof(__nv_bfloat16);
  Layout l{};
  l.y = l.x + round_up(xn);
  l.a = l.y + round_up(xn);
  l.b = l.a + round_up(mm);
  l.partials = l.b + round_up(mm);
  l.cublas = l.partials + round_up(kNsNormBlocks * sizeof(float));
  l.end = l.cublas + kNsCublasWorkspaceBytes;
  return l;
}

// The scratch, carved from `work`.
struct Scratch {
  __nv_bfloat16* x;
  __nv_bfloat16* y;
  __nv_bfloat16* a;
  __nv_bfloat16* b;
  float* partials;  // [kNsNormBlocks]
  void* cublas;     // kNsCublasWorkspaceBytes
};

Scratch carve(void* work, const NsShape& s) {
  char* at = static_cast<char*>(work);
  const Layout l = layout_of(s);
  return {reinterpret_cast<__nv_bfloat16*>(at + l.x), reinterpret_cast<__nv_bfloat16*>(at + l.y),
          reinterpret_cast<__nv_bfloat16*>(at + l.a), reinterpret_cast<__nv_bfloat16*>(at + l.b),
          reinterpret_cast<float*>(at + l.partials),  at + l.cublas};
}

// A plain float32 input, as ns_round_and_square_kernel's source; `vec`: x takes float4s.
struct FloatSource {
  const float* x;
  bool vec;
  __device__ void begin() {}
  __device__ float operator()(int64_t i) const { return x[i]; }
  __device__ void group(int64_t i, float (&u)[kNsGroup]) const {
    load_group<ElemType::f32>(x, i, vec, u);
  }
};

// The kNsNormBlocks partials' sum, the same in every block: each thread sums its strided
// share in order, then block_sum's tree. Every thread of the block calls it.
__device__ float fold_partials(const float* partials) {
  static_assert(kNsNormBlocks % kThreads == 0, "whole shares");
  float share = 0.0f;
  for (int i = threadIdx.x; i < kNsNormBlocks; i += kThreads) share += partials[i];
  return block_sum(share);
}

// Elements per thread and round of the bfloat16 passes: 16 bytes.
constexpr int kBf16Group = 8;

// Thread blocks of the normalize pass: each folds the partials once, so fewer than
// grid_for's cap, still enough to keep every SM's memory pipes full.
constexpr unsigned kNormalizeBlocks = 1024;

// x /= max(sqrt(sum of the partials), eps), in bfloat16 as torch divides. `x` is 256-byte
// aligned (the work's).
__global__ void normalize_kernel(__nv_bfloat16* x, int64_t n, const float* partials, float eps) {
  const float inverse = 1.0f / fmaxf(sqrtf(fold_partials(partials)), eps);
  uint16_t* bits = bf16_bits(x);
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x) * kBf16Group; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads * kBf16Group) {
    if (n - i >= kBf16Group) {
      float v[kBf16Group];
      BF16::load_vec<kBf16Group>(bits, i, v);
#pragma unroll
      for (int k = 0; k < kBf16Group; ++k) v[k] *= inverse;
      BF16::store_vec<kBf16Group>(bits, i, v);
    } else {
      for (int64_t j = i; j < n; ++j) BF16::store(bits, j, BF16::load(bits, j) * inverse);
    }
  }
}

// B := b A + a I, each element in float32 rounded once to bfloat16: the part of
// B' = a I + b A + c A A to which the next GEMM adds c A A. With a on the diagonal, the
// iteration's X := a X + (b A + c A A) X is one GEMM, B' X, into the other buffer: no copy of
// X for a GEMM's C input, no read of it there. A block takes whole rows, so the diagonal is
// found without a division; 16-byte accesses where rows start 16-byte aligned (m % 8 == 0:
// the work is 256-byte aligned).
__global__ void poly_init_kernel(const __nv_bfloat16* a_mat, __nv_bfloat16* b_out, int64_t m,
                                 float a, float b) {
  const uint16_t* in = bf16_bits(a_mat);
  uint16_t* out = bf16_bits(b_out);
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    const int64_t row = r * m;
    if (m % kBf16Group == 0) {
      for (int64_t c = threadIdx.x * static_cast<int64_t>(kBf16Group); c < m;
           c += static_cast<int64_t>(kThreads) * kBf16Group) {
        float v[kBf16Group];
        BF16::load_vec<kBf16Group>(in, row + c, v);
#pragma unroll
        for (int k = 0; k < kBf16Group; ++k) v[k] = fmaf(b, v[k], c + k == r ? a : 0.0f);
        BF16::store_vec<kBf16Group>(out, row + c, v);
      }
    } else {
      for (int64_t c = threadIdx.x; c < m; c += kThreads)
        BF16::store(out, row + c, fmaf(b, BF16::load(in, row + c), c == r ? a : 0.0f));
    }
  }
}

// out := in widened; `in` 256-byte aligned (the work's), `vec`: out takes float4s.
__global__ void widen_kernel(const __nv_bfloat16* in, int64_t n, float* out, bool vec) {
  const uint16_t* bits = bf16_bits(in);
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x) * kNsGroup; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads * kNsGroup) {
    if (n - i >= kNsGroup) {
      float v[kNsGroup];
      BF16::load_vec<kNsGroup>(bits, i, v);
      store_group<ElemType::f32>(out, i, vec, v);
    } else {
      for (int64_t j = i; j < n; ++j) out[j] = BF16::load(bits, j);
    }
  }
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
  ns_round_and_square_kernel<<<kNsNormBlocks, kThreads, 0, stream>>>(
      FloatSource{x, group_ok<ElemType::f32>(x)}, elems, in.x, in.partials);
  if ((st.cuda = cudaGetLastError()) != cudaSuccess) return st;
  const __nv_bfloat16* result = nullptr;
  st = newton_schulz_cuda_rounded(calls, blas, rows, cols, ns, work, stream, &result);
  if (!st.ok()) return st;
  widen_kernel<<<grid_for(elems, kThreads * kNsGroup), kThreads, 0, stream>>>(
      result, elems, x, group_ok<ElemType::f32>(x));
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
  // Setting the stream puts the handle back on cuBLAS's own workspace pool: ours after it.
  if ((st.blas = calls.set_stream(blas, stream)) != CUBLAS_STATUS_SUCCESS) return st;
  if ((st.blas = calls.set_workspace(blas, w.cublas, kNsCublasWorkspaceBytes)) !=
      CUBLAS_STATUS_SUCCESS)
    return st;
  normalize_kernel<<<std::min(grid_for(elems, kThreads * kBf16Group), kNormalizeBlocks), kThreads,
                     0, stream>>>(w.x, elems, w.partials, ns.eps);
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
    poly_init_kernel<<<grid_for(m, 1), kThreads, 0, stream>>>(w.a, w.b, m, ns.a, ns.b);
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
