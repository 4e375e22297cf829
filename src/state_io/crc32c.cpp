// src/state_io/crc32c.cpp — CRC-32C two ways: the x86-64 SSE4.2 crc32 instruction, chosen
// at run time (8 bytes per instruction, three lanes at once on long inputs), and a portable
// table-driven path, slicing by 8: eight 256-entry tables let the loop fold 8 input bytes
// per iteration with 8 independent lookups.
#include "crc32c.hpp"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

namespace sa {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

using Tables = std::array<std::array<uint32_t, 256>, 8>;

// tables[0][b] is the CRC register after feeding byte b into a zero register;
// tables[k][b] the register after that byte is followed by k zero bytes.
constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    t[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b)
    for (std::size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}

constexpr Tables kTables = make_tables();

// The 8 bytes at p as a little-endian integer (the order the reflected CRC consumes them).
inline uint64_t load_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

#if defined(__x86_64__)
// The three-way path: the crc32 instruction takes 3 cycles but starts one a cycle, so three
// registers over three lanes of kLane bytes run at about three times one register's speed.
// The register is linear over GF(2): after lanes A, B, C from register r it is
// shift(reg(r, A), 2 kLane) ^ shift(reg(0, B), kLane) ^ reg(0, C), where shift(x, n) is x
// followed by n zero bytes, a fixed 32x32 bit matrix applied by four 256-entry tables.
constexpr std::size_t kLane = 4096;

class ZeroShift {
 public:
  // The map of `times` applications of `base` (nullptr: one zero byte, `zeros` times).
  ZeroShift(std::size_t zeros, const ZeroShift* base = nullptr, int times = 1) {
    std::array<uint32_t, 32> column{};
    for (int i = 0; i < 32; ++i) {
      uint32_t c = 1u << i;
      if (base == nullptr) {
        for (std::size_t k = 0; k < zeros; ++k) c = (c >> 8) ^ kTables[0][c & 0xFFu];
      } else {
        for (int k = 0; k < times; ++k) c = (*base)(c);
      }
      column[static_cast<std::size_t>(i)] = c;
    }
    for (std::size_t byte = 0; byte < 4; ++byte)
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t out = 0;
        for (std::size_t bit = 0; bit < 8; ++bit)
          if ((v >> bit) & 1u) out ^= column[8 * byte + bit];
        tables_[byte][v] = out;
      }
  }
  uint32_t operator()(uint32_t r) const {
    return tables_[0][r & 0xFFu] ^ tables_[1][(r >> 8) & 0xFFu] ^ tables_[2][(r >> 16) & 0xFFu] ^
           tables_[3][r >> 24];
  }

 private:
  std::array<std::array<uint32_t, 256>, 4> tables_{};
};

// The instruction computes the reflected CRC-32C register update without the initial
// and final inversion, exactly as the table path's loop does.
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const void* data,
                                                        std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (bytes > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(c, *p++);
    --bytes;
  }
  uint64_t c64 = c;
  if (bytes >= 3 * kLane) {
    static const ZeroShift one_lane(kLane);
    static const ZeroShift two_lanes(0, &one_lane, 2);
    while (bytes >= 3 * kLane) {
      uint64_t a = c64, b = 0, d = 0;
      for (std::size_t i = 0; i < kLane; i += 8) {
        uint64_t wa, wb, wd;
        std::memcpy(&wa, p + i, 8);
        std::memcpy(&wb, p + kLane + i, 8);
        std::memcpy(&wd, p + 2 * kLane + i, 8);
        a = _mm_crc32_u64(a, wa);
        b = _mm_crc32_u64(b, wb);
        d = _mm_crc32_u64(d, wd);
      }
      c64 = two_lanes(static_cast<uint32_t>(a)) ^ one_lane(static_cast<uint32_t>(b)) ^
            static_cast<uint32_t>(d);
      p += 3 * kLane;
      bytes -= 3 * kLane;
    }
  }
  while (bytes >= 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof word);  // little-endian: the order the CRC consumes bytes
    c64 = _mm_crc32_u64(c64, word);
    p += 8;
    bytes -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (bytes > 0) {
    c = _mm_crc32_u8(c, *p++);
    --bytes;
  }
  return ~c;
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, std::size_t bytes) {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return crc32c_sse42(crc, data, bytes);
#endif
  return crc32c_table(crc, data, bytes);
}

uint32_t crc32c_table(uint32_t crc, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  // Bytes up to an 8-byte boundary, so the main loop reads aligned words.
  while (bytes > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
    --bytes;
  }
  while (bytes >= 8) {
    const uint64_t word = load_le64(p) ^ c;
    c = kTables[7][word & 0xFFu] ^ kTables[6][(word >> 8) & 0xFFu] ^
        kTables[5][(word >> 16) & 0xFFu] ^ kTables[4][(word >> 24) & 0xFFu] ^
        kTables[3][(word >> 32) & 0xFFu] ^ kTables[2][(word >> 40) & 0xFFu] ^
        kTables[1][(word >> 48) & 0xFFu] ^ kTables[0][word >> 56];
    p += 8;
    bytes -= 8;
  }
  while (bytes > 0) {
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
    --bytes;
  }
  return ~c;
}

void crc32c_blocks(const void* data, std::size_t bytes, std::size_t block_bytes, uint32_t* out) {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::size_t blocks = (bytes + block_bytes - 1) / block_bytes;
  auto run = [&](std::size_t first, std::size_t end) {
    for (std::size_t b = first; b < end; ++b)
      out[b] = crc32c(0, p + b * block_bytes, std::min(block_bytes, bytes - b * block_bytes));
  };
  // A thread costs ~50 us to start; a MiB takes ~0.5 ms to checksum.
  constexpr std::size_t kBytesPerThread = std::size_t{1} << 20;
  const std::size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t threads = std::min(
      {hardware, blocks, std::max<std::size_t>(1, bytes / kBytesPerThread), std::size_t{16}});
  if (threads <= 1) return run(0, blocks);
  std::vector<std::thread> workers;
  std::size_t next = 0;
  try {
    for (std::size_t t = 1; t < threads; ++t) {
      const std::size_t end = blocks * t / threads;
      workers.emplace_back(run, next, end);
      next = end;
    }
  } catch (const std::system_error&) {  // no thread to be had: do the rest here
  }
  run(next, blocks);
  for (std::thread& w : workers) w.join();
}

}  // namespace sa
