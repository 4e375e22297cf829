#include "plan.hpp"

#include <algorithm>

#include "dtype.hpp"
#include "optimizer.hpp"

namespace sa {
namespace {

// The grad a step reads: NULL when the param has no grad (the kernels skip the slot).
const void* step_grad(const Param& p) { return p.binding == GradBinding::bound ? p.grad : nullptr; }

std::size_t align_up(std::size_t n) {
  return (n + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
}

// The bytes of `kind` that elements [first, first + count) of `p` take, and where they start.
StagedRun state_run(const Param& p, StateKind kind, int64_t first, int64_t count) {
  const auto size = static_cast<std::size_t>(dtype_size(state_dtype(p, kind)));
  if (!state_kind_info(kind).per_block)
    return {kind, static_cast<std::size_t>(first) * size, 0,
            static_cast<std::size_t>(count) * size};
  const int64_t block = kernels::kQuant8Block;
  return {kind, static_cast<std::size_t>(first / block) * size, 0,
          static_cast<std::size_t>((count + block - 1) / block) * size};
}

// Cuts a host bucket's slots into ring segments: each piece a run of whole blocks of one
// slot (its last piece may end in a partial one), as many as fit the ring slot.
std::vector<StagedSegment> stage(const Bucket& bucket, const std::vector<const Param*>& params) {
  std::vector<StagedSegment> segments(1);
  const int64_t block = kernels::kQuant8Block;
  for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
    const Param& p = *params[static_cast<std::size_t>(bucket.param_of_slot[s])];
    std::vector<StateKind> kinds;
    std::size_t block_bytes = 0;  // one block's state, every kind, aligned runs aside
    for (const StateKindInfo& k : kStateKinds) {
      if (!has_state(p, k.kind)) continue;
      kinds.push_back(k.kind);
      block_bytes += state_run(p, k.kind, 0, block).bytes;
    }
    for (int64_t first = 0; first < p.numel;) {
      StagedSegment* seg = &segments.back();
      // Room for whole blocks after the runs' alignment padding.
      const std::size_t padding = kinds.size() * kStagingAlign;
      std::size_t room =
          kStagingSlotBytes > seg->bytes + padding ? kStagingSlotBytes - seg->bytes - padding : 0;
      if (room < block_bytes) {
        segments.emplace_back();
        seg = &segments.back();
        room = kStagingSlotBytes - padding;
      }
      const int64_t count =
          std::min<int64_t>(p.numel - first, static_cast<int64_t>(room / block_bytes) * block);
      StagedPiece piece{static_cast<int32_t>(s), first, count, {}};
      for (StateKind kind : kinds) {
        StagedRun run = state_run(p, kind, first, count);
        run.ring_offset = seg->bytes;
        seg->bytes += align_up(run.bytes);
        piece.runs.push_back(run);
      }
      seg->pieces.push_back(std::move(piece));
      first += count;
    }
  }
  if (segments.back().pieces.empty()) segments.pop_back();
  return segments;
}

}  // namespace

kernels::TensorSlot slot_of(const Param& p, int64_t index) {
  kernels::TensorSlot slot{p.data,
                           step_grad(p),
                           {},
                           p.numel,
                           static_cast<int32_t>(index),
                           primary_replica(p.layout) ? 1 : 0,
                           p.scale};
  for (std::size_t k = 0; k < kNumStateKinds; ++k)
    slot.state[k] = p.state.buffers[k] ? p.state.buffers[k]->data() : nullptr;
  return slot;
}

Plan build_plan(const std::vector<const Param*>& params) {
  Plan plan;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Param& p = *params[i];
    if (kernels::is_current(p.scaling)) plan.current.push_back({p.param_type, p.scaling, p.scale});
    if (p.numel == 0) continue;
    const kernels::Variant variant = variant_of(p);
    Bucket* bucket = nullptr;
    for (auto& b : plan.buckets)
      if (b.variant == variant && b.placement == p.placement) bucket = &b;
    if (bucket == nullptr) {
      plan.buckets.push_back(Bucket{variant, p.placement, {}, {}, 0, false, {}});
      bucket = &plan.buckets.back();
    }
    bucket->slots.push_back(slot_of(p, static_cast<int64_t>(i)));
    bucket->param_of_slot.push_back(static_cast<int64_t>(i));
    bucket->numel += p.numel;
  }
  for (Bucket& b : plan.buckets)
    if (b.placement == StatePlacement::host && b.variant.scaling == kernels::ParamScaling::none)
      b.segments = stage(b, params);
  return plan;
}

void rebind_grads(Plan& plan, const std::vector<const Param*>& params) {
  for (auto& bucket : plan.buckets) {
    for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
      const void* grad = step_grad(*params[bucket.param_of_slot[s]]);
      if (bucket.slots[s].grad == grad) continue;
      bucket.slots[s].grad = grad;
      bucket.grads_moved = true;
    }
  }
}

}  // namespace sa
