// src/state_io/safetensors.hpp — the safetensors container: an 8-byte little-endian header
// length N, N bytes of JSON header, then the data section. This layer knows nothing of
// shardadam: it checks the container strictly and encodes it (metadata.hpp gives the
// header its shardadam meaning).
#ifndef SHARDADAM_SRC_STATE_IO_SAFETENSORS_HPP_
#define SHARDADAM_SRC_STATE_IO_SAFETENSORS_HPP_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <dlpack/dlpack.h>

#include "../layout.hpp"

namespace sa {

// The largest header we read or write: a little above the safetensors package's own
// limit (100,000,000 bytes), so that nothing it accepts is refused here.
inline constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;  // "F32", "BF16", "F16", "I16"
  DLDataType dtype{};
  Dims shape;
  uint64_t begin = 0;  // data_offsets, relative to the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_section = 0;  // where the data section starts in the blob: 8 + N
  uint64_t data_bytes = 0;    // its length: blob size - data_section
  bool has_metadata = false;
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::vector<SafetensorsTensor> tensors;       // sorted by data offset
};

// The header length N from the first 8 bytes; SA_ERR_FORMAT unless 2 <= N <= the
// largest header and 8 + N <= blob_size. `blob` names the blob in messages.
uint64_t parse_header_length(const unsigned char prefix[8], uint64_t blob_size,
                             const std::string& blob);

// Parses and checks the N bytes of JSON of a blob of `blob_size` bytes: an object; no
// duplicate keys; "__metadata__", if present, maps strings to strings; every other key
// is a tensor with a known dtype (dtype.hpp's safetensors table), a shape of at most
// SA_MAX_NDIM non-negative dims, and data_offsets [begin, end] inside the data section
// with end - begin = numel * element size; no two tensors' data ranges overlap; the last
// tensor's data ends where the blob ends (no bytes after the data section, which the
// safetensors package refuses too). Throws sa::Error(SA_ERR_FORMAT) naming `blob` and what
// is wrong; a JSON syntax error is placed by its byte offset, without quoting the bytes.
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t blob_size,
                                           const std::string& blob);

// The header of a blob holding `tensors` (their data_offsets are written as given) and
// `metadata`: length prefix, compact JSON, and spaces padding the data section to an
// 8-byte boundary (as the safetensors package does), and further to `min_bytes` in all
// when that is more (a multiple of 8: the JSON may end in spaces). Tensors are listed in
// the order given. SA_ERR_UNSUPPORTED if a name is not valid UTF-8 (JSON cannot carry it)
// or the header would exceed kMaxHeaderBytes.
std::string encode_safetensors_header(const std::map<std::string, std::string>& metadata,
                                      const std::vector<SafetensorsTensor>& tensors,
                                      std::size_t min_bytes = 0);

// numel * size of a shape, or false on overflow past 2^64.
bool shape_bytes(const Dims& shape, uint64_t element_size, uint64_t& bytes);

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_SAFETENSORS_HPP_
