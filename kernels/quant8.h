// kernels/quant8.h — 8-bit blockwise dynamic quantization of a moment (ElemType::q8), the
// scheme of bitsandbytes' 8-bit optimizers (Dettmers et al., "8-bit Optimizers via
// Block-wise Quantization"): a block of kQuant8Block elements keeps one float32 absmax and
// one byte per element, the index of the nearest entry of a fixed 256-entry code book
// (kernels/quant8_maps.h: signed for exp_avg, unsigned for exp_avg_sq and max_exp_avg_sq).
//
// The rule, bitsandbytes' quantize_blockwise: absmax = max |x| over the block,
// scaled = clamp(x * (1 / max(absmax, 1e-38)), -1, 1), code = the number of midpoints
// between consecutive map entries that lie below scaled (a tie goes to the lower code);
// x is restored as map[code] * absmax. A NaN in a block makes its absmax NaN, so the whole
// block reads back as NaN (nothing hides a diverged moment). Plain float operations and
// comparisons only, so every backend computes the same bits.
#ifndef SHARDADAM_KERNELS_QUANT8_H_
#define SHARDADAM_KERNELS_QUANT8_H_

#include <stdint.h>

#include "adam_math.h"
#include "bucket_table.h"
#include "quant8_maps.h"

namespace sa {
namespace kernels {

// The tables of a moment's code book (kernels/quant8_maps.h): signed for exp_avg, unsigned
// for the second moments. Host copies; the CUDA kernel copies the map to shared memory and
// encodes by key tables instead of mids and buckets (kernels/cuda/adam_block_cuda.cu).
struct Quant8Book {
  const uint32_t* map;     // [256] float32 bits, ascending
  const uint32_t* mids;    // [256] quant8_midpoint(map, j), and 2 at 255
  const uint8_t* buckets;  // [kQuant8Buckets] the code of each bucket's lowest value
};

#if !defined(__CUDACC__)
inline Quant8Book quant8_book(bool is_signed) {
  return is_signed ? Quant8Book{kQuant8SignedMap, kQuant8SignedMids, kQuant8SignedBuckets}
                   : Quant8Book{kQuant8UnsignedMap, kQuant8UnsignedMids, kQuant8UnsignedBuckets};
}
inline const uint32_t* quant8_map(bool is_signed) { return quant8_book(is_signed).map; }
#endif

SA_HD float quant8_decode(const uint32_t* map, uint8_t code, float absmax) {
  return bits_float(map[code]) * absmax;
}

// The absmax of a block, as the float32 bits of the magnitude: the largest |x|, or if a
// value is NaN the NaN with the largest payload. The integer maximum of the magnitudes'
// bits is both (a NaN's bits exceed infinity's), and it does not depend on the order the
// values are met in: a warp's shuffle tree and the CPU's loop give the same bits.
SA_HD uint32_t quant8_magnitude_bits(float x) { return float_bits(x) & 0x7FFFFFFFu; }
SA_HD uint32_t quant8_absmax_combine(uint32_t a, uint32_t b) { return a > b ? a : b; }

SA_HD float quant8_absmax(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = quant8_absmax_combine(m, quant8_magnitude_bits(x[i]));
  return bits_float(m);
}

// x / absmax as the search compares it: times the rounded inverse, clamped to [-1, 1]; a
// NaN becomes -1, whose code (0) is the one the search gives a NaN.
SA_HD float quant8_inverse(float absmax) { return 1.0f / (absmax > 1e-38f ? absmax : 1e-38f); }

SA_HD float quant8_scaled(float x, float inverse) {
  const float scaled = x * inverse;
  return scaled > -1.0f ? (scaled < 1.0f ? scaled : 1.0f) : -1.0f;
}

// The midpoint (map[j] + map[j + 1]) / 2 between codes j and j + 1, j in [0, 255): a
// scaled value above it is nearer code j + 1 (a tie goes to the lower code).
SA_HD float quant8_midpoint(const uint32_t* map, int j) {
  return (bits_float(map[j]) + bits_float(map[j + 1])) * 0.5f;
}

// The code of a scaled value (quant8_scaled), by definition: the number of midpoints below
// it, found in steps of 128, 64, ..., 1. The reference for quant8_code, and the rule the
// bucket tables are generated from.
SA_HD uint8_t quant8_search(const uint32_t* map, float scaled) {
  int below = 0;
  for (int step = 128; step >= 1; step /= 2) {
    const int j = below + step - 1;  // at most 254
    below += quant8_midpoint(map, j) < scaled ? step : 0;
  }
  return static_cast<uint8_t>(below);
}

// The same code in two table reads (the CPU's encode; the CUDA kernel reads one key table,
// below). The buckets cut [-1, 1] by a value's sign and the top 16 bits of its magnitude
// (magnitudes below 2^-23 share the first), fine enough that no bucket holds two midpoints
// (tests/test_quant8.cpp checks every bucket).
// A bucket's table entry is the code c of its lowest value; a value of the bucket has c,
// or c + 1 if the one midpoint that can lie in the bucket, mids[c], is below it.
SA_HD int quant8_bucket(float scaled) {
  const uint32_t bits = float_bits(scaled);
  uint32_t magnitude = bits & 0x7FFFFFFFu;
  magnitude = magnitude > kQuant8BucketLow ? magnitude : kQuant8BucketLow;
  return static_cast<int>((magnitude - kQuant8BucketLow) >> kQuant8BucketShift) +
         static_cast<int>(bits >> 31) * kQuant8BucketsPerSign;
}

// The lowest value of bucket i: its smallest magnitude for a positive bucket, minus its
// largest for a negative one (scaled values stop at 1).
SA_HD float quant8_bucket_low(int i) {
  const uint32_t k = static_cast<uint32_t>(i % kQuant8BucketsPerSign);
  if (i < kQuant8BucketsPerSign)
    return k == 0 ? 0.0f : bits_float(kQuant8BucketLow + (k << kQuant8BucketShift));
  const uint32_t top = kQuant8BucketLow + ((k + 1) << kQuant8BucketShift) - 1;
  return -bits_float(top < 0x3F800000u ? top : 0x3F800000u);
}

SA_HD uint8_t quant8_code(const uint8_t* buckets, const uint32_t* mids, float scaled) {
  const int low = buckets[quant8_bucket(scaled)];
  return static_cast<uint8_t>(low + (bits_float(mids[low]) < scaled ? 1 : 0));
}

// The code in one table read, for a scaled value of a block whose absmax is finite (the
// CUDA kernel's encode; kernels/cuda/adam_block_cuda.cu). There |scaled| < 1.0078 (|x| <=
// absmax, times its rounded inverse), no value is NaN, and no clamp is needed: a key, an
// integer that orders as the values do, counts the midpoints below a value. The keys of a
// table fall into buckets of 2^shift keys, few enough to keep in shared memory and fine
// enough that no bucket holds two midpoints (tests/test_quant8.cpp checks every one).
// Entry e of the table (bucket first + e) holds the code c of the bucket's lowest key and,
// if a midpoint's key m lies in the bucket, m's place t in it; the entry is
//   (c << code_bit) + ((2^shift - 1 - t) << key_shift) - (bucket_low << key_shift)
// (mod 2^32, key_shift = code_bit - shift), so that entry + (key << key_shift) carries
// into bit code_bit exactly when key > m, and its bits [code_bit, code_bit + 8) are the
// code: an add and a byte select per value.
//  - signed (exp_avg): the key is the float's bits with the magnitude's bits flipped for a
//    negative value (-0 below +0; no midpoint is 0), buckets of 2^17 keys, all of them from
//    -1.0078 to 1.0078: 16,258 entries;
//  - unsigned (exp_avg_sq, max_exp_avg_sq; values >= 0): the key is the bits of
//    max(scaled, 2^-23) (no midpoint is below 2^-23), buckets of 2^16: 2,945 entries.
struct Quant8KeyTable {
  int shift;      // a key's bucket is key >> shift (arithmetic)
  int code_bit;   // where the code lands in entry + (key << (code_bit - shift))
  int32_t first;  // the bucket of entry 0
  int32_t count;  // entries
};
constexpr float kQuant8UnsignedKeyLow = 1.1920928955078125e-7f;  // 2^-23

SA_HD constexpr Quant8KeyTable quant8_keys(bool is_signed) {
  return is_signed ? Quant8KeyTable{17, 24, -0x1FC1, 0x1FC0 + 0x1FC1 + 1}
                   : Quant8KeyTable{16, 16, 0x3400, 0x3F80 - 0x3400 + 1};
}

SA_HD int32_t quant8_signed_key(float scaled) {
  const auto bits = static_cast<int32_t>(float_bits(scaled));
  return bits ^ ((bits >> 31) & 0x7FFFFFFF);
}
SA_HD int32_t quant8_unsigned_key(float scaled) {
  return static_cast<int32_t>(float_bits(fmaxf(scaled, kQuant8UnsignedKeyLow)));
}
SA_HD int32_t quant8_key(bool is_signed, float scaled) {
  return is_signed ? quant8_signed_key(scaled) : quant8_unsigned_key(scaled);
}

// A key's entry plus the key, shifted: the code is in its bits [code_bit, code_bit + 8).
SA_HD uint32_t quant8_key_sum(Quant8KeyTable k, const uint32_t* entries, int32_t key) {
  return entries[(key >> k.shift) - k.first] +
         (static_cast<uint32_t>(key) << (k.code_bit - k.shift));
}

// The code of a key through table k's entries.
SA_HD uint8_t quant8_key_code(Quant8KeyTable k, const uint32_t* entries, int32_t key) {
  return static_cast<uint8_t>(quant8_key_sum(k, entries, key) >> k.code_bit);
}

// Entries [begin, end) of table k, from the keys of the 255 midpoints (ascending): the
// first entry's code by a binary search, each next one by walking past the midpoint its
// bucket holds. The CUDA kernel fills its shared copy with this, a slice per thread.
SA_HD void quant8_fill_keys(Quant8KeyTable k, const int32_t* mid_keys, int32_t begin, int32_t end,
                            uint32_t* entries) {
  const int key_shift = k.code_bit - k.shift;
  const uint32_t width = 1u << k.shift;
  int below = 0;  // midpoints with a key below the bucket's lowest
  const int32_t first_low = static_cast<int32_t>(static_cast<uint32_t>(k.first + begin) << k.shift);
  for (int step = 128; step >= 1; step /= 2)
    if (below + step <= 255 && mid_keys[below + step - 1] < first_low) below += step;
  for (int32_t e = begin; e < end; ++e) {
    const uint32_t low = static_cast<uint32_t>(k.first + e) << k.shift;
    uint32_t place = width - 1;  // no midpoint in the bucket: never carries
    const int code = below;
    if (below < 255 && static_cast<uint32_t>(mid_keys[below]) - low < width) {
      place = static_cast<uint32_t>(mid_keys[below]) - low;
      ++below;
    }
    entries[e] = (static_cast<uint32_t>(code) << k.code_bit) + ((width - 1 - place) << key_shift) -
                 (low << key_shift);
  }
}

// Part `part` of `parts` equal slices of table k (the last ones shorter or empty): what
// thread `part` of a thread block of `parts` fills. A slice's length is odd, so that the
// warp's 32 slices are in 32 different banks of shared memory at each step of the fill
// (at 64 they were in one, a 32-way conflict per store).
SA_HD void quant8_fill_keys_part(Quant8KeyTable k, const int32_t* mid_keys, int32_t part,
                                 int32_t parts, uint32_t* entries) {
  const int32_t per = ((k.count + parts - 1) / parts) | 1;
  const int32_t begin = part * per < k.count ? part * per : k.count;
  quant8_fill_keys(k, mid_keys, begin, begin + per < k.count ? begin + per : k.count, entries);
}

// The key of a code book's midpoint j (< 255), and all 255 of them.
SA_HD int32_t quant8_mid_key(const uint32_t* map, bool is_signed, int j) {
  return quant8_key(is_signed, quant8_midpoint(map, j));
}
SA_HD void quant8_mid_keys(const uint32_t* map, bool is_signed, int32_t* mid_keys) {
  for (int j = 0; j < 255; ++j) mid_keys[j] = quant8_mid_key(map, is_signed, j);
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_QUANT8_H_
