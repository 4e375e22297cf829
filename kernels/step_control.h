// kernels/step_control.h — how one step decides whether to run and by how much to scale the
// grads: from the found-inf flag and the gradient norm, both possibly reduced across ranks.
// The host (CPU backend) and the device (the CUDA fold kernel) call the same functions, so
// a clipped step scales the grads by the same float on every backend and every rank.
#ifndef SHARDADAM_KERNELS_STEP_CONTROL_H_
#define SHARDADAM_KERNELS_STEP_CONTROL_H_

#include <math.h>
#include <stdint.h>

#include "adam_math.h"

namespace sa {
namespace kernels {

enum class NormType : int32_t { none = 0, l2 = 1, inf = 2 };

// What a step reduces across ranks, as doubles:
//   [kStatNorm]     l2: the sum of squares of the counted raw grads; inf: their largest |g|
//                   (a NaN grad counts as +inf, so the max cannot lose it)
//   [kStatFoundInf] the number of ranks whose found_inf flag is set (l2, summed) or
//                   whether any is (inf, max): nonzero means skip.
// Both reduce with one op: sum for l2 (and for a found-inf-only step), max for inf.
constexpr int kStatNorm = 0;
constexpr int kStatFoundInf = 1;
constexpr int kNumStats = 2;

struct ClipSpec {
  NormType norm;
  double max_norm;  // > 0; +inf reports the norm without clipping
};

// torch.nn.utils.clip_grad_norm_'s guard against a zero norm.
constexpr double kClipEpsilon = 1e-6;

struct StepDecision {
  bool skip;
  double grad_multiplier;  // what every raw grad is multiplied by: inv_grad_scale * clip
  double norm;             // the global norm of the unscaled grads (NaN when not computed)
};

// Decides a step from the reduced stats (NULL when nothing was reduced: then only the
// local found_inf counts, as read by the caller into found_inf_local).
SA_HD StepDecision decide_step(const ClipSpec& spec, const double* stats, bool found_inf_local,
                               float inv_grad_scale) {
  StepDecision d;
  d.grad_multiplier = static_cast<double>(inv_grad_scale);
  d.norm = NAN;
  d.skip = stats != nullptr ? stats[kStatFoundInf] != 0.0 : found_inf_local;
  if (spec.norm == NormType::none || stats == nullptr) return d;
  const double raw = spec.norm == NormType::l2 ? sqrt(stats[kStatNorm]) : stats[kStatNorm];
  d.norm = raw * fabs(static_cast<double>(inv_grad_scale));
  if (!isfinite(d.norm)) {
    d.skip = true;
    return d;
  }
  const double clip = spec.max_norm / (d.norm + kClipEpsilon);
  if (clip < 1.0) d.grad_multiplier *= clip;
  return d;
}

// ---- the fold: a step's decision, coefficients and step counts ------------------------
// Every backend has a fold primitive (the CUDA fold kernel, the CPU backend's host loop)
// that reads the tables below, decides the step with fold_decide, and unless it is skipped
// advances the counts and folds each active param's coefficients. All pointers are in the
// backend's memory (host memory for the CPU backend).

// What the fold decided, where the backend keeps it: the Adam launches read `skip`, the
// Muon kernels `skip` and `grad_multiplier` (Adam's is folded into its coefficients), the
// core reads `skip` and `norm` back only when asked (sa_step_args.skipped / host_grad_norm).
struct StepVerdict {
  int32_t skip;           // nonzero: every update returns at once
  float grad_multiplier;  // StepDecision's, rounded once to float
  double norm;            // the global norm of the unscaled grads; NaN when not computed
};

// The fold's per-step inputs.
struct FoldInputs {
  const float* inv_grad_scale;  // nullable: 1
  const float* found_inf;       // nullable; read only when `stats` is NULL
  const double* stats;          // nullable: the reduced step stats (kNumStats doubles)
  ClipSpec clip;
  StepVerdict* verdict;  // written every step
  float* norm_out;       // nullable: the caller's copy of the norm
};

// The groups and params the fold reads, and the step counts it advances: the counts'
// one home (the core never keeps a second copy).
struct FoldTables {
  const AdamHyper* hyper;  // [num_groups]
  int64_t* group_steps;    // [num_groups]
  int32_t num_groups;
  const int32_t* param_group;   // [num_params]
  const uint8_t* param_active;  // [num_params]: 1 = has a grad at this step
  int64_t* param_steps;         // [num_params]
  int32_t num_params;
};

// The decision every fold starts with: from the reduced stats when there are any, else
// from this rank's found_inf flag. Does not write anything.
SA_HD StepDecision fold_decide(const FoldInputs& in) {
  const bool local_inf = in.stats == nullptr && in.found_inf != nullptr && *in.found_inf != 0.0f;
  const float inv_grad_scale = in.inv_grad_scale != nullptr ? *in.inv_grad_scale : 1.0f;
  return decide_step(in.clip, in.stats, local_inf, inv_grad_scale);
}

// The step counts an unskipped fold advances, entry by entry, so that every backend (the
// CPU backend's loop, the CUDA fold kernel's threads) advances them by this one rule: a
// group's count at every unskipped step; an active param's (one with a grad in this step)
// to the count its coefficients are folded for, which this returns (0: the param is
// inactive and its count stays).
SA_HD void fold_group_step(const FoldTables& t, int32_t group) { ++t.group_steps[group]; }
SA_HD int64_t fold_param_step(const FoldTables& t, int32_t param) {
  return t.param_active[param] ? ++t.param_steps[param] : 0;
}

// Writes a decision where the core and the Adam launches read it.
SA_HD void fold_publish(const FoldInputs& in, const StepDecision& d) {
  in.verdict->skip = d.skip ? 1 : 0;
  in.verdict->grad_multiplier = static_cast<float>(d.grad_multiplier);
  in.verdict->norm = d.norm;
  if (in.norm_out != nullptr) *in.norm_out = static_cast<float>(d.norm);
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_STEP_CONTROL_H_
