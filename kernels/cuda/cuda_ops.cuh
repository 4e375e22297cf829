// kernels/cuda/cuda_ops.cuh — adam_update()'s arithmetic on the GPU. The _rn intrinsics
// are never contracted or reassociated by nvcc (whatever --fmad says), so the CUDA
// results equal the CPU's bit for bit (adam_math.h rule 1).
#ifndef SHARDADAM_KERNELS_CUDA_CUDA_OPS_CUH_
#define SHARDADAM_KERNELS_CUDA_CUDA_OPS_CUH_

#include "../adam_math.h"

namespace sa {
namespace kernels {

struct CudaOps {
  __device__ __forceinline__ float mul(float a, float b) const { return __fmul_rn(a, b); }
  __device__ __forceinline__ float fma(float a, float b, float c) const {
    return __fmaf_rn(a, b, c);
  }
  __device__ __forceinline__ float sqrt(float a) const { return __fsqrt_rn(a); }
  __device__ __forceinline__ float div(float a, float b) const { return __fdiv_rn(a, b); }
  __device__ __forceinline__ float max(float a, float b) const { return a > b ? a : b; }
};

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_CUDA_OPS_CUH_
