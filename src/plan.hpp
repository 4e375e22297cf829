// src/plan.hpp — the launch plan: params grouped into buckets by Variant, one TensorSlot
// per non-empty shard. Built once after params change; a step only rebinds grads.
#ifndef SHARDADAM_SRC_PLAN_HPP_
#define SHARDADAM_SRC_PLAN_HPP_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../kernels/bucket_table.h"
#include "../kernels/muon_math.h"

namespace sa {

struct Param;

// Where a param's state lives and who steps it (sa_state_placement). It is part of a
// bucket's key, so a bucket's state is all in one memory, and the kernels never know it:
// host state is streamed through a device ring (or, for fp8 params, read in place where it
// is mapped); host_cpu_step state stays where it is and the host's threads step it, on the
// param and grad brought down into a host mirror.
enum class StatePlacement : uint8_t { device = 0, host = 1, host_cpu_step = 2 };

// Whether state of `placement` lives in host memory (Backend::allocate_state).
inline bool on_host(StatePlacement placement) { return placement != StatePlacement::device; }

// A step over state on the host streams it through a ring of kStagingSlots device buffers
// of kStagingSlotBytes each: a segment's state goes up into a ring slot, the bucket's kernel
// updates it there, and it goes down again, while the next segment goes up and the one
// before goes down. Device memory for state on the host: the ring, whatever the model.
constexpr std::size_t kStagingSlotBytes = std::size_t{32} << 20;
constexpr int kStagingSlots = 3;

// One state of a staged piece: `bytes` at host_offset from the slot's state buffer, at
// ring_offset in the ring slot of its segment.
struct StagedRun {
  StateKind kind;
  std::size_t host_offset;
  std::size_t ring_offset;
  std::size_t bytes;
};

// Elements [first, first + count) of a bucket's slot, and where each of its states goes.
// `first` is a multiple of kernels::kQuant8Block, so a block moment's blocks are the slot's.
struct StagedPiece {
  int32_t slot;
  int64_t first;
  int64_t count;
  std::vector<StagedRun> runs;
};

// One copy of a segment, up before its kernel and down after: `bytes` of host state at
// `host` (runs of one kind of adjacent pieces, whose states lie next to each other) and at
// ring_offset in the segment's ring slot.
struct StagedCopy {
  char* host;
  std::size_t ring_offset;
  std::size_t bytes;
};

// What one ring slot holds at a time: its pieces, and the copies that move their state.
struct StagedSegment {
  std::vector<StagedPiece> pieces;
  std::vector<StagedCopy> copies;
  std::size_t bytes = 0;  // of the ring slot
  int ring_slot =
      0;  // the one it streams through: its place among the plan's, modulo kStagingSlots
};
constexpr std::size_t kStagingAlign = 256;

// A piece of a bucket stepped by the CPU (StatePlacement::host_cpu_step): elements
// [first, first + count) of slot `slot`, whose param and grad come down into the mirror
// slot of its segment at param_offset and grad_offset (the param goes back up from there).
// `first` is a multiple of kernels::kQuant8Block, as a StagedPiece's.
struct MirroredPiece {
  int32_t slot;
  int64_t first;
  int64_t count;
  std::size_t param_offset;
  std::size_t grad_offset;
  void* state[kNumStateKinds];  // the slot's, at the piece's first element (or block)
};

// What one mirror slot (host memory, kStagingSlotBytes) holds at a time.
struct MirroredSegment {
  std::vector<MirroredPiece> pieces;
  int ring_slot = 0;  // its place among the plan's mirrored segments, modulo kStagingSlots
};

// A matrix of a Muon bucket: rows x cols (its global shape). Whole on this rank, row-major
// in its slot, when `gathered` is -1; else split across ranks and stepped as
// Plan::gathered[gathered] says.
struct MatrixShape {
  int64_t rows;
  int64_t cols;
  int32_t gathered = -1;
};

// A Muon matrix split across ranks (is_sharded). Every rank's plan lists the same ones, in
// param order, empty shards too. Their whole directions lie in one buffer of
// Plan::gather_elems doubles (backend memory), in Plan::gather_ranks chunks of
// Plan::gather_chunk (lay_out_gathered): a matrix at `offset`, in its owner's chunk. At each
// step every rank writes its box's direction at the matrix's offset (primary replicas
// only: zeros elsewhere); the chunks are summed across the ranks, each owner's chunk to its
// owner (with one chunk: every rank owns every matrix, and the whole buffer is summed);
// each owner orthogonalizes its matrices in place; the chunks are gathered to every rank;
// and each rank applies its box of each result (kernels::MatrixBox).
struct GatheredMatrix {
  kernels::MatrixBox box;
  int64_t param;        // its param's index
  bool contributes;     // a primary replica: its box is summed into the direction
  int64_t offset = 0;   // of the whole direction in the buffer, in elements
  bool owned = false;   // this rank orthogonalizes it
  int32_t bucket = -1;  // this rank's slot of the matrix; -1 for an empty shard
  int32_t slot = -1;
};

struct Bucket {
  kernels::Variant variant;
  StatePlacement placement = StatePlacement::device;
  std::vector<kernels::TensorSlot> slots;
  std::vector<int64_t> param_of_slot;       // slot i updates param param_of_slot[i]
  std::vector<MatrixShape> matrix_of_slot;  // a Muon bucket's: slot i's matrix; else empty
  int64_t numel = 0;
  bool grads_moved = false;  // a grad pointer changed since the backend saw the slots
  // State on the host, streamed through the ring, segment by segment, in slot order. Empty
  // for state on the device, and for fp8 params (scaling != none), whose kernels read their
  // host state in place (a current scaling's cast reads the master again after the amax
  // is reduced).
  std::vector<StagedSegment> segments;
  // State stepped by the CPU: the segments its param and grad go through, in slot order.
  // Empty for every other placement.
  std::vector<MirroredSegment> mirrored;
};

// A Muon slot's momentum_buffer (float32: kernels::kMuonVariant).
inline float* momentum_buffer_of(const kernels::TensorSlot& slot) {
  return static_cast<float*>(slot.state[static_cast<std::size_t>(StateKind::momentum_buffer)]);
}

struct Plan {
  std::vector<Bucket> buckets;
  std::vector<kernels::CurrentScale> current;  // every current-scaled param, in param order
  std::vector<GatheredMatrix> gathered;        // every split Muon matrix, in param order
  int32_t gather_ranks = 0;                    // their buffer's chunks (0: not laid out)
  int32_t gather_rank = 0;                     // this rank's chunk
  int64_t gather_chunk = 0;                    // elements a chunk
  int64_t gather_elems = 0;                    // gather_ranks * gather_chunk
};

// Lays Plan::gathered out in `ranks` chunks, as rank `rank` of them (0 <= rank < ranks): each
// matrix gets an owner, the rank whose chunk it lies in. Owners are balanced by Newton-
// Schulz's flops (~ min(rows, cols)^2 max(rows, cols) a step; largest first, each to the
// least loaded rank, the lowest on a tie), so every rank that lays out the same matrices
// with the same `ranks` picks the same owners. A chunk holds its owner's matrices in param
// order; gather_chunk is the largest owner's elements. With one chunk, this rank owns all.
void lay_out_gathered(Plan& plan, int32_t rank, int32_t ranks);

// The slot of a split matrix that this rank steps: its own box, when it holds one and has a
// grad at this step; else NULL (an empty shard, or no grad: nothing of it to step here).
// (Inline, as staged_slot.)
inline const kernels::TensorSlot* stepped_slot(const Plan& plan, const GatheredMatrix& g) {
  if (g.bucket < 0) return nullptr;
  const kernels::TensorSlot& slot =
      plan.buckets[static_cast<std::size_t>(g.bucket)].slots[static_cast<std::size_t>(g.slot)];
  return slot.grad != nullptr ? &slot : nullptr;
}

// The slot of param `index`, as a plan holds it, with no grad (rebind_grads binds them).
kernels::TensorSlot slot_of(const Param& p, int64_t index);

// The slot of `bucket`'s piece `piece`, its state in the ring slot at `ring` (device
// memory): param and grad advanced to the piece's first element. (Inline: the CUDA
// backend's module builds these tables, and links no core code.)
inline kernels::TensorSlot staged_slot(const Bucket& bucket, const StagedPiece& piece, char* ring) {
  kernels::TensorSlot slot = bucket.slots[static_cast<std::size_t>(piece.slot)];
  slot.param =
      static_cast<char*>(slot.param) + piece.first * kernels::elem_bytes(bucket.variant.param);
  if (slot.grad != nullptr)
    slot.grad = static_cast<const char*>(slot.grad) +
                piece.first * kernels::elem_bytes(bucket.variant.grad);
  for (const StagedRun& run : piece.runs)
    slot.state[static_cast<std::size_t>(run.kind)] = ring + run.ring_offset;
  slot.numel = piece.count;
  return slot;
}

// The slot of `bucket`'s mirrored piece `piece`, its param and grad in the mirror slot at
// `mirror` (host memory) and its state where it lives (host memory), at the piece's first
// element: what the host's Adam reads and writes. (Inline, as staged_slot.)
inline kernels::TensorSlot mirrored_slot(const Bucket& bucket, const MirroredPiece& piece,
                                         char* mirror) {
  kernels::TensorSlot slot = bucket.slots[static_cast<std::size_t>(piece.slot)];
  slot.param = mirror + piece.param_offset;
  slot.grad = mirror + piece.grad_offset;
  for (std::size_t k = 0; k < kNumStateKinds; ++k) slot.state[k] = piece.state[k];
  slot.numel = piece.count;
  return slot;
}

// Buckets in order of first appearance; empty shards get no slot (so they cost nothing
// and cannot overrun anything). No slot has a grad yet: rebind_grads binds them.
Plan build_plan(const std::vector<const Param*>& params);

// Copies step_grads[i], the grad param i's step reads (NULL: none), into its slot, marking
// the buckets where one moved; with a `subset` (non-empty), params i without subset[i] get
// NULL (not stepped).
void rebind_grads(Plan& plan, const std::vector<const void*>& step_grads,
                  const std::vector<uint8_t>& subset = {});

}  // namespace sa

#endif  // SHARDADAM_SRC_PLAN_HPP_
