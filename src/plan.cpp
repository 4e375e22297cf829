#include "plan.hpp"

#include <algorithm>
#include <cstdint>

#include "dtype.hpp"
#include "errors.hpp"
#include "param.hpp"
#include "state_io/box.hpp"

namespace sa {
namespace {

std::size_t align_up(std::size_t n) {
  return (n + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
}

// The bytes of `kind` that elements [first, first + count) of `p` take, and where they start.
StagedRun state_run(const Param& p, StateKind kind, int64_t first, int64_t count) {
  const auto size = static_cast<std::size_t>(dtype_size(state_dtype(p, kind)));
  if (!state_kind_info(kind).per_block)
    return {kind, static_cast<std::size_t>(first) * size, 0,
            static_cast<std::size_t>(count) * size};
  const int64_t block = kernels::kQuant8Block;
  return {kind, static_cast<std::size_t>(first / block) * size, 0,
          static_cast<std::size_t>((count + block - 1) / block) * size};
}

// A piece's bytes in a segment: `block` for each of its whole blocks, plus up to `reserve`
// beyond them (its runs' alignment).
struct PieceCost {
  std::size_t block;
  std::size_t reserve;
};

// Cuts a bucket's slots into pieces of segments of at most kStagingSlotBytes: each piece a
// run of whole blocks of one slot (its last piece may end in a partial one), as many as fit
// what the segment has left. cost(p) is param p's PieceCost; place(segments, slot, p, first,
// count) adds the piece to segments.back() and returns the bytes it takes there.
template <class Segment, class Cost, class Place>
std::vector<Segment> cut(const Bucket& bucket, const std::vector<const Param*>& params,
                         const Cost& cost, const Place& place) {
  std::vector<Segment> segments(1);
  const int64_t block = kernels::kQuant8Block;
  std::size_t used = 0;  // of the last segment
  for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
    const Param& p = *params[static_cast<std::size_t>(bucket.param_of_slot[s])];
    const PieceCost c = cost(p);
    for (int64_t first = 0; first < p.numel;) {
      if (used + c.reserve + c.block > kStagingSlotBytes) {
        segments.emplace_back();
        used = 0;
      }
      const std::size_t room = kStagingSlotBytes - used - c.reserve;
      const int64_t count =
          std::min<int64_t>(p.numel - first, static_cast<int64_t>(room / c.block) * block);
      used += place(segments, static_cast<int32_t>(s), p, first, count);
      first += count;
    }
  }
  if (segments.back().pieces.empty()) segments.pop_back();
  return segments;
}

// Cuts a host bucket's slots into ring segments (cut). Then lays each segment out: a region
// per state kind, in which the runs of adjacent pieces keep the distance they have on the
// host when their host states are adjacent too (the backend allocates each kind's host
// state one param after another: Backend::allocate_state), so that one copy moves them.
std::vector<StagedSegment> stage(const Bucket& bucket, const std::vector<const Param*>& params) {
  const auto kinds_of = [](const Param& p) {
    std::vector<StateKind> kinds;
    for (const StateKindInfo& k : kStateKinds)
      if (has_state(p, k.kind)) kinds.push_back(k.kind);
    return kinds;
  };
  std::vector<StagedSegment> segments = cut<StagedSegment>(
      bucket, params,
      [&](const Param& p) {
        PieceCost c{0, 0};  // a block's state of every kind; each run's alignment, at most
        for (StateKind kind : kinds_of(p)) {
          c.block += state_run(p, kind, 0, kernels::kQuant8Block).bytes;
          c.reserve += kStagingAlign;
        }
        return c;
      },
      [&](std::vector<StagedSegment>& segs, int32_t slot, const Param& p, int64_t first,
          int64_t count) {
        StagedPiece piece{slot, first, count, {}};
        std::size_t bytes = 0;  // its runs, each as if copied on its own
        for (StateKind kind : kinds_of(p)) {
          piece.runs.push_back(state_run(p, kind, first, count));
          bytes += align_up(piece.runs.back().bytes);
        }
        segs.back().pieces.push_back(std::move(piece));
        return bytes;
      });

  for (StagedSegment& seg : segments) {
    for (const StateKindInfo& k : kStateKinds) {
      std::size_t open = SIZE_MAX;  // the copy of this kind that an adjacent run extends
      for (StagedPiece& piece : seg.pieces) {
        for (StagedRun& run : piece.runs) {
          if (run.kind != k.kind) continue;
          char* host = static_cast<char*>(bucket.slots[static_cast<std::size_t>(piece.slot)]
                                              .state[static_cast<std::size_t>(run.kind)]) +
                       run.host_offset;
          if (open != SIZE_MAX) {
            StagedCopy& copy = seg.copies[open];
            const char* end = copy.host + copy.bytes;
            // Adjacent: the run starts where the copy ends, or past its alignment padding.
            if (host >= end && static_cast<std::size_t>(host - end) < kStagingAlign) {
              run.ring_offset = copy.ring_offset + static_cast<std::size_t>(host - copy.host);
              copy.bytes = static_cast<std::size_t>(host - copy.host) + run.bytes;
              continue;
            }
            seg.bytes = copy.ring_offset + align_up(copy.bytes);
          }
          run.ring_offset = seg.bytes;
          seg.copies.push_back({host, seg.bytes, run.bytes});
          open = seg.copies.size() - 1;
        }
      }
      if (open != SIZE_MAX)
        seg.bytes = seg.copies[open].ring_offset + align_up(seg.copies[open].bytes);
    }
    if (seg.bytes > kStagingSlotBytes)
      fail(SA_ERR_INTERNAL, "a staged segment of ", seg.bytes, " bytes overflows its ring slot of ",
           kStagingSlotBytes);
  }
  return segments;
}

// Cuts a bucket stepped by the CPU into mirror segments (cut). Each segment's params come
// first, one after another, then its grads, so that pieces adjacent on the device are
// adjacent in the mirror too (the backend copies them at once).
std::vector<MirroredSegment> mirror(const Bucket& bucket, const std::vector<const Param*>& params) {
  const auto param_bytes = static_cast<std::size_t>(kernels::elem_bytes(bucket.variant.param));
  const auto grad_bytes = static_cast<std::size_t>(kernels::elem_bytes(bucket.variant.grad));
  const PieceCost cost{static_cast<std::size_t>(kernels::kQuant8Block) * (param_bytes + grad_bytes),
                       kStagingAlign};  // the grads' alignment
  std::vector<MirroredSegment> segments = cut<MirroredSegment>(
      bucket, params, [&](const Param&) { return cost; },
      [&](std::vector<MirroredSegment>& segs, int32_t slot, const Param& p, int64_t first,
          int64_t count) {
        MirroredPiece piece{slot, first, count, 0, 0, {}};
        for (const StateKindInfo& k : kStateKinds)
          if (has_state(p, k.kind))
            piece.state[static_cast<std::size_t>(k.kind)] =
                static_cast<char*>(bucket.slots[static_cast<std::size_t>(slot)]
                                       .state[static_cast<std::size_t>(k.kind)]) +
                state_run(p, k.kind, first, count).host_offset;
        segs.back().pieces.push_back(piece);
        return static_cast<std::size_t>(count) * (param_bytes + grad_bytes);
      });
  for (MirroredSegment& seg : segments) {
    std::size_t at = 0;
    for (MirroredPiece& piece : seg.pieces) {
      piece.param_offset = at;
      at += static_cast<std::size_t>(piece.count) * param_bytes;
    }
    at = align_up(at);
    for (MirroredPiece& piece : seg.pieces) {
      piece.grad_offset = at;
      at += static_cast<std::size_t>(piece.count) * grad_bytes;
    }
    if (at > kStagingSlotBytes)
      fail(SA_ERR_INTERNAL, "a mirrored segment of ", at, " bytes overflows its mirror slot of ",
           kStagingSlotBytes);
  }
  return segments;
}

}  // namespace

kernels::TensorSlot slot_of(const Param& p, int64_t index) {
  kernels::TensorSlot slot{
      p.data, nullptr, {}, p.numel, static_cast<int32_t>(index), primary_replica(p.layout) ? 1 : 0,
      p.scale};
  for (std::size_t k = 0; k < kNumStateKinds; ++k)
    slot.state[k] = p.state.buffers[k] ? p.state.buffers[k]->data() : nullptr;
  return slot;
}

Plan build_plan(const std::vector<const Param*>& params) {
  Plan plan;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Param& p = *params[i];
    if (kernels::is_current(p.scaling)) plan.current.push_back({p.param_type, p.scaling, p.scale});
    const kernels::Variant variant = variant_of(p);
    int32_t gathered = -1;  // a split Muon matrix's entry (2-D: check_muon_param)
    if (variant.rule == kernels::UpdateRule::muon && is_sharded(p.layout)) {
      const Layout& l = p.layout;
      const kernels::MatrixBox box{l.global_shape[0],  l.global_shape[1], l.global_offset[0],
                                   l.global_offset[1], l.local_shape[0],  l.local_shape[1]};
      gathered = static_cast<int32_t>(plan.gathered.size());
      plan.gathered.push_back({box, static_cast<int64_t>(i), primary_replica(l)});
    }
    if (p.numel == 0) continue;
    Bucket* bucket = nullptr;
    for (auto& b : plan.buckets)
      if (b.variant == variant && b.placement == p.placement) bucket = &b;
    if (bucket == nullptr) {
      plan.buckets.push_back(Bucket{variant, p.placement, {}, {}, {}, 0, false, {}, {}, {}});
      bucket = &plan.buckets.back();
    }
    bucket->slots.push_back(slot_of(p, static_cast<int64_t>(i)));
    bucket->param_of_slot.push_back(static_cast<int64_t>(i));
    bucket->slot_grads.push_back(nullptr);
    if (variant.rule == kernels::UpdateRule::muon)  // 2-D (check_muon_param)
      bucket->matrix_of_slot.push_back(
          {p.layout.global_shape[0], p.layout.global_shape[1], gathered});
    if (gathered >= 0) {
      plan.gathered[static_cast<std::size_t>(gathered)].bucket =
          static_cast<int32_t>(bucket - plan.buckets.data());
      plan.gathered[static_cast<std::size_t>(gathered)].slot =
          static_cast<int32_t>(bucket->slots.size() - 1);
    }
    bucket->numel += p.numel;
  }
  int staged = 0, mirrored = 0;  // segments so far, in plan order
  for (Bucket& b : plan.buckets) {
    if (b.placement == StatePlacement::host_cpu_step) {
      b.mirrored = mirror(b, params);
      for (MirroredSegment& seg : b.mirrored) seg.ring_slot = mirrored++ % kStagingSlots;
    }
    if (b.placement != StatePlacement::host || b.variant.scaling != kernels::ParamScaling::none)
      continue;
    b.segments = stage(b, params);
    for (StagedSegment& seg : b.segments) seg.ring_slot = staged++ % kStagingSlots;
  }
  return plan;
}

namespace {

int64_t area(const kernels::MatrixBox& b) { return b.box_rows * b.box_cols; }

// Where box b's first element lies in its whole (row-major), and whether the box is one run
// there (whole rows, or one row): then it moves to and from the whole without staging.
int64_t at_in_whole(const kernels::MatrixBox& b) { return b.row0 * b.cols + b.col0; }
bool contiguous(const kernels::MatrixBox& b) { return b.box_cols == b.cols || b.box_rows <= 1; }

bool same_box(const kernels::MatrixBox& a, const kernels::MatrixBox& b) {
  return a.row0 == b.row0 && a.col0 == b.col0 && a.box_rows == b.box_rows &&
         a.box_cols == b.box_cols;
}

// A distinct box of a matrix, and the ranks that hold it (ascending).
struct DistinctBox {
  kernels::MatrixBox box;
  std::vector<int32_t> holders;
};

// Matrix m's distinct non-empty boxes, in the order of their lowest holders; throws
// SA_ERR_MISMATCH when a rank's matrix has another shape, or the boxes do not cover the
// matrix exactly once.
std::vector<DistinctBox> distinct_boxes(const std::vector<kernels::MatrixBox>& boxes,
                                        const GatheredMatrix& g, std::size_t m, std::size_t n,
                                        int32_t ranks) {
  std::vector<DistinctBox> out;
  for (int32_t r = 0; r < ranks; ++r) {
    const kernels::MatrixBox& b = boxes[static_cast<std::size_t>(r) * n + m];
    if (b.rows != g.box.rows || b.cols != g.box.cols)
      fail(SA_ERR_MISMATCH, "rank ", r, "'s split Muon matrix ", m, " (param ", g.param,
           " here) is ", b.rows, " x ", b.cols, ", this rank's ", g.box.rows, " x ", g.box.cols,
           ": register the same params, in the same order, on every rank");
    if (area(b) == 0) continue;
    const auto same = std::find_if(out.begin(), out.end(),
                                   [&](const DistinctBox& d) { return same_box(d.box, b); });
    if (same != out.end())
      same->holders.push_back(r);
    else
      out.push_back({b, {r}});
  }
  if (g.box.rows * g.box.cols == 0) return out;
  std::vector<Box> parts;
  parts.reserve(out.size());
  for (const DistinctBox& d : out)
    parts.push_back({{d.box.row0, d.box.col0}, {d.box.box_rows, d.box.box_cols}});
  const Box target{{0, 0}, {g.box.rows, g.box.cols}};
  const Coverage c = check_coverage(target, parts);
  if (!c.exact)
    fail(SA_ERR_MISMATCH, "the ranks' boxes of split Muon matrix ", m, " (param ", g.param,
         " here, ", g.box.rows, " x ", g.box.cols, ") do not cover it exactly once: ",
         describe_coverage_problem(
             c, parts, target,
             [&](std::size_t i) { return concat("rank ", out[i].holders.front(), "'s box"); },
             "rank's box"),
         "; check that every rank gives its own mesh coordinate");
  return out;
}

// Owners balanced by Newton-Schulz's flops: largest first, each to the least loaded rank
// among `candidates(m)` (ascending; the lowest on a tie). -1 for a matrix without any.
template <class Candidates>
std::vector<int32_t> balance_owners(const std::vector<GatheredMatrix>& gathered, int32_t ranks,
                                    const Candidates& candidates) {
  const std::size_t n = gathered.size();
  auto flops = [&](std::size_t m) {
    const auto r = static_cast<double>(gathered[m].box.rows),
               c = static_cast<double>(gathered[m].box.cols);
    return r < c ? r * r * c : c * c * r;
  };
  std::vector<std::size_t> order(n);
  for (std::size_t m = 0; m < n; ++m) order[m] = m;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return flops(a) > flops(b); });
  std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
  std::vector<int32_t> owner(n, -1);
  for (const std::size_t m : order) {
    for (const int32_t r : candidates(m))
      if (owner[m] < 0 ||
          load[static_cast<std::size_t>(r)] < load[static_cast<std::size_t>(owner[m])])
        owner[m] = r;
    if (owner[m] >= 0) load[static_cast<std::size_t>(owner[m])] += flops(m);
  }
  return owner;
}

// Where the rounds of the exchanges start (MatrixExchange): at matrix 0, and at each matrix
// that would take some rank past `per_round` transfers in its round. A rank's transfers of
// a matrix in one exchange are at most 1 (a holder) or, on the owner, one per holder of
// each of its distinct boxes; every rank counts every rank's, so all cut alike.
std::vector<bool> round_starts(const std::vector<std::vector<DistinctBox>>& distinct,
                               const std::vector<int32_t>& owner, int32_t ranks,
                               int64_t per_round) {
  std::vector<bool> starts(distinct.size(), false);
  std::vector<int64_t> load(static_cast<std::size_t>(ranks), 0);
  bool empty = true;
  for (std::size_t m = 0; m < distinct.size(); ++m) {
    std::vector<std::pair<int32_t, int64_t>> ops;  // (rank, its transfers of m)
    int64_t on_owner = 0;
    for (const DistinctBox& d : distinct[m]) {
      on_owner += static_cast<int64_t>(d.holders.size());
      for (const int32_t h : d.holders)
        if (h != owner[m]) ops.emplace_back(h, 1);
    }
    if (owner[m] >= 0) ops.emplace_back(owner[m], on_owner);
    bool over = false;
    for (const auto& [r, k] : ops) over = over || load[static_cast<std::size_t>(r)] + k > per_round;
    if (m == 0 || (over && !empty)) {
      starts[m] = true;
      std::fill(load.begin(), load.end(), 0);
      empty = true;
    }
    for (const auto& [r, k] : ops) load[static_cast<std::size_t>(r)] += k;
    empty = empty && ops.empty();
  }
  return starts;
}

}  // namespace

void lay_out_gathered(Plan& plan, int32_t rank, int32_t ranks,
                      const std::vector<kernels::MatrixBox>& boxes, int64_t per_round) {
  const std::size_t n = plan.gathered.size();
  std::vector<GatheredMatrix> gathered = plan.gathered;  // committed when nothing can fail
  if (ranks <= 1) {  // summed: every matrix whole, in param order, this rank the owner of all
    // One rank that says so (its boxes given): each box must be its whole matrix.
    if (boxes.size() == n)
      for (std::size_t m = 0; m < n; ++m) distinct_boxes(boxes, gathered[m], m, n, 1);
    int64_t at = 0;
    for (GatheredMatrix& g : gathered) {
      g.whole = at;
      g.dir = at + at_in_whole(g.box);
      g.ld = g.box.cols;
      g.contributes = g.primary && area(g.box) > 0;
      at += g.box.rows * g.box.cols;
    }
    plan.gathered = std::move(gathered);
    plan.gather_ranks = 1;
    plan.gather_elems = plan.gather_zero = at;
    plan.to_owners = plan.from_owners = MatrixExchange{};
    return;
  }
  if (boxes.size() != n * static_cast<std::size_t>(ranks))
    fail(SA_ERR_INTERNAL, "lay_out_gathered: ", boxes.size(), " boxes for ", n, " matrices of ",
         ranks, " ranks");
  std::vector<std::vector<DistinctBox>> distinct(n);
  for (std::size_t m = 0; m < n; ++m) distinct[m] = distinct_boxes(boxes, gathered[m], m, n, ranks);
  const std::vector<int32_t> owner = balance_owners(gathered, ranks, [&](std::size_t m) {
    std::vector<int32_t> holders;  // of any of its distinct boxes, ascending
    for (const DistinctBox& d : distinct[m])
      holders.insert(holders.end(), d.holders.begin(), d.holders.end());
    std::sort(holders.begin(), holders.end());
    return holders;
  });

  // This rank's boxes, each on its own, then the wholes it owns, then staging.
  int64_t at = 0;
  for (GatheredMatrix& g : gathered) {
    g.contributes = false;  // until it is found the source of its box, below
    g.dir = at;
    g.ld = g.box.box_cols;
    at += area(g.box);
  }
  const int64_t local = at;
  for (std::size_t m = 0; m < n; ++m) {
    gathered[m].whole = owner[m] == rank ? at : -1;
    if (owner[m] == rank) at += gathered[m].box.rows * gathered[m].box.cols;
  }
  const int64_t staging = at;
  int64_t staged_to = 0, staged_from = 0;  // each direction's staging, from `staging`

  MatrixExchange to, from;
  const std::vector<bool> starts = round_starts(distinct, owner, ranks, per_round);
  auto end_round = [](MatrixExchange& x) { x.rounds.push_back({x.sends.size(), x.recvs.size()}); };
  for (std::size_t m = 0; m < n; ++m) {
    if (starts[m] && m > 0) {
      end_round(to);
      end_round(from);
    }
    GatheredMatrix& g = gathered[m];
    const int32_t o = owner[m];
    for (const DistinctBox& d : distinct[m]) {
      const kernels::MatrixBox& b = d.box;
      const auto holds = [&](int32_t r) {
        return std::find(d.holders.begin(), d.holders.end(), r) != d.holders.end();
      };
      const int32_t source = holds(o) ? o : d.holders.front();
      if (holds(rank)) g.contributes = source == rank;
      const int64_t in_whole = g.whole + at_in_whole(b);  // (on the owner)
      // To the owner: from the source's box, into the whole (through staging unless a run).
      if (source == rank && o == rank) {
        to.before.push_back({g.dir, g.ld, in_whole, b.cols, b.box_rows, b.box_cols});
      } else if (source == rank) {
        to.sends.push_back({o, g.dir, area(b)});
      } else if (o == rank && contiguous(b)) {
        to.recvs.push_back({source, in_whole, area(b)});
      } else if (o == rank) {
        to.recvs.push_back({source, staging + staged_to, area(b)});
        to.after.push_back(
            {staging + staged_to, b.box_cols, in_whole, b.cols, b.box_rows, b.box_cols});
        staged_to += area(b);
      }
      // Back to every holder: from the whole (through staging unless a run), into its box.
      if (o == rank) {
        int64_t sent_from = in_whole;
        if (!contiguous(b) && (d.holders.size() > 1 || d.holders.front() != rank)) {
          sent_from = staging + staged_from;
          from.before.push_back({in_whole, b.cols, sent_from, b.box_cols, b.box_rows, b.box_cols});
          staged_from += area(b);
        }
        for (const int32_t h : d.holders)
          if (h == rank)
            from.before.push_back({in_whole, b.cols, g.dir, g.ld, b.box_rows, b.box_cols});
          else
            from.sends.push_back({h, sent_from, area(b)});
      } else if (holds(rank)) {
        from.recvs.push_back({o, g.dir, area(b)});
      }
    }
  }
  if (n > 0) {
    end_round(to);
    end_round(from);
  }
  plan.gathered = std::move(gathered);
  plan.gather_ranks = ranks;
  plan.gather_zero = local;
  plan.gather_elems = staging + std::max(staged_to, staged_from);
  plan.to_owners = std::move(to);
  plan.from_owners = std::move(from);
}

void rebind_grads(Plan& plan, const std::vector<const void*>& step_grads,
                  const std::vector<uint8_t>& subset) {
  for (auto& bucket : plan.buckets) {
    for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
      const auto index = static_cast<std::size_t>(bucket.param_of_slot[s]);
      const void* grad = subset.empty() || subset[index] ? step_grads[index] : nullptr;
      if (bucket.slot_grads[s] == grad) continue;
      bucket.slot_grads[s] = grad;
      bucket.slots[s].grad = grad;
      bucket.grads_moved = true;
    }
  }
}

}  // namespace sa
