// kernels/cuda/adam_block_cuda.cu — the CUDA Adam kernel for block moments
// (kernels/block_moment.h: q8, f8e4m3), in its own translation unit so that it compiles
// beside adam_cuda.cu. Tables, chunks and the step's verdict as in adam_cuda.cu; the element
// update is the float32-moment Variant's, between a decode and an encode of each
// 256-element block.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../block_moment.h"
#include "../variants.h"
#include "adam_cuda.cuh"
#include "cuda_ops.cuh"
#include "master.cuh"
#include "storage.cuh"

namespace sa {
namespace kernels {
namespace {

// A warp per block of kQuant8Block elements, 8 per lane: decode the block's moments (with
// BlockCodec<T>, T the bucket's moment storage),
// update each element as the float32-moment Signature S does, take the new absmax over the
// warp, encode. The same functions of block_moment.h as the CPU, so the same bits (the absmax
// does not depend on the order its values are met in). A block whose 256 elements are all
// in the shard, with arrays that allow it, moves a lane's runs of 4 in 16-byte (float32),
// 8-byte (16-bit) and 4-byte (codes) accesses; the shard's last, partial block and
// unaligned arrays go an element at a time (kWhole false). Along a run of whole blocks a
// warp loads its next block's codes once it has decoded the current block's, and the next
// params and grads once it has stored the current params, so those loads are in flight
// while it works (measured: 7% faster with q8, 11% with f8e4m3; bench/cuda_tuning.md). A
// run's kRun elements go through adam_update side by side (CudaLaneOps).
//
// The grid is persistent (kBlockMomentBlocksPerSm thread blocks per multiprocessor, each taking
// every gridDim.x-th chunk), so each thread block copies q8's 16 KB of code-book tables
// into shared memory once per launch, not once per chunk.
static_assert(kCudaChunkElems % kQuant8Block == 0, "chunks start on q8 block boundaries");

// Tuning knob (bench/cuda_tuning.md): resident thread blocks per multiprocessor, the
// register budget they leave (65536 / (256 * 2) = 128 per thread: the pipelined loads need
// them; 3 blocks' 80 spill) and the grid size.
#ifndef SA_CUDA_BLOCK_MOMENT_BLOCKS_PER_SM
#define SA_CUDA_BLOCK_MOMENT_BLOCKS_PER_SM 2
#endif
constexpr int kBlockMomentBlocksPerSm = SA_CUDA_BLOCK_MOMENT_BLOCKS_PER_SM;

// What a block storage's codes need in shared memory: q8's two code books (Quant8Book),
// [0] signed (exp_avg), [1] unsigned; nothing for f8e4m3.
template <ElemType T>
struct BlockTables {
  __device__ void load() {}
  __device__ typename BlockCodec<T>::Book book(bool) const { return {}; }
};

template <>
struct BlockTables<ElemType::q8> {
  uint32_t map[2][256];
  uint32_t mids[2][256];
  uint8_t buckets[2][kQuant8Buckets];
  __device__ void load();
  __device__ Quant8Book book(bool is_signed) const {
    const int i = is_signed ? 0 : 1;
    return {map[i], mids[i], buckets[i]};
  }
};

__device__ void BlockTables<ElemType::q8>::load() {
  BlockTables& t = *this;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    t.map[0][i] = kQuant8SignedMap[i];
    t.map[1][i] = kQuant8UnsignedMap[i];
    t.mids[0][i] = kQuant8SignedMids[i];
    t.mids[1][i] = kQuant8UnsignedMids[i];
  }
  for (int i = threadIdx.x; i < kQuant8Buckets; i += blockDim.x) {
    t.buckets[0][i] = kQuant8SignedBuckets[i];
    t.buckets[1][i] = kQuant8UnsignedBuckets[i];
  }
}

// A lane's elements of a q8 block: two runs of kRun, at lane * kRun in each half of the
// block, so that each access of a warp covers one contiguous run of the block (512 bytes
// of a float32 array, 128 of the codes).
constexpr int kRun = kVec / 2;
constexpr int kRuns = 2;
static_assert(kQuant8Block == kRuns * 32 * kRun, "two runs of kRun per lane cover a block");

// A lane's share of a block, as loaded: the param (full precision) and grad of each run,
// and each moment's codes (a run's kRun codes as one word, the first in the low byte) and
// absmax. Loading is apart from the update so that a warp can issue its next block's loads
// while it updates the current one (update_chunk).
template <class S>
struct BlockInputs {
  float p[kRuns][kRun], g[kRuns][kRun];
  uint32_t codes[kNumMoments][kRuns];
  float absmax[kNumMoments];
};

// The lane's runs of a block: [first, first + n) of the shard.
struct LaneRuns {
  int64_t first[kRuns];
  int n[kRuns];
  template <bool kWhole>
  __device__ __forceinline__ static LaneRuns make(int64_t block, int64_t numel, int lane) {
    LaneRuns runs;
#pragma unroll
    for (int r = 0; r < kRuns; ++r) {
      runs.first[r] = block * kQuant8Block + r * (kQuant8Block / kRuns) + lane * kRun;
      const int64_t left = numel - runs.first[r];
      runs.n[r] = kWhole || left >= kRun ? kRun : left > 0 ? static_cast<int>(left) : 0;
    }
    return runs;
  }
};

template <class S, bool kWhole>
__device__ __forceinline__ void load_values(const TypedSlot<S>& a, const LaneRuns& runs,
                                            BlockInputs<S>& in) {
  using P = Master<S::kParam, S::kMaster>;
#pragma unroll
  for (int r = 0; r < kRuns; ++r) {
    const int64_t first = runs.first[r];
    if (kWhole) {
      P::load_vec(a, first, in.p[r]);
      Storage<S::kGrad>::load_vec(a.grad, first, in.g[r]);
    } else {
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        in.p[r][j] = j < runs.n[r] ? P::load(a, first + j) : 0.0f;
        in.g[r][j] = j < runs.n[r] ? Storage<S::kGrad>::load(a.grad, first + j) : 0.0f;
      }
    }
  }
}

template <class S, bool kWhole>
__device__ __forceinline__ void load_codes(const TensorSlot& slot, int64_t block,
                                           const LaneRuns& runs, BlockInputs<S>& in) {
  for_each_moment<S>([&](auto k) {
    const auto* codes = static_cast<const uint8_t*>(slot.state[static_cast<int>(moment_state(k))]);
#pragma unroll
    for (int r = 0; r < kRuns; ++r) {
      const int64_t first = runs.first[r];
      uint32_t w = 0;
      if (kWhole) {
        w = *reinterpret_cast<const uint32_t*>(codes + first);
      } else {
#pragma unroll
        for (int j = 0; j < kRun; ++j)
          w |= j < runs.n[r] ? static_cast<uint32_t>(codes[first + j]) << (8 * j) : 0u;
      }
      in.codes[k][r] = w;
    }
    in.absmax[k] =
        static_cast<const float*>(slot.state[static_cast<int>(moment_absmax_state(k))])[block];
  });
}

// All of a block's inputs (a run's first block, or a block outside the pipeline).
template <class S, bool kWhole>
__device__ __forceinline__ void load_block(const TypedSlot<S>& a, const TensorSlot& slot,
                                           int64_t block, const LaneRuns& runs,
                                           BlockInputs<S>& in) {
  load_values<S, kWhole>(a, runs, in);
  load_codes<S, kWhole>(slot, block, runs, in);
}

template <bool kWhole>
__device__ __forceinline__ void store_codes(uint8_t* codes, int64_t first, int n,
                                            const uint8_t (&c)[kRun]) {
  if (kWhole) {
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < kRun; ++j) w |= static_cast<uint32_t>(c[j]) << (8 * j);
    *reinterpret_cast<uint32_t*>(codes + first) = w;
  } else {
#pragma unroll
    for (int j = 0; j < kRun; ++j)
      if (j < n) codes[first + j] = c[j];
  }
}

template <class S, bool kWhole>
__device__ __forceinline__ void store_run(const TypedSlot<S>& a, int64_t first, int n,
                                          const float (&p)[kRun]) {
  using P = Master<S::kParam, S::kMaster>;
  if (kWhole) {
    P::store_vec(a, first, p);
  } else {
#pragma unroll
    for (int j = 0; j < kRun; ++j)
      if (j < n) P::store(a, first + j, p[j]);
  }
}

// Updates block `block` from its loaded inputs `in`. Calls decoded() once the codes are
// decoded (it may load the warp's next block's codes into `in`), and stored() once the
// params are stored, before the encode (it may load the next block's params and grads):
// nothing of `in` they replace is read after that.
template <ElemType T, class S, bool kL2, bool kWhole, class Decoded, class Stored>
__device__ __forceinline__ void update_block(const TypedSlot<S>& a, const TensorSlot& slot,
                                             int64_t block, const LaneRuns& runs,
                                             BlockInputs<S>& in, const AdamCoeffs<float>& c,
                                             const BlockTables<T>& t, int lane, Decoded decoded,
                                             Stored stored) {
  using Codec = BlockCodec<T>;
  float mom[kNumMoments][kRuns][kRun];
  for_each_moment<S>([&](auto k) {
    const float factor = Codec::decode_factor(in.absmax[k]);
    const auto book = t.book(moment_signed(k));
#pragma unroll
    for (int r = 0; r < kRuns; ++r)
#pragma unroll
      for (int j = 0; j < kRun; ++j)
        mom[k][r][j] =
            j < runs.n[r]
                ? Codec::decode(book, static_cast<uint8_t>(in.codes[k][r] >> (8 * j)), factor)
                : 0.0f;
  });
  decoded();
  const auto lane_c = broadcast<kRun>(c);
#pragma unroll
  for (int r = 0; r < kRuns; ++r) {  // a run's elements side by side (CudaLaneOps)
    CudaLanes<kRun> pr, gr, e[kNumMoments];
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      pr.x[j] = in.p[r][j];
      gr.x[j] = in.g[r][j];
      for_each_moment<S>([&](auto k) { e[k].x[j] = mom[k][r][j]; });
    }
    adam_update<kL2, S::kAmsgrad>(CudaLaneOps<kRun>{}, lane_c, gr, pr, e);
    float p[kRun];
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      p[j] = pr.x[j];
      for_each_moment<S>([&](auto k) { mom[k][r][j] = e[k].x[j]; });
    }
    store_run<S, kWhole>(a, runs.first[r], runs.n[r], p);
  }
  stored();
  // Each moment's absmax bits (quant8_absmax): over the lane, then over the warp, the
  // moments' shuffles side by side.
  uint32_t bits[kNumMoments];
  for_each_moment<S>([&](auto k) {
    bits[k] = 0;
#pragma unroll
    for (int r = 0; r < kRuns; ++r)
#pragma unroll
      for (int j = 0; j < kRun; ++j)
        if (j < runs.n[r])
          bits[k] = quant8_absmax_combine(bits[k], quant8_magnitude_bits(mom[k][r][j]));
  });
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    for_each_moment<S>([&](auto k) {
      bits[k] = quant8_absmax_combine(bits[k], __shfl_xor_sync(0xFFFFFFFFu, bits[k], offset));
    });
  for_each_moment<S>([&](auto k) {
    const float absmax = bits_float(bits[k]);
    const auto factor = Codec::encode_factor(absmax);
    const auto book = t.book(moment_signed(k));
    auto* codes = static_cast<uint8_t*>(slot.state[static_cast<int>(moment_state(k))]);
#pragma unroll
    for (int r = 0; r < kRuns; ++r) {
      uint8_t code[kRun];
#pragma unroll
      for (int j = 0; j < kRun; ++j) code[j] = Codec::encode(book, mom[k][r][j], factor);
      store_codes<kWhole>(codes, runs.first[r], runs.n[r], code);
    }
    if (lane == 0)
      static_cast<float*>(slot.state[static_cast<int>(moment_absmax_state(k))])[block] = absmax;
  });
}

// Tuning knob (bench/cuda_tuning.md): 1 asks L2 for a block of the warp's further along the
// chunk while it updates the current one (the kernel waits on its loads: ncu), one line per
// lane.
#ifndef SA_CUDA_BLOCK_PREFETCH
#define SA_CUDA_BLOCK_PREFETCH 1
#endif
// How far ahead, in the warp's blocks beyond the next (whose loads the pipeline issues
// itself), the L2 prefetch reaches.
#ifndef SA_CUDA_BLOCK_PREFETCH_AHEAD
#define SA_CUDA_BLOCK_PREFETCH_AHEAD 1
#endif
// Tuning knob: 1 loads the next block's codes as soon as the current block's are decoded
// (6 registers more, live through the update), 0 with its params and grads.
#ifndef SA_CUDA_BLOCK_EARLY_CODES
#define SA_CUDA_BLOCK_EARLY_CODES 1
#endif

__device__ __forceinline__ void prefetch_lines(const void* base, int64_t bytes, int lane) {
  if (base != nullptr && lane * 128 < bytes)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(base) + lane * 128));
}

// The lines of block b's arrays (param, grad, master, each moment's codes), lane i the i-th
// line of each; the caller keeps b within the slot.
template <class S>
__device__ __forceinline__ void prefetch_block(const TypedSlot<S>& a, int64_t b, int lane) {
  const int64_t first = b * kQuant8Block;
  prefetch_lines(a.param + first, kQuant8Block * sizeof(*a.param), lane);
  prefetch_lines(a.grad + first, kQuant8Block * sizeof(*a.grad), lane);
  if (S::kMaster != MasterKind::none)
    prefetch_lines(a.master + first, kQuant8Block * sizeof(*a.master), lane);
  for_each_moment<S>([&](auto k) {
    prefetch_lines(reinterpret_cast<const uint8_t*>(a.moment[k]) + first, kQuant8Block, lane);
  });
}

// The blocks of one chunk, a warp per block. A run of whole blocks is pipelined: each
// block's update loads the warp's next block while it runs (update_block's decoded and
// stored).
template <ElemType T, class S, bool kL2>
__device__ void update_chunk(const ChunkWork& w, const BlockTables<T>& t) {
  const TypedSlot<S> a(w.slot);
  bool vec_ok = param_vec_aligned(a);
  for_each_moment<S>([&](auto k) {
    vec_ok = vec_ok && aligned(w.slot.state[static_cast<int>(moment_state(k))], kRun);
  });
  const int warps = static_cast<int>(blockDim.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t numel = w.slot.numel;
  const auto mine = [&](int64_t b) { return b * kQuant8Block < w.end; };
  const auto whole = [&](int64_t b) { return vec_ok && (b + 1) * kQuant8Block <= numel; };
  const auto prefetch = [&](int64_t b) {
    if (SA_CUDA_BLOCK_PREFETCH && mine(b)) prefetch_block(a, b, lane);
  };
  int64_t b = w.begin / kQuant8Block + static_cast<int>(threadIdx.x) / 32;
  while (mine(b)) {
    BlockInputs<S> in;
    if (whole(b)) {
      auto runs = LaneRuns::make<true>(b, numel, lane);
      load_block<S, true>(a, w.slot, b, runs, in);
      for (bool more = true; more;) {
        const int64_t next = b + warps;
        const auto next_runs = LaneRuns::make<true>(next, numel, lane);
        more = mine(next) && whole(next);
        prefetch(next + SA_CUDA_BLOCK_PREFETCH_AHEAD * warps);
        const auto next_codes = [&] {
          if (more && SA_CUDA_BLOCK_EARLY_CODES) load_codes<S, true>(w.slot, next, next_runs, in);
        };
        const auto next_values = [&] {
          if (more) load_values<S, true>(a, next_runs, in);
          if (more && !SA_CUDA_BLOCK_EARLY_CODES) load_codes<S, true>(w.slot, next, next_runs, in);
        };
        update_block<T, S, kL2, true>(a, w.slot, b, runs, in, w.coeffs.c, t, lane, next_codes,
                                      next_values);
        b = next;
        runs = next_runs;
      }
    } else {
      const auto runs = LaneRuns::make<false>(b, numel, lane);
      load_block<S, false>(a, w.slot, b, runs, in);
      update_block<T, S, kL2, false>(
          a, w.slot, b, runs, in, w.coeffs.c, t, lane, [] {}, [] {});
      b += warps;
    }
  }
}

// T: the bucket's block storage; S: the float32-moment Signature of its Variant.
template <ElemType T, class S>
__global__ void __launch_bounds__(kCudaBlockThreads, kBlockMomentBlocksPerSm)
    adam_bucket_kernel_blocks(DeviceBucket bucket, DeviceStep step) {
  if (step.verdict->skip) return;
  __shared__ BlockTables<T> tables;
  tables.load();
  __syncthreads();
  for (int64_t chunk = blockIdx.x; chunk < bucket.num_chunks; chunk += gridDim.x) {
    ChunkWork w;
    if (!chunk_work(bucket, step, chunk, w)) continue;
    if (w.coeffs.l2)
      update_chunk<T, S, true>(w, tables);
    else
      update_chunk<T, S, false>(w, tables);
  }
}

template <ElemType T, class S>
cudaError_t launch_typed_blocks(const DeviceBucket& bucket, const DeviceStep& step,
                                cudaStream_t stream) {
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int64_t grid = std::min<int64_t>(bucket.num_chunks, int64_t{sms} * kBlockMomentBlocksPerSm);
  adam_bucket_kernel_blocks<T, S>
      <<<static_cast<unsigned>(grid), kCudaBlockThreads, 0, stream>>>(bucket, step);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_adam_bucket_blocks(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                                      cudaStream_t st) {
  if (b.num_chunks == 0) return cudaSuccess;
  Variant inner = v;  // a block storage: the float32 Variant's update, per block
  inner.moment = ElemType::f32;
  cudaError_t err = cudaErrorInvalidValue;  // the core never builds a Variant not in the table
  visit_block_storage(v.moment, [&](auto tag) {
    visit_variant(inner, [&](auto signature) {
      err = launch_typed_blocks<decltype(tag)::value, decltype(signature)>(b, s, st);
    });
  });
  return err;
}

}  // namespace kernels
}  // namespace sa
