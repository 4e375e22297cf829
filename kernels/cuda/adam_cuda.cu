// kernels/cuda/adam_cuda.cu — the CUDA multi-tensor Adam kernel.
//
// One launch per bucket walks every chunk of every shard: block b takes chunk b, finds
// its slot by a binary search in the chunk prefix sums, and updates up to
// kCudaChunkElems elements with adam_update(). The tables live in device memory, so
// there is no per-launch tensor limit and an empty shard (zero chunks) costs nothing.
// Loads and stores are 16 bytes wide where a slot's pointers allow it (8 elements per
// thread per iteration); a scalar path covers the rest and the ragged tail, computing
// exactly the same function.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../variants.h"
#include "adam_cuda.cuh"
#include "adam_fp8_cuda.cuh"
#include "cuda_ops.cuh"
#include "master.cuh"
#include "storage.cuh"

namespace sa {
namespace kernels {
namespace {

template <class S, bool kL2>
__device__ __forceinline__ void update_scalar(const TypedSlot<S>& a, int64_t i,
                                              const AdamCoeffs<float>& c) {
  using M = Storage<S::kMoment>;
  using P = Master<S::kParam, S::kMaster>;
  float p = P::load(a, i), mom[kNumMoments];
  for_each_moment<S>([&](auto k) { mom[k] = M::load(a.moment[k], i); });
  adam_update<kL2, S::kAmsgrad>(CudaOps{}, c, Storage<S::kGrad>::load(a.grad, i), p, mom);
  P::store(a, i, p);
  for_each_moment<S>([&](auto k) { M::store(a.moment[k], i, mom[k]); });
}

// kVec consecutive elements with 16-byte accesses to the moment, grad, param and master
// arrays (a remainder master an element at a time: Master).
template <class S, bool kL2>
__device__ __forceinline__ void update_vec(const TypedSlot<S>& a, int64_t i,
                                           const AdamCoeffs<float>& c) {
  using M = Storage<S::kMoment>;
  using P = Master<S::kParam, S::kMaster>;
  float g[kVec], p[kVec], mom[kNumMoments][kVec];
  Storage<S::kGrad>::load_vec(a.grad, i, g);
  for_each_moment<S>([&](auto k) { M::load_vec(a.moment[k], i, mom[k]); });
  P::load_vec(a, i, p);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    float e[kNumMoments];  // element j's moments
    for_each_moment<S>([&](auto k) { e[k] = mom[k][j]; });
    adam_update<kL2, S::kAmsgrad>(CudaOps{}, c, g[j], p[j], e);
    for_each_moment<S>([&](auto k) { mom[k][j] = e[k]; });
  }
  P::store_vec(a, i, p);
  for_each_moment<S>([&](auto k) { M::store_vec(a.moment[k], i, mom[k]); });
}

template <class S, bool kL2>
__device__ void update_range(const TensorSlot& slot, int64_t begin, int64_t end,
                             const AdamCoeffs<float>& c) {
  const TypedSlot<S> a(slot);
  // 16-byte accesses need every array of the slot aligned to kVec elements.
  constexpr uintptr_t kMomentVec = kVec * sizeof(StorageOf<S::kMoment>);
  bool vec_ok = param_vec_aligned(a);
  for_each_moment<S>([&](auto k) { vec_ok = vec_ok && aligned(a.moment[k], kMomentVec); });
  int64_t scalar_begin = begin;
  if (vec_ok) {
    const int64_t vec_end = begin + (end - begin) / kVec * kVec;  // begin is a multiple of kVec
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < vec_end;
         i += static_cast<int64_t>(blockDim.x) * kVec)
      update_vec<S, kL2>(a, i, c);
    scalar_begin = vec_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += blockDim.x)
    update_scalar<S, kL2>(a, i, c);
}

template <class S>
__global__ void __launch_bounds__(kCudaBlockThreads, SA_CUDA_MIN_BLOCKS_PER_SM)
    adam_bucket_kernel(DeviceBucket bucket, DeviceStep step) {
  ChunkWork w;
  if (step.verdict->skip || !chunk_work(bucket, step, blockIdx.x, w)) return;
  if (w.coeffs.l2)
    update_range<S, true>(w.slot, w.begin, w.end, w.coeffs.c);
  else
    update_range<S, false>(w.slot, w.begin, w.end, w.coeffs.c);
}

// Tuning knob (bench/cuda_tuning.md): the most thread blocks of this kernel a
// multiprocessor runs at once, 0 for as many as its registers allow. A cap is set by
// dynamic shared memory that the kernel never touches. Measured on an H200: at 78
// registers 3 blocks fit, and the fp32 step is 2% slower than at 2 (bf16 unchanged).
#ifndef SA_CUDA_MAX_BLOCKS_PER_SM
#define SA_CUDA_MAX_BLOCKS_PER_SM 2
#endif

// The dynamic shared memory per thread block that leaves room for at most kMax blocks.
template <class S>
cudaError_t occupancy_cap_bytes(int kMax, size_t* bytes) {
  *bytes = 0;
  if (kMax <= 0) return cudaSuccess;
  int device = 0, per_sm = 0, reserved = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
  if (err != cudaSuccess) return err;
  *bytes = static_cast<size_t>(per_sm / (kMax + 1) - reserved + 1);
  static const cudaError_t set = cudaFuncSetAttribute(
      adam_bucket_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(*bytes));
  return set;
}

template <class S>
cudaError_t launch_typed(const DeviceBucket& bucket, const DeviceStep& step, cudaStream_t stream) {
  size_t smem = 0;
  const cudaError_t err = occupancy_cap_bytes<S>(SA_CUDA_MAX_BLOCKS_PER_SM, &smem);
  if (err != cudaSuccess) return err;
  adam_bucket_kernel<S>
      <<<static_cast<unsigned>(bucket.num_chunks), kCudaBlockThreads, smem, stream>>>(bucket, step);
  return cudaGetLastError();
}

__global__ void fold_kernel(FoldTables t, FoldInputs in, GroupCoeffs* out) {
  const StepDecision d = fold_decide(in);
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) fold_publish(in, d);
  if (d.skip) return;
  if (i < t.num_groups) fold_group_step(t, i);
  if (i < t.num_params) {
    const int64_t step = fold_param_step(t, i);
    if (step != 0)
      out[i].l2 = fold_coefficients(t.hyper[t.param_group[i]], step, d.grad_multiplier, out[i].c);
  }
}

template <ElemType T>
__global__ void widen_kernel(float* dst, const typename Storage<T>::type* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = Storage<T>::load(src, i);
}

}  // namespace

cudaError_t launch_adam_bucket_elements(const Variant& v, const DeviceBucket& b,
                                        const DeviceStep& s, cudaStream_t st) {
  cudaError_t err = cudaErrorInvalidValue;  // the core never builds a Variant not in the table
  visit_variant(v, [&](auto signature) { err = launch_typed<decltype(signature)>(b, s, st); });
  return err;
}

bool needs_master_slots(const Variant& v) {
  return v.scaling != ParamScaling::none && is_block_storage(v.moment);
}

// The one place a bucket launch's kernel is chosen from its Variant: each family below
// instantiates its kernels from kernels/variants.h's table and takes the Variant as it is.
cudaError_t launch_bucket(BucketOp op, const Variant& v, const BucketArgs& a, cudaStream_t st) {
  if (a.bucket.num_chunks == 0) return cudaSuccess;
  const bool scaled = v.scaling != ParamScaling::none;
  switch (op) {
    case BucketOp::grad_norm:
      return launch_grad_norm_partials(v.grad, a.norm, a.bucket, a.partials, st);
    case BucketOp::update:
      if (v.rule != UpdateRule::adam) return cudaSuccess;  // the matrices pass steps it
      if (needs_master_slots(v))  // the masters by the block kernel, then the cast
        return launch_adam_bucket_scaled_blocks(v, a.bucket, a.masters, a.step, st);
      if (scaled) return launch_adam_bucket_scaled(v, a.bucket, a.step, st);
      if (is_block_storage(v.moment)) return launch_adam_bucket_blocks(v, a.bucket, a.step, st);
      return launch_adam_bucket_elements(v, a.bucket, a.step, st);
    case BucketOp::cast_from_master:
      return scaled ? launch_cast_bucket(v, a.bucket, a.step, st) : cudaSuccess;
    case BucketOp::current_cast:
      return is_current(v.scaling) ? launch_current_cast(v, a.bucket, a.step.verdict, st)
                                   : cudaSuccess;
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_slot(SlotOp op, const Variant& v, const TensorSlot& slot, cudaStream_t st) {
  auto* master = static_cast<float*>(slot.state[static_cast<size_t>(StateKind::master)]);
  switch (op) {
    case SlotOp::init_master:
      return v.scaling == ParamScaling::none
                 ? launch_widen_to_f32(master, slot.param, v.param, slot.numel, st)
                 : launch_dequantize_param(v.param, v.scaling, slot.param, slot.scale, slot.numel,
                                           master, st);
    case SlotOp::measure_amax:
      return launch_measure_amax(slot, st);
    case SlotOp::cast_from_master:
      return launch_cast_param(v, slot, st);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_fold_coefficients(const FoldTables& tables, const FoldInputs& inputs,
                                     GroupCoeffs* out, cudaStream_t stream) {
  // One thread per group and per param, at least one: the verdict is written even when
  // there are neither.
  const int32_t threads = std::max(1, std::max(tables.num_groups, tables.num_params));
  fold_kernel<<<(threads + 127) / 128, 128, 0, stream>>>(tables, inputs, out);
  return cudaGetLastError();
}

cudaError_t launch_widen_to_f32(float* dst, const void* src, ElemType type, int64_t n,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535));
  const bool element_dtype = visit_elem_type(type, [&](auto tag) {
    constexpr ElemType kType = decltype(tag)::value;
    widen_kernel<kType>
        <<<blocks, 256, 0, stream>>>(dst, static_cast<const StorageOf<kType>*>(src), n);
  });
  if (!element_dtype) return cudaErrorInvalidValue;  // a block storage, never a param's
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace sa
