// kernels/cuda/adam_block_parts.cuh — how the block-moment kernel's instantiations are split
// over translation units, so that its build scales with cores.
//
// Every Variant with block moments (each block storage of kMomentTypes x each unscaled param
// form x each grad dtype x amsgrad) is one instantiation of the pipelined kernel of
// adam_block_kernel.cuh. In one file they were 83% of the CUDA module's compile time (244-280
// CPU s on sm_90, half of it for instantiations with bfloat16 moments that no launch reached:
// the kernel's update is the float32-moment one). adam_block_part.cu is compiled
// SA_CUDA_BLOCK_PARTS times, as part 0, 1, ...; part p instantiates the Variants whose rank (below)
// is p modulo the number of parts, and adam_block_cuda.cu sends each launch to its Variant's part.
// The table of variants.h stays the one list: a new row lands in some part, and the number of parts
// is a build setting only (CMakeLists.txt: SHARDADAM_CUDA_BLOCK_PARTS).
#ifndef SHARDADAM_KERNELS_CUDA_ADAM_BLOCK_PARTS_CUH_
#define SHARDADAM_KERNELS_CUDA_ADAM_BLOCK_PARTS_CUH_

#include <cuda_runtime.h>

#include "../variants.h"
#include "adam_cuda.cuh"

#ifndef SA_CUDA_BLOCK_PARTS
#error "SA_CUDA_BLOCK_PARTS (the number of block-kernel parts) comes from CMakeLists.txt"
#endif

namespace sa {
namespace kernels {

constexpr int kBlockKernelParts = SA_CUDA_BLOCK_PARTS;
static_assert(kBlockKernelParts >= 1, "at least one part");

// The rank of a block-moment Variant among all of them, or -1 for a Variant that is not one
// (an element moment, a scaled param). Amsgrad is the outermost loop so that each part gets
// as many three-moment Variants (the costlier ones to compile) as two-moment ones.
constexpr int block_variant_rank(const Variant& v) {
  int rank = 0;
  for (int amsgrad = 0; amsgrad < 2; ++amsgrad)
    for (const ElemType moment : kMomentTypes) {
      if (!is_block_storage(moment)) continue;
      for (const ParamForm& form : kParamForms) {
        if (form.scaling != ParamScaling::none) continue;
        for (const ElemType grad : kGradTypes) {
          if (v.amsgrad == (amsgrad != 0) && v.moment == moment &&
              ParamForm{v.param, v.master, v.scaling} == form && v.grad == grad)
            return rank;
          ++rank;
        }
      }
    }
  return -1;
}

// v with moment storage m (the block Variant of a float32-moment Signature).
constexpr Variant with_moment(Variant v, ElemType m) {
  v.moment = m;
  return v;
}

// The part that instantiates Variant v, or -1 (block_variant_rank).
constexpr int block_kernel_part(const Variant& v) {
  const int rank = block_variant_rank(v);
  return rank < 0 ? -1 : rank % kBlockKernelParts;
}

// launch_adam_bucket_blocks for the Variants of part kPart (adam_block_kernel.cuh defines
// it; adam_block_part.cu instantiates it once per part). A Variant of another part returns
// cudaErrorInvalidValue and launches nothing.
template <int kPart>
cudaError_t launch_adam_bucket_blocks_part(const Variant& variant, const DeviceBucket& bucket,
                                           const DeviceStep& step, cudaStream_t stream);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_ADAM_BLOCK_PARTS_CUH_
