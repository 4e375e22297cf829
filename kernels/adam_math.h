// kernels/adam_math.h — the one per-element Adam/AdamW update, and the split of a float32
// into a bfloat16 param and its int16 remainder. Every backend (CPU scalar, CPU SIMD,
// CUDA) calls adam_update() with its own arithmetic `Ops`; nothing else in shardadam
// spells the formula. The dtype conversions are kernels/elem_type.h's.
//
// Bitwise agreement across backends rests on three rules kept here:
//  1. Every multiply-add is an explicit fma (Ops::fma); there is no bare a*b+c that a
//     compiler could contract on one backend and not on another (the CPU kernels are
//     also built with -ffp-contract=off, CUDA code uses the _rn intrinsics).
//  2. The operation order below is fixed; sqrt and division are IEEE correctly rounded
//     on every backend.
//  3. All per-step constants are folded once per step by fold_coefficients (in double,
//     rounded once to float, no libm pow) and passed in, never recomputed per element.
#ifndef SHARDADAM_KERNELS_ADAM_MATH_H_
#define SHARDADAM_KERNELS_ADAM_MATH_H_

#include <math.h>
#include <stdint.h>

#include "elem_type.h"   // SA_HD, float_bits / bits_float and the dtype conversions
#include "state_kind.h"  // the moments

namespace sa {
namespace kernels {

// Per-group constants of one step, already folded (see the derivation in
// sa_group_config's comment in shardadam.h). V is float for scalar code and a vector
// type for SIMD code, which broadcasts each field once per span.
template <class V>
struct AdamCoeffs {
  V grad_scale;       // inv_grad_scale, negated when maximizing (negation is exact)
  V l2_weight_decay;  // used only by the kL2 instantiation (Adam with weight decay)
  V decay_factor;     // 1 - lr * weight_decay for AdamW, else exactly 1
  V beta1;
  V one_minus_beta1;
  V beta2;
  V one_minus_beta2;
  V eps;
  V inv_sqrt_bias_correction2;  // 1 / sqrt(1 - beta2^t)
  V neg_step_size;              // -lr / (1 - beta1^t)
};

// A group's hyperparameters as the kernels see them (the C ABI's sa_group_config,
// validated, without the fields that only shape storage).
struct AdamHyper {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  bool decoupled_weight_decay;
  bool bias_correction;
  bool maximize;
};

// base^exp by binary exponentiation. Unlike pow(), it is the same sequence of correctly
// rounded double multiplies on every host and device, so the bias corrections (and hence
// every coefficient) agree bit for bit wherever they are folded.
SA_HD double int_power(double base, int64_t exp) {
  double result = 1.0;
  while (exp > 0) {
    if (exp & 1) result *= base;
    base *= base;
    exp >>= 1;
  }
  return result;
}

// Folds a group's hyperparameters at step t (the count after this step, >= 1) into the
// float coefficients of adam_update. Computed in double and rounded once to float.
// `grad_multiplier` is what every raw grad is multiplied by (the inverse loss scale,
// times the clip coefficient when clipping). Returns whether the group uses Adam-style
// L2 decay (the kL2 instantiation).
SA_HD bool fold_coefficients(const AdamHyper& h, int64_t t, double grad_multiplier,
                             AdamCoeffs<float>& c) {
  const double bias_correction1 = h.bias_correction ? 1.0 - int_power(h.beta1, t) : 1.0;
  const double bias_correction2 = h.bias_correction ? 1.0 - int_power(h.beta2, t) : 1.0;
  const bool l2 = !h.decoupled_weight_decay && h.weight_decay != 0.0;
  c.grad_scale = static_cast<float>(h.maximize ? -grad_multiplier : grad_multiplier);
  c.l2_weight_decay = l2 ? static_cast<float>(h.weight_decay) : 0.0f;
  c.decay_factor =
      h.decoupled_weight_decay ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / sqrt(bias_correction2));
  c.neg_step_size = static_cast<float>(-h.lr / bias_correction1);
  return l2;
}

// The update of one element (or one vector of elements). p and the moments `mom` (indexed
// by kernels/state_kind.h's moment::Index) are in/out and all in float32; the caller loads
// and stores them in their storage dtypes, and only the moments the param has
// (SA_MOMENTS' `present`: max_exp_avg_sq with amsgrad) are read or written.
//   kL2:      Adam-style weight decay added to the gradient.
//   kAmsgrad: keep the running max of v and use it in the denominator.
template <bool kL2, bool kAmsgrad, class Ops, class V>
SA_HD void adam_update(const Ops& ops, const AdamCoeffs<V>& c, V grad, V& p,
                       V (&mom)[kNumMoments]) {
  V& m = mom[moment::exp_avg];
  V& v = mom[moment::exp_avg_sq];
  V g = ops.mul(grad, c.grad_scale);
  if (kL2) g = ops.fma(c.l2_weight_decay, p, g);
  p = ops.mul(p, c.decay_factor);
  m = ops.fma(c.beta1, m, ops.mul(c.one_minus_beta1, g));
  v = ops.fma(c.beta2, v, ops.mul(ops.mul(c.one_minus_beta2, g), g));
  V v_used = v;
  if (kAmsgrad) {
    V& vmax = mom[moment::max_exp_avg_sq];
    vmax = ops.max(vmax, v);
    v_used = vmax;
  }
  const V denom = ops.fma(ops.sqrt(v_used), c.inv_sqrt_bias_correction2, c.eps);
  p = ops.fma(c.neg_step_size, ops.div(m, denom), p);
}

// bfloat16 param + int16 remainder ("split fp32"): the fp32 value x is stored as
// hi = x's bits rounded to the nearest multiple of 2^16 (ties away from zero in
// magnitude) and rem = bits(x) - hi * 2^16, which always fits an int16. The param
// therefore reads as x rounded to nearest bfloat16, and hi:rem restores x exactly.
SA_HD float join_remainder(uint16_t hi, int16_t rem) {
  return bits_float((static_cast<uint32_t>(hi) << 16) +
                    static_cast<uint32_t>(static_cast<int32_t>(rem)));
}

SA_HD void split_remainder(float f, uint16_t& hi, int16_t& rem) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: keep a NaN in the param, payload is moot
    hi = static_cast<uint16_t>((x >> 16) | 0x0040u);
    rem = 0;
    return;
  }
  const uint32_t h = (x + 0x8000u) >> 16;
  hi = static_cast<uint16_t>(h);
  rem = static_cast<int16_t>(static_cast<int32_t>(x - (h << 16)));
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_ADAM_MATH_H_
