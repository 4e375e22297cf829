// src/state_io/import_plan.cpp — phase 1 of an import (import_plan.hpp): the headers, the
// name index, tiling, dtypes, keys, groups and step counts checked, then the pieces, the
// landings and the chunks planned. Nothing is read but the headers, and nothing changes.
#include "import_plan.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../errors.hpp"
#include "../fields.hpp"
#include "group_json.hpp"
#include "runs.hpp"
#include "state_io.hpp"

namespace sa {
namespace {

using Piece = ImportPlan::Piece;
using Landing = ImportPlan::Landing;
using Chunk = ImportPlan::Chunk;

// Block moments' blocks.
constexpr int64_t kBlock = kMomentBlock;

// One saved tensor of a param's state: the file that holds it, and its entry in that
// file's header.
struct SavedRef {
  std::size_t file;
  const SavedTensor* tensor;
};

// Everything the files hold of one param: its saved boxes, per state key.
struct SavedParam {
  std::map<std::string, std::vector<SavedRef>> keys;
  bool matched = false;
};

// "{a, b}": state keys, for messages.
std::string key_list(const std::set<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "" : ", ") + k;
  return "{" + out + "}";
}

// Every rank writes the groups, so every file of one checkpoint holds the same ones;
// files that disagree come from different checkpoints, whether or not the groups are
// restored.
void check_groups_agree(const std::vector<ShardHeader>& headers,
                        const std::vector<BlobReader>& readers) {
  for (std::size_t f = 1; f < headers.size(); ++f) {
    const std::string difference = describe_group_difference(headers[0].groups, readers[0].name(),
                                                             headers[f].groups, readers[f].name());
    if (!difference.empty())
      fail(SA_ERR_MISMATCH, "the shard files disagree about ", difference,
           "; are they from different checkpoints?");
  }
}

// Plans one import (plan_import): the state of phase 1, and the plan it builds.
class Planner {
 public:
  Planner(const Optimizer& opt, const std::vector<BlobReader>& readers,
          const ImportSettings& settings)
      : opt_(opt), readers_(readers), settings_(settings) {}

  // The plan: the headers checked, the pieces, landings and chunks planned.
  ImportPlan run() {
    plan();
    plan_chunks();
    return std::move(plan_);
  }

 private:
  // Reads and checks the headers, and plans the pieces and landings of every param.
  void plan() {
    for (const BlobReader& r : readers_) plan_.headers.push_back(read_shard_header(r));
    check_groups_agree(plan_.headers, readers_);
    for (std::size_t f = 0; f < plan_.headers.size(); ++f)
      for (const SavedTensor& t : plan_.headers[f].tensors)
        if (t.block_elems == 0)  // block scales come with their codes (SavedTensor::scales)
          saved_[t.param].keys[t.key].push_back({f, &t});

    // Only the params imported are checked against the files (tiling, shapes, keys):
    // those allow_unexpected ignores are never read, so a broken set of their boxes
    // cannot reach this optimizer's state.
    for (std::size_t i = 0; i < opt_.params().size(); ++i) {
      if (plan_param(*opt_.params()[i])) plan_.imported.push_back(static_cast<int64_t>(i));
      if (settings_.restore_groups) plan_param_step(static_cast<int64_t>(i));
    }

    if (!settings_.allow_unexpected) {
      std::vector<std::string> extra;
      for (const auto& [name, entry] : saved_)
        if (!entry.matched) extra.push_back(name);
      if (!extra.empty()) {
        std::sort(extra.begin(), extra.end());
        std::string names;
        for (std::size_t i = 0; i < std::min<std::size_t>(extra.size(), 5); ++i)
          names += (i ? ", '" : "'") + extra[i] + "'";
        fail(SA_ERR_MISMATCH, "the shard files hold ", extra.size(),
             " param(s) this optimizer does not have: ", names, extra.size() > 5 ? ", ..." : "",
             "; pass allow_unexpected = 1 to ignore them");
      }
    }

    if (settings_.restore_groups && !plan_.headers.empty()) {
      const auto& groups = plan_.headers[0].groups;
      if (static_cast<int64_t>(groups.size()) != opt_.num_groups())
        fail(SA_ERR_MISMATCH, "the shard files hold ", groups.size(),
             " groups but this optimizer has ", opt_.num_groups(),
             "; create the same groups in the same order (or pass restore_groups = 0)");
      for (std::size_t g = 0; g < groups.size(); ++g) {
        try {
          opt_.check_group_replacement(static_cast<int32_t>(g), groups[g].config);
        } catch (const Error& e) {
          // A group whose params have no max_exp_avg_sq cannot take amsgrad from the files
          // (and the reverse): a mismatch. Any other refusal means the file holds nonsense.
          fail(e.status() == SA_ERR_STATE ? SA_ERR_MISMATCH : SA_ERR_FORMAT, readers_[0].name(),
               ": restoring its groups: ", e.what());
        }
      }
    }
  }

  // Plans the copies of a param's states; returns false for a param allow_missing skips.
  bool plan_param(const Param& p) {
    const auto entry = saved_.find(p.name);
    if (entry == saved_.end()) {
      if (settings_.allow_missing) {
        ++plan_.skipped_params;
        return false;
      }
      fail(SA_ERR_MISMATCH, "param '", p.name, "' is in none of the ", readers_.size(),
           " shard files; pass allow_missing = 1 to keep its current state");
    }
    SavedParam& saved = entry->second;
    saved.matched = true;

    const std::vector<FileState> states = file_states(p);
    std::set<std::string> local_keys, saved_keys;
    for (const FileState& f : states) local_keys.insert(f.state.key);
    for (const auto& [key, refs] : saved.keys) saved_keys.insert(key);
    if (local_keys != saved_keys)
      fail(SA_ERR_MISMATCH, "param '", p.name, "': the shard files hold the states ",
           key_list(saved_keys), " but this param has ", key_list(local_keys),
           " (its master kind or its group's amsgrad differs from the saved one)");

    const Box local{p.layout.global_offset, p.layout.local_shape};
    for (const FileState& f : states) {
      const NamedState& s = f.state;
      const std::string what = concat("param '", p.name, "' state ", s.key);
      int landing = -1;
      if (f.absmax && p.numel > 0) {
        landing = static_cast<int>(plan_.landings.size());
        plan_.landings.push_back({f, p.numel, (p.numel + kBlock - 1) / kBlock});
      }
      const std::vector<SavedRef>& refs = saved.keys.at(s.key);
      std::vector<Box> saved_boxes;
      std::vector<Dims> global_shapes;
      for (const SavedRef& ref : refs) {
        const SavedTensor& t = *ref.tensor;
        if (t.global_shape != p.layout.global_shape)
          fail(SA_ERR_MISMATCH, what, ": ", readers_[ref.file].name(),
               " holds it with global shape ", format_dims(t.global_shape),
               " but this param's global shape is ", format_dims(p.layout.global_shape));
        if (!same_dtype(t.dtype, s.dtype) &&
            find_state_kind(s.key)->storage != StateStorage::moment)  // moments convert
          fail(SA_ERR_MISMATCH, what, ": ", readers_[ref.file].name(), " holds it as ",
               safetensors_name(t.dtype), " but this param keeps it as ", dtype_name(s.dtype));
        saved_boxes.push_back({t.global_offset, t.shape});
        global_shapes.push_back(t.global_shape);
      }
      // The whole global tensor, not only this rank's box: a box that overlaps another
      // elsewhere means the files are not one checkpoint (a forged or mixed-up header),
      // even where this rank's own box happens to be covered once. Tiled exactly, the
      // saved boxes cover the local box exactly once too.
      const Tiling tiling = check_tiling(
          saved_boxes, global_shapes, [&](std::size_t i) { return readers_[refs[i].file].name(); });
      if (tiling.kind != Tiling::Kind::exact)
        fail(SA_ERR_MISMATCH, what, ": the shard files do not cover its global shape ",
             format_dims(p.layout.global_shape), " exactly once: ", tiling.detail,
             " (every file of the checkpoint must be given, each once)");
      int k = 0;
      const bool is_signed = is_moment_state(s.kind, &k) && moment_signed(k);
      for (std::size_t i = 0; i < refs.size(); ++i) {
        Box shared;
        if (!intersect(local, saved_boxes[i], shared)) continue;
        const SavedTensor& t = *refs[i].tensor;
        const DLDataType dst_dtype = landing >= 0 ? dl_dtype_of(ElemType::f32) : s.dtype;
        Piece piece;
        piece.file = refs[i].file;
        piece.saved = &t;
        piece.box = shared;
        piece.from = saved_boxes[i];
        piece.to = local;
        piece.dst = landing >= 0 ? nullptr : s.buffer->data();
        piece.dst_dtype = dst_dtype;
        piece.what = what;
        piece.landing = landing;
        piece.saved_numel = static_cast<int64_t>(t.bytes / dtype_size(t.dtype));
        if (t.scales >= 0) {
          piece.scales = &plan_.headers[refs[i].file].tensors[static_cast<std::size_t>(t.scales)];
          piece.coded = *elem_type_of(t.dtype);  // link_block_scales: a block storage
          piece.is_signed = is_signed;
        }
        plan_.converts = plan_.converts || !same_dtype(t.dtype, dst_dtype);
        plan_.pieces.push_back(std::move(piece));
      }
    }
    return true;
  }

  // The saved step count of param `index`: from the "params" of every file that holds its
  // tensors (version 2), which must agree; a version 1 file gives its group's count.
  void plan_param_step(int64_t index) {
    const Param& p = *opt_.params()[static_cast<std::size_t>(index)];
    const auto entry = saved_.find(p.name);
    if (entry == saved_.end()) return;  // allow_missing: it keeps its count
    int64_t step = -1;
    std::size_t step_file = 0;
    for (const auto& [key, refs] : entry->second.keys) {
      for (const SavedRef& ref : refs) {
        const ShardHeader& h = plan_.headers[ref.file];
        if (h.version < 2 && static_cast<std::size_t>(p.group) >= h.groups.size())
          continue;  // reported by plan()
        const int64_t s = h.version >= 2 ? h.param_steps.at(p.name) : h.groups[p.group].step;
        if (step >= 0 && s != step)
          fail(SA_ERR_MISMATCH, "param '", p.name, "': ", readers_[step_file].name(),
               " says its step count is ", step, " but ", readers_[ref.file].name(), " says ", s,
               "; are they from different checkpoints?");
        step = s;
        step_file = ref.file;
      }
    }
    if (step >= 0) plan_.restored_steps.emplace_back(index, step);
  }

  // The checksum blocks each piece's runs touch, cut into chunks of at most `limit` bytes
  // of whole blocks; in blob order, so that file readers read forward.
  void plan_chunks() {
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(
        plan_.pieces.size());  // blocks [a, b)
    uint64_t total = 0, largest_block = 0;
    for (std::size_t i = 0; i < plan_.pieces.size(); ++i) {
      Piece& piece = plan_.pieces[i];
      const uint64_t block = plan_.headers[piece.file].block_bytes;
      const uint64_t elem = dtype_size(piece.saved->dtype);
      largest_block = std::max(largest_block, block);
      auto& r = ranges[i];
      piece.src_begin = -1;
      for (RunCursor c(piece.box, piece.from, piece.to); !c.done(); c.advance(c.remaining())) {
        if (piece.src_begin < 0) piece.src_begin = c.src();
        piece.src_end = c.src() + c.remaining();
        const uint64_t begin = static_cast<uint64_t>(c.src()) * elem;
        const uint64_t end = begin + static_cast<uint64_t>(c.remaining()) * elem;
        const uint64_t first = begin / block, last = (end - 1) / block + 1;
        if (!r.empty() && first <= r.back().second) {
          r.back().second = std::max(r.back().second, last);
        } else {
          r.emplace_back(first, last);
        }
      }
      for (const auto& [a, b] : r) total += std::min(b * block, piece.saved->bytes) - a * block;
    }
    plan_.cached = total <= settings_.staging_bytes;
    // Data that do not fit a device's staging are copied through two halves of it (one
    // read while the other goes up), when each half holds a checksum block. Host state is
    // copied on the pool, which the reads need too: one slot, read then copied.
    const Backend* backend = opt_.backend();
    plan_.pipelined = !plan_.cached && backend != nullptr && !backend->host_memory() &&
                      settings_.staging_bytes >= 2 * largest_block;
    // Pipelined, the halves are the optimizer's two pinned slots, of at most kDeviceSlotBytes
    // (larger ones would not copy faster, and take longer to pin).
    const uint64_t limit =
        plan_.pipelined
            ? std::max(largest_block, std::min(settings_.staging_bytes / 2, kDeviceSlotBytes))
            : std::max(settings_.staging_bytes, largest_block);
    for (std::size_t i = 0; i < plan_.pieces.size(); ++i) {
      const uint64_t block = plan_.headers[plan_.pieces[i].file].block_bytes;
      const uint64_t per_chunk = std::max<uint64_t>(1, limit / block);
      for (const auto& [a, b] : ranges[i])
        for (uint64_t first = a; first < b; first += per_chunk) {
          const uint64_t begin = first * block;
          const uint64_t end =
              std::min(std::min(b, first + per_chunk) * block, plan_.pieces[i].saved->bytes);
          plan_.chunks.push_back({i, begin, end - begin});
        }
    }
    std::sort(plan_.chunks.begin(), plan_.chunks.end(), [&](const Chunk& x, const Chunk& y) {
      const Piece &px = plan_.pieces[x.piece], &py = plan_.pieces[y.piece];
      if (px.file != py.file) return px.file < py.file;
      return px.saved->data_begin + x.begin < py.saved->data_begin + y.begin;
    });
    uint64_t staging = 0, largest_chunk = 0;
    for (Chunk& c : plan_.chunks) {
      c.cache_at = staging;  // (used only when cached)
      staging += c.bytes;
      largest_chunk = std::max(largest_chunk, c.bytes);
    }
    // Uncached, chunks go through slots of `limit` bytes (at least the largest chunk), as
    // many at once as fit (batches), so that small pieces' blocks are read in parallel too.
    plan_.slot_bytes = plan_.cached ? staging : std::max(largest_chunk, std::min(limit, staging));
    plan_.staging_bytes = plan_.pipelined ? 2 * plan_.slot_bytes : plan_.slot_bytes;
    plan_landing_rounds();
  }

  // Cuts the landings into rounds (in order) of at most the staging size each; a landing
  // larger than that is a round of its own.
  void plan_landing_rounds() {
    uint64_t at = 0;
    int round = 0;
    for (Landing& l : plan_.landings) {
      const auto entries = static_cast<uint64_t>(l.numel + l.blocks);
      if (at > 0 && (at + entries) * (sizeof(float) + 1) > settings_.staging_bytes) ++round, at = 0;
      l.round = round;
      l.at = at;
      at += entries;
      plan_.arena_entries = std::max(plan_.arena_entries, at);
    }
    plan_.rounds = plan_.landings.empty() ? 1 : round + 1;
  }

  const Optimizer& opt_;
  const std::vector<BlobReader>& readers_;
  ImportSettings settings_;
  std::unordered_map<std::string, SavedParam> saved_;  // by param name
  ImportPlan plan_;
};

}  // namespace

ImportSettings import_settings(const sa_import_options& o) {
  check_fields(SA_STRUCT_IMPORT_OPTIONS, &o, "", "options->");
  return {o.staging_bytes == 0 ? kDefaultStagingBytes : o.staging_bytes, o.allow_missing == 1,
          o.allow_unexpected == 1, o.restore_groups == 1, o.read_once == 1};
}

ImportPlan plan_import(const Optimizer& opt, const std::vector<BlobReader>& readers,
                       const ImportSettings& settings) {
  return Planner(opt, readers, settings).run();
}

}  // namespace sa
