// kernels/elem_type.h — the one table of the storage dtypes: for each, how an element is
// stored, its DLPack code, its names, and (for an element storage) the conversion of one
// element to and from float. Everything that maps or converts a dtype derives from it:
// the core's dtype table (src/dtype.cpp: DLPack dtypes, names, safetensors names, sizes,
// the C ABI's sa_dtype_info that the bindings read), the kernels' loads and stores, the
// widening of a param and the grad norm on both backends (visit_elem_type), and the
// conversions of moments in state io.
//
// A new element dtype is a row of SA_ELEM_TYPES, its Codec below, and its place in
// kernels/variants.h's tables (which params, grads and moments may use it). A new fp8 param
// dtype is instead a row of SA_ELEM_TYPES, its Codec and its saturating cast's Encoding
// below, and a row of SA_FP8_PARAM_TYPES: its param forms (one per scaling), the scalings'
// rules and both backends' casts follow from that row. A moment of a block dtype (form 1
// or 2) also needs a BlockCodec (kernels/block_moment.h). Faster loads
// (kernels/cpu/adam_cpu_simd-inl.h's LoadLanes, kernels/cuda/storage.cuh) are optional:
// without them a kernel converts the dtype an element at a time, with the same Codec.
//
// Host and device code; no DLPack dependency (codes are dlpack.h's DLDataTypeCode values,
// checked against it in src/dtype.cpp).
#ifndef SHARDADAM_KERNELS_ELEM_TYPE_H_
#define SHARDADAM_KERNELS_ELEM_TYPE_H_

#include <stdint.h>
#include <string.h>

#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

#ifndef SA_HD
#if defined(__CUDACC__)
#define SA_HD __host__ __device__ __forceinline__
#else
#define SA_HD inline __attribute__((always_inline))
#endif
#endif

namespace sa {
namespace kernels {

// X(name, storage C type, DLPack type code, bits, printable name, safetensors name or
//   nullptr when shard files never hold it, form (below), doc)
//
// form 0: an element dtype (a Codec converts each element; a moment of it is stored
//         element by element);
// form 1: codes of a block storage, no Codec (q8: indices into a code book);
// form 2: an element dtype whose moments are stored in blocks: each element scaled by its
//         block's absmax, then converted by the Codec (f8e4m3).
// A moment of form 1 or 2 keeps a float32 absmax per block of kQuant8Block elements (the
// states *_absmax) and is updated a block at a time (kernels/block_moment.h).
#define SA_ELEM_TYPES(X)                                                                  \
  X(f32, float, 2 /* kDLFloat */, 32, "float32", "F32", 0, "IEEE binary32")               \
  X(bf16, uint16_t, 4 /* kDLBfloat */, 16, "bfloat16", "BF16", 0,                         \
    "bfloat16: the high half of a float32 (round to nearest even)")                       \
  X(f16, uint16_t, 2 /* kDLFloat */, 16, "float16", "F16", 0, "IEEE binary16")            \
  X(q8, uint8_t, 1 /* kDLUInt */, 8, "uint8", "U8", 1,                                    \
    "8-bit blockwise dynamic quantization (moments only): a code per element, a float32 " \
    "absmax per block of 256 (shard files hold both)")                                    \
  X(f8e4m3, uint8_t, 10 /* kDLFloat8_e4m3fn */, 8, "float8_e4m3fn", "F8_E4M3", 2,         \
    "float8 e4m3fn (no infinities; saturating round to nearest even). As moments: "       \
    "each element divided by its block's scale (a float32 absmax per 256 elements, "      \
    "scale = max(absmax, 1e-12) / 448, torchao's AdamWFp8; shard files hold both)")       \
  X(f8e5m2, uint8_t, 12 /* kDLFloat8_e5m2 */, 8, "float8_e5m2", nullptr, 0,               \
    "float8 e5m2 (params only; saturating round to nearest even: a magnitude beyond "     \
    "57344, infinities included, becomes 57344)")                                         \
  X(e8m0, uint8_t, 14 /* kDLFloat8_e8m0fnu */, 8, "float8_e8m0fnu", nullptr, 0,           \
    "float8 e8m0fnu: a power of two, 2^(code - 127), 255 = NaN (the block scales of "     \
    "MXFP8 params, sa_param_scaling)")

enum class ElemType : uint8_t {
#define SA_ELEM_ENUMERATOR(name, storage, code, bits, text, st_name, form, doc) name,
  SA_ELEM_TYPES(SA_ELEM_ENUMERATOR)
#undef SA_ELEM_ENUMERATOR
};

// NOLINTNEXTLINE(bugprone-macro-parentheses): a term of the sum below
#define SA_ELEM_COUNT(name, storage, code, bits, text, st_name, form, doc) 1 +
constexpr int kNumElemTypes = SA_ELEM_TYPES(SA_ELEM_COUNT) 0;
#undef SA_ELEM_COUNT

// How one element of type T is stored (float32 as float, 16-bit types as their bits, q8
// as its code).
template <ElemType T>
struct ElemStorage;
#define SA_ELEM_STORAGE(name, storage, code, bits, text, st_name, form, doc)   \
  template <>                                                                  \
  struct ElemStorage<ElemType::name> {                                         \
    using type = storage;                                                      \
    static_assert(sizeof(storage) * 8 == (bits), "storage and bits disagree"); \
  };
SA_ELEM_TYPES(SA_ELEM_STORAGE)
#undef SA_ELEM_STORAGE

template <ElemType T>
using StorageOf = typename ElemStorage<T>::type;

// What a row's form says: whether the dtype has a per-element Codec (forms 0 and 2), and
// whether a moment of it is stored in blocks (forms 1 and 2).
constexpr bool form_has_codec(int form) { return form != 1; }
constexpr bool form_is_block(int form) { return form != 0; }

// Bytes per element of t, and whether a moment of t is stored in blocks: sums over the
// table's rows, of which one matches.
// NOLINTBEGIN(bugprone-macro-parentheses): terms of the sums below
#define SA_ELEM_BYTES(name, storage, code, bits, text, st_name, form, doc) \
  (t == ElemType::name ? (bits) / 8 : 0) +
#define SA_ELEM_BLOCK(name, storage, code, bits, text, st_name, form, doc) \
  (t == ElemType::name && form_is_block(form)) +
// NOLINTEND(bugprone-macro-parentheses)
constexpr int64_t elem_bytes(ElemType t) { return SA_ELEM_TYPES(SA_ELEM_BYTES) 0; }
constexpr bool is_block_storage(ElemType t) { return (SA_ELEM_TYPES(SA_ELEM_BLOCK) 0) != 0; }
#undef SA_ELEM_BYTES
#undef SA_ELEM_BLOCK

// ---- scalar conversions -----------------------------------------------------------------
// Bit-level and portable, so host and device round identically. SIMD code implements
// the same rules lane-wise and is tested against these.

SA_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

SA_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

SA_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest, ties to even; NaN stays a (quiet) NaN.
SA_HD uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

SA_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_float(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);  // signed zero
  // Subnormal half: normalize into a float32 normal.
  uint32_t e = 113u;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return bits_float(sign | (e << 23) | ((mant & 0x3FFu) << 13));
}

// Round to nearest, ties to even, overflow to infinity; NaN stays a (quiet) NaN.
SA_HD uint16_t float_to_half(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (ax >= 0x38800000u) {                                              // normal half
    const uint32_t r = ax - 0x38000000u;                                // rebias exponent
    return static_cast<uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (ax < 0x33000000u) return sign;  // below half the smallest subnormal: zero
  // Subnormal half: the value in units of 2^-24 is mant >> shift, rounded to even.
  const uint32_t e = ax >> 23;
  const uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t q = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

// float8 e4m3fn (OCP FP8: 4 exponent bits of bias 7, 3 mantissa bits, no infinities, NaN
// = S.1111.111, largest 448, subnormals down to 2^-9). Exact. The portable definition,
// which the host runs; devices of compute capability 8.9 and later convert in hardware
// (e4m3fn_to_float below), with the same result for every code (tests/gpu checks all 256).
SA_HD float e4m3fn_to_float_portable(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xFu;
  const uint32_t mant = b & 0x7u;
  if (exp == 0xFu && mant == 0x7u) return bits_float(sign | 0x7FC00000u);  // NaN
  if (exp != 0) return bits_float(sign | ((exp + 120u) << 23) | (mant << 20));
  return bits_float(sign | float_bits(static_cast<float>(mant) * 0.001953125f));  // m * 2^-9
}

SA_HD float e4m3fn_to_float(uint8_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // Every e4m3fn value is a float16 value, so code -> float16 -> float32 is exact; the NaN
  // codes take the portable NaN (the hardware's has another payload).
  const __half h = __half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3));
  return (b & 0x7Fu) == 0x7Fu ? bits_float((static_cast<uint32_t>(b & 0x80u) << 24) | 0x7FC00000u)
                              : __half2float(h);
#else
  return e4m3fn_to_float_portable(b);
#endif
}

// The saturating fp8 casts' rules as constants, for float_to_fp8 below and the CPU's SIMD
// cast (kernels/cpu/adam_cpu.cpp), which must round alike. Bits of |x| as a float32:
//   kSaturateAt: |x| at or above the midpoint past the largest finite value (or infinite)
//                gives kSaturated, the largest finite code;
//   kNormalAt:   the smallest normal; from it up the float's mantissa drops kDropBits bits,
//                rounded to nearest even, and the exponent is rebiased by kRebias;
//   below it:    |x| in units of the smallest subnormal (kSubnormalUnits of them make 1),
//                rounded to the nearest even integer, is the code.
struct E4m3Encoding {  // float8_e4m3fn: bias 7, 3 mantissa bits, largest 448
  static constexpr uint32_t kSaturateAt = 0x43E80000u;  // 464
  static constexpr uint32_t kSaturated = 0x7Eu;
  static constexpr uint32_t kNormalAt = 0x3C800000u;  // 2^-6
  static constexpr int kDropBits = 20;
  static constexpr uint32_t kRebias = 120u << 3;    // (127 - 7) << 3
  static constexpr float kSubnormalUnits = 512.0f;  // 2^9
};
struct E5m2Encoding {  // float8_e5m2: bias 15, 2 mantissa bits, largest 57344
  static constexpr uint32_t kSaturateAt = 0x47600000u;  // 57344 (an e5m2 cast never makes inf)
  static constexpr uint32_t kSaturated = 0x7Bu;
  static constexpr uint32_t kNormalAt = 0x38800000u;  // 2^-14
  static constexpr int kDropBits = 21;
  static constexpr uint32_t kRebias = 112u << 2;      // (127 - 15) << 2
  static constexpr float kSubnormalUnits = 65536.0f;  // 2^16
};

// X(name, Encoding, largest finite value, emax)
//
// The fp8 param dtypes: the one list of them. An fp8 param keeps a float32 master and is
// cast from it by each scaling of kernels/param_scaling.h (kernels/param_cast.h); a row
// gives the dtype its param forms (kernels/variants.h), the scalings' rules (Fp8Param) and
// the casts of both backends (visit_fp8_param). Encoding: the rules of its saturating
// cast, float_to_fp8<Encoding> below, which its Codec's encode must be (the CPU's SIMD
// cast runs the same rules); largest finite value: fp8_max of block128 and the current
// scalings; emax: the exponent of its largest power of two, which an MXFP8 block scale
// subtracts (OCP MX).
#define SA_FP8_PARAM_TYPES(X)        \
  X(f8e4m3, E4m3Encoding, 448.0f, 8) \
  X(f8e5m2, E5m2Encoding, 57344.0f, 15)

// An fp8 param dtype's row of SA_FP8_PARAM_TYPES as a type.
template <ElemType P>
struct Fp8Param;
#define SA_FP8_PARAM_TRAIT(name, encoding, max, emax)                                              \
  template <>                                                                                      \
  struct Fp8Param<ElemType::name> {                                                                \
    using Encoding = encoding;                                                                     \
    static constexpr float kMax = (max);                                                           \
    static constexpr int kEmax = (emax);                                                           \
    static_assert(static_cast<float>(1 << kEmax) <= kMax && kMax < static_cast<float>(2 << kEmax), \
                  "emax is not the exponent of the largest finite value's power of two");          \
  };
SA_FP8_PARAM_TYPES(SA_FP8_PARAM_TRAIT)
#undef SA_FP8_PARAM_TRAIT

// The fp8 param dtypes in the table's order (kernels/variants.h's param forms).
inline constexpr ElemType kFp8ParamTypes[] = {
#define SA_FP8_PARAM_ELEM(name, encoding, max, emax) ElemType::name,
    SA_FP8_PARAM_TYPES(SA_FP8_PARAM_ELEM)
#undef SA_FP8_PARAM_ELEM
};

// Round to nearest, ties to even, saturating by E's rules; NaN stays NaN (code 0x7F with the
// sign). Adding and taking away 2^23 rounds a float in [0, 2^23) to an integer, ties to even.
template <class E>
SA_HD uint8_t float_to_fp8(float f) {
  const uint32_t x = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);  // NaN
  if (ax >= E::kSaturateAt) return static_cast<uint8_t>(sign | E::kSaturated);
  if (ax >= E::kNormalAt) {
    const uint32_t half = (1u << (E::kDropBits - 1)) - 1u;
    const uint32_t r = (ax + half + ((ax >> E::kDropBits) & 1u)) >> E::kDropBits;
    return static_cast<uint8_t>(sign | (r - E::kRebias));
  }
  const float units = bits_float(ax) * E::kSubnormalUnits;
  const float rounded = (units + 8388608.0f) - 8388608.0f;
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(rounded));
}

// Round to nearest, ties to even; a magnitude beyond the largest (448) saturates to it,
// infinities included; NaN stays NaN.
SA_HD uint8_t float_to_e4m3fn(float f) { return float_to_fp8<E4m3Encoding>(f); }

// float_to_e4m3fn(a) in the low byte and float_to_e4m3fn(b) in the high one, except that a
// NaN may come out as the other NaN code. On devices of compute capability 8.9 and later
// this is one instruction (cvt.rn.satfinite.e4m3x2.f32: to nearest even, saturating,
// infinities included), equal to float_to_e4m3fn for every float (tests/gpu checks all 2^32).
SA_HD uint16_t float_to_e4m3fn_pair(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<uint16_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
#else
  return static_cast<uint16_t>(float_to_e4m3fn(a) | (float_to_e4m3fn(b) << 8));
#endif
}

// float8 e5m2 (OCP FP8: 5 exponent bits of bias 15, 2 mantissa bits, IEEE-like: infinities
// and NaNs at exponent 31, largest finite 57344, subnormals down to 2^-16). Exact.
SA_HD float e5m2_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 2) & 0x1Fu;
  const uint32_t mant = b & 0x3u;
  if (exp == 0x1Fu) return bits_float(sign | 0x7F800000u | (mant << 21));  // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 21));
  return bits_float(sign | float_bits(static_cast<float>(mant) * 1.52587890625e-05f));  // m * 2^-16
}

// Round to nearest, ties to even; a magnitude of 57344 or more (e5m2's largest finite
// value; infinities included) saturates to it, as float_to_e4m3fn saturates: a cast never
// makes an infinity. NaN stays NaN (code 0x7F with the sign).
SA_HD uint8_t float_to_e5m2(float f) { return float_to_fp8<E5m2Encoding>(f); }

// float8 e8m0fnu (the OCP MX scale): 2^(code - 127); code 255 is NaN, there is no zero.
SA_HD float e8m0_to_float(uint8_t b) {
  if (b == 0xFFu) return bits_float(0x7FC00000u);
  if (b == 0) return bits_float(0x00400000u);  // 2^-127, a float32 subnormal
  return bits_float(static_cast<uint32_t>(b) << 23);
}

// The e8m0 code of 2^floor(log2 |f|), the rounding of the OCP MX scale rule: the biased
// exponent of |f| (0 for |f| below 2^-126, zero included), 254 for an infinity, 255 for NaN.
SA_HD uint8_t float_to_e8m0(float f) {
  const uint32_t ax = float_bits(f) & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return 0xFFu;
  const uint32_t exp = ax >> 23;
  return static_cast<uint8_t>(exp > 254u ? 254u : exp);
}

// ---- per-element codecs -----------------------------------------------------------------
// Codec<T>::decode(storage) -> float (exact for every dtype here) and
// Codec<T>::encode(float) -> storage (the dtype's rounding). Form-1 dtypes (q8) have none.

template <ElemType T>
struct Codec;

template <>
struct Codec<ElemType::f32> {
  static SA_HD float decode(float x) { return x; }
  static SA_HD float encode(float f) { return f; }
};

template <>
struct Codec<ElemType::bf16> {
  static SA_HD float decode(uint16_t h) { return bf16_to_float(h); }
  static SA_HD uint16_t encode(float f) { return float_to_bf16(f); }
};

template <>
struct Codec<ElemType::f16> {
  static SA_HD float decode(uint16_t h) { return half_to_float(h); }
  static SA_HD uint16_t encode(float f) { return float_to_half(f); }
};

template <>
struct Codec<ElemType::f8e4m3> {
  static SA_HD float decode(uint8_t b) { return e4m3fn_to_float(b); }
  static SA_HD uint8_t encode(float f) { return float_to_e4m3fn(f); }
};

template <>
struct Codec<ElemType::f8e5m2> {
  static SA_HD float decode(uint8_t b) { return e5m2_to_float(b); }
  static SA_HD uint8_t encode(float f) { return float_to_e5m2(f); }
};

template <>
struct Codec<ElemType::e8m0> {
  static SA_HD float decode(uint8_t b) { return e8m0_to_float(b); }
  static SA_HD uint8_t encode(float f) { return float_to_e8m0(f); }
};

// The dtype T as a type, for generic lambdas: fn(ElemTag<ElemType::bf16>{}).
template <ElemType T>
using ElemTag = std::integral_constant<ElemType, T>;

// Calls fn(ElemTag<t>{}) and returns true when the form of t's row satisfies kTake;
// returns false, calling nothing, otherwise. The one switch from a runtime dtype to its
// compile-time type; visit_elem_type and visit_block_storage (block_moment.h) are it.
template <bool (*kTake)(int form), class Fn>
bool visit_elem_rows(ElemType t, Fn&& fn) {
  // NOLINTBEGIN(bugprone-branch-clone): a case per row; the rows kTake refuses return false
  switch (t) {
#define SA_ELEM_VISIT(name, storage, code, bits, text, st_name, form, doc) \
  case ElemType::name:                                                     \
    if constexpr (kTake(form)) {                                           \
      fn(ElemTag<ElemType::name>{});                                       \
      return true;                                                         \
    } else {                                                               \
      return false;                                                        \
    }
    SA_ELEM_TYPES(SA_ELEM_VISIT)
#undef SA_ELEM_VISIT
  }
  // NOLINTEND(bugprone-branch-clone)
  return false;
}

// Calls fn(ElemTag<t>{}) for a dtype t with a Codec and returns true; returns false,
// calling nothing, for one without (q8). The dispatch from a runtime dtype to its
// compile-time loads (widening, grad norms, moment conversions).
template <class Fn>
bool visit_elem_type(ElemType t, Fn&& fn) {
  return visit_elem_rows<form_has_codec>(t, fn);
}

// Calls fn(ElemTag<t>{}) for an fp8 param dtype t (a row of SA_FP8_PARAM_TYPES) and returns
// true; returns false, calling nothing, for any other dtype. The one switch from a runtime
// param dtype to its compile-time fp8 rules (Fp8Param); host and device code, as a current
// scaling's scale is written on both.
#ifdef __CUDACC__
#pragma nv_exec_check_disable  // fn is a device lambda in device code, a host one on the host
#endif
template <class Fn>
SA_HD bool visit_fp8_param(ElemType t, Fn&& fn) {
  switch (t) {
#define SA_FP8_PARAM_VISIT(name, encoding, max, emax) \
  case ElemType::name:                                \
    fn(ElemTag<ElemType::name>{});                    \
    return true;
    SA_FP8_PARAM_TYPES(SA_FP8_PARAM_VISIT)
#undef SA_FP8_PARAM_VISIT
    default:
      return false;
  }
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_ELEM_TYPE_H_
