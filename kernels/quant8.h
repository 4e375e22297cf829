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
// for the second moments. Host copies; CUDA kernels copy theirs to shared memory
// (kernels/cuda/adam_block_cuda.cu).
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

// The same code in two table reads (both backends). The buckets cut [-1, 1] by a value's
// sign and the top 16 bits of its magnitude (magnitudes below 2^-23 share the first), fine
// enough that no bucket holds two midpoints (tests/test_quant8.cpp checks every bucket).
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

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_QUANT8_H_
