// kernels/cuda/crc32c_cuda.cu — CRC-32C of blocks of device memory. One thread block per
// checksum block; each thread takes a 4096-byte segment of it and runs the table-driven
// CRC over it (the first segment from the initial value, the others from 0); thread 0 then
// folds the segments' registers in order. The register update is affine in the register,
// so the register after segments 0..s is shift(register after 0..s-1, length of s) xor the
// register of segment s alone from 0, where shift feeds zero bytes: a GF(2) matrix for a
// whole segment (computed once on the host), byte steps for a shorter last one.
#include "crc32c_cuda.cuh"

namespace sa {
namespace kernels {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli
constexpr int kSegment = 4096;
constexpr int kThreads = 256;
constexpr int kMaxSegments = static_cast<int>(kCrc32cMaxBlock / kSegment);

// The register after 4096 zero bytes, as a matrix: column k is the result for register 1 << k.
struct SegmentShift {
  uint32_t column[32];
};

__host__ __device__ inline uint32_t table_entry(uint32_t i) {
  for (int bit = 0; bit < 8; ++bit) i = (i & 1u) ? (i >> 1) ^ kPolynomial : i >> 1;
  return i;
}

SegmentShift make_segment_shift() {
  uint32_t table[256];
  for (uint32_t i = 0; i < 256; ++i) table[i] = table_entry(i);
  SegmentShift shift{};
  for (int k = 0; k < 32; ++k) {
    uint32_t reg = 1u << k;
    for (int i = 0; i < kSegment; ++i) reg = table[reg & 0xffu] ^ (reg >> 8);
    shift.column[k] = reg;
  }
  return shift;
}

__global__ void crc32c_blocks_kernel(const unsigned char* src, uint64_t bytes, uint64_t block,
                                     uint32_t* out, SegmentShift shift) {
  __shared__ uint32_t table[256];
  __shared__ uint32_t registers[kMaxSegments];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) table[i] = table_entry(static_cast<uint32_t>(i));
  __syncthreads();
  const uint64_t begin = static_cast<uint64_t>(blockIdx.x) * block;
  const uint64_t length = bytes - begin < block ? bytes - begin : block;
  const int segments = static_cast<int>((length + kSegment - 1) / kSegment);
  for (int s = threadIdx.x; s < segments; s += blockDim.x) {
    const unsigned char* p = src + begin + static_cast<uint64_t>(s) * kSegment;
    const uint64_t left = length - static_cast<uint64_t>(s) * kSegment;
    const int n = left < kSegment ? static_cast<int>(left) : kSegment;
    uint32_t reg = s == 0 ? 0xFFFFFFFFu : 0u;
    int i = 0;
    if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) {
      for (; i + 4 <= n; i += 4) {  // a little-endian word: its bytes in order
        reg ^= *reinterpret_cast<const uint32_t*>(p + i);
        for (int b = 0; b < 4; ++b) reg = table[reg & 0xffu] ^ (reg >> 8);
      }
    }
    for (; i < n; ++i) reg = table[(reg ^ p[i]) & 0xffu] ^ (reg >> 8);
    registers[s] = reg;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  uint32_t crc = registers[0];
  for (int s = 1; s < segments; ++s) {
    const uint64_t left = length - static_cast<uint64_t>(s) * kSegment;
    if (left >= kSegment) {
      uint32_t shifted = 0;
      for (int k = 0; k < 32; ++k)
        if ((crc >> k) & 1u) shifted ^= shift.column[k];
      crc = shifted;
    } else {
      for (uint64_t i = 0; i < left; ++i) crc = table[crc & 0xffu] ^ (crc >> 8);
    }
    crc ^= registers[s];
  }
  out[blockIdx.x] = crc ^ 0xFFFFFFFFu;
}

}  // namespace

cudaError_t launch_crc32c_blocks(const void* src, uint64_t bytes, uint64_t block, uint32_t* out,
                                 cudaStream_t stream) {
  if (block == 0 || block % kSegment != 0 || block > kCrc32cMaxBlock) return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  const uint64_t blocks = (bytes + block - 1) / block;
  if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;
  static const SegmentShift shift = make_segment_shift();
  crc32c_blocks_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const unsigned char*>(src), bytes, block, out, shift);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace sa
