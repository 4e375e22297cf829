// src/plan.hpp — the launch plan: params grouped into buckets by Variant, one TensorSlot
// per non-empty shard. Built once after params change; a step only rebinds grads.
#ifndef SHARDADAM_SRC_PLAN_HPP_
#define SHARDADAM_SRC_PLAN_HPP_

#include <cstdint>
#include <vector>

#include "../kernels/bucket_table.h"

namespace sa {

struct Param;

// Where a param's state lives (sa_state_placement). It is part of a bucket's key, so a
// bucket's state is all in one memory, and the kernels never know it: host state is mapped
// into the device's address space and read and written in place.
enum class StatePlacement : uint8_t { device = 0, host = 1 };

struct Bucket {
  kernels::Variant variant;
  StatePlacement placement = StatePlacement::device;
  std::vector<kernels::TensorSlot> slots;
  std::vector<int64_t> param_of_slot;  // slot i updates param param_of_slot[i]
  int64_t numel = 0;
  bool grads_moved = false;  // a grad pointer changed since the backend saw the slots
};

struct Plan {
  std::vector<Bucket> buckets;
  std::vector<kernels::CurrentScale> current;  // every current-scaled param, in param order
};

// The slot of param `index`, as a plan holds it (its current grad included).
kernels::TensorSlot slot_of(const Param& p, int64_t index);

// Buckets in order of first appearance; empty shards get no slot (so they cost nothing
// and cannot overrun anything). Grad pointers are taken from the params as they are.
Plan build_plan(const std::vector<const Param*>& params);

// Copies every param's current grad pointer into its slot, marking the buckets where one
// moved.
void rebind_grads(Plan& plan, const std::vector<const Param*>& params);

}  // namespace sa

#endif  // SHARDADAM_SRC_PLAN_HPP_
