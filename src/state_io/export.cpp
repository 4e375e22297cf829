// src/state_io/export.cpp — one rank's state as a shard file. The header, which holds every
// block's checksum, precedes the data; it is padded to the length it has with every
// checksum at its widest, so its size is known before any checksum is. A writer with
// write_at gets the state in one pass: chunks of it (device state through two pinned
// staging buffers, the copy of one chunk overlapping the work on the one before) are
// checksummed and written block by block on all hardware threads, the header last. An
// append-only writer gets two passes (checksums, then header and data); the bytes are the
// same. Every named state is a tensor: a block moment's codes, and its blocks' absmax
// beside them.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>
#include <tuple>

#include "../backends/thread_pool.hpp"
#include "../dtype.hpp"
#include "../errors.hpp"
#include "../state_kinds.hpp"
#include "crc32c.hpp"
#include "metadata.hpp"
#include "state_io.hpp"

namespace sa {
namespace {

std::vector<WriterMesh> meshes_of(const std::vector<std::unique_ptr<Param>>& params) {
  std::vector<WriterMesh> meshes;
  for (const auto& p : params) {
    if (p->layout.mesh_shape.empty()) continue;
    WriterMesh m{p->layout.mesh_shape, p->layout.mesh_coord};
    if (std::none_of(meshes.begin(), meshes.end(), [&](const WriterMesh& seen) {
          return seen.shape == m.shape && seen.coord == m.coord;
        }))
      meshes.push_back(std::move(m));
  }
  return meshes;
}

// A run of one tensor's bytes inside a chunk: `bytes` bytes from `offset` of tensor
// `tensor` (an index into the header's tensors), at `at` in the chunk. A run starts at a
// multiple of the checksum block in its tensor, so no block is split between chunks.
struct DataRun {
  std::size_t tensor;
  uint64_t offset;
  uint64_t bytes;
  uint64_t at;
};

// What the export moves at once: consecutive runs of the data section, `bytes` in all
// (packing small tensors together, so that many small shards cost one staging round).
struct DataChunk {
  std::vector<DataRun> runs;
  uint64_t bytes = 0;
};

// The data section (the header's tensors, in their order) cut into chunks of at most
// `limit` bytes (a multiple of `block`).
std::vector<DataChunk> plan_chunks(const std::vector<SavedTensor>& tensors, uint64_t limit,
                                   uint64_t block) {
  std::vector<DataChunk> chunks;
  DataChunk current;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    for (uint64_t offset = 0; offset < tensors[k].bytes;) {
      const uint64_t rest = tensors[k].bytes - offset;
      const uint64_t room = limit - current.bytes;
      const uint64_t n = rest <= room ? rest : room / block * block;
      if (n == 0) {
        chunks.push_back(std::move(current));
        current = DataChunk{};
        continue;
      }
      current.runs.push_back({k, offset, n, current.bytes});
      current.bytes += n;
      offset += n;
    }
  }
  if (!current.runs.empty()) chunks.push_back(std::move(current));
  return chunks;
}

// Hands each chunk to `visit(chunk, base)` in order, where the chunk's run r is at
// base(r): backend memory itself on a host backend; on a device backend a copy in one of
// two pinned staging buffers, the next chunk's copy enqueued before the current chunk is
// visited, so the copy runs while the host works on the chunk before it.
class DataChunkStream {
 public:
  // `staging`: the optimizer's two staging buffers, (re)allocated here when smaller than
  // `largest` and kept for the next export.
  DataChunkStream(Backend* backend, const std::vector<const void*>& sources, uint64_t largest,
                  IoScratch& scratch)
      : backend_(backend), sources_(sources) {
    if (backend_ == nullptr || backend_->host_memory() || largest == 0) return;
    scratch.ensure_staging(*backend_, largest);
    for (int k = 0; k < 2; ++k) slots_[k] = scratch.staging[k];
  }

  template <class Visit>
  void for_each(const std::vector<DataChunk>& chunks, Visit&& visit) {
    if (!slots_[0]) {  // host memory: read in place
      for (const DataChunk& c : chunks) visit(c, [&](const DataRun& r) { return source(r); });
      return;
    }
    try {
      if (!chunks.empty()) fill(chunks[0], 0);
      for (std::size_t i = 0; i < chunks.size(); ++i) {
        backend_->synchronize_stream(nullptr);  // chunk i has landed in its slot
        if (i + 1 < chunks.size()) fill(chunks[i + 1], (i + 1) % 2);
        const auto* base = static_cast<const unsigned char*>(slots_[i % 2]->data());
        visit(chunks[i], [base](const DataRun& r) { return base + r.at; });
      }
    } catch (...) {
      backend_->synchronize_stream(nullptr);  // no copy may still write into freed staging
      throw;
    }
  }

 private:
  const unsigned char* source(const DataRun& r) const {
    return static_cast<const unsigned char*>(sources_[r.tensor]) + r.offset;
  }
  void fill(const DataChunk& c, std::size_t slot) {
    auto* base = static_cast<unsigned char*>(slots_[slot]->data());
    for (const DataRun& r : c.runs)
      backend_->download(base + r.at, source(r), static_cast<std::size_t>(r.bytes), nullptr);
  }

  Backend* backend_;
  const std::vector<const void*>& sources_;
  std::shared_ptr<Buffer> slots_[2];
};

// One checksum block of a chunk: the block starting `at` bytes into run `run`.
struct DataBlock {
  uint32_t run;
  uint64_t at;
};

// What one export writes: the header (its checksums still zero) and where each of its
// tensors' bytes are now (by header position; null when empty).
struct ExportPlan {
  ShardHeader header;
  std::vector<const void*> sources;
  uint64_t data_bytes = 0;
};

// The optimizer's state as it is now; the caller has synchronized the device.
ExportPlan plan_export(Optimizer& opt) {
  ExportPlan plan;
  ShardHeader& header = plan.header;
  header.library =
      concat("shardadam ", SA_VERSION_MAJOR, ".", SA_VERSION_MINOR, ".", SA_VERSION_PATCH);
  for (int32_t g = 0; g < opt.num_groups(); ++g)
    header.groups.push_back({opt.group(g, "group").config, opt.get_step(g)});
  header.meshes = meshes_of(opt.params());

  std::vector<int64_t> param_steps(opt.params().size());
  opt.get_param_steps(0, opt.num_params(), param_steps.data());

  std::vector<SavedTensor> tensors;
  std::vector<const void*> sources;  // each tensor's backend memory (null when empty)
  for (std::size_t i = 0; i < opt.params().size(); ++i) {
    const auto& p = opt.params()[i];
    if (!primary_replica(p->layout)) continue;
    header.param_steps[p->name] = param_steps[i];
    for (const NamedState& state : named_states(*p)) {
      SavedTensor t;
      t.param = p->name;
      t.key = state.key;
      t.dtype = state.dtype;
      t.shape = state_shape(*p, state.kind);
      if (state_kind_info(state.kind).per_block) {
        t.block_elems = kMomentBlock;  // a block moment's absmax: no box of its own
      } else {
        t.global_shape = p->layout.global_shape;
        t.global_offset = p->layout.global_offset;
      }
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      t.bytes = static_cast<uint64_t>(numel) * dtype_size(t.dtype);
      sources.push_back(t.bytes > 0 ? state.buffer->data() : nullptr);
      tensors.push_back(std::move(t));
    }
  }
  // Wider dtypes first: with the data section 8-byte aligned, every tensor then starts at
  // a multiple of its element size (what the safetensors package's own writer does).
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
  });
  for (std::size_t i : order) {
    SavedTensor& t = tensors[i];
    t.data_begin = plan.data_bytes;
    plan.data_bytes += t.bytes;
    t.crc32c.assign(static_cast<std::size_t>(block_count(t.bytes, header.block_bytes)), 0);
    header.tensors.push_back(std::move(t));
    plan.sources.push_back(sources[i]);
  }
  return plan;
}

// Copies every tensor of `plan` (host memory) to its place in the data section at `base`,
// on the pool.
void copy_in_parallel(ThreadPool& pool, const ExportPlan& plan, unsigned char* base) {
  HostCopies copies;
  for (std::size_t k = 0; k < plan.sources.size(); ++k) {
    const SavedTensor& t = plan.header.tensors[k];
    if (t.bytes > 0)
      copies.add(base + t.data_begin, plan.sources[k], static_cast<std::size_t>(t.bytes));
  }
  copies.run(pool);
}

// The export's threads, made by the first export and kept.
ThreadPool& export_pool(Optimizer& opt, IoScratch& scratch) {
  if (!scratch.threads) scratch.threads = std::make_unique<ThreadPool>(state_io_threads(opt));
  return *scratch.threads;
}

// The optimizer's scratch, after any async export still writing has ended (its threads
// and snapshot are free again). That export's failure is its own job's to report.
IoScratch& idle_scratch(Optimizer& opt) {
  IoScratch& scratch = io_scratch_of(opt);
  if (scratch.in_flight) {
    try {
      scratch.in_flight->wait();
    } catch (...) {  // reported by its own job
    }
    scratch.in_flight.reset();
  }
  return scratch;
}

// Checksums and writes `plan` through `writer`, then commits. `device`: the backend whose
// memory the sources are in, or null for host memory (read in place).
void write_export(ExportPlan& plan, Backend* device, IoScratch& scratch, ThreadPool& pool,
                  BlobWriter& writer) {
  ShardHeader& header = plan.header;
  const uint64_t block = header.block_bytes;
  const uint64_t data_bytes = plan.data_bytes;
  // Device state moves in chunks of kDeviceSlotBytes, two staged at a time; host state is
  // read in place, as one chunk.
  const std::vector<DataChunk> chunks = plan_chunks(
      header.tensors, device == nullptr ? std::max(data_bytes, block) : kDeviceSlotBytes, block);
  uint64_t largest_chunk = 0;
  for (const DataChunk& c : chunks) largest_chunk = std::max(largest_chunk, c.bytes);
  DataChunkStream stream(device, plan.sources, largest_chunk, scratch);
  // The header's size is fixed before any checksum is known: the length it has with every
  // checksum at its widest, the real one padded with spaces to it. So both ways of writing
  // below give the same bytes, and a positional writer can take the data first.
  const uint64_t header_bytes = shard_header_bound(header);
  writer.reserve(header_bytes + data_bytes);
  const bool positional = writer.positional();

  // Checksums every block of a chunk on the pool; with a positional writer each block is
  // written by the thread that checksummed it, while it is in that core's cache.
  std::vector<DataBlock> blocks;
  auto checksum_chunk = [&](const DataChunk& c, auto&& base) {
    blocks.clear();
    for (uint32_t r = 0; r < c.runs.size(); ++r)
      for (uint64_t at = 0; at < c.runs[r].bytes; at += block) blocks.push_back({r, at});
    // Block i: its tensor, its offset in that tensor and its length.
    auto locate = [&](int64_t i) {
      const DataRun& r = c.runs[blocks[i].run];
      SavedTensor& t = header.tensors[r.tensor];
      const uint64_t offset = r.offset + blocks[i].at;
      return std::make_tuple(&t, offset,
                             static_cast<std::size_t>(std::min(block, t.bytes - offset)));
    };
    std::atomic<int64_t> failed{-1};
    pool.parallel_for(static_cast<int64_t>(blocks.size()), [&](int64_t i) {
      const auto [t, offset, n] = locate(i);
      const unsigned char* data = base(c.runs[blocks[i].run]) + blocks[i].at;
      t->crc32c[offset / block] = crc32c(0, data, n);
      if (positional && writer.write_at(header_bytes + t->data_begin + offset, data, n) != 0) {
        int64_t none = -1;
        failed.compare_exchange_strong(none, i);
      }
    });
    if (failed.load() >= 0) {
      const auto [t, offset, n] = locate(failed.load());
      BlobWriter::write_at_failed(header_bytes + t->data_begin + offset, n);
    }
  };

  // Pass 1 (the only one with a positional writer): checksums, and the data written.
  stream.for_each(chunks, [&](const DataChunk& c, auto&& base) { checksum_chunk(c, base); });
  const std::string prefix = encode_shard_header(header, header_bytes);
  if (positional) {  // the header last, at offset 0
    if (writer.write_at(0, prefix.data(), prefix.size()) != 0)
      BlobWriter::write_at_failed(0, prefix.size());
  } else {  // append-only: the header, then pass 2 appends the data in order
    writer.write(prefix.data(), prefix.size());
    stream.for_each(chunks, [&](const DataChunk& c, auto&& base) {
      for (const DataRun& r : c.runs) writer.write(base(r), static_cast<std::size_t>(r.bytes));
    });
  }
  writer.commit();
}

}  // namespace

void HostCopies::add(void* dst, const void* src, std::size_t bytes) {
  constexpr std::size_t kPiece = std::size_t{1} << 20;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (std::size_t at = 0; at < bytes; at += kPiece)
    pieces_.push_back({d + at, s + at, std::min(kPiece, bytes - at)});
}

void HostCopies::run(ThreadPool& pool) const {
  pool.parallel_for(static_cast<int64_t>(pieces_.size()), [&](int64_t i) {
    const Piece& p = pieces_[static_cast<std::size_t>(i)];
    std::memcpy(p.dst, p.src, p.bytes);
  });
}

int state_io_threads(const Optimizer& opt) {
  if (opt.num_threads() > 0) return opt.num_threads();
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ExportJob::ExportJob(std::function<void()> work) {
  thread_ = std::thread([this, work = std::move(work)] {
    try {
      work();
    } catch (...) {
      failure_ = std::current_exception();
    }
    done_.store(true, std::memory_order_release);
  });
}

void ExportJob::join() {
  std::lock_guard<std::mutex> lock(join_mutex_);
  if (thread_.joinable()) thread_.join();
}

void ExportJob::wait() {
  join();
  if (failure_) std::rethrow_exception(failure_);
}

IoScratch::~IoScratch() {
  if (in_flight) in_flight->join();
}

void IoScratch::ensure_staging(Backend& backend, uint64_t bytes) {
  for (std::shared_ptr<Buffer>& slot : staging)
    if (!slot || slot->bytes() < bytes) {
      slot.reset();  // the old one goes first: peak pinned memory stays two slots
      slot = backend.allocate_staging(static_cast<std::size_t>(bytes));
    }
}

IoScratch& io_scratch_of(Optimizer& opt) {
  std::shared_ptr<IoScratch>& scratch = opt.io_scratch();
  if (!scratch) scratch = std::make_shared<IoScratch>();
  return *scratch;
}

void export_state(Optimizer& opt, const sa_writer* writer_table) {
  BlobWriter writer(writer_table);
  opt.require_usable("an export");
  IoScratch& scratch = idle_scratch(opt);
  Backend* backend = opt.backend();
  if (backend != nullptr) backend->synchronize();  // no step in flight may still write state
  ExportPlan plan = plan_export(opt);
  const bool on_host = backend == nullptr || backend->host_memory();
  write_export(plan, on_host ? nullptr : backend, scratch, export_pool(opt, scratch), writer);
}

std::shared_ptr<ExportJob> export_state_async(Optimizer& opt, const sa_writer* writer_table) {
  BlobWriter writer(writer_table);
  opt.require_usable("an export");
  IoScratch& scratch = idle_scratch(opt);
  ThreadPool& pool = export_pool(opt, scratch);
  Backend* backend = opt.backend();
  if (backend != nullptr) backend->synchronize();  // no step in flight may still write state
  ExportPlan plan = plan_export(opt);

  // The snapshot: every tensor at its place in the data section, in memory the optimizer
  // keeps (pinned for device state), grown only when the state is larger than ever before.
  if (plan.data_bytes > 0) {
    if (!scratch.snapshot || scratch.snapshot->bytes() < plan.data_bytes) {
      scratch.snapshot.reset();  // the old one goes first: peak memory stays one snapshot
      scratch.snapshot = backend->allocate_staging(static_cast<std::size_t>(plan.data_bytes));
    }
    auto* base = static_cast<unsigned char*>(scratch.snapshot->data());
    if (backend->host_memory()) {
      copy_in_parallel(pool, plan, base);
    } else {
      try {
        for (std::size_t k = 0; k < plan.sources.size(); ++k)
          if (plan.sources[k] != nullptr)
            backend->download(base + plan.header.tensors[k].data_begin, plan.sources[k],
                              static_cast<std::size_t>(plan.header.tensors[k].bytes), nullptr);
      } catch (...) {
        backend->synchronize_stream(nullptr);  // no copy may still write into the snapshot
        throw;
      }
      backend->synchronize_stream(nullptr);
    }
    for (std::size_t k = 0; k < plan.sources.size(); ++k)
      if (plan.sources[k] != nullptr) plan.sources[k] = base + plan.header.tensors[k].data_begin;
  }
  // The job reads the snapshot and runs on the pool, both kept by the scratch, whose
  // destructor waits for it.
  scratch.in_flight =
      std::make_shared<ExportJob>([plan = std::move(plan), writer, &scratch, &pool]() mutable {
        write_export(plan, nullptr, scratch, pool, writer);
      });
  return scratch.in_flight;
}

}  // namespace sa
