// kernels/cuda/adam_cuda.cuh — the CUDA multi-tensor Adam kernel's launcher interface.
// Kernels see only tables (bucket_table.h) and device pointers, never the optimizer.
#ifndef SHARDADAM_KERNELS_CUDA_ADAM_CUDA_CUH_
#define SHARDADAM_KERNELS_CUDA_ADAM_CUDA_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

#include "../bucket_table.h"
#include "../step_control.h"

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
// counts (chunk_offsets[s] = first chunk of slot s; chunk_offsets[num_slots] = total), and
// two counters that the block-moment kernel hands its chunks out by (adam_block_cuda.cu):
// zero between its launches, which leave them so.
struct DeviceBucket {
  const TensorSlot* slots;
  const int64_t* chunk_offsets;
  int32_t num_slots;
  int64_t num_chunks;
  uint32_t* work;  // [2]
};

// The chunk `chunk` of a bucket belongs to the last slot s with chunk_offsets[s] <= chunk.
__device__ __forceinline__ int32_t slot_of_chunk(const DeviceBucket& bucket, int64_t chunk) {
  int32_t lo = 0, hi = bucket.num_slots - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (bucket.chunk_offsets[mid] <= chunk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Per-step inputs of the Adam kernels, in device memory.
struct DeviceStep {
  const GroupCoeffs* coeffs;  // per param (TensorSlot::param_index), folded with the grad
                              // multiplier (loss scale x clip) at the param's step count
  const StepVerdict* verdict;
};

// The slot of chunk `chunk` of a bucket and the elements [begin, end) of the slot it covers.
struct ChunkRange {
  TensorSlot slot;
  int64_t begin;
  int64_t end;
};

// Of chunk `chunk` of slot s (a kernel that walks the slots knows s),
__device__ __forceinline__ ChunkRange chunk_range(const DeviceBucket& bucket, int32_t s,
                                                  int64_t chunk) {
  const int64_t begin = (chunk - bucket.chunk_offsets[s]) * kCudaChunkElems;
  return {bucket.slots[s], begin, min(begin + kCudaChunkElems, bucket.slots[s].numel)};
}

// or of chunk `chunk`, its slot found.
__device__ __forceinline__ ChunkRange chunk_range(const DeviceBucket& bucket, int64_t chunk) {
  return chunk_range(bucket, slot_of_chunk(bucket, chunk), chunk);
}

// What the thread block that takes chunk `chunk` updates in a bucket launch: its slot, the
// elements [begin, end) of the slot, and the slot's param's coefficients.
struct ChunkWork {
  TensorSlot slot;
  GroupCoeffs coeffs;
  int64_t begin;
  int64_t end;
};

// The ChunkWork of chunk `chunk` of slot s, or false when its param has no grad at this step.
__device__ __forceinline__ bool chunk_work(const DeviceBucket& bucket, const DeviceStep& step,
                                           int32_t s, int64_t chunk, ChunkWork& work) {
  const ChunkRange r = chunk_range(bucket, s, chunk);
  if (r.slot.grad == nullptr) return false;
  work = {r.slot, step.coeffs[r.slot.param_index], r.begin, r.end};
  return true;
}

// The same, the chunk's slot found.
__device__ __forceinline__ bool chunk_work(const DeviceBucket& bucket, const DeviceStep& step,
                                           int64_t chunk, ChunkWork& work) {
  return chunk_work(bucket, step, slot_of_chunk(bucket, chunk), chunk, work);
}

// ---- the one dispatch of a bucket's launches -------------------------------------------

// What a launch over one bucket does. The backend asks for an op; which kernel runs it is
// decided here, once, from the bucket's Variant (launch_bucket).
enum class BucketOp : uint8_t {
  // partials[c] := the partial norm (args.norm: l2 or inf) of chunk c's grads, 0 for shards
  // the norm does not count (in_norm == 0) or without a grad.
  grad_norm,
  // Every chunk of every slot with a grad gets its Variant's update, unless the verdict
  // skips the step. A scaled (fp8) param's chunk is cast from its updated master in the same
  // launch (element moments) or the next (block moments: the masters' update runs over
  // args.masters); a delayed scaling's amax (where the slot has one) receives max |master|
  // of the shard; a current scaling folds max |master| of every slot, grad or none, into its
  // amax_bits instead of the cast.
  update,
  // For a bucket whose masters something else updated (the host: state stepped by the CPU,
  // which reaches the masters in mapped host memory): the second half of a scaled update,
  // every updated chunk cast from its master (or a current scaling's amax), as above. Does
  // nothing for an unscaled Variant.
  cast_from_master,
  // A current scaling's second pass, unless the verdict skips the step: every chunk cast
  // from its master with its tensor's scale (launch_current_scales wrote it). Does nothing
  // for a Variant of another scaling.
  current_cast,
};

// The tables and inputs of a bucket launch; what an op does not read may be left zero.
struct BucketArgs {
  DeviceBucket bucket;
  // Where needs_master_slots(variant): the bucket's slots as fp8_master_slot gives them,
  // with the bucket's chunk offsets (the block-moment kernel updates the masters there).
  DeviceBucket masters;
  DeviceStep step;
  NormType norm;     // grad_norm
  double* partials;  // grad_norm: one per chunk of the bucket
};

// Whether launches of Variant v read BucketArgs::masters.
bool needs_master_slots(const Variant& v);

// Enqueues `op` over a bucket of Variant v on `stream`; returns the launch error
// (cudaSuccess when the launches were accepted, or there was nothing to launch).
cudaError_t launch_bucket(BucketOp op, const Variant& v, const BucketArgs& args,
                          cudaStream_t stream);

// Enqueues `op` (bucket_table.h) on one param's slot of Variant v, its state in device
// memory: the one dispatch of the one-slot launches.
cudaError_t launch_slot(SlotOp op, const Variant& v, const TensorSlot& slot, cudaStream_t stream);

// ---- the kernels' families, which launch_bucket sends its ops to -----------------------

// The update of a Variant with element moments and an unscaled param (adam_cuda.cu).
cudaError_t launch_adam_bucket_elements(const Variant& variant, const DeviceBucket& bucket,
                                        const DeviceStep& step, cudaStream_t stream);

// The update of a Variant with block moments (q8, f8e4m3: adam_block_cuda.cu).
cudaError_t launch_adam_bucket_blocks(const Variant& variant, const DeviceBucket& bucket,
                                      const DeviceStep& step, cudaStream_t stream);

// BucketOp::grad_norm (grad_norm_cuda.cu). `grad` is the bucket's grad dtype.
cudaError_t launch_grad_norm_partials(ElemType grad, NormType norm, const DeviceBucket& bucket,
                                      double* partials, cudaStream_t stream);

// The fp8 families: adam_fp8_cuda.cuh.

// ---- the step's other launches ----------------------------------------------------------

// Decides the step (decide_step) and folds each active param's hyperparameters at its
// next step count into out[param] on the device (capturable: reads the step counts from
// device memory and advances the groups' and the active params' unless the step is
// skipped).
cudaError_t launch_fold_coefficients(const FoldTables& tables, const FoldInputs& inputs,
                                     GroupCoeffs* out, cudaStream_t stream);

// stats[kStatNorm] = the sum (l2) or max (inf) of partials[0..n) in a fixed order, and
// stats[kStatFoundInf] = (found_inf != NULL && *found_inf != 0). One block; deterministic.
cudaError_t launch_grad_norm_finish(NormType norm, const double* partials, int64_t n,
                                    const float* found_inf, double* stats, cudaStream_t stream);

// dst[i] = float(src[i]) for the master-weight initialisation.
cudaError_t launch_widen_to_f32(float* dst, const void* src, ElemType type, int64_t n,
                                cudaStream_t stream);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_ADAM_CUDA_CUH_
