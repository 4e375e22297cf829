// kernels/cuda/adam_cuda.cuh — the CUDA multi-tensor Adam kernel's launcher interface.
// Kernels see only tables (bucket_table.h) and device pointers, never the optimizer.
#ifndef SHARDADAM_KERNELS_CUDA_ADAM_CUDA_CUH_
#define SHARDADAM_KERNELS_CUDA_ADAM_CUDA_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

#include "../bucket_table.h"

namespace sa {
namespace kernels {

// Elements of one chunk: the unit one thread block updates. A slot of n elements owns
// ceil(n / kCudaChunkElems) consecutive chunks; an empty slot owns none.
// Tuning knobs, measured on an H200 (bench/cuda_tuning.md); overridable at build time
// only to repeat those measurements.
#ifndef SA_CUDA_CHUNK_ELEMS
#define SA_CUDA_CHUNK_ELEMS 16384
#endif
#ifndef SA_CUDA_MIN_BLOCKS_PER_SM
#define SA_CUDA_MIN_BLOCKS_PER_SM 1
#endif
constexpr int64_t kCudaChunkElems = SA_CUDA_CHUNK_ELEMS;
constexpr int kCudaBlockThreads = 256;

// One bucket's device-resident tables: the slots and the prefix sums of their chunk
// counts (chunk_offsets[s] = first chunk of slot s; chunk_offsets[num_slots] = total).
struct DeviceBucket {
  const TensorSlot* slots;
  const int64_t* chunk_offsets;
  int32_t num_slots;
  int64_t num_chunks;
};

// Per-step inputs in device memory. groups[g] holds group g's coefficients folded with
// an inverse grad scale of 1; inv_grad_scale (nullable) multiplies into it in the
// kernel; a nonzero *found_inf (nullable) makes every block return at once.
struct DeviceStep {
  const GroupCoeffs* groups;
  const float* inv_grad_scale;
  const float* found_inf;
};

// One launch updates every chunk of every slot of the bucket. Enqueues on `stream`
// only; returns the launch error (cudaSuccess when the launch was accepted).
cudaError_t launch_adam_bucket(const Variant& variant, const DeviceBucket& bucket,
                               const DeviceStep& step, cudaStream_t stream);

// Folds hyperparameters into coefficients on the device (capturable: reads the step
// counts from device memory and advances them unless *found_inf is nonzero).
cudaError_t launch_fold_coefficients(const AdamHyper* hyper, int64_t* steps, int32_t num_groups,
                                     const float* found_inf, GroupCoeffs* out, cudaStream_t stream);

// dst[i] = float(src[i]) for the master-weight initialisation.
cudaError_t launch_widen_to_f32(float* dst, const void* src, ElemType type, int64_t n,
                                cudaStream_t stream);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_ADAM_CUDA_CUH_
