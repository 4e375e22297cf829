// kernels/step_control.h — how one step decides whether to run and by how much to scale the
// grads: from the found-inf flag and the gradient norm, both possibly reduced across ranks.
// The host (CPU backend) and the device (the CUDA fold kernel) call the same function, so
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

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_STEP_CONTROL_H_
