// kernels/cuda/adam_block_kernel.cuh — the CUDA Adam kernel for block moments
// (kernels/block_moment.h: q8, f8e4m3). Included only by adam_block_part.cu, once per part
// of the build (adam_block_parts.cuh): everything here but launch_adam_bucket_blocks_part is
// internal to that part's translation unit. Tables, chunks and the step's verdict as in
// adam_cuda.cu; the element update is the float32-moment Variant's, between a decode and an
// encode of each 256-element block.
#ifndef SHARDADAM_KERNELS_CUDA_ADAM_BLOCK_KERNEL_CUH_
#define SHARDADAM_KERNELS_CUDA_ADAM_BLOCK_KERNEL_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../block_moment.h"
#include "../guided.h"
#include "../variants.h"
#include "adam_block_parts.cuh"
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
// run's kRun elements go through adam_update side by side (CudaLaneOps). q8 encodes a block
// of finite absmax by one shared-memory table read per code (quant8.h's key tables; 20%
// fewer instructions than the bucket search's two reads and clamps).
//
// The grid is persistent (kBlockMomentBlocksPerSm thread blocks per multiprocessor, each taking
// stretches of the chunks as it asks for them), so each thread block builds q8's tables in
// shared memory once per launch, not once per chunk.
static_assert(kCudaChunkElems % kQuant8Block == 0, "chunks start on q8 block boundaries");

// Tuning knobs (bench/cuda_tuning.md): threads per thread block and resident thread blocks
// per multiprocessor, which set the register budget (65536 / (512 * 1) = 128 per thread:
// the pipelined loads need them; at 96 or 80 the kernel spills) and the grid. One thread
// block of 512 per multiprocessor rather than two of 256 keeps one copy of q8's tables in
// shared memory instead of two (79 KB each), which leaves the L1 cache more room: (f) 2.5%
// faster at the same 16 warps.
#ifndef SA_CUDA_BLOCK_MOMENT_THREADS
#define SA_CUDA_BLOCK_MOMENT_THREADS 512
#endif
#ifndef SA_CUDA_BLOCK_MOMENT_BLOCKS_PER_SM
#define SA_CUDA_BLOCK_MOMENT_BLOCKS_PER_SM 1
#endif
constexpr int kBlockMomentThreads = SA_CUDA_BLOCK_MOMENT_THREADS;
constexpr int kBlockMomentBlocksPerSm = SA_CUDA_BLOCK_MOMENT_BLOCKS_PER_SM;

// A lane's run of codes as one word, the first in the low byte.
constexpr int kRun = kVec / 2;
static_assert(kRun == 4, "a run's codes are one 32-bit word");

template <int N>
__device__ __forceinline__ uint32_t pack_codes(const uint8_t (&c)[N]) {
  uint32_t w = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) w |= static_cast<uint32_t>(c[j]) << (8 * j);
  return w;
}

// What a block storage's codes need in shared memory (the kernel's dynamic shared memory,
// kBlockTableBytes of it), and its encode of a lane's run of a block: for q8 the two code
// books (Quant8Book) to decode and the two key tables (quant8.h's Quant8KeyTable) to
// encode, [0] signed (exp_avg), [1] unsigned; nothing for f8e4m3, which encodes by its codec.
template <ElemType T>
struct BlockTables {
  static constexpr bool kFinitePath = false;  // encode<kSigned, true> is encode<kSigned, false>
  __device__ void load() {}
  __device__ typename BlockCodec<T>::Book book(bool) const { return {}; }
  template <bool kSigned, bool kFinite>
  __device__ __forceinline__ uint32_t encode(float absmax, const float (&x)[kRun]) const {
    const auto factor = BlockCodec<T>::encode_factor(absmax);
    uint8_t code[kRun];
#pragma unroll
    for (int j = 0; j < kRun; ++j) code[j] = BlockCodec<T>::encode({}, x[j], factor);
    return pack_codes(code);
  }
};

template <>
struct BlockTables<ElemType::q8> {
  uint32_t map[2][256];
  uint32_t signed_keys[quant8_keys(true).count];
  uint32_t unsigned_keys[quant8_keys(false).count];
  int32_t mid_keys[2][256];  // scratch of load()
  __device__ void load();
  __device__ Quant8Book book(bool is_signed) const { return {map[is_signed ? 0 : 1], {}, {}}; }
  // kFinite (the caller has checked that the block's absmax is finite: every |x * inverse|
  // < 1.0078, no NaN): by the key table, the codes picked out of the sums by byte permutes.
  // Otherwise (an infinite or NaN absmax, rare) by quant8_search, the same codes as the
  // CPU's quant8_code.
  static constexpr bool kFinitePath = true;
  template <bool kSigned, bool kFinite>
  __device__ __forceinline__ uint32_t encode(float absmax, const float (&x)[kRun]) const {
    const float inverse = quant8_inverse(absmax);
    if constexpr (kFinite) {
      constexpr Quant8KeyTable k = quant8_keys(kSigned);
      static_assert(k.code_bit % 8 == 0, "the code is a byte of the sum");
      constexpr uint32_t b = k.code_bit / 8, pick = b | (b + 4) << 4;  // byte b of each
      const uint32_t* entries = kSigned ? signed_keys : unsigned_keys;
      uint32_t sum[kRun];
#pragma unroll
      for (int j = 0; j < kRun; ++j)
        sum[j] = quant8_key_sum(k, entries, quant8_key(kSigned, x[j] * inverse));
      return __byte_perm(__byte_perm(sum[0], sum[1], pick), __byte_perm(sum[2], sum[3], pick),
                         0x5410);
    } else {
      uint8_t code[kRun];
#pragma unroll
      for (int j = 0; j < kRun; ++j)
        code[j] = quant8_search(map[kSigned ? 0 : 1], quant8_scaled(x[j], inverse));
      return pack_codes(code);
    }
  }
};

// The dynamic shared memory of the kernel for storage T.
template <ElemType T>
constexpr int kBlockTableBytes = std::is_empty<BlockTables<T>>::value ? 0 : sizeof(BlockTables<T>);

// Copies the code books and fills the key tables, each thread a slice of each
// (quant8_fill_keys_part); the caller syncs the block before reading them.
__device__ void BlockTables<ElemType::q8>::load() {
  BlockTables& t = *this;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    t.map[0][i] = kQuant8SignedMap[i];
    t.map[1][i] = kQuant8UnsignedMap[i];
  }
  __syncthreads();
  for (int j = threadIdx.x; j < 255; j += blockDim.x) {
    t.mid_keys[0][j] = quant8_mid_key(t.map[0], true, j);
    t.mid_keys[1][j] = quant8_mid_key(t.map[1], false, j);
  }
  __syncthreads();
  const auto part = static_cast<int32_t>(threadIdx.x), parts = static_cast<int32_t>(blockDim.x);
  quant8_fill_keys_part(quant8_keys(true), t.mid_keys[0], part, parts, t.signed_keys);
  quant8_fill_keys_part(quant8_keys(false), t.mid_keys[1], part, parts, t.unsigned_keys);
}

// A lane's elements of a q8 block: two runs of kRun, at lane * kRun in each half of the
// block, so that each access of a warp covers one contiguous run of the block (512 bytes
// of a float32 array, 128 of the codes).
constexpr int kRuns = 2;
static_assert(kQuant8Block == kRuns * 32 * kRun, "two runs of kRun per lane cover a block");

// A lane's share of a block, as loaded: the param (full precision) and grad of each run,
// and each moment's codes (a run's kRun codes as one word, the first in the low byte) and
// absmax. Loading is apart from the update so that a warp can issue its next block's loads
// while it updates the current one (update_run).
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
__device__ __forceinline__ void store_codes(uint8_t* codes, int64_t first, int n, uint32_t w) {
  if (kWhole) {
    *reinterpret_cast<uint32_t*>(codes + first) = w;
  } else {
#pragma unroll
    for (int j = 0; j < kRun; ++j)
      if (j < n) codes[first + j] = static_cast<uint8_t>(w >> (8 * j));
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
  // The encode, with every moment's absmax finite (BlockTables' kFinitePath) or not: one
  // branch per block, the same way for the whole warp.
  const auto encode = [&](auto finite) {
    for_each_moment<S>([&](auto k) {
      constexpr bool kSigned = moment_signed(decltype(k){});
      auto* codes = static_cast<uint8_t*>(slot.state[static_cast<int>(moment_state(k))]);
#pragma unroll
      for (int r = 0; r < kRuns; ++r)
        store_codes<kWhole>(
            codes, runs.first[r], runs.n[r],
            t.template encode<kSigned, decltype(finite)::value>(bits_float(bits[k]), mom[k][r]));
    });
  };
  bool finite = BlockTables<T>::kFinitePath;
  for_each_moment<S>([&](auto k) { finite = finite && bits[k] < 0x7F800000u; });
  if (finite)
    encode(std::true_type{});
  else
    encode(std::false_type{});
  if (lane == 0)
    for_each_moment<S>([&](auto k) {
      static_cast<float*>(slot.state[static_cast<int>(moment_absmax_state(k))])[block] =
          bits_float(bits[k]);
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

// The one line of a block's arrays that a lane asks L2 for: lane i the i-th line of the
// param's, grad's, master's and each moment's codes (in that order: 20 lines for float32
// params and grads, 26 at most), found once per run so that a prefetch costs an address
// and the instruction. A lane past the lines asks for nothing.
template <class S>
struct PrefetchLine {
  const char* line = nullptr;  // the lane's line in block 0
  int64_t block_bytes = 0;     // its array's bytes per block

  __device__ __forceinline__ static PrefetchLine make(const TypedSlot<S>& a, int lane) {
    PrefetchLine p;
    int i = lane;
    const auto take = [&](const void* array, int elem_bytes) {
      const int lines = static_cast<int>(kQuant8Block) * elem_bytes / 128;
      if (i >= 0 && i < lines) {
        p.line = static_cast<const char*>(array) + 128 * i;
        p.block_bytes = kQuant8Block * elem_bytes;
      }
      i -= lines;
    };
    take(a.param, sizeof(*a.param));
    take(a.grad, sizeof(*a.grad));
    if (S::kMaster != MasterKind::none) take(a.master, sizeof(*a.master));
    for_each_moment<S>([&](auto k) { take(a.moment[k], 1); });  // q8 / f8 codes
    return p;
  }
  __device__ __forceinline__ void operator()(int64_t b) const {
    if (line != nullptr) asm volatile("prefetch.global.L2 [%0];" ::"l"(line + b * block_bytes));
  }
};

// The blocks of w's elements (a run of a slot's chunks), a warp per block. A run of whole
// blocks is pipelined: each block's update loads the warp's next block while it runs
// (update_block's decoded and stored).
template <ElemType T, class S, bool kL2>
__device__ void update_run(const ChunkWork& w, const BlockTables<T>& t) {
  const TypedSlot<S> a(w.slot);
  bool vec_ok = param_vec_aligned(a);
  for_each_moment<S>([&](auto k) {
    vec_ok = vec_ok && aligned(w.slot.state[static_cast<int>(moment_state(k))], kRun);
  });
  const int warps = static_cast<int>(blockDim.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t numel = w.slot.numel;
  const auto mine = [&](int64_t b) { return b * kQuant8Block < w.end; };
  const auto whole = [&](int64_t b) { return vec_ok && (b + 1) * kQuant8Block <= numel; };
  const auto prefetch_line = PrefetchLine<S>::make(a, lane);
  const auto prefetch = [&](int64_t b) {
    if (SA_CUDA_BLOCK_PREFETCH && mine(b)) prefetch_line(b);
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

// Chunks [first, last) of the bucket, a slot at a time: a warp's blocks run on across the
// chunks of a slot, so its pipeline and the L2 prefetch restart only where a slot or a
// stretch begins (with chunks dealt out in turn they restarted at every chunk, a warp's 8
// blocks: a quarter of the blocks came unprefetched).
template <ElemType T, class S>
__device__ void update_stretch(const DeviceBucket& bucket, const DeviceStep& step, int64_t first,
                               int64_t last, const BlockTables<T>& tables) {
  // The slot of the stretch's first chunk is searched for once; from there the runs walk
  // the slots (a search per run was 1.2% of the (f) launch's stall samples).
  int32_t s = slot_of_chunk(bucket, first);
  for (int64_t chunk = first; chunk < last;) {
    while (bucket.chunk_offsets[s + 1] <= chunk) ++s;  // past a run's slot, and empty ones
    const int64_t run_end = min(last, bucket.chunk_offsets[s + 1]);
    ChunkWork w;
    if (chunk_work(bucket, step, s, chunk, w)) {
      w.end = min(w.slot.numel, (run_end - bucket.chunk_offsets[s]) * kCudaChunkElems);
      if (w.coeffs.l2)
        update_run<T, S, true>(w, tables);
      else
        update_run<T, S, false>(w, tables);
    }
    chunk = run_end;
  }
}

// The next stretch for a thread block that asks (thread 0): the next of the bucket's
// counter of stretches handed out (DeviceBucket::work[0]).
__device__ __forceinline__ Stretch take_stretch(const DeviceBucket& bucket) {
  return guided_stretch(atomicAdd(&bucket.work[0], 1u), static_cast<uint32_t>(bucket.num_chunks),
                        gridDim.x);
}

// T: the bucket's block storage; S: the float32-moment Signature of its Variant.
//
// The thread blocks take the chunks in stretches, as they ask (take_stretch). With one
// stretch per thread block fixed in advance, the multiprocessors of bench/gpu_step's (f)
// launch were busy 78% to 100% of it, 94% on average (ncu sm__cycles_active): the thread
// blocks' speeds differ, not only their work; asking made (f) 2% faster. Thread 0 asks for
// the next stretch as the current one begins, so the answer's latency is hidden behind the
// work; the last thread block to finish zeroes the counters for the next launch.
template <ElemType T, class S>
__global__ void __launch_bounds__(kBlockMomentThreads, kBlockMomentBlocksPerSm)
    adam_bucket_kernel_blocks(DeviceBucket bucket, DeviceStep step) {
  if (step.verdict->skip) return;
  extern __shared__ uint4 shared[];  // kBlockTableBytes<T>
  BlockTables<T>& tables = *reinterpret_cast<BlockTables<T>*>(shared);
  __shared__ Stretch stretch[2];  // the one being worked on, and the next
  if (threadIdx.x == 0) stretch[0] = take_stretch(bucket);
  tables.load();
  __syncthreads();
  for (int k = 0;; k ^= 1) {
    const Stretch mine = stretch[k];
    if (mine.first == mine.last) break;
    Stretch next{};
    if (threadIdx.x == 0) next = take_stretch(bucket);
    update_stretch<T, S>(bucket, step, mine.first, mine.last, tables);
    if (threadIdx.x == 0) stretch[k ^ 1] = next;
    __syncthreads();  // stretch[k] is read by all before thread 0 writes it again
  }
  if (threadIdx.x == 0) {
    __threadfence();  // this thread block's last take_stretch before it counts itself done
    if (atomicAdd(&bucket.work[1], 1u) == gridDim.x - 1) {
      bucket.work[0] = 0;
      bucket.work[1] = 0;
    }
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
  constexpr int kBytes = kBlockTableBytes<T>;
  if (kBytes > 48 * 1024) {  // past what a launch gets without asking
    err = cudaFuncSetAttribute(adam_bucket_kernel_blocks<T, S>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
    if (err != cudaSuccess) return err;
  }
  adam_bucket_kernel_blocks<T, S>
      <<<static_cast<unsigned>(grid), kBlockMomentThreads, kBytes, stream>>>(bucket, step);
  return cudaGetLastError();
}

}  // namespace

template <int kPart>
cudaError_t launch_adam_bucket_blocks_part(const Variant& v, const DeviceBucket& b,
                                           const DeviceStep& s, cudaStream_t st) {
  Variant inner = v;  // a block storage: the float32 Variant's update, per block
  inner.moment = ElemType::f32;
  cudaError_t err = cudaErrorInvalidValue;  // not a Variant of this part
  visit_block_storage(v.moment, [&](auto tag) {
    constexpr ElemType kStorage = decltype(tag)::value;
    visit_variant(inner, [&](auto signature) {
      using S = decltype(signature);
      // visit_variant instantiates this for every moment storage of the table; the block
      // kernel's update is the float32-moment Signature's only.
      if constexpr (S::kMoment == ElemType::f32 &&
                    block_kernel_part(with_moment(S::kVariant, kStorage)) == kPart)
        err = launch_typed_blocks<kStorage, S>(b, s, st);
    });
  });
  return err;
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CUDA_ADAM_BLOCK_KERNEL_CUH_
