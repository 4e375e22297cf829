// kernels/cuda/adam_quant8_cuda.cu — the CUDA Adam kernel for q8 (8-bit blockwise) moments,
// in its own translation unit so that it compiles beside adam_cuda.cu. Tables, chunks and
// the step's verdict as in adam_cuda.cu; the element update is the float32-moment
// Variant's, between a decode and an encode of each 256-element block.
#include <cuda_runtime.h>

#include <cstdint>

#include "../quant8.h"
#include "../variants.h"
#include "adam_cuda.cuh"
#include "cuda_ops.cuh"
#include "master.cuh"
#include "storage.cuh"

namespace sa {
namespace kernels {
namespace {

// A warp per block of kQuant8Block elements, 8 consecutive elements per lane: decode the
// block's moments, update each element as the float32-moment Signature S does, take the
// new absmax over the warp, encode. The same functions of quant8.h as the CPU, so the
// same bits. A lane whose 8 elements are all in the shard moves them in 16-byte (param,
// grad, master) and 8-byte (codes) accesses where the arrays allow, so a warp reads and
// writes whole contiguous runs; the last, partial lanes of a shard go an element at a time.
static_assert(kQuant8Block == 32 * kVec, "a warp of kVec elements per lane covers a q8 block");
static_assert(kCudaChunkElems % kQuant8Block == 0, "chunks start on q8 block boundaries");

// The code books and their search trees (quant8_tree_node), in shared memory.
struct Quant8Tables {
  uint32_t maps[2][256];  // [0] signed (exp_avg), [1] unsigned
  float trees[2][256];    // node 0 unused
};

__device__ __forceinline__ float absmax_combine(float a, float b) {
  return (b > a || b != b) ? b : a;  // quant8_absmax's rule: the max, NaN wins
}

__device__ __forceinline__ void load_codes(const uint8_t* codes, int64_t first, int n, bool whole,
                                           uint8_t (&c)[kVec]) {
  if (whole) {
    const uint2 w = *reinterpret_cast<const uint2*>(codes + first);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      c[j] = static_cast<uint8_t>(w.x >> (8 * j));
      c[4 + j] = static_cast<uint8_t>(w.y >> (8 * j));
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) c[j] = j < n ? codes[first + j] : 0;
  }
}

__device__ __forceinline__ void store_codes(uint8_t* codes, int64_t first, int n, bool whole,
                                            const uint8_t (&c)[kVec]) {
  if (whole) {
    uint2 w = make_uint2(0, 0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w.x |= static_cast<uint32_t>(c[j]) << (8 * j);
      w.y |= static_cast<uint32_t>(c[4 + j]) << (8 * j);
    }
    *reinterpret_cast<uint2*>(codes + first) = w;
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (j < n) codes[first + j] = c[j];
  }
}

template <class S, bool kL2>
__device__ void update_quant8_block(const TensorSlot& slot, int64_t block,
                                    const AdamCoeffs<float>& c, const Quant8Tables& t, bool vec_ok,
                                    int lane) {
  constexpr int kMoments = S::kAmsgrad ? 3 : 2;
  using P = Master<S::kParam, S::kMaster>;
  const TypedSlot<S> a(slot);  // param, grad and master; the moments are read below
  const int64_t first = block * kQuant8Block + lane * kVec;
  const int64_t left = slot.numel - first;  // elements of this lane's 8 in the shard
  const int n = left >= kVec ? kVec : left > 0 ? static_cast<int>(left) : 0;
  const bool whole = vec_ok && n == kVec;
  float mom[3][kVec];
#pragma unroll
  for (int k = 0; k < kMoments; ++k) {
    const auto* codes = static_cast<const uint8_t*>(slot.state[static_cast<int>(quant8_codes(k))]);
    const float absmax =
        static_cast<const float*>(slot.state[static_cast<int>(quant8_absmax_state(k))])[block];
    uint8_t code[kVec];
    load_codes(codes, first, n, whole, code);
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      mom[k][j] = j < n ? quant8_decode(t.maps[quant8_signed(k) ? 0 : 1], code[j], absmax) : 0.0f;
  }
  float p[kVec], g[kVec];
  if (whole) {
    P::load_vec(a, first, p);
    Storage<S::kGrad>::load_vec(a.grad, first, g);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      p[j] = j < n ? P::load(a, first + j) : 0.0f;
      g[j] = j < n ? Storage<S::kGrad>::load(a.grad, first + j) : 0.0f;
    }
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    float vmax = S::kAmsgrad ? mom[2][j] : 0.0f;
    adam_update<kL2, S::kAmsgrad>(CudaOps{}, c, g[j], p[j], mom[0][j], mom[1][j], vmax);
    if (S::kAmsgrad) mom[2][j] = vmax;
  }
  if (whole) {
    P::store_vec(a, first, p);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (j < n) P::store(a, first + j, p[j]);
  }
#pragma unroll
  for (int k = 0; k < kMoments; ++k) {
    float absmax = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (j < n) absmax = absmax_combine(absmax, fabsf(mom[k][j]));
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      absmax = absmax_combine(absmax, __shfl_xor_sync(0xFFFFFFFFu, absmax, offset));
    const float inverse = quant8_inverse(absmax);
    const float* tree = t.trees[quant8_signed(k) ? 0 : 1];
    uint8_t code[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      code[j] = quant8_search_tree(tree, quant8_scaled(mom[k][j], inverse));
    store_codes(static_cast<uint8_t*>(slot.state[static_cast<int>(quant8_codes(k))]), first, n,
                whole, code);
    if (lane == 0)
      static_cast<float*>(slot.state[static_cast<int>(quant8_absmax_state(k))])[block] = absmax;
  }
}

// S: the float32-moment Signature of the bucket's q8 Variant.
template <class S>
__global__ void __launch_bounds__(kCudaBlockThreads, SA_CUDA_MIN_BLOCKS_PER_SM)
    adam_bucket_kernel_quant8(DeviceBucket bucket, DeviceStep step) {
  if (step.verdict->skip) return;
  __shared__ Quant8Tables tables;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    tables.maps[0][i] = kQuant8SignedMap[i];
    tables.maps[1][i] = kQuant8UnsignedMap[i];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    tables.trees[0][i] = i == 0 ? 0.0f : quant8_tree_node(tables.maps[0], i);
    tables.trees[1][i] = i == 0 ? 0.0f : quant8_tree_node(tables.maps[1], i);
  }
  __syncthreads();
  ChunkWork w;
  if (!chunk_work(bucket, step, w)) return;
  const TypedSlot<S> a(w.slot);
  bool vec_ok = param_vec_aligned(a);
  for (int k = 0; k < (S::kAmsgrad ? 3 : 2); ++k)
    vec_ok = vec_ok && aligned(w.slot.state[static_cast<int>(quant8_codes(k))], kVec);
  const int warps = static_cast<int>(blockDim.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (int64_t b = w.begin / kQuant8Block + static_cast<int>(threadIdx.x) / 32;
       b * kQuant8Block < w.end; b += warps) {
    if (w.coeffs.l2)
      update_quant8_block<S, true>(w.slot, b, w.coeffs.c, tables, vec_ok, lane);
    else
      update_quant8_block<S, false>(w.slot, b, w.coeffs.c, tables, vec_ok, lane);
  }
}

template <class S>
cudaError_t launch_typed_quant8(const DeviceBucket& bucket, const DeviceStep& step,
                                cudaStream_t stream) {
  adam_bucket_kernel_quant8<S>
      <<<static_cast<unsigned>(bucket.num_chunks), kCudaBlockThreads, 0, stream>>>(bucket, step);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_adam_bucket_quant8(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                                      cudaStream_t st) {
  if (b.num_chunks == 0) return cudaSuccess;
  Variant inner = v;  // a block storage: the float32 Variant's update, per block
  inner.moment = ElemType::f32;
  cudaError_t err = cudaErrorInvalidValue;  // the core never builds a Variant not in the table
  visit_variant(inner,
                [&](auto signature) { err = launch_typed_quant8<decltype(signature)>(b, s, st); });
  return err;
}

}  // namespace kernels
}  // namespace sa
