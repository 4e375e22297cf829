// src/state_io/crc32c.hpp — CRC-32C (Castagnoli), the checksum of shard-file blocks and
// headers. The same CRC as iSCSI, ext4 and Python's `crc32c`/`google-crc32c` packages:
// reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF.
#ifndef SHARDADAM_SRC_STATE_IO_CRC32C_HPP_
#define SHARDADAM_SRC_STATE_IO_CRC32C_HPP_

#include <cstddef>
#include <cstdint>

namespace sa {

// The CRC-32C of `bytes` bytes at `data`, continuing from `crc` (the CRC of what came
// before; 0 for a fresh start): crc32c(crc32c(0, a), b) == crc32c(0, a followed by b).
// Uses the CPU's CRC-32C instruction where there is one (x86-64 SSE4.2), else
// crc32c_table; both give the same result.
uint32_t crc32c(uint32_t crc, const void* data, std::size_t bytes);

// The portable table-driven path of crc32c (exposed so tests cover it on every CPU).
uint32_t crc32c_table(uint32_t crc, const void* data, std::size_t bytes);

// The CRC-32C of each consecutive block of `block_bytes` bytes of the `bytes` bytes at
// `data` (the last block may be shorter), into out[0 .. ceil(bytes / block_bytes)).
// Spans of several MiB are split over threads: even the CRC instruction (~8 GB/s per
// core; the table-driven path ~1.7 GB/s) is below what memory and host-device links deliver.
void crc32c_blocks(const void* data, std::size_t bytes, std::size_t block_bytes, uint32_t* out);

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_CRC32C_HPP_
