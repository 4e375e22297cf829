#include "plan.hpp"

#include <algorithm>
#include <cstdint>

#include "dtype.hpp"
#include "errors.hpp"
#include "param.hpp"

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
      plan.buckets.push_back(Bucket{variant, p.placement, {}, {}, {}, 0, false, {}, {}});
      bucket = &plan.buckets.back();
    }
    bucket->slots.push_back(slot_of(p, static_cast<int64_t>(i)));
    bucket->param_of_slot.push_back(static_cast<int64_t>(i));
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
  lay_out_gathered(plan, 0, 1);  // as one rank; the step lays it out for its communicator
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

void lay_out_gathered(Plan& plan, int32_t rank, int32_t ranks) {
  const std::size_t n = plan.gathered.size();
  std::vector<int32_t> owner(n, 0);
  if (ranks > 1) {
    auto flops = [&](std::size_t m) {
      const auto r = static_cast<double>(plan.gathered[m].box.rows),
                 c = static_cast<double>(plan.gathered[m].box.cols);
      return r < c ? r * r * c : c * c * r;
    };
    std::vector<std::size_t> order(n);
    for (std::size_t m = 0; m < n; ++m) order[m] = m;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return flops(a) > flops(b); });
    std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
    for (const std::size_t m : order) {
      const auto least = std::min_element(load.begin(), load.end()) - load.begin();
      owner[m] = static_cast<int32_t>(least);
      load[static_cast<std::size_t>(least)] += flops(m);
    }
  }
  std::vector<int64_t> filled(static_cast<std::size_t>(std::max(ranks, 1)), 0);
  for (std::size_t m = 0; m < n; ++m) {
    const kernels::MatrixBox& box = plan.gathered[m].box;
    plan.gathered[m].offset = filled[static_cast<std::size_t>(owner[m])];  // within its chunk
    filled[static_cast<std::size_t>(owner[m])] += box.rows * box.cols;
  }
  plan.gather_ranks = std::max(ranks, 1);
  plan.gather_rank = ranks > 1 ? rank : 0;
  plan.gather_chunk = *std::max_element(filled.begin(), filled.end());
  plan.gather_elems = plan.gather_chunk * plan.gather_ranks;
  for (std::size_t m = 0; m < n; ++m) {
    plan.gathered[m].offset += owner[m] * plan.gather_chunk;
    plan.gathered[m].owned = owner[m] == (ranks > 1 ? rank : 0);
  }
}

void rebind_grads(Plan& plan, const std::vector<const void*>& step_grads,
                  const std::vector<uint8_t>& subset) {
  for (auto& bucket : plan.buckets) {
    for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
      const auto index = static_cast<std::size_t>(bucket.param_of_slot[s]);
      const void* grad = subset.empty() || subset[index] ? step_grads[index] : nullptr;
      if (bucket.slots[s].grad == grad) continue;
      bucket.slots[s].grad = grad;
      bucket.grads_moved = true;
    }
  }
}

}  // namespace sa
