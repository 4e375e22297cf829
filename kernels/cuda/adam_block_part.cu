// kernels/cuda/adam_block_part.cu — part SA_CUDA_BLOCK_PART of the block-moment kernel's
// instantiations (adam_block_parts.cuh). CMakeLists.txt compiles this file once per part.
#include "adam_block_kernel.cuh"

#ifndef SA_CUDA_BLOCK_PART
#error "SA_CUDA_BLOCK_PART (which part this translation unit is) comes from CMakeLists.txt"
#endif

namespace sa {
namespace kernels {

static_assert(SA_CUDA_BLOCK_PART >= 0 && SA_CUDA_BLOCK_PART < kBlockKernelParts,
              "a part of the SA_CUDA_BLOCK_PARTS");
template cudaError_t launch_adam_bucket_blocks_part<SA_CUDA_BLOCK_PART>(const Variant&,
                                                                        const DeviceBucket&,
                                                                        const DeviceStep&,
                                                                        cudaStream_t);

}  // namespace kernels
}  // namespace sa
