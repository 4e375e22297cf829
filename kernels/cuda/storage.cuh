// kernels/cuda/storage.cuh — loads and stores of the storage dtypes in CUDA kernels, one
// element or kVec at a time (16 bytes of a 16-bit array). Conversions are elem_type.h's
// bit-level Codecs, so rounding equals the CPU's bit for bit (NaN payloads included).
#ifndef SHARDADAM_KERNELS_CUDA_STORAGE_CUH_
#define SHARDADAM_KERNELS_CUDA_STORAGE_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

#include "../bucket_table.h"

namespace sa {
namespace kernels {

constexpr int kVec = 8;  // elements per thread per iteration: 16 bytes of a 16-bit array

// Storage access per element type: by default an element at a time through the dtype's
// Codec (kernels/elem_type.h); the dtypes below have vector loads and stores. load_vec and
// store_vec move N consecutive elements (kVec, or a half of it: 4), from an index that is
// a multiple of N.
template <ElemType T>
struct Storage {
  using type = StorageOf<T>;
  __device__ static float load(const type* p, int64_t i) { return Codec<T>::decode(p[i]); }
  __device__ static void store(type* p, int64_t i, float x) { p[i] = Codec<T>::encode(x); }
  template <int N>
  __device__ static void load_vec(const type* p, int64_t i, float (&x)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = Codec<T>::decode(p[i + k]);
  }
  template <int N>
  __device__ static void store_vec(type* p, int64_t i, const float (&x)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) p[i + k] = Codec<T>::encode(x[k]);
  }
};

template <>
struct Storage<ElemType::f32> {  // float4 accesses
  using type = float;
  __device__ static float load(const float* p, int64_t i) { return p[i]; }
  __device__ static void store(float* p, int64_t i, float x) { p[i] = x; }
  template <int N>
  __device__ static void load_vec(const float* p, int64_t i, float (&x)[N]) {
    static_assert(N % 4 == 0, "whole float4s");
#pragma unroll
    for (int q = 0; q < N / 4; ++q) {
      const float4 v = reinterpret_cast<const float4*>(p + i)[q];
      x[4 * q] = v.x;
      x[4 * q + 1] = v.y;
      x[4 * q + 2] = v.z;
      x[4 * q + 3] = v.w;
    }
  }
  template <int N>
  __device__ static void store_vec(float* p, int64_t i, const float (&x)[N]) {
    static_assert(N % 4 == 0, "whole float4s");
#pragma unroll
    for (int q = 0; q < N / 4; ++q)
      reinterpret_cast<float4*>(p + i)[q] =
          make_float4(x[4 * q], x[4 * q + 1], x[4 * q + 2], x[4 * q + 3]);
  }
};

// 16-bit storage: a uint4 carries 8 elements, a uint2 4.
template <ElemType T>
struct Storage16 {
  static_assert(sizeof(StorageOf<T>) == 2, "a 16-bit dtype");
  __device__ static float ToFloat(uint16_t h) { return Codec<T>::decode(h); }
  __device__ static uint16_t FromFloat(float f) { return Codec<T>::encode(f); }
  using type = uint16_t;
  __device__ static float load(const uint16_t* p, int64_t i) { return ToFloat(p[i]); }
  __device__ static void store(uint16_t* p, int64_t i, float x) { p[i] = FromFloat(x); }
  template <int N>
  __device__ static void load_vec(const uint16_t* p, int64_t i, float (&x)[N]) {
    static_assert(N == 4 || N == 8, "one 8- or 16-byte access");
    uint32_t words[N / 2];
    if constexpr (N == 8) {
      const uint4 w = *reinterpret_cast<const uint4*>(p + i);
      words[0] = w.x, words[1] = w.y, words[2] = w.z, words[3] = w.w;
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(p + i);
      words[0] = w.x, words[1] = w.y;
    }
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      x[2 * k] = ToFloat(static_cast<uint16_t>(words[k] & 0xFFFFu));
      x[2 * k + 1] = ToFloat(static_cast<uint16_t>(words[k] >> 16));
    }
  }
  template <int N>
  __device__ static void store_vec(uint16_t* p, int64_t i, const float (&x)[N]) {
    static_assert(N == 4 || N == 8, "one 8- or 16-byte access");
    uint32_t words[N / 2];
#pragma unroll
    for (int k = 0; k < N / 2; ++k)
      words[k] = static_cast<uint32_t>(FromFloat(x[2 * k])) |
                 (static_cast<uint32_t>(FromFloat(x[2 * k + 1])) << 16);
    if constexpr (N == 8)
      *reinterpret_cast<uint4*>(p + i) = make_uint4(words[0], words[1], words[2], words[3]);
    else
      *reinterpret_cast<uint2*>(p + i) = make_uint2(words[0], words[1]);
  }
};

template <>
struct Storage<ElemType::bf16> : Storage16<ElemType::bf16> {};
template <>
struct Storage<ElemType::f16> : Storage16<ElemType::f16> {};

__device__ __forceinline__ bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_STORAGE_CUH_
