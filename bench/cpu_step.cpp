// cpu_step.cpp — bandwidth of the CPU step over many shards, against memcpy measured in
// the same run with the same thread count (each timed step is followed by one timed copy,
// so both see the same machine even when its load drifts).
//
// The Adam step is memory-bound: per element it streams the param, grad and moments in
// and the param and moments out. So the figure of merit is bytes moved per second, and
// the honest yardstick is what a plain multi-threaded memcpy moves on the same machine.
//
// Shards: sizes log-uniform in [2^8, 2^20] elements, as many as it takes to reach --elems
// (default 200M, about 1,600 shards), plus 4 empty shards; --shards N instead draws N
// sizes and scales them to sum to --elems. Every shard is a separate param, so the table
// shows the step over many shards, not one big tensor.
//
// Bytes counted per element, exactly what the kernel reads and writes:
//   fp32:              read p, g, m, v (16)             write p, m, v (12)      = 28 B
//   bf16 + fp32 master: read g (2), master, m, v (12)   write p (2), master, m, v (12) = 28 B
//   fp8 + fp32 master, delayed scaling (float32 grads):
//                      read g, master, m, v (16)        write p (1), master, m, v (12) = 29 B
//   fp8, current scaling: the same in the update pass (the param not yet written), then the
//                      cast pass reads the master again and writes p: 16 + 12 + 4 + 1 = 33 B
//
// memcpy copies 8 B per element from one buffer to another (the fp32 step's 16 B per
// element of footprint) and counts read + write bytes. At small sizes (--quick) glibc's
// memcpy may use ordinary stores, which also read every destination line (traffic this
// count does not see), so the ratio flatters the step; the default size is far beyond the
// caches and glibc's non-temporal threshold.
//
//   cpu_step [--elems N] [--shards N] [--threads N] [--reps N] [--quick] [--scalar]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shardadam/shardadam.h"

namespace {

struct Options {
  int64_t elems = 200'000'000;
  int64_t shards = 0;  // 0: draw until --elems is reached
  int threads = 0;     // 0: one per hardware thread
  int reps = 7;
  bool scalar = false;  // also measure the scalar (non-SIMD) kernel
};

[[noreturn]] void usage(const char* problem) {
  std::fprintf(stderr,
               "cpu_step: %s\n"
               "usage: cpu_step [--elems N] [--shards N] [--threads N] [--reps N] [--quick] "
               "[--scalar]\n",
               problem);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> int64_t {
      if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);  // accepts 2e8
      if (end == argv[i] || *end != '\0' || v < 0) usage(("bad value for " + arg).c_str());
      return static_cast<int64_t>(v);
    };
    if (arg == "--elems") {
      o.elems = value();
    } else if (arg == "--shards") {
      o.shards = value();
    } else if (arg == "--threads") {
      o.threads = static_cast<int>(value());
    } else if (arg == "--reps") {
      o.reps = std::max<int>(1, static_cast<int>(value()));
    } else if (arg == "--quick") {
      o.elems = 24'000'000;
      o.reps = 5;
    } else if (arg == "--scalar") {
      o.scalar = true;
    } else if (arg == "--help" || arg == "-h") {
      usage("measures the CPU step's GB/s against memcpy");
    } else {
      usage(("unknown argument " + arg).c_str());
    }
  }
  if (o.elems < 1) usage("--elems must be at least 1");
  return o;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  return "unknown CPU";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Shard sizes: log-uniform in [2^8, 2^20], summing to `elems`, then 4 empty shards.
std::vector<int64_t> shard_sizes(const Options& o) {
  std::mt19937_64 rng(20240601);
  std::uniform_real_distribution<double> log2_size(8.0, 20.0);
  std::vector<int64_t> sizes;
  if (o.shards > 0) {
    std::vector<double> raw(static_cast<std::size_t>(o.shards));
    double sum = 0.0;
    for (double& r : raw) sum += (r = std::exp2(log2_size(rng)));
    int64_t total = 0;
    for (double r : raw) {
      sizes.push_back(std::max<int64_t>(1, std::llround(r * static_cast<double>(o.elems) / sum)));
      total += sizes.back();
    }
    sizes.back() = std::max<int64_t>(1, sizes.back() + o.elems - total);
  } else {
    int64_t total = 0;
    while (total < o.elems) {
      const int64_t n = std::min<int64_t>(std::llround(std::exp2(log2_size(rng))), o.elems - total);
      sizes.push_back(n);
      total += n;
    }
  }
  sizes.insert(sizes.end(), {0, 0, 0, 0});
  std::shuffle(sizes.begin(), sizes.end(), rng);
  return sizes;
}

// 64-byte aligned memory for all shards of one tensor kind, each shard starting on a
// cache line, as an engine's flat parameter/grad buffers would.
class Arena {
 public:
  Arena(const std::vector<int64_t>& sizes, std::size_t elem_size) {
    std::size_t bytes = 0;
    for (int64_t n : sizes) {
      offsets_.push_back(bytes);
      bytes += (static_cast<std::size_t>(n) * elem_size + 63) / 64 * 64;
    }
    data_.reset(static_cast<char*>(std::aligned_alloc(64, std::max<std::size_t>(bytes, 64))));
    if (!data_) {
      std::fprintf(stderr, "cpu_step: cannot allocate %zu bytes\n", bytes);
      std::exit(1);
    }
    bytes_ = bytes;
  }
  void* shard(std::size_t i) const { return data_.get() + offsets_[i]; }
  char* data() const { return data_.get(); }
  std::size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data_;
  std::vector<std::size_t> offsets_;
  std::size_t bytes_ = 0;
};

// Runs body(t) on `threads` threads (the caller is one of them) and waits.
template <class Body>
void on_threads(int threads, const Body& body) {
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  body(0);
  for (auto& th : pool) th.join();
}

// Fills `bytes` of memory with a pattern in parallel (this also faults the pages in on
// the threads that will later use them).
void fill(char* data, std::size_t bytes, int threads, uint8_t pattern) {
  on_threads(threads, [&](int t) {
    const std::size_t begin = bytes * t / threads, end = bytes * (t + 1) / threads;
    std::memset(data + begin, pattern, end - begin);
  });
}

// A multi-threaded memcpy, each thread copying its slice; the baseline the step is held
// against. Its buffers live as long as the benchmark, so every copy is warm.
class CopyBench {
 public:
  CopyBench(std::size_t bytes, int threads)
      : bytes_(bytes),
        threads_(threads),
        src_({static_cast<int64_t>(bytes)}, 1),
        dst_({static_cast<int64_t>(bytes)}, 1) {
    fill(src_.data(), bytes, threads, 0x3c);
    fill(dst_.data(), bytes, threads, 0);
    run();  // warm-up
    if (std::memcmp(dst_.data() + bytes / 2, src_.data() + bytes / 2,
                    std::min<std::size_t>(bytes / 2, 64)) != 0) {
      std::fprintf(stderr, "cpu_step: memcpy copied wrong data\n");
      std::exit(1);
    }
  }

  // Seconds for one copy of all bytes.
  double run() {
    const auto start = std::chrono::steady_clock::now();
    on_threads(threads_, [&](int t) {
      const std::size_t begin = bytes_ * t / threads_, end = bytes_ * (t + 1) / threads_;
      std::memcpy(dst_.data() + begin, src_.data() + begin, end - begin);
    });
    return seconds_since(start);
  }

  // Bytes read plus bytes written by one copy.
  double traffic() const { return 2.0 * static_cast<double>(bytes_); }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_;
  int threads_;
  Arena src_, dst_;
};

void check(sa_status status, const sa_optimizer* opt, const char* what) {
  if (status != SA_OK) {
    std::fprintf(stderr, "cpu_step: %s failed: %s (%s)\n", what, sa_optimizer_last_error(opt),
                 sa_status_string(status));
    std::exit(1);
  }
}

struct Config {
  const char* name;
  DLDataType param_dtype;  // grads have the param's dtype (float32 for fp8); bfloat16 and fp8
                           // get an fp32 master
  bool simd;
  double bytes_per_elem;
  bool clip = false;  // L2 norm of all grads (one more read of them), clipped inside the step
  int32_t scaling = SA_SCALING_NONE;  // fp8 params: a per-tensor scaling (delayed, current)
};

struct Result {
  double ms;
  double gbps;
  double copy_gbps;
};

// Steps interleaved with copies, so that both see the same machine even when its load
// drifts during the run.
Result run_config(const Config& c, const std::vector<int64_t>& sizes, int64_t elems, int threads,
                  int reps, CopyBench& copy) {
  const std::size_t elem_size = c.param_dtype.bits / 8;
  const bool fp8 = c.scaling != SA_SCALING_NONE;
  const std::size_t grad_size = fp8 ? 4 : elem_size;
  Arena params(sizes, elem_size), grads(sizes, grad_size);
  // Small params and grads of both signs, the same bit pattern in every element (fp32
  // 0x3c3c3c3c ~ 0.0115; bfloat16 0x3c3c ~ 0.0115).
  fill(params.data(), params.bytes(), threads, 0x3c);
  fill(grads.data(), grads.bytes(), threads, 0xbc);

  sa_optimizer_config config = SA_OPTIMIZER_CONFIG_INIT;
  config.num_threads = threads;
  config.cpu_simd = c.simd ? 1 : 0;
  sa_optimizer* opt = nullptr;
  check(sa_optimizer_create(&config, &opt), nullptr, "sa_optimizer_create");
  const sa_group_config group_config = SA_GROUP_CONFIG_INIT;
  int32_t group = 0;
  check(sa_optimizer_add_group(opt, &group_config, &group), opt, "sa_optimizer_add_group");

  std::vector<int64_t> shapes(sizes);  // DLPack shapes must outlive add_param
  std::vector<DLManagedTensorVersioned> tensors(sizes.size());
  // fp8: each param's scale tensor, [1] (delayed: the scale) or [1, 1] (current: scale,
  // scale_inv), as the step reads or writes it.
  int64_t scale_shape = c.scaling == SA_SCALING_CURRENT ? 2 : 1;
  std::vector<float> scales(fp8 ? sizes.size() * 2 : 0, 1.0f);
  std::vector<DLManagedTensorVersioned> scale_tensors(fp8 ? sizes.size() : 0);
  std::vector<const void*> grad_ptrs(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    DLManagedTensorVersioned& t = tensors[i];
    t = DLManagedTensorVersioned{};
    t.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    t.dl_tensor.data = params.shard(i);
    t.dl_tensor.device = {kDLCPU, 0};
    t.dl_tensor.ndim = 1;
    t.dl_tensor.dtype = c.param_dtype;
    t.dl_tensor.shape = &shapes[i];
    const std::string name = "layers." + std::to_string(i) + ".w";
    sa_param_options options = SA_PARAM_OPTIONS_INIT;
    if (fp8) {
      DLManagedTensorVersioned& s = scale_tensors[i];
      s = DLManagedTensorVersioned{};
      s.version = t.version;
      s.dl_tensor.data = &scales[2 * i];
      s.dl_tensor.device = {kDLCPU, 0};
      s.dl_tensor.ndim = 1;
      s.dl_tensor.dtype = {kDLFloat, 32, 1};
      s.dl_tensor.shape = &scale_shape;
      options.scaling = c.scaling;
      options.scale = &s;
    }
    check(sa_optimizer_add_param(opt, name.c_str(), group, &t, nullptr, fp8 ? &options : nullptr,
                                 nullptr),
          opt, "sa_optimizer_add_param");
    grad_ptrs[i] = grads.shard(i);
  }
  check(sa_optimizer_set_grad_ptrs(opt, static_cast<int64_t>(grad_ptrs.size()), grad_ptrs.data()),
        opt, "sa_optimizer_set_grad_ptrs");

  std::vector<double> times, copy_times;
  for (int r = -2; r < reps; ++r) {  // two warm-up steps: the first builds the plan
    const auto start = std::chrono::steady_clock::now();
    sa_step_args args = SA_STEP_ARGS_INIT;
    args.max_grad_norm = c.clip ? 1.0 : 0.0;
    check(sa_optimizer_step(opt, &args, nullptr), opt, "sa_optimizer_step");
    const double step_seconds = seconds_since(start);
    const double copy_seconds = copy.run();
    if (r >= 0) {
      times.push_back(step_seconds);
      copy_times.push_back(copy_seconds);
    }
  }
  // The step did write the params (the first non-empty shard no longer holds the fill; an
  // fp8 param's code may, its master must not: e4m3's 0x3c is 1.5).
  const unsigned char fill_pattern[4] = {0x3c, 0x3c, 0x3c, 0x3c};
  for (std::size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] > 0) {
      bool unchanged = std::memcmp(params.shard(i), fill_pattern, elem_size) == 0;
      if (fp8) {
        DLManagedTensorVersioned* master = nullptr;
        check(sa_optimizer_state_view(opt, static_cast<int64_t>(i), "master", &master), opt,
              "sa_optimizer_state_view");
        unchanged = *static_cast<const float*>(master->dl_tensor.data) == 1.5f;
        master->deleter(master);
      }
      if (unchanged) {
        std::fprintf(stderr, "cpu_step: %s: the step left the params unchanged\n", c.name);
        std::exit(1);
      }
      break;
    }
  sa_optimizer_destroy(opt);

  const double t = median(times);
  return {t * 1e3, c.bytes_per_elem * static_cast<double>(elems) / t / 1e9,
          copy.traffic() / median(copy_times) / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<int64_t> sizes = shard_sizes(o);
  int64_t elems = 0, largest = 0;
  for (int64_t n : sizes) {
    elems += n;
    largest = std::max(largest, n);
  }

  std::printf("machine: %s, %d threads\n", cpu_model().c_str(), threads);
  std::printf("library: %s\n", sa_build_info());
  std::printf(
      "shards:  %zu (4 empty), %lld elements, largest %lld; median of %d steps after 2 "
      "warm-up steps\n\n",
      sizes.size(), static_cast<long long>(elems), static_cast<long long>(largest), o.reps);

  // memcpy over the same footprint as the fp32 step's arrays (16 B per element: src and
  // dst 8 B each), far beyond the caches for the default size.
  CopyBench copy(static_cast<std::size_t>(elems) * 8, threads);

  const DLDataType f32{kDLFloat, 32, 1}, bf16{kDLBfloat, 16, 1}, e4m3{kDLFloat8_e4m3fn, 8, 1};
  std::vector<Config> configs = {
      {"fp32", f32, true, 28.0},
      {"bf16 + fp32 master", bf16, true, 28.0},
      {"fp32 + L2 clip", f32, true, 32.0, true},
      {"fp8 e4m3, delayed scaling", e4m3, true, 29.0, false, SA_SCALING_DELAYED},
      {"fp8 e4m3, current scaling", e4m3, true, 33.0, false, SA_SCALING_CURRENT}};
  if (o.scalar) {
    configs.push_back({"fp32 (scalar)", f32, false, 28.0});
    configs.push_back({"bf16 + fp32 master (scalar)", bf16, false, 28.0});
  }

  std::printf("%-28s %12s %7s %9s %8s %12s %7s\n", "config", "elements", "shards", "ms/step",
              "GB/s", "memcpy GB/s", "ratio");
  for (const Config& c : configs) {
    const Result r = run_config(c, sizes, elems, threads, o.reps, copy);
    std::printf("%-28s %12lld %7zu %9.2f %8.2f %12.2f %7.2f\n", c.name,
                static_cast<long long>(elems), sizes.size(), r.ms, r.gbps, r.copy_gbps,
                r.gbps / r.copy_gbps);
    std::fflush(stdout);
  }
  std::printf(
      "\nGB/s counts the 28 bytes per element the step reads and writes (32 with the clip's norm "
      "pass; fp8: 29, or 33 with current scaling's cast pass); memcpy GB/s counts "
      "read+write bytes of a %d-thread memcpy of %.2f GB, timed after each step.\n",
      threads, static_cast<double>(elems) * 8 / 1e9);
  return 0;
}
