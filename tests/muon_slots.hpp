// tests/muon_slots.hpp — the Muon kernels' arguments for tests that hold a matrix's arrays
// themselves: the Variant of a dtype combination and a slot of the arrays.
#ifndef SHARDADAM_TESTS_MUON_SLOTS_HPP_
#define SHARDADAM_TESTS_MUON_SLOTS_HPP_

#include <cstddef>

#include "kernels/variants.h"

namespace sa::test {

// The Muon Variant of these dtypes: a bfloat16 param gets a float32 master.
constexpr sa::kernels::Variant muon_variant(sa::kernels::ElemType param = sa::kernels::ElemType::f32,
                                            sa::kernels::ElemType grad = sa::kernels::ElemType::f32,
                                            sa::kernels::ElemType buf = sa::kernels::ElemType::f32) {
  return {param,
          grad,
          buf,
          param == sa::kernels::ElemType::f32 ? sa::kernels::MasterKind::none
                                              : sa::kernels::MasterKind::fp32,
          false,
          sa::kernels::ParamScaling::none,
          sa::kernels::UpdateRule::muon};
}

// A slot of a matrix's arrays (any memory the kernel reads): the param, its grad, its
// momentum_buffer and, for a bfloat16 param, its float32 master.
inline sa::kernels::TensorSlot muon_slot(void* param, const void* grad, void* buf,
                                         void* master = nullptr) {
  sa::kernels::TensorSlot slot{};
  slot.param = param;
  slot.grad = grad;
  slot.state[static_cast<std::size_t>(sa::StateKind::momentum_buffer)] = buf;
  slot.state[static_cast<std::size_t>(sa::StateKind::master)] = master;
  return slot;
}

}  // namespace sa::test

#endif  // SHARDADAM_TESTS_MUON_SLOTS_HPP_
