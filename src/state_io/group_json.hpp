// src/state_io/group_json.hpp — a saved group as JSON: the one spelling of its keys, used
// by the shard-file metadata, by the inspection report, and by the messages that say where
// two files' groups differ.
#ifndef SHARDADAM_SRC_STATE_IO_GROUP_JSON_HPP_
#define SHARDADAM_SRC_STATE_IO_GROUP_JSON_HPP_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../errors.hpp"
#include "../schema.hpp"
#include "metadata.hpp"

namespace sa {

// Json is nlohmann::json or nlohmann::ordered_json. The keys are the schema's field names
// in its order (a flag as an integer), then "step".
template <class Json>
Json group_to_json(const SavedGroup& g) {
  Json out = Json::object();
  for (const schema::GroupField& f : schema::kGroupFields) {
    const double value = schema::get(g.config, f);
    if (schema::integral(f.rule))
      out[f.name] = static_cast<int32_t>(value);
    else
      out[f.name] = value;
  }
  out["step"] = g.step;
  return out;
}

// Where the groups of two files differ, "" where they agree: "the number of groups: 2 in
// <a>, 3 in <b>", or the first group that differs with every field that does, spelled as
// the files spell them: "group 0: lr 0.001 in <a>, 0.002 in <b>; step 3 in <a>, 4 in <b>".
// Fields compare as the JSON values they are written as (doubles by ==, so -0 equals 0).
inline std::string describe_group_difference(const std::vector<SavedGroup>& a,
                                             const std::string& a_holder,
                                             const std::vector<SavedGroup>& b,
                                             const std::string& b_holder) {
  if (a.size() != b.size())
    return concat("the number of groups: ", a.size(), " in ", a_holder, ", ", b.size(), " in ",
                  b_holder);
  using nlohmann::ordered_json;
  for (std::size_t g = 0; g < a.size(); ++g) {
    const ordered_json x = group_to_json<ordered_json>(a[g]), y = group_to_json<ordered_json>(b[g]);
    std::string fields;
    for (const auto& [key, value] : x.items())
      if (value != y.at(key))
        fields += concat(fields.empty() ? "" : "; ", key, " ", value.dump(), " in ", a_holder, ", ",
                         y.at(key).dump(), " in ", b_holder);
    if (!fields.empty()) return concat("group ", g, ": ", fields);
  }
  return "";
}

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_GROUP_JSON_HPP_
