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

#include "adam_cuda.cuh"
#include "cuda_ops.cuh"
#include "storage.cuh"

namespace sa {
namespace kernels {
namespace {

// The arrays of one slot, typed.
template <ElemType P, ElemType G, ElemType M>
struct SlotArrays {
  using PT = typename Storage<P>::type;
  using GT = typename Storage<G>::type;
  using MT = typename Storage<M>::type;
  PT* __restrict__ param;
  const GT* __restrict__ grad;
  void* __restrict__ master;
  MT* __restrict__ m;
  MT* __restrict__ v;
  MT* __restrict__ vmax;

  __device__ explicit SlotArrays(const TensorSlot& s)
      : param(static_cast<PT*>(s.param)),
        grad(static_cast<const GT*>(s.grad)),
        master(s.master),
        m(static_cast<MT*>(s.exp_avg)),
        v(static_cast<MT*>(s.exp_avg_sq)),
        vmax(static_cast<MT*>(s.max_exp_avg_sq)) {}
};

// Full-precision param value: load and store, per master kind.
template <ElemType P, MasterKind K>
struct Master;

template <ElemType P>
struct Master<P, MasterKind::none> {  // P is f32: the param is the value
  template <class A>
  __device__ static float load(const A& a, int64_t i) {
    return Storage<P>::load(a.param, i);
  }
  template <class A>
  __device__ static void store(const A& a, int64_t i, float x) {
    Storage<P>::store(a.param, i, x);
  }
};

template <ElemType P>
struct Master<P, MasterKind::fp32> {
  template <class A>
  __device__ static float load(const A& a, int64_t i) {
    return static_cast<const float*>(a.master)[i];
  }
  template <class A>
  __device__ static void store(const A& a, int64_t i, float x) {
    static_cast<float*>(a.master)[i] = x;
    Storage<P>::store(a.param, i, x);
  }
};

template <ElemType P>
struct Master<P, MasterKind::remainder> {  // P is bf16
  template <class A>
  __device__ static float load(const A& a, int64_t i) {
    return join_remainder(a.param[i], static_cast<const int16_t*>(a.master)[i]);
  }
  template <class A>
  __device__ static void store(const A& a, int64_t i, float x) {
    uint16_t hi;
    int16_t rem;
    split_remainder(x, hi, rem);
    a.param[i] = hi;
    static_cast<int16_t*>(a.master)[i] = rem;
  }
};

template <ElemType P, ElemType G, ElemType M, MasterKind K, bool kL2, bool kAmsgrad>
__device__ __forceinline__ void update_scalar(const SlotArrays<P, G, M>& a, int64_t i,
                                              const AdamCoeffs<float>& c) {
  float p = Master<P, K>::load(a, i);
  float m = Storage<M>::load(a.m, i);
  float v = Storage<M>::load(a.v, i);
  float vmax = kAmsgrad ? Storage<M>::load(a.vmax, i) : 0.0f;
  adam_update<kL2, kAmsgrad>(CudaOps{}, c, Storage<G>::load(a.grad, i), p, m, v, vmax);
  Master<P, K>::store(a, i, p);
  Storage<M>::store(a.m, i, m);
  Storage<M>::store(a.v, i, v);
  if (kAmsgrad) Storage<M>::store(a.vmax, i, vmax);
}

// kVec consecutive elements with 16-byte accesses to the moment, grad and fp32 arrays.
// The full-precision param goes through Master (its arrays are touched once per
// element; for fp32 masters the compiler vectorizes the contiguous float accesses).
template <ElemType P, ElemType G, ElemType M, MasterKind K, bool kL2, bool kAmsgrad>
__device__ __forceinline__ void update_vec(const SlotArrays<P, G, M>& a, int64_t i,
                                           const AdamCoeffs<float>& c) {
  float g[kVec], m[kVec], v[kVec], vmax[kVec], p[kVec];
  Storage<G>::load_vec(a.grad, i, g);
  Storage<M>::load_vec(a.m, i, m);
  Storage<M>::load_vec(a.v, i, v);
  if (kAmsgrad) Storage<M>::load_vec(a.vmax, i, vmax);
  if (K == MasterKind::fp32) {
    Storage<ElemType::f32>::load_vec(static_cast<const float*>(a.master), i, p);
  } else if (K == MasterKind::none) {
    Storage<P>::load_vec(a.param, i, p);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) p[k] = Master<P, K>::load(a, i + k);
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (!kAmsgrad) vmax[k] = 0.0f;
    adam_update<kL2, kAmsgrad>(CudaOps{}, c, g[k], p[k], m[k], v[k], vmax[k]);
  }
  if (K == MasterKind::fp32) {
    Storage<ElemType::f32>::store_vec(static_cast<float*>(a.master), i, p);
    Storage<P>::store_vec(a.param, i, p);
  } else if (K == MasterKind::none) {
    Storage<P>::store_vec(a.param, i, p);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) Master<P, K>::store(a, i + k, p[k]);
  }
  Storage<M>::store_vec(a.m, i, m);
  Storage<M>::store_vec(a.v, i, v);
  if (kAmsgrad) Storage<M>::store_vec(a.vmax, i, vmax);
}

template <ElemType P, ElemType G, ElemType M, MasterKind K, bool kL2, bool kAmsgrad>
__device__ void update_range(const TensorSlot& slot, int64_t begin, int64_t end,
                             const AdamCoeffs<float>& c) {
  const SlotArrays<P, G, M> a(slot);
  // 16-byte accesses need every array of the slot aligned to kVec elements.
  const bool vec_ok =
      aligned(slot.param, kVec * sizeof(typename Storage<P>::type)) &&
      aligned(slot.grad, kVec * sizeof(typename Storage<G>::type)) &&
      aligned(slot.exp_avg, kVec * sizeof(typename Storage<M>::type)) &&
      aligned(slot.exp_avg_sq, kVec * sizeof(typename Storage<M>::type)) &&
      (!kAmsgrad || aligned(slot.max_exp_avg_sq, kVec * sizeof(typename Storage<M>::type))) &&
      (K != MasterKind::fp32 || aligned(slot.master, kVec * sizeof(float)));
  int64_t scalar_begin = begin;
  if (vec_ok) {
    const int64_t vec_end = begin + (end - begin) / kVec * kVec;  // begin is a multiple of kVec
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < vec_end;
         i += static_cast<int64_t>(blockDim.x) * kVec)
      update_vec<P, G, M, K, kL2, kAmsgrad>(a, i, c);
    scalar_begin = vec_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += blockDim.x)
    update_scalar<P, G, M, K, kL2, kAmsgrad>(a, i, c);
}

template <ElemType P, ElemType G, ElemType M, MasterKind K, bool kAmsgrad>
__global__ void __launch_bounds__(kCudaBlockThreads, SA_CUDA_MIN_BLOCKS_PER_SM)
    adam_bucket_kernel(DeviceBucket bucket, DeviceStep step) {
  if (step.verdict->skip) return;
  const int64_t chunk = blockIdx.x;
  const int32_t lo = slot_of_chunk(bucket, chunk);
  const TensorSlot slot = bucket.slots[lo];
  if (slot.grad == nullptr) return;  // the param has no grad at this step
  const GroupCoeffs g = step.coeffs[slot.param_index];
  const int64_t begin = (chunk - bucket.chunk_offsets[lo]) * kCudaChunkElems;
  const int64_t end = min(begin + kCudaChunkElems, slot.numel);
  if (g.l2)
    update_range<P, G, M, K, true, kAmsgrad>(slot, begin, end, g.c);
  else
    update_range<P, G, M, K, false, kAmsgrad>(slot, begin, end, g.c);
}

template <ElemType P, ElemType G, ElemType M, MasterKind K, bool kAmsgrad>
cudaError_t launch_typed(const DeviceBucket& bucket, const DeviceStep& step, cudaStream_t stream) {
  adam_bucket_kernel<P, G, M, K, kAmsgrad>
      <<<static_cast<unsigned>(bucket.num_chunks), kCudaBlockThreads, 0, stream>>>(bucket, step);
  return cudaGetLastError();
}

// Runtime Variant -> template instantiation, one level per field.
template <ElemType P, ElemType G, ElemType M, MasterKind K>
cudaError_t dispatch_amsgrad(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                             cudaStream_t st) {
  return v.amsgrad ? launch_typed<P, G, M, K, true>(b, s, st)
                   : launch_typed<P, G, M, K, false>(b, s, st);
}

template <ElemType P, ElemType G, ElemType M>
cudaError_t dispatch_master(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                            cudaStream_t st) {
  if (P == ElemType::f32) {
    if (v.master == MasterKind::none)
      return dispatch_amsgrad<P, G, M, MasterKind::none>(v, b, s, st);
  } else {
    if (v.master == MasterKind::fp32)
      return dispatch_amsgrad<P, G, M, MasterKind::fp32>(v, b, s, st);
    if (P == ElemType::bf16 && v.master == MasterKind::remainder)
      return dispatch_amsgrad<P, G, M, MasterKind::remainder>(v, b, s, st);
  }
  return cudaErrorInvalidValue;  // the core never builds such a variant
}

template <ElemType P, ElemType G>
cudaError_t dispatch_moment(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                            cudaStream_t st) {
  if (v.moment == ElemType::bf16) return dispatch_master<P, G, ElemType::bf16>(v, b, s, st);
  if (v.moment == ElemType::f32) return dispatch_master<P, G, ElemType::f32>(v, b, s, st);
  return cudaErrorInvalidValue;
}

template <ElemType P>
cudaError_t dispatch_grad(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                          cudaStream_t st) {
  switch (v.grad) {
    case ElemType::f32:
      return dispatch_moment<P, ElemType::f32>(v, b, s, st);
    case ElemType::bf16:
      return dispatch_moment<P, ElemType::bf16>(v, b, s, st);
    case ElemType::f16:
      return dispatch_moment<P, ElemType::f16>(v, b, s, st);
  }
  return cudaErrorInvalidValue;
}

__global__ void fold_kernel(FoldTables t, FoldInputs in, GroupCoeffs* out) {
  const bool local_inf = in.stats == nullptr && in.found_inf != nullptr && *in.found_inf != 0.0f;
  const float inv_grad_scale = in.inv_grad_scale != nullptr ? *in.inv_grad_scale : 1.0f;
  const StepDecision d = decide_step(in.clip, in.stats, local_inf, inv_grad_scale);
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) {
    in.verdict->skip = d.skip ? 1 : 0;
    in.verdict->norm = d.norm;
    if (in.norm_out != nullptr) *in.norm_out = static_cast<float>(d.norm);
  }
  if (d.skip) return;
  if (i < t.num_groups) ++t.group_steps[i];
  if (i < t.num_params && t.param_active[i]) {
    const int64_t step = t.param_steps[i] + 1;
    out[i].l2 = fold_coefficients(t.hyper[t.param_group[i]], step, d.grad_multiplier, out[i].c);
    t.param_steps[i] = step;
  }
}

template <ElemType T>
__global__ void widen_kernel(float* dst, const typename Storage<T>::type* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = Storage<T>::load(src, i);
}

}  // namespace

cudaError_t launch_adam_bucket(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                               cudaStream_t st) {
  if (b.num_chunks == 0) return cudaSuccess;
  switch (v.param) {
    case ElemType::f32:
      return dispatch_grad<ElemType::f32>(v, b, s, st);
    case ElemType::bf16:
      return dispatch_grad<ElemType::bf16>(v, b, s, st);
    case ElemType::f16:
      return dispatch_grad<ElemType::f16>(v, b, s, st);
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
  switch (type) {
    case ElemType::f32:
      widen_kernel<ElemType::f32>
          <<<blocks, 256, 0, stream>>>(dst, static_cast<const float*>(src), n);
      break;
    case ElemType::bf16:
      widen_kernel<ElemType::bf16>
          <<<blocks, 256, 0, stream>>>(dst, static_cast<const uint16_t*>(src), n);
      break;
    case ElemType::f16:
      widen_kernel<ElemType::f16>
          <<<blocks, 256, 0, stream>>>(dst, static_cast<const uint16_t*>(src), n);
      break;
  }
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace sa
