// kernels/cuda/master.cuh — a param's full-precision value in CUDA kernels: where it is
// loaded from and stored to, per master kind (the param itself, an fp32 master beside it,
// or the bfloat16 param joined with its int16 remainder). `A` is a TypedSlot.
#ifndef SHARDADAM_KERNELS_CUDA_MASTER_CUH_
#define SHARDADAM_KERNELS_CUDA_MASTER_CUH_

#include <stdint.h>

#include "../adam_math.h"
#include "../bucket_table.h"
#include "../variants.h"
#include "storage.cuh"

namespace sa {
namespace kernels {

// Full-precision param value: load and store, per master kind, one element or N (kVec or
// 4) consecutive ones (vector accesses where the arrays allow: param_vec_aligned).
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
  template <class A, int N>
  __device__ static void load_vec(const A& a, int64_t i, float (&x)[N]) {
    Storage<P>::load_vec(a.param, i, x);
  }
  template <class A, int N>
  __device__ static void store_vec(const A& a, int64_t i, const float (&x)[N]) {
    Storage<P>::store_vec(a.param, i, x);
  }
};

template <ElemType P>
struct Master<P, MasterKind::fp32> {
  template <class A>
  __device__ static float load(const A& a, int64_t i) {
    return a.master[i];
  }
  template <class A>
  __device__ static void store(const A& a, int64_t i, float x) {
    a.master[i] = x;
    Storage<P>::store(a.param, i, x);
  }
  template <class A, int N>
  __device__ static void load_vec(const A& a, int64_t i, float (&x)[N]) {
    Storage<ElemType::f32>::load_vec(a.master, i, x);
  }
  template <class A, int N>
  __device__ static void store_vec(const A& a, int64_t i, const float (&x)[N]) {
    Storage<ElemType::f32>::store_vec(a.master, i, x);
    Storage<P>::store_vec(a.param, i, x);
  }
};

template <ElemType P>
struct Master<P, MasterKind::remainder> {  // P is bf16
  template <class A>
  __device__ static float load(const A& a, int64_t i) {
    return join_remainder(a.param[i], a.master[i]);
  }
  template <class A>
  __device__ static void store(const A& a, int64_t i, float x) {
    uint16_t hi;
    int16_t rem;
    split_remainder(x, hi, rem);
    a.param[i] = hi;
    a.master[i] = rem;
  }
  template <class A, int N>
  __device__ static void load_vec(const A& a, int64_t i, float (&x)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = load(a, i + k);
  }
  template <class A, int N>
  __device__ static void store_vec(const A& a, int64_t i, const float (&x)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) store(a, i + k, x[k]);
  }
};

// Whether a TypedSlot's param, grad and master arrays allow Master's and Storage's kVec
// accesses (16 bytes of a 16-bit array; the moments are checked by their users).
template <class S>
__device__ __forceinline__ bool param_vec_aligned(const TypedSlot<S>& a) {
  return aligned(a.param, kVec * sizeof(*a.param)) && aligned(a.grad, kVec * sizeof(*a.grad)) &&
         (S::kMaster != MasterKind::fp32 || aligned(a.master, kVec * sizeof(float)));
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_MASTER_CUH_
