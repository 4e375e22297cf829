// kernels/cuda/adam_fp8_cuda.cuh — the CUDA kernels of scaled (fp8) params
// (kernels/param_scaling.h): the fused update and cast of a bucket, the cast of one param
// from its master (import), and the master's initialisation from the param (add_param).
// Kernels see only tables (bucket_table.h) and device pointers, never the optimizer.
#ifndef SHARDADAM_KERNELS_CUDA_ADAM_FP8_CUDA_CUH_
#define SHARDADAM_KERNELS_CUDA_ADAM_FP8_CUDA_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

#include "../bucket_table.h"
#include "adam_cuda.cuh"

namespace sa {
namespace kernels {

// Enqueues the step of a bucket of scaled params (variant.scaling not none, element
// moments): each chunk's masters are updated as a float32 param's (fp8_master_variant)
// and cast in the same pass; block scalings write their blocks' scales, a delayed
// scaling's amax (where the slot has one) receives max |master| of the shard. Nothing is
// written when the verdict skips the step, nor for a slot without a grad or elements. A
// current scaling's pass folds max |master| into each slot's amax_bits instead of the cast
// (every slot's, grad or none; below).
//
// Like every family of adam_cuda.cuh, these bucket launches are reached through
// launch_bucket, which chooses among them and skips an empty bucket.
cudaError_t launch_adam_bucket_scaled(const Variant& variant, const DeviceBucket& bucket,
                                      const DeviceStep& step, cudaStream_t stream);

// The same for a bucket of scaled params with block moments (q8, f8e4m3): two launches,
// the block-moment update of the masters (adam_block_cuda.cu, over `masters`: the bucket's
// slots as fp8_master_slot gives them, with the bucket's chunk offsets), then the cast of
// every updated chunk from its master (as launch_cast_param casts, one thread block per
// chunk, with the same amax rules as above), or for a current scaling the fold of every
// chunk's max |master| into its slot's amax_bits.
cudaError_t launch_adam_bucket_scaled_blocks(const Variant& variant, const DeviceBucket& bucket,
                                             const DeviceBucket& masters, const DeviceStep& step,
                                             cudaStream_t stream);

// The second launch of launch_adam_bucket_scaled_blocks on its own, for a bucket whose
// masters something else updated (the block-moment kernel, or the host: state stepped by
// the CPU, which reaches the masters in mapped host memory): every updated chunk cast from
// its master, or for a current scaling every chunk's max |master| folded into its slot's
// amax_bits. Any moments.
cudaError_t launch_cast_bucket(const Variant& variant, const DeviceBucket& bucket,
                               const DeviceStep& step, cudaStream_t stream);

// Current scaling (is_current), in a step's order:
//   launch_reset_current_amax: *amax_bits = 0 for every entry of the plan's current table;
//   launch_bucket(BucketOp::update) of each bucket: the masters'
//     update, and max |master| of every slot folded into its amax_bits, unless verdict->skip
//     (block moments: whether or not);
//   (the core reduces the amax_bits across ranks, on the stream with NCCL)
//   launch_current_scales: each entry's [scale, scale_inv] and amax from its reduced amax
//     (param_cast.h's write_current_scale), unless verdict->skip;
//   launch_current_cast (BucketOp::current_cast): every chunk of the bucket cast from its master
//   with that scale,
//     unless verdict->skip.
// launch_measure_amax is the first pass without an update, for one param (a recast).
cudaError_t launch_reset_current_amax(const CurrentScale* table, int32_t n, cudaStream_t stream);
cudaError_t launch_current_scales(const CurrentScale* table, int32_t n, const StepVerdict* verdict,
                                  cudaStream_t stream);
cudaError_t launch_current_cast(const Variant& variant, const DeviceBucket& bucket,
                                const StepVerdict* verdict, cudaStream_t stream);
cudaError_t launch_measure_amax(const TensorSlot& slot, cudaStream_t stream);

// Enqueues the cast of one scaled param from its master, as a step casts it after the
// update: the param's codes, its block scales, a delayed scaling's amax (set to 0 first, so
// an empty shard's amax is 0), and a current scaling's scale from its reduced amax (an empty
// shard's too).
cudaError_t launch_cast_param(const Variant& variant, const TensorSlot& slot, cudaStream_t stream);

// Enqueues master[i] = the value the fp8 code param[i] stands for under its scale
// (param_cast.h's dequantize_block), for n elements: the master's initialisation.
cudaError_t launch_dequantize_param(ElemType param_type, ParamScaling scaling, const void* param,
                                    const ParamScale& scale, int64_t n, float* master,
                                    cudaStream_t stream);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_ADAM_FP8_CUDA_CUH_
