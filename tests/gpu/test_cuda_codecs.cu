// tests/gpu/test_cuda_codecs.cu — the float8 conversions a GPU of compute capability 8.9 or
// later does in hardware (kernels/elem_type.h: e4m3fn_to_float, float_to_e4m3fn_pair)
// against the portable definitions the host uses, run on the device: every e4m3fn code
// decodes to the same bits, and every one of the 2^32 float32 bit patterns encodes, in
// either half of a pair, to float_to_e4m3fn's code (a NaN to a NaN code). These are what
// make block_moment.h's f8e4m3 codec give the host's bits on the GPU.
#include <cuda_runtime.h>
#include <stdint.h>

#include <catch2/catch.hpp>

#include "../../kernels/elem_type.h"
#include "gpu/cuda_test_support.hpp"

namespace {

using sa::kernels::bits_float;

__global__ void decode_mismatches(unsigned long long* count) {
  const auto b = static_cast<uint8_t>(threadIdx.x);
  if (sa::kernels::float_bits(sa::kernels::e4m3fn_to_float(b)) !=
      sa::kernels::float_bits(sa::kernels::e4m3fn_to_float_portable(b)))
    atomicAdd(count, 1ull);
}

__device__ bool same_code(uint8_t got, uint8_t want) {
  return (want & 0x7Fu) == 0x7Fu ? (got & 0x7Fu) == 0x7Fu : got == want;
}

// Patterns [first, first + n): pattern i in the low half of a pair, i ^ 0x80000000 (its
// negation) in the high half.
__global__ void pair_mismatches(uint64_t first, uint64_t n, unsigned long long* count) {
  unsigned long long bad = 0;
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const auto bits = static_cast<uint32_t>(first + k);
    const float a = bits_float(bits), b = bits_float(bits ^ 0x80000000u);
    const uint16_t pair = sa::kernels::float_to_e4m3fn_pair(a, b);
    bad += !same_code(static_cast<uint8_t>(pair & 0xFFu), sa::kernels::float_to_e4m3fn(a));
    bad += !same_code(static_cast<uint8_t>(pair >> 8), sa::kernels::float_to_e4m3fn(b));
  }
  if (bad) atomicAdd(count, bad);
}

}  // namespace

TEST_CASE("float8: the GPU's hardware e4m3fn conversions equal the portable ones", "[gpu]") {
  int device = 0, major = 0, minor = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major * 10 + minor < 89) {
    WARN("compute capability " << major << "." << minor
                               << ": below 8.9, the portable conversions run; nothing to compare");
    return;
  }
  unsigned long long* count = nullptr;
  CUDA_OK(cudaMalloc(&count, 2 * sizeof(unsigned long long)));
  CUDA_OK(cudaMemset(count, 0, 2 * sizeof(unsigned long long)));
  decode_mismatches<<<1, 256>>>(count);
  const uint64_t kAll = uint64_t{1} << 32;
  pair_mismatches<<<4096, 256>>>(0, kAll, count + 1);
  CUDA_OK(cudaGetLastError());
  unsigned long long host[2] = {1, 1};
  CUDA_OK(cudaMemcpy(host, count, sizeof(host), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(count));
  CHECK(host[0] == 0);  // of 256 codes
  CHECK(host[1] == 0);  // of 2 * 2^32 conversions
}
