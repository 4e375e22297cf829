// bench/gpu_host_time.cu — host time of sa_optimizer_step on CUDA, measured in C++ (no
// Python or ctypes in the way), against the time of an empty kernel launch measured in the
// same run: how many launches' worth of host time a step costs.
//
//   gpu_host_time [--shards 1516] [--steps 2000]
//
// The shards are small (2^10..2^14 elements) so the GPU keeps up and the host is what is
// timed; the host work of a step does not depend on the shard sizes.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "shardadam/shardadam.h"

namespace {

void check(bool ok, const char* what, const sa_optimizer* opt = nullptr) {
  if (ok) return;
  std::fprintf(stderr, "gpu_host_time: %s failed: %s\n", what, opt ? sa_optimizer_last_error(opt) : "");
  std::exit(1);
}

__global__ void empty_kernel() {}

struct Stats {
  double median_us, p99_us;
};

// Times n calls. sync_every: synchronize the stream before every that-many calls (1: the
// device is idle at every call, as a step right after a host wait would find it; 64: a
// short queue, as in a loop that never waits).
template <class F>
Stats time_calls(int n, F&& call, cudaStream_t stream, int sync_every = 64) {
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n; ++i) {
    if (i % sync_every == 0) cudaStreamSynchronize(stream);
    const auto t0 = std::chrono::steady_clock::now();
    call(i);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  cudaStreamSynchronize(stream);
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100]};
}

struct Managed {
  DLManagedTensorVersioned m{};
  int64_t shape = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int shards = 1516, steps = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--shards")) shards = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> exponent(10.0, 14.0);
  std::vector<Managed> params(shards);
  std::vector<const void*> grads_a(shards), grads_b(shards);
  sa_optimizer* opt = nullptr;
  check(sa_optimizer_create(nullptr, &opt) == SA_OK, "sa_optimizer_create");
  const sa_group_config group = SA_GROUP_CONFIG_INIT;
  check(sa_optimizer_add_group(opt, &group, nullptr) == SA_OK, "add_group", opt);
  std::vector<void*> allocations;
  for (int i = 0; i < shards; ++i) {
    Managed& p = params[i];
    p.shape = static_cast<int64_t>(std::exp2(exponent(rng)));
    void* data[3];
    for (void*& d : data) {
      check(cudaMalloc(&d, p.shape * sizeof(float)) == cudaSuccess, "cudaMalloc");
      cudaMemset(d, 0, p.shape * sizeof(float));
      allocations.push_back(d);
    }
    p.m.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    p.m.dl_tensor.data = data[0];
    p.m.dl_tensor.device = {kDLCUDA, 0};
    p.m.dl_tensor.ndim = 1;
    p.m.dl_tensor.dtype = {kDLFloat, 32, 1};
    p.m.dl_tensor.shape = &p.shape;
    grads_a[i] = data[1];
    grads_b[i] = data[2];
    const std::string name = "p" + std::to_string(i);
    check(sa_optimizer_add_param(opt, name.c_str(), 0, &p.m, nullptr, nullptr, nullptr) == SA_OK,
          "add_param", opt);
  }
  check(sa_optimizer_set_grad_ptrs(opt, shards, grads_a.data()) == SA_OK, "set_grad_ptrs", opt);
  check(sa_optimizer_step(opt, nullptr, stream) == SA_OK, "first step", opt);  // builds the plan

  const Stats launch = time_calls(steps, [&](int) { empty_kernel<<<1, 32, 0, stream>>>(); }, stream);
  const Stats stable = time_calls(
      steps, [&](int) { check(sa_optimizer_step(opt, nullptr, stream) == SA_OK, "step", opt); }, stream);
  const Stats stable_idle = time_calls(
      steps, [&](int) { check(sa_optimizer_step(opt, nullptr, stream) == SA_OK, "step", opt); }, stream, 1);
  sa_step_args clip = SA_STEP_ARGS_INIT;
  clip.max_grad_norm = 1.0;
  const Stats clipped = time_calls(
      steps, [&](int) { check(sa_optimizer_step(opt, &clip, stream) == SA_OK, "step", opt); }, stream);
  const Stats fresh = time_calls(
      steps,
      [&](int i) {
        check(sa_optimizer_set_grad_ptrs(opt, shards, (i % 2 ? grads_b : grads_a).data()) == SA_OK,
              "set_grad_ptrs", opt);
        check(sa_optimizer_step(opt, nullptr, stream) == SA_OK, "step", opt);
      },
      stream);

  // FusedAdam's pattern: every grad unbound after a step (SA_NO_GRAD) and bound again
  // before the next, to the same buffers (a DDP/FSDP engine's grads keep their addresses).
  const std::vector<const void*> no_grads(static_cast<std::size_t>(shards), SA_NO_GRAD);
  check(sa_optimizer_set_grad_ptrs(opt, shards, grads_a.data()) == SA_OK, "set_grad_ptrs", opt);
  const Stats rebound = time_calls(
      steps,
      [&](int) {
        check(sa_optimizer_set_grad_ptrs(opt, shards, grads_a.data()) == SA_OK, "set_grad_ptrs", opt);
        check(sa_optimizer_step(opt, nullptr, stream) == SA_OK, "step", opt);
        check(sa_optimizer_set_grad_ptrs(opt, shards, no_grads.data()) == SA_OK, "set_grad_ptrs", opt);
      },
      stream);

  std::printf("device: %s; %d fp32 shards; %d calls each; %s\n", prop.name, shards, steps, sa_build_info());
  std::printf("%-46s %10s %10s %14s\n", "call", "median us", "p99 us", "x empty launch");
  auto row = [&](const char* what, const Stats& s) {
    std::printf("%-46s %10.2f %10.2f %14.1f\n", what, s.median_us, s.p99_us, s.median_us / launch.median_us);
  };
  row("empty kernel launch (baseline)", launch);
  row("sa_optimizer_step, stable grads", stable);
  row("  the same, device idle at each call", stable_idle);
  row("  the same, clipped (max_grad_norm, no comm)", clipped);
  row("set_grad_ptrs (fresh list) + sa_optimizer_step", fresh);
  row("bind (same list) + step + unbind (FusedAdam's)", rebound);

  sa_optimizer_destroy(opt);
  for (void* d : allocations) cudaFree(d);
  cudaStreamDestroy(stream);
  return 0;
}
