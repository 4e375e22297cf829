// kernels/cuda/adam_quant8_cuda.cu — the CUDA Adam kernel for q8 (8-bit blockwise) moments,
// in its own translation unit so that it compiles beside adam_cuda.cu. Tables, chunks and
// the step's verdict as in adam_cuda.cu; the element update is the float32-moment
// Variant's, between a decode and an encode of each 256-element block.
#include <cuda_runtime.h>

#include <cstdint>

#include "../quant8.h"
#include "../variants.h"
#include "adam_cuda.cuh"
#include "cuda_ops.cuh"
#include "master.cuh"
#include "storage.cuh"

namespace sa {
namespace kernels {
namespace {

// A warp per block of kQuant8Block elements, 8 consecutive elements per lane: decode the
// block's moments, update each element as the float32-moment Signature S does, take the
// new absmax over the warp, encode. The same functions of quant8.h as the CPU, so the
// same bits.
static_assert(kQuant8Block == 32 * 8, "a warp of 8 elements per lane covers a q8 block");
static_assert(kCudaChunkElems % kQuant8Block == 0, "chunks start on q8 block boundaries");

__device__ __forceinline__ float absmax_combine(float a, float b) {
  return (b > a || b != b) ? b : a;  // quant8_absmax's rule: the max, NaN wins
}

template <class S, bool kL2>
__device__ void update_quant8_block(const TensorSlot& slot, int64_t block,
                                    const AdamCoeffs<float>& c, const uint32_t (*maps)[256],
                                    int lane) {
  constexpr int kPerLane = 8;
  constexpr int kMoments = S::kAmsgrad ? 3 : 2;
  const TypedSlot<S> a(slot);  // param, grad and master; the moments are read below
  const int64_t first = block * kQuant8Block + lane * kPerLane;
  float mom[3][kPerLane];
#pragma unroll
  for (int k = 0; k < kMoments; ++k) {
    const auto* codes = static_cast<const uint8_t*>(slot.state[static_cast<int>(quant8_codes(k))]);
    const float absmax =
        static_cast<const float*>(slot.state[static_cast<int>(quant8_absmax_state(k))])[block];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      mom[k][j] = first + j < slot.numel
                      ? quant8_decode(maps[quant8_signed(k) ? 0 : 1], codes[first + j], absmax)
                      : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t i = first + j;
    if (i >= slot.numel) break;
    float p = Master<S::kParam, S::kMaster>::load(a, i);
    float vmax = S::kAmsgrad ? mom[2][j] : 0.0f;
    adam_update<kL2, S::kAmsgrad>(CudaOps{}, c, Storage<S::kGrad>::load(a.grad, i), p, mom[0][j],
                                  mom[1][j], vmax);
    if (S::kAmsgrad) mom[2][j] = vmax;
    Master<S::kParam, S::kMaster>::store(a, i, p);
  }
#pragma unroll
  for (int k = 0; k < kMoments; ++k) {
    float absmax = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (first + j < slot.numel) absmax = absmax_combine(absmax, fabsf(mom[k][j]));
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      absmax = absmax_combine(absmax, __shfl_xor_sync(0xFFFFFFFFu, absmax, offset));
    auto* codes = static_cast<uint8_t*>(slot.state[static_cast<int>(quant8_codes(k))]);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (first + j < slot.numel)
        codes[first + j] = quant8_encode(maps[quant8_signed(k) ? 0 : 1], mom[k][j], absmax);
    if (lane == 0)
      static_cast<float*>(slot.state[static_cast<int>(quant8_absmax_state(k))])[block] = absmax;
  }
}

// S: the float32-moment Signature of the bucket's q8 Variant.
template <class S>
__global__ void __launch_bounds__(kCudaBlockThreads, SA_CUDA_MIN_BLOCKS_PER_SM)
    adam_bucket_kernel_quant8(DeviceBucket bucket, DeviceStep step) {
  if (step.verdict->skip) return;
  __shared__ uint32_t maps[2][256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    maps[0][i] = kQuant8SignedMap[i];
    maps[1][i] = kQuant8UnsignedMap[i];
  }
  __syncthreads();
  ChunkWork w;
  if (!chunk_work(bucket, step, w)) return;
  const int warps = static_cast<int>(blockDim.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (int64_t b = w.begin / kQuant8Block + static_cast<int>(threadIdx.x) / 32;
       b * kQuant8Block < w.end; b += warps) {
    if (w.coeffs.l2)
      update_quant8_block<S, true>(w.slot, b, w.coeffs.c, maps, lane);
    else
      update_quant8_block<S, false>(w.slot, b, w.coeffs.c, maps, lane);
  }
}

template <class S>
cudaError_t launch_typed_quant8(const DeviceBucket& bucket, const DeviceStep& step,
                                cudaStream_t stream) {
  adam_bucket_kernel_quant8<S>
      <<<static_cast<unsigned>(bucket.num_chunks), kCudaBlockThreads, 0, stream>>>(bucket, step);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_adam_bucket_quant8(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                                      cudaStream_t st) {
  if (b.num_chunks == 0) return cudaSuccess;
  Variant inner = v;  // a block storage: the float32 Variant's update, per block
  inner.moment = ElemType::f32;
  cudaError_t err = cudaErrorInvalidValue;  // the core never builds a Variant not in the table
  visit_variant(inner,
                [&](auto signature) { err = launch_typed_quant8<decltype(signature)>(b, s, st); });
  return err;
}

}  // namespace kernels
}  // namespace sa
