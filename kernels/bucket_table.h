// kernels/bucket_table.h — the plain data a kernel reads: what kind of update (Variant),
// which tensors (TensorSlot) and with which constants (GroupCoeffs). Kernels see nothing
// else of the optimizer; the core builds these tables (src/plan) and a backend walks them.
#ifndef SHARDADAM_KERNELS_BUCKET_TABLE_H_
#define SHARDADAM_KERNELS_BUCKET_TABLE_H_

#include <stdint.h>

#include "adam_math.h"
#include "elem_type.h"
#include "param_scaling.h"
#include "state_kind.h"

namespace sa {
namespace kernels {

// Elements per block of q8 storage: blocks start every kQuant8Block elements of the local
// shard (the last one may be shorter), so a backend splits a shard's work only there.
constexpr int64_t kQuant8Block = 256;

// How the full-precision param value is kept (mirrors sa_master_kind, AUTO resolved):
// in the param itself, in the state StateKind::master (float32), or split between the
// bfloat16 param and the state StateKind::remainder (int16).
enum class MasterKind : uint8_t { none = 0, fp32 = 1, remainder = 2 };

// The update a param's group asks for (sa_update_rule). Adam's is per element, and every
// pass of a step runs it a bucket at a time; Muon's orthogonalizes each whole matrix, so
// its bucket is stepped by the matrices pass (src/backend.hpp) and skipped by the others.
enum class UpdateRule : uint8_t { adam = 0, muon = 1 };

// The dtype signature of an update: params of one Variant share one bucket and one
// kernel instantiation. The Variants the kernels implement are kernels/variants.h's table.
struct Variant {
  ElemType param;
  ElemType grad;
  ElemType moment;
  MasterKind master;
  bool amsgrad;
  ParamScaling scaling;                // how an fp8 param is cast from its master (none otherwise)
  UpdateRule rule = UpdateRule::adam;  // last, so that a Variant written without it is Adam's
};

constexpr bool operator==(const Variant& a, const Variant& b) {
  return a.param == b.param && a.grad == b.grad && a.moment == b.moment && a.master == b.master &&
         a.amsgrad == b.amsgrad && a.scaling == b.scaling && a.rule == b.rule;
}
constexpr bool operator!=(const Variant& a, const Variant& b) { return !(a == b); }

// One shard in a bucket. Pointers are to the first element; element types follow the
// bucket's Variant (kernels/variants.h says which state each Variant has and how it is
// stored); a state the Variant does not have is NULL. A NULL `grad` means the param has
// no grad at this step: the step leaves the shard as it is and the norm does not count it.
struct TensorSlot {
  void* param;
  const void* grad;
  void* state[kNumStateKinds];  // by StateKind
  int64_t numel;
  int32_t param_index;  // the param's index: its step count and its coefficients of the step
  int32_t in_norm;      // 1: the gradient norm counts this shard; 0: another replica holds it
  ParamScale scale;     // an fp8 param's scale tensors (param_scaling.h); NULLs otherwise
};

// A current-scaled param (is_current), empty shards included: the second pass of a step
// writes its scale (param_cast.h's write_current_scale), which every rank's forward pass
// reads, whether or not the rank holds elements of it.
struct CurrentScale {
  ElemType param;
  ParamScaling scaling;
  ParamScale scale;
};

// The constants of one step for one param (float, as the kernels compute; params of one
// group at the same step count share the values) plus whether its group uses Adam-style
// L2 decay (selects the kL2 instantiation).
struct GroupCoeffs {
  AdamCoeffs<float> c;
  bool l2;
};

// The operations on one param's slot (its TensorSlot, the grad unused, and its Variant)
// outside a step: add_param, import, recast.
enum class SlotOp : uint8_t {
  // The master (state[master], float32) := the param's values, widened from its dtype
  // (unscaled), or what its fp8 codes stand for under its scale (kernels/param_cast.h's
  // dequantize_block): a master's initialisation.
  init_master,
  // *slot.scale.amax_bits := max |master| of a current-scaled param, its master as it is
  // (a recast's first pass).
  measure_amax,
  // Casts a scaled param from its master as a step would after updating it: param codes,
  // block scales, a delayed scaling's amax, and a current scaling's scale from its reduced
  // amax (*slot.scale.amax_bits) (import, recast).
  cast_from_master,
};

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_BUCKET_TABLE_H_
