// src/state_io/import.cpp — resharding: loads any set of shard files into this optimizer's
// existing state buffers.
//
// Phases, and what a failure in each leaves behind:
//  1. plan     headers, the name index, tiling, dtypes, keys, groups;    nothing changed
//              the pieces and chunks to copy (import_plan.cpp)
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
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../backends/thread_pool.hpp"
#include "../dtype.hpp"
#include "../errors.hpp"
#include "../moment_values.hpp"
#include "crc32c.hpp"
#include "import_plan.hpp"
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

using Piece = ImportPlan::Piece;
using Landing = ImportPlan::Landing;
using Chunk = ImportPlan::Chunk;

// Moments convert between their element dtypes (float32 and bfloat16 today: the pairs
// plan_import lets through) with the kernels' rounding (dtype.hpp's convert_elems).
void convert(const unsigned char* src, DLDataType from, unsigned char* dst, DLDataType to,
             int64_t n) {
  const std::optional<ElemType> from_type = elem_type_of(from), to_type = elem_type_of(to);
  if (!from_type || !to_type)
    fail(SA_ERR_INTERNAL, "a conversion from ", dtype_name(from), " to ", dtype_name(to));
  convert_elems(*from_type, src, *to_type, dst, n);
}

class Importer {
 public:
  Importer(Optimizer& opt, const std::vector<BlobReader>& readers, const ImportSettings& settings,
           ImportPlan plan)
      : opt_(opt), readers_(readers), settings_(settings), plan_(std::move(plan)) {}

  // Phases 2 and 3 of the plan (phase 1: plan_import).
  void run() {
    verify();
    apply();
  }

 private:
  // ---- phase 2 ------------------------------------------------------------------------

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
      return plan_.headers[r.file].data_section + r.tensor->data_begin + r.begin;
    };
    auto what = [](const Read& r) { return concat("tensor '", r.tensor->name(), "'"); };
    blocks_.clear();
    for (std::size_t i = 0; i < reads.size(); ++i) {
      const Read& r = reads[i];
      if (!readers_[r.file].concurrent())
        readers_[r.file].read(offset_of(r), r.dst, static_cast<std::size_t>(r.bytes),
                              what(r).c_str());
      for (uint64_t at = 0; at < r.bytes; at += plan_.headers[r.file].block_bytes)
        blocks_.push_back({i, at});
    }
    crc_scratch_.resize(blocks_.size());
    read_results_.assign(blocks_.size(), BlobReader::ReadResult::ok);
    pool().parallel_for(static_cast<int64_t>(blocks_.size()), [&](int64_t i) {
      const auto k = static_cast<std::size_t>(i);
      const Read& r = reads[blocks_[k].read];
      const uint64_t at = blocks_[k].at;
      const auto n =
          static_cast<std::size_t>(std::min(plan_.headers[r.file].block_bytes, r.bytes - at));
      const BlobReader& reader = readers_[r.file];
      if (reader.concurrent()) read_results_[k] = reader.try_read(offset_of(r) + at, r.dst + at, n);
      if (read_results_[k] == BlobReader::ReadResult::ok)
        crc_scratch_[k] = crc32c(0, r.dst + at, n);
    });
    for (std::size_t k = 0; k < blocks_.size(); ++k) {
      const Read& r = reads[blocks_[k].read];
      const uint64_t block = plan_.headers[r.file].block_bytes;
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

  // `chunks` where phase 2 keeps them all (cached): each at its cache_at.
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
      const Piece& piece = plan_.pieces[p.chunk->piece];
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
    const uint64_t block_bytes = plan_.headers[piece.file].block_bytes;
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
    Backend* backend = opt_.backend();
    if (plan_.chunks.empty() || backend == nullptr) return;
    // Pipelined: the optimizer's two pinned slots, kept for its next imports and exports.
    if (plan_.pipelined) {
      IoScratch& scratch = io_scratch_of(opt_);
      scratch.ensure_staging(*backend, plan_.slot_bytes);
      slots_[0] = scratch.staging[0];
      slots_[1] = scratch.staging[1];
    } else {
      slots_[0] = backend->allocate_staging(static_cast<std::size_t>(plan_.staging_bytes));
    }
    auto* base = static_cast<unsigned char*>(slots_[0]->data());
    std::vector<const Chunk*> all;
    for (const Chunk& c : plan_.chunks) all.push_back(&c);
    if (plan_.cached) {  // everything, at once, where phase 3 finds it
      read_checked(reads_of(cached_batch(all), base), SA_ERR_FORMAT);
    } else if (!settings_.read_once) {  // read_once: each chunk is read as it is copied
      for (const Batch& batch : batches_of(all, plan_.slot_bytes))
        read_checked(reads_of(batch, base), SA_ERR_FORMAT);
    }
    for (Piece& piece : plan_.pieces)
      if (piece.scales != nullptr) read_scales(piece);
  }

  // ---- phase 3 ------------------------------------------------------------------------

  void apply() {
    Backend* backend = opt_.backend();
    const std::string previous_reason = opt_.unusable_reason();
    if (backend != nullptr && !plan_.chunks.empty()) {
      // Everything the copy needs is allocated before the first byte of state changes.
      std::vector<RunCursor> cursors;
      cursors.reserve(plan_.pieces.size());
      for (const Piece& p : plan_.pieces) cursors.emplace_back(p.box, p.from, p.to);
      std::shared_ptr<Buffer> bounce;
      if (plan_.converts && !backend->host_memory())
        bounce = backend->allocate_staging(kBounceBytes);
      try {
        values_.resize(static_cast<std::size_t>(plan_.arena_entries));
        codes_.resize(static_cast<std::size_t>(plan_.arena_entries));
        decoded_.resize(kDecodeElems);
      } catch (const std::bad_alloc&) {
        fail(SA_ERR_OUT_OF_MEMORY, "cannot allocate the ",
             plan_.arena_entries * (sizeof(float) + 1),
             " bytes of host memory that block moments land in; nothing was changed");
      }
      backend->synchronize();  // no step in flight may still use the state
      opt_.mark_unusable("an import failed while it was copying state");
      try {
        // Round r copies the other states (r = 0) and the pieces of its landings, then
        // quantizes those by this param's blocks and writes them up. A chunk belongs to
        // one piece, and so to one round: each is read once.
        for (int round = 0; round < plan_.rounds; ++round) {
          for (const Landing& l : plan_.landings)
            if (l.round == round) std::fill_n(landing_codes(l) + l.numel, l.blocks, uint8_t{0});
          copy_chunks(*backend, cursors, bounce.get(), round);
          for (const Landing& l : plan_.landings)
            if (l.round == round) store_landing(*backend, l);
        }
        // An fp8 param follows from its master, which was just loaded: cast it (and its
        // scales) with its scaling, as a step would.
        opt_.cast_params_from_master(plan_.imported);
      } catch (const Error& e) {
        opt_.mark_unusable(concat("an import failed while it was copying state (", e.what(), ")"));
        fail(e.status() == SA_ERR_FORMAT && !settings_.read_once ? SA_ERR_IO : e.status(), e.what(),
             "; the state is now partly overwritten, so the optimizer refuses to step until an "
             "import succeeds");
      }
    }
    if (settings_.restore_groups && !plan_.headers.empty()) {
      // Params the files do not hold (allow_missing) keep their counts; setting a group's
      // count sets its params', so theirs are put back after it.
      std::vector<int64_t> steps(opt_.params().size());
      opt_.get_param_steps(0, opt_.num_params(), steps.data());
      const auto& groups = plan_.headers[0].groups;
      for (std::size_t g = 0; g < groups.size(); ++g) {  // checked in plan(): cannot fail
        opt_.set_group(static_cast<int32_t>(g), groups[g].config);
        opt_.set_step(static_cast<int32_t>(g), groups[g].step);
      }
      for (const auto& [index, step] : plan_.restored_steps)
        steps[static_cast<std::size_t>(index)] = step;
      opt_.set_param_steps(0, opt_.num_params(), steps.data());
    }
    // A param skipped by allow_missing keeps whatever state it had: if an earlier import
    // left it half written, it still is.
    if (plan_.skipped_params == 0) {
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
    for (const Chunk& c : plan_.chunks) {
      const int landing = plan_.pieces[c.piece].landing;
      if ((landing < 0 ? 0 : plan_.landings[static_cast<std::size_t>(landing)].round) == round)
        chunks.push_back(&c);
    }
    if (plan_.cached) {
      scatter(cached_batch(chunks), base, cursors, backend, bounce);
      return;
    }
    // Read again after phase 2 (the blob may have changed since: SA_ERR_IO), or for the
    // first time with read_once (a mismatch is damage: SA_ERR_FORMAT).
    const sa_status status = settings_.read_once ? SA_ERR_FORMAT : SA_ERR_IO;
    const std::vector<Batch> batches = batches_of(chunks, plan_.slot_bytes);
    auto slot = [&](std::size_t k) {
      return static_cast<unsigned char*>(slots_[plan_.pipelined ? k % 2 : 0]->data());
    };
    if (!batches.empty()) read_checked(reads_of(batches[0], slot(0)), status);
    for (std::size_t k = 0; k < batches.size(); ++k) {
      std::exception_ptr read_failure;
      std::thread next;
      if (plan_.pipelined && k + 1 < batches.size())
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
      if (!plan_.pipelined && k + 1 < batches.size())
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
      const Piece& piece = plan_.pieces[c.piece];
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
    const Piece& piece = plan_.pieces[c.piece];
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
    const Piece& piece = plan_.pieces[c.piece];
    const uint64_t src_size = dtype_size(piece.saved->dtype);
    const uint64_t dst_size = dtype_size(piece.dst_dtype);
    const Span span{data, static_cast<int64_t>(c.begin / src_size),
                    static_cast<int64_t>((c.begin + c.bytes) / src_size)};
    // A block moment lands in host memory (see Landing); everything else goes to state.
    auto* dst_base = piece.landing >= 0
                         ? reinterpret_cast<unsigned char*>(landing_values(
                               plan_.landings[static_cast<std::size_t>(piece.landing)]))
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
    const Piece& piece = plan_.pieces[index];
    const Landing& l = plan_.landings[static_cast<std::size_t>(piece.landing)];
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
    const Piece& piece = plan_.pieces[index];
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
  ImportSettings settings_;
  ImportPlan plan_;  // phase 2 reads its coded pieces' scales into it (read_scales)
  // The arenas of one round's landings (allocated in phase 3; see Landing::at).
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
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace

void import_state(Optimizer& opt, const std::vector<BlobReader>& readers,
                  const sa_import_options& options) {
  const ImportSettings settings = import_settings(options);
  Importer(opt, readers, settings, plan_import(opt, readers, settings)).run();
}

}  // namespace sa
