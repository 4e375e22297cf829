// tests/test_state_and_dlpack.cpp — the optimizer's state and its DLPack surface: state
// views are zero-copy, correctly typed and outlive the optimizer; params come in as
// versioned or legacy DLPack; param_info, find_param, groups and step counts round-trip;
// grads bind by DLTensor (byte_offset honoured) or by pointer, may be rebound every step,
// and are not needed for empty params; version, build info and status strings.
#include "test_support.hpp"

namespace {

using namespace sa_test;
using Dims = std::vector<int64_t>;

// The library's float32 param (no master) and moments, as a reference state.
RefState library_state(sa_optimizer* opt, int64_t param, const HostTensor& shard) {
  RefState s(values_of(shard), Storage::f32);
  const StateView m = state_view(opt, param, "exp_avg");
  const StateView v = state_view(opt, param, "exp_avg_sq");
  for (int64_t i = 0; i < shard.numel(); ++i) {
    s.m[i] = m.get(i);
    s.v[i] = v.get(i);
  }
  return s;
}

// The float32 param equals the reference value after one step (float32 rounding only).
void check_value(const HostTensor& shard, const std::vector<double>& want, double step_size) {
  Worst w("param");
  for (int64_t i = 0; i < shard.numel(); ++i)
    w.add(i, shard.get(i), want[i], step_value_tolerance(want[i], step_size));
  CHECK_WITHIN(w);
}

// Whether `got` differs from `want` somewhere beyond the one-step tolerance.
bool differs(const std::vector<double>& got, const std::vector<double>& want, double step_size) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > step_value_tolerance(want[i], step_size)) return true;
  return false;
}

OptimizerPtr optimizer_with_group(const sa_group_config& config) {
  auto opt = make_optimizer();
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
  return opt;
}

}  // namespace

// ---- state views -----------------------------------------------------------------------------

TEST_CASE("state views have the state's storage dtype, the local shape and the optimizer's device",
          "[state]") {
  const sa_group_config config = [] {
    sa_group_config c = SA_GROUP_CONFIG_INIT;
    c.amsgrad = 1;
    return c;
  }();
  HostTensor f32({3, 5}, kFloat32), bf16({7}, kBfloat16), rem({2, 2, 2}, kBfloat16),
      empty({0, 4}, kFloat32);
  auto opt = optimizer_with_group(config);
  const sa_param_options bf16_moments = param_options(kDefaultDtype, kBfloat16, SA_MASTER_AUTO);
  const sa_param_options remainder = param_options(kDefaultDtype, kBfloat16, SA_MASTER_REMAINDER);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "f32", 0, f32.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "bf16", 0, bf16.versioned(), nullptr,
                                                  &bf16_moments, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "rem", 0, rem.versioned(), nullptr,
                                                  &remainder, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "empty", 0, empty.versioned(), nullptr,
                                                  nullptr, nullptr));

  struct Expect {
    int64_t param;
    const char* key;
    DLDataType dtype;
    Dims shape;
  };
  const std::vector<Expect> expected = {
      {0, "exp_avg", kFloat32, {3, 5}},
      {0, "exp_avg_sq", kFloat32, {3, 5}},
      {0, "max_exp_avg_sq", kFloat32, {3, 5}},
      {1, "exp_avg", kBfloat16, {7}},
      {1, "exp_avg_sq", kBfloat16, {7}},
      {1, "max_exp_avg_sq", kBfloat16, {7}},
      {1, "master", kFloat32, {7}},
      {2, "exp_avg", kBfloat16, {2, 2, 2}},
      {2, "remainder", kInt16, {2, 2, 2}},
      {3, "exp_avg", kFloat32, {0, 4}},
  };
  for (const Expect& e : expected) {
    INFO("param " << e.param << " state " << e.key);
    const StateView view = state_view(opt.get(), e.param, e.key);
    const DLManagedTensorVersioned& t = *view.view;
    CHECK(t.version.major == DLPACK_MAJOR_VERSION);
    CHECK((t.flags & DLPACK_FLAG_BITMASK_READ_ONLY) == 0);  // writable, as documented
    CHECK(t.deleter != nullptr);
    CHECK(same_dtype(t.dl_tensor.dtype, e.dtype));
    CHECK(Dims(t.dl_tensor.shape, t.dl_tensor.shape + t.dl_tensor.ndim) == e.shape);
    CHECK(t.dl_tensor.device.device_type == kDLCPU);
    CHECK(t.dl_tensor.device.device_id == 0);
    CHECK(t.dl_tensor.strides == nullptr);
    // A fresh state is zero (moments, remainder); a master starts as the param's value.
    if (std::string(e.key) != "master")
      for (int64_t i = 0; i < view.numel(); ++i) CHECK(view.get(i) == 0.0);
  }
}

// A CPU param's state is host memory whatever placement it asks for: SA_STATE_ON_HOST and
// SA_STATE_ON_HOST_CPU_STEP are accepted and resolve to SA_STATE_ON_DEVICE (one bucket for
// all), and step the same bits. A value that is no sa_state_placement is refused and adds
// nothing.
TEST_CASE("state_placement: a CPU param's state is host memory, unknown placements refused",
          "[state]") {
  HostTensor a({33}, kFloat32), b({33}, kFloat32), c({33}, kFloat32), grad({33}, kFloat32);
  Rng rng(0x91ACE);
  fill_normal(a, rng, 1.0);
  std::memcpy(b.data(), a.data(), a.bytes());
  std::memcpy(c.data(), a.data(), a.bytes());
  fill_normal(grad, rng, 1.0);
  auto opt = optimizer_with_group(SA_GROUP_CONFIG_INIT);
  sa_param_options options = SA_PARAM_OPTIONS_INIT;
  CHECK(options.state_placement == SA_STATE_ON_DEVICE);
  for (int32_t bad : {-1, 3, 1 << 20}) {
    options.state_placement = bad;
    CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                   sa_optimizer_add_param(opt.get(), "a", 0, a.versioned(), nullptr, &options, nullptr),
                   "param 'a'", "state_placement is " + std::to_string(bad),
                   "it must be an sa_state_placement");
    CHECK(sa_optimizer_num_params(opt.get()) == 0);
  }
  options.state_placement = SA_STATE_ON_HOST;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "a", 0, a.versioned(), nullptr,
                                                  &options, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "b", 0, b.versioned(), nullptr,
                                                  nullptr, nullptr));
  options.state_placement = SA_STATE_ON_HOST_CPU_STEP;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "c", 0, c.versioned(), nullptr,
                                                  &options, nullptr));
  for (int64_t i : {0, 1, 2}) {
    sa_param_info info = SA_PARAM_INFO_INIT;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_param_info(opt.get(), i, &info));
    CHECK(info.state_placement == SA_STATE_ON_DEVICE);
    CHECK(state_view(opt.get(), i, "exp_avg").view->dl_tensor.device.device_type == kDLCPU);
  }
  const std::vector<unsigned char> initial = a.raw_bytes();
  const DLTensor g = grad.dl();
  for (int64_t i : {0, 1, 2}) REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), i, &g));
  for (int s = 0; s < 3; ++s) REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  CHECK(a.raw_bytes() != initial);  // stepped
  CHECK(a.raw_bytes() == b.raw_bytes());
  CHECK(c.raw_bytes() == b.raw_bytes());
}

TEST_CASE("a master starts as the param's value, widened exactly", "[state]") {
  HostTensor bf16({64}, kBfloat16), f16({64}, kFloat16);
  auto opt = optimizer_with_group(SA_GROUP_CONFIG_INIT);
  Rng rng(1);
  fill_normal(bf16, rng, 3.0);
  fill_normal(f16, rng, 3.0);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "bf16", 0, bf16.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "f16", 0, f16.versioned(), nullptr,
                                                  nullptr, nullptr));
  const StateView m0 = state_view(opt.get(), 0, "master");
  const StateView m1 = state_view(opt.get(), 1, "master");
  for (int64_t i = 0; i < 64; ++i) {
    CHECK(m0.get(i) == bf16.get(i));
    CHECK(m1.get(i) == f16.get(i));
  }
}

TEST_CASE(
    "state views are zero-copy: two views of a state share memory, and writes through a view steer "
    "the next step",
    "[state]") {
  const sa_group_config config = group_config(1e-2, 1e-2, 1);
  HostTensor w({40}, kFloat32), grad({40}, kFloat32);
  auto opt = optimizer_with_group(config);
  Rng rng(2);
  fill_normal(w, rng, 1.0);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), nullptr,
                                                  nullptr, nullptr));
  const DLTensor g = grad.dl();
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
  fill_log_uniform(grad, rng, 1e-3, 1.0);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));

  const StateView m = state_view(opt.get(), 0, "exp_avg");
  const StateView m_again = state_view(opt.get(), 0, "exp_avg");
  const StateView v = state_view(opt.get(), 0, "exp_avg_sq");
  CHECK(m.data() == m_again.data());
  CHECK(m.data() != v.data());

  // Overwrite both moments with values of our own choosing.
  RefState unwritten = library_state(opt.get(), 0, w);
  for (int64_t i = 0; i < 40; ++i) {
    static_cast<float*>(m.data())[i] = static_cast<float>(0.05 * rng.normal());
    static_cast<float*>(v.data())[i] = static_cast<float>(0.01 + 0.01 * rng.uniform());
  }
  RefState written = library_state(opt.get(), 0, w);
  CHECK(m_again.get(7) == written.m[7]);  // the other view sees the write

  fill_log_uniform(grad, rng, 1e-3, 1.0);
  RefScales scales;
  reference_step(written, config, 2, values_of(grad), 1.0, RefBug::none, &scales);
  reference_step(unwritten, config, 2, values_of(grad), 1.0);
  REQUIRE(differs(written.value, unwritten.value, scales.step_size));  // the write matters
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  check_value(w, written.value, scales.step_size);
  // The step wrote its new moments where the views look.
  Worst m_after("exp_avg after the step");
  for (int64_t i = 0; i < 40; ++i)
    m_after.add(i, m.get(i), written.m[i],
                step_moment_tolerance(written.m[i], scales.m_terms[i], Storage::f32));
  CHECK_WITHIN(m_after);
}

namespace {

float float_of_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Values to write into a master: random ones, and exact midpoints between two neighbours
// of the low-precision format (`mantissa_bits` stored mantissa bits), where the rounding
// rule decides.
std::vector<float> values_with_ties(Rng& rng, int64_t n, int mantissa_bits) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float x = static_cast<float>(rng.normal() * 4.0);
    if (i % 2 == 0) {
      out[i] = x;
    } else {  // keep the top 1 + 8 + mantissa_bits bits, then set the half-ulp bit
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      const int drop = 23 - mantissa_bits;
      bits = (bits >> drop << drop) | (1u << (drop - 1));
      out[i] = float_of_bits(bits);
    }
  }
  return out;
}

}  // namespace

TEST_CASE(
    "writing a master through its view sets the param at the next step: the nearest value, ties to "
    "even",
    "[state]") {
  const int32_t simd = GENERATE(0, 1);
  INFO("cpu_simd " << simd);
  // No decay, zero grads, zero moments: m / (sqrt(v) + eps) = 0, so the step keeps the
  // masters as written and rewrites each param from its master. 37 elements: whole SIMD
  // vectors and a scalar tail.
  const sa_group_config still = group_config(1e-2, 0.0, 1);
  HostTensor bf16({37}, kBfloat16), f16({37}, kFloat16), grad_bf16({37}, kBfloat16),
      grad_f16({37}, kFloat16);
  auto opt = make_optimizer(1, simd);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &still, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "bf16", 0, bf16.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "f16", 0, f16.versioned(), nullptr,
                                                  nullptr, nullptr));
  const void* ptrs[2] = {grad_bf16.data(), grad_f16.data()};
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad_ptrs(opt.get(), 2, ptrs));
  const StateView master_bf16 = state_view(opt.get(), 0, "master");
  const StateView master_f16 = state_view(opt.get(), 1, "master");
  Rng rng(3);
  const std::vector<float> written_bf16 = values_with_ties(rng, 37, 7);
  const std::vector<float> written_f16 = values_with_ties(rng, 37, 10);
  std::memcpy(master_bf16.data(), written_bf16.data(), 37 * sizeof(float));
  std::memcpy(master_f16.data(), written_f16.data(), 37 * sizeof(float));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  for (int64_t i = 0; i < 37; ++i) {
    INFO("element " << i << ", bf16 master " << written_bf16[i] << ", f16 master "
                    << written_f16[i]);
    CHECK(master_bf16.get(i) == written_bf16[i]);
    CHECK(master_f16.get(i) == written_f16[i]);
    CHECK(bf16.get(i) == round_to_bf16(written_bf16[i]));
    CHECK(f16.get(i) == round_to_f16(written_f16[i]));
  }
}

TEST_CASE(
    "a bfloat16 param with a remainder reads as its value rounded to nearest, ties away from zero",
    "[state]") {
  const int32_t simd = GENERATE(0, 1);
  INFO("cpu_simd " << simd);
  const sa_group_config still = group_config(1e-2, 0.0, 1);
  HostTensor p({37}, kBfloat16), grad({37}, kBfloat16);
  Rng rng(13);
  fill_normal(p, rng, 4.0);
  auto opt = make_optimizer(1, simd);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &still, nullptr));
  const sa_param_options remainder =
      param_options(kDefaultDtype, kDefaultDtype, SA_MASTER_REMAINDER);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "p", 0, p.versioned(), nullptr,
                                                  &remainder, nullptr));
  const void* ptrs[1] = {grad.data()};
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad_ptrs(opt.get(), 1, ptrs));
  const StateView rem = state_view(opt.get(), 0, "remainder");
  auto* rem_bits = static_cast<int16_t*>(rem.data());
  // Remainders that put the value exactly half-way (-0x8000), just below or above it, or
  // anywhere.
  std::vector<float> value(37);
  for (int64_t i = 0; i < 37; ++i) {
    const int16_t r = i % 4 == 0   ? int16_t{-0x8000}
                      : i % 4 == 1 ? int16_t{-0x7FFF}
                      : i % 4 == 2 ? int16_t{0x7FFF}
                                   : static_cast<int16_t>(rng.integer(-0x8000, 0x7FFF));
    rem_bits[i] = r;
    value[i] = join_param_and_remainder(p.as<uint16_t>()[i], r);
  }
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  for (int64_t i = 0; i < 37; ++i) {
    INFO("element " << i << ", value " << value[i]);
    const float joined = join_param_and_remainder(p.as<uint16_t>()[i], rem_bits[i]);
    CHECK(std::memcmp(&joined, &value[i], sizeof joined) == 0);  // the value survives the split
    CHECK(p.get(i) == round_to_bf16_ties_away(value[i]));
  }
}

TEST_CASE("a state view stays valid after sa_optimizer_destroy until its own deleter runs",
          "[state][dlpack]") {
  HostTensor w({1000}, kFloat32), grad({1000}, kFloat32);
  Rng rng(4);
  fill_normal(w, rng, 1.0);
  fill_normal(grad, rng, 1.0);
  DLManagedTensorVersioned* view = nullptr;
  std::vector<float> seen(1000);
  {
    auto opt = optimizer_with_group(SA_GROUP_CONFIG_INIT);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), nullptr,
                                                    nullptr, nullptr));
    const DLTensor g = grad.dl();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_state_view(opt.get(), 0, "exp_avg_sq", &view));
    std::memcpy(seen.data(), view->dl_tensor.data, sizeof(float) * 1000);
    CHECK(std::any_of(seen.begin(), seen.end(), [](float x) { return x != 0.0f; }));
  }  // the optimizer is gone; the view must not be
  CHECK(w.deleter_calls() == 1);
  REQUIRE(view != nullptr);
  CHECK(view->dl_tensor.shape[0] == 1000);
  CHECK(std::memcmp(seen.data(), view->dl_tensor.data, sizeof(float) * 1000) == 0);
  static_cast<float*>(view->dl_tensor.data)[999] = 1.0f;  // still writable memory
  view->deleter(view);
}

// ---- params in -------------------------------------------------------------------------------

TEST_CASE("a legacy DLManagedTensor param steps like a versioned one and is released once",
          "[dlpack]") {
  const sa_group_config config = group_config(1e-2, 1e-2, 1);
  HostTensor a({50}, kFloat32), b({50}, kFloat32), grad({50}, kFloat32);
  Rng rng(5);
  fill_normal(a, rng, 1.0);
  std::memcpy(b.data(), a.data(), a.bytes());
  {
    auto opt = optimizer_with_group(config);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "versioned", 0, a.versioned(),
                                                    nullptr, nullptr, nullptr));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param_legacy(opt.get(), "legacy", 0, b.legacy(),
                                                           nullptr, nullptr, nullptr));
    const void* ptrs[2] = {grad.data(), grad.data()};
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad_ptrs(opt.get(), 2, ptrs));
    RefState ref(values_of(a), Storage::f32);
    double step_size = 0.0;
    for (int t = 1; t <= 5; ++t) {
      fill_normal(grad, rng, 0.1);
      RefScales scales;
      reference_step(ref, config, t, values_of(grad), 1.0, RefBug::none, &scales);
      step_size += scales.step_size;
      REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
    }
    CHECK(a.raw_bytes() == b.raw_bytes());
    check_value(b, ref.value, step_size);
    CHECK(b.deleter_calls() == 0);
  }
  CHECK(a.deleter_calls() == 1);
  CHECK(b.deleter_calls() == 1);
}

TEST_CASE("param_info reports what was registered, AUTO resolved, and its pointers stay valid",
          "[params]") {
  HostTensor f32({3, 3}, kFloat32), bf16({5}, kBfloat16), f16({2}, kFloat16);
  std::vector<HostTensor> extras;
  for (int k = 0; k < 40; ++k) extras.emplace_back(Dims{1}, kFloat32);
  const sa_group_config defaults = SA_GROUP_CONFIG_INIT;
  auto opt = optimizer_with_group(defaults);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &defaults, nullptr));
  const MeshLayout mesh{{3, 9}, {3}, {1}, {shard(1)}};  // columns 3..6
  const sa_layout layout = mesh.get();
  int64_t index = -1;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "layers.0.w", 1, f32.versioned(),
                                                  &layout, nullptr, &index));
  CHECK(index == 0);
  const sa_param_options bf16_opts = param_options(kFloat32, kBfloat16, SA_MASTER_REMAINDER);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "layers.0.b", 0, bf16.versioned(),
                                                  nullptr, &bf16_opts, &index));
  CHECK(index == 1);

  sa_param_info info = SA_PARAM_INFO_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_param_info(opt.get(), 0, &info));
  const sa_param_info first = info;
  CHECK(std::string(info.name) == "layers.0.w");
  CHECK(info.group == 1);
  CHECK(info.ndim == 2);
  CHECK(Dims(info.local_shape, info.local_shape + 2) == Dims{3, 3});
  CHECK(Dims(info.global_shape, info.global_shape + 2) == Dims{3, 9});
  CHECK(Dims(info.global_offset, info.global_offset + 2) == Dims{0, 3});
  CHECK(info.numel == 9);
  CHECK(same_dtype(info.param_dtype, kFloat32));
  CHECK(same_dtype(info.grad_dtype, kFloat32));    // default: the param's dtype
  CHECK(same_dtype(info.moment_dtype, kFloat32));  // default: float32
  CHECK(info.master == SA_MASTER_NONE);            // AUTO on float32
  CHECK(info.device.device_type == kDLCPU);

  REQUIRE_SA_OK(opt.get(), sa_optimizer_param_info(opt.get(), 1, &info));
  CHECK(std::string(info.name) == "layers.0.b");
  CHECK(info.group == 0);
  CHECK(info.ndim == 1);
  CHECK(info.global_offset[0] == 0);
  CHECK(same_dtype(info.param_dtype, kBfloat16));
  CHECK(same_dtype(info.grad_dtype, kFloat32));
  CHECK(same_dtype(info.moment_dtype, kBfloat16));
  CHECK(info.master == SA_MASTER_REMAINDER);

  // More params later (the optimizer's tables grow): the first info's pointers still hold.
  for (int k = 0; k < 40; ++k) {
    const std::string name = "extra." + std::to_string(k);
    REQUIRE_SA_OK(opt.get(),
                  sa_optimizer_add_param(opt.get(), name.c_str(), 0, extras[k].versioned(), nullptr,
                                         nullptr, nullptr));
  }
  CHECK(sa_optimizer_num_params(opt.get()) == 42);
  CHECK(std::string(first.name) == "layers.0.w");
  CHECK(Dims(first.global_offset, first.global_offset + 2) == Dims{0, 3});

  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "f16", 0, f16.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_param_info(opt.get(), 42, &info));
  CHECK(same_dtype(info.grad_dtype, kFloat16));
  CHECK(info.master == SA_MASTER_FP32);  // AUTO on float16
}

TEST_CASE("find_param returns the index a name was registered under", "[params]") {
  std::vector<HostTensor> shards;
  for (int k = 0; k < 5; ++k) shards.emplace_back(Dims{2}, kFloat32);
  auto opt = optimizer_with_group(SA_GROUP_CONFIG_INIT);
  const char* names[5] = {"embed", "layers.0.attn.q", "layers.0.attn.k", "layers.10.mlp", "head"};
  for (int k = 0; k < 5; ++k)
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), names[k], 0, shards[k].versioned(),
                                                    nullptr, nullptr, nullptr));
  CHECK(sa_optimizer_num_params(opt.get()) == 5);
  for (int k = 4; k >= 0; --k) {
    int64_t found = -1;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_find_param(opt.get(), names[k], &found));
    CHECK(found == k);
  }
  int64_t found = -1;
  CHECK(sa_optimizer_find_param(opt.get(), "layers.0.attn", &found) ==
        SA_ERR_INVALID_ARGUMENT);  // no prefix match
  CHECK(found == -1);
}

TEST_CASE("find_param and the duplicate-name check hold as the name index grows", "[params]") {
  // 3,000 names: the index (src/name_index.hpp) grows from 64 slots to 8,192 on the way,
  // its probes cross runs of other names; every name is refused again at every size.
  constexpr int kParams = 3000;
  std::vector<HostTensor> shards;
  shards.reserve(kParams + 1);
  for (int k = 0; k <= kParams; ++k) shards.emplace_back(Dims{1}, kFloat32);
  auto opt = optimizer_with_group(SA_GROUP_CONFIG_INIT);
  auto name = [](int k) { return "layers." + std::to_string(k % 97) + ".w" + std::to_string(k); };
  for (int k = 0; k < kParams; ++k) {
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), name(k).c_str(), 0,
                                                    shards[k].versioned(), nullptr, nullptr,
                                                    nullptr));
    if (k % 500 == 499) {  // every name so far is taken, and nothing is added by the refusal
      for (int j = 0; j <= k; j += 37)
        CHECK(sa_optimizer_add_param(opt.get(), name(j).c_str(), 0, shards[kParams].versioned(),
                                     nullptr, nullptr, nullptr) == SA_ERR_INVALID_ARGUMENT);
      CHECK(sa_optimizer_num_params(opt.get()) == k + 1);
    }
  }
  for (int k = kParams - 1; k >= 0; --k) {
    int64_t found = -1;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_find_param(opt.get(), name(k).c_str(), &found));
    REQUIRE(found == k);
  }
  for (const char* missing : {"layers.0.w", "layers.1.w3000", "layers.0.w00", ""}) {
    int64_t found = -1;
    CHECK(sa_optimizer_find_param(opt.get(), missing, &found) == SA_ERR_INVALID_ARGUMENT);
  }
}

// ---- groups and step counts --------------------------------------------------------------------

TEST_CASE(
    "groups are positional, and get_group returns exactly what add_group and set_group stored",
    "[groups]") {
  auto opt = make_optimizer();
  CHECK(sa_optimizer_num_groups(opt.get()) == 0);
  sa_group_config a = SA_GROUP_CONFIG_INIT;
  sa_group_config b = {sizeof(sa_group_config), 0.125, 0.5, 0.75, 1e-3, 0.25, 0, 0, 1, 1,
                       SA_RULE_ADAMW, 0, 0.5, 1.0, -2.0, 3.0, 7, SA_MUON_LR_MATCH_RMS_ADAMW};
  int32_t ia = -1, ib = -1;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &a, &ia));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &b, &ib));
  CHECK(ia == 0);
  CHECK(ib == 1);
  CHECK(sa_optimizer_num_groups(opt.get()) == 2);

  auto same = [](const sa_group_config& x, const sa_group_config& y) {
    return x.lr == y.lr && x.beta1 == y.beta1 && x.beta2 == y.beta2 && x.eps == y.eps &&
           x.weight_decay == y.weight_decay &&
           x.decoupled_weight_decay == y.decoupled_weight_decay &&
           x.bias_correction == y.bias_correction && x.maximize == y.maximize &&
           x.amsgrad == y.amsgrad;
  };
  sa_group_config got = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_get_group(opt.get(), 1, &got));
  CHECK(same(got, b));
  CHECK(got.struct_size == sizeof(sa_group_config));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_get_group(opt.get(), 0, &got));
  CHECK(same(got, a));
  // The SA_GROUP_CONFIG_INIT defaults are torch.optim.AdamW's.
  CHECK(got.lr == 1e-3);
  CHECK(got.beta1 == 0.9);
  CHECK(got.beta2 == 0.999);
  CHECK(got.eps == 1e-8);
  CHECK(got.weight_decay == 1e-2);
  CHECK(got.decoupled_weight_decay == 1);
  CHECK(got.bias_correction == 1);
  CHECK(got.maximize == 0);
  CHECK(got.amsgrad == 0);

  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_group(opt.get(), 0, &b));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_get_group(opt.get(), 0, &got));
  CHECK(same(got, b));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_lr(opt.get(), 1, 0.0));  // lr 0 is allowed
  REQUIRE_SA_OK(opt.get(), sa_optimizer_get_group(opt.get(), 1, &got));
  CHECK(got.lr == 0.0);
  CHECK(got.beta1 == 0.5);  // the rest untouched
}

TEST_CASE("a group's step count counts steps taken, and set_step replaces it", "[groups]") {
  const sa_group_config defaults = SA_GROUP_CONFIG_INIT;
  auto opt = optimizer_with_group(defaults);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &defaults, nullptr));
  CHECK(step_count(opt.get(), 0) == 0);
  REQUIRE_SA_OK(opt.get(),
                sa_optimizer_step(opt.get(), nullptr, nullptr));  // no params: still a step
  CHECK(step_count(opt.get(), 0) == 1);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_step(opt.get(), 1, 41));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  CHECK(step_count(opt.get(), 0) == 2);
  CHECK(step_count(opt.get(), 1) == 42);
  // A found_inf step is not counted, with or without params.
  const float found_inf = 1.0f;
  int32_t skipped = -1;
  sa_step_args args = SA_STEP_ARGS_INIT;
  args.found_inf = &found_inf;
  args.skipped = &skipped;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), &args, nullptr));
  CHECK(skipped == 1);
  CHECK(step_count(opt.get(), 0) == 2);
  CHECK(step_count(opt.get(), 1) == 42);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_step(opt.get(), 0, 0));
  CHECK(step_count(opt.get(), 0) == 0);
}

TEST_CASE("a param added after some steps starts at step 0, as a fresh torch param does (bias correction included)",
          "[groups]") {
  const sa_group_config config = group_config(1e-2, 1e-2, 1);
  HostTensor first({20}, kFloat32), late({20}, kFloat32), grad({20}, kFloat32);
  auto opt = optimizer_with_group(config);
  Rng rng(6);
  fill_normal(first, rng, 1.0);
  fill_normal(late, rng, 1.0);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "first", 0, first.versioned(), nullptr,
                                                  nullptr, nullptr));
  const DLTensor g = grad.dl();
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
  for (int t = 0; t < 3; ++t) {
    fill_normal(grad, rng, 0.1);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  }
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "late", 0, late.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 1, &g));
  fill_normal(grad, rng, 0.1);
  RefState ref_late(values_of(late), Storage::f32);
  RefState ref_first = library_state(opt.get(), 0, first);
  RefScales scales;
  reference_step(ref_late, config, 1, values_of(grad), 1.0, RefBug::none,
                 &scales);  // its own first step: t = 1
  reference_step(ref_first, config, 4, values_of(grad), 1.0);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  check_value(late, ref_late.value, scales.step_size);
  check_value(first, ref_first.value, scales.step_size);
  CHECK(step_count(opt.get(), 0) == 4);
  int64_t steps[2] = {-1, -1};
  REQUIRE_SA_OK(opt.get(), sa_optimizer_get_param_steps(opt.get(), 0, 2, steps));
  CHECK(steps[0] == 4);
  CHECK(steps[1] == 1);
}

// ---- grads -------------------------------------------------------------------------------------

TEST_CASE("set_grad reads the grad at data + byte_offset", "[grads]") {
  const sa_group_config config = group_config(1e-2, 0.0, 1);
  HostTensor w({16}, kFloat32);
  HostTensor buffer({16 + 8}, kFloat32);  // [8 decoy floats | the grad]
  auto opt = optimizer_with_group(config);
  Rng rng(7);
  fill_normal(w, rng, 1.0);
  for (int64_t i = 0; i < 8; ++i) buffer.set(i, 1000.0f);
  for (int64_t i = 8; i < 24; ++i)
    buffer.set(i, static_cast<float>(rng.signed_log_uniform(1e-3, 1.0)));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), nullptr,
                                                  nullptr, nullptr));
  DLTensor g = buffer.dl();
  const int64_t shape[1] = {16};
  g.shape = const_cast<int64_t*>(shape);
  g.byte_offset = 8 * sizeof(float);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
  std::vector<double> grad(16);
  for (int64_t i = 0; i < 16; ++i) grad[i] = buffer.get(8 + i);
  RefState ref(values_of(w), Storage::f32);
  RefScales scales;
  reference_step(ref, config, 1, grad, 1.0, RefBug::none, &scales);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  check_value(w, ref.value, scales.step_size);
}

TEST_CASE("empty params need no grad, by set_grad or set_grad_ptrs", "[grads]") {
  HostTensor empty({0}, kFloat32), empty2({4, 0}, kBfloat16), full({3}, kFloat32),
      grad({3}, kFloat32);
  auto opt = optimizer_with_group(group_config(1e-2, 1e-2, 1));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "empty", 0, empty.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "empty2", 0, empty2.versioned(),
                                                  nullptr, nullptr, nullptr));
  SECTION("only empty params: a step needs no grad at all") {
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
    CHECK(step_count(opt.get(), 0) == 1);
  }
  SECTION("set_grad on the non-empty param only") {
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "full", 0, full.versioned(), nullptr,
                                                    nullptr, nullptr));
    const DLTensor g = grad.dl();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 2, &g));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  }
  SECTION("set_grad_ptrs with NULL for the empty params") {
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "full", 0, full.versioned(), nullptr,
                                                    nullptr, nullptr));
    const void* ptrs[3] = {nullptr, nullptr, grad.data()};
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad_ptrs(opt.get(), 3, ptrs));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  }
  SECTION("an empty grad tensor with a NULL data pointer binds to an empty param") {
    HostTensor empty_grad({0}, kFloat32);
    DLTensor g = empty_grad.dl();
    g.data = nullptr;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  }
}

TEST_CASE("grads rebound between steps are honoured: two buffers used alternately", "[grads]") {
  const sa_group_config config = group_config(1e-2, 1e-2, 1);
  HostTensor w({64}, kFloat32), v({64}, kBfloat16);
  HostTensor wa({64}, kFloat32), wb({64}, kFloat32), va({64}, kBfloat16), vb({64}, kBfloat16);
  auto opt = optimizer_with_group(config);
  Rng rng(8);
  fill_normal(w, rng, 1.0);
  fill_normal(v, rng, 1.0);
  // The two buffers point in opposite directions, so using the wrong one shows at once.
  fill_log_uniform(wa, rng, 1e-2, 1.0);
  fill_log_uniform(va, rng, 1e-2, 1.0);
  for (int64_t i = 0; i < 64; ++i) {
    wb.set(i, -2.0f * wa.get(i));
    vb.set(i, -2.0f * va.get(i));
  }
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "v", 0, v.versioned(), nullptr,
                                                  nullptr, nullptr));
  RefState ref_w(values_of(w), Storage::f32);
  RefState ref_v(values_of(v), Storage::f32);  // v's fp32 master
  const StateView master = state_view(opt.get(), 1, "master");
  double step_size_sum = 0.0;
  for (int t = 1; t <= 12; ++t) {
    const bool use_a = t % 2 == 1;
    const HostTensor& gw = use_a ? wa : wb;
    const HostTensor& gv = use_a ? va : vb;
    if (t % 4 < 2) {  // by pointer...
      const void* ptrs[2] = {gw.data(), gv.data()};
      REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad_ptrs(opt.get(), 2, ptrs));
    } else {  // ...or by DLTensor
      const DLTensor dw = gw.dl(), dv = gv.dl();
      REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &dw));
      REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 1, &dv));
    }
    RefScales scales;
    reference_step(ref_w, config, t, values_of(gw), 1.0, RefBug::none, &scales);
    reference_step(ref_v, config, t, values_of(gv), 1.0);
    step_size_sum += scales.step_size;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
    INFO("step " << t);
    Worst worst_w("w"), worst_v("v's master");
    for (int64_t i = 0; i < 64; ++i) {
      worst_w.add(i, w.get(i), ref_w.value[i],
                  t * 2.0 * f32_ulp(ref_w.value[i]) + 1e-4 * step_size_sum);
      worst_v.add(i, master.get(i), ref_v.value[i],
                  t * 2.0 * f32_ulp(ref_v.value[i]) + 1e-4 * step_size_sum);
    }
    CHECK_WITHIN(worst_w);
    CHECK_WITHIN(worst_v);
  }
}

// ---- version, build, status ---------------------------------------------------------------------

TEST_CASE(
    "sa_version() is the header's SA_VERSION_NUMBER and sa_build_info names the version and the "
    "cpu backend",
    "[version]") {
  CHECK(sa_version() == SA_VERSION_NUMBER);
  CHECK(SA_VERSION_NUMBER == SA_VERSION_MAJOR * 10000 + SA_VERSION_MINOR * 100 + SA_VERSION_PATCH);
  const std::string info = sa_build_info();
  const std::string version = std::to_string(SA_VERSION_MAJOR) + "." +
                              std::to_string(SA_VERSION_MINOR) + "." +
                              std::to_string(SA_VERSION_PATCH);
  CHECK_THAT(info,
             Catch::Contains("shardadam") && Catch::Contains(version) && Catch::Contains("cpu"));
  CHECK(sa_build_info() == sa_build_info());  // static: the same pointer every time
}

TEST_CASE("sa_status_string names every status, and unknown values", "[version]") {
  const std::vector<std::pair<sa_status, const char*>> names = {
      {SA_OK, "SA_OK"},
      {SA_ERR_INVALID_ARGUMENT, "SA_ERR_INVALID_ARGUMENT"},
      {SA_ERR_UNSUPPORTED, "SA_ERR_UNSUPPORTED"},
      {SA_ERR_OUT_OF_MEMORY, "SA_ERR_OUT_OF_MEMORY"},
      {SA_ERR_DEVICE, "SA_ERR_DEVICE"},
      {SA_ERR_COMM, "SA_ERR_COMM"},
      {SA_ERR_IO, "SA_ERR_IO"},
      {SA_ERR_FORMAT, "SA_ERR_FORMAT"},
      {SA_ERR_MISMATCH, "SA_ERR_MISMATCH"},
      {SA_ERR_STATE, "SA_ERR_STATE"},
      {SA_ERR_INTERNAL, "SA_ERR_INTERNAL"},
  };
  for (const auto& [status, name] : names) CHECK(std::string(sa_status_string(status)) == name);
  CHECK(std::string(sa_status_string(static_cast<sa_status>(11))) == "unknown sa_status");
  CHECK(std::string(sa_status_string(static_cast<sa_status>(-1))) == "unknown sa_status");
}

TEST_CASE("a handle's last error is empty until a call fails, and is kept per handle",
          "[version]") {
  auto a = make_optimizer();
  auto b = make_optimizer();
  CHECK(std::string(sa_optimizer_last_error(a.get())).empty());
  int64_t step = 0;
  CHECK(sa_optimizer_get_step(a.get(), 3, &step) == SA_ERR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(sa_optimizer_last_error(a.get())), Catch::Contains("group 3"));
  CHECK(std::string(sa_optimizer_last_error(b.get())).empty());  // b is not touched
  CHECK(sa_optimizer_get_step(b.get(), 7, &step) == SA_ERR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(sa_optimizer_last_error(a.get())), Catch::Contains("group 3"));
  CHECK_THAT(std::string(sa_optimizer_last_error(b.get())), Catch::Contains("group 7"));
}
