// state_io.cpp — what a checkpoint and a resume cost: export and import of ~1 GiB of
// optimizer state through shard files, each against a baseline measured in the same run,
// with the import's peak memory.
//
// Four simulated ranks (uneven Shard(0)) each take one step and export (to sa_memory_writer,
// and to a shard file with its fsync); then one unsharded optimizer imports all four files
// (a 4 -> 1 reshard), and another imports the same bytes from memory. One line per measure:
//   export to memory     vs memcpy of the same bytes on as many threads as the export uses
//                        (a GPU: the pinned D2H copy of the same bytes)
//   export to file       vs a plain write + fsync of the same bytes (files beside them)
//   import from memory   vs memcpy (as above; a GPU: the pinned H2D copy)
//   import from file     vs a plain read of the same files (page cache)
//   ..., read once       the same with sa_import_options.read_once (read each byte once
//                        even when the data exceed the staging)
//   async export blocks  how long sa_optimizer_export_async holds the caller (its second
//                        call: the first makes the snapshot), vs memcpy into a ready buffer
//                        (a GPU: pinned D2H); "async export total" until its job ended
//   D2H, H2D             (a GPU) pinned cudaMemcpy of the state's bytes, and the export into
//                        a ready buffer / a writer that keeps nothing, which split the
//                        export's time between its copies and the destination's
//   D2H + memcpy at once (a GPU) the D2H copy and a pinned -> ready-buffer copy of the same
//                        bytes on the export's threads, run together: the floor of an
//                        export into pageable memory (the host's memory bandwidth, shared)
// Both sides checksum every byte (CRC-32C, on all cores): export once, import twice when
// the data exceed the staging buffer (once to verify before anything is written, once as
// each block is applied) unless read once.
// The import from files also reports its increase of peak RSS (VmHWM after resetting it
// through /proc/self/clear_refs), against the staging size. The import copies into the
// existing state, so the increase must stay within staging + O(headers): the program fails
// (exit 1) when it exceeds staging + 16 MiB + 4x the headers.
// Correctness: every imported state is compared (by a 64-bit hash) with what its rank held,
// and every async export's bytes with the synchronous export's.
//
// With --moments uint8 the moments are 8-bit block moments, which the files hold as their
// codes and absmax: the import lands them in host memory, where each block a saved block
// holds whole (here every one: the block grid of 1024-element rows agrees on any Shard(0)
// split) is taken as saved, any other quantized from its decoded values; with that landing
// the bound is twice the staging size (sa_import_options).
//
// --device cuda (a build with CUDA) keeps params, grads and state on GPU 0.
//
//   state_io [--gib G] [--staging-mib M] [--dir DIR] [--threads N] [--moments float32|uint8]
//            [--device cpu|cuda]
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shardadam/shardadam.h"

#ifdef SA_BENCH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRanks = 4;
constexpr int64_t kCols = 1024;

struct Options {
  double gib = 1.0;
  uint64_t staging_mib = 64;
  std::string dir;
  int threads = 0;
  bool uint8_moments = false;  // --moments uint8: 8-bit block moments (codes + absmax)
  bool cuda = false;           // --device cuda
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "state_io: %s\n", what.c_str());
  std::exit(2);
}

void ok(sa_status s, const sa_optimizer* opt, const char* what) {
  if (s != SA_OK) die(std::string(what) + ": " + sa_optimizer_last_error(opt));
}

#ifdef SA_BENCH_CUDA
void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A status line of /proc/self/status in bytes ("VmRSS", "VmHWM"), or -1.
int64_t proc_status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key) + 1) * 1024;
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false where that is not possible.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out) && proc_status_bytes("VmHWM:") <= proc_status_bytes("VmRSS:") + (1 << 20);
}

uint64_t hash_bytes(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x9E3779B97F4A7C15ull ^ bytes;
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

float value_at(uint64_t i, uint64_t salt) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ salt;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return static_cast<float>(static_cast<double>(x % 2000001) / 1e6 - 1.0);
}

// A float32 tensor: its values in `data`, and on a GPU a device copy that the optimizer
// gets instead.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  float* device = nullptr;
  DLManagedTensorVersioned managed{};
  HostTensor() = default;
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  ~HostTensor() {
#ifdef SA_BENCH_CUDA
    if (device != nullptr) cudaFree(device);
#endif
  }
  void to_device() {
#ifdef SA_BENCH_CUDA
    cuda_ok(cudaMalloc(&device, std::max<std::size_t>(1, data.size()) * sizeof(float)), "cudaMalloc");
    cuda_ok(cudaMemcpy(device, data.data(), data.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
#endif
  }
  DLTensor dl() {
    DLTensor t{};
    t.data = device != nullptr ? static_cast<void*>(device) : static_cast<void*>(data.data());
    t.device = {device != nullptr ? kDLCUDA : kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape.data();
    return t;
  }
  DLManagedTensorVersioned* versioned() {
    managed.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    managed.dl_tensor = dl();
    return &managed;
  }
};

// One optimizer over the params' boxes of `rank` (rank < 0: unsharded).
struct Model {
  sa_optimizer* opt = nullptr;
  std::vector<std::unique_ptr<HostTensor>> params, grads;
  std::vector<int64_t> row_offset;

  Model(const std::vector<int64_t>& rows, int rank, int threads, bool step, bool uint8_moments, bool cuda) {
    sa_optimizer_config config = SA_OPTIMIZER_CONFIG_INIT;
    config.num_threads = threads;
    ok(sa_optimizer_create(&config, &opt), nullptr, "create");
    sa_group_config group = SA_GROUP_CONFIG_INIT;
    ok(sa_optimizer_add_group(opt, &group, nullptr), opt, "add_group");
    for (std::size_t k = 0; k < rows.size(); ++k) {
      int64_t global[2] = {rows[k], kCols}, mesh[1] = {kRanks}, coord[1] = {rank};
      const sa_placement shard0 = {SA_PLACEMENT_SHARD, 0};
      sa_layout layout = SA_LAYOUT_INIT;
      layout.ndim = 2;
      layout.global_shape = global;
      layout.mesh_ndim = rank < 0 ? 0 : 1;
      layout.mesh_shape = mesh;
      layout.mesh_coord = coord;
      layout.placements = &shard0;
      int64_t local[2], offset[2];
      ok(sa_layout_local_box(&layout, local, offset), nullptr, "local_box");
      auto p = std::make_unique<HostTensor>();
      p->shape = {local[0], local[1]};
      p->data.resize(static_cast<std::size_t>(local[0] * local[1]));
      const uint64_t base = static_cast<uint64_t>(offset[0] * kCols);
      for (std::size_t i = 0; i < p->data.size(); ++i) p->data[i] = value_at(base + i, k);
      if (cuda) p->to_device();
      sa_param_options options = SA_PARAM_OPTIONS_INIT;
      if (uint8_moments) options.moment_dtype = {kDLUInt, 8, 1};
      ok(sa_optimizer_add_param(opt, ("layers." + std::to_string(k) + ".w").c_str(), 0, p->versioned(),
                                &layout, &options, nullptr),
         opt, "add_param");
      row_offset.push_back(offset[0]);
      if (step) {
        auto g = std::make_unique<HostTensor>();
        g->shape = p->shape;
        g->data.resize(p->data.size());
        for (std::size_t i = 0; i < g->data.size(); ++i) g->data[i] = 1e-3f * value_at(base + i, k + 7777);
        if (cuda) g->to_device();
        DLTensor t = g->dl();
        ok(sa_optimizer_set_grad(opt, static_cast<int64_t>(k), &t), opt, "set_grad");
        grads.push_back(std::move(g));
      }
      params.push_back(std::move(p));
    }
    if (step) ok(sa_optimizer_step(opt, nullptr, nullptr), opt, "step");
#ifdef SA_BENCH_CUDA
    if (cuda) cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
  }
  ~Model() { sa_optimizer_destroy(opt); }

  // The hash of rows [r0, r0 + n) of a state of param k (every state here, block absmax
  // values included, holds the same number of bytes per row of the param).
  uint64_t state_hash(std::size_t k, const char* key, int64_t r0, int64_t n) const {
    DLManagedTensorVersioned* view = nullptr;
    ok(sa_optimizer_state_view(opt, static_cast<int64_t>(k), key, &view), opt, "state_view");
    const DLTensor& t = view->dl_tensor;
    int64_t numel = 1;
    for (int32_t d = 0; d < t.ndim; ++d) numel *= t.shape[d];
    const auto row_bytes = static_cast<std::size_t>(numel * t.dtype.bits / 8 / params[k]->shape[0]);
    const auto* data = static_cast<const unsigned char*>(t.data);
    std::vector<unsigned char> copy;
#ifdef SA_BENCH_CUDA
    if (t.device.device_type == kDLCUDA) {
      copy.resize(static_cast<std::size_t>(n) * row_bytes);
      cuda_ok(cudaMemcpy(copy.data(), data + static_cast<std::size_t>(r0) * row_bytes, copy.size(),
                         cudaMemcpyDeviceToHost),
              "cudaMemcpy");
      data = copy.data() - static_cast<std::size_t>(r0) * row_bytes;
    }
#endif
    const uint64_t h = hash_bytes(data + static_cast<std::size_t>(r0) * row_bytes, static_cast<std::size_t>(n) * row_bytes);
    view->deleter(view);
    return h;
  }
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) die("missing value after " + arg);
      return argv[++i];
    };
    if (arg == "--gib") {
      o.gib = std::atof(next());
    } else if (arg == "--staging-mib") {
      o.staging_mib = std::strtoull(next(), nullptr, 10);
    } else if (arg == "--dir") {
      o.dir = next();
    } else if (arg == "--threads") {
      o.threads = std::atoi(next());
    } else if (arg == "--moments") {
      const std::string m = next();
      if (m != "float32" && m != "uint8") die("--moments takes float32 or uint8");
      o.uint8_moments = m == "uint8";
    } else if (arg == "--device") {
      const std::string d = next();
      if (d != "cpu" && d != "cuda") die("--device takes cpu or cuda");
      o.cuda = d == "cuda";
#ifndef SA_BENCH_CUDA
      if (o.cuda) die("--device cuda: this build of the benchmark has no CUDA");
#endif
    } else {
      die("usage: state_io [--gib G] [--staging-mib M] [--dir DIR] [--threads N] [--moments float32|uint8] "
          "[--device cpu|cuda]");
    }
  }
  if (o.gib <= 0 || o.staging_mib == 0) die("--gib and --staging-mib must be positive");
  return o;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace

using Bytes = std::vector<unsigned char>;

// A writer into a buffer that exists already (allocated and touched once, as a caller's
// reused checkpoint buffer is), or one that keeps nothing (`keep` false): the destination's
// own cost taken out of an export's.
struct ReadyBuffer {
  Bytes bytes;
  bool keep = true;
  sa_writer table() {
    sa_writer w = SA_WRITER_INIT;
    w.ctx = this;
    w.write = [](void*, const void*, std::size_t) { return 1; };  // never called: write_at is there
    w.write_at = [](void* ctx, uint64_t offset, const void* data, std::size_t n) {
      auto* b = static_cast<ReadyBuffer*>(ctx);
      if (!b->keep) return 0;
      if (offset + n > b->bytes.size()) return 1;
      std::memcpy(b->bytes.data() + offset, data, n);
      return 0;
    };
    w.reserve = [](void* ctx, uint64_t n) {
      auto* b = static_cast<ReadyBuffer*>(ctx);
      return b->keep && n > b->bytes.size() ? 1 : 0;
    };
    return w;
  }
};

// The bytes a memory writer holds.
Bytes memory_writer_bytes(const sa_writer& writer) {
  const void* data = nullptr;
  std::size_t size = 0;
  ok(sa_memory_writer_data(&writer, &data, &size), nullptr, "memory_writer_data");
  return Bytes(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + size);
}

// memcpy of n bytes split over `threads` threads, as the export spreads its work.
void parallel_memcpy(unsigned char* dst, const unsigned char* src, std::size_t n, int threads) {
  std::vector<std::thread> workers;
  const std::size_t part = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    const std::size_t begin = std::min(n, part * t), end = std::min(n, begin + part);
    workers.emplace_back([=] { std::memcpy(dst + begin, src + begin, end - begin); });
  }
  for (std::thread& w : workers) w.join();
}

// The bytes written to a new file with write(2), then fsync, as a program without shardadam
// would save them.
void write_plain(const std::string& path, const Bytes& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) die("cannot create " + path);
  for (std::size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (n <= 0) die("cannot write " + path);
    at += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) die("cannot fsync " + path);
}

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  namespace fs = std::filesystem;
  const fs::path dir = o.dir.empty() ? fs::temp_directory_path() / ("shardadam_state_io_" + std::to_string(::getpid()))
                                     : fs::path(o.dir);
  fs::create_directories(dir);

  // Params [rows, 1024] fp32 of uneven row counts; state = exp_avg + exp_avg_sq = 8 B/elem
  // (8-bit: a code each and a float32 absmax per 256 elements each, 2 + 8/256 B/elem, in
  // the files too; rows of 1024 keep the block grids of any Shard(0) split in step, so the
  // import copies every block as saved, through the landing arena).
  const int64_t total_rows = static_cast<int64_t>(o.gib * double(1 << 30) / 8.0 / kCols);
  const std::vector<const char*> keys =
      o.uint8_moments ? std::vector<const char*>{"exp_avg", "exp_avg_sq", "exp_avg_absmax", "exp_avg_sq_absmax"}
                      : std::vector<const char*>{"exp_avg", "exp_avg_sq"};
  std::vector<int64_t> rows;
  for (int64_t left = total_rows, k = 0; left > 0; ++k) {
    const int64_t r = std::min<int64_t>(left, 4096 + (k * 2731) % 8192 + 3);  // odd sizes: uneven splits
    rows.push_back(r);
    left -= r;
  }
  const double state_bytes = double(total_rows) * kCols * (o.uint8_moments ? 2.0 + 8.0 / 256 : 8.0);
  std::printf("state_io: %.3f GiB of %s Adam state (%zu params [rows, %lld]), saved on %d ranks "
              "(uneven Shard(0)), loaded on 1\nmachine: %s, %ld hardware threads\n",
              state_bytes / double(1 << 30), o.uint8_moments ? "8-bit" : "fp32", rows.size(),
              static_cast<long long>(kCols), kRanks,
              cpu_name().c_str(), sysconf(_SC_NPROCESSORS_ONLN));

  // ---- export: each rank steps once, exports to memory and writes its file ------------------
  std::vector<std::string> paths;
  std::vector<Bytes> blobs;  // the memory exports (the import from memory reads them)
  std::vector<std::vector<std::vector<uint64_t>>> hashes(kRanks);  // [rank][param][key]
  std::vector<std::vector<std::pair<int64_t, int64_t>>> boxes(kRanks);     // [rank][param] (row0, rows)
  double file_export_seconds = 0, memory_export_seconds = 0, ready_export_seconds = 0, null_export_seconds = 0;
  double async_block_seconds = 0, async_total_seconds = 0;
  int async_mismatches = 0;
  uint64_t file_bytes = 0;
  for (int r = 0; r < kRanks; ++r) {
    Model rank(rows, r, o.threads, true, o.uint8_moments, o.cuda);
    {
      sa_writer memory = SA_WRITER_INIT;
      ok(sa_memory_writer(&memory), nullptr, "memory_writer");
      const auto t0 = Clock::now();
      ok(sa_optimizer_export(rank.opt, &memory), rank.opt, "export");
      memory_export_seconds += seconds_since(t0);
      blobs.push_back(memory_writer_bytes(memory));
      sa_writer_release(&memory);
    }
    {  // into a ready buffer, and into nothing (the export's own cost)
      ReadyBuffer ready;
      ready.bytes.assign(blobs.back().size(), 0);
      sa_writer table = ready.table();
      const auto t0 = Clock::now();
      ok(sa_optimizer_export(rank.opt, &table), rank.opt, "export to a ready buffer");
      ready_export_seconds += seconds_since(t0);
      if (ready.bytes != blobs.back()) die("the export into a ready buffer differs from the memory writer's");
      ReadyBuffer nothing;
      nothing.keep = false;
      table = nothing.table();
      const auto t1 = Clock::now();
      ok(sa_optimizer_export(rank.opt, &table), rank.opt, "export to a writer that keeps nothing");
      null_export_seconds += seconds_since(t1);
    }
    // Async: the first makes the snapshot (timed apart: once per optimizer), the second
    // is what every later save costs the caller.
    for (int round = 0; round < 2; ++round) {
      sa_writer memory = SA_WRITER_INIT;
      ok(sa_memory_writer(&memory), nullptr, "memory_writer");
      sa_export_job* job = nullptr;
      const auto t0 = Clock::now();
      ok(sa_optimizer_export_async(rank.opt, &memory, &job), rank.opt, "export_async");
      const double blocked = seconds_since(t0);
      const sa_status status = sa_export_job_wait(job);
      const double total = seconds_since(t0);
      if (status != SA_OK) die(std::string("async export: ") + sa_export_job_last_error(job));
      sa_export_job_release(job);
      async_mismatches += memory_writer_bytes(memory) != blobs.back();
      sa_writer_release(&memory);
      if (round == 1) async_block_seconds += blocked, async_total_seconds += total;
    }
    paths.push_back((dir / ("rank" + std::to_string(r) + ".safetensors")).string());
    sa_writer writer = SA_WRITER_INIT;
    ok(sa_file_writer(paths.back().c_str(), &writer), nullptr, "file_writer");
    const auto t0 = Clock::now();
    ok(sa_optimizer_export(rank.opt, &writer), rank.opt, "export");
    file_export_seconds += seconds_since(t0);
    sa_writer_release(&writer);
    file_bytes += fs::file_size(paths.back());
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const int64_t n = rank.params[k]->shape[0];
      hashes[r].emplace_back();
      for (const char* key : keys) hashes[r].back().push_back(rank.state_hash(k, key, 0, n));
      boxes[r].push_back({rank.row_offset[k], n});
    }
  }

  // ---- baselines, same machine, same moment -------------------------------------------------
  const int threads = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));  // the export's
  double memcpy_gbs = 0, memcpy1_gbs = 0, write_gbs = 0, read_gbs = 0, ready_memcpy_gbs = 0, d2h_gbs = 0,
         h2d_gbs = 0, d2h_copy_gbs = 0, pin_seconds = 0;
  {
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(state_bytes), std::size_t{1} << 30);
    Bytes a(n, 1), b(n, 2);
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    memcpy1_gbs = double(n) / seconds_since(t0) / 1e9;
    // Into a new malloc'd buffer, as an export into a new memory blob writes: the kernel's
    // first touch of each page is part of the cost on both sides. The best of 3 (on a VM
    // the first touch of memory the guest never used costs several times more).
    for (int round = 0; round < 3; ++round) {
      void* fresh = std::malloc(n);
      if (fresh == nullptr) die("out of memory");
      const auto t1 = Clock::now();
      parallel_memcpy(static_cast<unsigned char*>(fresh), a.data(), n, threads);
      memcpy_gbs = std::max(memcpy_gbs, double(n) / seconds_since(t1) / 1e9);
      std::free(fresh);
    }
    // Into a buffer touched before: what an async export's snapshot copies into.
    const auto t2 = Clock::now();
    parallel_memcpy(b.data(), a.data(), n, threads);
    ready_memcpy_gbs = double(n) / seconds_since(t2) / 1e9;
  }
#ifdef SA_BENCH_CUDA
  if (o.cuda) {  // pinned copies of the state's bytes: the link, each way (best of 3)
    const auto n = static_cast<std::size_t>(state_bytes);
    void *device = nullptr, *pinned = nullptr;
    cuda_ok(cudaMalloc(&device, n), "cudaMalloc");
    cuda_ok(cudaMallocHost(&pinned, n), "cudaMallocHost");
    std::memset(pinned, 1, n);
    for (int round = 0; round < 3; ++round) {
      auto t0 = Clock::now();
      cuda_ok(cudaMemcpy(pinned, device, n, cudaMemcpyDeviceToHost), "D2H");
      d2h_gbs = std::max(d2h_gbs, double(n) / seconds_since(t0) / 1e9);
      t0 = Clock::now();
      cuda_ok(cudaMemcpy(device, pinned, n, cudaMemcpyHostToDevice), "H2D");
      h2d_gbs = std::max(h2d_gbs, double(n) / seconds_since(t0) / 1e9);
    }
    // The floor of an export into pageable memory: the D2H copy and a copy of as many bytes
    // from pinned memory into a ready buffer on the export's threads, both at once (what
    // the export overlaps, without its checksums), sharing the host's memory bandwidth.
    Bytes ready(n, 3);
    void* pinned2 = nullptr;
    cuda_ok(cudaMallocHost(&pinned2, n), "cudaMallocHost");
    std::memset(pinned2, 2, n);
    for (int round = 0; round < 3; ++round) {
      const auto t0 = Clock::now();
      cuda_ok(cudaMemcpyAsync(pinned, device, n, cudaMemcpyDeviceToHost, nullptr), "D2H");
      parallel_memcpy(ready.data(), static_cast<const unsigned char*>(pinned2), n, threads);
      cuda_ok(cudaStreamSynchronize(nullptr), "D2H");
      d2h_copy_gbs = std::max(d2h_copy_gbs, double(n) / seconds_since(t0) / 1e9);
    }
    cudaFreeHost(pinned2);
    cudaFreeHost(pinned);
    cudaFree(device);
    // An optimizer's first import that does not fit its staging pins two slots of
    // min(staging / 2, 32 MiB) (cudaMallocHost), which it keeps: that time is part of it.
    const std::size_t slot = std::min<std::size_t>((o.staging_mib << 20) / 2, std::size_t{32} << 20);
    void* slots[2] = {nullptr, nullptr};
    const auto t0 = Clock::now();
    for (void*& p : slots) cuda_ok(cudaMallocHost(&p, slot), "cudaMallocHost");
    pin_seconds = seconds_since(t0);
    for (void* p : slots) cudaFreeHost(p);
  }
#endif
  {  // The files' bytes written plainly, one file each with its fsync: an export's I/O floor.
    const auto t0 = Clock::now();
    for (int r = 0; r < kRanks; ++r) write_plain((dir / ("plain" + std::to_string(r))).string(), blobs[r]);
    write_gbs = double(file_bytes) / seconds_since(t0) / 1e9;
    for (int r = 0; r < kRanks; ++r) fs::remove(dir / ("plain" + std::to_string(r)));
  }
  {  // Reading the files (page cache) into a staging-sized buffer: the I/O floor of an import.
    std::vector<unsigned char> buffer(o.staging_mib << 20);
    const auto t1 = Clock::now();
    for (const std::string& path : paths) {
      std::FILE* f = std::fopen(path.c_str(), "rb");
      while (std::fread(buffer.data(), 1, buffer.size(), f) == buffer.size()) {
      }
      std::fclose(f);
    }
    read_gbs = double(file_bytes) / seconds_since(t1) / 1e9;
  }

  // ---- import: one unsharded optimizer reads all four files ---------------------------------
  Model loaded(rows, -1, o.threads, false, o.uint8_moments, o.cuda);
  std::vector<sa_reader> readers(kRanks);
  std::vector<const sa_reader*> pointers;
  for (int r = 0; r < kRanks; ++r) {
    ok(sa_file_reader(paths[static_cast<std::size_t>(r)].c_str(), &readers[static_cast<std::size_t>(r)]), nullptr,
       "file_reader");
    pointers.push_back(&readers[static_cast<std::size_t>(r)]);
  }
  sa_import_options options = SA_IMPORT_OPTIONS_INIT;
  options.staging_bytes = o.staging_mib << 20;
  const int64_t rss_before = proc_status_bytes("VmRSS:");
  const bool exact_peak = reset_peak_rss();
  struct rusage usage_before {};
  getrusage(RUSAGE_SELF, &usage_before);
  const auto t0 = Clock::now();
  ok(sa_optimizer_import(loaded.opt, kRanks, pointers.data(), &options), loaded.opt, "import");
  const double import_seconds = seconds_since(t0);
  const int64_t peak = exact_peak ? proc_status_bytes("VmHWM:") : -1;
  // Again with read_once (the same bytes land: the state check below covers both).
  sa_import_options once = options;
  once.read_once = 1;
  const auto t_once = Clock::now();
  ok(sa_optimizer_import(loaded.opt, kRanks, pointers.data(), &once), loaded.opt, "import, read once");
  const double import_once_seconds = seconds_since(t_once);
  for (sa_reader& r : readers) sa_reader_release(&r);

  // ---- import from memory: the same bytes, another optimizer ---------------------------------
  double memory_import_seconds = 0, memory_import_once_seconds = 0;
  int mismatches = async_mismatches;
  {
    Model from_memory(rows, -1, o.threads, false, o.uint8_moments, o.cuda);
    std::vector<sa_reader> memory_readers(kRanks);
    std::vector<const sa_reader*> memory_pointers;
    for (int r = 0; r < kRanks; ++r) {
      ok(sa_memory_reader(blobs[r].data(), blobs[r].size(), &memory_readers[r]), nullptr, "memory_reader");
      memory_pointers.push_back(&memory_readers[r]);
    }
    const auto t1 = Clock::now();
    ok(sa_optimizer_import(from_memory.opt, kRanks, memory_pointers.data(), &options), from_memory.opt, "import");
    memory_import_seconds = seconds_since(t1);
    const auto t2 = Clock::now();
    ok(sa_optimizer_import(from_memory.opt, kRanks, memory_pointers.data(), &once), from_memory.opt,
       "import, read once");
    memory_import_once_seconds = seconds_since(t2);
    for (std::size_t k = 0; k < rows.size(); ++k)  // the same bytes as the file import
      for (const char* key : keys)
        mismatches += from_memory.state_hash(k, key, 0, rows[k]) != loaded.state_hash(k, key, 0, rows[k]);
    for (sa_reader& r : memory_readers) sa_reader_release(&r);
  }

  for (int r = 0; r < kRanks; ++r)
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const auto [r0, n] = boxes[static_cast<std::size_t>(r)][k];
      const auto& want = hashes[static_cast<std::size_t>(r)][k];
      for (std::size_t i = 0; i < keys.size(); ++i) mismatches += loaded.state_hash(k, keys[i], r0, n) != want[i];
    }

  // Shard files hold the state as the optimizer does (block moments: codes and absmax).
  const double header_bytes = double(file_bytes) - state_bytes;
  const double staging = double(o.staging_mib << 20);
  // Block moments land in an arena of up to the staging size again (sa_import_options).
  const double limit = staging * (o.uint8_moments ? 2 : 1) + double(16 << 20) + 4 * header_bytes;
  std::printf("\n%-20s %9s %8s   %-34s %8s %7s\n", "measure", "seconds", "GB/s", "baseline (same run)", "GB/s",
              "ratio");
  const auto line = [&](const char* what, double seconds, const std::string& baseline, double baseline_gbs) {
    const double gbs = state_bytes / seconds / 1e9;
    std::printf("%-20s %9.3f %8.2f   %-34s %8.2f %7.2f\n", what, seconds, gbs, baseline.c_str(), baseline_gbs,
                gbs / baseline_gbs);
  };
  const std::string memcpy_name = "memcpy, " + std::to_string(threads) + " threads, new buffer";
  const std::string ready_name = "memcpy, " + std::to_string(threads) + " threads, ready buffer";
  const std::string read_name = "plain read (page cache)";
  if (o.cuda) {
    line("D2H", state_bytes / d2h_gbs / 1e9, "cudaMemcpy, pinned", d2h_gbs);
    line("H2D", state_bytes / h2d_gbs / 1e9, "cudaMemcpy, pinned", h2d_gbs);
    line("D2H + memcpy at once", state_bytes / d2h_copy_gbs / 1e9, "D2H", d2h_gbs);
    line("export to memory", memory_export_seconds, "D2H", d2h_gbs);
    line("..., ready buffer", ready_export_seconds, "D2H", d2h_gbs);
    line("..., keeping none", null_export_seconds, "D2H", d2h_gbs);
  } else {
    line("export to memory", memory_export_seconds, memcpy_name, memcpy_gbs);
    line("..., ready buffer", ready_export_seconds, ready_name, ready_memcpy_gbs);
  }
  line("export to file", file_export_seconds, "plain write + fsync", write_gbs);
  line("import from memory", memory_import_seconds, o.cuda ? "H2D" : memcpy_name, o.cuda ? h2d_gbs : memcpy_gbs);
  line("..., read once", memory_import_once_seconds, o.cuda ? "H2D" : memcpy_name, o.cuda ? h2d_gbs : memcpy_gbs);
  line("import from file", import_seconds, read_name, read_gbs);
  line("..., read once", import_once_seconds, read_name, read_gbs);
  line("async export blocks", async_block_seconds, o.cuda ? "D2H" : ready_name, o.cuda ? d2h_gbs : ready_memcpy_gbs);
  line("async export total", async_total_seconds, o.cuda ? "D2H" : ready_name, o.cuda ? d2h_gbs : ready_memcpy_gbs);
  std::printf("(staging %llu MiB: %s; async exports: the second of each rank, %s the synchronous export's bytes)\n",
              static_cast<unsigned long long>(o.staging_mib),
              state_bytes > double(o.staging_mib << 20) ? "the data exceed it, so the default import reads twice"
                                                        : "the data fit, so every import reads once",
              async_mismatches ? "NOT" : "each equal to");
  std::printf("(memcpy on 1 thread: %.2f GB/s)\n", memcpy1_gbs);
  if (o.cuda)
    std::printf("(the default imports are each the first of its optimizer: pinning its two slots "
                "(cudaMallocHost, %.1f ms) is part of them; the read-once imports reuse them)\n",
                pin_seconds * 1e3);
  std::printf("\nfiles: %.1f MiB of headers in %.3f GiB\n", header_bytes / double(1 << 20), double(file_bytes) / double(1 << 30));
  std::printf("state check: %s (%d of %zu states differ)\n", mismatches ? "FAILED" : "every state bitwise equal",
              mismatches, rows.size() * keys.size() * kRanks);
  if (peak < 0) {
    std::printf("peak RSS: /proc/self/clear_refs is not writable here, so the import's own peak cannot be "
                "separated from earlier ones (ru_maxrss %ld KiB); not checked\n",
                usage_before.ru_maxrss);
  } else {
    const double increase = double(peak - rss_before);
    std::printf("peak RSS: %.1f MiB before the import, peak %.1f MiB during it: +%.1f MiB "
                "(staging %.0f MiB; limit %sstaging + 16 MiB + 4x headers = %.1f MiB) -> %.2fx staging\n",
                double(rss_before) / double(1 << 20), double(peak) / double(1 << 20), increase / double(1 << 20),
                staging / double(1 << 20), o.uint8_moments ? "2x " : "", limit / double(1 << 20), increase / staging);
    if (increase > limit) {
      std::printf("FAILED: the import raised peak RSS by more than staging + O(headers)\n");
      mismatches += 1;
    }
  }
  if (o.dir.empty()) fs::remove_all(dir);
  return mismatches == 0 ? 0 : 1;
}
