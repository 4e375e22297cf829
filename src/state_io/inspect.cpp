// src/state_io/inspect.cpp — what a set of shard files holds, as a JSON report: per file,
// whether its header parses and its checksums match; per global tensor (param and state
// key), the boxes saved and whether they cover it exactly once (block scales go with their
// codes: "block_scales"). Never throws for a bad file: finding bad files is its job.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "../dtype.hpp"
#include "../errors.hpp"
#include "box.hpp"
#include "crc32c.hpp"
#include "group_json.hpp"
#include "metadata.hpp"
#include "state_io.hpp"

namespace sa {
namespace {

using nlohmann::ordered_json;

constexpr std::size_t kMaxListedBadBlocks = 10;

// Checks every block of every tensor of one file; fills the file's report.
void verify_file(const BlobReader& reader, const ShardHeader& header, ordered_json& report) {
  uint64_t largest = 0;
  for (const SavedTensor& t : header.tensors) largest = std::max(largest, t.bytes);
  const uint64_t chunk = std::max<uint64_t>(
      header.block_bytes, kDefaultStagingBytes / header.block_bytes * header.block_bytes);
  std::vector<unsigned char> staging(static_cast<std::size_t>(std::min(chunk, largest)));
  ordered_json bad = ordered_json::array();
  uint64_t bad_count = 0;
  std::vector<uint32_t> crcs;
  for (const SavedTensor& t : header.tensors) {
    for (uint64_t at = 0; at < t.bytes; at += chunk) {
      const uint64_t n = std::min(chunk, t.bytes - at);
      reader.read(header.data_section + t.data_begin + at, staging.data(),
                  static_cast<std::size_t>(n), "tensor data");
      crcs.resize(static_cast<std::size_t>(block_count(n, header.block_bytes)));
      crc32c_blocks(staging.data(), static_cast<std::size_t>(n),
                    static_cast<std::size_t>(header.block_bytes), crcs.data());
      for (std::size_t i = 0; i < crcs.size(); ++i) {
        const uint64_t block = at / header.block_bytes + i;
        const uint32_t crc = crcs[i];
        if (crc == t.crc32c[block]) continue;
        if (++bad_count <= kMaxListedBadBlocks)
          bad.push_back({{"tensor", t.name()},
                         {"block", block},
                         {"stored", t.crc32c[block]},
                         {"computed", crc}});
      }
    }
  }
  report["checksums"] = bad_count == 0 ? "ok" : "bad";
  report["bad_blocks"] = bad_count;
  if (bad_count > 0) report["bad_block_list"] = bad;
}

struct GlobalTensor {
  std::string param, key;
  std::string scales;  // block codes: the key of their scales (a float32 absmax per block)
  std::vector<Box> boxes;
  std::vector<std::size_t> files;
  std::vector<Dims> global_shapes;
  std::set<std::string> dtypes;
};

}  // namespace

std::string inspect_shards(const std::vector<BlobReader>& readers, bool verify_data) {
  ordered_json report = {{"ok", true}};  // first, for readers; set at the end
  bool ok = true;
  std::vector<std::optional<ShardHeader>> headers(readers.size());

  ordered_json files = ordered_json::array();
  for (std::size_t f = 0; f < readers.size(); ++f) {
    ordered_json file = {{"index", f}, {"name", readers[f].name()}, {"bytes", readers[f].size()}};
    try {
      headers[f] = read_shard_header(readers[f]);
      const ShardHeader& h = *headers[f];
      file["header"] = "ok";
      file["library"] = h.library;
      ordered_json meshes = ordered_json::array();
      for (const WriterMesh& m : h.meshes)
        meshes.push_back({{"shape", m.shape}, {"coord", m.coord}});
      file["meshes"] = meshes;
      ordered_json groups = ordered_json::array();
      for (const SavedGroup& g : h.groups) groups.push_back(group_to_json<ordered_json>(g));
      file["groups"] = groups;
      file["tensors"] = h.tensors.size();
      file["checksum_block_bytes"] = h.block_bytes;
      if (verify_data) {
        try {
          verify_file(readers[f], h, file);
          ok = ok && file["checksums"] == "ok";
        } catch (const Error& e) {
          file["checksums"] = "unreadable";
          file["error"] = e.what();
          ok = false;
        }
      } else {
        file["checksums"] = "not verified";
      }
    } catch (const Error& e) {
      file["header"] = "bad";
      file["error"] = e.what();
      ok = false;
    }
    files.push_back(file);
  }
  report["files"] = files;

  // Groups: every file of one checkpoint holds the same.
  std::string groups_status = "consistent";
  const ShardHeader* first = nullptr;
  std::size_t first_index = 0;
  for (std::size_t f = 0; f < headers.size(); ++f) {
    if (!headers[f]) continue;
    if (first == nullptr) {
      first = &*headers[f];
      first_index = f;
      continue;
    }
    const std::string difference = describe_group_difference(
        first->groups, concat("file ", first_index), headers[f]->groups, concat("file ", f));
    if (!difference.empty()) {
      groups_status = concat("the files disagree about ", difference);
      ok = false;
      break;
    }
  }
  report["groups"] = groups_status;

  std::map<std::string, GlobalTensor> tensors;
  for (std::size_t f = 0; f < headers.size(); ++f) {
    if (!headers[f]) continue;
    for (const SavedTensor& t : headers[f]->tensors) {
      if (t.block_elems > 0) continue;  // block scales: their codes' box
      GlobalTensor& g = tensors[t.name()];
      if (t.scales >= 0) g.scales = headers[f]->tensors[static_cast<std::size_t>(t.scales)].key;
      g.param = t.param;
      g.key = t.key;
      g.boxes.push_back({t.global_offset, t.shape});
      g.files.push_back(f);
      g.global_shapes.push_back(t.global_shape);
      g.dtypes.insert(safetensors_name(t.dtype));
    }
  }
  ordered_json list = ordered_json::array();
  for (const auto& named : tensors) {
    const std::string& name = named.first;
    const GlobalTensor& g = named.second;  // not a structured binding: lambdas capture it
    ordered_json boxes = ordered_json::array();
    for (std::size_t i = 0; i < g.boxes.size(); ++i)
      boxes.push_back(
          {{"file", g.files[i]}, {"offset", g.boxes[i].offset}, {"shape", g.boxes[i].shape}});
    ordered_json entry = {{"name", name},       {"param", g.param},
                          {"key", g.key},       {"global_shape", g.global_shapes[0]},
                          {"dtypes", g.dtypes}, {"boxes", boxes}};
    if (!g.scales.empty())
      entry["block_scales"] = {{"key", g.scales}, {"block_elems", kMomentBlock}};
    const Tiling tiling = check_tiling(g.boxes, g.global_shapes,
                                       [&](std::size_t i) { return concat("file ", g.files[i]); });
    entry["coverage"] = tiling_kind_name(tiling.kind);
    entry["detail"] = tiling.detail;
    ok = ok && tiling.kind == Tiling::Kind::exact;
    list.push_back(entry);
  }
  report["tensors"] = list;
  report["ok"] = ok;
  // Blob names come from the caller and need not be UTF-8.
  return report.dump(2, ' ', false, ordered_json::error_handler_t::replace);
}

}  // namespace sa
