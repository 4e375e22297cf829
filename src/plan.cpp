#include "plan.hpp"

#include "optimizer.hpp"

namespace sa {
namespace {

// The grad a step reads: NULL when the param has no grad (the kernels skip the slot).
const void* step_grad(const Param& p) { return p.binding == GradBinding::bound ? p.grad : nullptr; }

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
      plan.buckets.push_back(Bucket{variant, p.placement, {}, {}, 0, false});
      bucket = &plan.buckets.back();
    }
    bucket->slots.push_back(slot_of(p, static_cast<int64_t>(i)));
    bucket->param_of_slot.push_back(static_cast<int64_t>(i));
    bucket->numel += p.numel;
  }
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
