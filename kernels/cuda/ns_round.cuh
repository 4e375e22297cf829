// kernels/cuda/ns_round.cuh — the first pass of newton_schulz_cuda (newton_schulz.cuh) as a
// kernel template, for CUDA translation units that fuse their own elementwise work into it
// (muon_cuda.cu: Muon's momentum; newton_schulz.cu: a plain float32 input).
#ifndef SHARDADAM_KERNELS_CUDA_NS_ROUND_CUH_
#define SHARDADAM_KERNELS_CUDA_NS_ROUND_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "newton_schulz.cuh"

namespace sa {
namespace kernels {

constexpr int kNsThreads = 256;

// out[i] := source(i) rounded to bfloat16 (i < n), and each block's sum of the rounded
// values' squares into partials[blockIdx.x]; launched as <<<kNsNormBlocks, kNsThreads>>>, so
// the partials fold in the same order every time (deterministic). `source` is a functor:
// source.begin() once per thread, then source(i) per element (it may write its own state).
template <class Source>
__global__ void ns_round_and_square_kernel(Source source, int64_t n, __nv_bfloat16* out,
                                           float* partials) {
  __shared__ float sums[kNsThreads];
  source.begin();
  float sum = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kNsThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(kNsNormBlocks) * kNsThreads) {
    const __nv_bfloat16 v = __float2bfloat16_rn(source(i));
    out[i] = v;
    const float f = __bfloat162float(v);
    sum = fmaf(f, f, sum);
  }
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kNsThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_NS_ROUND_CUH_
