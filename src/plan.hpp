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
// param order, empty shards too. Their directions lie in one buffer of Plan::gather_elems
// floats (backend memory; the directions are floats, and so are their orthogonalizations),
// which lay_out_gathered lays out in one of two ways.
// - Exchanged (the communicator says its ranks: Plan::gather_ranks > 1): the buffer holds
//   this rank's boxes, each on its own (`dir`, ld = box_cols), in param order; then the
//   whole directions of the matrices it owns (`whole`); then staging for pieces that are
//   not contiguous in their whole. Each matrix has one owner, among the ranks that hold a
//   box of it. At each step every rank writes its boxes' directions; each distinct box goes
//   from one of its holders to the owner (Plan::to_owners); the owner orthogonalizes the
//   whole; and each box goes back to every rank that holds it (Plan::from_owners). A rank
//   holds its boxes and its owned matrices: about 2/nranks of all split matrices, not all.
// - Summed (one rank, or a host communicator that does not say its ranks: gather_ranks
//   == 1): every rank owns every matrix; the buffer is their whole directions, each rank
//   writes its box's direction in place (`dir` inside `whole`, ld = cols; primary replicas
//   only: zeros elsewhere), and an all-reduce sums them (in doubles: x + 0 is exact).
// Each rank then applies its box of the result, read where it wrote the direction.
struct GatheredMatrix {
  kernels::MatrixBox box;  // this rank's box (kernels::MatrixBox)
  int64_t param;           // its param's index
  bool primary;            // a primary replica of its box (primary_replica)
  // Writes its box's direction: summed, the primary replica; exchanged, the box's source.
  bool contributes = false;
  int64_t dir = 0;  // the box's direction and result: at gather + dir, row r at + r * ld
  int64_t ld = 0;
  int64_t whole = -1;   // this rank owns it: its whole direction at gather + whole; else -1
  int32_t bucket = -1;  // this rank's slot of the matrix; -1 for an empty shard
  int32_t slot = -1;
};

// A copy of a rows x cols box of floats within the gather buffer: row r from
// gather + from + r * from_ld to gather + to + r * to_ld.
struct BoxCopy {
  int64_t from, from_ld, to, to_ld, rows, cols;
};

// `count` floats at gather + at, sent to or received from rank `peer`.
struct Transfer {
  int32_t peer;
  int64_t at;
  int64_t count;
};

// One movement of the split matrices' directions between ranks: the copies within this
// rank (`before`, which the transfers need or which need none), the transfers (a rank's
// sends to a peer and the peer's receives from it are listed in the same order), then the
// copies of what was received (`after`). Stream-ordered, in that order. The transfers go in
// rounds (sends and recvs up to each round's ends), the same number on every rank, each
// round whole matrices' transfers, so that what a round sends is received in that round:
// NCCL takes at most 2048 operations in a group (its documented limit).
struct MatrixExchange {
  struct Round {
    std::size_t sends_end, recvs_end;
  };
  std::vector<BoxCopy> before;
  std::vector<Transfer> sends, recvs;
  std::vector<Round> rounds;
  std::vector<BoxCopy> after;
};

// The most transfers a rank makes in one round of a MatrixExchange (sends and receives).
constexpr int64_t kTransfersPerRound = 1024;

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
  // slots[i].grad again, packed: rebind_grads compares these 8 bytes a slot, not a slot's
  // cache line each (at 100k params, 13.6 MB of slots against 0.8 MB; an engine that hands
  // over grads at every step walks them at every step). Written only with the slots.
  std::vector<const void*> slot_grads;
};

struct Plan {
  std::vector<Bucket> buckets;
  std::vector<kernels::CurrentScale> current;  // every current-scaled param, in param order
  std::vector<GatheredMatrix> gathered;        // every split Muon matrix, in param order
  // Their layout (GatheredMatrix), by lay_out_gathered: 0 ranks until it runs (the step
  // lays it out for its communicator), 1 summed, more exchanged.
  int32_t gather_ranks = 0;
  int64_t gather_elems = 0;               // the buffer
  int64_t gather_zero = 0;                // its first elements, which the gather pass zeroes
  MatrixExchange to_owners, from_owners;  // exchanged only
};

// Lays Plan::gathered out for rank `rank` of `ranks` (GatheredMatrix). With one rank:
// summed (and with its `boxes` given, each must be its whole matrix). With more:
// exchanged, by `boxes`, every rank's box of every split matrix
// (boxes[r * gathered.size() + m]: rank r's of matrix m; box_rows or box_cols 0: none).
// Owners are balanced by Newton-Schulz's flops (~ min(rows, cols)^2 max(rows, cols) a
// step): largest first, each to the least loaded rank that holds a box of it, the lowest on
// a tie; so every rank that lays out the same boxes picks the same owners. A distinct box
// (replicas hold the same one) goes to the owner from the owner itself when it holds one,
// else from its lowest holder. Throws SA_ERR_MISMATCH, changing nothing, when a matrix's
// distinct boxes do not cover it exactly once or a rank's matrix has another shape.
// `per_round`: kTransfersPerRound, or fewer (tests).
void lay_out_gathered(Plan& plan, int32_t rank, int32_t ranks,
                      const std::vector<kernels::MatrixBox>& boxes = {},
                      int64_t per_round = kTransfersPerRound);

// The slot of a split matrix that this rank steps: its own box, when it holds one and has a
// grad at this step; else NULL (an empty shard, or no grad: nothing of it to step here).
// (Inline, as staged_slot.)
inline const kernels::TensorSlot* stepped_slot(const Plan& plan, const GatheredMatrix& g) {
  if (g.bucket < 0) return nullptr;
  const kernels::TensorSlot& slot =
      plan.buckets[static_cast<std::size_t>(g.bucket)].slots[static_cast<std::size_t>(g.slot)];
  return slot.grad != nullptr ? &slot : nullptr;
}

// The Variant of the bucket that holds this rank's slot of a split matrix (one stepped_slot
// found).
inline const kernels::Variant& gathered_variant(const Plan& plan, const GatheredMatrix& g) {
  return plan.buckets[static_cast<std::size_t>(g.bucket)].variant;
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
