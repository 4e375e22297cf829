// tests/fuzz/fuzz_header.cpp — libFuzzer target on the shard-file header parser and the
// inspection built on it. The input is a whole blob. Two paths:
//  - as given: length field, JSON, container checks, header checksum;
//  - resealed: when the container parses, its header checksum is recomputed and the
//    header re-encoded, so mutations also reach the checks behind the checksum (metadata
//    JSON, groups, boxes, checksum lists), which a random mutation would almost never
//    get past otherwise.
// Any exception other than sa::Error, any sanitizer report, and any parsed tensor whose
// data lies outside the blob is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/errors.hpp"
#include "src/state_io/blob.hpp"
#include "src/state_io/metadata.hpp"
#include "src/state_io/safetensors.hpp"
#include "src/state_io/state_io.hpp"

namespace {

void check_parsed(const sa::ShardHeader& h, uint64_t blob_size) {
  for (const sa::SavedTensor& t : h.tensors) {
    if (h.data_section + t.data_begin + t.bytes > blob_size) __builtin_trap();
    if (t.crc32c.size() != sa::block_count(t.bytes, h.block_bytes)) __builtin_trap();
    if (t.block_elems > 0) continue;  // block scales: no box; checked with their codes
    for (std::size_t d = 0; d < t.shape.size(); ++d)
      if (t.global_offset[d] + t.shape[d] > t.global_shape[d]) __builtin_trap();
    if (t.scales < 0) continue;
    // Block codes (one byte each) and their scales: one per block, in the same header.
    if (static_cast<std::size_t>(t.scales) >= h.tensors.size()) __builtin_trap();
    const sa::SavedTensor& s = h.tensors[static_cast<std::size_t>(t.scales)];
    const auto blocks = static_cast<int64_t>((t.bytes + 255) / 256);
    if (s.block_elems != 256 || s.shape != sa::Dims{blocks} || h.block_bytes % 256 != 0)
      __builtin_trap();
  }
}

void parse_and_inspect(const unsigned char* data, std::size_t size) {
  const std::string blob = "fuzz";
  try {
    if (size < 8) return;
    const uint64_t n = sa::parse_header_length(data, size, blob);
    const std::string_view json(reinterpret_cast<const char*>(data) + 8, static_cast<std::size_t>(n));
    try {
      check_parsed(sa::parse_shard_header(json, size, blob), size);
    } catch (const sa::Error&) {
    }
    // Resealed.
    sa::SafetensorsHeader st = sa::parse_safetensors_header(json, size, blob);
    st.metadata["header_crc32c"] = sa::header_checksum(st.metadata, st.tensors);
    const std::string header = sa::encode_safetensors_header(st.metadata, st.tensors);
    std::vector<unsigned char> resealed(header.begin(), header.end());
    resealed.insert(resealed.end(), data + 8 + n, data + size);
    const std::string_view json2(header.data() + 8, header.size() - 8);
    try {
      check_parsed(sa::parse_shard_header(json2, resealed.size(), blob), resealed.size());
    } catch (const sa::Error&) {
    }
    // The inspection of the resealed blob reads its data and checks coverage too.
    std::vector<sa::BlobReader> readers;
    sa_reader reader = sa::make_memory_reader(resealed.data(), resealed.size());
    readers.emplace_back(&reader, 0);
    (void)sa::inspect_shards(readers, true);
    reader.release(reader.ctx);
  } catch (const sa::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  parse_and_inspect(data, size);
  return 0;
}
