// kernels/state_kind.h — the one table of the kinds of optimizer state a param can have, as
// the kernels index them (TensorSlot::state) and as the core names them (src/state_kinds.hpp
// derives keys, storages and docs from the tables here).
//
// The moments are the states the update reads and writes per element, kept in the param's
// moment dtype: SA_MOMENTS below. Each gets a StateKind of its own key and, for a block
// storage (kernels/block_moment.h), a second one, <key>_absmax, with the float32 absmax of
// each block. Between the two runs of the moments sit the two kinds that keep a 16-bit
// param's full-precision value. A new moment is a row of SA_MOMENTS plus what the update
// does with it (kernels/adam_math.h): allocation, views, shard files, the CPU and CUDA loads
// and stores and the bindings' state keys all follow from the row.
#ifndef SHARDADAM_KERNELS_STATE_KIND_H_
#define SHARDADAM_KERNELS_STATE_KIND_H_

#include <stddef.h>
#include <stdint.h>

#include "elem_type.h"  // SA_HD

// X(key, present, is_signed, doc), in canonical order (named states, views, shard files):
//   present    a constant expression of `v`, a Variant (kernels/bucket_table.h): whether
//              params of v have this moment;
//   is_signed  whether its values may be negative (q8 codes it with the signed map);
//   doc        what it holds, for the C ABI's state tables.
#define SA_MOMENTS(X)                                               \
  X(exp_avg, v.rule == UpdateRule::adam, true, "first moment")      \
  X(exp_avg_sq, v.rule == UpdateRule::adam, false, "second moment") \
  X(max_exp_avg_sq, v.rule == UpdateRule::adam && v.amsgrad, false, \
    "running maximum of exp_avg_sq (amsgrad groups)")               \
  X(momentum_buffer, v.rule == UpdateRule::muon, true, "Muon's momentum (Muon groups)")

namespace sa {

// The index of a moment in SA_MOMENTS, which is also its place in the kernels' per-element
// arrays of moment values (adam_update's `mom`).
namespace moment {
enum Index : int {
#define SA_MOMENT_INDEX(key, present, is_signed, doc) key,
  SA_MOMENTS(SA_MOMENT_INDEX)
#undef SA_MOMENT_INDEX
};
}  // namespace moment

// Whether moment k may be negative (q8 codes it with the signed map); its length is the
// number of moments.
inline constexpr bool kMomentSigned[] = {
#define SA_MOMENT_SIGNED(key, present, is_signed, doc) is_signed,
    SA_MOMENTS(SA_MOMENT_SIGNED)
#undef SA_MOMENT_SIGNED
};
constexpr int kNumMoments = static_cast<int>(sizeof(kMomentSigned) / sizeof(kMomentSigned[0]));

// clang-format off
enum class StateKind : uint8_t {
#define SA_MOMENT_KIND(key, present, is_signed, doc) key,
  SA_MOMENTS(SA_MOMENT_KIND)
#undef SA_MOMENT_KIND
  master,     // float32 master copy of a 16-bit param (master kind fp32)
  remainder,  // int16 low half of a bfloat16 param's float32 value (master kind remainder)
  // One float32 per block of kQuant8Block elements: the absmax of a block moment's block.
#define SA_ABSMAX_KIND(key, present, is_signed, doc) key##_absmax,
  SA_MOMENTS(SA_ABSMAX_KIND)
#undef SA_ABSMAX_KIND
};
// clang-format on
constexpr size_t kNumStateKinds = 2 * kNumMoments + 2;

// The state of moment k, and the state of its block absmax.
SA_HD constexpr StateKind moment_state(int k) { return static_cast<StateKind>(k); }
SA_HD constexpr StateKind moment_absmax_state(int k) {
  return static_cast<StateKind>(kNumMoments + 2 + k);
}

// Whether a state is moment k's values (or its block absmax); sets *k if so.
constexpr bool is_moment_state(StateKind kind, int* k) {
  *k = static_cast<int>(kind);
  return *k < kNumMoments;
}
constexpr bool is_absmax_state(StateKind kind, int* k) {
  *k = static_cast<int>(kind) - (kNumMoments + 2);
  return *k >= 0 && *k < kNumMoments;
}

// kMomentSigned[k], in host and device code.
SA_HD constexpr bool moment_signed(int k) {
  // NOLINTBEGIN(bugprone-branch-clone): a case per moment; two may give the same answer
  switch (k) {
#define SA_MOMENT_SIGNED_CASE(key, present, is_signed, doc) \
  case moment::key:                                         \
    return is_signed;
    SA_MOMENTS(SA_MOMENT_SIGNED_CASE)
#undef SA_MOMENT_SIGNED_CASE
  }
  // NOLINTEND(bugprone-branch-clone)
  return false;
}

static_assert(moment_state(moment::exp_avg) == StateKind::exp_avg &&
                  moment_absmax_state(0) == StateKind::exp_avg_absmax &&
                  static_cast<size_t>(moment_absmax_state(kNumMoments - 1)) + 1 == kNumStateKinds,
              "StateKind: the moments, master and remainder, then the moments' absmax states");

}  // namespace sa

#endif  // SHARDADAM_KERNELS_STATE_KIND_H_
