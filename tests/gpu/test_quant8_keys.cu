// tests/gpu/test_quant8_keys.cu — the q8 encode of the CUDA kernel (kernels/quant8.h's key
// tables: quant8_key_code over entries quant8_fill_keys writes) against the rule it stands
// in for (quant8_search of the clamped value) for every float32 of its domain: each pattern
// of magnitude below 1.0078125, both signs for the signed code book, the non-negative ones
// for the unsigned book. The tables are filled on the device, a slice per thread as the
// kernel fills its shared copy. (tests/test_quant8.cpp checks the same on the host at every
// bucket's ends and around every midpoint.)
#include <cuda_runtime.h>
#include <stdint.h>

#include <catch2/catch.hpp>

#include "../../kernels/quant8.h"
#include "gpu/cuda_test_support.hpp"

namespace {

using sa::kernels::bits_float;
using sa::kernels::Quant8KeyTable;

constexpr uint32_t kDomainEnd = 0x3F810000u;  // 1.0078125: magnitudes below it

// A code book and its key table in device memory, made on the device as the kernel makes
// its shared copy (BlockTables<q8>::load): the map, its midpoints' keys, then the entries,
// a slice per thread (quant8_fill_keys_part).
struct Book {
  uint32_t map[256];
  int32_t mid_keys[255];
};

__global__ void make_book(bool is_signed, Book* book, uint32_t* entries) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    book->map[i] =
        is_signed ? sa::kernels::kQuant8SignedMap[i] : sa::kernels::kQuant8UnsignedMap[i];
  __syncthreads();
  for (int j = threadIdx.x; j < 255; j += blockDim.x)
    book->mid_keys[j] = sa::kernels::quant8_mid_key(book->map, is_signed, j);
  __syncthreads();
  sa::kernels::quant8_fill_keys_part(sa::kernels::quant8_keys(is_signed), book->mid_keys,
                                     static_cast<int32_t>(threadIdx.x),
                                     static_cast<int32_t>(blockDim.x), entries);
}

// Patterns [0, kDomainEnd) of magnitude, with the sign bit `sign`.
__global__ void mismatches(bool is_signed, uint32_t sign, const Book* book, const uint32_t* entries,
                           unsigned long long* bad) {
  __shared__ uint32_t map[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) map[i] = book->map[i];
  __syncthreads();
  const Quant8KeyTable k = sa::kernels::quant8_keys(is_signed);
  unsigned long long count = 0;
  for (uint32_t m = blockIdx.x * blockDim.x + threadIdx.x; m < kDomainEnd;
       m += gridDim.x * blockDim.x) {
    const float x = bits_float(sign | m);
    const uint8_t want = sa::kernels::quant8_search(map, sa::kernels::quant8_scaled(x, 1.0f));
    count +=
        sa::kernels::quant8_key_code(k, entries, sa::kernels::quant8_key(is_signed, x)) != want;
  }
  if (count) atomicAdd(bad, count);
}

unsigned long long count_mismatches(bool is_signed) {
  const Quant8KeyTable k = sa::kernels::quant8_keys(is_signed);
  Book* book = nullptr;
  uint32_t* entries = nullptr;
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMalloc(&book, sizeof(Book)));
  CUDA_OK(cudaMalloc(&entries, sizeof(uint32_t) * static_cast<std::size_t>(k.count)));
  CUDA_OK(cudaMalloc(&bad, sizeof(*bad)));
  CUDA_OK(cudaMemset(bad, 0, sizeof(*bad)));
  make_book<<<1, 256>>>(is_signed, book, entries);
  for (const uint32_t sign : {0u, 0x80000000u})
    if (is_signed || sign == 0) mismatches<<<4096, 256>>>(is_signed, sign, book, entries, bad);
  CUDA_OK(cudaGetLastError());
  unsigned long long result = 0;
  CUDA_OK(cudaMemcpy(&result, bad, sizeof(result), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(book));
  CUDA_OK(cudaFree(entries));
  CUDA_OK(cudaFree(bad));
  return result;
}

}  // namespace

TEST_CASE("quant8 key tables: quant8_search's code for every float32 of the domain", "[gpu]") {
  CHECK(count_mismatches(true) == 0);   // of 2 x 0x3F810000 patterns
  CHECK(count_mismatches(false) == 0);  // of 0x3F810000
}
