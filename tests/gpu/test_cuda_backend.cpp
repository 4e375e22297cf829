// tests/gpu/test_cuda_backend.cpp — the CUDA backend against the CPU backend.
//
// The CPU backend is the reference: both run adam_update() with explicit fmas and fold
// coefficients with the same double arithmetic, so params and states must agree bit for
// bit (NaN payloads aside; the data here has no NaN). The CPU backend itself is checked
// against a float64 reference in tests/test_optimizer_reference.cpp.
//
// Built only with CUDA; gpu_main.cpp skips the whole binary (exit 77, "SKIPPED" printed)
// when no CUDA device is usable.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpu/cuda_test_support.hpp"
#include "gpu/twin.hpp"
#include "test_support.hpp"

using namespace sa_test;

namespace {

// Every variant over 24 steps of 43 shards (empty ones too), the CUDA optimizer's state
// where `state` puts it, against the CPU backend bit for bit.
void every_variant_against_cpu(GpuState state) {
  for (const VariantSpec& v : kVariants) {
    DYNAMIC_SECTION(v.label) {
      Rng rng(0xC0DA + static_cast<uint64_t>(v.param.code * 7 + v.grad.bits + v.master));
      Twin t(state);
      t.add_groups(v.amsgrad);
      const std::vector<int64_t> sizes = shard_sizes(rng, 40);
      for (std::size_t i = 0; i < sizes.size(); ++i)
        t.add("layers." + std::to_string(i) + ".w", static_cast<int32_t>(i % 2), v, {sizes[i]},
              /*offset_elems=*/rng.chance(0.3) ? rng.integer(1, 7) : 0, rng);
      t.add("block.w2d", 0, v, {37, 129}, 0, rng);
      // A variant whose only shard on this rank is empty: its bucket has nothing to run.
      const VariantSpec empty_only{"", kFloat16, kFloat16, kBfloat16, SA_MASTER_FP32, v.amsgrad};
      t.add("empty.only", 1, empty_only, {0, 5}, 0, rng);

      for (int step = 0; step < 24; ++step) {
        t.bind_new_grads(rng, step % 2 == 1, /*through_ptrs=*/step % 3 != 0);
        if (step == 10)
          for (auto* opt : {t.cpu.get(), t.gpu.get()})
            REQUIRE_SA_OK(opt, sa_optimizer_set_lr(opt, 1, 5e-4));
        const float inv_scale = step % 4 == 2 ? 0.25f : 1.0f;
        const float found_inf = step == 7 ? 1.0f : 0.0f;
        t.step_both(inv_scale, found_inf, nullptr);
      }
      t.require_identical();
      CHECK(step_count(t.gpu.get(), 0) == 23);  // 24 steps, one skipped by found_inf
    }
  }
}

}  // namespace

TEST_CASE("every variant on CUDA equals the CPU backend bit for bit over 24 steps", "[gpu]") {
  every_variant_against_cpu(GpuState::device);
}

// State on the host is stepped by the same kernels reading it over the link: the same bits
// as the CPU backend, and so as state in device memory.
TEST_CASE("every variant with its state on the host equals the CPU backend bit for bit",
          "[gpu][offload]") {
  every_variant_against_cpu(GpuState::host);
}

// Placement is part of the bucket key: one optimizer steps buckets of both.
TEST_CASE("an optimizer with state on the host and on the device equals the CPU backend",
          "[gpu][offload]") {
  every_variant_against_cpu(GpuState::mixed);
}

// State the CPU steps: the device's verdict and coefficients, the CPU backend's kernels on
// the param and grad brought down: the CPU backend's bits, found_inf's skip and params
// without grads included.
TEST_CASE("every variant with its state stepped by the CPU equals the CPU backend bit for bit",
          "[gpu][offload][cpu_step]") {
  every_variant_against_cpu(GpuState::cpu_step);
}

TEST_CASE("an optimizer with state in all three placements equals the CPU backend",
          "[gpu][offload][cpu_step]") {
  every_variant_against_cpu(GpuState::all_three);
}

// The block-moment kernel's grid is persistent (a few thread blocks per multiprocessor, each
// taking every gridDim.x-th chunk): a bucket of many more chunks than the grid has thread
// blocks, with a partial last q8 block, must equal the CPU everywhere.
TEST_CASE("block moments over more chunks than the kernel's grid equal the CPU bit for bit",
          "[gpu]") {
  for (const VariantSpec& v : kVariants) {
    if (!same_dtype(v.moment, kUint8) && !same_dtype(v.moment, kFloat8E4m3fn)) continue;
    DYNAMIC_SECTION(v.label) {
      Rng rng(0x0881);
      Twin t;
      t.add_groups(v.amsgrad);
      t.add("big", 0, v, {(int64_t{9} << 20) + 77}, 0, rng);  // 577 chunks of 16384 elements
      t.add("small", 1, v, {300}, 0, rng);
      for (int step = 0; step < 3; ++step) {
        t.bind_new_grads(rng, false, /*through_ptrs=*/true);
        t.step_both(1.0f, 0.0f, nullptr);
      }
      t.require_identical();
    }
  }
}

// Float32 arrays equal bit for bit, except that a NaN equals any NaN (the GPU's arithmetic
// makes the canonical NaN, x86's another payload).
bool same_floats_nan_aside(const std::vector<unsigned char>& a,
                           const std::vector<unsigned char>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i + 4 <= a.size(); i += 4) {
    float x, y;
    std::memcpy(&x, a.data() + i, 4);
    std::memcpy(&y, b.data() + i, 4);
    if (std::isnan(x) ? !std::isnan(y) : std::memcmp(&x, &y, 4) != 0) return false;
  }
  return true;
}

// Code arrays equal byte for byte, except that for float8 codes a NaN (0x7F or 0xFF: the
// NaN's sign, which arithmetic leaves as it may) equals any NaN.
bool same_codes_nan_aside(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b,
                          bool float8) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i] && !(float8 && (a[i] & 0x7Fu) == 0x7Fu && (b[i] & 0x7Fu) == 0x7Fu))
      return false;
  return true;
}

// A block whose moment holds an infinity or a NaN has a non-finite absmax: the kernel
// encodes it by the search, not by the key tables (adam_block_cuda.cu), and must still give
// the CPU's codes; its neighbours stay on the tables.
TEST_CASE("block moments holding an infinity or a NaN encode as the CPU's", "[gpu]") {
  for (const VariantSpec& v : kVariants) {
    if (!same_dtype(v.moment, kUint8) && !same_dtype(v.moment, kFloat8E4m3fn)) continue;
    DYNAMIC_SECTION(v.label) {
      Rng rng(0x1F);
      Twin t;
      t.add_groups(v.amsgrad);
      const int64_t n = 6 * 256 + 40;
      t.add("w", 0, v, {n}, 0, rng);
      t.bind_new_grads(rng, false, /*through_ptrs=*/true);
      t.step_both(1.0f, 0.0f, nullptr);
      HostTensor& grad = *t.host_grads_a[0];
      fill_log_uniform(grad, rng, 1e-4, 3.0);
      grad.set(256 + 3, std::numeric_limits<float>::infinity());         // block 1
      grad.set(3 * 256 + 200, -std::numeric_limits<float>::infinity());  // block 3
      grad.set(5 * 256 + 7, std::numeric_limits<float>::quiet_NaN());    // block 5
      grad.set(n - 1, std::numeric_limits<float>::quiet_NaN());          // the partial block
      t.dev_grads_a[0]->upload(grad);
      const DLTensor h = grad.dl(), d = t.dev_grads_a[0]->dl();
      REQUIRE_SA_OK(t.cpu.get(), sa_optimizer_set_grad(t.cpu.get(), 0, &h));
      REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_set_grad(t.gpu.get(), 0, &d));
      t.step_both(1.0f, 0.0f, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const char* keys[16] = {};
      int32_t num_keys = 0;
      REQUIRE_SA_OK(t.cpu.get(), sa_optimizer_state_keys(t.cpu.get(), 0, keys, 16, &num_keys));
      int non_finite_blocks = 0;
      for (const char* key : std::vector<const char*>(keys, keys + num_keys)) {
        INFO("state " << key);
        const StateView c = state_view(t.cpu.get(), 0, key);
        const StateView g = state_view(t.gpu.get(), 0, key);
        if (same_dtype(c.view->dl_tensor.dtype, kFloat32)) {
          CHECK(same_floats_nan_aside(download_view(g), c.raw_bytes()));
          if (std::string(key).find("absmax") != std::string::npos)
            for (int64_t b = 0; b < c.numel(); ++b) non_finite_blocks += !std::isfinite(c.get(b));
        } else {
          CHECK(same_codes_nan_aside(download_view(g), c.raw_bytes(),
                                     same_dtype(v.moment, kFloat8E4m3fn)));
        }
      }
      CHECK(non_finite_blocks >= 4 * 2);  // both moments of the four blocks, at least
      if (same_dtype(v.param, kFloat32))
        CHECK(same_floats_nan_aside(t.dev_params[0]->download(), t.host_params[0]->raw_bytes()));
    }
  }
}

TEST_CASE("a tensor of more than 2^31 elements is updated to its last element", "[gpu][large]") {
  const int64_t n = (int64_t{1} << 31) + 1001;
  const int64_t probe = 4096;  // random values at both ends; zeros (which stay 0) between
  size_t free_bytes = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total));
  if (free_bytes < static_cast<size_t>(n) * 4 * 5) {
    WARN("SKIPPED: needs " << n * 20 / (1 << 30) << " GiB of free device memory");
    return;
  }
  Rng rng(31);
  DeviceTensor param({n}, kFloat32), grad({n}, kFloat32);
  HostTensor head_p({probe}, kFloat32), tail_p({probe}, kFloat32), head_g({probe}, kFloat32),
      tail_g({probe}, kFloat32);
  for (auto* h : {&head_p, &tail_p}) fill_normal(*h, rng, 1.0);
  for (auto* h : {&head_g, &tail_g}) fill_log_uniform(*h, rng, 1e-3, 1.0);
  auto put = [&](DeviceTensor& d, const HostTensor& h, int64_t at) {
    CUDA_OK(cudaMemcpy(static_cast<float*>(d.data()) + at, h.data(), h.bytes(),
                       cudaMemcpyHostToDevice));
  };
  put(param, head_p, 0);
  put(param, tail_p, n - probe);
  put(grad, head_g, 0);
  put(grad, tail_g, n - probe);

  // The reference: a CPU optimizer over just the two probed ranges (the update is
  // elementwise, so the rest of the tensor does not matter to them).
  OptimizerPtr cpu = make_optimizer(2, 1), gpu = make_optimizer();
  const sa_group_config config = group_config(1e-3, 1e-2, 1);
  for (auto* opt : {cpu.get(), gpu.get()})
    REQUIRE_SA_OK(opt, sa_optimizer_add_group(opt, &config, nullptr));
  REQUIRE_SA_OK(gpu.get(), sa_optimizer_add_param(gpu.get(), "huge", 0, param.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_param(cpu.get(), "head", 0, head_p.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_param(cpu.get(), "tail", 0, tail_p.versioned(), nullptr,
                                                  nullptr, nullptr));
  const DLTensor g = grad.dl(), hg = head_g.dl(), tg = tail_g.dl();
  REQUIRE_SA_OK(gpu.get(), sa_optimizer_set_grad(gpu.get(), 0, &g));
  REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_grad(cpu.get(), 0, &hg));
  REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_grad(cpu.get(), 1, &tg));
  for (int step = 0; step < 3; ++step) {
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_step(gpu.get(), nullptr, nullptr));
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_step(cpu.get(), nullptr, nullptr));
  }
  CUDA_OK(cudaDeviceSynchronize());
  auto range = [&](const void* base, int64_t at) {
    std::vector<unsigned char> out(static_cast<size_t>(probe) * 4);
    CUDA_OK(cudaMemcpy(out.data(), static_cast<const float*>(base) + at, out.size(),
                       cudaMemcpyDeviceToHost));
    return out;
  };
  CHECK(range(param.data(), 0) == head_p.raw_bytes());
  CHECK(range(param.data(), n - probe) == tail_p.raw_bytes());
  const StateView m = state_view(gpu.get(), 0, "exp_avg");
  CHECK(range(m.data(), n - probe) == state_view(cpu.get(), 1, "exp_avg").raw_bytes());
  const StateView v = state_view(gpu.get(), 0, "exp_avg_sq");
  CHECK(range(v.data(), n - probe) == state_view(cpu.get(), 1, "exp_avg_sq").raw_bytes());
  // The middle stayed exactly zero (no stray writes, nothing skipped or doubled).
  CHECK(range(param.data(), n / 2) ==
        std::vector<unsigned char>(static_cast<size_t>(probe) * 4, 0));
  gpu.reset();
  cpu.reset();
}

TEST_CASE("a captured step replays in a CUDA graph and follows lr changes made between replays",
          "[gpu][offload]") {
  // bf16 + fp32 master, 8-bit moments, float8 moments (the block kernel: its launch asks
  // for its shared memory, which a capture must take too); state on the device, and half
  // of it on the host (the ring's streams and events join the capture)
  for (const GpuState state : {GpuState::device, GpuState::mixed})
  for (const int variant : {3, 9, 12}) {
    const VariantSpec& v = kVariants[variant];
    DYNAMIC_SECTION(v.label << (state == GpuState::mixed ? ", half on the host" : "")) {
      Rng rng(0x6A4F);
      Twin t(state);
      t.add_groups(v.amsgrad);
      const std::vector<int64_t> sizes = shard_sizes(rng, 30);
      for (std::size_t i = 0; i < sizes.size(); ++i)
        t.add("p" + std::to_string(i), static_cast<int32_t>(i % 2), v, {sizes[i]}, 0, rng);
      cudaStream_t stream;
      CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

      // Step 1 outside capture builds the plan and binds grad set A for good.
      t.bind_new_grads(rng, false, true);
      t.step_both(1.0f, 0.0f, stream);

      // A pending change must be flushed before capture: a captured step refuses to record it.
      REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_set_lr(t.gpu.get(), 0, 1e-3));
      cudaGraph_t graph = nullptr;
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      CHECK_SA_FAILS(t.gpu.get(), SA_ERR_STATE, sa_optimizer_step(t.gpu.get(), nullptr, stream),
                     "sa_optimizer_flush");
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      REQUIRE_SA_OK(t.cpu.get(), sa_optimizer_set_lr(t.cpu.get(), 0, 1e-3));
      REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_flush(t.gpu.get(), stream));

      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_step(t.gpu.get(), nullptr, stream));
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

      const double lrs[] = {1e-3, 3e-3, 2e-4, 2e-4, 5e-3};
      for (double lr : lrs) {
        // New grad values in the same (captured) buffers, a new lr, then replay.
        for (std::size_t i = 0; i < t.host_grads_a.size(); ++i) {
          fill_log_uniform(*t.host_grads_a[i], rng, 1e-4, 3.0);
          CUDA_OK(cudaMemcpyAsync(t.dev_grads_a[i]->data(), t.host_grads_a[i]->data(),
                                  t.host_grads_a[i]->bytes(), cudaMemcpyHostToDevice, stream));
        }
        for (auto* opt : {t.cpu.get(), t.gpu.get()})
          REQUIRE_SA_OK(opt, sa_optimizer_set_lr(opt, 1, lr));
        REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_flush(t.gpu.get(), stream));
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));  // the host grads are refilled next round
        REQUIRE_SA_OK(t.cpu.get(), sa_optimizer_step(t.cpu.get(), nullptr, nullptr));
      }
      t.require_identical();
      CHECK(step_count(t.gpu.get(), 0) == 1 + 5);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
    }
  }
}

// The step counts have one home, the device: a count set between replays is what the
// next replay advances, with no flush (an old host copy once made the host report the set
// value while the replay advanced the device's stale one).
TEST_CASE("a step count set between graph replays is what the replay advances, without a flush",
          "[gpu]") {
  Rng rng(0x5E7);
  Twin t;
  t.add_groups(false);
  for (int i = 0; i < 6; ++i)
    t.add("p" + std::to_string(i), i % 2, kVariants[i % 2 == 0 ? 0 : 3], {1000 + 37 * i}, 0, rng);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  t.bind_new_grads(rng, false, true);
  t.step_both(1.0f, 0.0f, stream);
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_step(t.gpu.get(), nullptr, stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int64_t resume : {40, 7}) {
    for (auto* opt : {t.cpu.get(), t.gpu.get()})
      for (int32_t g = 0; g < 2; ++g) REQUIRE_SA_OK(opt, sa_optimizer_set_step(opt, g, resume + g));
    CUDA_OK(cudaGraphLaunch(exec, stream));  // no sa_optimizer_flush
    REQUIRE_SA_OK(t.cpu.get(), sa_optimizer_step(t.cpu.get(), nullptr, nullptr));
    CHECK(step_count(t.gpu.get(), 0) == resume + 1);
    CHECK(step_count(t.gpu.get(), 1) == resume + 2);
    t.require_identical();  // bias correction used the set counts on both
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("a found_inf flag in device memory skips the step and leaves the step count", "[gpu]") {
  Rng rng(0xF1);
  Twin t;
  t.add_groups(false);
  t.add("w", 0, kVariants[0], {1000}, 0, rng);
  t.bind_new_grads(rng, false, true);
  t.step_both(1.0f, 0.0f, nullptr);
  const auto before = t.dev_params[0]->download();
  t.step_both(1.0f, 1.0f, nullptr);  // skipped on both; skipped out = 1 on both
  CHECK(t.dev_params[0]->download() == before);
  CHECK(step_count(t.gpu.get(), 0) == 1);
  t.step_both(1.0f, 0.0f, nullptr);
  t.require_identical();
}

TEST_CASE(
    "params without a grad at some steps, and per-param step counts, equal the CPU bit for bit "
    "(plain, found_inf, clipped and captured steps)",
    "[gpu][grads]") {
  Rng rng(0x9AD);
  Twin t;
  t.add_groups(false);
  const std::vector<int64_t> sizes = shard_sizes(rng, 24);
  for (std::size_t i = 0; i < sizes.size(); ++i)
    t.add("p" + std::to_string(i), static_cast<int32_t>(i % 2), kVariants[i % 2 == 0 ? 0 : 3],
          {sizes[i]}, 0, rng);
  const auto n = static_cast<int64_t>(sizes.size());
  // Counts as a torch state dict may bring them: every param its own.
  std::vector<int64_t> steps(sizes.size());
  for (std::size_t i = 0; i < steps.size(); ++i) steps[i] = static_cast<int64_t>(i % 5) * 3;
  for (auto* opt : {t.cpu.get(), t.gpu.get()})
    REQUIRE_SA_OK(opt, sa_optimizer_set_param_steps(opt, 0, n, steps.data()));
  std::vector<bool> present(sizes.size());
  for (int step = 0; step < 12; ++step) {
    for (std::size_t i = 0; i < present.size(); ++i) present[i] = rng.chance(0.6);
    t.bind_some_grads(rng, step % 2 == 1, present);
    if (step % 4 == 3) {
      const auto norms = t.step_both_clipped(0.5, SA_NORM_L2, nullptr);
      CHECK(std::fabs(norms.first - norms.second) <= 1e-12 * norms.first);
    } else {
      t.step_both(1.0f, step == 5 ? 1.0f : 0.0f, nullptr);
    }
    if (step == 2) t.require_identical();  // no clipped step yet: bit for bit
  }
  // Clipped steps scale by a norm whose last bit depends on the summation order.
  t.require_close(4.0);
  std::vector<int64_t> got(sizes.size());
  REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_get_param_steps(t.gpu.get(), 0, n, got.data()));
  CHECK(got != steps);

  // A captured step with some params lacking grads replays their absence.
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (std::size_t i = 0; i < present.size(); ++i) present[i] = i % 3 != 0;
  t.bind_some_grads(rng, false, present);
  t.step_both(1.0f, 0.0f, stream);
  REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_flush(t.gpu.get(), stream));
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_step(t.gpu.get(), nullptr, stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    REQUIRE_SA_OK(t.cpu.get(), sa_optimizer_step(t.cpu.get(), nullptr, nullptr));
  }
  t.require_close(4.0);
  std::vector<int64_t> cpu_steps(sizes.size()), gpu_steps(sizes.size());
  REQUIRE_SA_OK(t.cpu.get(), sa_optimizer_get_param_steps(t.cpu.get(), 0, n, cpu_steps.data()));
  REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_get_param_steps(t.gpu.get(), 0, n, gpu_steps.data()));
  CHECK(gpu_steps == cpu_steps);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Pinning more than the host has fails the add with SA_ERR_OUT_OF_MEMORY naming the bytes,
// and adds nothing: the next param is index 0 and steps. The shard claims 2^40 float32
// elements over a small allocation: the refusal comes before anything reads it.
TEST_CASE("state on the host that the host cannot pin fails add_param and adds nothing",
          "[gpu][offload][cpu_step]") {
  DeviceTensor small({16}, kFloat32);  // outlives the optimizer, which owns a view of it
  OptimizerPtr opt = make_optimizer();
  const sa_group_config group = group_config(1e-3, 0.0, 1);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &group, nullptr));
  int64_t huge_shape[1] = {int64_t{1} << 40};
  DLManagedTensorVersioned huge = *small.versioned();
  huge.deleter = nullptr;  // the caller keeps a refused shard: a deleter must not run
  huge.dl_tensor.shape = huge_shape;
  sa_param_options options = SA_PARAM_OPTIONS_INIT;
  for (const int32_t placement : {SA_STATE_ON_HOST, SA_STATE_ON_HOST_CPU_STEP}) {
    INFO("placement " << placement);
    options.state_placement = placement;
    // exp_avg and exp_avg_sq of 2^40 float32: 2^43 bytes in all, 2^42 each
    CHECK_SA_FAILS(opt.get(), SA_ERR_OUT_OF_MEMORY,
                   sa_optimizer_add_param(opt.get(), "huge", 0, &huge, nullptr, &options, nullptr),
                   "param 'huge'", "8796093022208 bytes of pinned host memory", "4398046511104",
                   "the host has");
    CHECK(sa_optimizer_num_params(opt.get()) == 0);
  }

  options.state_placement = 7;
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(opt.get(), "bad", 0, small.versioned(), nullptr, &options,
                                        nullptr),
                 "state_placement is 7", "SA_STATE_ON_HOST");
  CHECK(sa_optimizer_num_params(opt.get()) == 0);

  options.state_placement = SA_STATE_ON_HOST;
  int64_t index = -1;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "w", 0, small.versioned(), nullptr,
                                                  &options, &index));
  CHECK(index == 0);
  DeviceTensor grad({16}, kFloat32);
  HostTensor ones({16}, kFloat32);
  for (int64_t i = 0; i < 16; ++i) ones.as<float>()[i] = 1.0f;
  grad.upload(ones);
  const DLTensor g = grad.dl();
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  // Adam's first step moves every element by -lr (a zero param, decay 0).
  const std::vector<unsigned char> after = small.download();
  float first = 0.0f;
  std::memcpy(&first, after.data(), sizeof first);
  CHECK(first == Approx(-1e-3).epsilon(1e-6));
  const StateView m = state_view(opt.get(), 0, "exp_avg");
  CHECK(m.view->dl_tensor.device.device_type == kDLCPU);
  CHECK(static_cast<const float*>(m.data())[0] == Approx(0.1).epsilon(1e-6));
}

// State on the host goes through a ring of 3 device buffers of 32 MiB: params of more state
// than the ring holds are cut into pieces of whole blocks over many segments (the ring
// wraps around several times), small ones share a segment, and a 8-bit moment's last,
// partial block ends its last piece. Every piece must update as the whole param does.
// State the CPU steps goes the same way through a mirror ring of 3 pinned host buffers of
// 32 MiB (param and grad).
TEST_CASE("state on the host larger than the staging ring steps to the CPU's bits",
          "[gpu][offload]") {
  const VariantSpec variants[] = {kVariants[0], kVariants[7], kVariants[10]};
  for (const GpuState state : {GpuState::host, GpuState::cpu_step})
  for (const VariantSpec& v : variants) {
    DYNAMIC_SECTION(v.label << (state == GpuState::cpu_step ? ", stepped by the CPU" : "")) {
      Rng rng(0x5E6 + static_cast<uint64_t>(v.master));
      Twin t(state);
      t.add_groups(v.amsgrad);
      t.add("small.0", 0, v, {1000}, 0, rng);
      t.add("big", 1, v, {9, 1'000'003}, 1, rng);  // ~9M elements: 72-144 MB of state
      t.add("small.1", 0, v, {257}, 0, rng);
      t.add("big.2", 0, v, {4'200'077}, 0, rng);
      for (int step = 0; step < 3; ++step) {
        t.bind_new_grads(rng, step % 2 == 1, true);
        t.step_both(1.0f, step == 1 ? 1.0f : 0.0f, nullptr);
      }
      t.require_identical();
    }
  }
}

// Partial steps on CUDA, state on the device and on the host (segments of params without a
// grad stay put), give the CPU backend's bits; a full step after them steps every param.
TEST_CASE("partial steps on CUDA equal the CPU backend's, state on the host or the device",
          "[gpu][offload][partial]") {
  Rng rng(0x9A47);
  Twin t(GpuState::all_three);
  t.add_groups(false);
  const VariantSpec& v = kVariants[3];  // bf16 + fp32 master
  for (int i = 0; i < 12; ++i)
    t.add("layers." + std::to_string(i), i % 2, v, {i == 5 ? 5'000'000 : 1000 + 313 * i}, 0, rng);
  for (int step = 0; step < 4; ++step) {
    t.bind_new_grads(rng, step % 2 == 1, true);
    std::vector<int64_t> evens, odds;
    for (int64_t i = 0; i < 12; ++i) (i % 3 == 0 ? evens : odds).push_back(i);
    for (const auto* part : {&evens, &odds})
      for (auto* opt : {t.cpu.get(), t.gpu.get()})
        REQUIRE_SA_OK(opt, sa_optimizer_step_params(opt, static_cast<int64_t>(part->size()),
                                                    part->data(), nullptr, nullptr));
    t.require_identical();
  }
  t.bind_new_grads(rng, false, true);
  t.step_both(1.0f, 0.0f, nullptr);
  t.require_identical();
  CHECK(step_count(t.gpu.get(), 0) == 1);
}

// A flush after a partial step readies a full step, which then captures (nothing left to
// upload) and replays to the CPU's bits.
TEST_CASE("a full step captured after a partial step and a flush replays to the CPU's bits",
          "[gpu][offload][partial]") {
  Rng rng(0xF1A5);
  Twin t(GpuState::mixed);
  t.add_groups(false);
  for (int i = 0; i < 6; ++i) t.add("p" + std::to_string(i), i % 2, kVariants[3], {2000 + 17 * i}, 0, rng);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  t.bind_new_grads(rng, false, true);
  const int64_t some[2] = {1, 4};
  for (auto* opt : {t.cpu.get(), t.gpu.get()})
    REQUIRE_SA_OK(opt, sa_optimizer_step_params(opt, 2, some, nullptr, opt == t.gpu.get() ? stream : nullptr));
  REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_flush(t.gpu.get(), stream));
  const CapturedStep captured = capture_step(t.gpu.get(), stream);
  INFO(captured.message);
  REQUIRE(captured.status == SA_OK);
  REQUIRE(captured.ended == cudaSuccess);
  cudaGraph_t graph = captured.graph;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  REQUIRE_SA_OK(t.cpu.get(), sa_optimizer_step(t.cpu.get(), nullptr, nullptr));
  t.require_identical();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A step of state the CPU steps runs host callbacks with per-step data: a capture is refused
// (SA_ERR_STATE) and changes nothing; the step outside capture then gives the CPU's bits.
TEST_CASE("a step of state stepped by the CPU refuses capture and changes nothing",
          "[gpu][offload][cpu_step]") {
  Rng rng(0xCA97);
  Twin t(GpuState::all_three);
  t.add_groups(false);
  for (int i = 0; i < 6; ++i) t.add("p" + std::to_string(i), i % 2, kVariants[3], {3000 + 11 * i}, 0, rng);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  t.bind_new_grads(rng, false, true);
  t.step_both(1.0f, 0.0f, stream);
  REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_flush(t.gpu.get(), stream));
  const CapturedStep captured = capture_step(t.gpu.get(), stream);
  if (captured.graph != nullptr) cudaGraphDestroy(captured.graph);
  CHECK(captured.status == SA_ERR_STATE);
  CHECK(captured.message.find("SA_STATE_ON_HOST_CPU_STEP cannot be captured") != std::string::npos);
  cudaGetLastError();  // an invalidated capture leaves its error
  CUDA_OK(cudaStreamSynchronize(stream));
  t.require_identical();  // nothing ran
  t.step_both(1.0f, 0.0f, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  t.require_identical();
  CHECK(step_count(t.gpu.get(), 0) == 2);
  cudaStreamDestroy(stream);
}

// A value past the last placement is refused by value, naming all three.
TEST_CASE("an unknown state placement is refused, adding nothing", "[gpu][offload][cpu_step]") {
  OptimizerPtr opt = make_optimizer();
  const sa_group_config group = group_config(1e-3, 0.0, 1);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &group, nullptr));
  DeviceTensor w({16}, kFloat32);
  sa_param_options plain = SA_PARAM_OPTIONS_INIT;
  plain.state_placement = 3;
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), nullptr, &plain, nullptr),
                 "state_placement is 3", "SA_STATE_ON_HOST_CPU_STEP 2");
  CHECK(sa_optimizer_num_params(opt.get()) == 0);
}
