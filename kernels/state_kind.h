// kernels/state_kind.h — the kinds of optimizer state a param can have, as the kernels
// index them (TensorSlot::state). The core's table of their keys, storages and docs is
// src/state_kinds.hpp; the order here is its row order.
#ifndef SHARDADAM_KERNELS_STATE_KIND_H_
#define SHARDADAM_KERNELS_STATE_KIND_H_

#include <stddef.h>
#include <stdint.h>

namespace sa {

enum class StateKind : uint8_t {
  exp_avg,
  exp_avg_sq,
  max_exp_avg_sq,
  master,
  remainder,
  // One float32 per block of kQuant8Block elements: the absmax of a q8 moment's block.
  exp_avg_absmax,
  exp_avg_sq_absmax,
  max_exp_avg_sq_absmax
};
constexpr size_t kNumStateKinds = 8;

}  // namespace sa

#endif  // SHARDADAM_KERNELS_STATE_KIND_H_
