#include "metadata.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "../dtype.hpp"
#include "../errors.hpp"
#include "../state_kinds.hpp"
#include "crc32c.hpp"
#include "group_json.hpp"
#include "json_error.hpp"
#include "safetensors.hpp"

namespace sa {
namespace {

using nlohmann::json;

// The __metadata__ keys (docs/shard-files.md, "The file format").
constexpr const char* kKeyFormat = "format";
constexpr const char* kKeyVersion = "format_version";
constexpr const char* kKeyHeaderCrc = "header_crc32c";
constexpr const char* kKeyChecksum = "checksum";
constexpr const char* kKeyGroups = "groups";
constexpr const char* kKeyWriter = "writer";
constexpr const char* kKeyTensors = "tensors";
constexpr const char* kKeyParams = "params";  // version >= 2

std::string hex32(uint32_t v) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

}  // namespace

// The header checksum covers what the header means, not how it is spelled, so that a tool
// that rewrites a shard file (safetensors' save_file with the same tensors and metadata)
// keeps it valid: the CRC-32C of the compact JSON, keys sorted by byte value, of
// {"__metadata__": <metadata without header_crc32c>, "<tensor>": {"dtype": .., "shape": ..}, ...}.
// data_offsets are left out: where a tensor's bytes sit is checked by the data checksums.
std::string header_checksum(const std::map<std::string, std::string>& metadata,
                            const std::vector<SafetensorsTensor>& tensors) {
  json canonical = json::object();
  json& meta = canonical["__metadata__"] = json::object();
  for (const auto& [key, value] : metadata)
    if (key != kKeyHeaderCrc) meta[key] = value;
  for (const SafetensorsTensor& t : tensors)
    canonical[t.name] = {{"dtype", t.dtype_name}, {"shape", t.shape}};
  const std::string text = canonical.dump();
  return hex32(crc32c(0, text.data(), text.size()));
}

namespace {

// ---- reading typed fields ----------------------------------------------------------------

class FieldReader {
 public:
  explicit FieldReader(std::string blob) : blob_(std::move(blob)) {}

  json parse(const std::map<std::string, std::string>& metadata, const char* key) const {
    const auto it = metadata.find(key);
    if (it == metadata.end()) fail(SA_ERR_FORMAT, blob_, ": __metadata__ has no \"", key, "\"");
    try {
      return json::parse(it->second);
    } catch (const json::exception& e) {
      const JsonError error = describe_json_error(e);
      if (!error.has_position)
        fail(SA_ERR_FORMAT, blob_, ": __metadata__ \"", key,
             "\" is not valid JSON: ", error.reason);
      fail(SA_ERR_FORMAT, blob_, ": __metadata__ \"", key, "\" is not valid JSON at byte ",
           error.position, " of its value: ", error.reason);
    }
  }

  const json& member(const json& object, const char* key, const std::string& where) const {
    if (!object.is_object()) fail(SA_ERR_FORMAT, blob_, ": ", where, " is not a JSON object");
    const auto it = object.find(key);
    if (it == object.end()) fail(SA_ERR_FORMAT, blob_, ": ", where, " has no \"", key, "\"");
    return *it;
  }

  double number(const json& object, const char* key, const std::string& where) const {
    const json& v = member(object, key, where);
    if (!v.is_number()) fail(SA_ERR_FORMAT, blob_, ": ", where, ".", key, " is not a number");
    return v.get<double>();
  }

  int64_t integer(const json& object, const char* key, const std::string& where, int64_t lo,
                  int64_t hi) const {
    return integer_value(member(object, key, where), concat(where, ".", key), lo, hi);
  }

  int64_t integer_value(const json& v, const std::string& what, int64_t lo, int64_t hi) const {
    int64_t value = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX))
        fail(SA_ERR_FORMAT, blob_, ": ", what, " is too large");
      value = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      value = v.get<int64_t>();
    } else {
      fail(SA_ERR_FORMAT, blob_, ": ", what, " is ", v.dump(), ", not an integer");
    }
    if (value < lo || value > hi)
      fail(SA_ERR_FORMAT, blob_, ": ", what, " is ", value, ", outside [", lo, ", ", hi, "]");
    return value;
  }

  Dims dims(const json& object, const char* key, const std::string& where) const {
    const json& v = member(object, key, where);
    if (!v.is_array() || v.size() > SA_MAX_NDIM)
      fail(SA_ERR_FORMAT, blob_, ": ", where, ".", key, " is not an array of at most ", SA_MAX_NDIM,
           " integers");
    Dims out;
    for (const json& d : v)
      out.push_back(integer_value(d, concat(where, ".", key, " entry"), 0, INT64_MAX));
    return out;
  }

  const std::string& blob() const { return blob_; }

 private:
  std::string blob_;
};

double field_value(const json& g, const schema::GroupField& f, int version, const FieldReader& in,
                   const std::string& where) {
  if (version < f.since && g.is_object() && !g.contains(f.name)) return f.default_value;
  return schema::integral(f.rule)
             ? static_cast<double>(in.integer(g, f.name, where, INT32_MIN, INT32_MAX))
             : in.number(g, f.name, where);
}

std::vector<SavedGroup> parse_groups(const json& groups, int version, const FieldReader& in) {
  if (!groups.is_array())
    fail(SA_ERR_FORMAT, in.blob(), ": __metadata__ \"groups\" is not an array");
  std::vector<SavedGroup> out;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const json& g = groups[i];
    const std::string where = concat("groups[", i, "]");
    sa_group_config c = schema::default_group_config();
    for (const schema::GroupField& f : schema::kGroupFields)
      schema::set(c, f, field_value(g, f, version, in, where));
    out.push_back({c, in.integer(g, "step", where, 0, INT64_MAX)});
  }
  return out;
}

std::vector<WriterMesh> parse_meshes(const json& writer, const FieldReader& in,
                                     std::string& library) {
  const json& lib = in.member(writer, "library", "writer");
  if (!lib.is_string()) fail(SA_ERR_FORMAT, in.blob(), ": writer.library is not a string");
  library = lib.get<std::string>();
  const json& meshes = in.member(writer, "meshes", "writer");
  if (!meshes.is_array()) fail(SA_ERR_FORMAT, in.blob(), ": writer.meshes is not an array");
  std::vector<WriterMesh> out;
  for (std::size_t i = 0; i < meshes.size(); ++i) {
    const std::string where = concat("writer.meshes[", i, "]");
    WriterMesh m{in.dims(meshes[i], "shape", where), in.dims(meshes[i], "coord", where)};
    bool inside = m.shape.size() == m.coord.size();
    for (std::size_t d = 0; inside && d < m.shape.size(); ++d) inside = m.coord[d] < m.shape[d];
    if (!inside)
      fail(SA_ERR_FORMAT, in.blob(), ": ", where, " has coordinate ", format_dims(m.coord),
           " outside the mesh ", format_dims(m.shape));
    out.push_back(std::move(m));
  }
  return out;
}

void parse_box(const json& entry, const std::string& where, SavedTensor& s, const FieldReader& in) {
  s.global_shape = in.dims(entry, "global_shape", where);
  s.global_offset = in.dims(entry, "global_offset", where);
  if (s.global_shape.size() != s.shape.size() || s.global_offset.size() != s.shape.size())
    fail(SA_ERR_FORMAT, in.blob(), ": ", where, " has global_shape ", format_dims(s.global_shape),
         " and global_offset ", format_dims(s.global_offset), " but the tensor has shape ",
         format_dims(s.shape));
  for (std::size_t d = 0; d < s.shape.size(); ++d)
    if (s.global_offset[d] > s.global_shape[d] ||
        s.shape[d] > s.global_shape[d] - s.global_offset[d])
      fail(SA_ERR_FORMAT, in.blob(), ": ", where, ": the box of offset ",
           format_dims(s.global_offset), " and shape ", format_dims(s.shape),
           " does not fit the global shape ", format_dims(s.global_shape));
}

std::vector<uint32_t> parse_checksums(const json& entry, const std::string& where, uint64_t bytes,
                                      uint64_t block_bytes, const FieldReader& in) {
  const json& crcs = in.member(entry, "crc32c", where);
  const uint64_t blocks = block_count(bytes, block_bytes);
  if (!crcs.is_array() || crcs.size() != blocks)
    fail(SA_ERR_FORMAT, in.blob(), ": ", where, ".crc32c must list ", blocks,
         " checksums (one per block of ", block_bytes, " bytes of its ", bytes, " bytes)");
  std::vector<uint32_t> out;
  out.reserve(crcs.size());
  for (const json& c : crcs)
    out.push_back(
        static_cast<uint32_t>(in.integer_value(c, where + ".crc32c entry", 0, UINT32_MAX)));
  return out;
}

SavedTensor parse_saved_tensor(const SafetensorsTensor& t, const json& tensors,
                               uint64_t block_bytes, const FieldReader& in) {
  SavedTensor s;
  const std::size_t slash = t.name.rfind('/');
  if (slash == std::string::npos || slash == 0)
    fail(SA_ERR_FORMAT, in.blob(), ": tensor '", t.name, "' is not named \"<param>/<state key>\"");
  s.param = t.name.substr(0, slash);
  s.key = t.name.substr(slash + 1);
  const StateKindInfo* kind = find_state_kind(s.key);
  if (kind == nullptr)
    fail(SA_ERR_FORMAT, in.blob(), ": tensor '", t.name, "' has state key '", s.key,
         "'; shard files hold ", all_state_keys());
  if (!storage_accepts(kind->storage, t.dtype))
    fail(SA_ERR_FORMAT, in.blob(), ": tensor '", t.name, "' is stored as ", t.dtype_name, "; ",
         s.key, " is stored as ", storage_file_dtypes(kind->storage));
  s.dtype = t.dtype;
  s.shape = t.shape;
  s.data_begin = t.begin;
  s.bytes = t.end - t.begin;

  const auto entry = tensors.find(t.name);
  if (entry == tensors.end())
    fail(SA_ERR_FORMAT, in.blob(), ": tensor '", t.name,
         "' has no entry in __metadata__ \"tensors\"");
  const std::string where = concat("tensors['", t.name, "']");
  if (kind->per_block) {
    s.block_elems = in.integer(*entry, "block_elems", where, 1, INT32_MAX);
    if (s.block_elems != kMomentBlock)
      fail(SA_ERR_UNSUPPORTED, in.blob(), ": ", where, ".block_elems is ", s.block_elems,
           "; this library's block moments have blocks of ", kMomentBlock, " elements");
    if (s.shape.size() != 1)
      fail(SA_ERR_FORMAT, in.blob(), ": tensor '", t.name, "' has shape ", format_dims(s.shape),
           "; block scales are one-dimensional");
  } else {
    parse_box(*entry, where, s, in);
  }
  s.crc32c = parse_checksums(*entry, where, s.bytes, block_bytes, in);
  return s;
}

// Pairs each block moment's codes with its scales ("<param>/<moment>_absmax", in the same
// file), which must be there, of one entry per block of the codes, and checksummed in
// whole blocks of codes (an import decodes a block from the chunk that holds it).
void link_block_scales(ShardHeader& h, const FieldReader& in) {
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < h.tensors.size(); ++i) index[h.tensors[i].name()] = i;
  auto is_codes = [](const SavedTensor& t) {
    const std::optional<ElemType> type = elem_type_of(t.dtype);
    return type && is_block_moment(*type);
  };
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const SavedTensor& scales = h.tensors[i];
    if (scales.block_elems == 0) continue;
    int k = 0;
    if (!is_absmax_state(find_state_kind(scales.key)->kind, &k))  // the per-block kinds
      fail(SA_ERR_INTERNAL, "block scales of state ", scales.key);
    const std::string codes_name = concat(scales.param, "/", state_kind_info(moment_state(k)).key);
    const auto found = index.find(codes_name);
    if (found == index.end() || !is_codes(h.tensors[found->second]))
      fail(SA_ERR_FORMAT, in.blob(), ": tensor '", scales.name(),
           "' holds block scales but the file ",
           found == index.end() ? "has no tensor '" : "holds no block codes as tensor '",
           codes_name, "'");
    SavedTensor& codes = h.tensors[found->second];
    const auto n = static_cast<int64_t>(codes.bytes);  // one byte per code
    const int64_t blocks = (n + scales.block_elems - 1) / scales.block_elems;
    if (scales.shape != Dims{blocks})
      fail(SA_ERR_FORMAT, in.blob(), ": tensor '", scales.name(), "' has shape ",
           format_dims(scales.shape), " but '", codes_name, "' has ", n, " elements: ", blocks,
           " blocks of ", scales.block_elems);
    if (h.block_bytes % static_cast<uint64_t>(scales.block_elems) != 0)
      fail(SA_ERR_FORMAT, in.blob(), ": checksum.block_bytes ", h.block_bytes,
           " is not a multiple of ", scales.block_elems,
           ", the codes of one block (the file holds block moments)");
    codes.scales = static_cast<int64_t>(i);
  }
  for (const SavedTensor& codes : h.tensors) {
    if (!is_codes(codes) || codes.scales >= 0) continue;
    int k = 0;
    is_moment_state(find_state_kind(codes.key)->kind, &k);  // storage_accepts: a moment
    fail(SA_ERR_FORMAT, in.blob(), ": tensor '", codes.name(), "' holds ",
         safetensors_name(codes.dtype), " codes but the file has no tensor '", codes.param, "/",
         state_kind_info(moment_absmax_state(k)).key, "' with their block scales");
  }
}

// "params": {"<param>": {"step": N}, ...}, one entry for exactly the params the file holds
// tensors of.
std::map<std::string, int64_t> parse_param_steps(const json& params,
                                                 const std::vector<SavedTensor>& tensors,
                                                 const FieldReader& in) {
  if (!params.is_object())
    fail(SA_ERR_FORMAT, in.blob(), ": __metadata__ \"params\" is not an object");
  std::map<std::string, int64_t> steps;
  for (const auto& [name, entry] : params.items())
    steps[name] = in.integer(entry, "step", concat("params['", name, "']"), 0, INT64_MAX);
  std::set<std::string> held;
  for (const SavedTensor& t : tensors) {
    if (!steps.count(t.param))
      fail(SA_ERR_FORMAT, in.blob(), ": tensor '", t.name(),
           "' has no entry for its param in __metadata__ \"params\"");
    held.insert(t.param);
  }
  for (const auto& entry : steps)
    if (!held.count(entry.first))
      fail(SA_ERR_FORMAT, in.blob(), ": __metadata__ \"params\" names '", entry.first,
           "', which has no tensor");
  return steps;
}

}  // namespace

std::size_t shard_header_bound(ShardHeader header) {
  for (SavedTensor& t : header.tensors) std::fill(t.crc32c.begin(), t.crc32c.end(), UINT32_MAX);
  return encode_shard_header(header).size();  // the header checksum is fixed-width hex
}

std::string encode_shard_header(const ShardHeader& header, std::size_t min_bytes) {
  std::map<std::string, std::string> metadata;
  metadata[kKeyFormat] = kShardFormat;
  metadata[kKeyVersion] = std::to_string(kShardFormatVersion);
  metadata[kKeyChecksum] =
      json{{"algorithm", "crc32c"}, {"block_bytes", header.block_bytes}}.dump();

  json groups = json::array();
  for (const SavedGroup& g : header.groups) {
    groups.push_back(group_to_json<json>(g));
  }
  metadata[kKeyGroups] = groups.dump();

  json meshes = json::array();
  for (const WriterMesh& m : header.meshes)
    meshes.push_back({{"shape", m.shape}, {"coord", m.coord}});
  metadata[kKeyWriter] = json{{"library", header.library}, {"meshes", meshes}}.dump();

  json params = json::object();
  for (const auto& [name, step] : header.param_steps) params[name] = {{"step", step}};

  json tensors = json::object();
  std::vector<SafetensorsTensor> entries;
  for (const SavedTensor& t : header.tensors) {
    tensors[t.name()] = t.block_elems > 0
                            ? json{{"block_elems", t.block_elems}, {"crc32c", t.crc32c}}
                            : json{{"global_shape", t.global_shape},
                                   {"global_offset", t.global_offset},
                                   {"crc32c", t.crc32c}};
    entries.push_back({t.name(), safetensors_name(t.dtype), t.dtype, t.shape, t.data_begin,
                       t.data_begin + t.bytes});
  }
  try {
    metadata[kKeyTensors] = tensors.dump();
    metadata[kKeyParams] = params.dump();
  } catch (const json::exception& e) {
    fail(SA_ERR_UNSUPPORTED,
         "a param name is not valid UTF-8, which a safetensors (JSON) header "
         "cannot hold (",
         e.what(), ")");
  }
  // Names are valid UTF-8 from here on (the dump above would have thrown), so the
  // canonical dump cannot throw.
  metadata[kKeyHeaderCrc] = header_checksum(metadata, entries);
  return encode_safetensors_header(metadata, entries, min_bytes);
}

double saved_group_field(const json& group, const schema::GroupField& f, int version,
                         const std::string& blob, const std::string& where) {
  return field_value(group, f, version, FieldReader(blob), where);
}

ShardHeader parse_shard_header(std::string_view text, uint64_t blob_size, const std::string& blob) {
  const SafetensorsHeader st = parse_safetensors_header(text, blob_size, blob);
  const auto format = st.metadata.find(kKeyFormat);
  if (format == st.metadata.end() || format->second != kShardFormat)
    fail(SA_ERR_FORMAT, blob,
         ": a safetensors file, but not a shardadam shard file (its __metadata__ ",
         st.has_metadata ? "has no \"format\": \"shardadam\"" : "is missing", ")");
  // The checksum first: a flipped bit in the version must read as corruption, not as a
  // file from a newer shardadam.
  const auto stored_crc = st.metadata.find(kKeyHeaderCrc);
  if (stored_crc == st.metadata.end())
    fail(SA_ERR_FORMAT, blob, ": __metadata__ has no \"header_crc32c\"");
  const std::string computed = header_checksum(st.metadata, st.tensors);
  if (stored_crc->second != computed)
    fail(SA_ERR_FORMAT, blob, ": the header checksum does not match (stored '", stored_crc->second,
         "', computed '", computed, "'): the header was corrupted or edited");

  const auto version = st.metadata.find(kKeyVersion);
  if (version == st.metadata.end())
    fail(SA_ERR_FORMAT, blob, ": __metadata__ has no \"format_version\"");
  const bool numeric = !version->second.empty() && version->second.size() < 10 &&
                       version->second.find_first_not_of("0123456789") == std::string::npos;
  const int version_number = numeric ? std::stoi(version->second) : -1;
  if (version_number < kOldestShardFormatVersion || version_number > kShardFormatVersion ||
      version->second != std::to_string(version_number)) {
    const bool newer = version_number > kShardFormatVersion;
    fail(newer ? SA_ERR_UNSUPPORTED : SA_ERR_FORMAT, blob, ": shard file format version '",
         version->second, "'; this library (shardadam ", SA_VERSION_MAJOR, ".", SA_VERSION_MINOR,
         ".", SA_VERSION_PATCH, ") reads versions ", kOldestShardFormatVersion, " to ",
         kShardFormatVersion, newer ? " (the file is from a newer shardadam)" : "");
  }

  const FieldReader in(blob);
  ShardHeader h;
  h.data_section = st.data_section;
  const json checksum = in.parse(st.metadata, kKeyChecksum);
  const json& algorithm = in.member(checksum, "algorithm", "checksum");
  if (algorithm != "crc32c")
    fail(SA_ERR_FORMAT, blob, ": checksum.algorithm is ", algorithm.dump(),
         "; shardadam uses \"crc32c\"");
  h.block_bytes =
      static_cast<uint64_t>(in.integer(checksum, "block_bytes", "checksum", 64, int64_t{1} << 30));
  if (h.block_bytes % 8 != 0)
    fail(SA_ERR_FORMAT, blob, ": checksum.block_bytes ", h.block_bytes, " is not a multiple of 8");
  h.groups = parse_groups(in.parse(st.metadata, kKeyGroups), version_number, in);
  h.meshes = parse_meshes(in.parse(st.metadata, kKeyWriter), in, h.library);

  const json tensors = in.parse(st.metadata, kKeyTensors);
  if (!tensors.is_object())
    fail(SA_ERR_FORMAT, blob, ": __metadata__ \"tensors\" is not an object");
  if (tensors.size() != st.tensors.size())
    fail(SA_ERR_FORMAT, blob, ": __metadata__ \"tensors\" describes ", tensors.size(),
         " tensors but the header holds ", st.tensors.size());
  for (const SafetensorsTensor& t : st.tensors)
    h.tensors.push_back(parse_saved_tensor(t, tensors, h.block_bytes, in));
  link_block_scales(h, in);
  h.version = version_number;
  if (h.version >= 2)
    h.param_steps = parse_param_steps(in.parse(st.metadata, kKeyParams), h.tensors, in);
  return h;
}

ShardHeader read_shard_header(const BlobReader& reader) {
  unsigned char prefix[8];
  if (reader.size() < 8)
    fail(SA_ERR_FORMAT, reader.name(), ": the blob has ", reader.size(),
         " bytes, fewer than a safetensors header length field (empty or not a shard file)");
  reader.read(0, prefix, sizeof prefix, "the header length");
  const uint64_t n = parse_header_length(prefix, reader.size(), reader.name());
  std::string text(n, '\0');
  reader.read(8, text.data(), n, "the header");
  return parse_shard_header(text, reader.size(), reader.name());
}

}  // namespace sa
