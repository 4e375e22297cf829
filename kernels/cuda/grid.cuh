// kernels/cuda/grid.cuh — the launch size of the CUDA kernels' grid-stride loops.
#ifndef SHARDADAM_KERNELS_CUDA_GRID_CUH_
#define SHARDADAM_KERNELS_CUDA_GRID_CUH_

#include <stdint.h>

#include <algorithm>

namespace sa {
namespace kernels {

// Thread blocks for a grid-stride loop over n items, per_block per thread block and round:
// enough to cover them once, at least 1 and at most 4096 (the loop takes the rest).
inline unsigned grid_for(int64_t n, int64_t per_block) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((n + per_block - 1) / per_block, 4096)));
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_GRID_CUH_
