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
#include "state_kind.h"

namespace sa {
namespace kernels {

// The q8 moments of a slot, k = 0, 1, 2 (the third with amsgrad only): the state holding
// the codes, the state holding the block absmax values, and whether the signed map codes
// it. Written once here for the CPU and CUDA kernels.
SA_HD constexpr StateKind quant8_codes(int k) {
  return k == 0 ? StateKind::exp_avg : k == 1 ? StateKind::exp_avg_sq : StateKind::max_exp_avg_sq;
}
SA_HD constexpr StateKind quant8_absmax_state(int k) {
  return k == 0   ? StateKind::exp_avg_absmax
         : k == 1 ? StateKind::exp_avg_sq_absmax
                  : StateKind::max_exp_avg_sq_absmax;
}
SA_HD constexpr bool quant8_signed(int k) { return k == 0; }

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

// x / absmax as the search compares it: times the rounded inverse, clamped to [-1, 1].
SA_HD float quant8_inverse(float absmax) { return 1.0f / (absmax > 1e-38f ? absmax : 1e-38f); }

SA_HD float quant8_scaled(float x, float inverse) {
  const float scaled = x * inverse;
  return scaled < -1.0f ? -1.0f : scaled > 1.0f ? 1.0f : scaled;
}

// The midpoint (map[j] + map[j + 1]) / 2 between codes j and j + 1, j in [0, 255): a
// scaled value above it is nearer code j + 1 (a tie goes to the lower code).
SA_HD float quant8_midpoint(const uint32_t* map, int j) {
  return (bits_float(map[j]) + bits_float(map[j + 1])) * 0.5f;
}

// One step of the code search: the number of midpoints below `scaled` (they ascend with
// j) is found in steps of 128, 64, ..., 1, each adding its size when the midpoint it tests
// lies below. Fixed steps and no data-dependent branch: a mispredicted branch per step
// cost ~130 ns per element on x86, and it diverges on a GPU.
SA_HD int quant8_search_step(const uint32_t* map, int below, int step, float scaled) {
  const int j = below + step - 1;  // at most 254
  return below + (quant8_midpoint(map, j) < scaled ? step : 0);
}

// The code of a scaled value (quant8_scaled): the number of midpoints below it.
SA_HD uint8_t quant8_search(const uint32_t* map, float scaled) {
  int below = 0;
  for (int step = 128; step >= 1; step /= 2) below = quant8_search_step(map, below, step, scaled);
  return static_cast<uint8_t>(below);
}

// The code of x in a block whose absmax is `absmax`.
SA_HD uint8_t quant8_encode(const uint32_t* map, float x, float absmax) {
  return quant8_search(map, quant8_scaled(x, quant8_inverse(absmax)));
}

// quant8_search as a tree in breadth-first (Eytzinger) order, for the CUDA kernel: node i
// in [1, 256) holds the midpoint the search tests at its level, for the codes below it.
// quant8_search_tree visits i -> 2i + (node < scaled) eight times and the code is
// i - 256: the same comparisons of the same midpoints, so the same code. The nodes of one
// level are contiguous, so lanes that test different nodes of an early level read
// different shared-memory banks (in quant8_search's order every midpoint the first three
// steps test sits in the same bank).
SA_HD float quant8_tree_node(const uint32_t* map, int i) {
  int level = 0;  // i in [2^level, 2^(level + 1))
  while ((2 << level) <= i) ++level;
  const int step = 128 >> level;
  const int below = (i - (1 << level)) * 2 * step;
  return quant8_midpoint(map, below + step - 1);
}

SA_HD uint8_t quant8_search_tree(const float* tree, float scaled) {
  int i = 1;
  for (int level = 0; level < 8; ++level) i = 2 * i + (tree[i] < scaled ? 1 : 0);
  return static_cast<uint8_t>(i - 256);
}

// One block: x[0, n) -> codes[0, n) and its absmax. Eight searches run side by side (they
// are chains of dependent loads; interleaved, the CPU overlaps them), each exactly
// quant8_encode's.
SA_HD float quant8_encode_block(const uint32_t* map, const float* x, int64_t n, uint8_t* codes) {
  constexpr int kLanes = 8;
  const float absmax = quant8_absmax(x, n);
  const float inverse = quant8_inverse(absmax);
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t i = 0; i < whole; i += kLanes) {
    float scaled[kLanes];
    int below[kLanes];
    for (int e = 0; e < kLanes; ++e) {
      scaled[e] = quant8_scaled(x[i + e], inverse);
      below[e] = 0;
    }
    for (int step = 128; step >= 1; step /= 2)
      for (int e = 0; e < kLanes; ++e)
        below[e] = quant8_search_step(map, below[e], step, scaled[e]);
    for (int e = 0; e < kLanes; ++e) codes[i + e] = static_cast<uint8_t>(below[e]);
  }
  for (int64_t i = whole; i < n; ++i) codes[i] = quant8_encode(map, x[i], absmax);
  return absmax;
}

SA_HD void quant8_decode_block(const uint32_t* map, const uint8_t* codes, float absmax, int64_t n,
                               float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = quant8_decode(map, codes[i], absmax);
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_QUANT8_H_
