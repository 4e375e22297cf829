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

#if !defined(__CUDACC__)
// The code book of a moment: signed for exp_avg, unsigned for the second moments. (CUDA
// kernels read their copy in shared memory: kernels/cuda/adam_cuda.cu.)
inline const uint32_t* quant8_map(bool is_signed) {
  return is_signed ? kQuant8SignedMap : kQuant8UnsignedMap;
}
#endif

SA_HD float quant8_decode(const uint32_t* map, uint8_t code, float absmax) {
  return bits_float(map[code]) * absmax;
}

// The absmax of n values: their largest magnitude, or NaN if one is NaN.
SA_HD float quant8_absmax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = fabsf(x[i]);
    if (a > m || a != a) m = a;
    if (m != m) break;
  }
  return m;
}

// The code of x in a block whose absmax is `absmax`.
SA_HD uint8_t quant8_encode(const uint32_t* map, float x, float absmax) {
  const float inv = 1.0f / (absmax > 1e-38f ? absmax : 1e-38f);
  float scaled = x * inv;
  scaled = scaled < -1.0f ? -1.0f : scaled > 1.0f ? 1.0f : scaled;
  // The number of midpoints (map[j] + map[j + 1]) / 2, j in [0, 255), below `scaled`.
  int lo = 0, hi = 255;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    const float bound = (bits_float(map[mid]) + bits_float(map[mid + 1])) * 0.5f;
    if (bound < scaled)
      lo = mid + 1;
    else
      hi = mid;
  }
  return static_cast<uint8_t>(lo);
}

// One block: x[0, n) -> codes[0, n) and its absmax.
SA_HD float quant8_encode_block(const uint32_t* map, const float* x, int64_t n, uint8_t* codes) {
  const float absmax = quant8_absmax(x, n);
  for (int64_t i = 0; i < n; ++i) codes[i] = quant8_encode(map, x[i], absmax);
  return absmax;
}

SA_HD void quant8_decode_block(const uint32_t* map, const uint8_t* codes, float absmax, int64_t n,
                               float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = quant8_decode(map, codes[i], absmax);
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_QUANT8_H_
