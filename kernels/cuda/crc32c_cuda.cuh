// kernels/cuda/crc32c_cuda.cuh — CRC-32C of blocks of device memory, on the device: a shard
// file's checksums computed where the state is, so that an export's host threads only copy.
#ifndef SHARDADAM_KERNELS_CUDA_CRC32C_CUDA_CUH_
#define SHARDADAM_KERNELS_CUDA_CRC32C_CUDA_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace sa {
namespace kernels {

// The largest block launch_crc32c_blocks takes (a multiple of 4096 bytes at most this).
constexpr uint64_t kCrc32cMaxBlock = uint64_t{4} << 20;

// Enqueues out[i] = the CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value
// and final xor 0xFFFFFFFF; src/state_io/crc32c.hpp's crc32c(0, ...)) of block i of the
// `bytes` bytes at `src`, blocks of `block` bytes (the last one may be shorter), for i in
// [0, ceil(bytes / block)). `src` and `out` are device memory. cudaErrorInvalidValue unless
// `block` is a positive multiple of 4096 of at most kCrc32cMaxBlock.
cudaError_t launch_crc32c_blocks(const void* src, uint64_t bytes, uint64_t block, uint32_t* out,
                                 cudaStream_t stream);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_CRC32C_CUDA_CUH_
