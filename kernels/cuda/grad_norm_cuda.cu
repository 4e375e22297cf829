// kernels/cuda/grad_norm_cuda.cu — the gradient norm of a step, in two deterministic
// passes: one block per chunk of each bucket writes that chunk's partial (sum of squares
// in double, or the largest |g|), then a single block folds all partials in a fixed
// order. No atomics, so the norm is the same bits on every run.
#include <cuda_runtime.h>

#include <cstdint>

#include "adam_cuda.cuh"
#include "storage.cuh"

namespace sa {
namespace kernels {
namespace {

constexpr int kFinishThreads = 1024;

template <NormType N>
struct Accumulate;

template <>
struct Accumulate<NormType::l2> {
  __device__ static double add(double acc, float g) {
    const double x = g;
    return __fma_rn(x, x, acc);
  }
  __device__ static double combine(double a, double b) { return a + b; }
};

template <>
struct Accumulate<NormType::inf> {
  __device__ static double add(double acc, float g) {
    double a = fabs(static_cast<double>(g));
    if (isnan(a)) a = INFINITY;  // a NaN must not vanish in the max
    return fmax(acc, a);
  }
  __device__ static double combine(double a, double b) { return fmax(a, b); }
};

// The block-wide combine of one value per thread; the result is valid in thread 0.
template <NormType N, int kThreads>
__device__ double block_combine(double value) {
  __shared__ double warp_values[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    value = Accumulate<N>::combine(value, __shfl_down_sync(0xFFFFFFFFu, value, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_values[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kThreads / 32 ? warp_values[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2)
      value = Accumulate<N>::combine(value, __shfl_down_sync(0xFFFFFFFFu, value, offset));
  }
  return value;
}

template <ElemType G, NormType N>
__global__ void __launch_bounds__(kCudaBlockThreads)
    norm_partials_kernel(DeviceBucket bucket, double* partials) {
  const int64_t chunk = blockIdx.x;
  const int32_t s = slot_of_chunk(bucket, chunk);
  const TensorSlot slot = bucket.slots[s];
  if (!slot.in_norm || slot.grad == nullptr) {  // another replica counts it, or no grad
    if (threadIdx.x == 0) partials[chunk] = 0.0;
    return;
  }
  using GT = typename Storage<G>::type;
  const GT* grad = static_cast<const GT*>(slot.grad);
  const int64_t begin = (chunk - bucket.chunk_offsets[s]) * kCudaChunkElems;
  const int64_t end = min(begin + kCudaChunkElems, slot.numel);
  double acc = 0.0;
  int64_t scalar_begin = begin;
  if (aligned(grad, kVec * sizeof(GT))) {
    const int64_t vec_end = begin + (end - begin) / kVec * kVec;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < vec_end;
         i += static_cast<int64_t>(blockDim.x) * kVec) {
      float g[kVec];
      Storage<G>::load_vec(grad, i, g);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc = Accumulate<N>::add(acc, g[k]);
    }
    scalar_begin = vec_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += blockDim.x)
    acc = Accumulate<N>::add(acc, Storage<G>::load(grad, i));
  acc = block_combine<N, kCudaBlockThreads>(acc);
  if (threadIdx.x == 0) partials[chunk] = acc;
}

template <NormType N>
__global__ void __launch_bounds__(kFinishThreads)
    norm_finish_kernel(const double* partials, int64_t n, const float* found_inf, double* stats) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kFinishThreads)
    acc = Accumulate<N>::combine(acc, partials[i]);
  acc = block_combine<N, kFinishThreads>(acc);
  if (threadIdx.x == 0) {
    stats[kStatNorm] = acc;
    stats[kStatFoundInf] = (found_inf != nullptr && *found_inf != 0.0f) ? 1.0 : 0.0;
  }
}

template <ElemType G>
cudaError_t launch_partials(NormType norm, const DeviceBucket& bucket, double* partials,
                            cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(bucket.num_chunks);
  if (norm == NormType::inf)
    norm_partials_kernel<G, NormType::inf>
        <<<blocks, kCudaBlockThreads, 0, stream>>>(bucket, partials);
  else
    norm_partials_kernel<G, NormType::l2>
        <<<blocks, kCudaBlockThreads, 0, stream>>>(bucket, partials);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_grad_norm_partials(ElemType grad, NormType norm, const DeviceBucket& bucket,
                                      double* partials, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;  // a block storage is a moment's, never a grad's
  visit_elem_type(grad, [&](auto tag) {
    err = launch_partials<decltype(tag)::value>(norm, bucket, partials, stream);
  });
  return err;
}

cudaError_t launch_grad_norm_finish(NormType norm, const double* partials, int64_t n,
                                    const float* found_inf, double* stats, cudaStream_t stream) {
  if (norm == NormType::inf)
    norm_finish_kernel<NormType::inf>
        <<<1, kFinishThreads, 0, stream>>>(partials, n, found_inf, stats);
  else
    norm_finish_kernel<NormType::l2>
        <<<1, kFinishThreads, 0, stream>>>(partials, n, found_inf, stats);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace sa
