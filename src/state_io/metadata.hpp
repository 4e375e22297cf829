// src/state_io/metadata.hpp — what makes a safetensors file a shardadam shard file: the
// tensor naming ("<param>/<state key>"), which dtype each state key may have, and the
// __metadata__ keys (docs/shard-files.md documents each one for other readers).
#ifndef SHARDADAM_SRC_STATE_IO_METADATA_HPP_
#define SHARDADAM_SRC_STATE_IO_METADATA_HPP_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <dlpack/dlpack.h>
#include <nlohmann/json_fwd.hpp>

#include "../layout.hpp"
#include "../schema.hpp"
#include "blob.hpp"
#include "safetensors.hpp"
#include "shardadam/shardadam.h"

namespace sa {

inline constexpr const char* kShardFormat = "shardadam";
// 4: the groups' update rule and Muon's hyperparameters (src/schema.hpp), and the state
//    "momentum_buffer" of a Muon group's params. Older files load as AdamW groups.
// 3: block moments (8-bit, float8) as their codes (U8, F8_E4M3) and their blocks' absmax
//    (the tensor "<param>/<moment>_absmax"). Version 2 files hold them as float32 values.
// 2: per-param step counts ("params"). Version 1 files (no "params") still load: each
//    param then takes its group's step count.
inline constexpr int kShardFormatVersion = 4;
inline constexpr int kOldestShardFormatVersion = 1;
// Bytes per checksummed block of a tensor's data (the last block of a tensor is shorter).
// 1 MiB: the checksum list stays ~1e-6 of the data, and a partial read of a tensor reads
// at most one block more than it needs at each end.
inline constexpr uint64_t kChecksumBlockBytes = uint64_t{1} << 20;

struct SavedGroup {
  sa_group_config config;
  int64_t step;
};

// A mesh the writer's params were placed on, with the writer's coordinate in it.
struct WriterMesh {
  Dims shape;
  Dims coord;
};

struct SavedTensor {
  std::string param;  // the tensor is named "<param>/<key>"
  std::string key;
  DLDataType dtype{};
  Dims shape;  // the saved shard's (local) shape
  Dims global_shape;
  Dims global_offset;
  // The block scales of a block moment (a per-block key, "<moment>_absmax"): one float32
  // per block of this many elements of the moment's tensor in the same file, in its flat
  // order. They have no box of their own (global_shape and global_offset are empty).
  int64_t block_elems = 0;
  // A block moment's codes (dtype U8 or F8_E4M3): the index in the header's tensors of its
  // scales; -1 for any other tensor.
  int64_t scales = -1;
  uint64_t data_begin = 0;  // relative to the data section
  uint64_t bytes = 0;
  std::vector<uint32_t> crc32c;  // one per block of kChecksumBlockBytes (or the file's size)

  std::string name() const { return param + "/" + key; }
};

struct ShardHeader {
  uint64_t data_section = 0;  // offset of the data section in the blob
  uint64_t block_bytes = kChecksumBlockBytes;
  std::string library;  // who wrote it, e.g. "shardadam 0.1.0"
  int version = kShardFormatVersion;
  std::vector<SavedGroup> groups;
  std::vector<WriterMesh> meshes;
  std::vector<SavedTensor> tensors;  // in data order
  // Version >= 2: the step count of every param the file holds tensors of.
  std::map<std::string, int64_t> param_steps;
};

// Number of checksum blocks of a tensor of `bytes` bytes.
inline uint64_t block_count(uint64_t bytes, uint64_t block_bytes) {
  return (bytes + block_bytes - 1) / block_bytes;
}

// The value of the "header_crc32c" metadata key (8 lowercase hex digits) for a header
// holding `metadata` (its own "header_crc32c", if any, is ignored) and `tensors`. Its
// definition, which other writers of shard files follow, is in docs/shard-files.md.
std::string header_checksum(const std::map<std::string, std::string>& metadata,
                            const std::vector<SafetensorsTensor>& tensors);

// The header bytes (length prefix, JSON, padding) of a shard file holding `header`'s
// tensors at their data_begin offsets, padded with spaces to `min_bytes` in all (an
// export passes shard_header_bound); data_section is not read.
std::string encode_shard_header(const ShardHeader& header, std::size_t min_bytes = 0);

// The size of encode_shard_header(header) with every block checksum at its widest
// (4294967295): at least the size of the header whatever the checksums are, so an export
// knows where the data begin before it has read them. A multiple of 8.
std::size_t shard_header_bound(ShardHeader header);

// The value of group field `f` in `group`, a saved group of a file of format `version`
// (where: "groups[0]", for messages): its default when the file predates the field
// (version < f.since: schema.hpp's rule for fields added later), else the value the file
// holds, which must be there and valid JSON of the field's kind (SA_ERR_FORMAT naming
// `blob` and where otherwise).
double saved_group_field(const nlohmann::json& group, const schema::GroupField& f, int version,
                         const std::string& blob, const std::string& where);

// Parses the JSON text of a blob's header (the N bytes after the length prefix) and
// checks everything a shard file promises: safetensors structure (safetensors.hpp),
// format and version, the header checksum, and for every tensor its name, dtype, box and
// checksum list. SA_ERR_FORMAT (SA_ERR_UNSUPPORTED for a newer format version) naming
// `blob` and the problem.
ShardHeader parse_shard_header(std::string_view json, uint64_t blob_size, const std::string& blob);

// Reads the header of `reader`'s blob (two reads: the length, then the JSON) and parses it.
ShardHeader read_shard_header(const BlobReader& reader);

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_METADATA_HPP_
