// kernels/cuda/adam_fp8_cuda.cu — the CUDA kernels of scaled (fp8) params, in their own
// translation unit so that they compile beside adam_cuda.cu and adam_block_cuda.cu.
//
// The step is one pass: the thread block of a chunk (adam_cuda.cuh's tables and chunks)
// updates each element's float32 master with adam_update(), as a float32 param's update
// (fp8_master_variant: the same function the CPU runs), then casts it while it is in a
// register. A thread holds kLaneElems consecutive elements of a tile of kTileElems, so a
// block of a block scaling is the kLaneElems-element runs of scaling_block / kLaneElems
// consecutive lanes of one warp (8 lanes for MXFP8's 32, the whole warp for block128's
// 128): their amax is reduced with __shfl_xor_sync over those lanes, on the float bits
// with quant8_absmax's rule (the integer max of the magnitudes' bits: order-independent and
// NaN-propagating, so from the same masters the CPU's loop and this tree give the same
// bits; a NaN master's payload is the device's own), and the first lane of the block stores
// its scale. The factor and the element cast are param_cast.h's block_cast_factor and
// cast_value, the functions the CPU's cast_block calls, so the codes and scales are the
// CPU's bits.
//
// A delayed scaling casts with the engine's scale (read from device memory once per
// thread), and where the slot has an amax tensor, folds max |master| of the shard into it
// with atomicMax on the magnitude's bits (an unsigned compare orders non-negative floats,
// and a NaN's bits exceed infinity's, so the result is the CPU's quant8_absmax bits, NaN
// included): a lane's elements, the warp by shuffles, then one atomicMax per warp. The
// amax starts from 0: a small kernel, launched on the stream before the update and
// checking the same verdict, zeroes the amax of every slot that the update will write
// (grad bound, elements present, step not skipped), the slots whose amax the CPU writes.
//
// Blocks never straddle a chunk or a tile: chunks and tiles start on multiples of every
// scaling's block within the slot (static_asserts below), and add_param refuses layouts
// whose shard is not whole blocks; a short last block is still handled as the CPU's
// for_each_scale_block does (its lanes past the shard contribute no magnitude).
//
// With block moments (q8, f8e4m3) the update is adam_block_cuda.cu's, a warp per 256-element
// moment block; fusing the cast there would put this file's lane layout inside that one, so
// such a bucket runs two launches instead: that kernel over the masters (a slot table of
// fp8_master_slot's), then cast_bucket_kernel, which casts each updated chunk from its
// master with the functions above (one more read of the master per element).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../param_cast.h"
#include "../variants.h"
#include "adam_cuda.cuh"
#include "adam_fp8_cuda.cuh"
#include "cuda_ops.cuh"
#include "grid.cuh"
#include "storage.cuh"

namespace sa {
namespace kernels {
namespace {

// Consecutive elements per thread per tile: one float4 of the master, one 4-byte word of
// codes.
constexpr int kLaneElems = 4;
constexpr int64_t kTileElems = int64_t{kCudaBlockThreads} * kLaneElems;
static_assert(kCudaChunkElems % kTileElems == 0, "tiles start at a chunk's start");

// Lanes that hold one block of scaling kS (0 for a per-tensor scaling).
template <ParamScaling kS>
constexpr int kBlockLanes = static_cast<int>(scaling_block(kS) / kLaneElems);

template <ParamScaling kS>
constexpr bool block_fits_a_warp() {
  constexpr int64_t kBlock = scaling_block(kS);
  constexpr int kLanes = kBlockLanes<kS>;
  if constexpr (kBlock == 0) {
    return true;
  } else {
    return kBlock % kLaneElems == 0 && kLanes >= 1 && kLanes <= 32 &&
           (kLanes & (kLanes - 1)) == 0 && kTileElems % kBlock == 0;
  }
}
#define SA_FP8_BLOCK_CHECK(name, value, block, scale_type, writes, doc) \
  static_assert(block_fits_a_warp<ParamScaling::name>(),                \
                "a block of " #name                                     \
                " is the runs of a power of two of lanes of one warp, " \
                "and tiles start on its blocks");
SA_PARAM_SCALINGS(SA_FP8_BLOCK_CHECK)
#undef SA_FP8_BLOCK_CHECK

// Elements of the lane's run [first, first + kLaneElems) that lie before `end`.
__device__ __forceinline__ int lane_count(int64_t first, int64_t end) {
  const int64_t left = end - first;
  return left >= kLaneElems ? kLaneElems : (left > 0 ? static_cast<int>(left) : 0);
}

// Updates the lane's n elements from `first` (S: a float32 param's Signature whose param is
// the master) and leaves their new masters in p (0 past n). vec: the arrays allow 16-byte
// (float32) and 8-byte (16-bit) accesses.
template <class S, bool kL2>
__device__ __forceinline__ void update_lane(const TypedSlot<S>& a, int64_t first, int n, bool vec,
                                            const AdamCoeffs<float>& c, float (&p)[kLaneElems]) {
  using M = Storage<S::kMoment>;
  using G = Storage<S::kGrad>;
  float g[kLaneElems], mom[kNumMoments][kLaneElems];
  if (vec && n == kLaneElems) {
    Storage<ElemType::f32>::load_vec(a.param, first, p);
    G::load_vec(a.grad, first, g);
    for_each_moment<S>([&](auto k) { M::load_vec(a.moment[k], first, mom[k]); });
  } else {
#pragma unroll
    for (int j = 0; j < kLaneElems; ++j) {
      p[j] = j < n ? a.param[first + j] : 0.0f;
      g[j] = j < n ? G::load(a.grad, first + j) : 0.0f;
      for_each_moment<S>(
          [&](auto k) { mom[k][j] = j < n ? M::load(a.moment[k], first + j) : 0.0f; });
    }
  }
#pragma unroll
  for (int j = 0; j < kLaneElems; ++j) {
    float e[kNumMoments];
    for_each_moment<S>([&](auto k) { e[k] = mom[k][j]; });
    adam_update<kL2, S::kAmsgrad>(CudaOps{}, c, g[j], p[j], e);
    for_each_moment<S>([&](auto k) { mom[k][j] = e[k]; });
    if (j >= n) p[j] = 0.0f;  // no magnitude for the amax
  }
  if (vec && n == kLaneElems) {
    Storage<ElemType::f32>::store_vec(a.param, first, p);
    for_each_moment<S>([&](auto k) { M::store_vec(a.moment[k], first, mom[k]); });
  } else {
#pragma unroll
    for (int j = 0; j < kLaneElems; ++j) {
      if (j >= n) continue;
      a.param[first + j] = p[j];
      for_each_moment<S>([&](auto k) { M::store(a.moment[k], first + j, mom[k][j]); });
    }
  }
}

// The lane's n masters from `first`, unchanged (0 past n): the cast without an update.
__device__ __forceinline__ void load_lane(const float* master, int64_t first, int n,
                                          float (&p)[kLaneElems]) {
  if (n == kLaneElems && aligned(master + first, 16)) {
    Storage<ElemType::f32>::load_vec(master, first, p);
  } else {
#pragma unroll
    for (int j = 0; j < kLaneElems; ++j) p[j] = j < n ? master[first + j] : 0.0f;
  }
}

// Casts the lane's n masters m (from element `first` of the slot) into the param, under
// `factor` for a delayed scaling, else under the factor of their block, whose amax the
// block's lanes reduce here (every lane of the warp must call this, with n = 0 past the
// shard). amax_bits accumulates max |m| (delayed; quant8_absmax's bits rule).
template <ElemType P, ParamScaling kS>
__device__ __forceinline__ void cast_lane(const float (&m)[kLaneElems], int n, int64_t first,
                                          const TensorSlot& slot, float factor,
                                          uint32_t& amax_bits) {
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < kLaneElems; ++j)
    if (j < n) bits = quant8_absmax_combine(bits, quant8_magnitude_bits(m[j]));
  if constexpr (scaling_block(kS) == 0) {
    amax_bits = quant8_absmax_combine(amax_bits, bits);
  } else {
    constexpr int kLanes = kBlockLanes<kS>;
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2)
      bits = quant8_absmax_combine(bits, __shfl_xor_sync(0xFFFFFFFFu, bits, offset));
    const bool leader = static_cast<int>(threadIdx.x) % kLanes == 0 && n > 0;
    factor =
        block_cast_factor<P, kS>(bits_float(bits), slot.scale, first / scaling_block(kS), leader);
  }
  uint8_t code[kLaneElems];
#pragma unroll
  for (int j = 0; j < kLaneElems; ++j) code[j] = cast_value<P>(m[j], factor);
  auto* param = static_cast<uint8_t*>(slot.param);
  if (n == kLaneElems && aligned(param + first, 4)) {
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < kLaneElems; ++j) w |= static_cast<uint32_t>(code[j]) << (8 * j);
    *reinterpret_cast<uint32_t*>(param + first) = w;
  } else {
#pragma unroll
    for (int j = 0; j < kLaneElems; ++j)
      if (j < n) param[first + j] = code[j];
  }
}

// The warp's largest amax bits, folded into *amax (one atomicMax per warp).
__device__ __forceinline__ void fold_amax(float* amax, uint32_t bits) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    bits = quant8_absmax_combine(bits, __shfl_xor_sync(0xFFFFFFFFu, bits, offset));
  if (threadIdx.x % 32 == 0 && bits != 0) atomicMax(reinterpret_cast<unsigned int*>(amax), bits);
}

// The factor of a per-tensor scaling (the scale tensor's first element: the engine's for a
// delayed scaling, the one written before the cast for a current one), 0 otherwise (block
// scalings take theirs per block).
template <ElemType P, ParamScaling kS>
__device__ __forceinline__ float delayed_factor(const TensorSlot& slot) {
  if constexpr (scaling_block(kS) == 0) return block_cast_factor<P, kS>(0.0f, slot.scale, 0, false);
  return 0.0f;
}

// The warp's largest magnitude bits, folded into *amax_bits (one atomicMax per warp).
__device__ __forceinline__ void fold_amax_bits(double* amax_bits, uint32_t bits) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    bits = quant8_absmax_combine(bits, __shfl_xor_sync(0xFFFFFFFFu, bits, offset));
  if (threadIdx.x % 32 == 0 && bits != 0)
    atomicMax(reinterpret_cast<unsigned long long*>(amax_bits),
              static_cast<unsigned long long>(__double_as_longlong(static_cast<double>(bits))));
}

// Max |master| of elements [begin, end) of a slot (every `stride` from the thread's first),
// folded into its amax_bits.
__device__ void fold_master_amax(const TensorSlot& slot, int64_t begin, int64_t end,
                                 int64_t stride) {
  const auto* master = static_cast<const float*>(slot.state[static_cast<int>(StateKind::master)]);
  uint32_t bits = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += stride)
    bits = quant8_absmax_combine(bits, quant8_magnitude_bits(master[i]));
  fold_amax_bits(slot.scale.amax_bits, bits);
}

// The update of chunk w and, while its new masters are in registers, the cast (delayed and
// block scalings), or for a current scaling the fold of their magnitudes into the slot's
// amax_bits (its cast waits for the tensor's amax: current_cast_kernel).
template <ElemType P, ParamScaling kS, class S, bool kL2>
__device__ void update_cast_chunk(const ChunkWork& w) {
  const TypedSlot<S> a(fp8_master_slot(w.slot));
  constexpr uintptr_t kMomentVec = kLaneElems * sizeof(StorageOf<S::kMoment>);
  bool vec = aligned(a.param, kLaneElems * sizeof(float)) &&
             aligned(a.grad, kLaneElems * sizeof(StorageOf<S::kGrad>));
  for_each_moment<S>([&](auto k) { vec = vec && aligned(a.moment[k], kMomentVec); });
  float factor = 0.0f;
  if constexpr (!is_current(kS)) factor = delayed_factor<P, kS>(w.slot);
  uint32_t amax_bits = 0;
  for (int64_t tile = w.begin; tile < w.end; tile += kTileElems) {
    const int64_t first = tile + static_cast<int64_t>(threadIdx.x) * kLaneElems;
    const int n = lane_count(first, w.end);
    float p[kLaneElems];
    update_lane<S, kL2>(a, first, n, vec, w.coeffs.c, p);
    if constexpr (is_current(kS)) {
#pragma unroll
      for (int j = 0; j < kLaneElems; ++j)  // 0 past n: no magnitude
        amax_bits = quant8_absmax_combine(amax_bits, quant8_magnitude_bits(p[j]));
    } else {
      cast_lane<P, kS>(p, n, first, w.slot, factor, amax_bits);
    }
  }
  if constexpr (is_current(kS))
    fold_amax_bits(w.slot.scale.amax_bits, amax_bits);
  else if (kS == ParamScaling::delayed && w.slot.scale.amax != nullptr)
    fold_amax(w.slot.scale.amax, amax_bits);
}

// P, kS: the bucket's param dtype and scaling; S: the Signature of its master's update.
// A current scaling's chunk of a param without a grad still folds its masters' amax: the
// cast pass casts every param with its tensor's new scale.
template <ElemType P, ParamScaling kS, class S>
__global__ void __launch_bounds__(kCudaBlockThreads)
    adam_scaled_kernel(DeviceBucket bucket, DeviceStep step) {
  if (step.verdict->skip) return;
  ChunkWork w;
  if (!chunk_work(bucket, step, blockIdx.x, w)) {
    if constexpr (is_current(kS)) {
      const ChunkRange c = chunk_range(bucket, blockIdx.x);
      fold_master_amax(c.slot, c.begin, c.end, blockDim.x);
    }
    return;
  }
  if (w.coeffs.l2)
    update_cast_chunk<P, kS, S, true>(w);
  else
    update_cast_chunk<P, kS, S, false>(w);
}

// Zeroes the amax of each slot the update writes one for (see the top of this file).
__global__ void reset_amax_kernel(DeviceBucket bucket, DeviceStep step) {
  if (step.verdict->skip) return;
  for (int32_t s = blockIdx.x * blockDim.x + threadIdx.x; s < bucket.num_slots;
       s += gridDim.x * blockDim.x) {
    const TensorSlot& slot = bucket.slots[s];
    if (slot.grad != nullptr && slot.numel > 0 && slot.scale.amax != nullptr)
      *slot.scale.amax = 0.0f;
  }
}

// Casts the tiles from `begin` (every `stride` elements) before `end` of a slot from its
// master, unchanged: the cast of an import, and of a step whose update ran before.
template <ElemType P, ParamScaling kS>
__device__ void cast_tiles(const TensorSlot& slot, int64_t begin, int64_t end, int64_t stride) {
  const auto* master = static_cast<const float*>(slot.state[static_cast<int>(StateKind::master)]);
  const float factor = delayed_factor<P, kS>(slot);
  uint32_t amax_bits = 0;
  for (int64_t tile = begin; tile < end; tile += stride) {
    const int64_t first = tile + static_cast<int64_t>(threadIdx.x) * kLaneElems;
    const int n = lane_count(first, end);
    float m[kLaneElems];
    load_lane(master, first, n, m);
    cast_lane<P, kS>(m, n, first, slot, factor, amax_bits);
  }
  if (kS == ParamScaling::delayed && slot.scale.amax != nullptr)
    fold_amax(slot.scale.amax, amax_bits);
}

// One slot, a grid-stride loop over its tiles.
template <ElemType P, ParamScaling kS>
__global__ void __launch_bounds__(kCudaBlockThreads) cast_kernel(TensorSlot slot) {
  cast_tiles<P, kS>(slot, blockIdx.x * kTileElems, slot.numel, gridDim.x * kTileElems);
}

// A bucket whose masters the block-moment kernel has just updated: chunk b's cast.
template <ElemType P, ParamScaling kS>
__global__ void __launch_bounds__(kCudaBlockThreads)
    cast_bucket_kernel(DeviceBucket bucket, DeviceStep step) {
  ChunkWork w;
  if (step.verdict->skip || !chunk_work(bucket, step, blockIdx.x, w)) return;
  cast_tiles<P, kS>(w.slot, w.begin, w.end, kTileElems);
}

template <ElemType P, ParamScaling kS>
__global__ void dequantize_kernel(const uint8_t* param, ParamScale scale, int64_t n,
                                  float* master) {
  constexpr int64_t kBlock = scaling_block(kS);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dequantize_block<P, kS>(param + i, 1, scale, kBlock == 0 ? 0 : i / kBlock, master + i);
}

// ---- current scaling (is_current): the update with the amax, the scales, the cast pass ----
// adam_scaled_kernel updates the masters and folds max |master| of every chunk into its
// slot's amax_bits, grad or none (the cast pass casts every slot again, with the tensor's
// new scale); with block moments the block-moment kernel updates the masters and
// current_amax_kernel reads them once more for the amax. amax_bits is a double holding
// magnitude bits (an integer below 2^32): non-negative doubles order as their bits do, so an
// atomicMax on the bits is the max, as the CPU's fold is.

__global__ void reset_current_amax_kernel(const CurrentScale* table, int32_t n) {
  for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    *table[i].scale.amax_bits = 0.0;
}

__global__ void __launch_bounds__(kCudaBlockThreads) current_amax_kernel(DeviceBucket bucket) {
  const ChunkRange c = chunk_range(bucket, blockIdx.x);
  fold_master_amax(c.slot, c.begin, c.end, blockDim.x);
}

__global__ void __launch_bounds__(kCudaBlockThreads) slot_amax_kernel(TensorSlot slot) {
  fold_master_amax(slot, static_cast<int64_t>(blockIdx.x) * blockDim.x, slot.numel,
                   static_cast<int64_t>(gridDim.x) * blockDim.x);
}

// Each entry's scale from its reduced amax, unless the step is skipped.
__global__ void current_scale_kernel(const CurrentScale* table, int32_t n,
                                     const StepVerdict* verdict) {
  if (verdict->skip) return;
  for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    write_current_scale(table[i].param, table[i].scaling, table[i].scale);
}

__global__ void one_current_scale_kernel(CurrentScale c) {
  write_current_scale(c.param, c.scaling, c.scale);
}

// Chunk b of a bucket cast from its master with the scale written before, grad or none.
template <ElemType P, ParamScaling kS>
__global__ void __launch_bounds__(kCudaBlockThreads)
    current_cast_kernel(DeviceBucket bucket, const StepVerdict* verdict) {
  if (verdict->skip) return;
  const ChunkRange c = chunk_range(bucket, blockIdx.x);
  cast_tiles<P, kS>(c.slot, c.begin, c.end, kTileElems);
}

// A delayed scaling's amax reset (reset_amax_kernel), before the kernel that writes it.
cudaError_t launch_reset_amax(ParamScaling scaling, const DeviceBucket& b, const DeviceStep& s,
                              cudaStream_t st) {
  if (scaling != ParamScaling::delayed) return cudaSuccess;
  reset_amax_kernel<<<grid_for(b.num_slots, kCudaBlockThreads), kCudaBlockThreads, 0, st>>>(b, s);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_cast_bucket(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                               cudaStream_t st) {
  cudaError_t err = cudaErrorInvalidValue;  // the core never builds a Variant not in the table
  visit_param_scaling(v.param, v.scaling, [&](auto p, auto scaling) {
    constexpr ParamScaling kS = decltype(scaling)::value;
    if constexpr (is_current(kS)) {  // the amax now; the cast after the reduction
      current_amax_kernel<<<static_cast<unsigned>(b.num_chunks), kCudaBlockThreads, 0, st>>>(b);
    } else {
      err = launch_reset_amax(kS, b, s, st);
      if (err != cudaSuccess) return;
      cast_bucket_kernel<decltype(p)::value, kS>
          <<<static_cast<unsigned>(b.num_chunks), kCudaBlockThreads, 0, st>>>(b, s);
    }
    err = cudaGetLastError();
  });
  return err;
}

cudaError_t launch_adam_bucket_scaled_blocks(const Variant& v, const DeviceBucket& b,
                                             const DeviceBucket& masters, const DeviceStep& s,
                                             cudaStream_t st) {
  const cudaError_t err = launch_adam_bucket_blocks(fp8_master_variant(v), masters, s, st);
  return err != cudaSuccess ? err : launch_cast_bucket(v, b, s, st);
}

cudaError_t launch_adam_bucket_scaled(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                                      cudaStream_t st) {
  cudaError_t err = cudaErrorInvalidValue;  // the core never builds a Variant not in the table
  visit_param_scaling(v.param, v.scaling, [&](auto p, auto scaling) {
    constexpr ElemType kP = decltype(p)::value;
    constexpr ParamScaling kS = decltype(scaling)::value;
    visit_variant(fp8_master_variant(v), [&](auto signature) {
      using S = decltype(signature);
      // visit_variant instantiates every param form; the master's is a float32 param's.
      if constexpr (S::kParam == ElemType::f32 && S::kMaster == MasterKind::none) {
        err = launch_reset_amax(kS, b, s, st);
        if (err != cudaSuccess) return;
        adam_scaled_kernel<kP, kS, S>
            <<<static_cast<unsigned>(b.num_chunks), kCudaBlockThreads, 0, st>>>(b, s);
        err = cudaGetLastError();
      }
    });
  });
  return err;
}

cudaError_t launch_reset_current_amax(const CurrentScale* table, int32_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  reset_current_amax_kernel<<<grid_for(n, kCudaBlockThreads), kCudaBlockThreads, 0, st>>>(table, n);
  return cudaGetLastError();
}

cudaError_t launch_measure_amax(const TensorSlot& slot, cudaStream_t st) {
  cudaError_t err = cudaMemsetAsync(slot.scale.amax_bits, 0, sizeof(double), st);
  if (err != cudaSuccess || slot.numel == 0) return err;
  slot_amax_kernel<<<grid_for(slot.numel, kCudaBlockThreads), kCudaBlockThreads, 0, st>>>(slot);
  return cudaGetLastError();
}

cudaError_t launch_current_scales(const CurrentScale* table, int32_t n, const StepVerdict* verdict,
                                  cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  current_scale_kernel<<<grid_for(n, kCudaBlockThreads), kCudaBlockThreads, 0, st>>>(table, n,
                                                                                     verdict);
  return cudaGetLastError();
}

cudaError_t launch_current_cast(const Variant& v, const DeviceBucket& bucket,
                                const StepVerdict* verdict, cudaStream_t st) {
  cudaError_t err = cudaErrorInvalidValue;  // the core never builds a Variant not in the table
  visit_param_scaling(v.param, v.scaling, [&](auto p, auto scaling) {
    constexpr ParamScaling kS = decltype(scaling)::value;
    if constexpr (is_current(kS)) {
      current_cast_kernel<decltype(p)::value, kS>
          <<<static_cast<unsigned>(bucket.num_chunks), kCudaBlockThreads, 0, st>>>(bucket, verdict);
      err = cudaGetLastError();
    }
  });
  return err;
}

cudaError_t launch_cast_param(const Variant& v, const TensorSlot& slot, cudaStream_t st) {
  cudaError_t err = cudaErrorInvalidValue;
  visit_param_scaling(v.param, v.scaling, [&](auto p, auto scaling) {
    constexpr ElemType kP = decltype(p)::value;
    constexpr ParamScaling kS = decltype(scaling)::value;
    err = cudaSuccess;
    if (kS == ParamScaling::delayed && slot.scale.amax != nullptr)
      err = cudaMemsetAsync(slot.scale.amax, 0, sizeof(float), st);
    if (is_current(kS)) {  // the scale from the reduced amax first, an empty shard's too
      one_current_scale_kernel<<<1, 1, 0, st>>>(CurrentScale{kP, kS, slot.scale});
      err = cudaGetLastError();
    }
    if (err != cudaSuccess || slot.numel == 0) return;
    cast_kernel<kP, kS><<<grid_for(slot.numel, kTileElems), kCudaBlockThreads, 0, st>>>(slot);
    err = cudaGetLastError();
  });
  return err;
}

cudaError_t launch_dequantize_param(ElemType param_type, ParamScaling scaling, const void* param,
                                    const ParamScale& scale, int64_t n, float* master,
                                    cudaStream_t st) {
  cudaError_t err = cudaErrorInvalidValue;
  visit_param_scaling(param_type, scaling, [&](auto p, auto s) {
    err = cudaSuccess;
    if (n == 0) return;
    dequantize_kernel<decltype(p)::value, decltype(s)::value>
        <<<grid_for(n, kCudaBlockThreads), kCudaBlockThreads, 0, st>>>(
            static_cast<const uint8_t*>(param), scale, n, master);
    err = cudaGetLastError();
  });
  return err;
}

}  // namespace kernels
}  // namespace sa
