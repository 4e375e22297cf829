// kernels/cpu/adam_cpu.cpp — adam_cpu_range: the scalar element loop, and the dispatch to
// the Highway loop of adam_cpu_simd-inl.h for the whole vectors of a range.
//
// Build this file with -ffp-contract=off (adam_math.h, rule 1): the compiler must not
// fuse a multiply and an add of its own accord, or the scalar and SIMD paths (and the CUDA
// kernel) would round differently.
//
// No allocation and no locking here: the CPU backend calls adam_cpu_range from its worker
// threads on disjoint ranges.

// hwy/foreach_target.h re-includes this file once per SIMD target, by the name below.
// The quoted-include search for that name starts in hwy/, not next to this file, so the
// build must put the repository root or kernels/ on the include path.
#if __has_include("kernels/cpu/adam_cpu.cpp")
#define HWY_TARGET_INCLUDE "kernels/cpu/adam_cpu.cpp"
#elif __has_include("cpu/adam_cpu.cpp")
#define HWY_TARGET_INCLUDE "cpu/adam_cpu.cpp"
#else
#error "adam_cpu.cpp: put the repository root (or kernels/) on the include path"
#endif
#include "adam_cpu.h"

#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <stdint.h>

#include <cassert>
#include <cmath>

#include "../adam_math.h"
#include "../block_moment.h"
#include "../bucket_table.h"
#include "../param_cast.h"
#include "adam_cpu_simd-inl.h"
#include "visit_kernel.h"

// What a block moment's decode and encode read (block_moment.h), per moment: the per-target
// loop below takes them from the scalar code at the end of this file. Defined once, though
// Highway compiles this file once per target.
#ifndef SHARDADAM_KERNELS_CPU_ADAM_CPU_BLOCK_TABLES_
#define SHARDADAM_KERNELS_CPU_ADAM_CPU_BLOCK_TABLES_
namespace sa {
namespace kernels {
struct BlockTables {
  const float* values[kNumMoments];     // the value of each code, before the block's factor
  const int32_t* buckets[kNumMoments];  // q8: the bucket table widened to int32; f8: unused
  const uint32_t* mids[kNumMoments];    // q8: the midpoints; f8: unused
  const uint32_t* keys[kNumMoments];    // q8: the key table's entries (quant8.h); f8: unused
};
}  // namespace kernels
}  // namespace sa
#endif

// ---- per SIMD target --------------------------------------------------------------------

HWY_BEFORE_NAMESPACE();
namespace sa {
namespace kernels {
namespace HWY_NAMESPACE {

// Updates the whole vectors of [begin, end) and returns where the rest begins; on a
// target without a fused multiply-add it updates nothing and returns `begin`.
int64_t UpdateWholeVectorsOfVariant(const Variant& variant, const TensorSlot& slot,
                                    const GroupCoeffs& g, int64_t begin, int64_t end) {
#if HWY_NATIVE_FMA
  int64_t rest_begin = begin;
  visit_kernel(variant, g.l2, [&](auto signature, auto l2) HWY_ATTR {
    rest_begin =
        UpdateWholeVectors<decltype(signature), decltype(l2)::value>(slot, g.c, begin, end);
  });
  return rest_begin;
#else
  (void)variant;
  (void)slot;
  (void)g;
  (void)end;
  return begin;
#endif
}

const char* SimdTargetName() { return HWY_NATIVE_FMA ? hwy::TargetName(HWY_TARGET) : "scalar"; }

#if HWY_NATIVE_FMA
// codes[i] = float_to_fp8<E>(master[i] * factor) (elem_type.h) for the whole vectors of
// [0, n), lane by lane: the same IEEE product, the same integer steps on its bits (|x| is
// below 2^31 as an int32, so signed compares order it), the subnormal rounding by adding and
// taking away 2^23 in float lanes; lanes of the other cases are computed and discarded.
// kDivide: float_to_fp8<E>(master[i] / factor) instead (a float8 moment's encode, whose
// rule divides by the block's scale), the same correctly rounded quotient.
template <class E, bool kDivide = false>
int64_t CastFp8Vectors(const float* master, int64_t n, float factor, uint8_t* codes) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto scale = hn::Set(df, factor);
  const auto round_bit = hn::Set(du, 1u);
  const auto half = hn::Set(du, (1u << (E::kDropBits - 1)) - 1u);
  const auto two23 = hn::Set(df, 8388608.0f);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(df, master + i);
    const auto x = hn::BitCast(du, kDivide ? hn::Div(v, scale) : hn::Mul(v, scale));
    const auto sign = hn::And(hn::ShiftRight<24>(x), hn::Set(du, 0x80u));
    const auto ax = hn::And(x, hn::Set(du, 0x7FFFFFFFu));
    const auto sax = hn::BitCast(di, ax);
    const auto r = hn::ShiftRight<E::kDropBits>(
        hn::Add(hn::Add(ax, half), hn::And(hn::ShiftRight<E::kDropBits>(ax), round_bit)));
    const auto normal = hn::Sub(r, hn::Set(du, E::kRebias));
    const auto units = hn::Mul(hn::BitCast(df, ax), hn::Set(df, E::kSubnormalUnits));
    const auto subnormal =
        hn::BitCast(du, hn::ConvertTo(di, hn::Sub(hn::Add(units, two23), two23)));
    const auto at_least = [&](uint32_t bits) {  // Highway 1.0 has no integer Ge: > bits - 1
      return hn::RebindMask(du, hn::Gt(sax, hn::Set(di, static_cast<int32_t>(bits - 1))));
    };
    auto code = hn::IfThenElse(at_least(E::kNormalAt), normal, subnormal);
    code = hn::IfThenElse(at_least(E::kSaturateAt), hn::Set(du, E::kSaturated), code);
    code = hn::IfThenElse(at_least(0x7F800001u), hn::Set(du, 0x7Fu), code);  // NaN
    hn::StoreU(hn::TruncateTo(d8, hn::Or(code, sign)), d8, codes + i);
  }
  return i;
}
#endif

#if HWY_NATIVE_FMA
// The integer max of the magnitudes' bits over the whole vectors of [0, n) (quant8_absmax's
// rule: order-independent, so lanes give the loop's bits); *rest: where the rest begins.
uint32_t AbsmaxBitsVectors(const float* x, int64_t n, int64_t* rest) {
  const hn::ScalableTag<uint32_t> du;
  const auto lanes = static_cast<int64_t>(hn::Lanes(du));
  const auto magnitude = hn::Set(du, 0x7FFFFFFFu);
  auto m = hn::Zero(du);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    m = hn::Max(m, hn::And(hn::LoadU(du, reinterpret_cast<const uint32_t*>(x + i)), magnitude));
  *rest = i;
  return hn::GetLane(hn::MaxOfLanes(du, m));
}
#endif

// AbsmaxBitsVectors, or nothing on a target without a fused multiply-add (*rest = 0).
uint32_t AbsmaxBitsWholeVectors(const float* x, int64_t n, int64_t* rest) {
#if HWY_NATIVE_FMA
  return AbsmaxBitsVectors(x, n, rest);
#else
  (void)x;
  (void)n;
  *rest = 0;
  return 0;
#endif
}

#if HWY_NATIVE_FMA
// x[i] = values[codes[i]] * factor for the whole vectors of [0, n), a block moment's decode
// (quant8_decode: `values` the map; a float8 moment's: every e4m3fn value, times the scale):
// the value gathered by its code and the same float32 product, lane by lane.
int64_t DecodeCodesVectors(const float* values, const uint8_t* codes, float factor, int64_t n,
                           float* x) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto by = hn::Set(df, factor);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto index = hn::PromoteTo(di, hn::LoadU(d8, codes + i));
    hn::StoreU(hn::Mul(hn::GatherIndex(df, values, index), by), df, x + i);
  }
  return i;
}

// codes[i] = quant8_code(buckets, mids, quant8_scaled(x[i], inverse)) for the whole vectors
// of [0, n), with the bucket table widened to int32 (`buckets`) for the gather: the same
// product, clamp (compare-and-select: a NaN becomes -1), bucket arithmetic on the bits and
// midpoint compare, lane by lane.
int64_t EncodeQ8Vectors(const int32_t* buckets, const uint32_t* mids, const float* x, float inverse,
                        int64_t n, uint8_t* codes) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto factor = hn::Set(df, inverse);
  const auto one = hn::Set(df, 1.0f), minus_one = hn::Set(df, -1.0f);
  const auto low = hn::Set(du, kQuant8BucketLow);
  const auto per_sign = hn::Set(du, static_cast<uint32_t>(kQuant8BucketsPerSign));
  const auto* mid_values = reinterpret_cast<const float*>(mids);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto product = hn::Mul(hn::LoadU(df, x + i), factor);
    const auto scaled = hn::IfThenElse(
        hn::Gt(product, minus_one), hn::IfThenElse(hn::Lt(product, one), product, one), minus_one);
    const auto bits = hn::BitCast(du, scaled);
    const auto magnitude = hn::Max(hn::And(bits, hn::Set(du, 0x7FFFFFFFu)), low);
    const auto negative = hn::RebindMask(du, hn::Lt(hn::BitCast(di, bits), hn::Zero(di)));
    const auto bucket = hn::Add(hn::ShiftRight<kQuant8BucketShift>(hn::Sub(magnitude, low)),
                                hn::IfThenElseZero(negative, per_sign));
    const auto below = hn::GatherIndex(di, buckets, hn::BitCast(di, bucket));
    const auto above = hn::RebindMask(di, hn::Lt(hn::GatherIndex(df, mid_values, below), scaled));
    const auto code = hn::IfThenElse(above, hn::Add(below, hn::Set(di, 1)), below);
    hn::StoreU(hn::TruncateTo(d8, hn::BitCast(du, code)), d8, codes + i);
  }
  return i;
}

// EncodeQ8Vectors for a block whose absmax is finite, by quant8.h's key tables (`entries`:
// table quant8_keys(kSigned), filled by quant8_fill_keys): one gather per vector instead of
// the bucket's code and then its midpoint, the same code (tests/test_quant8.cpp checks the
// key tables against quant8_search across their domain, which holds every scaled value of
// such a block).
template <bool kSigned>
int64_t EncodeQ8KeyVectors(const uint32_t* entries, const float* x, float inverse, int64_t n,
                           uint8_t* codes) {
  constexpr Quant8KeyTable kKeys = quant8_keys(kSigned);
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto factor = hn::Set(df, inverse);
  const auto* table = reinterpret_cast<const int32_t*>(entries);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto scaled = hn::Mul(hn::LoadU(df, x + i), factor);
    hn::Vec<decltype(di)> key;
    if constexpr (kSigned) {  // quant8_signed_key
      const auto bits = hn::BitCast(di, scaled);
      key = hn::Xor(bits, hn::And(hn::ShiftRight<31>(bits), hn::Set(di, 0x7FFFFFFF)));
    } else {  // quant8_unsigned_key
      key = hn::BitCast(di, hn::Max(scaled, hn::Set(df, kQuant8UnsignedKeyLow)));
    }
    const auto entry = hn::GatherIndex(
        di, table, hn::Sub(hn::ShiftRight<kKeys.shift>(key), hn::Set(di, kKeys.first)));
    const auto sum = hn::Add(hn::BitCast(du, entry),
                             hn::ShiftLeft<kKeys.code_bit - kKeys.shift>(hn::BitCast(du, key)));
    hn::StoreU(hn::TruncateTo(d8, hn::ShiftRight<kKeys.code_bit>(sum)), d8, codes + i);
  }
  return i;
}

// A block's moments as UpdateVectors reads and writes them: Load decodes a vector of codes
// (DecodeCodesVectors' gather and product), Store keeps the updated float32 values for the
// encode and the integer max of their magnitudes' bits (AbsmaxBitsVectors': the block's new
// absmax). So a block is decoded, updated and measured in one pass over its elements.
struct CodedMoments {
  using D = hn::ScalableTag<float>;
  using DU = hn::RebindToUnsigned<D>;
  int64_t base = 0;                     // the block's first element
  const float* values[kNumMoments]{};   // BlockTables::values
  const uint8_t* codes[kNumMoments]{};  // the slot's codes, by element
  float* decoded[kNumMoments]{};        // the block's updated values, from `base`
  hn::Vec<D> factor[kNumMoments];       // the block's decode factor
  hn::Vec<DU> magnitude[kNumMoments];   // the max of the magnitudes' bits so far

  HWY_INLINE hn::Vec<D> Load(int k, int64_t i) const {
    const auto index =
        hn::PromoteTo(hn::RebindToSigned<D>(), hn::LoadU(hn::Rebind<uint8_t, D>(), codes[k] + i));
    return hn::Mul(hn::GatherIndex(D(), values[k], index), factor[k]);
  }
  HWY_INLINE void Store(int k, int64_t i, hn::Vec<D> v) {
    hn::StoreU(v, D(), decoded[k] + (i - base));
    magnitude[k] = hn::Max(magnitude[k], hn::And(hn::BitCast(DU(), v), hn::Set(DU(), 0x7FFFFFFFu)));
  }
};

// A block's decode factor, and the encode of moment k's updated values x[0, n) under the
// block's new absmax, for a block storage (q8 or f8e4m3). Branches taken once per block, so
// that UpdateCodedBlocks' loop is compiled once for both storages (twice, it doubled this
// file's compile time).
float DecodeFactor(ElemType storage, float absmax) {
  return storage == ElemType::q8 ? BlockCodec<ElemType::q8>::decode_factor(absmax)
                                 : BlockCodec<ElemType::f8e4m3>::decode_factor(absmax);
}

void EncodeBlock(ElemType storage, const BlockTables& tables, int k, const float* x, float absmax,
                 int64_t n, uint8_t* codes) {
  if (storage == ElemType::f8e4m3) {
    CastFp8Vectors<E4m3Encoding, true>(
        x, n, BlockCodec<ElemType::f8e4m3>::encode_factor(absmax).scale, codes);
    return;
  }
  const float inverse = BlockCodec<ElemType::q8>::encode_factor(absmax);
  if (float_bits(absmax) >= 0x7F800000u)  // a NaN or infinite block: the clamping search
    EncodeQ8Vectors(tables.buckets[k], tables.mids[k], x, inverse, n, codes);
  else if (moment_signed(k))
    EncodeQ8KeyVectors<true>(tables.keys[k], x, inverse, n, codes);
  else
    EncodeQ8KeyVectors<false>(tables.keys[k], x, inverse, n, codes);
}

// Updates the blocks of [begin, end) of a slot of block moments `storage` (F: the Signature
// of its float32 twin, whose update runs on the decoded values) a block at a time: decode,
// update and absmax in one pass (UpdateVectors with CodedMoments), then each moment's
// encode (EncodeBlock). The same operations as the block loop of adam_cpu_range_blocks, so
// the same bits. Stops at a block that is not whole vectors (only a shard's last block can
// be) and returns where it stopped.
template <class F, bool kL2>
int64_t UpdateCodedBlocks(ElemType storage, const TensorSlot& slot, const AdamCoeffs<float>& cf,
                          const BlockTables& tables, int64_t begin, int64_t end) {
  const CodedMoments::D df;
  const CodedMoments::DU du;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const TypedSlot<F> s(slot);  // its moment pointers are the codes: read through `moments`
  HWY_ALIGN float decoded[kNumMoments][kQuant8Block];
  uint8_t* codes[kNumMoments]{};
  float* absmax[kNumMoments]{};
  CodedMoments moments;
  for_each_moment<F>([&](auto k) HWY_ATTR {
    codes[k] = static_cast<uint8_t*>(slot.state[static_cast<size_t>(moment_state(k))]);
    absmax[k] = static_cast<float*>(slot.state[static_cast<size_t>(moment_absmax_state(k))]);
    moments.values[k] = tables.values[k];
    moments.codes[k] = codes[k];
    moments.decoded[k] = decoded[k];
  });
  int64_t block_begin = begin;
  for (; block_begin < end; block_begin += kQuant8Block) {
    const int64_t n = end - block_begin < kQuant8Block ? end - block_begin : kQuant8Block;
    if (n % lanes != 0) break;
    const int64_t block = block_begin / kQuant8Block;
    moments.base = block_begin;
    for_each_moment<F>([&](auto k) HWY_ATTR {
      moments.factor[k] = hn::Set(df, DecodeFactor(storage, absmax[k][block]));
      moments.magnitude[k] = hn::Zero(du);
    });
    UpdateVectors<F, kL2>(s, cf, block_begin, block_begin + n, moments);
    for_each_moment<F>([&](auto k) HWY_ATTR {
      const float a = bits_float(hn::GetLane(hn::MaxOfLanes(du, moments.magnitude[k])));
      absmax[k][block] = a;
      EncodeBlock(storage, tables, k, decoded[k], a, n, codes[k] + block_begin);
    });
  }
  return block_begin;
}
#endif

// UpdateCodedBlocks for a variant of block moments; on a target without a fused
// multiply-add it updates nothing and returns `begin`.
int64_t UpdateCodedBlocksOfVariant(const Variant& variant, const TensorSlot& slot,
                                   const GroupCoeffs& g, const BlockTables& tables, int64_t begin,
                                   int64_t end) {
#if HWY_NATIVE_FMA
  Variant inner = variant;
  inner.moment = ElemType::f32;
  int64_t done = begin;
  visit_kernel(inner, g.l2, [&](auto signature, auto l2) HWY_ATTR {
    done = UpdateCodedBlocks<decltype(signature), decltype(l2)::value>(variant.moment, slot, g.c,
                                                                       tables, begin, end);
  });
  return done;
#else
  (void)variant;
  (void)slot;
  (void)g;
  (void)tables;
  (void)end;
  return begin;
#endif
}

// CastFp8Vectors dividing by the scale (a float8 moment's encode), or nothing on a target
// without a fused multiply-add.
int64_t EncodeF8WholeVectors(const float* x, float scale, int64_t n, uint8_t* codes) {
#if HWY_NATIVE_FMA
  return CastFp8Vectors<E4m3Encoding, true>(x, n, scale, codes);
#else
  (void)x;
  (void)scale;
  (void)n;
  (void)codes;
  return 0;
#endif
}

// DecodeCodesVectors / EncodeQ8Vectors, or nothing on a target without a fused multiply-add
// (returns 0: the scalar loop does it all, as it updates).
int64_t DecodeCodesWholeVectors(const float* values, const uint8_t* codes, float factor, int64_t n,
                                float* x) {
#if HWY_NATIVE_FMA
  return DecodeCodesVectors(values, codes, factor, n, x);
#else
  (void)values;
  (void)codes;
  (void)factor;
  (void)n;
  (void)x;
  return 0;
#endif
}

int64_t EncodeQ8WholeVectors(const int32_t* buckets, const uint32_t* mids, const float* x,
                             float inverse, int64_t n, uint8_t* codes) {
#if HWY_NATIVE_FMA
  return EncodeQ8Vectors(buckets, mids, x, inverse, n, codes);
#else
  (void)buckets;
  (void)mids;
  (void)x;
  (void)inverse;
  (void)n;
  (void)codes;
  return 0;
#endif
}

// CastFp8Vectors for an fp8 param dtype; where the rest begins (begin itself on a target
// without a fused multiply-add: the scalar path then casts it all, as it updates).
int64_t CastFp8WholeVectors(ElemType type, const float* master, int64_t n, float factor,
                            uint8_t* codes) {
  int64_t rest = 0;
#if HWY_NATIVE_FMA
  visit_fp8_param(type, [&](auto p) {
    using Encoding = typename Fp8Param<decltype(p)::value>::Encoding;
    rest = CastFp8Vectors<Encoding>(master, n, factor, codes);
  });
#else
  (void)type;
  (void)master;
  (void)n;
  (void)factor;
  (void)codes;
#endif
  return rest;
}

}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace sa
HWY_AFTER_NAMESPACE();

// ---- once: the scalar path and the entry points -----------------------------------------

#if HWY_ONCE

namespace sa {
namespace kernels {
namespace {

// The arithmetic adam_update() uses, on one float. std::fma is a correctly rounded fused
// multiply-add on every CPU (glibc emulates it where the hardware has none).
struct ScalarOps {
  float mul(float a, float b) const { return a * b; }
  float fma(float a, float b, float c) const { return std::fma(a, b, c); }
  float sqrt(float a) const { return std::sqrt(a); }
  float div(float a, float b) const { return a / b; }
  float max(float a, float b) const { return a > b ? a : b; }
};

template <ElemType T>
float load_elem(const StorageOf<T>* p) {
  return Codec<T>::decode(*p);
}

template <ElemType T>
void store_elem(float f, StorageOf<T>* p) {
  *p = Codec<T>::encode(f);
}

// The full-precision value of param i, wherever it is kept.
template <class S>
float load_param_value(const TypedSlot<S>& s, int64_t i) {
  if constexpr (S::kMaster == MasterKind::none) {
    return load_elem<S::kParam>(s.param + i);
  } else if constexpr (S::kMaster == MasterKind::fp32) {
    return s.master[i];
  } else {
    return join_remainder(s.param[i], s.master[i]);
  }
}

template <class S>
void store_param_value(const TypedSlot<S>& s, int64_t i, float p) {
  if constexpr (S::kMaster == MasterKind::none) {
    store_elem<S::kParam>(p, s.param + i);
  } else if constexpr (S::kMaster == MasterKind::fp32) {
    s.master[i] = p;
    store_elem<S::kParam>(p, s.param + i);
  } else {
    split_remainder(p, s.param[i], s.master[i]);
  }
}

template <class S, bool kL2>
void update_range_scalar(const TensorSlot& slot, const AdamCoeffs<float>& c, int64_t begin,
                         int64_t end) {
  const TypedSlot<S> s(slot);
  for (int64_t i = begin; i < end; ++i) {
    float p = load_param_value(s, i);
    float mom[kNumMoments];
    for_each_moment<S>([&](auto k) { mom[k] = load_elem<S::kMoment>(s.moment[k] + i); });
    adam_update<kL2, S::kAmsgrad>(ScalarOps(), c, load_elem<S::kGrad>(s.grad + i), p, mom);
    store_param_value(s, i, p);
    for_each_moment<S>([&](auto k) { store_elem<S::kMoment>(mom[k], s.moment[k] + i); });
  }
}

HWY_EXPORT(UpdateWholeVectorsOfVariant);
HWY_EXPORT(SimdTargetName);
HWY_EXPORT(CastFp8WholeVectors);
HWY_EXPORT(AbsmaxBitsWholeVectors);
HWY_EXPORT(DecodeCodesWholeVectors);
HWY_EXPORT(EncodeQ8WholeVectors);
HWY_EXPORT(EncodeF8WholeVectors);
HWY_EXPORT(UpdateCodedBlocksOfVariant);

// The value of every float8_e4m3fn code, for DecodeCodesVectors' gather.
const float* e4m3fn_values() {
  struct Values {
    float table[256];
    Values() {
      for (int c = 0; c < 256; ++c) table[c] = e4m3fn_to_float(static_cast<uint8_t>(c));
    }
  };
  static const Values values;
  return values.table;
}

// A q8 book's bucket table widened to int32, for EncodeQ8Vectors' gather.
const int32_t* wide_buckets(bool is_signed) {
  struct Wide {
    int32_t table[2][kQuant8Buckets];
    Wide() {
      for (int s = 0; s < 2; ++s)
        for (int i = 0; i < kQuant8Buckets; ++i) table[s][i] = quant8_book(s == 1).buckets[i];
    }
  };
  static const Wide wide;
  return wide.table[is_signed ? 1 : 0];
}

// A q8 book's key table (quant8.h: quant8_keys, filled by quant8_fill_keys), for
// EncodeQ8KeyVectors' gather.
const uint32_t* key_entries(bool is_signed) {
  struct Keys {
    uint32_t unsigned_entries[quant8_keys(false).count];
    uint32_t signed_entries[quant8_keys(true).count];
    Keys() {
      int32_t mid_keys[255];
      quant8_mid_keys(quant8_map(false), false, mid_keys);
      quant8_fill_keys(quant8_keys(false), mid_keys, 0, quant8_keys(false).count, unsigned_entries);
      quant8_mid_keys(quant8_map(true), true, mid_keys);
      quant8_fill_keys(quant8_keys(true), mid_keys, 0, quant8_keys(true).count, signed_entries);
    }
  };
  static const Keys keys;
  return is_signed ? keys.signed_entries : keys.unsigned_entries;
}

}  // namespace

void decode_q8(bool is_signed, const uint8_t* codes, float absmax, int64_t n, float* x, bool simd) {
  const Quant8Book book = quant8_book(is_signed);
  const int64_t rest = simd ? HWY_DYNAMIC_DISPATCH(DecodeCodesWholeVectors)(
                                  reinterpret_cast<const float*>(book.map), codes, absmax, n, x)
                            : 0;
  decode_block<ElemType::q8>(book, codes + rest, absmax, n - rest, x + rest);
}

float encode_q8(bool is_signed, const float* x, int64_t n, uint8_t* codes, bool simd) {
  const Quant8Book book = quant8_book(is_signed);
  if (!simd) return encode_block<ElemType::q8>(book, x, n, codes);
  const float absmax = absmax_simd(x, n);
  const float inverse = BlockCodec<ElemType::q8>::encode_factor(absmax);
  const int64_t rest = HWY_DYNAMIC_DISPATCH(EncodeQ8WholeVectors)(wide_buckets(is_signed),
                                                                  book.mids, x, inverse, n, codes);
  for (int64_t i = rest; i < n; ++i)
    codes[i] = BlockCodec<ElemType::q8>::encode(book, x[i], inverse);
  return absmax;
}

void decode_f8e4m3(const uint8_t* codes, float absmax, int64_t n, float* x, bool simd) {
  using Codec = BlockCodec<ElemType::f8e4m3>;
  const float scale = Codec::decode_factor(absmax);
  const int64_t rest =
      simd ? HWY_DYNAMIC_DISPATCH(DecodeCodesWholeVectors)(e4m3fn_values(), codes, scale, n, x) : 0;
  decode_block<ElemType::f8e4m3>({}, codes + rest, absmax, n - rest, x + rest);
}

float encode_f8e4m3(const float* x, int64_t n, uint8_t* codes, bool simd) {
  using Codec = BlockCodec<ElemType::f8e4m3>;
  if (!simd) return encode_block<ElemType::f8e4m3>({}, x, n, codes);
  const float absmax = absmax_simd(x, n);
  const Codec::EncodeFactor factor = Codec::encode_factor(absmax);
  const int64_t rest = HWY_DYNAMIC_DISPATCH(EncodeF8WholeVectors)(x, factor.scale, n, codes);
  for (int64_t i = rest; i < n; ++i) codes[i] = Codec::encode({}, x[i], factor);
  return absmax;
}

namespace {

void* state_at(const TensorSlot& slot, StateKind kind) {
  return slot.state[static_cast<size_t>(kind)];
}

void*& state_at(TensorSlot& slot, StateKind kind) { return slot.state[static_cast<size_t>(kind)]; }

void* offset(void* p, int64_t elems, int64_t bytes) {
  return p == nullptr ? nullptr : static_cast<char*>(p) + elems * bytes;
}

// Block moments (kernels/block_moment.h: q8, f8e4m3), a block at a time: decode the
// block's moments into float32, run the float32 moment update over it (adam_cpu_range with
// moment f32: the same element function, SIMD included), and encode them again with the
// block's new absmax.
template <ElemType T>
void adam_cpu_range_blocks(const Variant& variant, const TensorSlot& slot, const GroupCoeffs& g,
                           int64_t begin, int64_t end, bool simd) {
  static_assert(T == ElemType::q8 || T == ElemType::f8e4m3, "a block storage without lanes");
  assert(begin % kQuant8Block == 0 && (end % kQuant8Block == 0 || end == slot.numel));
  if (simd) {
    BlockTables tables{};
    for (int k = 0; k < kNumMoments; ++k) {
      if constexpr (T == ElemType::q8) {
        const Quant8Book book = quant8_book(moment_signed(k));
        tables.values[k] = reinterpret_cast<const float*>(book.map);
        tables.buckets[k] = wide_buckets(moment_signed(k));
        tables.mids[k] = book.mids;
        tables.keys[k] = key_entries(moment_signed(k));
      } else {
        tables.values[k] = e4m3fn_values();
      }
    }
    begin = HWY_DYNAMIC_DISPATCH(UpdateCodedBlocksOfVariant)(variant, slot, g, tables, begin, end);
  }
  Variant inner = variant;
  inner.moment = ElemType::f32;
  const int64_t master_bytes = variant.master == MasterKind::remainder ? 2 : 4;
  alignas(64) float values[kNumMoments][kQuant8Block];
  for (int64_t block_begin = begin; block_begin < end; block_begin += kQuant8Block) {
    const int64_t n = end - block_begin < kQuant8Block ? end - block_begin : kQuant8Block;
    const int64_t block = block_begin / kQuant8Block;
    TensorSlot inner_slot = slot;
    inner_slot.param = offset(slot.param, block_begin, elem_bytes(variant.param));
    inner_slot.grad = offset(const_cast<void*>(slot.grad), block_begin, elem_bytes(variant.grad));
    for (StateKind k : {StateKind::master, StateKind::remainder})
      state_at(inner_slot, k) = offset(state_at(slot, k), block_begin, master_bytes);
    for (int k = 0; k < kNumMoments; ++k) {
      if (!moment_present(variant, k)) continue;
      const auto* codes =
          static_cast<const uint8_t*>(state_at(slot, moment_state(k))) + block_begin;
      const float absmax = static_cast<const float*>(state_at(slot, moment_absmax_state(k)))[block];
      if constexpr (T == ElemType::q8)
        decode_q8(moment_signed(k), codes, absmax, n, values[k], simd);
      else
        decode_f8e4m3(codes, absmax, n, values[k], simd);
      state_at(inner_slot, moment_state(k)) = values[k];
      state_at(inner_slot, moment_absmax_state(k)) = nullptr;
    }
    inner_slot.numel = n;
    adam_cpu_range(inner, inner_slot, g, 0, n, simd);
    for (int k = 0; k < kNumMoments; ++k) {
      if (!moment_present(variant, k)) continue;
      auto* codes = static_cast<uint8_t*>(state_at(slot, moment_state(k))) + block_begin;
      float& absmax = static_cast<float*>(state_at(slot, moment_absmax_state(k)))[block];
      if constexpr (T == ElemType::q8)
        absmax = encode_q8(moment_signed(k), values[k], n, codes, simd);
      else
        absmax = encode_f8e4m3(values[k], n, codes, simd);
    }
  }
}

static_assert(kCastRun % kQuant8Block == 0, "cast runs start on block boundaries");

// A scaled param: its master updated as a float32 param (the same function as an fp32
// master's update), then the param cast from it, run by run. A current scaling's cast
// waits for the tensor's amax (the second pass, cpu_backend.cpp): here its runs are only
// updated and measured.
float adam_cpu_range_scaled(const Variant& variant, const TensorSlot& slot, const GroupCoeffs& g,
                            int64_t begin, int64_t end, bool simd) {
  assert(begin % kQuant8Block == 0 && (end % kQuant8Block == 0 || end == slot.numel));
  const Variant inner = fp8_master_variant(variant);
  const TensorSlot inner_slot = fp8_master_slot(slot);
  const auto* master = static_cast<const float*>(inner_slot.param);
  uint32_t amax = 0;
  for (int64_t run = begin; run < end; run += kCastRun) {
    const int64_t run_end = end - run < kCastRun ? end : run + kCastRun;
    adam_cpu_range(inner, inner_slot, g, run, run_end, simd);
    const float run_amax =
        is_current(variant.scaling)
            ? fp8_cast_ops(simd).absmax(master + run, run_end - run)
            : cast_param_range(variant.param, variant.scaling, master, slot.param, slot.scale, run,
                               run_end, fp8_cast_ops(simd));
    amax = quant8_absmax_combine(amax, quant8_magnitude_bits(run_amax));
  }
  return bits_float(amax);
}

}  // namespace

namespace {

template <ElemType P>
void cast_run(const float* master, int64_t n, float factor, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) codes[i] = cast_value<P>(master[i], factor);
}

}  // namespace

void cast_fp8_run_scalar(ElemType type, const float* master, int64_t n, float factor,
                         uint8_t* codes) {
  visit_fp8_param(type, [&](auto p) { cast_run<decltype(p)::value>(master, n, factor, codes); });
}

void cast_fp8_run_simd(ElemType type, const float* master, int64_t n, float factor,
                       uint8_t* codes) {
  const int64_t rest = HWY_DYNAMIC_DISPATCH(CastFp8WholeVectors)(type, master, n, factor, codes);
  cast_fp8_run_scalar(type, master + rest, n - rest, factor, codes + rest);
}

float absmax_scalar(const float* master, int64_t n) { return quant8_absmax(master, n); }

float absmax_simd(const float* master, int64_t n) {
  int64_t rest = 0;
  const uint32_t bits = HWY_DYNAMIC_DISPATCH(AbsmaxBitsWholeVectors)(master, n, &rest);
  return bits_float(
      quant8_absmax_combine(bits, float_bits(quant8_absmax(master + rest, n - rest))));
}

const CastOps& fp8_cast_ops(bool simd) {
  static constexpr CastOps kScalar{cast_fp8_run_scalar, absmax_scalar};
  static constexpr CastOps kSimd{cast_fp8_run_simd, absmax_simd};
  return simd ? kSimd : kScalar;
}

float adam_cpu_range(const Variant& variant, const TensorSlot& slot, const GroupCoeffs& g,
                     int64_t begin, int64_t end, bool simd) {
  assert(0 <= begin && begin <= end && end <= slot.numel);
  if (begin >= end) return 0.0f;
  if (variant.scaling != ParamScaling::none)
    return adam_cpu_range_scaled(variant, slot, g, begin, end, simd);
  if (visit_block_storage(variant.moment, [&](auto tag) {
        adam_cpu_range_blocks<decltype(tag)::value>(variant, slot, g, begin, end, simd);
      }))
    return 0.0f;
  const int64_t rest_begin =
      simd ? HWY_DYNAMIC_DISPATCH(UpdateWholeVectorsOfVariant)(variant, slot, g, begin, end)
           : begin;
  if (rest_begin == end) return 0.0f;
  visit_kernel(variant, g.l2, [&](auto signature, auto l2) {
    update_range_scalar<decltype(signature), decltype(l2)::value>(slot, g.c, rest_begin, end);
  });
  return 0.0f;
}

const char* adam_cpu_simd_target() { return HWY_DYNAMIC_DISPATCH(SimdTargetName)(); }

}  // namespace kernels
}  // namespace sa

#endif  // HWY_ONCE
