#include "plan.hpp"

#include "optimizer.hpp"

namespace sa {
namespace {

kernels::Variant variant_of(const Param& p) {
  return {p.param_type, p.grad_type, p.moment_type, p.master, p.amsgrad};
}

// The grad a step reads: NULL when the param has no grad (the kernels skip the slot).
const void* step_grad(const Param& p) { return p.binding == GradBinding::bound ? p.grad : nullptr; }

kernels::TensorSlot slot_of(const Param& p, int64_t index) {
  auto data_or_null = [](const std::shared_ptr<Buffer>& b) { return b ? b->data() : nullptr; };
  return {
      p.data, step_grad(p),
      // The kernels' master slot holds the fp32 master or the int16 remainder (Variant
      // says which).
      data_or_null(
          p.state[has_state(p, StateKind::remainder) ? StateKind::remainder : StateKind::master]),
      data_or_null(p.state[StateKind::exp_avg]), data_or_null(p.state[StateKind::exp_avg_sq]),
      data_or_null(p.state[StateKind::max_exp_avg_sq]), p.numel, static_cast<int32_t>(index),
      primary_replica(p.layout) ? 1 : 0};
}

}  // namespace

Plan build_plan(const std::vector<const Param*>& params) {
  Plan plan;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Param& p = *params[i];
    if (p.numel == 0) continue;
    const kernels::Variant variant = variant_of(p);
    Bucket* bucket = nullptr;
    for (auto& b : plan.buckets)
      if (b.variant == variant) bucket = &b;
    if (bucket == nullptr) {
      plan.buckets.push_back(Bucket{variant, {}, {}, 0});
      bucket = &plan.buckets.back();
    }
    bucket->slots.push_back(slot_of(p, static_cast<int64_t>(i)));
    bucket->param_of_slot.push_back(static_cast<int64_t>(i));
    bucket->numel += p.numel;
  }
  return plan;
}

void rebind_grads(Plan& plan, const std::vector<const Param*>& params) {
  for (auto& bucket : plan.buckets)
    for (std::size_t s = 0; s < bucket.slots.size(); ++s)
      bucket.slots[s].grad = step_grad(*params[bucket.param_of_slot[s]]);
}

}  // namespace sa
