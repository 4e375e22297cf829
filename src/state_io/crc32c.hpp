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
uint32_t crc32c(uint32_t crc, const void* data, std::size_t bytes);

// The CRC-32C of each consecutive block of `block_bytes` bytes of the `bytes` bytes at
// `data` (the last block may be shorter), into out[0 .. ceil(bytes / block_bytes)).
// Spans of several MiB are split over threads: a table-driven CRC runs at ~1.5-3 GB/s
// per core, below what memory, disks and host-device links deliver.
void crc32c_blocks(const void* data, std::size_t bytes, std::size_t block_bytes, uint32_t* out);

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_CRC32C_HPP_
