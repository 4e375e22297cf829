// tests/test_optimizer_errors.cpp — bad input never crashes and never half-applies: every
// bad call returns a specific status, its message names the offending thing (param name,
// what was expected, what arrived), and the optimizer is left exactly as it was (params,
// groups, states, params' data, grad bindings). A shard handed to a failing add_param
// stays the caller's: its deleter is not called.
#include <cstddef>
#include <tuple>

#include "test_support.hpp"

namespace {

using namespace sa_test;

// Everything observable about an optimizer through the C ABI, plus the params' data.
struct Snapshot {
  int32_t num_groups = 0;
  int64_t num_params = 0;
  std::vector<std::tuple<double, double, double, double, double, int32_t, int32_t, int32_t, int32_t,
                         int64_t>>
      groups;
  std::vector<std::string> params;  // name, group, shapes, dtypes, master
  std::vector<std::vector<unsigned char>> states;
  std::vector<std::vector<unsigned char>> shards;
};

std::string dims_text(const int64_t* d, int32_t n) {
  std::string s = "[";
  for (int32_t i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

Snapshot snapshot(sa_optimizer* opt, std::initializer_list<const HostTensor*> shards) {
  Snapshot s;
  s.num_groups = sa_optimizer_num_groups(opt);
  s.num_params = sa_optimizer_num_params(opt);
  for (int32_t g = 0; g < s.num_groups; ++g) {
    sa_group_config c = SA_GROUP_CONFIG_INIT;
    REQUIRE_SA_OK(opt, sa_optimizer_get_group(opt, g, &c));
    s.groups.emplace_back(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.decoupled_weight_decay,
                          c.bias_correction, c.maximize, c.amsgrad, step_count(opt, g));
  }
  for (int64_t p = 0; p < s.num_params; ++p) {
    sa_param_info info = SA_PARAM_INFO_INIT;
    REQUIRE_SA_OK(opt, sa_optimizer_param_info(opt, p, &info));
    s.params.push_back(std::string(info.name) + " g" + std::to_string(info.group) + " " +
                       dims_text(info.local_shape, info.ndim) +
                       dims_text(info.global_shape, info.ndim) +
                       dims_text(info.global_offset, info.ndim) + " " +
                       dtype_label(info.param_dtype) + "/" + dtype_label(info.grad_dtype) + "/" +
                       dtype_label(info.moment_dtype) + " master " + std::to_string(info.master));
    sa_group_config c = SA_GROUP_CONFIG_INIT;
    REQUIRE_SA_OK(opt, sa_optimizer_get_group(opt, info.group, &c));
    std::vector<const char*> keys = {"exp_avg", "exp_avg_sq"};
    if (c.amsgrad) keys.push_back("max_exp_avg_sq");
    if (info.master == SA_MASTER_FP32) keys.push_back("master");
    if (info.master == SA_MASTER_REMAINDER) keys.push_back("remainder");
    for (const char* key : keys) s.states.push_back(state_view(opt, p, key).raw_bytes());
  }
  for (const HostTensor* t : shards) s.shards.push_back(t->raw_bytes());
  return s;
}

// "" when equal, else which part differs.
std::string difference(const Snapshot& a, const Snapshot& b) {
  if (a.num_groups != b.num_groups) return "number of groups";
  if (a.num_params != b.num_params) return "number of params";
  if (a.groups != b.groups) return "group configs or step counts";
  if (a.params != b.params) return "param info";
  if (a.states != b.states) return "optimizer state";
  if (a.shards != b.shards) return "params' data";
  return "";
}

// An optimizer that has taken one step, so its states are nonzero:
//   group 0: AdamW, lr 1e-2, weight decay 1e-2
//   param 0 "layers.0.w": float32 [4, 3]
//   param 1 "layers.0.b": bfloat16 [3] with an fp32 master
// with grads bound by sa_optimizer_set_grad. Members are declared before the optimizer,
// so the optimizer is destroyed first.
struct Trained {
  HostTensor w{{4, 3}, kFloat32};
  HostTensor b{{3}, kBfloat16};
  HostTensor grad_w{{4, 3}, kFloat32};
  HostTensor grad_b{{3}, kBfloat16};
  sa_group_config config = group_config(1e-2, 1e-2, 1);
  OptimizerPtr opt = make_optimizer();

  Trained() {
    Rng rng(11);
    fill_normal(w, rng, 1.0);
    fill_normal(b, rng, 1.0);
    fill_normal(grad_w, rng, 0.1);
    fill_normal(grad_b, rng, 0.1);
    REQUIRE_SA_OK(get(), sa_optimizer_add_group(get(), &config, nullptr));
    REQUIRE_SA_OK(get(), sa_optimizer_add_param(get(), "layers.0.w", 0, w.versioned(), nullptr,
                                                nullptr, nullptr));
    REQUIRE_SA_OK(get(), sa_optimizer_add_param(get(), "layers.0.b", 0, b.versioned(), nullptr,
                                                nullptr, nullptr));
    const DLTensor gw = grad_w.dl();
    const DLTensor gb = grad_b.dl();
    REQUIRE_SA_OK(get(), sa_optimizer_set_grad(get(), 0, &gw));
    REQUIRE_SA_OK(get(), sa_optimizer_set_grad(get(), 1, &gb));
    REQUIRE_SA_OK(get(), sa_optimizer_step(get(), nullptr, nullptr));
  }
  sa_optimizer* get() const { return opt.get(); }
  Snapshot snap() const { return snapshot(get(), {&w, &b}); }
};

// What one more step makes of a float32 param (no master, float32 moments) whose grad is
// `grad`, by the float64 reference started from the optimizer's current state.
std::vector<double> predicted_step(sa_optimizer* opt, int64_t param, const HostTensor& shard,
                                   const std::vector<double>& grad) {
  sa_param_info info = SA_PARAM_INFO_INIT;
  REQUIRE_SA_OK(opt, sa_optimizer_param_info(opt, param, &info));
  sa_group_config c = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt, sa_optimizer_get_group(opt, info.group, &c));
  REQUIRE(!c.amsgrad);
  std::vector<double> value(static_cast<std::size_t>(shard.numel()));
  for (int64_t i = 0; i < shard.numel(); ++i) value[i] = shard.get(i);
  RefState s(value, Storage::f32);
  const StateView m = state_view(opt, param, "exp_avg");
  const StateView v = state_view(opt, param, "exp_avg_sq");
  for (int64_t i = 0; i < shard.numel(); ++i) {
    s.m[i] = m.get(i);
    s.v[i] = v.get(i);
  }
  reference_step(s, c, step_count(opt, info.group) + 1, grad, 1.0);
  return s.value;
}

// One step from the same state: float32 rounding only.
void check_matches(const HostTensor& shard, const std::vector<double>& expected) {
  for (int64_t i = 0; i < shard.numel(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(shard.get(i) - expected[i]) <= 1e-6 * std::fabs(expected[i]) + 1e-9);
  }
}

}  // namespace

// ---- NULL pointers ---------------------------------------------------------------------------

TEST_CASE(
    "every entry point rejects a NULL optimizer with SA_ERR_INVALID_ARGUMENT and a thread-local "
    "message",
    "[errors]") {
  HostTensor t({2}, kFloat32);
  const DLTensor dl = t.dl();
  sa_group_config config = SA_GROUP_CONFIG_INIT;
  sa_param_info info = SA_PARAM_INFO_INIT;
  int64_t i64 = 0;
  int32_t i32 = 0;
  const void* ptrs[1] = {t.data()};
  DLManagedTensorVersioned* view = nullptr;

  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_add_group(nullptr, &config, &i32),
                 "sa_optimizer_add_group", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_get_group(nullptr, 0, &config),
                 "sa_optimizer_get_group", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_group(nullptr, 0, &config),
                 "sa_optimizer_set_group", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_lr(nullptr, 0, 0.1),
                 "sa_optimizer_set_lr", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_get_step(nullptr, 0, &i64),
                 "sa_optimizer_get_step", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_step(nullptr, 0, 1),
                 "sa_optimizer_set_step", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(nullptr, "w", 0, t.versioned(), nullptr, nullptr, &i64),
                 "sa_optimizer_add_param", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param_legacy(nullptr, "w", 0, t.legacy(), nullptr, nullptr, &i64),
                 "sa_optimizer_add_param_legacy", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_find_param(nullptr, "w", &i64),
                 "sa_optimizer_find_param", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_param_info(nullptr, 0, &info),
                 "sa_optimizer_param_info", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad(nullptr, 0, &dl),
                 "sa_optimizer_set_grad", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad_ptrs(nullptr, 1, ptrs),
                 "sa_optimizer_set_grad_ptrs", "opt is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step(nullptr, nullptr, nullptr),
                 "sa_optimizer_step", "opt is NULL");
  view = reinterpret_cast<DLManagedTensorVersioned*>(&t);  // must be reset to NULL
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_state_view(nullptr, 0, "exp_avg", &view), "sa_optimizer_state_view",
                 "opt is NULL");
  CHECK(view == nullptr);

  CHECK(sa_optimizer_num_groups(nullptr) == 0);
  CHECK(sa_optimizer_num_params(nullptr) == 0);
  CHECK(std::string(sa_optimizer_last_error(nullptr)) == sa_last_error());
  sa_optimizer_destroy(nullptr);  // a no-op
  CHECK(t.deleter_calls() == 0);
}

TEST_CASE("NULL arguments are rejected, named in the message, and change nothing", "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor extra({2}, kFloat32);
  int64_t i64 = 0;
  DLManagedTensorVersioned* view = nullptr;

  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_group(f.get(), nullptr, nullptr), "sa_optimizer_add_group",
                 "config is NULL");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_get_group(f.get(), 0, nullptr),
                 "out is NULL");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_group(f.get(), 0, nullptr),
                 "config is NULL");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_get_step(f.get(), 0, nullptr),
                 "step is NULL");
  CHECK_SA_FAILS(
      f.get(), SA_ERR_INVALID_ARGUMENT,
      sa_optimizer_add_param(f.get(), nullptr, 0, extra.versioned(), nullptr, nullptr, nullptr),
      "name is NULL or empty");
  CHECK_SA_FAILS(
      f.get(), SA_ERR_INVALID_ARGUMENT,
      sa_optimizer_add_param(f.get(), "", 0, extra.versioned(), nullptr, nullptr, nullptr),
      "name is NULL or empty");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(f.get(), "extra", 0, nullptr, nullptr, nullptr, nullptr),
                 "param 'extra'", "local_shard is NULL");
  CHECK_SA_FAILS(
      f.get(), SA_ERR_INVALID_ARGUMENT,
      sa_optimizer_add_param_legacy(f.get(), "extra", 0, nullptr, nullptr, nullptr, nullptr),
      "param 'extra'", "local_shard is NULL");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_find_param(f.get(), nullptr, &i64),
                 "name or param is NULL");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_find_param(f.get(), "layers.0.w", nullptr), "name or param is NULL");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_param_info(f.get(), 0, nullptr),
                 "out is NULL");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad(f.get(), 0, nullptr),
                 "grad is NULL");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad_ptrs(f.get(), 2, nullptr),
                 "ptrs is NULL");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_state_view(f.get(), 0, nullptr, &view), "key or out is NULL");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_state_view(f.get(), 0, "exp_avg", nullptr), "key or out is NULL");

  SECTION("a NULL data pointer or shape in a non-empty tensor") {
    DLManagedTensorVersioned* m = extra.versioned();
    m->dl_tensor.data = nullptr;
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                   sa_optimizer_add_param(f.get(), "extra", 0, m, nullptr, nullptr, nullptr),
                   "param 'extra': local shard", "data is NULL for a tensor of 2 elements");
    m = extra.versioned();
    m->dl_tensor.shape = nullptr;
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                   sa_optimizer_add_param(f.get(), "extra", 0, m, nullptr, nullptr, nullptr),
                   "param 'extra': local shard", "shape is NULL");
    DLTensor g = f.grad_w.dl();
    g.data = nullptr;
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad(f.get(), 0, &g),
                   "param 'layers.0.w': grad", "data is NULL");
    g = f.grad_w.dl();
    g.shape = nullptr;
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad(f.get(), 0, &g),
                   "param 'layers.0.w': grad", "shape is NULL");
  }
  SECTION("a NULL layout array") {
    sa_layout layout = SA_LAYOUT_INIT;
    layout.ndim = 1;
    CHECK_SA_FAILS(
        f.get(), SA_ERR_INVALID_ARGUMENT,
        sa_optimizer_add_param(f.get(), "extra", 0, extra.versioned(), &layout, nullptr, nullptr),
        "param 'extra'", "global_shape is NULL");
  }
  CHECK(difference(before, f.snap()) == "");
  CHECK(extra.deleter_calls() == 0);
}

TEST_CASE("sa_optimizer_create rejects bad configs, sets *out to NULL and says why", "[errors]") {
  sa_optimizer* opt = reinterpret_cast<sa_optimizer*>(&opt);  // garbage that must be cleared
  sa_optimizer_config config = SA_OPTIMIZER_CONFIG_INIT;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_create(&config, nullptr),
                 "sa_optimizer_create", "out is NULL");
  config.num_threads = -1;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_create(&config, &opt),
                 "num_threads is -1");
  CHECK(opt == nullptr);
  config = SA_OPTIMIZER_CONFIG_INIT;
  config.cpu_simd = 2;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_create(&config, &opt),
                 "cpu_simd is 2");
  config = SA_OPTIMIZER_CONFIG_INIT;
  config.struct_size = 0;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_create(&config, &opt), "config",
                 "struct_size 0 is too small", "SA_*_INIT");
  config.struct_size = sizeof(sa_optimizer_config) + 16;
  CHECK_SA_FAILS(nullptr, SA_ERR_UNSUPPORTED, sa_optimizer_create(&config, &opt), "config",
                 "is larger than this library's", "newer shardadam.h");
  CHECK(opt == nullptr);
  // NULL config means the defaults.
  REQUIRE_SA_OK(nullptr, sa_optimizer_create(nullptr, &opt));
  CHECK(opt != nullptr);
  sa_optimizer_destroy(opt);
}

// ---- dtypes, devices, memory layout of shards --------------------------------------------------

TEST_CASE("a param of an unsupported dtype is SA_ERR_UNSUPPORTED naming the dtype", "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor f64({3}, kFloat64);
  HostTensor i32({3}, kInt32);
  CHECK_SA_FAILS(
      f.get(), SA_ERR_UNSUPPORTED,
      sa_optimizer_add_param(f.get(), "layers.1.w", 0, f64.versioned(), nullptr, nullptr, nullptr),
      "param 'layers.1.w'", "param dtype float64 is not supported", "float32, bfloat16, float16, float8_e4m3fn or float8_e5m2");
  CHECK_SA_FAILS(
      f.get(), SA_ERR_UNSUPPORTED,
      sa_optimizer_add_param(f.get(), "layers.1.w", 0, i32.versioned(), nullptr, nullptr, nullptr),
      "param 'layers.1.w'", "param dtype int32");
  HostTensor vec({3}, kFloat32);
  DLManagedTensorVersioned* m = vec.versioned();
  m->dl_tensor.dtype.lanes = 4;
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED,
                 sa_optimizer_add_param(f.get(), "layers.1.w", 0, m, nullptr, nullptr, nullptr),
                 "param 'layers.1.w'", "float32x4", "lanes");
  CHECK(difference(before, f.snap()) == "");
  f.opt.reset();
  CHECK(f64.deleter_calls() == 0);
  CHECK(i32.deleter_calls() == 0);
  CHECK(vec.deleter_calls() == 0);
}

TEST_CASE("storage options that do not fit the param are rejected with what to use instead",
          "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor f32({5}, kFloat32);
  HostTensor bf16({5}, kBfloat16);
  HostTensor f16({5}, kFloat16);
  auto add = [&](HostTensor& t, const sa_param_options& o) {
    return sa_optimizer_add_param(f.get(), "new", 0, t.versioned(), nullptr, &o, nullptr);
  };
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED,
                 add(f32, param_options(kFloat64, kDefaultDtype, SA_MASTER_AUTO)), "param 'new'",
                 "options.grad_dtype is float64; it must be unset or float32, bfloat16 or float16");
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED,
                 add(f32, param_options(kDefaultDtype, kFloat16, SA_MASTER_AUTO)), "param 'new'",
                 "options.moment_dtype is float16; it must be unset or float32, bfloat16, uint8 or float8_e4m3fn");
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED,
                 add(bf16, param_options(kDefaultDtype, kDefaultDtype, SA_MASTER_NONE)),
                 "param 'new'", "SA_MASTER_NONE needs a float32 param, not bfloat16");
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED,
                 add(f32, param_options(kDefaultDtype, kDefaultDtype, SA_MASTER_FP32)),
                 "param 'new'", "SA_MASTER_FP32 needs a bfloat16, float16, float8_e4m3fn or float8_e5m2 param, not float32");
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED,
                 add(f16, param_options(kDefaultDtype, kDefaultDtype, SA_MASTER_REMAINDER)),
                 "param 'new'", "SA_MASTER_REMAINDER needs a bfloat16 param, not float16");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 add(f32, param_options(kDefaultDtype, kDefaultDtype, 9)), "param 'new'",
                 "master is 9");
  CHECK(difference(before, f.snap()) == "");
}

TEST_CASE("a grad whose dtype is not the registered grad dtype is SA_ERR_MISMATCH naming both",
          "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor bf16_grad({4, 3}, kBfloat16);
  const DLTensor g = bf16_grad.dl();
  CHECK_SA_FAILS(f.get(), SA_ERR_MISMATCH, sa_optimizer_set_grad(f.get(), 0, &g),
                 "sa_optimizer_set_grad: param 'layers.0.w': grad dtype bfloat16 does not match "
                 "registered grad dtype float32");
  HostTensor f32_grad({3}, kFloat32);
  const DLTensor g2 = f32_grad.dl();
  CHECK_SA_FAILS(
      f.get(), SA_ERR_MISMATCH, sa_optimizer_set_grad(f.get(), 1, &g2),
      "param 'layers.0.b': grad dtype float32 does not match registered grad dtype bfloat16");
  CHECK(difference(before, f.snap()) == "");
}

TEST_CASE(
    "a rejected grad leaves the previous binding in place: wrong dtype, shape, device, strides, "
    "alignment",
    "[errors]") {
  // Every rejected grad points at decoy data far from the bound grad, so a step that used
  // any of them would show.
  HostTensor decoy({4, 3}, kFloat32), decoy_bf16({4, 3}, kBfloat16),
      decoy_transposed({3, 4}, kFloat32);
  HostTensor misaligned({4, 3}, kFloat32, 2);  // data 2 bytes past an aligned address
  Rng rng(5);
  for (HostTensor* t : {&decoy, &decoy_bf16, &decoy_transposed, &misaligned})
    fill_normal(*t, rng, 50.0);
  Trained f;
  const Snapshot before = f.snap();

  DLTensor g = decoy_bf16.dl();
  CHECK_SA_FAILS(
      f.get(), SA_ERR_MISMATCH, sa_optimizer_set_grad(f.get(), 0, &g),
      "param 'layers.0.w': grad dtype bfloat16 does not match registered grad dtype float32");
  g = decoy_transposed.dl();
  CHECK_SA_FAILS(f.get(), SA_ERR_MISMATCH, sa_optimizer_set_grad(f.get(), 0, &g),
                 "param 'layers.0.w': grad shape [3, 4] does not match the local shape [4, 3]");
  g = decoy.dl();
  g.ndim = 1;
  CHECK_SA_FAILS(f.get(), SA_ERR_MISMATCH, sa_optimizer_set_grad(f.get(), 0, &g),
                 "param 'layers.0.w': grad shape [4] does not match the local shape [4, 3]");
  g = decoy.dl();
  g.device = DLDevice{kDLCUDA, 0};
  CHECK_SA_FAILS(f.get(), SA_ERR_MISMATCH, sa_optimizer_set_grad(f.get(), 0, &g),
                 "param 'layers.0.w': grad is on cuda:0 but the param is on cpu");
  const int64_t column_major[2] = {1, 4};
  g = decoy.dl();
  g.strides = const_cast<int64_t*>(column_major);
  CHECK_SA_FAILS(f.get(), SA_ERR_MISMATCH, sa_optimizer_set_grad(f.get(), 0, &g),
                 "param 'layers.0.w': grad", "strides [1, 4]", "C-contiguous");
  g = misaligned.dl();
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad(f.get(), 0, &g),
                 "param 'layers.0.w': grad", "not aligned to the element size of 4 bytes");
  g = decoy.dl();
  g.byte_offset = 1;
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad(f.get(), 0, &g),
                 "param 'layers.0.w': grad", "not aligned");
  g = decoy.dl();
  g.ndim = -1;
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad(f.get(), 0, &g),
                 "param 'layers.0.w': grad", "ndim -1");
  CHECK(difference(before, f.snap()) == "");

  // Param 1 is rebound validly (to its same grad), then the next step still uses the
  // grad bound to param 0 before the failures.
  const DLTensor gb = f.grad_b.dl();
  REQUIRE_SA_OK(f.get(), sa_optimizer_set_grad(f.get(), 1, &gb));
  const std::vector<double> expected = predicted_step(f.get(), 0, f.w, values_of(f.grad_w));
  REQUIRE_SA_OK(f.get(), sa_optimizer_step(f.get(), nullptr, nullptr));
  check_matches(f.w, expected);
}

TEST_CASE("a shard on a device this build cannot serve is SA_ERR_UNSUPPORTED", "[errors]") {
  auto opt = make_optimizer();
  const sa_group_config config = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
  HostTensor t({4}, kFloat32);
  // A library that found its CUDA module serves CUDA shards (tests/gpu covers them there).
  if (std::string(sa_build_info()).find("cuda: module ") == std::string::npos) {
    t.set_device(DLDevice{kDLCUDA, 0});
    CHECK_SA_FAILS(
        opt.get(), SA_ERR_UNSUPPORTED,
        sa_optimizer_add_param(opt.get(), "w", 0, t.versioned(), nullptr, nullptr, nullptr),
        "param 'w'", "cuda:0", "CUDA");
  }
  t.set_device(DLDevice{kDLMetal, 0});
  CHECK_SA_FAILS(
      opt.get(), SA_ERR_UNSUPPORTED,
      sa_optimizer_add_param(opt.get(), "w", 0, t.versioned(), nullptr, nullptr, nullptr),
      "param 'w'", "metal:0");
  CHECK(sa_optimizer_num_params(opt.get()) == 0);
  opt.reset();
  CHECK(t.deleter_calls() == 0);
}

TEST_CASE("one optimizer serves one device: a shard on another device is SA_ERR_MISMATCH",
          "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor t({4}, kFloat32);
  t.set_device(DLDevice{kDLCUDA, 1});
  CHECK_SA_FAILS(
      f.get(), SA_ERR_MISMATCH,
      sa_optimizer_add_param(f.get(), "gpu.w", 0, t.versioned(), nullptr, nullptr, nullptr),
      "param 'gpu.w'", "cuda:1", "cpu", "one device");
  CHECK(difference(before, f.snap()) == "");
  f.opt.reset();
  CHECK(t.deleter_calls() == 0);
}

TEST_CASE("a non-contiguous shard is rejected, any stride on a dim of size 1 or 0 is fine",
          "[errors]") {
  HostTensor t({4, 3}, kFloat32), column({4, 1}, kFloat32), empty({0, 5}, kFloat32);
  Trained f;  // after the shards it takes: destroyed first
  const Snapshot before = f.snap();
  t.set_strides({1, 4});
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(f.get(), "t", 0, t.versioned(), nullptr, nullptr, nullptr),
                 "param 't': local shard", "shape [4, 3]", "strides [1, 4]", "C-contiguous");
  t.set_strides({6, 2});  // every other column
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(f.get(), "t", 0, t.versioned(), nullptr, nullptr, nullptr),
                 "strides [6, 2]");
  CHECK(difference(before, f.snap()) == "");

  t.set_strides({3, 1});  // explicit row-major strides
  REQUIRE_SA_OK(f.get(),
                sa_optimizer_add_param(f.get(), "t", 0, t.versioned(), nullptr, nullptr, nullptr));
  column.set_strides({1, 99});
  REQUIRE_SA_OK(f.get(), sa_optimizer_add_param(f.get(), "column", 0, column.versioned(), nullptr,
                                                nullptr, nullptr));
  empty.set_strides({7, 3});
  REQUIRE_SA_OK(f.get(), sa_optimizer_add_param(f.get(), "empty", 0, empty.versioned(), nullptr,
                                                nullptr, nullptr));
  CHECK(sa_optimizer_num_params(f.get()) == 5);
}

TEST_CASE("a shard whose data is not aligned to its element size is rejected", "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor f32({5}, kFloat32, 2);
  CHECK_SA_FAILS(
      f.get(), SA_ERR_INVALID_ARGUMENT,
      sa_optimizer_add_param(f.get(), "m", 0, f32.versioned(), nullptr, nullptr, nullptr),
      "param 'm': local shard", "not aligned to the element size of 4 bytes");
  HostTensor bf16({5}, kBfloat16, 1);
  CHECK_SA_FAILS(
      f.get(), SA_ERR_INVALID_ARGUMENT,
      sa_optimizer_add_param(f.get(), "m", 0, bf16.versioned(), nullptr, nullptr, nullptr),
      "param 'm': local shard", "element size of 2 bytes");
  HostTensor aligned({5}, kFloat32);
  DLManagedTensorVersioned* m = aligned.versioned();
  m->dl_tensor.byte_offset = 6;
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(f.get(), "m", 0, m, nullptr, nullptr, nullptr),
                 "param 'm': local shard", "not aligned");
  CHECK(difference(before, f.snap()) == "");
}

TEST_CASE("a shard whose rank or shape disagrees with its layout is SA_ERR_MISMATCH", "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor t({4, 3}, kFloat32);
  const MeshLayout one_dim{{8}, {2}, {0}, {shard(0)}};
  const sa_layout l1 = one_dim.get();
  CHECK_SA_FAILS(f.get(), SA_ERR_MISMATCH,
                 sa_optimizer_add_param(f.get(), "t", 0, t.versioned(), &l1, nullptr, nullptr),
                 "param 't'", "layout.ndim is 1 but the local shard has 2 dims");
  const MeshLayout rows{{9, 3}, {2}, {1}, {shard(0)}};  // rank 1 of 9 rows over 2: 4 rows at 5
  const sa_layout l2 = rows.get();
  HostTensor five({5, 3}, kFloat32);
  CHECK_SA_FAILS(f.get(), SA_ERR_MISMATCH,
                 sa_optimizer_add_param(f.get(), "t", 0, five.versioned(), &l2, nullptr, nullptr),
                 "param 't'", "the local shard has shape [5, 3]",
                 "local shape [4, 3] at offset [5, 0]");
  CHECK(difference(before, f.snap()) == "");
  f.opt.reset();
  CHECK(t.deleter_calls() == 0);
  CHECK(five.deleter_calls() == 0);
}

TEST_CASE("a duplicate param name is rejected and the registered param keeps its data and state",
          "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor again({4, 3}, kFloat32);
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(f.get(), "layers.0.w", 0, again.versioned(), nullptr,
                                        nullptr, nullptr),
                 "param 'layers.0.w'", "already registered (index 0)");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param_legacy(f.get(), "layers.0.b", 0, again.legacy(), nullptr,
                                               nullptr, nullptr),
                 "param 'layers.0.b'", "already registered (index 1)");
  CHECK(difference(before, f.snap()) == "");
  f.opt.reset();
  CHECK(again.deleter_calls() == 0);
}

TEST_CASE("a Partial placement is rejected for a param", "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor t({4}, kFloat32);
  const MeshLayout partial_mesh{{8}, {2, 2}, {0, 1}, {shard(0), partial()}};
  const sa_layout layout = partial_mesh.get();
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(f.get(), "p", 0, t.versioned(), &layout, nullptr, nullptr),
                 "param 'p'", "placements[1] is Partial");
  CHECK(difference(before, f.snap()) == "");
}

TEST_CASE("a read-only tensor, or one of another DLPack major version, is not taken", "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor t({4}, kFloat32);
  DLManagedTensorVersioned* m = t.versioned();
  m->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(f.get(), "ro", 0, m, nullptr, nullptr, nullptr),
                 "param 'ro'", "read-only");
  m = t.versioned();
  m->version.major = DLPACK_MAJOR_VERSION + 1;
  const std::string newer = "a DLPack " + std::to_string(DLPACK_MAJOR_VERSION + 1) + ".";
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED,
                 sa_optimizer_add_param(f.get(), "ro", 0, m, nullptr, nullptr, nullptr),
                 "param 'ro'", newer.c_str());
  CHECK(difference(before, f.snap()) == "");
  f.opt.reset();
  CHECK(t.deleter_calls() == 0);
}

// ---- hyperparameters -------------------------------------------------------------------------

TEST_CASE("bad hyperparameters are rejected by add_group, set_group and set_lr, naming the field",
          "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  const double nan = std::nan("");
  const double inf = HUGE_VAL;
  struct Bad {
    const char* what;
    void (*apply)(sa_group_config&, double, double);
    const char* message;
  };
  const std::vector<Bad> cases = {
      {"negative lr", [](sa_group_config& c, double, double) { c.lr = -0.1; },
       "lr is -0.1; it must be finite and >= 0"},
      {"NaN lr", [](sa_group_config& c, double n, double) { c.lr = n; }, "lr is nan"},
      {"infinite lr", [](sa_group_config& c, double, double i) { c.lr = i; }, "lr is inf"},
      {"beta1 = 1", [](sa_group_config& c, double, double) { c.beta1 = 1.0; },
       "beta1 is 1; it must be in [0, 1)"},
      {"negative beta1", [](sa_group_config& c, double, double) { c.beta1 = -0.5; },
       "beta1 is -0.5"},
      {"NaN beta1", [](sa_group_config& c, double n, double) { c.beta1 = n; }, "beta1 is nan"},
      {"beta2 > 1", [](sa_group_config& c, double, double) { c.beta2 = 1.5; }, "beta2 is 1.5"},
      {"NaN beta2", [](sa_group_config& c, double n, double) { c.beta2 = n; }, "beta2 is nan"},
      {"negative eps", [](sa_group_config& c, double, double) { c.eps = -1e-8; }, "eps is -1e-08"},
      {"NaN eps", [](sa_group_config& c, double n, double) { c.eps = n; }, "eps is nan"},
      {"negative weight decay", [](sa_group_config& c, double, double) { c.weight_decay = -0.01; },
       "weight_decay is -0.01"},
      {"infinite weight decay", [](sa_group_config& c, double, double i) { c.weight_decay = i; },
       "weight_decay is inf"},
      {"decoupled flag 2", [](sa_group_config& c, double, double) { c.decoupled_weight_decay = 2; },
       "decoupled_weight_decay is 2; it must be 0 or 1"},
      {"bias_correction flag -1",
       [](sa_group_config& c, double, double) { c.bias_correction = -1; }, "bias_correction is -1"},
      {"maximize flag 3", [](sa_group_config& c, double, double) { c.maximize = 3; },
       "maximize is 3"},
      {"amsgrad flag 2", [](sa_group_config& c, double, double) { c.amsgrad = 2; }, "amsgrad is 2"},
  };
  for (const Bad& bad : cases) {
    INFO(bad.what);
    sa_group_config c = f.config;
    c.lr = 0.5;  // a valid change that must not be applied along with the bad one
    bad.apply(c, nan, inf);
    int32_t index = 77;
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_add_group(f.get(), &c, &index),
                   "sa_optimizer_add_group", "group 1", bad.message);
    CHECK(index == 77);
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_group(f.get(), 0, &c),
                   "sa_optimizer_set_group", "group 0", bad.message);
  }
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_lr(f.get(), 0, -1.0),
                 "sa_optimizer_set_lr", "group 0", "lr is -1");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_lr(f.get(), 0, nan),
                 "lr is nan");
  CHECK(difference(before, f.snap()) == "");
}

TEST_CASE(
    "amsgrad cannot change once a group holds params (SA_ERR_STATE), an empty group may change it",
    "[errors]") {
  HostTensor t({3}, kFloat32);
  Trained f;
  const Snapshot before = f.snap();
  sa_group_config c = f.config;
  c.amsgrad = 1;
  c.lr = 0.25;  // must not be applied either
  CHECK_SA_FAILS(f.get(), SA_ERR_STATE, sa_optimizer_set_group(f.get(), 0, &c), "group 0",
                 "amsgrad cannot change once the group holds params (it holds 2)");
  CHECK(difference(before, f.snap()) == "");

  int32_t empty_group = -1;
  REQUIRE_SA_OK(f.get(), sa_optimizer_add_group(f.get(), &f.config, &empty_group));
  REQUIRE_SA_OK(f.get(), sa_optimizer_set_group(f.get(), empty_group, &c));
  sa_group_config got = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(f.get(), sa_optimizer_get_group(f.get(), empty_group, &got));
  CHECK(got.amsgrad == 1);
  CHECK(got.lr == 0.25);
  // Its params now get a max_exp_avg_sq state.
  REQUIRE_SA_OK(f.get(), sa_optimizer_add_param(f.get(), "ams", empty_group, t.versioned(), nullptr,
                                                nullptr, nullptr));
  DLManagedTensorVersioned* view = nullptr;
  REQUIRE_SA_OK(f.get(), sa_optimizer_state_view(f.get(), 2, "max_exp_avg_sq", &view));
  view->deleter(view);
}

// ---- steps and grad bindings --------------------------------------------------------------------

TEST_CASE("a step with a non-empty param lacking a grad is SA_ERR_STATE and updates nothing",
          "[errors]") {
  HostTensor a({6}, kFloat32), b({2, 2}, kFloat32), grad_a({6}, kFloat32);
  auto opt = make_optimizer();
  const sa_group_config config = group_config(1e-2, 1e-2, 1);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
  Rng rng(3);
  fill_normal(a, rng, 1.0);
  fill_normal(b, rng, 1.0);
  fill_normal(grad_a, rng, 1.0);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "a", 0, a.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "b", 0, b.versioned(), nullptr,
                                                  nullptr, nullptr));
  const Snapshot before = snapshot(opt.get(), {&a, &b});

  CHECK_SA_FAILS(opt.get(), SA_ERR_STATE, sa_optimizer_step(opt.get(), nullptr, nullptr),
                 "sa_optimizer_step", "param 'a' was never given a grad", "nothing was updated");
  const DLTensor g = grad_a.dl();
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
  // 'a' has its grad now, but 'b' does not: 'a' must not be updated either.
  int32_t skipped = 7;
  sa_step_args args = SA_STEP_ARGS_INIT;
  args.skipped = &skipped;
  CHECK_SA_FAILS(opt.get(), SA_ERR_STATE, sa_optimizer_step(opt.get(), &args, nullptr),
                 "param 'b' was never given a grad");
  CHECK(skipped == 7);
  CHECK(difference(before, snapshot(opt.get(), {&a, &b})) == "");
  CHECK(step_count(opt.get(), 0) == 0);
}

TEST_CASE(
    "set_grad_ptrs is all-or-nothing: after wrong n, NULL or misaligned pointers the previous "
    "bindings stay",
    "[errors]") {
  // param 0: float32 [5]; param 1: empty; param 2: float32 [4] with bfloat16 grads.
  HostTensor p0({5}, kFloat32), p1({0}, kFloat32), p2({4}, kFloat32);
  auto opt = make_optimizer();
  const sa_group_config config = group_config(1e-2, 0.0, 1);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
  Rng rng(17);
  fill_normal(p0, rng, 1.0);
  fill_normal(p2, rng, 1.0);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "p0", 0, p0.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "p1", 0, p1.versioned(), nullptr,
                                                  nullptr, nullptr));
  const sa_param_options bf16_grads = param_options(kBfloat16, kDefaultDtype, SA_MASTER_AUTO);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "p2", 0, p2.versioned(), nullptr,
                                                  &bf16_grads, nullptr));

  // Two grad sets; the second, if it were used, would move the params the other way.
  HostTensor a0({5}, kFloat32), a2({4}, kBfloat16), b0({5}, kFloat32, 4), b2({4}, kBfloat16, 2);
  fill_normal(a0, rng, 1.0);
  fill_normal(a2, rng, 1.0);
  for (int64_t i = 0; i < 5; ++i) b0.set(i, -a0.get(i));
  for (int64_t i = 0; i < 4; ++i) b2.set(i, -a2.get(i));
  const void* bind_a[3] = {a0.data(), nullptr, a2.data()};
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad_ptrs(opt.get(), 3, bind_a));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));  // builds the plan
  const Snapshot before = snapshot(opt.get(), {&p0, &p1, &p2});

  const void* bind_b[3] = {b0.data(), nullptr, b2.data()};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_set_grad_ptrs(opt.get(), 2, bind_b),
                 "n is 2 but the optimizer has 3 params");
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_set_grad_ptrs(opt.get(), 4, bind_b), "n is 4");
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_set_grad_ptrs(opt.get(), 3, nullptr), "ptrs is NULL");
  const void* null_last[3] = {b0.data(), nullptr, nullptr};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_set_grad_ptrs(opt.get(), 3, null_last),
                 "ptrs[2] (param 'p2', 4 elements) is NULL");
  const void* misaligned_f32[3] = {static_cast<const char*>(b0.data()) - 2, nullptr, b2.data()};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_set_grad_ptrs(opt.get(), 3, misaligned_f32),
                 "ptrs[0] (param 'p0') is not aligned to its float32 elements");
  const void* misaligned_bf16[3] = {b0.data(), nullptr, static_cast<const char*>(b2.data()) - 1};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_set_grad_ptrs(opt.get(), 3, misaligned_bf16),
                 "ptrs[2] (param 'p2') is not aligned to its bfloat16 elements");
  CHECK(difference(before, snapshot(opt.get(), {&p0, &p1, &p2})) == "");

  // A valid binding of one param after the failures must not bring any rejected pointer
  // to life either: p2 is bound again to its set-A grad, and the step uses set A for both.
  const DLTensor a2_tensor = a2.dl();
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 2, &a2_tensor));
  std::vector<double> expected0 = predicted_step(opt.get(), 0, p0, values_of(a0));
  std::vector<double> expected2 = predicted_step(opt.get(), 2, p2, values_of(a2));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  check_matches(p0, expected0);
  check_matches(p2, expected2);

  // And a valid rebinding is honoured by the step after it.
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad_ptrs(opt.get(), 3, bind_b));
  expected0 = predicted_step(opt.get(), 0, p0, values_of(b0));
  expected2 = predicted_step(opt.get(), 2, p2, values_of(b2));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  check_matches(p0, expected0);
  check_matches(p2, expected2);
}

// ---- option structs -----------------------------------------------------------------------------

TEST_CASE(
    "every option struct rejects struct_size 0 and, as SA_ERR_UNSUPPORTED, one larger than the "
    "library's",
    "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  HostTensor t({4, 3}, kFloat32);
  const std::vector<std::size_t> bad_sizes = {0, 4};

  sa_group_config config = f.config;
  for (std::size_t size : bad_sizes) {
    config.struct_size = size;
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                   sa_optimizer_add_group(f.get(), &config, nullptr), "config: struct_size",
                   "too small");
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_group(f.get(), 0, &config),
                   "config: struct_size", "too small");
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_get_group(f.get(), 0, &config),
                   "out: struct_size", "too small");
  }
  config.struct_size = sizeof(sa_group_config) + 8;
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED, sa_optimizer_add_group(f.get(), &config, nullptr),
                 "newer shardadam.h");
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED, sa_optimizer_set_group(f.get(), 0, &config),
                 "newer shardadam.h");
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED, sa_optimizer_get_group(f.get(), 0, &config),
                 "newer shardadam.h");

  sa_param_info info = SA_PARAM_INFO_INIT;
  info.struct_size = 0;
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_param_info(f.get(), 0, &info),
                 "out: struct_size 0");
  info.struct_size = sizeof(sa_param_info) + 8;
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED, sa_optimizer_param_info(f.get(), 0, &info),
                 "newer shardadam.h");

  sa_param_options options = SA_PARAM_OPTIONS_INIT;
  options.struct_size = 0;
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(f.get(), "t", 0, t.versioned(), nullptr, &options, nullptr),
                 "param 't': options: struct_size 0");
  options.struct_size = sizeof(sa_param_options) + 8;
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED,
                 sa_optimizer_add_param(f.get(), "t", 0, t.versioned(), nullptr, &options, nullptr),
                 "param 't': options", "newer shardadam.h");

  const MeshLayout mesh{{4, 3}, {1}, {0}, {shard(0)}};
  sa_layout layout = mesh.get();
  layout.struct_size = 0;
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(f.get(), "t", 0, t.versioned(), &layout, nullptr, nullptr),
                 "param 't': layout: struct_size 0");
  layout.struct_size = sizeof(sa_layout) + 8;
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED,
                 sa_optimizer_add_param(f.get(), "t", 0, t.versioned(), &layout, nullptr, nullptr),
                 "param 't': layout", "newer shardadam.h");

  sa_step_args args = SA_STEP_ARGS_INIT;
  args.struct_size = 0;
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_step(f.get(), &args, nullptr),
                 "args: struct_size 0");
  args.struct_size = sizeof(sa_step_args) + 8;
  CHECK_SA_FAILS(f.get(), SA_ERR_UNSUPPORTED, sa_optimizer_step(f.get(), &args, nullptr), "args",
                 "newer shardadam.h");

  CHECK(difference(before, f.snap()) == "");
  f.opt.reset();
  CHECK(t.deleter_calls() == 0);
}

TEST_CASE(
    "a caller built against an older header (shorter struct) gets defaults for the fields it lacks",
    "[errors]") {
  HostTensor t({3}, kBfloat16), g({3}, kBfloat16);
  Trained f;
  SECTION("add_group: a struct without amsgrad gets amsgrad 0, whatever lies past its end") {
    sa_group_config c = f.config;
    c.amsgrad = 55;  // past struct_size: must not be read
    c.struct_size = offsetof(sa_group_config, amsgrad);
    int32_t index = -1;
    REQUIRE_SA_OK(f.get(), sa_optimizer_add_group(f.get(), &c, &index));
    sa_group_config got = SA_GROUP_CONFIG_INIT;
    REQUIRE_SA_OK(f.get(), sa_optimizer_get_group(f.get(), index, &got));
    CHECK(got.amsgrad == 0);
    CHECK(got.lr == f.config.lr);
  }
  SECTION("set_group: fields past a short struct keep the group's current values") {
    sa_group_config c = SA_GROUP_CONFIG_INIT;
    c.maximize = 1;
    int32_t index = -1;
    REQUIRE_SA_OK(f.get(), sa_optimizer_add_group(f.get(), &c, &index));
    sa_group_config update = SA_GROUP_CONFIG_INIT;
    update.lr = 0.125;
    update.maximize = 0;  // past struct_size: ignored
    update.struct_size = offsetof(sa_group_config, maximize);
    REQUIRE_SA_OK(f.get(), sa_optimizer_set_group(f.get(), index, &update));
    sa_group_config got = SA_GROUP_CONFIG_INIT;
    REQUIRE_SA_OK(f.get(), sa_optimizer_get_group(f.get(), index, &got));
    CHECK(got.lr == 0.125);
    CHECK(got.maximize == 1);
  }
  SECTION(
      "get_group and param_info write only the caller's struct_size bytes and keep struct_size") {
    struct {
      sa_group_config config;
      unsigned char guard[32];
    } g;
    std::memset(&g, 0xA5, sizeof g);
    g.config.struct_size = offsetof(sa_group_config, maximize);
    REQUIRE_SA_OK(f.get(), sa_optimizer_get_group(f.get(), 0, &g.config));
    CHECK(g.config.struct_size == offsetof(sa_group_config, maximize));
    CHECK(g.config.lr == f.config.lr);
    CHECK(g.config.bias_correction == 1);
    const auto* tail =
        reinterpret_cast<const unsigned char*>(&g.config) + offsetof(sa_group_config, maximize);
    CHECK(std::all_of(tail, tail + sizeof g.config - offsetof(sa_group_config, maximize),
                      [](unsigned char c) { return c == 0xA5; }));
    // Calling again with the same struct is just as safe.
    REQUIRE_SA_OK(f.get(), sa_optimizer_get_group(f.get(), 0, &g.config));
    CHECK(g.config.struct_size == offsetof(sa_group_config, maximize));

    sa_param_info info = SA_PARAM_INFO_INIT;
    info.struct_size = offsetof(sa_param_info, ndim);
    info.ndim = -5;
    REQUIRE_SA_OK(f.get(), sa_optimizer_param_info(f.get(), 1, &info));
    CHECK(info.struct_size == offsetof(sa_param_info, ndim));
    CHECK(std::string(info.name) == "layers.0.b");
    CHECK(info.ndim == -5);
  }
  SECTION(
      "add_param: options without master get AUTO; step args without `skipped` leave it alone") {
    sa_param_options o = SA_PARAM_OPTIONS_INIT;
    o.master = 99;  // past struct_size
    o.struct_size = offsetof(sa_param_options, master);
    REQUIRE_SA_OK(f.get(),
                  sa_optimizer_add_param(f.get(), "old", 0, t.versioned(), nullptr, &o, nullptr));
    sa_param_info info = SA_PARAM_INFO_INIT;
    REQUIRE_SA_OK(f.get(), sa_optimizer_param_info(f.get(), 2, &info));
    CHECK(info.master == SA_MASTER_FP32);
    const DLTensor dl = g.dl();
    REQUIRE_SA_OK(f.get(), sa_optimizer_set_grad(f.get(), 2, &dl));
    int32_t skipped = 42;
    const float found_inf = 1.0f;
    sa_step_args args = SA_STEP_ARGS_INIT;
    args.found_inf = &found_inf;
    args.skipped = &skipped;
    args.struct_size = offsetof(sa_step_args, skipped);
    REQUIRE_SA_OK(f.get(), sa_optimizer_step(f.get(), &args, nullptr));
    CHECK(skipped == 42);
    CHECK(step_count(f.get(), 0) == 1);  // found_inf was within the struct: skipped
  }
}

// ---- state keys and indices ---------------------------------------------------------------------

TEST_CASE("an unknown state key is rejected with the list of the param's keys", "[errors]") {
  Trained f;
  DLManagedTensorVersioned* view = nullptr;
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_state_view(f.get(), 0, "momentum", &view),
                 "param 'layers.0.w' has no state 'momentum'; it has: exp_avg, exp_avg_sq");
  CHECK(view == nullptr);
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_state_view(f.get(), 0, "master", &view),
                 "param 'layers.0.w' has no state 'master'");
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_state_view(f.get(), 0, "max_exp_avg_sq", &view),
                 "has no state 'max_exp_avg_sq'");
  CHECK_SA_FAILS(
      f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_state_view(f.get(), 1, "remainder", &view),
      "param 'layers.0.b' has no state 'remainder'; it has: exp_avg, exp_avg_sq, master");
  CHECK(view == nullptr);
}

TEST_CASE("out-of-range group and param indices are rejected by every call that takes one",
          "[errors]") {
  Trained f;
  const Snapshot before = f.snap();
  sa_group_config c = SA_GROUP_CONFIG_INIT;
  int64_t step = 0;
  for (int32_t g : {-1, 1, 1000}) {
    const std::string text =
        "group " + std::to_string(g) + " does not exist (the optimizer has 1 groups)";
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_get_group(f.get(), g, &c),
                   text.c_str());
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_group(f.get(), g, &f.config),
                   text.c_str());
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_lr(f.get(), g, 0.1),
                   text.c_str());
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_get_step(f.get(), g, &step),
                   text.c_str());
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_step(f.get(), g, 3),
                   text.c_str());
    HostTensor t({2}, kFloat32);
    CHECK_SA_FAILS(
        f.get(), SA_ERR_INVALID_ARGUMENT,
        sa_optimizer_add_param(f.get(), "t", g, t.versioned(), nullptr, nullptr, nullptr),
        "param 't'", text.c_str());
  }
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_step(f.get(), 0, -1),
                 "group 0: step -1 is negative");
  sa_param_info info = SA_PARAM_INFO_INIT;
  const DLTensor g = f.grad_w.dl();
  DLManagedTensorVersioned* view = nullptr;
  for (int64_t p : {int64_t{-1}, int64_t{2}, int64_t{1} << 40}) {
    const std::string text =
        "param " + std::to_string(p) + " does not exist (the optimizer has 2 params)";
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_param_info(f.get(), p, &info),
                   text.c_str());
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad(f.get(), p, &g),
                   text.c_str());
    CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                   sa_optimizer_state_view(f.get(), p, "exp_avg", &view), text.c_str());
    CHECK(view == nullptr);
  }
  int64_t found = 5;
  CHECK_SA_FAILS(f.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_find_param(f.get(), "layers.9.w", &found),
                 "no param is named 'layers.9.w'");
  CHECK(difference(before, f.snap()) == "");
}

// ---- ownership ----------------------------------------------------------------------------------

TEST_CASE("an accepted shard's deleter runs exactly once, at destroy, a rejected shard's never",
          "[errors][dlpack]") {
  HostTensor accepted({3}, kFloat32), accepted_legacy({2}, kBfloat16), rejected({3}, kFloat64),
      rejected_legacy({2}, kInt32);
  {
    auto opt = make_optimizer();
    const sa_group_config config = SA_GROUP_CONFIG_INIT;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "a", 0, accepted.versioned(),
                                                    nullptr, nullptr, nullptr));
    REQUIRE_SA_OK(opt.get(),
                  sa_optimizer_add_param_legacy(opt.get(), "b", 0, accepted_legacy.legacy(),
                                                nullptr, nullptr, nullptr));
    CHECK(sa_optimizer_add_param(opt.get(), "c", 0, rejected.versioned(), nullptr, nullptr,
                                 nullptr) == SA_ERR_UNSUPPORTED);
    CHECK(sa_optimizer_add_param_legacy(opt.get(), "d", 0, rejected_legacy.legacy(), nullptr,
                                        nullptr, nullptr) == SA_ERR_UNSUPPORTED);
    HostTensor g({3}, kFloat32), gb({2}, kBfloat16);
    const void* ptrs[2] = {g.data(), gb.data()};
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad_ptrs(opt.get(), 2, ptrs));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
    CHECK(accepted.deleter_calls() == 0);  // owned, not yet released
    CHECK(accepted_legacy.deleter_calls() == 0);
  }
  CHECK(accepted.deleter_calls() == 1);
  CHECK(accepted_legacy.deleter_calls() == 1);
  CHECK(rejected.deleter_calls() == 0);
  CHECK(rejected_legacy.deleter_calls() == 0);
}

TEST_CASE("a host shard with a nonzero cpu device_id is refused, naming the id", "[errors]") {
  auto opt = make_optimizer();
  const sa_group_config config = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
  HostTensor t({4}, kFloat32);
  t.set_device(DLDevice{kDLCPU, 1});
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(opt.get(), "w", 0, t.versioned(), nullptr, nullptr, nullptr),
                 "param 'w'", "device_id 1");
  CHECK(sa_optimizer_num_params(opt.get()) == 0);
  opt.reset();
  CHECK(t.deleter_calls() == 0);
}
