// src/state_io/state_io.hpp — shard files: export of one rank's state, import (resharding)
// of any set of them, inspection, and the ready-made readers and writers. The C entry
// points (src/api_state_io.cpp) call these; the format is in metadata.hpp.
#ifndef SHARDADAM_SRC_STATE_IO_STATE_IO_HPP_
#define SHARDADAM_SRC_STATE_IO_STATE_IO_HPP_

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../backends/thread_pool.hpp"
#include "../optimizer.hpp"
#include "blob.hpp"
#include "shardadam/shardadam.h"

namespace sa {

// Default staging size of an import.
inline constexpr uint64_t kDefaultStagingBytes = uint64_t{64} << 20;

// Copies between host buffers, run at once on a pool: an async export's snapshot, an
// import's plain copies into host state. add() cuts a copy into pieces of at most 1 MiB,
// so that large and small ones spread evenly over the threads.
class HostCopies {
 public:
  void clear() { pieces_.clear(); }
  void add(void* dst, const void* src, std::size_t bytes);
  void run(ThreadPool& pool) const;

 private:
  struct Piece {
    unsigned char* dst;
    const unsigned char* src;
    std::size_t bytes;
  };
  std::vector<Piece> pieces_;
};

// How many threads an export or import checksums, reads and writes on: the optimizer's
// worker count (sa_optimizer_config.num_threads; 0: every hardware thread), as a CPU step.
int state_io_threads(const Optimizer& opt);

// Work on a thread of its own: an async export's checksums and writes. What the work
// throws is kept and rethrown by wait() (the C ABI turns it into a status there).
class ExportJob {
 public:
  explicit ExportJob(std::function<void()> work);
  ~ExportJob() { join(); }
  ExportJob(const ExportJob&) = delete;
  ExportJob& operator=(const ExportJob&) = delete;

  // Whether the work has ended (then wait() returns at once).
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Waits for the work to end; rethrows what it threw. Safe from several threads.
  void wait();
  // Waits for the work to end, whatever it threw.
  void join();

 private:
  std::atomic<bool> done_{false};
  std::exception_ptr failure_;  // written by the work's thread before done_
  std::mutex join_mutex_;
  std::thread thread_;
};

// Device state moves between device and host through two pinned slots of at most this
// many bytes (an export's chunks, an import's batches).
inline constexpr uint64_t kDeviceSlotBytes = kDefaultStagingBytes / 2;

// What exports and imports keep on their optimizer between calls (Optimizer::io_scratch):
// the two pinned slots device state moves through (grown to the largest yet), the
// snapshot an async export copies the state into (grown to the largest state yet), the
// threads an export checksums and writes on, and the async export still writing, if any.
// Its destructor waits for that one: the job's thread reads the snapshot and runs on the
// threads.
struct IoScratch {
  std::shared_ptr<Buffer> staging[2];
  std::shared_ptr<Buffer> snapshot;
  std::unique_ptr<ThreadPool> threads;
  std::shared_ptr<ExportJob> in_flight;
  ~IoScratch();

  // The two pinned slots, each of at least `bytes` (made or grown here for `backend`).
  void ensure_staging(Backend& backend, uint64_t bytes);
};

// The optimizer's scratch, made on first use.
IoScratch& io_scratch_of(Optimizer& opt);

// sa_optimizer_export.
void export_state(Optimizer& opt, const sa_writer* writer);

// sa_optimizer_export_async: returns once the state is copied into the optimizer's
// snapshot; the job checksums and writes it (and commits) on a thread of its own.
std::shared_ptr<ExportJob> export_state_async(Optimizer& opt, const sa_writer* writer);

// sa_optimizer_import; `options` has been read with read_options (defaults filled in).
void import_state(Optimizer& opt, const std::vector<BlobReader>& readers,
                  const sa_import_options& options);

// sa_inspect's report (JSON text).
std::string inspect_shards(const std::vector<BlobReader>& readers, bool verify_data);

// The ready readers and writers (io_callbacks.cpp). Failures throw sa::Error(SA_ERR_IO).
sa_writer make_file_writer(const char* path);
sa_writer make_memory_writer();
// The bytes of a memory writer; SA_ERR_INVALID_ARGUMENT for any other writer.
void memory_writer_data(const sa_writer& writer, const void** data, std::size_t* size);
sa_reader make_file_reader(const char* path);
sa_reader make_memory_reader(const void* data, std::size_t size);

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_STATE_IO_HPP_
