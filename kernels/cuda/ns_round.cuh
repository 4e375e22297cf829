// kernels/cuda/ns_round.cuh — the first pass of newton_schulz_cuda (newton_schulz.cuh) as a
// kernel template, for CUDA translation units that fuse their own elementwise work into it
// (muon_cuda.cu: Muon's momentum; newton_schulz.cu: a plain float32 input), and the grouped
// float32 accesses those passes share.
#ifndef SHARDADAM_KERNELS_CUDA_NS_ROUND_CUH_
#define SHARDADAM_KERNELS_CUDA_NS_ROUND_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "newton_schulz.cuh"
#include "storage.cuh"

namespace sa {
namespace kernels {

constexpr int kNsThreads = 256;

// Elements per thread and round of the Muon and Newton-Schulz passes over float32 arrays: a
// float4 of float32, 8 bytes of bfloat16. The elements a thread takes, and the order it sums
// them in, depend on n alone, never on whether an array allows vector accesses: a grouped
// pass gives the same bits from any pointer.
constexpr int kNsGroup = 4;

using BF16 = Storage<ElemType::bf16>;

__device__ __forceinline__ uint16_t* bf16_bits(__nv_bfloat16* p) {
  return reinterpret_cast<uint16_t*>(p);
}
__device__ __forceinline__ const uint16_t* bf16_bits(const __nv_bfloat16* p) {
  return reinterpret_cast<const uint16_t*>(p);
}

// Whether an array of T at p takes vector accesses at every kNsGroup-th element (host side:
// a launch picks the form once).
template <ElemType T>
bool group_ok(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (kNsGroup * sizeof(StorageOf<T>)) == 0;
}

// The kNsGroup elements of T at p[i..) as floats, one vector access where `vec`, else one at
// a time.
template <ElemType T>
__device__ __forceinline__ void load_group(const StorageOf<T>* p, int64_t i, bool vec,
                                           float (&x)[kNsGroup]) {
  if (vec) {
    Storage<T>::template load_vec<kNsGroup>(p, i, x);
  } else {
#pragma unroll
    for (int k = 0; k < kNsGroup; ++k) x[k] = Storage<T>::load(p, i + k);
  }
}

template <ElemType T>
__device__ __forceinline__ void store_group(StorageOf<T>* p, int64_t i, bool vec,
                                            const float (&x)[kNsGroup]) {
  if (vec) {
    Storage<T>::template store_vec<kNsGroup>(p, i, x);
  } else {
#pragma unroll
    for (int k = 0; k < kNsGroup; ++k) Storage<T>::store(p, i + k, x[k]);
  }
}

// The sum of every thread's `value` in a block of kNsThreads, the same fixed tree every time;
// every thread of the block calls it, and every thread gets the sum.
__device__ __forceinline__ float block_sum(float value) {
  __shared__ float sums[kNsThreads];
  sums[threadIdx.x] = value;
  __syncthreads();
  for (int half = kNsThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  return sums[0];
}

// out[i] := source(i) rounded to bfloat16 (i < n), and each block's sum of the rounded
// values' squares into partials[blockIdx.x]; launched as <<<kNsNormBlocks, kNsThreads>>>, so
// the partials fold in the same order every time (deterministic). Each thread takes groups
// of kNsGroup elements: source.group(i, u) for a whole group at i, source(i) one element of
// the last, partial one. `source` is a functor: source.begin() once per thread first (it may
// write its own state). `out` is 256-byte aligned (newton_schulz.cuh's work).
template <class Source>
__global__ void ns_round_and_square_kernel(Source source, int64_t n, __nv_bfloat16* out,
                                           float* partials) {
  source.begin();
  uint16_t* bits = bf16_bits(out);
  float sum = 0.0f;
  constexpr int64_t kStride = static_cast<int64_t>(kNsNormBlocks) * kNsThreads * kNsGroup;
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(kNsThreads) + threadIdx.x) * kNsGroup; i < n;
       i += kStride) {
    if (n - i >= kNsGroup) {
      float u[kNsGroup];
      source.group(i, u);
#pragma unroll
      for (int k = 0; k < kNsGroup; ++k) {
        u[k] = BF16::ToFloat(BF16::FromFloat(u[k]));
        sum = fmaf(u[k], u[k], sum);
      }
      BF16::store_vec<kNsGroup>(bits, i, u);
    } else {
      for (int64_t j = i; j < n; ++j) {
        const uint16_t v = BF16::FromFloat(source(j));
        bits[j] = v;
        const float f = BF16::ToFloat(v);
        sum = fmaf(f, f, sum);
      }
    }
  }
  const float total = block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_NS_ROUND_CUH_
