// kernels/cuda/cuda_ops.cuh — adam_update()'s arithmetic on the GPU. The _rn intrinsics
// are never contracted or reassociated by nvcc (whatever --fmad says), so the CUDA
// results equal the CPU's bit for bit (adam_math.h rule 1).
#ifndef SHARDADAM_KERNELS_CUDA_CUDA_OPS_CUH_
#define SHARDADAM_KERNELS_CUDA_CUDA_OPS_CUH_

#include "../adam_math.h"

namespace sa {
namespace kernels {

struct CudaOps {
  __device__ __forceinline__ float mul(float a, float b) const { return __fmul_rn(a, b); }
  __device__ __forceinline__ float fma(float a, float b, float c) const {
    return __fmaf_rn(a, b, c);
  }
  __device__ __forceinline__ float sqrt(float a) const { return __fsqrt_rn(a); }
  __device__ __forceinline__ float div(float a, float b) const { return __fdiv_rn(a, b); }
  __device__ __forceinline__ float max(float a, float b) const { return a > b ? a : b; }
};

// N elements through one adam_update(), for kernels that hold several elements per thread.
// The results are CudaOps' bit for bit; what differs is the schedule. nvcc expands each
// __fsqrt_rn and __fdiv_rn into a short fast path and a branch around a slow one, and the
// branch keeps one element's dependent chain (MUFU.RSQ, three FMAs, MUFU.RCP, five FMAs)
// from overlapping the next element's. Here the N fast paths run side by side, one range
// test covers them all, and only when an element falls outside it do all N take the
// intrinsics (which give the fast path's bits wherever the test passes).
template <int N>
struct CudaLanes {
  float x[N];
};

template <int N>
struct CudaLaneOps {
  using V = CudaLanes<N>;
  __device__ __forceinline__ static uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }
  template <class Fn>
  __device__ __forceinline__ static V map(Fn fn) {
    V r;
#pragma unroll
    for (int j = 0; j < N; ++j) r.x[j] = fn(j);
    return r;
  }
  __device__ __forceinline__ V mul(const V& a, const V& b) const {
    return map([&](int j) { return CudaOps{}.mul(a.x[j], b.x[j]); });
  }
  __device__ __forceinline__ V fma(const V& a, const V& b, const V& c) const {
    return map([&](int j) { return CudaOps{}.fma(a.x[j], b.x[j], c.x[j]); });
  }
  __device__ __forceinline__ V max(const V& a, const V& b) const {
    return map([&](int j) { return CudaOps{}.max(a.x[j], b.x[j]); });
  }
  // sqrt.rn.f32's fast path as ptxas emits it, for a positive normal a of at least 2^-101
  // (its own test, below); anything else (zero, subnormal, negative, infinite, NaN) takes
  // __fsqrt_rn. tests/gpu/test_cuda_lane_ops.cu checks every float32.
  // (The tests below take the largest of the lanes' offsets from the range's start: one
  // unsigned max per operand, then one comparison.)
  static constexpr uint32_t kSqrtLow = 0x0D000000u, kSqrtRange = 0x727FFFFFu;
  __device__ __forceinline__ static float sqrt_fast(float a) {
    float y;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(a));
    const float s = __fmul_rn(a, y), half_y = __fmul_rn(y, 0.5f);
    return __fmaf_rn(__fmaf_rn(-s, s, a), half_y, s);
  }
  __device__ __forceinline__ V sqrt(const V& a) const {
    uint32_t offset = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) offset = umax(offset, float_bits(a.x[j]) - kSqrtLow);
    if (offset <= kSqrtRange) return map([&](int j) { return sqrt_fast(a.x[j]); });
    return map([&](int j) { return CudaOps{}.sqrt(a.x[j]); });
  }
  // div.rn.f32's fast path as ptxas emits it (a reciprocal refined once, a quotient, its
  // remainder, the corrected quotient), taken where |a| and b lie in [2^-60, 2^60]: then
  // no step overflows or underflows, inside the range where ptxas's own check (FCHK)
  // takes the same path. Elsewhere (zero, b <= 0, NaN, ...) __fdiv_rn.
  static constexpr uint32_t kDivLow = 0x21800000u;   // 2^-60
  static constexpr uint32_t kDivHigh = 0x5D800000u;  // 2^60

  __device__ __forceinline__ static float div_fast(float a, float b) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    r = __fmaf_rn(r, __fmaf_rn(-b, r, 1.0f), r);
    const float q = __fmaf_rn(a, r, 0.0f);
    return __fmaf_rn(r, __fmaf_rn(-b, q, a), q);
  }
  __device__ __forceinline__ V div(const V& a, const V& b) const {
    uint32_t offset = 0;
#pragma unroll
    for (int j = 0; j < N; ++j)
      offset = umax(umax(offset, (float_bits(a.x[j]) & 0x7FFFFFFFu) - kDivLow),
                    float_bits(b.x[j]) - kDivLow);
    if (offset <= kDivHigh - kDivLow) return map([&](int j) { return div_fast(a.x[j], b.x[j]); });
    return map([&](int j) { return CudaOps{}.div(a.x[j], b.x[j]); });
  }
};

// A step's coefficients, each repeated across N lanes (CudaLaneOps' V).
template <int N>
__device__ __forceinline__ AdamCoeffs<CudaLanes<N>> broadcast(const AdamCoeffs<float>& c) {
  const auto all = [](float v) { return CudaLaneOps<N>::map([&](int) { return v; }); };
  return {all(c.grad_scale),
          all(c.l2_weight_decay),
          all(c.decay_factor),
          all(c.beta1),
          all(c.one_minus_beta1),
          all(c.beta2),
          all(c.one_minus_beta2),
          all(c.eps),
          all(c.inv_sqrt_bias_correction2),
          all(c.neg_step_size)};
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_CUDA_OPS_CUH_
