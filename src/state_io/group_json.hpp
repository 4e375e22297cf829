// src/state_io/group_json.hpp — a saved group as JSON: the one spelling of its keys, used
// by the shard-file metadata and by the inspection report.
#ifndef SHARDADAM_SRC_STATE_IO_GROUP_JSON_HPP_
#define SHARDADAM_SRC_STATE_IO_GROUP_JSON_HPP_

#include "metadata.hpp"

namespace sa {

// Json is nlohmann::json or nlohmann::ordered_json.
template <class Json>
Json group_to_json(const SavedGroup& g) {
  const sa_group_config& c = g.config;
  return Json{{"lr", c.lr},
              {"beta1", c.beta1},
              {"beta2", c.beta2},
              {"eps", c.eps},
              {"weight_decay", c.weight_decay},
              {"decoupled_weight_decay", c.decoupled_weight_decay},
              {"bias_correction", c.bias_correction},
              {"maximize", c.maximize},
              {"amsgrad", c.amsgrad},
              {"step", g.step}};
}

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_GROUP_JSON_HPP_
