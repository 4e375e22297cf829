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
// Codec (kernels/elem_type.h); the dtypes below have vector loads and stores.
template <ElemType T>
struct Storage {
  using type = StorageOf<T>;
  __device__ static float load(const type* p, int64_t i) { return Codec<T>::decode(p[i]); }
  __device__ static void store(type* p, int64_t i, float x) { p[i] = Codec<T>::encode(x); }
  __device__ static void load_vec(const type* p, int64_t i, float (&x)[kVec]) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = Codec<T>::decode(p[i + k]);
  }
  __device__ static void store_vec(type* p, int64_t i, const float (&x)[kVec]) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) p[i + k] = Codec<T>::encode(x[k]);
  }
};

template <>
struct Storage<ElemType::f32> {
  using type = float;
  __device__ static float load(const float* p, int64_t i) { return p[i]; }
  __device__ static void store(float* p, int64_t i, float x) { p[i] = x; }
  __device__ static void load_vec(const float* p, int64_t i, float (&x)[kVec]) {
    const float4 a = reinterpret_cast<const float4*>(p + i)[0];
    const float4 b = reinterpret_cast<const float4*>(p + i)[1];
    x[0] = a.x;
    x[1] = a.y;
    x[2] = a.z;
    x[3] = a.w;
    x[4] = b.x;
    x[5] = b.y;
    x[6] = b.z;
    x[7] = b.w;
  }
  __device__ static void store_vec(float* p, int64_t i, const float (&x)[kVec]) {
    reinterpret_cast<float4*>(p + i)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(p + i)[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
};

// 16-bit storage: a uint4 carries 8 elements.
template <ElemType T>
struct Storage16 {
  static_assert(sizeof(StorageOf<T>) == 2, "a 16-bit dtype");
  __device__ static float ToFloat(uint16_t h) { return Codec<T>::decode(h); }
  __device__ static uint16_t FromFloat(float f) { return Codec<T>::encode(f); }
  using type = uint16_t;
  __device__ static float load(const uint16_t* p, int64_t i) { return ToFloat(p[i]); }
  __device__ static void store(uint16_t* p, int64_t i, float x) { p[i] = FromFloat(x); }
  __device__ static void load_vec(const uint16_t* p, int64_t i, float (&x)[kVec]) {
    const uint4 w = *reinterpret_cast<const uint4*>(p + i);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[2 * k] = ToFloat(static_cast<uint16_t>(words[k] & 0xFFFFu));
      x[2 * k + 1] = ToFloat(static_cast<uint16_t>(words[k] >> 16));
    }
  }
  __device__ static void store_vec(uint16_t* p, int64_t i, const float (&x)[kVec]) {
    uint32_t words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      words[k] = static_cast<uint32_t>(FromFloat(x[2 * k])) |
                 (static_cast<uint32_t>(FromFloat(x[2 * k + 1])) << 16);
    *reinterpret_cast<uint4*>(p + i) = make_uint4(words[0], words[1], words[2], words[3]);
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
