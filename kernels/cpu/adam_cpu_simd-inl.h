// kernels/cpu/adam_cpu_simd-inl.h — the Highway element loop of adam_cpu_range, compiled
// once per SIMD target (adam_cpu.cpp includes it through hwy/foreach_target.h).
//
// The loop computes adam_update() from adam_math.h with HwyOps, whose operations are the
// lane-wise twins of the scalar path's: Mul, MulAdd (a fused multiply-add), Sqrt and Div
// are IEEE correctly rounded, and max is a compare-and-select. The loads and stores below
// implement adam_math.h's conversion rules with integer lane ops (or with instructions
// that round the same way), so every non-NaN result is bitwise equal to the scalar path.
// A target without a native fused multiply-add would emulate MulAdd as a multiply and an
// add (two roundings), so this file compiles no loop for it (#if HWY_NATIVE_FMA).

// Per-target include guard, as Highway requires of -inl.h files.
#if defined(SHARDADAM_KERNELS_CPU_ADAM_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SHARDADAM_KERNELS_CPU_ADAM_CPU_SIMD_INL_H_
#undef SHARDADAM_KERNELS_CPU_ADAM_CPU_SIMD_INL_H_
#else
#define SHARDADAM_KERNELS_CPU_ADAM_CPU_SIMD_INL_H_
#endif

#include <hwy/highway.h>
#include <stdint.h>

#include "../adam_math.h"
#include "../bucket_table.h"
#include "visit_kernel.h"

// Without F16C, Highway 1.0's float32 -> float16 demotion on x86 truncates instead of
// rounding to nearest even, which would break agreement with float_to_half.
#if defined(HWY_DISABLE_F16C)
#error "shardadam's CPU kernel needs Highway's F16C float16 conversions (HWY_DISABLE_F16C is set)"
#endif

HWY_BEFORE_NAMESPACE();
namespace sa {
namespace kernels {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

#if HWY_NATIVE_FMA

using FloatTag = hn::ScalableTag<float>;
using Vec = hn::Vec<FloatTag>;

// The V of adam_update<..., HwyOps>. adam_update is defined outside this per-target
// region, so GCC compiles its instantiation for the baseline ISA, where a by-value vector
// wider than 16 bytes draws a -Wpsabi note that no pragma silences. A user-provided copy
// constructor makes the class pass by reference instead; once inlined, nothing of the
// wrapper is left.
struct FloatLanes {
  Vec raw;
  FloatLanes() : raw(hn::Zero(FloatTag())) {}  // an absent moment's place (adam_update's mom)
  FloatLanes(Vec v) : raw(v) {}  // NOLINT(google-explicit-constructor): a plain wrapper
  FloatLanes(const FloatLanes& other) : raw(other.raw) {}
  FloatLanes& operator=(const FloatLanes& other) {
    raw = other.raw;
    return *this;
  }
};

// The arithmetic adam_update() uses, lane-wise; member for member the ScalarOps of
// adam_cpu.cpp. max is a compare-and-select, like the scalar `a > b ? a : b`, so a NaN
// operand picks the same side.
struct HwyOps {
  FloatLanes mul(const FloatLanes& a, const FloatLanes& b) const { return hn::Mul(a.raw, b.raw); }
  FloatLanes fma(const FloatLanes& a, const FloatLanes& b, const FloatLanes& c) const {
    return hn::MulAdd(a.raw, b.raw, c.raw);
  }
  FloatLanes sqrt(const FloatLanes& a) const { return hn::Sqrt(a.raw); }
  FloatLanes div(const FloatLanes& a, const FloatLanes& b) const { return hn::Div(a.raw, b.raw); }
  FloatLanes max(const FloatLanes& a, const FloatLanes& b) const {
    return hn::IfThenElse(hn::Gt(a.raw, b.raw), a.raw, b.raw);
  }
};

// ---- lane-wise twins of adam_math.h's conversions ---------------------------------------

using U32Tag = hn::RebindToUnsigned<FloatTag>;
using U16Tag = hn::Rebind<uint16_t, FloatTag>;  // as many lanes as FloatTag, half as wide
using I16Tag = hn::Rebind<int16_t, FloatTag>;
using F16Tag = hn::Rebind<hwy::float16_t, FloatTag>;

HWY_INLINE hn::Vec<U32Tag> WidenBits(const uint16_t* p) {
  return hn::PromoteTo(U32Tag(), hn::LoadU(U16Tag(), p));
}

// float_to_bf16 on 32-bit lanes: round to nearest even, a NaN stays a quiet NaN. The
// result is in the low 16 bits of each lane.
HWY_INLINE hn::Vec<U32Tag> RoundToBf16Bits(Vec f) {
  const U32Tag du;
  const auto x = hn::BitCast(du, f);
  const auto upper = hn::ShiftRight<16>(x);
  const auto rounded = hn::ShiftRight<16>(
      hn::Add(x, hn::Add(hn::Set(du, 0x7FFFu), hn::And(upper, hn::Set(du, 1u)))));
  const auto quiet_nan = hn::Or(upper, hn::Set(du, 0x0040u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(f)), quiet_nan, rounded);
}

template <ElemType T>
HWY_INLINE Vec LoadLanes(const StorageOf<T>* p) {
  const FloatTag df;
  if constexpr (T == ElemType::f32) {
    return hn::LoadU(df, p);
  } else if constexpr (T == ElemType::bf16) {
    return hn::BitCast(df, hn::ShiftLeft<16>(WidenBits(p)));  // bf16_to_float: exact
  } else if constexpr (T == ElemType::f16) {
    // half_to_float: exact (F16C / NEON / SVE convert every half, subnormals included).
    return hn::PromoteTo(df, hn::BitCast(F16Tag(), hn::LoadU(U16Tag(), p)));
  } else {  // a dtype without a lane-wise load: its Codec, one lane at a time
    HWY_ALIGN float lanes[hn::MaxLanes(df)];
    for (size_t k = 0; k < hn::Lanes(df); ++k) lanes[k] = Codec<T>::decode(p[k]);
    return hn::Load(df, lanes);
  }
}

template <ElemType T>
HWY_INLINE void StoreLanes(Vec f, StorageOf<T>* p) {
  if constexpr (T == ElemType::f32) {
    hn::StoreU(f, FloatTag(), p);
  } else if constexpr (T == ElemType::bf16) {
    hn::StoreU(hn::TruncateTo(U16Tag(), RoundToBf16Bits(f)), U16Tag(), p);
  } else if constexpr (T == ElemType::f16) {
    // float_to_half: the conversion instructions round to nearest even (the rounding mode
    // is encoded in the instruction on x86, not read from MXCSR), overflow to infinity and
    // quiet a NaN keeping its top payload bits, which is float_to_half's rule.
    hn::StoreU(hn::BitCast(U16Tag(), hn::DemoteTo(F16Tag(), f)), U16Tag(), p);
  } else {  // a dtype without a lane-wise store: its Codec, one lane at a time
    const FloatTag df;
    HWY_ALIGN float lanes[hn::MaxLanes(df)];
    hn::Store(f, df, lanes);
    for (size_t k = 0; k < hn::Lanes(df); ++k) p[k] = Codec<T>::encode(lanes[k]);
  }
}

// join_remainder: (hi << 16) + rem, with rem sign-extended.
HWY_INLINE Vec JoinRemainder(const uint16_t* hi, const int16_t* rem) {
  const U32Tag du;
  const auto rem32 =
      hn::BitCast(du, hn::PromoteTo(hn::RebindToSigned<FloatTag>(), hn::LoadU(I16Tag(), rem)));
  return hn::BitCast(FloatTag(), hn::Add(hn::ShiftLeft<16>(WidenBits(hi)), rem32));
}

// split_remainder: hi = the bits rounded to a multiple of 2^16 (ties away from zero),
// rem = the difference; a NaN keeps a quiet NaN in hi and stores rem = 0.
HWY_INLINE void SplitRemainder(Vec f, uint16_t* hi, int16_t* rem) {
  const U32Tag du;
  const auto x = hn::BitCast(du, f);
  const auto is_nan = hn::RebindMask(du, hn::IsNaN(f));
  const auto h = hn::ShiftRight<16>(hn::Add(x, hn::Set(du, 0x8000u)));
  const auto r = hn::Sub(x, hn::ShiftLeft<16>(h));  // fits an int16 (two's complement)
  const auto quiet_nan = hn::Or(hn::ShiftRight<16>(x), hn::Set(du, 0x0040u));
  hn::StoreU(hn::TruncateTo(U16Tag(), hn::IfThenElse(is_nan, quiet_nan, h)), U16Tag(), hi);
  hn::StoreU(hn::BitCast(I16Tag(), hn::TruncateTo(U16Tag(), hn::IfThenZeroElse(is_nan, r))),
             I16Tag(), rem);
}

// ---- the loop ---------------------------------------------------------------------------

template <class S>
HWY_INLINE Vec LoadParamValue(const TypedSlot<S>& s, int64_t i) {
  if constexpr (S::kMaster == MasterKind::none) {
    return LoadLanes<S::kParam>(s.param + i);
  } else if constexpr (S::kMaster == MasterKind::fp32) {
    return hn::LoadU(FloatTag(), s.master + i);
  } else {
    return JoinRemainder(s.param + i, s.master + i);
  }
}

template <class S>
HWY_INLINE void StoreParamValue(const TypedSlot<S>& s, int64_t i, Vec p) {
  if constexpr (S::kMaster == MasterKind::none) {
    StoreLanes<S::kParam>(p, s.param + i);
  } else if constexpr (S::kMaster == MasterKind::fp32) {
    hn::StoreU(p, FloatTag(), s.master + i);
    StoreLanes<S::kParam>(p, s.param + i);
  } else {
    SplitRemainder(p, s.param + i, s.master + i);
  }
}

// Where the loop below reads and writes the moments: the slot's arrays, in the moment
// dtype. (A block moment's codes are another place: adam_cpu.cpp's CodedMoments.)
template <class S>
struct SlotMoments {
  const TypedSlot<S>& s;
  HWY_INLINE Vec Load(int k, int64_t i) const { return LoadLanes<S::kMoment>(s.moment[k] + i); }
  HWY_INLINE void Store(int k, int64_t i, Vec v) { StoreLanes<S::kMoment>(v, s.moment[k] + i); }
};

// Updates the whole vectors of [begin, end), the moments read and written through
// `moments`, and returns where the ragged tail (fewer than one vector of elements) begins;
// the caller runs the scalar path on it. Unaligned loads and stores throughout, so a result
// never depends on where a range starts.
// Inlined, so that a caller's local `moments` stays in registers (called through a
// reference, its pointers and accumulators were reloaded and stored at every vector).
template <class S, bool kL2, class Moments>
HWY_INLINE int64_t UpdateVectors(const TypedSlot<S>& s, const AdamCoeffs<float>& cf, int64_t begin,
                                 int64_t end, Moments& moments) {
  const FloatTag df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const AdamCoeffs<FloatLanes> c{hn::Set(df, cf.grad_scale),
                                 hn::Set(df, cf.l2_weight_decay),
                                 hn::Set(df, cf.decay_factor),
                                 hn::Set(df, cf.beta1),
                                 hn::Set(df, cf.one_minus_beta1),
                                 hn::Set(df, cf.beta2),
                                 hn::Set(df, cf.one_minus_beta2),
                                 hn::Set(df, cf.eps),
                                 hn::Set(df, cf.inv_sqrt_bias_correction2),
                                 hn::Set(df, cf.neg_step_size)};
  int64_t i = begin;
  for (; end - i >= lanes; i += lanes) {
    FloatLanes p = LoadParamValue(s, i);
    FloatLanes mom[kNumMoments];
    for_each_moment<S>([&](auto k) HWY_ATTR { mom[k] = moments.Load(k, i); });
    const FloatLanes grad = LoadLanes<S::kGrad>(s.grad + i);
    adam_update<kL2, S::kAmsgrad>(HwyOps(), c, grad, p, mom);
    StoreParamValue(s, i, p.raw);
    for_each_moment<S>([&](auto k) HWY_ATTR { moments.Store(k, i, mom[k].raw); });
  }
  return i;
}

// UpdateVectors over the slot's own moment arrays.
template <class S, bool kL2>
int64_t UpdateWholeVectors(const TensorSlot& slot, const AdamCoeffs<float>& cf, int64_t begin,
                           int64_t end) {
  const TypedSlot<S> s(slot);
  SlotMoments<S> moments{s};
  return UpdateVectors<S, kL2>(s, cf, begin, end, moments);
}

#endif  // HWY_NATIVE_FMA

}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace sa
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
