// kernels/param_scaling.h — the one table of the ways an fp8 param is scaled from its
// float32 master (sa_param_scaling): the core's checks, the C ABI's table and the kernels'
// dispatch derive from it. kernels/param_cast.h holds the rules themselves.
//
// Blocks run along the last dim: a block of kBlock elements is kBlock consecutive elements
// of a row. add_param refuses a layout whose last dim is not a whole number of blocks on
// every rank, so in a C-contiguous local shard block b is elements [b * kBlock,
// (b + 1) * kBlock) of the flat shard, and a run that starts on a multiple of kBlock holds
// whole blocks.
//
// Host and device code.
#ifndef SHARDADAM_KERNELS_PARAM_SCALING_H_
#define SHARDADAM_KERNELS_PARAM_SCALING_H_

#include <stdint.h>

#include "elem_type.h"

namespace sa {
namespace kernels {

// X(name, sa_param_scaling value, block elements along the last dim (0: one scale for the
//   whole tensor), the scale tensor's dtype, whether the step writes the scale tensor,
//   doc)
#define SA_PARAM_SCALINGS(X)                                                                \
  X(none, 0, 0, f32, false, "no scale: a float32, bfloat16 or float16 param")               \
  X(delayed, 1, 0, f32, false,                                                              \
    "per tensor, the engine's scale: scale is a float32 scalar the step reads, "            \
    "param = fp8(master * scale); amax, a float32 scalar, receives max |master| of the "    \
    "local shard at every step that updates it (for the engine's amax history)")            \
  X(mxfp8, 2, 32, e8m0, true,                                                               \
    "OCP MXFP8: a float8_e8m0fnu scale per 32 elements of the last dim, written by the "    \
    "step: X = 2^(floor(log2 amax) - emax) (emax 8 for e4m3, 15 for e5m2), param = "        \
    "fp8(master / X)")                                                                      \
  X(block128, 3, 128, f32, true,                                                            \
    "1x128 blocks (DeepSeek-V3): a float32 scale_inv per 128 elements of the last dim, "    \
    "written by the step: scale = fp8_max / amax (1 when amax is 0), param = fp8(master * " \
    "scale), scale_inv = 1 / scale")                                                        \
  X(current, 4, 0, f32, true,                                                               \
    "per tensor, from this step's masters (Transformer Engine's current scaling): amax = "  \
    "max |master| over the whole global tensor (reduced across ranks through the "          \
    "optimizer's communicator when it is sharded), scale = fp8_max / amax (1 when amax "    \
    "is 0), param = fp8(master * scale); scale is two float32 elements the step writes: "   \
    "[scale, scale_inv = 1 / scale]; amax, optional, receives the global amax")             \
  X(current_pow2, 5, 0, f32, true,                                                          \
    "as current, with the scale rounded down to a power of two (so scale_inv is exact and " \
    "the cast never saturates)")

enum class ParamScaling : uint8_t {
#define SA_SCALING_ENUMERATOR(name, value, block, scale_type, writes, doc) name = (value),
  SA_PARAM_SCALINGS(SA_SCALING_ENUMERATOR)
#undef SA_SCALING_ENUMERATOR
};

// The scalings in the table's order (kernels/variants.h's fp8 param forms).
inline constexpr ParamScaling kParamScalings[] = {
#define SA_SCALING_ELEM(name, value, block, scale_type, writes, doc) ParamScaling::name,
    SA_PARAM_SCALINGS(SA_SCALING_ELEM)
#undef SA_SCALING_ELEM
};

// NOLINTBEGIN(bugprone-macro-parentheses): terms of the sums below
#define SA_SCALING_COUNT(name, value, block, scale_type, writes, doc) 1 +
#define SA_SCALING_BLOCK(name, value, block, scale_type, writes, doc) \
  (s == ParamScaling::name ? (block) : 0) +
// NOLINTEND(bugprone-macro-parentheses)
constexpr int kNumParamScalings = SA_PARAM_SCALINGS(SA_SCALING_COUNT) 0;
// Elements per block of a scaling (0: per tensor).
SA_HD constexpr int64_t scaling_block(ParamScaling s) {
  return SA_PARAM_SCALINGS(SA_SCALING_BLOCK) 0;
}

// Whether a scaling derives its scale from this step's masters over the whole tensor, so
// that a step takes two passes with the amax (reduced across ranks) between them: the
// update and the amax, then the scale and the cast.
SA_HD constexpr bool is_current(ParamScaling s) {
  return s == ParamScaling::current || s == ParamScaling::current_pow2;
}
#undef SA_SCALING_COUNT
#undef SA_SCALING_BLOCK

// The pointers of a scaled param, in its TensorSlot (NULL for an unscaled one):
//   delayed:  scale -> the engine's float32 scale (read), amax -> float32 (written);
//   mxfp8:    scale -> uint8 e8m0 codes, one per block (written); amax NULL;
//   block128: scale -> float32 scale_inv, one per block (written); amax NULL;
//   current:  scale -> float32 [scale, scale_inv] (written), amax -> float32 (written,
//             optional), amax_bits -> the core's double that the first pass sets to the
//             shard's max |master| as magnitude bits (quant8_magnitude_bits: an integer
//             below 2^32, exact in a double, ordered as the magnitudes with NaN above
//             infinity), that a communicator max-reduces across ranks, and that the second
//             pass reads; margin: the scale is divided by 2^margin (0 .. kMaxCurrentMargin).
// Other scalings: margin 0.
struct ParamScale {
  void* scale;
  float* amax;
  double* amax_bits;
  int32_t margin;
};

// The largest margin of a current scaling: with it, the scale of the largest finite amax
// (fp8_max / FLT_MAX, at least 448 / FLT_MAX > 2^-120) divided by 2^margin is still a normal
// float, so the division is exact and scale_inv finite.
constexpr int32_t kMaxCurrentMargin = 6;

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_PARAM_SCALING_H_
