#include "safetensors.hpp"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>

#include "../dtype.hpp"
#include "../errors.hpp"
#include "json_error.hpp"

namespace sa {
namespace {

using nlohmann::json;

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void write_le64(uint64_t v, char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
}

// Parses with nlohmann, refusing duplicate keys in the top-level object and in the objects
// directly inside it (a later duplicate would silently replace an earlier entry).
json parse_json_strict(std::string_view text, const std::string& blob) {
  std::set<std::string> top_keys, inner_keys;
  auto refuse_duplicates = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (depth == 1) {
        if (!top_keys.insert(key).second)
          fail(SA_ERR_FORMAT, blob, ": the header names '", key, "' twice");
        inner_keys.clear();
      } else if (depth == 2 && !inner_keys.insert(key).second) {
        fail(SA_ERR_FORMAT, blob, ": the header has the key '", key, "' twice in one object");
      }
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), refuse_duplicates);
  } catch (const json::exception& e) {
    const JsonError error = describe_json_error(e);
    if (!error.has_position)
      fail(SA_ERR_FORMAT, blob, ": the header is not valid JSON: ", error.reason);
    fail(SA_ERR_FORMAT, blob, ": the header is not valid JSON at byte ", error.position,
         " of the header (byte ", 8 + error.position, " of the blob): ", error.reason);
  }
}

uint64_t unsigned_of(const json& v, const std::string& what, const std::string& blob) {
  if (!v.is_number_unsigned())
    fail(SA_ERR_FORMAT, blob, ": ", what, " is ", v.dump(), ", not an integer >= 0");
  return v.get<uint64_t>();
}

SafetensorsTensor parse_tensor(const std::string& name, const json& entry, uint64_t data_bytes,
                               const std::string& blob) {
  const std::string where = concat("tensor '", name, "'");
  if (!entry.is_object()) fail(SA_ERR_FORMAT, blob, ": ", where, " is not a JSON object");
  SafetensorsTensor t;
  t.name = name;

  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string())
    fail(SA_ERR_FORMAT, blob, ": ", where, " has no string \"dtype\"");
  t.dtype_name = dtype->get<std::string>();
  const auto dl = dtype_of_safetensors_name(t.dtype_name);
  if (!dl)
    fail(SA_ERR_FORMAT, blob, ": ", where, " has dtype '", t.dtype_name,
         "', which shard files never hold (they hold ", safetensors_names(), ")");
  t.dtype = *dl;

  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array())
    fail(SA_ERR_FORMAT, blob, ": ", where, " has no \"shape\" array");
  if (shape->size() > SA_MAX_NDIM)
    fail(SA_ERR_FORMAT, blob, ": ", where, " has ", shape->size(), " dims; at most ", SA_MAX_NDIM);
  for (const json& d : *shape) {
    const uint64_t size = unsigned_of(d, where + ": a shape entry", blob);
    if (size > static_cast<uint64_t>(INT64_MAX))
      fail(SA_ERR_FORMAT, blob, ": ", where, ": shape entry ", size, " is too large");
    t.shape.push_back(static_cast<int64_t>(size));
  }

  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2)
    fail(SA_ERR_FORMAT, blob, ": ", where, " has no \"data_offsets\" pair");
  t.begin = unsigned_of((*offsets)[0], where + ": data_offsets[0]", blob);
  t.end = unsigned_of((*offsets)[1], where + ": data_offsets[1]", blob);
  if (t.begin > t.end || t.end > data_bytes)
    fail(SA_ERR_FORMAT, blob, ": ", where, " has data_offsets [", t.begin, ", ", t.end,
         "] outside the data section of ", data_bytes, " bytes (truncated file?)");
  uint64_t bytes = 0;
  if (!shape_bytes(t.shape, dtype_size(t.dtype), bytes) || bytes != t.end - t.begin)
    fail(SA_ERR_FORMAT, blob, ": ", where, " of shape ", format_dims(t.shape), " and dtype ",
         t.dtype_name, " needs ", bytes, " bytes but its data_offsets [", t.begin, ", ", t.end,
         "] span ", t.end - t.begin);
  return t;
}

}  // namespace

bool shape_bytes(const Dims& shape, uint64_t element_size, uint64_t& bytes) {
  uint64_t n = element_size;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  bytes = n;
  return true;
}

uint64_t parse_header_length(const unsigned char prefix[8], uint64_t blob_size,
                             const std::string& blob) {
  const uint64_t n = read_le64(prefix);
  if (n < 2 || n > kMaxHeaderBytes)
    fail(SA_ERR_FORMAT, blob, ": the header length field says ", n,
         " bytes; a safetensors header has between 2 and ", kMaxHeaderBytes,
         " (not a safetensors file?)");
  if (blob_size < 8 || n > blob_size - 8)
    fail(SA_ERR_FORMAT, blob, ": the header length field says ", n, " bytes but the blob has only ",
         blob_size, " bytes (truncated, or not a safetensors file)");
  return n;
}

SafetensorsHeader parse_safetensors_header(std::string_view text, uint64_t blob_size,
                                           const std::string& blob) {
  SafetensorsHeader h;
  h.data_section = 8 + text.size();
  if (blob_size < h.data_section)
    fail(SA_ERR_FORMAT, blob, ": the header runs past the end of the blob");
  h.data_bytes = blob_size - h.data_section;
  if (text.empty() || text.front() != '{')
    fail(SA_ERR_FORMAT, blob, ": the header does not start with '{' (not a safetensors file?)");
  // nlohmann's parser takes a NUL byte for the end of the input, so "{...}\0garbage" would
  // pass; JSON has no NUL outside strings, and inside them it must be escaped.
  if (text.find('\0') != std::string_view::npos)
    fail(SA_ERR_FORMAT, blob, ": the header holds a NUL byte at offset ", 8 + text.find('\0'),
         "; a safetensors header is JSON text");
  const json root = parse_json_strict(text, blob);
  if (!root.is_object()) fail(SA_ERR_FORMAT, blob, ": the header is not a JSON object");

  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail(SA_ERR_FORMAT, blob, ": __metadata__ is not a JSON object");
      h.has_metadata = true;
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string())
          fail(SA_ERR_FORMAT, blob, ": __metadata__ value '", mkey, "' is not a string");
        h.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(key, value, h.data_bytes, blob));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Sorted by start, a non-empty range overlaps an earlier one exactly when it starts
  // before the furthest end seen so far. Empty ranges overlap nothing.
  const SafetensorsTensor* furthest = nullptr;
  for (const SafetensorsTensor& cur : h.tensors) {
    if (cur.begin == cur.end) continue;
    if (furthest != nullptr && cur.begin < furthest->end)
      fail(SA_ERR_FORMAT, blob, ": the data of tensors '", furthest->name, "' [", furthest->begin,
           ", ", furthest->end, ") and '", cur.name, "' [", cur.begin, ", ", cur.end, ") overlap");
    if (furthest == nullptr || cur.end > furthest->end) furthest = &cur;
  }
  // The safetensors package refuses bytes that no tensor covers at the end ("file not
  // fully covered"): they are no part of any file it or we write, and would be a place
  // to hide data that every check here skips.
  const uint64_t data_end = furthest == nullptr ? 0 : furthest->end;
  if (h.data_bytes > data_end)
    fail(SA_ERR_FORMAT, blob, ": ", h.data_bytes - data_end,
         " bytes after the data section (its tensors end at byte ", h.data_section + data_end,
         ", the blob at ", blob_size, "; a safetensors file ends with its last tensor's data)");
  return h;
}

std::string encode_safetensors_header(const std::map<std::string, std::string>& metadata,
                                      const std::vector<SafetensorsTensor>& tensors,
                                      std::size_t min_bytes) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  root["__metadata__"] = metadata;
  for (const SafetensorsTensor& t : tensors) {
    if (root.contains(t.name)) fail(SA_ERR_INTERNAL, "tensor '", t.name, "' is listed twice");
    root[t.name] = {
        {"dtype", t.dtype_name}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string text;
  try {
    text = root.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    fail(SA_ERR_UNSUPPORTED,
         "a param name is not valid UTF-8, which a safetensors (JSON) header "
         "cannot hold (",
         e.what(), ")");
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  if (8 + text.size() < min_bytes) text.append(min_bytes - 8 - text.size(), ' ');
  if (text.size() > kMaxHeaderBytes)
    fail(SA_ERR_UNSUPPORTED, "the shard file header would be ", text.size(),
         " bytes; safetensors readers accept at most ", kMaxHeaderBytes);
  std::string out(8, '\0');
  write_le64(text.size(), out.data());
  return out + text;
}

}  // namespace sa
