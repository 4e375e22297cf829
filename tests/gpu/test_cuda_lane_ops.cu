// tests/gpu/test_cuda_lane_ops.cu — CudaLaneOps (kernels/cuda/cuda_ops.cuh) against the
// intrinsics it stands in for, on the device. Its sqrt and division run ptxas's fast
// paths of __fsqrt_rn and __fdiv_rn side by side under range tests of their own, so they
// must give the intrinsics' bits for every input: every one of the 2^32 float32 patterns
// for the square root; for the division, 2^32 random pairs of patterns spread over the
// whole range, every mantissa of the dividend against divisors near the ends of their
// binade, and every pair near the edges of the fast range. Each check also counts the
// lane groups that took the fast path, so that a range test which never passes fails too.
#include <cuda_runtime.h>
#include <stdint.h>

#include <catch2/catch.hpp>

#include "../../kernels/cuda/cuda_ops.cuh"
#include "gpu/cuda_test_support.hpp"

namespace {

using sa::kernels::bits_float;
using sa::kernels::CudaLaneOps;
using sa::kernels::CudaLanes;
using sa::kernels::float_bits;

constexpr int kLanes = 4;  // as the block-moment kernel uses them
using Ops = CudaLaneOps<kLanes>;

struct Counts {
  unsigned long long mismatches;
  unsigned long long fast_groups;
};

__device__ void add(Counts* c, unsigned long long bad, unsigned long long fast) {
  if (bad) atomicAdd(&c->mismatches, bad);
  if (fast) atomicAdd(&c->fast_groups, fast);
}

// Patterns [first, first + 4n): group k is the 4 consecutive patterns from first + 4k.
__global__ void sqrt_mismatches(uint64_t first, uint64_t n, Counts* c) {
  unsigned long long bad = 0, fast = 0;
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    CudaLanes<kLanes> a;
    bool in_range = true;
    for (int j = 0; j < kLanes; ++j) {
      const auto bits = static_cast<uint32_t>(first + 4 * k + j);
      a.x[j] = bits_float(bits);
      in_range = in_range && bits - Ops::kSqrtLow <= Ops::kSqrtRange;
    }
    const CudaLanes<kLanes> r = Ops{}.sqrt(a);
    for (int j = 0; j < kLanes; ++j) bad += float_bits(r.x[j]) != float_bits(__fsqrt_rn(a.x[j]));
    fast += in_range;
  }
  add(c, bad, fast);
}

__device__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ bool div_in_range(float a, float b) {
  const uint32_t span = Ops::kDivHigh - Ops::kDivLow;
  return (float_bits(a) & 0x7FFFFFFFu) - Ops::kDivLow <= span &&
         float_bits(b) - Ops::kDivLow <= span;
}

// One group of 4 divisions against __fdiv_rn.
__device__ void check_div(const CudaLanes<kLanes>& a, const CudaLanes<kLanes>& b,
                          unsigned long long& bad, unsigned long long& fast) {
  const CudaLanes<kLanes> q = Ops{}.div(a, b);
  bool in_range = true;
  for (int j = 0; j < kLanes; ++j) {
    bad += float_bits(q.x[j]) != float_bits(__fdiv_rn(a.x[j], b.x[j]));
    in_range = in_range && div_in_range(a.x[j], b.x[j]);
  }
  fast += in_range;
}

// Random pairs: an exponent field drawn around the fast range (biased 50..220, so that
// both sides of both edges are hit), any sign and mantissa; in a quarter of the groups
// any pattern at all.
__global__ void div_random_mismatches(uint64_t seed, uint64_t n, Counts* c) {
  unsigned long long bad = 0, fast = 0;
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    CudaLanes<kLanes> a, b;
    const bool anything = (k & 3) == 0;
    for (int j = 0; j < kLanes; ++j) {
      const uint64_t r = splitmix64(seed ^ (4 * k + j));
      uint32_t x = static_cast<uint32_t>(r), y = static_cast<uint32_t>(r >> 32);
      if (!anything) {
        x = (x & 0x807FFFFFu) | ((50u + (x >> 23 & 0xFFu) % 171u) << 23);
        y = (y & 0x007FFFFFu) | ((50u + (y >> 23 & 0xFFu) % 171u) << 23);  // b > 0, as Adam's
      }
      a.x[j] = bits_float(x);
      b.x[j] = bits_float(y);
    }
    check_div(a, b, bad, fast);
  }
  add(c, bad, fast);
}

// Every mantissa of a dividend in [1, 2) (times 2^e for e in -3..3) against divisors whose
// mantissas lie at the ends of the binade and at 1.5: where the reciprocal's first
// approximation and the quotient's rounding are closest to their limits.
__global__ void div_mantissa_mismatches(Counts* c) {
  __shared__ float divisors[8];
  if (threadIdx.x < 8) {
    const uint32_t mantissas[8] = {0, 1, 2, 0x400000, 0x3FFFFF, 0x7FFFFD, 0x7FFFFE, 0x7FFFFF};
    divisors[threadIdx.x] = bits_float(0x3F800000u | mantissas[threadIdx.x]);
  }
  __syncthreads();
  unsigned long long bad = 0, fast = 0;
  const uint64_t n = (uint64_t{1} << 23) / kLanes * 7 * 8;  // groups
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t per_divisor = (uint64_t{1} << 23) / kLanes * 7;
    const float divisor = divisors[k / per_divisor];
    const uint64_t i = k % per_divisor;
    const uint32_t exponent = 124u + static_cast<uint32_t>(i / ((uint64_t{1} << 23) / kLanes));
    CudaLanes<kLanes> a, b;
    for (int j = 0; j < kLanes; ++j) {
      const auto mantissa = static_cast<uint32_t>((kLanes * i + j) & 0x7FFFFFu);
      a.x[j] = bits_float(exponent << 23 | mantissa);
      b.x[j] = divisor;
    }
    check_div(a, b, bad, fast);
  }
  add(c, bad, fast);
}

// Both operands within 2^12 patterns of an edge of the fast range (2^-60 and 2^60, each
// side), the dividend of either sign: 4 x 2^13 x 2^13 x 2 pairs.
__global__ void div_edge_mismatches(Counts* c) {
  unsigned long long bad = 0, fast = 0;
  const uint32_t edges[2] = {Ops::kDivLow, Ops::kDivHigh};
  const uint64_t side = 1u << 13, n = 4 * side * side * 2 / kLanes;
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    CudaLanes<kLanes> a, b;
    for (int j = 0; j < kLanes; ++j) {
      const uint64_t t = kLanes * k + j;
      const uint32_t ia = static_cast<uint32_t>(t % side),
                     ib = static_cast<uint32_t>(t / side % side);
      const uint64_t rest = t / (side * side);
      const uint32_t ea = edges[rest & 1], eb = edges[rest >> 1 & 1], sign = (rest >> 2 & 1) << 31;
      a.x[j] = bits_float(sign | (ea - side / 2 + ia));
      b.x[j] = bits_float(eb - side / 2 + ib);
    }
    check_div(a, b, bad, fast);
  }
  add(c, bad, fast);
}

Counts run(void (*launch)(Counts*)) {
  Counts* device = nullptr;
  CUDA_OK(cudaMalloc(&device, sizeof(Counts)));
  CUDA_OK(cudaMemset(device, 0, sizeof(Counts)));
  launch(device);
  CUDA_OK(cudaGetLastError());
  Counts host{};
  CUDA_OK(cudaMemcpy(&host, device, sizeof(host), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(device));
  return host;
}

}  // namespace

TEST_CASE("CudaLaneOps: sqrt gives __fsqrt_rn's bits for every float32", "[gpu]") {
  const Counts c =
      run([](Counts* d) { sqrt_mismatches<<<4096, 256>>>(0, (uint64_t{1} << 32) / 4, d); });
  CHECK(c.mismatches == 0);  // of 2^32
  // The fast range [0x0D000000, 0x7F7FFFFF] holds 0x72800000 patterns: 0x1CA00000 groups.
  CHECK(c.fast_groups == 0x1CA00000ull);
}

TEST_CASE("CudaLaneOps: division gives __fdiv_rn's bits", "[gpu]") {
  const Counts random =
      run([](Counts* d) { div_random_mismatches<<<4096, 256>>>(7, uint64_t{1} << 30, d); });
  CHECK(random.mismatches == 0);  // of 2^32 pairs
  CHECK(random.fast_groups >
        (uint64_t{1} << 30) / 32);  // about 1 in 20 groups has all 8 operands in range
  const Counts mantissas = run([](Counts* d) { div_mantissa_mismatches<<<4096, 256>>>(d); });
  CHECK(mantissas.mismatches == 0);  // of 8 x 7 x 2^23 pairs
  CHECK(mantissas.fast_groups == (uint64_t{1} << 23) / kLanes * 7 * 8);
  const Counts edges = run([](Counts* d) { div_edge_mismatches<<<4096, 256>>>(d); });
  CHECK(edges.mismatches == 0);  // of 2^29 pairs
  CHECK(edges.fast_groups > 0);
}
