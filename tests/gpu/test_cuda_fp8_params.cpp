// tests/gpu/test_cuda_fp8_params.cpp — fp8 params (float8_e4m3fn, float8_e5m2 with a
// float32 master and a scaling, sa_param_scaling) on CUDA against the CPU backend.
//
// The CPU backend is the reference (its casts are checked against casts searched over all
// codes in tests/test_fp8_params.cpp): from the same codes, scales and grads, a CUDA
// optimizer must give the same param codes, masters, moments, block scales and amax, bit
// for bit, at every step. Where a grad is NaN the float32 NaNs may differ in payload (a GPU
// makes the canonical NaN, a CPU keeps its operand's), so floats there compare as equal
// when both are NaN; codes still compare bit for bit.
//
// Built only with CUDA; gpu_main.cpp skips the binary where no CUDA device is usable.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu/cuda_test_support.hpp"
#include "test_state_io_support.hpp"
#include "test_support.hpp"
#include "test_thread_comm.hpp"

using namespace sa_test;

namespace {

constexpr DLDataType kE4m3 = {kDLFloat8_e4m3fn, 8, 1};
constexpr DLDataType kE5m2 = {kDLFloat8_e5m2, 8, 1};
constexpr DLDataType kE8m0 = {kDLFloat8_e8m0fnu, 8, 1};

struct Fp8Format {
  DLDataType dtype;
  const char* name;
};
const Fp8Format kFormats[] = {{kE4m3, "float8_e4m3fn"}, {kE5m2, "float8_e5m2"}};

struct ScalingCase {
  const char* label;
  int32_t scaling;
  int64_t block;   // 0: per tensor
  bool amax;       // delayed: with an amax tensor
  int32_t margin;  // current: sa_param_options.margin
};
const ScalingCase kCases[] = {{"delayed with amax", SA_SCALING_DELAYED, 0, true, 0},
                              {"delayed without amax", SA_SCALING_DELAYED, 0, false, 0},
                              {"mxfp8", SA_SCALING_MXFP8, 32, false, 0},
                              {"block128", SA_SCALING_BLOCK128, 128, false, 0},
                              {"current with amax", SA_SCALING_CURRENT, 0, true, 0},
                              {"current_pow2", SA_SCALING_CURRENT_POW2, 0, false, 0},
                              {"current, margin 3", SA_SCALING_CURRENT, 0, true, 3}};

bool is_current(const ScalingCase& s) {
  return s.scaling == SA_SCALING_CURRENT || s.scaling == SA_SCALING_CURRENT_POW2;
}

// The engine's delayed scale at each step: 1e4 saturates both formats' casts.
const float kDelayedScales[] = {16.0f, 1e4f, 0.5f, 64.0f, 3.0f, 1e-3f, 8.0f};

bool finite_code(const Fp8Format& f, uint8_t c) {
  if (same_dtype(f.dtype, kE4m3)) return (c & 0x7F) != 0x7F;
  return (c & 0x7C) != 0x7C;  // e5m2: exponent 31 is inf / NaN
}

// Bytes of float32 arrays equal, or (nan_ok) both NaN where they differ.
bool same_floats(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b,
                 bool nan_ok) {
  if (a.size() != b.size()) return false;
  if (!nan_ok) return a == b;
  for (std::size_t i = 0; i + 4 <= a.size(); i += 4) {
    float x, y;
    std::memcpy(&x, a.data() + i, 4);
    std::memcpy(&y, b.data() + i, 4);
    if (std::memcmp(&x, &y, 4) != 0 && !(std::isnan(x) && std::isnan(y))) return false;
  }
  return true;
}

// Elements [128, 256) of a shard of 512 or more: zero codes and zero grads, so zero blocks.
bool in_zero_blocks(int64_t i, int64_t numel) { return numel >= 512 && i >= 128 && i < 256; }

std::vector<unsigned char> host_bytes(const HostTensor& t) { return t.raw_bytes(); }

// One fp8 param on both backends: its codes, scale and amax tensors, and grads.
struct Fp8Shard {
  std::string name;
  int32_t group = 0;
  bool has_nan = false;  // a grad of this shard gets a NaN
  std::unique_ptr<HostTensor> param, scale, amax, grad;
  std::unique_ptr<DeviceTensor> dev_param, dev_scale, dev_amax, dev_grad;
};

// A CPU and a CUDA optimizer over the same fp8 shards (every shard of one format and
// scaling), with the groups of tests/gpu/twin.hpp: AdamW, and Adam with L2 decay,
// maximize and amsgrad.
struct Fp8Twin {
  Fp8Format format;
  ScalingCase scaling;
  OptimizerPtr cpu = make_optimizer(2, 1);
  OptimizerPtr gpu = make_optimizer();
  std::vector<Fp8Shard> shards;
  DeviceFloat dev_inv_scale, dev_found_inf;
  GpuState gpu_state;  // where the CUDA optimizer keeps each shard's state

  Fp8Twin(const Fp8Format& f, const ScalingCase& s, GpuState state = GpuState::device)
      : format(f), scaling(s), gpu_state(state) {
    sa_group_config adamw = group_config(2e-2, 1e-2, 1);
    sa_group_config adam_l2 = group_config(1e-2, 1e-1, 0);
    adam_l2.maximize = 1;
    adam_l2.beta1 = 0.8;
    adam_l2.amsgrad = 1;
    for (auto* opt : {cpu.get(), gpu.get()}) {
      REQUIRE_SA_OK(opt, sa_optimizer_add_group(opt, &adamw, nullptr));
      REQUIRE_SA_OK(opt, sa_optimizer_add_group(opt, &adam_l2, nullptr));
    }
  }
  ~Fp8Twin() {  // optimizers go first: they hold the tensors
    cpu.reset();
    gpu.reset();
  }
  Fp8Twin(const Fp8Twin&) = delete;
  Fp8Twin& operator=(const Fp8Twin&) = delete;

  // A shard of `shape` with random finite codes (elements [128, 256) zero in shards of 512
  // or more: zero blocks), random scales, grads of `grad` dtype and moments of `moment` dtype; its
  // device tensors `offset` elements off their allocation's alignment.
  void add(const std::string& name, int32_t group, std::vector<int64_t> shape, DLDataType grad,
           DLDataType moment, int64_t offset, float delayed_scale, Rng& rng) {
    Fp8Shard s;
    s.name = name;
    s.group = group;
    s.param = std::make_unique<HostTensor>(shape, format.dtype);
    for (int64_t i = 0; i < s.param->numel(); ++i) {
      auto c = static_cast<uint8_t>(rng.integer(0, 255));
      if (!finite_code(format, c)) c = 0x3A;
      s.param->as<uint8_t>()[i] = in_zero_blocks(i, s.param->numel()) ? 0 : c;
    }
    std::vector<int64_t> scale_shape{is_current(scaling) ? 2 : 1};  // current: [scale, scale_inv]
    if (scaling.block != 0) {
      scale_shape = shape;
      scale_shape.back() /= scaling.block;
    }
    s.scale = std::make_unique<HostTensor>(scale_shape,
                                           scaling.scaling == SA_SCALING_MXFP8 ? kE8m0 : kFloat32);
    for (int64_t b = 0; b < s.scale->numel(); ++b) {
      if (scaling.scaling == SA_SCALING_MXFP8)
        s.scale->as<uint8_t>()[b] = static_cast<uint8_t>(rng.integer(110, 129));
      else if (scaling.scaling == SA_SCALING_BLOCK128 || is_current(scaling))
        s.scale->as<float>()[b] = static_cast<float>(std::fabs(rng.signed_log_uniform(1e-3, 1e2)));
      else
        s.scale->as<float>()[b] = delayed_scale;
    }
    if (scaling.amax) {
      s.amax = std::make_unique<HostTensor>(std::vector<int64_t>{1}, kFloat32);
      s.amax->as<float>()[0] = -1.0f;  // never a step's amax: shows where none was written
    }
    s.grad = std::make_unique<HostTensor>(shape, grad);
    s.dev_param = std::make_unique<DeviceTensor>(shape, format.dtype, offset);
    s.dev_scale = std::make_unique<DeviceTensor>(scale_shape, s.scale->dtype());
    s.dev_grad = std::make_unique<DeviceTensor>(shape, grad, offset);
    s.dev_param->upload(*s.param);
    s.dev_scale->upload(*s.scale);
    if (s.amax) {
      s.dev_amax = std::make_unique<DeviceTensor>(std::vector<int64_t>{1}, kFloat32);
      s.dev_amax->upload(*s.amax);
    }
    sa_param_options o = param_options(grad, moment, SA_MASTER_AUTO);
    o.scaling = scaling.scaling;
    o.margin = scaling.margin;
    o.scale = s.scale->versioned();
    o.amax = s.amax ? s.amax->versioned() : nullptr;
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_param(cpu.get(), name.c_str(), group,
                                                    s.param->versioned(), nullptr, &o, nullptr));
    o.scale = s.dev_scale->versioned();
    o.amax = s.dev_amax ? s.dev_amax->versioned() : nullptr;
    o.state_placement = placement_of(gpu_state, shards.size());
    REQUIRE_SA_OK(gpu.get(),
                  sa_optimizer_add_param(gpu.get(), name.c_str(), group, s.dev_param->versioned(),
                                         nullptr, &o, nullptr));
    shards.push_back(std::move(s));
  }

  // The shards every case runs: an empty one, one of a single block (a delayed one of 37
  // elements: a partial tile lane), one of several CUDA chunks and two CPU work items,
  // bfloat16 grads and moments on misaligned tensors in the amsgrad group, one whose grad
  // gets a NaN, and two with block moments (8-bit, float8; the second over several chunks).
  void add_shards(Rng& rng, float delayed_scale) {
    const int64_t block = scaling.block == 0 ? 37 : scaling.block;
    const int64_t row = scaling.block == 0 ? 129 : 128;
    add("empty", 0, {0, row}, kFloat32, kFloat32, 0, delayed_scale, rng);
    add("one_block", 1, {1, block}, kFloat32, kFloat32, 0, delayed_scale, rng);
    add("chunks", 0, {3, 17408}, kFloat32, kFloat32, 0, delayed_scale, rng);
    add("bf16", 1, {5, 3 * row}, kBfloat16, kBfloat16, 1, delayed_scale, rng);
    add("nan", 0, {2, 2 * row}, kFloat32, kFloat32, 0, delayed_scale, rng);
    shards.back().has_nan = true;
    // Block moments: the block-moment kernel updates the masters, then a cast pass runs.
    add("q8_moments", 1, {3, 3 * row}, kFloat32, kUint8, 0, delayed_scale, rng);
    add("f8_moments", 0, {2, 17408}, kBfloat16, kFloat8E4m3fn, 0, delayed_scale, rng);
  }

  void set_delayed_scale(float s) {
    if (scaling.scaling != SA_SCALING_DELAYED) return;
    for (Fp8Shard& sh : shards) {
      sh.scale->as<float>()[0] = s;
      sh.dev_scale->upload(*sh.scale);
    }
  }

  // New grads (normal, times `magnitude`; a NaN in the NaN shard with nan) in the grad
  // buffers of the shards where present[i], host and device.
  void fill_grads(Rng& rng, double magnitude, bool nan, const std::vector<bool>& present) {
    for (std::size_t i = 0; i < shards.size(); ++i) {
      if (!present[i]) continue;
      Fp8Shard& s = shards[i];
      fill_normal(*s.grad, rng, magnitude);
      for (int64_t k = 0; k < s.grad->numel(); ++k)
        if (in_zero_blocks(k, s.grad->numel())) s.grad->set(k, 0.0f);  // they stay zero
      if (nan && s.has_nan) s.grad->set(s.grad->numel() - 40, NAN);
      s.dev_grad->upload(*s.grad);
    }
  }

  // New grads (fill_grads) for the shards where present[i], none for the others; one step
  // on both, skipped with found_inf.
  void step(Rng& rng, double magnitude, bool nan, const std::vector<bool>& present,
            float found_inf) {
    fill_grads(rng, magnitude, nan, present);
    std::vector<DLTensor> h(shards.size()), d(shards.size());
    std::vector<const DLTensor*> hl(shards.size(), nullptr), dl(shards.size(), nullptr);
    for (std::size_t i = 0; i < shards.size(); ++i) {
      if (!present[i]) continue;
      const Fp8Shard& s = shards[i];
      h[i] = s.grad->dl();
      d[i] = s.dev_grad->dl();
      hl[i] = &h[i];
      dl[i] = &d[i];
    }
    const auto n = static_cast<int64_t>(shards.size());
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_grads(cpu.get(), n, hl.data()));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_set_grads(gpu.get(), n, dl.data()));
    float inv_scale = 1.0f;
    dev_inv_scale.set(inv_scale);
    dev_found_inf.set(found_inf);
    sa_step_args ca = SA_STEP_ARGS_INIT, ga = SA_STEP_ARGS_INIT;
    ca.inv_grad_scale = &inv_scale;
    ca.found_inf = &found_inf;
    ga.inv_grad_scale = dev_inv_scale.get();
    ga.found_inf = dev_found_inf.get();
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_step(cpu.get(), &ca, nullptr));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_step(gpu.get(), &ga, nullptr));
  }

  // The CUDA side of every shard (codes, scales, amax, every state) equals the CPU side.
  void require_identical() const {
    CUDA_OK(cudaDeviceSynchronize());
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const Fp8Shard& s = shards[i];
      INFO("shard '" << s.name << "' (" << s.param->numel() << " elements)");
      CHECK(s.dev_param->download() == host_bytes(*s.param));
      if (scaling.scaling == SA_SCALING_MXFP8)
        CHECK(s.dev_scale->download() == host_bytes(*s.scale));
      if (scaling.scaling == SA_SCALING_BLOCK128 || is_current(scaling))
        CHECK(same_floats(s.dev_scale->download(), host_bytes(*s.scale), s.has_nan));
      if (s.amax) CHECK(same_floats(s.dev_amax->download(), host_bytes(*s.amax), s.has_nan));
      const char* keys[16] = {};
      int32_t num_keys = 0;
      REQUIRE_SA_OK(cpu.get(), sa_optimizer_state_keys(cpu.get(), static_cast<int64_t>(i), keys, 16,
                                                       &num_keys));
      REQUIRE(num_keys >= 3);  // exp_avg, exp_avg_sq, master
      for (int32_t k = 0; k < num_keys; ++k) {
        INFO("state " << keys[k]);
        const StateView c = state_view(cpu.get(), static_cast<int64_t>(i), keys[k]);
        const StateView d = state_view(gpu.get(), static_cast<int64_t>(i), keys[k]);
        CHECK(d.view->dl_tensor.device.device_type ==
              (placement_of(gpu_state, i) != SA_STATE_ON_DEVICE ? kDLCPU : kDLCUDA));
        const bool f32 = same_dtype(c.view->dl_tensor.dtype, kFloat32);
        if (f32)
          CHECK(same_floats(download_view(d), c.raw_bytes(), s.has_nan));
        else if (!s.has_nan)
          CHECK(download_view(d) == c.raw_bytes());
      }
    }
  }
};

// 7 steps: saturating delayed scales and grads of 1e3, a step skipped by found_inf, a step
// without the big shard's grad, a NaN grad at step 4.
void train(Fp8Twin& t, Rng& rng) {
  const std::size_t n = t.shards.size();
  for (int step = 0; step < 7; ++step) {
    INFO("step " << step);
    t.set_delayed_scale(kDelayedScales[step]);
    std::vector<bool> present(n, true);
    if (step == 5) present[2] = false;  // "chunks": no grad, so no cast and no amax
    t.step(rng, step == 3 ? 1e3 : 1.0, /*nan=*/step == 4, present,
           /*found_inf=*/step == 2 ? 1.0f : 0.0f);
    t.require_identical();
  }
}

}  // namespace

TEST_CASE("fp8 params on CUDA step to the CPU's codes, masters, scales and amax bit for bit",
          "[gpu][fp8param]") {
  for (const Fp8Format& f : kFormats) {
    for (const ScalingCase& s : kCases) {
      DYNAMIC_SECTION(f.name << ", " << s.label) {
        Rng rng(0xF8 + static_cast<uint64_t>(s.scaling * 2 + (s.amax ? 1 : 0)) +
                (same_dtype(f.dtype, kE5m2) ? 100 : 0));
        Fp8Twin t(f, s);
        t.add_shards(rng, kDelayedScales[0]);
        t.require_identical();  // the masters' initialisation
        train(t, rng);
        if (s.amax) {  // delayed: the empty shard's amax was never written (still its -1);
                       // current: the tensor's, of no elements
          const std::vector<unsigned char> bytes = t.shards[0].dev_amax->download();
          float amax = 0.0f;
          std::memcpy(&amax, bytes.data(), sizeof amax);
          CHECK(amax == (is_current(s) ? 0.0f : -1.0f));
        }
      }
    }
  }
}

// Masters and moments on the host, fp8 params, their scales and amax on the device: every
// other shard's state on the host (the device's kernels reach it mapped), or in all three
// placements (the host updates the CPU-stepped shards' masters, then the device casts them).
void fp8_on_the_host(GpuState state) {
  for (const Fp8Format& f : kFormats) {
    for (const ScalingCase& s : kCases) {
      DYNAMIC_SECTION(f.name << ", " << s.label) {
        Rng rng(0x0F8 + static_cast<uint64_t>(s.scaling * 2 + (s.amax ? 1 : 0)));
        Fp8Twin t(f, s, state);
        t.add_shards(rng, kDelayedScales[0]);
        t.require_identical();  // the masters' initialisation, into host memory
        train(t, rng);
      }
    }
  }
}

TEST_CASE("fp8 params with their state on the host step to the CPU's bits",
          "[gpu][fp8param][offload]") {
  fp8_on_the_host(GpuState::mixed);
}

TEST_CASE("fp8 params whose state the CPU steps, beside the other placements, step to its bits",
          "[gpu][fp8param][offload][cpu_step]") {
  fp8_on_the_host(GpuState::all_three);
}

TEST_CASE("fp8 params whose state the CPU steps, every one, step to its bits",
          "[gpu][fp8param][offload][cpu_step]") {
  fp8_on_the_host(GpuState::cpu_step);
}

TEST_CASE("a CUDA state import casts fp8 params from the loaded master as the step did",
          "[gpu][fp8param][state_io]") {
  for (const Fp8Format& f : kFormats) {
    for (const ScalingCase& s : kCases) {
      DYNAMIC_SECTION(f.name << ", " << s.label) {
        Rng rng(0x1F8 + static_cast<uint64_t>(s.scaling * 2 + (s.amax ? 1 : 0)));
        Fp8Twin t(f, s);
        t.add_shards(rng, kDelayedScales[0]);
        train(t, rng);
        const Bytes gpu_blob = export_blob(t.gpu.get());
        const Bytes cpu_blob = export_blob(t.cpu.get());

        // Other codes and scales (and, for delayed, the engine's last scale), the loaded
        // masters and moments: the param must be cast back from the master.
        Rng other(0xBAD);
        Fp8Twin r(f, s);
        r.add_shards(other, kDelayedScales[6]);
        REQUIRE_SA_OK(r.gpu.get(), import_blobs(r.gpu.get(), {gpu_blob}));
        REQUIRE_SA_OK(r.cpu.get(), import_blobs(r.cpu.get(), {cpu_blob}));
        r.require_identical();
        CUDA_OK(cudaDeviceSynchronize());
        for (std::size_t i = 0; i < t.shards.size(); ++i) {
          const Fp8Shard& a = t.shards[i];
          const Fp8Shard& b = r.shards[i];
          INFO("shard '" << a.name << "'");
          CHECK(b.dev_param->download() == a.dev_param->download());
          if (s.block != 0 || is_current(s))
            CHECK(same_floats(b.dev_scale->download(), a.dev_scale->download(), a.has_nan));
          // The import's amax is that of the loaded master, the last step's (every shard
          // had a grad there); the empty shard's was never written.
          if (s.amax && a.param->numel() > 0)
            CHECK(same_floats(b.dev_amax->download(), a.dev_amax->download(), a.has_nan));
        }
        // And both go on training alike.
        r.set_delayed_scale(kDelayedScales[1]);
        r.step(rng, 1.0, false, std::vector<bool>(r.shards.size(), true), 0.0f);
        r.require_identical();
      }
    }
  }
}

// The step of fp8 params enqueues only stream-ordered work (the amax reset is a kernel that
// reads the verdict), so it captures into a CUDA graph; replays with new grads and a new
// delayed scale in the same buffers must follow the CPU.
TEST_CASE("a captured fp8 step replays in a CUDA graph and follows the CPU bit for bit",
          "[gpu][fp8param]") {
  for (const ScalingCase& s : kCases) {
    if (s.scaling == SA_SCALING_DELAYED && !s.amax) continue;
    DYNAMIC_SECTION(s.label) {
      Rng rng(0x6A8 + static_cast<uint64_t>(s.scaling));
      Fp8Twin t(kFormats[0], s);
      t.add_shards(rng, kDelayedScales[0]);
      const std::vector<bool> all(t.shards.size(), true);
      t.step(rng, 1.0, false, all, 0.0f);  // builds the plan and binds the grads for good
      CUDA_OK(cudaDeviceSynchronize());    // that step ran on the legacy stream
      cudaStream_t stream = nullptr;
      CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_flush(t.gpu.get(), stream));
      cudaGraph_t graph = nullptr;
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      REQUIRE_SA_OK(t.gpu.get(), sa_optimizer_step(t.gpu.get(), nullptr, stream));
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 3; ++replay) {
        INFO("replay " << replay);
        t.set_delayed_scale(kDelayedScales[replay + 1]);
        t.fill_grads(rng, replay == 1 ? 1e3 : 1.0, false, all);
        CUDA_OK(cudaDeviceSynchronize());  // the uploads (legacy stream) before the replay
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        REQUIRE_SA_OK(t.cpu.get(), sa_optimizer_step(t.cpu.get(), nullptr, nullptr));
        t.require_identical();
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
    }
  }
}

// A sharded current-scaled param reduces its amax between the passes: on CUDA through NCCL
// on the stream (so the step captures), on the CPU through host callbacks. One rank of a
// 2-rank Shard(0) layout whose communicators are 1-rank ones (NCCL's of one GPU; callbacks
// that return the values): the reduction is the identity, and both must give the same bits.
TEST_CASE(
    "a sharded current-scaled param steps and captures with its amax reduced by NCCL, "
    "as the CPU does with a host communicator",
    "[gpu][fp8param][comm]") {
  if (std::string(sa_build_info()).find("nccl: built") == std::string::npos) {
    WARN("this build has no NCCL: the reduction of a current scaling's amax on CUDA is not tested");
    return;
  }
  sa_nccl_unique_id id{};
  REQUIRE_SA_OK(nullptr, sa_nccl_unique_id_create(&id));
  sa_comm* nccl_raw = nullptr;
  REQUIRE_SA_OK(nullptr, sa_comm_create_nccl(&id, 1, 0, 0, &nccl_raw));
  CommPtr nccl(nccl_raw);
  sa_host_comm callbacks = SA_HOST_COMM_INIT;
  callbacks.all_reduce = [](void*, double*, int32_t, sa_reduce_op) { return 0; };
  sa_comm* host_raw = nullptr;
  REQUIRE_SA_OK(nullptr, sa_comm_create_host(&callbacks, &host_raw));
  CommPtr host(host_raw);

  const MeshLayout rows{{16, 4096}, {2}, {0}, {shard(0)}};
  const sa_layout layout = rows.get();
  const std::vector<int64_t> shape{8, 4096};
  Rng rng(0xC0C);
  HostTensor param(shape, kE4m3), scale({2}, kFloat32), amax({1}, kFloat32), grad(shape, kFloat32);
  for (int64_t i = 0; i < param.numel(); ++i) {
    auto c = static_cast<uint8_t>(rng.integer(0, 255));
    param.as<uint8_t>()[i] = finite_code(kFormats[0], c) ? c : 0x3A;
  }
  scale.as<float>()[0] = 4.0f;
  scale.as<float>()[1] = 0.25f;
  DeviceTensor dev_param(shape, kE4m3), dev_scale({2}, kFloat32), dev_amax({1}, kFloat32),
      dev_grad(shape, kFloat32);
  dev_param.upload(param);
  dev_scale.upload(scale);
  {
    OptimizerPtr cpu = make_optimizer(2, 1), gpu = make_optimizer();
    const sa_group_config adamw = group_config(2e-2, 1e-2, 1);
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_group(cpu.get(), &adamw, nullptr));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_add_group(gpu.get(), &adamw, nullptr));
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_comm(cpu.get(), host.get()));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_set_comm(gpu.get(), nccl.get()));
    sa_param_options o = SA_PARAM_OPTIONS_INIT;
    o.scaling = SA_SCALING_CURRENT;
    o.scale = scale.versioned();
    o.amax = amax.versioned();
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_param(cpu.get(), "w", 0, param.versioned(), &layout,
                                                    &o, nullptr));
    o.scale = dev_scale.versioned();
    o.amax = dev_amax.versioned();
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_add_param(gpu.get(), "w", 0, dev_param.versioned(),
                                                    &layout, &o, nullptr));
    const DLTensor hg = grad.dl(), dg = dev_grad.dl();
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_grad(cpu.get(), 0, &hg));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_set_grad(gpu.get(), 0, &dg));
    const auto require_identical = [&] {
      CUDA_OK(cudaDeviceSynchronize());
      CHECK(dev_param.download() == param.raw_bytes());
      CHECK(dev_scale.download() == scale.raw_bytes());
      CHECK(dev_amax.download() == amax.raw_bytes());
      CHECK(download_view(state_view(gpu.get(), 0, "master")) ==
            state_view(cpu.get(), 0, "master").raw_bytes());
    };
    const auto new_grads = [&](double magnitude) {
      fill_normal(grad, rng, magnitude);
      dev_grad.upload(grad);
    };
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step);
      new_grads(step == 1 ? 1e3 : 1.0);
      REQUIRE_SA_OK(cpu.get(), sa_optimizer_step(cpu.get(), nullptr, nullptr));
      REQUIRE_SA_OK(gpu.get(), sa_optimizer_step(gpu.get(), nullptr, nullptr));
      require_identical();
    }
    cudaStream_t stream = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_flush(gpu.get(), stream));
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const sa_status captured = sa_optimizer_step(gpu.get(), nullptr, stream);
    const std::string error = sa_optimizer_last_error(gpu.get());
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    INFO(error);
    REQUIRE(captured == SA_OK);
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      INFO("replay " << replay);
      new_grads(replay == 0 ? 10.0 : 1.0);
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      REQUIRE_SA_OK(cpu.get(), sa_optimizer_step(cpu.get(), nullptr, nullptr));
      require_identical();
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}
