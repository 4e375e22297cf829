// kernels/guided.h — how a persistent grid hands out a launch's n chunks: in stretches, to
// whichever thread block asks next (the CUDA block-moment kernel, adam_block_cuda.cu).
#ifndef SHARDADAM_KERNELS_GUIDED_H_
#define SHARDADAM_KERNELS_GUIDED_H_

#include <stdint.h>

#include "elem_type.h"  // SA_HD

namespace sa {
namespace kernels {

// Chunks [first, last).
struct Stretch {
  uint32_t first;
  uint32_t last;
};

// Stretch u of n chunks for a grid of g thread blocks, a guided schedule: long stretches
// first, so that the warps' pipelines seldom restart, short ones last, so that the thread
// blocks end together however their speeds differ. In rounds of g stretches, each 1 / (2g)
// of the chunks left, until that is one chunk; then one chunk each; past the last, empty
// ones at n. Stretches 0, 1, ... tile [0, n) in order, about g * (log2(n / 2g) + 3) of them.
SA_HD Stretch guided_stretch(uint32_t u, uint32_t n, uint32_t g) {
  uint32_t start = 0, left = n;
  for (;;) {
    const uint32_t size = left / (2 * g);
    if (size <= 1) {
      const uint32_t first = u < left ? start + u : n;
      return {first, first < n ? first + 1 : n};
    }
    if (u < g) return {start + u * size, start + (u + 1) * size};
    start += g * size;
    left -= g * size;
    u -= g;
  }
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_GUIDED_H_
