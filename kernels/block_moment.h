// kernels/block_moment.h — moments stored in blocks (is_block_storage: q8, f8e4m3). A block
// of kQuant8Block elements of the local shard keeps a float32 absmax (the states *_absmax)
// and one code per element; BlockCodec<T> says how a code stands for a value given its
// block's absmax. The CPU kernel (kernels/cpu/adam_cpu.cpp), the CUDA kernel
// (kernels/cuda/adam_block_cuda.cu) and state io (src/moment_values.cpp) use these alike,
// so every backend computes the same bits. A new block storage is a row of SA_ELEM_TYPES
// (form 1 or 2), its BlockCodec here, and its place in kernels/variants.h's kMomentTypes.
//
// Each codec has a Book (what its codes need besides the absmax: q8's code book, f8's
// nothing), per-block factors derived from the absmax once per block, per-element decode
// and encode, and keep_absmax: how a block's decoded values are written so that they
// quantize back to the same absmax (state io's file values, src/moment_values.cpp).
#ifndef SHARDADAM_KERNELS_BLOCK_MOMENT_H_
#define SHARDADAM_KERNELS_BLOCK_MOMENT_H_

#include <stdint.h>

#include "elem_type.h"
#include "quant8.h"
#include "state_kind.h"

namespace sa {
namespace kernels {

template <ElemType T>
struct BlockCodec;

// q8: bitsandbytes' 8-bit dynamic quantization (kernels/quant8.h).
template <>
struct BlockCodec<ElemType::q8> {
  using Book = Quant8Book;
  static SA_HD float decode_factor(float absmax) { return absmax; }
  static SA_HD float encode_factor(float absmax) { return quant8_inverse(absmax); }
  static SA_HD float decode(const Book& book, uint8_t code, float factor) {
    return quant8_decode(book.map, code, factor);
  }
  static SA_HD uint8_t encode(const Book& book, float x, float factor) {
    return quant8_code(book.buckets, book.mids, quant8_scaled(x, factor));
  }
  // The signed map holds +1 but not -1 (bitsandbytes' dynamic map): in a block of a signed
  // moment with no code 255, the first element of code 0 (the map's lowest entry, which
  // decodes to less than the absmax) is where the absmax came from; it reads as -absmax.
  // (+1, code 255, decodes to the absmax exactly.)
  static void keep_absmax(const uint8_t* c, int64_t n, float absmax, bool is_signed, float* x) {
    if (!is_signed) return;
    int64_t lowest = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (c[i] == 255) return;
      if (c[i] == 0 && lowest < 0) lowest = i;
    }
    if (lowest >= 0) x[lowest] = -absmax;
  }
};

// f8e4m3: torchao's AdamWFp8 scheme. scale = max(absmax, 1e-12) / 448 (448: e4m3fn's
// largest value), code = e4m3fn(x / scale), value = e4m3fn value * scale. A NaN absmax
// makes the scale NaN, so a block with a NaN reads back as NaN (as q8's does).
struct NoBook {};

template <>
struct BlockCodec<ElemType::f8e4m3> {
  using Book = NoBook;
  struct EncodeFactor {
    float scale;
    float inverse;  // 1 / scale, rounded
  };
  static SA_HD float scale(float absmax) { return (absmax < 1e-12f ? 1e-12f : absmax) / 448.0f; }
  static SA_HD float decode_factor(float absmax) { return scale(absmax); }
  static SA_HD EncodeFactor encode_factor(float absmax) {
    const float s = scale(absmax);
    return {s, 1.0f / s};
  }
  static SA_HD float decode(const Book&, uint8_t code, float factor) {
    return e4m3fn_to_float(code) * factor;
  }
  // e4m3fn(x / scale), torchao's rounding. On a GPU by encode_by_inverse, which gives the
  // same codes without a division (tests/test_fp8_moments.cpp); on the host, where two
  // software conversions cost more than the division saves, by the definition.
  static SA_HD uint8_t encode(const Book&, float x, EncodeFactor f) {
#if defined(__CUDA_ARCH__)
    return encode_by_inverse(x, f);
#else
    return float_to_e4m3fn(x / f.scale);
#endif
  }
  // y = x * inverse is within 2^-23 |q| of the exact quotient q = x / scale (two roundings
  // of 2^-24), so fl(q) lies within kSlack float steps of y (at most 5 where a power of two
  // falls between them). e4m3fn rounding is monotonic in the magnitude, so where the codes
  // kSlack steps below and above |y| agree, the code of fl(q) is theirs, with y's sign
  // (q's); otherwise (y near a rounding boundary of e4m3fn, zero, infinite or NaN: a few x
  // in a million) it divides.
  static constexpr uint32_t kSlack = 8;
  static SA_HD uint8_t encode_by_inverse(float x, EncodeFactor f) {
    const uint32_t y = float_bits(x * f.inverse), m = y & 0x7FFFFFFFu;
    const uint16_t pair =
        float_to_e4m3fn_pair(bits_float(m > kSlack ? m - kSlack : 0u), bits_float(m + kSlack));
    const auto below = static_cast<uint8_t>(pair & 0xFFu), above = static_cast<uint8_t>(pair >> 8);
    if (below == above && below != 0x7Fu) return static_cast<uint8_t>(((y >> 24) & 0x80u) | below);
    return float_to_e4m3fn(x / f.scale);
  }
  // An element of the block's largest code magnitude decodes to 448 * scale, an ulp or so
  // from the absmax (or, below absmax 1e-12 where the scale is clipped, less): it reads as
  // +-absmax. (fl(fl(448 * fl(a / 448)) / 448) = fl(a / 448) for every float32 a, and every
  // code comes back through fl(c * s) / s: the other elements need nothing.)
  static void keep_absmax(const uint8_t* c, int64_t n, float absmax, bool, float* x) {
    uint8_t top = 0;
    for (int64_t i = 0; i < n; ++i) top = (c[i] & 0x7Fu) > top ? (c[i] & 0x7Fu) : top;
    for (int64_t i = 0; i < n; ++i)
      if ((c[i] & 0x7Fu) == top) x[i] = (c[i] & 0x80u) ? -absmax : absmax;
  }
};

#if !defined(__CUDACC__)
// The host Book of a moment (moment_signed(k) picks q8's map).
template <ElemType T>
inline typename BlockCodec<T>::Book block_book(bool is_signed) {
  if constexpr (T == ElemType::q8)
    return quant8_book(is_signed);
  else
    return {};
}
#endif

// One block: x[0, n) -> codes[0, n); returns its absmax (quant8_absmax).
template <ElemType T>
SA_HD float encode_block(const typename BlockCodec<T>::Book& book, const float* x, int64_t n,
                         uint8_t* codes) {
  const float absmax = quant8_absmax(x, n);
  const auto factor = BlockCodec<T>::encode_factor(absmax);
  for (int64_t i = 0; i < n; ++i) codes[i] = BlockCodec<T>::encode(book, x[i], factor);
  return absmax;
}

template <ElemType T>
SA_HD void decode_block(const typename BlockCodec<T>::Book& book, const uint8_t* codes,
                        float absmax, int64_t n, float* x) {
  const float factor = BlockCodec<T>::decode_factor(absmax);
  for (int64_t i = 0; i < n; ++i) x[i] = BlockCodec<T>::decode(book, codes[i], factor);
}

// Calls fn(ElemTag<t>{}) for a block storage t (a row of form 1 or 2) and returns true;
// returns false, calling nothing, for any other dtype.
template <class Fn>
bool visit_block_storage(ElemType t, Fn&& fn) {
  return visit_elem_rows<form_is_block>(t, fn);
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_BLOCK_MOMENT_H_
