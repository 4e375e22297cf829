// kernels/param_cast.h — the rules of kernels/param_scaling.h's scalings: how a run of
// float32 master values becomes fp8 codes and scales, and back. The CPU kernel
// (kernels/cpu/adam_cpu.cpp) runs them after the update of every run of elements; master
// initialisation (add_param) and import run the inverse and the cast. The CUDA kernels
// (kernels/cuda/adam_fp8_cuda.cu) call the same functions: block_cast_factor and
// cast_value on a block whose amax its threads reduced with quant8_absmax's bits rule,
// dequantize_block an element at a time, so every backend casts to the same bits (the
// CPU's SIMD cast is cast_value lane by lane, tested against it).
//
// Host and device code, except visit_param_scaling and the range loops at the end (host).
#ifndef SHARDADAM_KERNELS_PARAM_CAST_H_
#define SHARDADAM_KERNELS_PARAM_CAST_H_

#include <float.h>
#include <stdint.h>

#include <type_traits>

#include "elem_type.h"
#include "param_scaling.h"
#include "quant8.h"  // quant8_absmax: the block amax (NaN-propagating, order-independent)

namespace sa {
namespace kernels {

// 2^k as a float32 for k in [-149, 127] (2^-127 and below are subnormals), exactly.
SA_HD float exp2_exact(int k) {
  return k >= -126 ? bits_float(static_cast<uint32_t>(k + 127) << 23)
                   : bits_float(1u << static_cast<uint32_t>(k + 149));
}

// MXFP8: the e8m0 code of a block's scale X = 2^(floor(log2 amax) - emax), clamped to e8m0's
// range [2^-127, 2^127] (a block of zeros, or of magnitudes below 2^(emax - 127), gets
// 2^-127); a NaN amax gives the NaN code. torchao's to_mx with ScaleCalculationMode.FLOOR.
template <ElemType P>
SA_HD uint8_t mx_scale_code(float amax) {
  const uint32_t bits = float_bits(amax);
  if (bits > 0x7F800000u) return 0xFFu;
  const int biased = static_cast<int>(bits >> 23) - Fp8Param<P>::kEmax;  // floor(log2) + 127 - emax
  return static_cast<uint8_t>(biased < 0 ? 0 : (biased > 254 ? 254 : biased));
}

// What a block's elements are multiplied by before the cast, 1 / X (exact: a power of
// two), from its e8m0 code; NaN for the NaN code.
SA_HD float mx_element_factor(uint8_t code) {
  return code == 0xFFu ? bits_float(0x7FC00000u) : exp2_exact(127 - static_cast<int>(code));
}

// block128: scale = fp8_max / amax, rounded; 1 for a block of zeros; FLT_MAX where the
// quotient overflows (amax below fp8_max / FLT_MAX); NaN for a NaN amax.
template <ElemType P>
SA_HD float block128_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  const float s = Fp8Param<P>::kMax / amax;
  return s > FLT_MAX ? FLT_MAX : s;
}

// current scaling: the tensor's scale from its amax over all ranks, block128's rule (1 when
// amax is 0, FLT_MAX where the quotient overflows, NaN for a NaN amax), divided by 2^margin
// (exact: the quotient is a normal float, and stays one; kMaxCurrentMargin); current_pow2
// rounds it down to a power of two (clearing the mantissa: every such scale is a normal
// float), so that master * scale stays within fp8_max and 1 / scale is exact.
template <ElemType P>
SA_HD float current_scale(float amax, bool pow2, int32_t margin) {
  const float s = block128_scale<P>(amax) * exp2_exact(-margin);
  return pow2 && s == s ? bits_float(float_bits(s) & 0xFF800000u) : s;
}

// The amax a current scaling's first pass left in *amax_bits (reduced across ranks).
SA_HD float reduced_amax(const ParamScale& scale) {
  return bits_float(static_cast<uint32_t>(*scale.amax_bits));
}

// A current scaling's second pass, before its cast (host and device): scale[0] = the scale
// of the reduced amax (*scale.amax_bits), scale[1] = 1 / scale[0], and the engine's amax,
// if it asked for one, = the reduced amax.
SA_HD void write_current_scale(ElemType param_type, ParamScaling scaling, const ParamScale& scale) {
  const float amax = reduced_amax(scale);
  const bool pow2 = scaling == ParamScaling::current_pow2;
  visit_fp8_param(param_type, [&](auto p) {
    const float factor = current_scale<decltype(p)::value>(amax, pow2, scale.margin);
    static_cast<float*>(scale.scale)[0] = factor;
    static_cast<float*>(scale.scale)[1] = 1.0f / factor;
  });
  if (scale.amax != nullptr) *scale.amax = amax;
}

// ---- one block (or one per-tensor run) --------------------------------------------------

// What the elements of a block (for a per-tensor scaling: of any run) whose max |master| is
// `amax` are multiplied by before the cast: the engine's scale (delayed; amax unused), 1 / X
// (mxfp8) or scale (block128). With write_scale, a block scaling also stores the block's
// scale (the e8m0 code, or the float32 scale_inv) at index `block` of scale.scale. The one
// rule of a block's scale: cast_block below and a device kernel that reduces a block's amax
// over its threads (kernels/cuda/adam_fp8_cuda.cu) both call it.
template <ElemType P, ParamScaling kScaling>
SA_HD float block_cast_factor(float amax, const ParamScale& scale, int64_t block,
                              bool write_scale) {
  if constexpr (kScaling == ParamScaling::delayed || is_current(kScaling)) {
    // A current scaling's scale was written before the cast (write_current_scale).
    (void)amax;
    (void)block;
    (void)write_scale;
    return *static_cast<const float*>(scale.scale);
  } else if constexpr (kScaling == ParamScaling::mxfp8) {
    const uint8_t code = mx_scale_code<P>(amax);
    if (write_scale) static_cast<uint8_t*>(scale.scale)[block] = code;
    return mx_element_factor(code);
  } else {
    static_assert(kScaling == ParamScaling::block128, "a scaling of SA_PARAM_SCALINGS");
    const float factor = block128_scale<P>(amax);
    if (write_scale) static_cast<float*>(scale.scale)[block] = 1.0f / factor;
    return factor;
  }
}

// The code of one master value under its block's factor (block_cast_factor).
template <ElemType P>
SA_HD uint8_t cast_value(float master, float factor) {
  return Codec<P>::encode(master * factor);
}

// The master values param[0, n) stand for: decode(code) / scale (delayed), decode(code) *
// X (mxfp8), decode(code) * scale_inv (block128; current: the second of its two
// elements), each rounded once.
template <ElemType P, ParamScaling kScaling>
SA_HD void dequantize_block(const uint8_t* param, int64_t n, const ParamScale& scale, int64_t block,
                            float* master) {
  if constexpr (kScaling == ParamScaling::delayed) {
    const float s = *static_cast<const float*>(scale.scale);
    for (int64_t i = 0; i < n; ++i) master[i] = Codec<P>::decode(param[i]) / s;
  } else {
    const float x = kScaling == ParamScaling::mxfp8
                        ? e8m0_to_float(static_cast<const uint8_t*>(scale.scale)[block])
                    : is_current(kScaling) ? static_cast<const float*>(scale.scale)[1]
                                           : static_cast<const float*>(scale.scale)[block];
    for (int64_t i = 0; i < n; ++i) master[i] = Codec<P>::decode(param[i]) * x;
  }
}

// ---- the dispatch to compile-time dtype and scaling (host code) ---------------------------

// Calls fn(ElemTag<P>{}, std::integral_constant<ParamScaling, S>{}) for an fp8 param dtype
// (visit_fp8_param) and a scaling of SA_PARAM_SCALINGS other than none, and returns
// true; false (calling nothing) otherwise.
template <class Fn>
bool visit_param_scaling(ElemType param, ParamScaling scaling, Fn&& fn) {
  auto with_scaling = [&](auto p) {
    switch (scaling) {  // NOLINT(bugprone-branch-clone): a case per row; none returns false
#define SA_SCALING_VISIT(name, value, block, scale_type, writes, doc)    \
  case ParamScaling::name:                                               \
    if constexpr (ParamScaling::name == ParamScaling::none) {            \
      return false;                                                      \
    } else {                                                             \
      fn(p, std::integral_constant<ParamScaling, ParamScaling::name>{}); \
      return true;                                                       \
    }
      SA_PARAM_SCALINGS(SA_SCALING_VISIT)
#undef SA_SCALING_VISIT
    }
    return false;
  };
  bool visited = false;
  visit_fp8_param(param, [&](auto p) { visited = with_scaling(p); });
  return visited;
}

// ---- host loops over a run of whole blocks ----------------------------------------------

#if !defined(__CUDACC__)

// Calls fn(first, n, block) for each block of elements [begin, end) under scaling kS: the
// whole run as block 0 for a per-tensor scaling, else its blocks (the last may be short).
template <ParamScaling kS, class Fn>
void for_each_scale_block(int64_t begin, int64_t end, Fn&& fn) {
  constexpr int64_t kBlock = scaling_block(kS);
  if constexpr (kBlock == 0) {
    fn(begin, end - begin, int64_t{0});
  } else {
    for (int64_t b = begin; b < end; b += kBlock)
      fn(b, end - b < kBlock ? end - b : kBlock, b / kBlock);
  }
}

// The CPU backend's loops over a run of masters (kernels/cpu/adam_cpu.h: scalar, or
// Highway's lanes, which give the same bits):
//   cast:   codes[i] = cast_value(master[i], factor) for i in [0, n), of an fp8 param dtype;
//   absmax: quant8_absmax(master, n).
struct CastOps {
  void (*cast)(ElemType param, const float* master, int64_t n, float factor, uint8_t* codes);
  float (*absmax)(const float* master, int64_t n);
};

// The cast of elements [begin, end) of a param (begin a multiple of the scaling's block,
// end too or the shard's end): each block's factor from its amax (block_cast_factor, which
// writes a block scaling's scale), then its codes. Returns max |master| over the run
// (quant8_absmax's bits rule) where a delayed scaling's amax is asked for (scale.amax),
// else 0.
inline float cast_param_range(ElemType param_type, ParamScaling scaling, const float* master,
                              void* param, const ParamScale& scale, int64_t begin, int64_t end,
                              const CastOps& ops) {
  float amax = 0.0f;
  visit_param_scaling(param_type, scaling, [&](auto p, auto s) {
    constexpr ElemType kP = decltype(p)::value;
    constexpr ParamScaling kS = decltype(s)::value;
    if (kS == ParamScaling::delayed && scale.amax != nullptr)
      amax = ops.absmax(master + begin, end - begin);
    uint8_t* codes = static_cast<uint8_t*>(param);
    for_each_scale_block<kS>(begin, end, [&](int64_t first, int64_t n, int64_t block) {
      const float block_amax = scaling_block(kS) == 0 ? 0.0f : ops.absmax(master + first, n);
      const float factor = block_cast_factor<kP, kS>(block_amax, scale, block, true);
      ops.cast(kP, master + first, n, factor, codes + first);
    });
  });
  return amax;
}

// Max |master[begin, end)| as magnitude bits in a double (a current scaling's first pass
// for a param whose master did not change: no grad, or a recast).
inline double master_amax_bits(const float* master, int64_t begin, int64_t end,
                               const CastOps& ops) {
  return static_cast<double>(quant8_magnitude_bits(ops.absmax(master + begin, end - begin)));
}

// The master values of elements [0, n) of a param (add_param's initialisation).
inline void dequantize_param(ElemType param_type, ParamScaling scaling, const void* param,
                             const ParamScale& scale, int64_t n, float* master) {
  visit_param_scaling(param_type, scaling, [&](auto p, auto s) {
    constexpr ElemType kP = decltype(p)::value;
    constexpr ParamScaling kS = decltype(s)::value;
    const uint8_t* codes = static_cast<const uint8_t*>(param);
    for_each_scale_block<kS>(0, n, [&](int64_t first, int64_t count, int64_t block) {
      dequantize_block<kP, kS>(codes + first, count, scale, block, master + first);
    });
  });
}

#endif  // !__CUDACC__

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_PARAM_CAST_H_
