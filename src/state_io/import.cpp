// src/state_io/import.cpp — resharding: loads any set of shard files into this optimizer's
// existing state buffers.
//
// Phases, and what a failure in each leaves behind:
//  1. plan     headers, the name index, tiling, dtypes, keys, groups     nothing changed
//  2. verify   read every checksum block the copy needs, check its CRC   nothing changed
//  3. apply    copy the runs into state (re-reading and re-checking the  optimizer marked
//              blocks unless phase 2 could keep them all in staging;     unusable
//              with read_once, reading them for the first time)
// The unit of reading is a checksum block, so that every byte copied into state has had
// its checksum checked when it is copied, even if the blob changes between phases 2 and 3.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <set>
#include <thread>
#include <unordered_map>

#include "../backends/thread_pool.hpp"
#include "../dtype.hpp"
#include "../errors.hpp"
#include "../moment_values.hpp"
#include "box.hpp"
#include "crc32c.hpp"
#include "group_json.hpp"
#include "metadata.hpp"
#include "runs.hpp"
#include "state_io.hpp"

namespace sa {
namespace {

// Dtype conversions on the way to a device go through a pinned buffer of this size.
constexpr std::size_t kBounceBytes = std::size_t{1} << 20;
// Block moments' blocks, and how many decoded elements go to a state that is not one at a
// time.
constexpr int64_t kBlock = kMomentBlock;
constexpr int64_t kDecodeElems = int64_t{1} << 16;

struct SavedRef {
  std::size_t file;
  const SavedTensor* tensor;
};

// Everything the files hold of one param: its saved boxes, per state key.
struct SavedParam {
  std::map<std::string, std::vector<SavedRef>> keys;
  bool matched = false;
};

// What one saved tensor gives one local state: the box they share.
struct Piece {
  std::size_t file = 0;
  const SavedTensor* saved = nullptr;
  Box box;                 // the intersection, in global coordinates
  Box from;                // the saved tensor's box
  Box to;                  // the local state's box
  void* dst = nullptr;     // backend memory, or null for a block moment (see `landing`)
  DLDataType dst_dtype{};  // as the state is held (float32 for a block moment: its values)
  std::string what;        // "param 'w' state exp_avg", for messages
  int landing = -1;        // a block moment: its Landing, else -1
  // The saved tensor holds block codes (version 3): their scales, and what decodes them.
  const SavedTensor* scales = nullptr;
  ElemType coded = ElemType::f32;  // the codes' storage (q8, f8e4m3)
  bool is_signed = false;          // exp_avg (q8's signed map)
  int64_t saved_numel = 0;
  // The saved elements [src_begin, src_end) hold every run (plan_chunks), and phase 2
  // reads the scales of their blocks, from block scales_first on.
  int64_t src_begin = 0, src_end = 0;
  int64_t scales_first = 0;
  std::vector<float> scale_values;
};

// A block moment (8-bit, float8) lands in host memory, then is stored: a block that the
// files hold whole (the same elements in one saved block of the same storage: the block
// grids agree there) as its saved codes and absmax, bit for bit; any other block as
// float32 values (decoded from the saved codes, or the saved float32 or bfloat16 values),
// which are quantized by this param's blocks, as a step quantizes. Landings go in rounds
// of at most the staging size (or one landing, if larger), each round in the same host
// arenas: peak memory stays the staging size, not 5 bytes per element of every block
// moment.
struct Landing {
  FileState state;
  int64_t numel;
  int64_t blocks;
  int round = 0;    // landings of one round share the arenas
  uint64_t at = 0;  // its entries in them: values_ its values, then its blocks' absmax;
                    // codes_ its codes, then a flag per block: held whole
};

// Whole checksum blocks of one piece's saved tensor, read at once.
struct Chunk {
  std::size_t piece;
  uint64_t begin;  // tensor-relative byte offset, at a block boundary
  uint64_t bytes;
  uint64_t cache_at = 0;  // where phase 2 kept it (when everything fits in staging)
};

struct Settings {
  uint64_t staging_bytes;
  bool allow_missing, allow_unexpected, restore_groups, read_once;
};

Settings settings_of(const sa_import_options& o) {
  auto flag = [](int32_t v, const char* name) {
    if (v != 0 && v != 1)
      fail(SA_ERR_INVALID_ARGUMENT, "options->", name, " is ", v, "; it must be 0 or 1");
    return v == 1;
  };
  return {o.staging_bytes == 0 ? kDefaultStagingBytes : o.staging_bytes,
          flag(o.allow_missing, "allow_missing"), flag(o.allow_unexpected, "allow_unexpected"),
          flag(o.restore_groups, "restore_groups"), flag(o.read_once, "read_once")};
}

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

// Moments convert between their element dtypes (float32 and bfloat16 today: the pairs
// plan() lets through) with the kernels' rounding (dtype.hpp's convert_elems).
void convert(const unsigned char* src, DLDataType from, unsigned char* dst, DLDataType to,
             int64_t n) {
  const std::optional<ElemType> from_type = elem_type_of(from), to_type = elem_type_of(to);
  if (!from_type || !to_type)
    fail(SA_ERR_INTERNAL, "a conversion from ", dtype_name(from), " to ", dtype_name(to));
  convert_elems(*from_type, src, *to_type, dst, n);
}

class Importer {
 public:
  Importer(Optimizer& opt, const std::vector<BlobReader>& readers, const Settings& settings)
      : opt_(opt), readers_(readers), settings_(settings) {}

  void run() {
    plan();
    verify();
    apply();
  }

 private:
  // ---- phase 1 ------------------------------------------------------------------------

  void plan() {
    for (const BlobReader& r : readers_) headers_.push_back(read_shard_header(r));
    check_groups_agree(headers_, readers_);
    for (std::size_t f = 0; f < headers_.size(); ++f)
      for (const SavedTensor& t : headers_[f].tensors)
        if (t.block_elems == 0)  // block scales come with their codes (SavedTensor::scales)
          saved_[t.param].keys[t.key].push_back({f, &t});

    // Only the params imported are checked against the files (tiling, shapes, keys):
    // those allow_unexpected ignores are never read, so a broken set of their boxes
    // cannot reach this optimizer's state.
    for (std::size_t i = 0; i < opt_.params().size(); ++i) {
      if (plan_param(*opt_.params()[i])) imported_.push_back(static_cast<int64_t>(i));
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

    if (settings_.restore_groups && !headers_.empty()) {
      const auto& groups = headers_[0].groups;
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
        ++skipped_params_;
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
        landing = static_cast<int>(landings_.size());
        landings_.push_back({f, p.numel, (p.numel + kBlock - 1) / kBlock});
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
          piece.scales = &headers_[refs[i].file].tensors[static_cast<std::size_t>(t.scales)];
          piece.coded = *elem_type_of(t.dtype);  // link_block_scales: a block storage
          piece.is_signed = is_signed;
        }
        converts_ = converts_ || !same_dtype(t.dtype, dst_dtype);
        pieces_.push_back(std::move(piece));
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
        const ShardHeader& h = headers_[ref.file];
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
    if (step >= 0) restored_steps_.emplace_back(index, step);
  }

  // ---- phase 2 ------------------------------------------------------------------------

  // The checksum blocks each piece's runs touch, cut into chunks of at most `limit` bytes
  // of whole blocks; in blob order, so that file readers read forward.
  void plan_chunks() {
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(
        pieces_.size());  // blocks [a, b)
    uint64_t total = 0, largest_block = 0;
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      Piece& piece = pieces_[i];
      const uint64_t block = headers_[piece.file].block_bytes;
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
    cached_ = total <= settings_.staging_bytes;
    // Data that do not fit a device's staging are copied through two halves of it (one
    // read while the other goes up), when each half holds a checksum block. Host state is
    // copied on the pool, which the reads need too: one slot, read then copied.
    const Backend* backend = opt_.backend();
    pipelined_ = !cached_ && backend != nullptr && !backend->host_memory() &&
                 settings_.staging_bytes >= 2 * largest_block;
    // Pipelined, the halves are the optimizer's two pinned slots, of at most kDeviceSlotBytes
    // (larger ones would not copy faster, and take longer to pin).
    const uint64_t limit =
        pipelined_
            ? std::max(largest_block, std::min(settings_.staging_bytes / 2, kDeviceSlotBytes))
            : std::max(settings_.staging_bytes, largest_block);
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      const uint64_t block = headers_[pieces_[i].file].block_bytes;
      const uint64_t per_chunk = std::max<uint64_t>(1, limit / block);
      for (const auto& [a, b] : ranges[i])
        for (uint64_t first = a; first < b; first += per_chunk) {
          const uint64_t begin = first * block;
          const uint64_t end =
              std::min(std::min(b, first + per_chunk) * block, pieces_[i].saved->bytes);
          chunks_.push_back({i, begin, end - begin});
        }
    }
    std::sort(chunks_.begin(), chunks_.end(), [&](const Chunk& x, const Chunk& y) {
      const Piece &px = pieces_[x.piece], &py = pieces_[y.piece];
      if (px.file != py.file) return px.file < py.file;
      return px.saved->data_begin + x.begin < py.saved->data_begin + y.begin;
    });
    uint64_t staging = 0, largest_chunk = 0;
    for (Chunk& c : chunks_) {
      c.cache_at = staging;  // (used only when cached_)
      staging += c.bytes;
      largest_chunk = std::max(largest_chunk, c.bytes);
    }
    // Uncached, chunks go through slots of `limit` bytes (at least the largest chunk), as
    // many at once as fit (batches), so that small pieces' blocks are read in parallel too.
    slot_bytes_ = cached_ ? staging : std::max(largest_chunk, std::min(limit, staging));
    staging_bytes_ = pipelined_ ? 2 * slot_bytes_ : slot_bytes_;
    plan_landing_rounds();
  }

  // Cuts the landings into rounds (in order) of at most the staging size each; a landing
  // larger than that is a round of its own.
  void plan_landing_rounds() {
    uint64_t at = 0;
    int round = 0;
    for (Landing& l : landings_) {
      const auto entries = static_cast<uint64_t>(l.numel + l.blocks);
      if (at > 0 && (at + entries) * (sizeof(float) + 1) > settings_.staging_bytes) ++round, at = 0;
      l.round = round;
      l.at = at;
      at += entries;
      arena_entries_ = std::max(arena_entries_, at);
    }
    rounds_ = landings_.empty() ? 1 : round + 1;
  }

  // A byte range of one saved tensor to read and check: `bytes` bytes of file `file`'s
  // tensor `t` from `begin` (a checksum block boundary; the end one too, or the tensor's
  // end), into `dst`.
  struct Read {
    std::size_t file;
    const SavedTensor* tensor;
    uint64_t begin, bytes;
    unsigned char* dst;
  };

  // Reads every range of `reads` and checks the checksum of every block, all blocks at
  // once on the import's threads: each block is read by the thread that checks it when its
  // reader is concurrent (sa_reader.concurrent), else all of that reader's ranges first,
  // here. The first failure in the ranges' order and block order is reported. `status` is
  // what a mismatch reports: SA_ERR_FORMAT in phase 2 (a corrupt blob, and with read_once
  // in phase 3 too), SA_ERR_IO in phase 3 (the blob changed since phase 2 checked it).
  void read_checked(const std::vector<Read>& reads, sa_status status) {
    auto offset_of = [&](const Read& r) {
      return headers_[r.file].data_section + r.tensor->data_begin + r.begin;
    };
    auto what = [](const Read& r) { return concat("tensor '", r.tensor->name(), "'"); };
    blocks_.clear();
    for (std::size_t i = 0; i < reads.size(); ++i) {
      const Read& r = reads[i];
      if (!readers_[r.file].concurrent())
        readers_[r.file].read(offset_of(r), r.dst, static_cast<std::size_t>(r.bytes),
                              what(r).c_str());
      for (uint64_t at = 0; at < r.bytes; at += headers_[r.file].block_bytes)
        blocks_.push_back({i, at});
    }
    crc_scratch_.resize(blocks_.size());
    read_results_.assign(blocks_.size(), BlobReader::ReadResult::ok);
    pool().parallel_for(static_cast<int64_t>(blocks_.size()), [&](int64_t i) {
      const auto k = static_cast<std::size_t>(i);
      const Read& r = reads[blocks_[k].read];
      const uint64_t at = blocks_[k].at;
      const auto n = static_cast<std::size_t>(std::min(headers_[r.file].block_bytes, r.bytes - at));
      const BlobReader& reader = readers_[r.file];
      if (reader.concurrent()) read_results_[k] = reader.try_read(offset_of(r) + at, r.dst + at, n);
      if (read_results_[k] == BlobReader::ReadResult::ok)
        crc_scratch_[k] = crc32c(0, r.dst + at, n);
    });
    for (std::size_t k = 0; k < blocks_.size(); ++k) {
      const Read& r = reads[blocks_[k].read];
      const uint64_t block = headers_[r.file].block_bytes;
      const uint64_t at = blocks_[k].at;
      const uint64_t n = std::min(block, r.bytes - at);
      const BlobReader& reader = readers_[r.file];
      if (read_results_[k] != BlobReader::ReadResult::ok)
        reader.read_failed(read_results_[k], offset_of(r) + at, static_cast<std::size_t>(n),
                           what(r).c_str());
      const uint64_t index = (r.begin + at) / block;
      const SavedTensor& t = *r.tensor;
      if (crc_scratch_[k] != t.crc32c[index])
        fail(status, reader.name(), ": tensor '", t.name(), "': block ", index, " (bytes ",
             r.begin + at, " to ", r.begin + at + n, " of its data) has checksum ", crc_scratch_[k],
             " but the header says ", t.crc32c[index],
             status == SA_ERR_FORMAT ? ": the file is corrupt"
                                     : ": the blob changed during the import");
    }
  }

  // A chunk and its place in a slot of the staging; a batch: chunks read at once into one slot.
  struct Placed {
    const Chunk* chunk;
    uint64_t at;
  };
  using Batch = std::vector<Placed>;

  // `chunks` cut, in order, into batches of at most `slot` bytes each (a chunk is never
  // larger).
  static std::vector<Batch> batches_of(const std::vector<const Chunk*>& chunks, uint64_t slot) {
    std::vector<Batch> out;
    uint64_t used = 0;
    for (const Chunk* c : chunks) {
      if (out.empty() || used + c->bytes > slot) out.emplace_back(), used = 0;
      out.back().push_back({c, used});
      used += c->bytes;
    }
    return out;
  }

  // `chunks` where phase 2 keeps them all (cached_): each at its cache_at.
  static Batch cached_batch(const std::vector<const Chunk*>& chunks) {
    Batch batch;
    for (const Chunk* c : chunks) batch.push_back({c, c->cache_at});
    return batch;
  }

  // The reads of a batch whose slot starts at `base`.
  std::vector<Read> reads_of(const Batch& batch, unsigned char* base) const {
    std::vector<Read> reads;
    reads.reserve(batch.size());
    for (const Placed& p : batch) {
      const Piece& piece = pieces_[p.chunk->piece];
      reads.push_back({piece.file, piece.saved, p.chunk->begin, p.chunk->bytes, base + p.at});
    }
    return reads;
  }

  // The import's threads (the optimizer's worker count, as an export's), made on first use.
  ThreadPool& pool() {
    if (!pool_) pool_ = std::make_unique<ThreadPool>(state_io_threads(opt_));
    return *pool_;
  }

  // Keeps the scales of the saved blocks a coded piece's runs touch in host memory (1/64
  // of the codes' bytes), read once and checked here. An absmax is the largest magnitude of
  // its block: finite, its sign bit clear. The writer never writes another, so a set sign
  // bit (-0.0 passes `< 0`, a NaN compares false to everything), a NaN or an infinity is
  // damage, refused before anything changes.
  void read_scales(Piece& piece) {
    const SavedTensor& t = *piece.scales;
    const uint64_t block_bytes = headers_[piece.file].block_bytes;
    const int64_t lo = piece.src_begin / t.block_elems;
    const int64_t hi = (piece.src_end + t.block_elems - 1) / t.block_elems;
    const uint64_t begin = static_cast<uint64_t>(lo) * sizeof(float) / block_bytes * block_bytes;
    const uint64_t end = std::min(
        block_count(static_cast<uint64_t>(hi) * sizeof(float), block_bytes) * block_bytes, t.bytes);
    std::vector<unsigned char> bytes(static_cast<std::size_t>(end - begin));
    read_checked({{piece.file, &t, begin, end - begin, bytes.data()}}, SA_ERR_FORMAT);
    piece.scales_first = lo;
    piece.scale_values.resize(static_cast<std::size_t>(hi - lo));
    std::memcpy(piece.scale_values.data(), bytes.data() + (lo * sizeof(float) - begin),
                piece.scale_values.size() * sizeof(float));
    for (std::size_t i = 0; i < piece.scale_values.size(); ++i) {
      const float absmax = piece.scale_values[i];
      if (std::signbit(absmax) || !std::isfinite(absmax))
        fail(SA_ERR_FORMAT, readers_[piece.file].name(), ": tensor '", t.name(), "': block ",
             lo + static_cast<int64_t>(i), " has absmax ", absmax,
             "; an absmax is the largest magnitude of its block: finite, its sign bit clear");
    }
  }

  void verify() {
    plan_chunks();
    Backend* backend = opt_.backend();
    if (chunks_.empty() || backend == nullptr) return;
    if (pipelined_) {  // the optimizer's two pinned slots, kept for its next imports and exports
      IoScratch& scratch = io_scratch_of(opt_);
      scratch.ensure_staging(*backend, slot_bytes_);
      slots_[0] = scratch.staging[0];
      slots_[1] = scratch.staging[1];
    } else {
      slots_[0] = backend->allocate_staging(static_cast<std::size_t>(staging_bytes_));
    }
    auto* base = static_cast<unsigned char*>(slots_[0]->data());
    std::vector<const Chunk*> all;
    for (const Chunk& c : chunks_) all.push_back(&c);
    if (cached_) {  // everything, at once, where phase 3 finds it
      read_checked(reads_of(cached_batch(all), base), SA_ERR_FORMAT);
    } else if (!settings_.read_once) {  // read_once: each chunk is read as it is copied
      for (const Batch& batch : batches_of(all, slot_bytes_))
        read_checked(reads_of(batch, base), SA_ERR_FORMAT);
    }
    for (Piece& piece : pieces_)
      if (piece.scales != nullptr) read_scales(piece);
  }

  // ---- phase 3 ------------------------------------------------------------------------

  void apply() {
    Backend* backend = opt_.backend();
    const std::string previous_reason = opt_.unusable_reason();
    if (backend != nullptr && !chunks_.empty()) {
      // Everything the copy needs is allocated before the first byte of state changes.
      std::vector<RunCursor> cursors;
      cursors.reserve(pieces_.size());
      for (const Piece& p : pieces_) cursors.emplace_back(p.box, p.from, p.to);
      std::shared_ptr<Buffer> bounce;
      if (converts_ && !backend->host_memory()) bounce = backend->allocate_staging(kBounceBytes);
      try {
        values_.resize(static_cast<std::size_t>(arena_entries_));
        codes_.resize(static_cast<std::size_t>(arena_entries_));
        decoded_.resize(kDecodeElems);
      } catch (const std::bad_alloc&) {
        fail(SA_ERR_OUT_OF_MEMORY, "cannot allocate the ", arena_entries_ * (sizeof(float) + 1),
             " bytes of host memory that block moments land in; nothing was changed");
      }
      backend->synchronize();  // no step in flight may still use the state
      opt_.mark_unusable("an import failed while it was copying state");
      try {
        // Round r copies the other states (r = 0) and the pieces of its landings, then
        // quantizes those by this param's blocks and writes them up. A chunk belongs to
        // one piece, and so to one round: each is read once.
        for (int round = 0; round < rounds_; ++round) {
          for (const Landing& l : landings_)
            if (l.round == round) std::fill_n(landing_codes(l) + l.numel, l.blocks, uint8_t{0});
          copy_chunks(*backend, cursors, bounce.get(), round);
          for (const Landing& l : landings_)
            if (l.round == round) store_landing(*backend, l);
        }
        // An fp8 param follows from its master, which was just loaded: cast it (and its
        // scales) with its scaling, as a step would.
        opt_.cast_params_from_master(imported_);
      } catch (const Error& e) {
        opt_.mark_unusable(concat("an import failed while it was copying state (", e.what(), ")"));
        fail(e.status() == SA_ERR_FORMAT && !settings_.read_once ? SA_ERR_IO : e.status(), e.what(),
             "; the state is now partly overwritten, so the optimizer refuses to step until an "
             "import succeeds");
      }
    }
    if (settings_.restore_groups && !headers_.empty()) {
      // Params the files do not hold (allow_missing) keep their counts; setting a group's
      // count sets its params', so theirs are put back after it.
      std::vector<int64_t> steps(opt_.params().size());
      opt_.get_param_steps(0, opt_.num_params(), steps.data());
      const auto& groups = headers_[0].groups;
      for (std::size_t g = 0; g < groups.size(); ++g) {  // checked in plan(): cannot fail
        opt_.set_group(static_cast<int32_t>(g), groups[g].config);
        opt_.set_step(static_cast<int32_t>(g), groups[g].step);
      }
      for (const auto& [index, step] : restored_steps_)
        steps[static_cast<std::size_t>(index)] = step;
      opt_.set_param_steps(0, opt_.num_params(), steps.data());
    }
    // A param skipped by allow_missing keeps whatever state it had: if an earlier import
    // left it half written, it still is.
    if (skipped_params_ == 0) {
      opt_.clear_unusable();
    } else {
      opt_.mark_unusable(previous_reason);
    }
  }

  // The chunks of round `round`: of its landings' pieces, and in round 0 of every piece
  // that lands directly in state. Unless phase 2 kept them all in staging, they are read
  // (and checked) again in batches, or with read_once for the first time. A device's are
  // pipelined: batch k+1 is read into one half of the staging, on a thread of its own with
  // the import's pool, while batch k, in the other, goes up from here. Host state is read
  // and then copied, both on the pool.
  void copy_chunks(Backend& backend, std::vector<RunCursor>& cursors, Buffer* bounce, int round) {
    auto* base = static_cast<unsigned char*>(slots_[0]->data());
    std::vector<const Chunk*> chunks;
    for (const Chunk& c : chunks_) {
      const int landing = pieces_[c.piece].landing;
      if ((landing < 0 ? 0 : landings_[static_cast<std::size_t>(landing)].round) == round)
        chunks.push_back(&c);
    }
    if (cached_) {
      scatter(cached_batch(chunks), base, cursors, backend, bounce);
      return;
    }
    // Read again after phase 2 (the blob may have changed since: SA_ERR_IO), or for the
    // first time with read_once (a mismatch is damage: SA_ERR_FORMAT).
    const sa_status status = settings_.read_once ? SA_ERR_FORMAT : SA_ERR_IO;
    const std::vector<Batch> batches = batches_of(chunks, slot_bytes_);
    auto slot = [&](std::size_t k) {
      return static_cast<unsigned char*>(slots_[pipelined_ ? k % 2 : 0]->data());
    };
    if (!batches.empty()) read_checked(reads_of(batches[0], slot(0)), status);
    for (std::size_t k = 0; k < batches.size(); ++k) {
      std::exception_ptr read_failure;
      std::thread next;
      if (pipelined_ && k + 1 < batches.size())
        next = std::thread([&, k] {
          try {
            read_checked(reads_of(batches[k + 1], slot(k + 1)), status);
          } catch (...) {
            read_failure = std::current_exception();
          }
        });
      try {
        scatter(batches[k], slot(k), cursors, backend, bounce);
      } catch (...) {
        if (next.joinable()) next.join();
        throw;
      }
      if (next.joinable()) next.join();
      if (read_failure) std::rethrow_exception(read_failure);
      if (!pipelined_ && k + 1 < batches.size())
        read_checked(reads_of(batches[k + 1], slot(k + 1)), status);
    }
  }

  // Copies a batch's chunks (held from `base`) into state. Plain copies into host memory
  // (no conversion, no landing) run on the pool (HostCopies); the rest here.
  void scatter(const Batch& batch, unsigned char* base, std::vector<RunCursor>& cursors,
               Backend& backend, Buffer* bounce) {
    copies_.clear();
    for (const Placed& p : batch) {
      const Chunk& c = *p.chunk;
      const Piece& piece = pieces_[c.piece];
      if (backend.host_memory() && piece.landing < 0 && piece.scales == nullptr &&
          same_dtype(piece.saved->dtype, piece.dst_dtype)) {
        collect_copies(c, base + p.at, cursors[c.piece]);
      } else {
        scatter(c, base + p.at, cursors[c.piece], backend, bounce);
      }
    }
    copies_.run(pool());
  }

  // The copies that put the part of a plain piece's runs lying in chunk `c` (held at
  // `data`) into host state, into copies_.
  void collect_copies(const Chunk& c, const unsigned char* data, RunCursor& cursor) {
    const Piece& piece = pieces_[c.piece];
    const uint64_t size = dtype_size(piece.saved->dtype);
    const auto first = static_cast<int64_t>(c.begin / size);
    const auto end = static_cast<int64_t>((c.begin + c.bytes) / size);
    while (!cursor.done() && cursor.src() < end) {
      if (cursor.src() < first)
        fail(SA_ERR_INTERNAL, piece.what, ": a run starts before its chunk");
      const int64_t n = std::min(cursor.remaining(), end - cursor.src());
      auto* dst =
          static_cast<unsigned char*>(piece.dst) + static_cast<uint64_t>(cursor.dst()) * size;
      const unsigned char* src = data + static_cast<uint64_t>(cursor.src() - first) * size;
      const auto bytes = static_cast<std::size_t>(static_cast<uint64_t>(n) * size);
      copies_.add(dst, src, bytes);
      cursor.advance(n);
    }
  }

  // Copies the part of a piece's runs that lies in chunk `c` (held at `data`) into state:
  // elements [first, end) of its saved tensor.
  void scatter(const Chunk& c, const unsigned char* data, RunCursor& cursor, Backend& backend,
               Buffer* bounce) {
    const Piece& piece = pieces_[c.piece];
    const uint64_t src_size = dtype_size(piece.saved->dtype);
    const uint64_t dst_size = dtype_size(piece.dst_dtype);
    const Span span{data, static_cast<int64_t>(c.begin / src_size),
                    static_cast<int64_t>((c.begin + c.bytes) / src_size)};
    // A block moment lands in host memory (see Landing); everything else goes to state.
    auto* dst_base = piece.landing >= 0 ? reinterpret_cast<unsigned char*>(landing_values(
                                              landings_[static_cast<std::size_t>(piece.landing)]))
                                        : static_cast<unsigned char*>(piece.dst);
    while (!cursor.done() && cursor.src() < span.end) {
      if (cursor.src() < span.first)
        fail(SA_ERR_INTERNAL, piece.what, ": a run starts before its chunk");
      const int64_t n = std::min(cursor.remaining(), span.end - cursor.src());
      unsigned char* dst = dst_base + static_cast<uint64_t>(cursor.dst()) * dst_size;
      if (piece.scales != nullptr && piece.landing >= 0) {
        land_codes(c.piece, span, cursor.src(), cursor.dst(), n);
      } else if (piece.scales != nullptr) {  // decoded, then as float32 values
        for (int64_t i = 0; i < n; i += kDecodeElems) {
          const int64_t m = std::min<int64_t>(kDecodeElems, n - i);
          decode(c.piece, span, cursor.src() + i, m, decoded_.data());
          put(reinterpret_cast<const unsigned char*>(decoded_.data()), dl_dtype_of(ElemType::f32),
              dst + static_cast<uint64_t>(i) * dst_size, piece, m, backend, bounce);
        }
      } else {
        put(data + static_cast<uint64_t>(cursor.src() - span.first) * src_size, piece.saved->dtype,
            dst, piece, n, backend, bounce);
      }
      cursor.advance(n);
    }
  }

  // Puts n elements (host memory, of dtype `from`) at `dst`, in piece's state (or its
  // landing), converted to its dtype.
  void put(const unsigned char* src, DLDataType from, unsigned char* dst, const Piece& piece,
           int64_t n, Backend& backend, Buffer* bounce) const {
    const DLDataType to = piece.dst_dtype;
    const uint64_t src_size = dtype_size(from), dst_size = dtype_size(to);
    const bool host = piece.landing >= 0 || backend.host_memory();
    if (same_dtype(from, to) && piece.landing >= 0) {
      std::memcpy(dst, src, static_cast<std::size_t>(n) * dst_size);
    } else if (same_dtype(from, to)) {
      backend.copy_from_host(dst, src, static_cast<std::size_t>(n) * dst_size);
    } else if (host) {
      convert(src, from, dst, to, n);
    } else {
      const int64_t step = static_cast<int64_t>(kBounceBytes / std::max(src_size, dst_size));
      auto* tmp = static_cast<unsigned char*>(bounce->data());
      for (int64_t i = 0; i < n; i += step) {
        const int64_t m = std::min(step, n - i);
        convert(src + static_cast<uint64_t>(i) * src_size, from, tmp, to, m);
        backend.copy_from_host(dst + static_cast<uint64_t>(i) * dst_size, tmp,
                               static_cast<std::size_t>(m) * dst_size);
      }
    }
  }

  // A chunk's data: elements [first, end) of its saved tensor.
  struct Span {
    const unsigned char* data;
    int64_t first, end;
  };

  // Lands saved elements [s, s + n) of coded piece `index` at landing element d: each
  // local block that one saved block of the same storage holds whole, the same elements,
  // as that block's codes and absmax; the other elements as their decoded values.
  void land_codes(std::size_t index, const Span& span, int64_t s, int64_t d, int64_t n) {
    const Piece& piece = pieces_[index];
    const Landing& l = landings_[static_cast<std::size_t>(piece.landing)];
    float* values = landing_values(l);
    float* absmax = values + l.numel;
    uint8_t* codes = landing_codes(l);
    uint8_t* whole = codes + l.numel;
    const bool same = piece.coded == l.state.block;
    while (n > 0) {
      if (same && s % kBlock == 0 && d % kBlock == 0) {
        const int64_t m = std::min(kBlock, l.numel - d);
        if (m <= n && m == std::min(kBlock, piece.saved_numel - s)) {
          std::memcpy(codes + d, span.data + (s - span.first), static_cast<std::size_t>(m));
          absmax[d / kBlock] = scale(piece, s / kBlock);
          whole[d / kBlock] = 1;
          s += m, d += m, n -= m;
          continue;
        }
      }
      const int64_t m = std::min({n, kBlock - s % kBlock, kBlock - d % kBlock});
      decode(index, span, s, m, values + d);
      s += m, d += m, n -= m;
    }
  }

  // The float32 values of saved elements [s, s + n) of coded piece `index`: each block
  // decoded whole (moment_values' block_values), since which element reads as the absmax
  // depends on the whole block; the last block decoded is kept for the next call.
  void decode(std::size_t index, const Span& span, int64_t s, int64_t n, float* out) {
    const Piece& piece = pieces_[index];
    while (n > 0) {
      const int64_t b = s / kBlock, at = s % kBlock, m = std::min(n, kBlock - at);
      if (decoded_piece_ != index || decoded_block_ != b) {
        const int64_t begin = b * kBlock, len = std::min(kBlock, piece.saved_numel - begin);
        if (begin < span.first || begin + len > span.end)
          fail(SA_ERR_INTERNAL, piece.what, ": a block of codes crosses its chunk");
        const float a = scale(piece, b);
        block_values(piece.coded, piece.is_signed, span.data + (begin - span.first), &a, len,
                     block_.data());
        decoded_piece_ = index;
        decoded_block_ = b;
      }
      std::memcpy(out, block_.data() + at, static_cast<std::size_t>(m) * sizeof(float));
      s += m, out += m, n -= m;
    }
  }

  // The absmax of saved block b of a coded piece (read in phase 2).
  static float scale(const Piece& piece, int64_t b) {
    const int64_t i = b - piece.scales_first;
    if (i < 0 || i >= static_cast<int64_t>(piece.scale_values.size()))
      fail(SA_ERR_INTERNAL, piece.what, ": block ", b, " has no scale read");
    return piece.scale_values[static_cast<std::size_t>(i)];
  }

  // Stores a landing: its blocks held whole as they are, the others quantized from their
  // values by this param's blocks, in runs of such blocks.
  void store_landing(Backend& backend, const Landing& l) {
    const float* values = landing_values(l);
    float* absmax = landing_values(l) + l.numel;
    uint8_t* codes = landing_codes(l);
    const uint8_t* whole = codes + l.numel;
    for (int64_t b = 0; b < l.blocks;) {
      if (whole[b]) {
        ++b;
        continue;
      }
      int64_t e = b + 1;
      while (e < l.blocks && !whole[e]) ++e;
      const int64_t begin = b * kBlock, end = std::min(e * kBlock, l.numel);
      block_from_values(l.state.block, l.state.is_signed, values + begin, end - begin,
                        codes + begin, absmax + b);
      b = e;
    }
    write_block_codes(backend, l.state, l.numel, codes, absmax);
  }

  Optimizer& opt_;
  const std::vector<BlobReader>& readers_;
  Settings settings_;
  std::vector<ShardHeader> headers_;
  std::unordered_map<std::string, SavedParam> saved_;
  std::vector<Piece> pieces_;
  std::vector<Landing> landings_;
  int rounds_ = 1;
  // The arenas of one round's landings (allocated in phase 3; see Landing::at).
  uint64_t arena_entries_ = 0;
  std::vector<float> values_;
  std::vector<uint8_t> codes_;
  float* landing_values(const Landing& l) { return values_.data() + l.at; }
  uint8_t* landing_codes(const Landing& l) { return codes_.data() + l.at; }
  // A block of codes decoded (decode), and whose it is; decoded_: decoded elements on their
  // way into state that is not a block moment.
  std::array<float, kMomentBlock> block_{};
  std::size_t decoded_piece_ = SIZE_MAX;
  int64_t decoded_block_ = -1;
  std::vector<float> decoded_;
  std::vector<Chunk> chunks_;
  bool converts_ = false;
  bool cached_ = false;     // phase 2 keeps everything it reads in staging
  bool pipelined_ = false;  // else, phase 3 reads into one half while copying from the other
  uint64_t staging_bytes_ = 0;
  // Where chunks are read: the staging, or pipelined the optimizer's two pinned slots.
  std::shared_ptr<Buffer> slots_[2];
  // A checksum block of a read_checked call: its read, and its offset in the read's range.
  struct BlockRef {
    std::size_t read;
    uint64_t at;
  };
  std::vector<BlockRef> blocks_;
  std::vector<uint32_t> crc_scratch_;  // their checksums
  HostCopies copies_;                  // scatter's plain copies into host state, run on the pool
  std::vector<BlobReader::ReadResult> read_results_;  // and how their reads went
  uint64_t slot_bytes_ = 0;  // uncached: a batch's share of the staging (half when pipelined)
  std::unique_ptr<ThreadPool> pool_;
  int64_t skipped_params_ = 0;
  std::vector<int64_t> imported_;  // the params the files hold, which the import loads
  std::vector<std::pair<int64_t, int64_t>> restored_steps_;  // (param index, saved step count)
};

}  // namespace

void import_state(Optimizer& opt, const std::vector<BlobReader>& readers,
                  const sa_import_options& options) {
  Importer(opt, readers, settings_of(options)).run();
}

}  // namespace sa
