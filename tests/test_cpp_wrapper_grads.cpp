// tests/test_cpp_wrapper_grads.cpp — the C++ wrapper's grad and step-count calls: every
// safe way to bind a grad is checked by the library (a transposed, expanded or reshaped
// grad throws shardadam::Error naming the param, and no binding changes); the raw-pointer
// path exists only as set_grad_ptrs_unchecked; a nullptr entry or clear_grad skips a param
// bit for bit without advancing its count; per-param counts set through the wrapper drive
// each param's bias correction. References: the float64 update of test_support.hpp.
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardadam/shardadam.hpp"
#include "test_support.hpp"

using namespace sa_test;

namespace {

// The raw-pointer binding is not reachable under a name that sounds safe.
template <class T, class = void>
struct has_set_grad_ptrs : std::false_type {};
template <class T>
struct has_set_grad_ptrs<T, std::void_t<decltype(std::declval<T&>().set_grad_ptrs(
                                static_cast<const void* const*>(nullptr), int64_t{0}))>>
    : std::true_type {};
static_assert(!has_set_grad_ptrs<shardadam::Optimizer>::value,
              "shardadam::Optimizer must not offer an unchecked set_grad_ptrs under a safe name");

std::vector<double> values_of(const HostTensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = t.get(i);
  return out;
}

// Three float32 params ("emb" [5, 4], "w" [7], "b" [3]) of one AdamW group, through the
// wrapper; the tensors outlive the optimizer (declared first, destroyed last).
struct Trio {
  sa_group_config config = group_config(1e-2, 1e-2, 1);
  HostTensor emb{{5, 4}, kFloat32}, w{{7}, kFloat32}, b{{3}, kFloat32};
  HostTensor g_emb{{5, 4}, kFloat32}, g_w{{7}, kFloat32}, g_b{{3}, kFloat32};
  Rng rng{83};
  shardadam::Optimizer opt;

  Trio() {
    opt.add_group(config);
    const char* names[3] = {"emb", "w", "b"};
    for (int i = 0; i < 3; ++i) {
      fill_normal(param(i), rng, 1.0);
      opt.add_param(names[i], 0, param(i).versioned());
    }
  }
  HostTensor& param(int i) { return i == 0 ? emb : i == 1 ? w : b; }
  HostTensor& grad(int i) { return i == 0 ? g_emb : i == 1 ? g_w : g_b; }
  void fresh_grads() {
    for (int i = 0; i < 3; ++i) fill_normal(grad(i), rng, 0.1);
  }
  // Param i's reference state, from the library's current param and moments.
  RefState state_of(int i) {
    RefState s(values_of(param(i)), Storage::f32);
    const shardadam::StateView m = opt.state_view(i, "exp_avg");
    const shardadam::StateView v = opt.state_view(i, "exp_avg_sq");
    for (int64_t k = 0; k < param(i).numel(); ++k) {
      s.m[k] = m.data<float>()[k];
      s.v[k] = v.data<float>()[k];
    }
    return s;
  }
  // Param i and its moments as bytes: an untouched param is so bit for bit.
  std::vector<unsigned char> bytes_of(int i) {
    std::vector<unsigned char> out = param(i).raw_bytes();
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      const shardadam::StateView view = opt.state_view(i, key);
      const auto* p = view.data<const unsigned char>();
      out.insert(out.end(), p, p + view.numel() * 4);
    }
    return out;
  }
  // One step, checked against the float64 reference: params with present[i] step at
  // count steps[i] + 1 from the grads now in their buffers, the others stay bit for bit.
  void step_and_check(const bool present[3], const std::vector<int64_t>& steps) {
    std::vector<RefState> refs;
    std::vector<RefScales> scales(3);
    std::vector<std::vector<unsigned char>> before;
    for (int i = 0; i < 3; ++i) {
      refs.push_back(state_of(i));
      before.push_back(bytes_of(i));
      if (present[i])
        reference_step(refs[i], config, steps[i] + 1, values_of(grad(i)), 1.0, RefBug::none,
                       &scales[i]);
    }
    opt.step();
    for (int i = 0; i < 3; ++i) {
      INFO("param " << i);
      if (!present[i]) {
        CHECK(bytes_of(i) == before[i]);
        continue;
      }
      Worst worst("param");
      for (int64_t k = 0; k < param(i).numel(); ++k)
        worst.add(k, param(i).get(k), refs[i].value[k],
                  step_value_tolerance(refs[i].value[k], scales[i].step_size));
      CHECK_WITHIN(worst);
    }
  }
};

// Runs `call`, which must throw shardadam::Error with `status` and every needle in its message.
template <class Call>
void check_throws(Call&& call, sa_status status, const std::vector<std::string>& needles) {
  try {
    call();
    FAIL("no shardadam::Error was thrown");
  } catch (const shardadam::Error& e) {
    INFO(e.what());
    CHECK(e.status() == status);
    for (const std::string& needle : needles) CHECK_THAT(e.message(), Catch::Contains(needle));
  }
}

}  // namespace

TEST_CASE(
    "C++ wrapper: set_grads refuses transposed, expanded and reshaped grads, naming the param, "
    "and binds nothing",
    "[cpp][grads][errors]") {
  Trio f;
  f.fresh_grads();
  // Decoys far from the real grads: a step that read any of them would show.
  HostTensor transposed({4, 5}, kFloat32), row({1, 4}, kFloat32), flat({20}, kFloat32),
      fresh_w({7}, kFloat32);
  for (HostTensor* t : {&transposed, &row, &flat, &fresh_w}) fill_normal(*t, f.rng, 100.0);
  std::vector<int64_t> shape54 = {5, 4}, t_strides = {1, 5}, e_strides = {0, 1};
  DLTensor t_grad = transposed.dl();  // torch.randn(4, 5).t()
  t_grad.shape = shape54.data();
  t_grad.strides = t_strides.data();
  DLTensor e_grad = row.dl();  // torch.randn(1, 4).expand(5, 4): 20 reads of a 4-element buffer
  e_grad.shape = shape54.data();
  e_grad.strides = e_strides.data();
  const DLTensor r_grad = flat.dl();  // [20] for a [5, 4] param
  const DLTensor w_grad = fresh_w.dl();

  // Before anything is bound: a refused call leaves every param unbound, so the step
  // still refuses.
  for (const auto& [what, bad, needle] :
       std::vector<std::tuple<const char*, const DLTensor*, std::string>>{
           {"transposed", &t_grad, "strides [1, 5]"},
           {"expanded", &e_grad, "strides [0, 1]"},
           {"reshaped", &r_grad, "grad shape [20] does not match the local shape [5, 4]"}}) {
    INFO(what);
    check_throws(
        [&] {
          f.opt.set_grads(std::vector<const DLTensor*>{bad, &w_grad, nullptr});
        },
        SA_ERR_MISMATCH, {"sa_optimizer_set_grads", "param 'emb'", needle});
    check_throws([&] { f.opt.set_grad(0, *bad); }, SA_ERR_MISMATCH, {"param 'emb'", needle});
  }
  check_throws([&] { f.opt.step(); }, SA_ERR_STATE, {"param 'emb' was never given a grad"});

  // Bound, then refused: the step reads the grads bound before the refused calls.
  std::vector<DLTensor> good;
  for (int i = 0; i < 3; ++i) good.push_back(f.grad(i).dl());
  f.opt.set_grads(std::vector<const DLTensor*>{&good[0], &good[1], &good[2]});
  check_throws(
      [&] {
        f.opt.set_grads(std::vector<const DLTensor*>{&good[0], &w_grad, &t_grad});
      },
      SA_ERR_MISMATCH, {"param 'b'"});
  check_throws(
      [&] {
        f.opt.set_grads(std::vector<const DLTensor*>{&good[0], &good[1]});
      },
      SA_ERR_INVALID_ARGUMENT, {"n is 2 but the optimizer has 3 params"});
  const bool all[3] = {true, true, true};
  f.step_and_check(all, {0, 0, 0});
  CHECK(f.opt.param_steps() == std::vector<int64_t>{1, 1, 1});
}

TEST_CASE(
    "C++ wrapper: a param without a grad (nullptr in set_grads, clear_grad, SA_NO_GRAD) is skipped "
    "bit for bit and its count stays while the others step",
    "[cpp][grads][steps]") {
  Trio f;
  const bool present[3][3] = {{true, false, true}, {false, true, true}, {true, true, false}};
  std::vector<int64_t> steps = {0, 0, 0};
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    f.fresh_grads();
    if (step == 0) {
      std::vector<const DLTensor*> grads(3, nullptr);
      std::vector<DLTensor> views;
      for (int i = 0; i < 3; ++i) views.push_back(f.grad(i).dl());
      for (int i = 0; i < 3; ++i) grads[i] = present[step][i] ? &views[i] : nullptr;
      f.opt.set_grads(grads);
    } else if (step == 1) {
      for (int i = 0; i < 3; ++i) {
        if (present[step][i])
          f.opt.set_grad(i, f.grad(i).dl());
        else
          f.opt.clear_grad(i);
      }
    } else {
      // The trusted fast path, under its unmistakable name.
      std::vector<const void*> ptrs;
      for (int i = 0; i < 3; ++i) ptrs.push_back(present[step][i] ? f.grad(i).data() : SA_NO_GRAD);
      f.opt.set_grad_ptrs_unchecked(ptrs.data(), static_cast<int64_t>(ptrs.size()));
    }
    f.step_and_check(present[step], steps);
    for (int i = 0; i < 3; ++i) steps[i] += present[step][i] ? 1 : 0;
    CHECK(f.opt.param_steps() == steps);
  }
  CHECK(steps == std::vector<int64_t>{2, 2, 2});
  CHECK(f.opt.step_count(0) == 3);
  check_throws([&] { f.opt.clear_grad(3); }, SA_ERR_INVALID_ARGUMENT,
               {"sa_optimizer_clear_grad", "3"});
}

TEST_CASE(
    "C++ wrapper: per-param step counts [6, 6, 3] set through the wrapper drive each param's bias "
    "correction",
    "[cpp][steps]") {
  Trio f;
  f.opt.set_param_steps(0, {6, 6, 3});
  CHECK(f.opt.param_steps() == std::vector<int64_t>{6, 6, 3});
  CHECK(f.opt.param_steps(1, 2) == std::vector<int64_t>{6, 3});
  f.fresh_grads();
  for (int i = 0; i < 3; ++i) f.opt.set_grad(i, f.grad(i).dl());
  // The moments start at zero, so a wrong count changes lr / (1 - beta1^t) far beyond the
  // tolerance (t = 4 against 7: a factor 1.5).
  const bool all[3] = {true, true, true};
  f.step_and_check(all, {6, 6, 3});
  CHECK(f.opt.param_steps() == std::vector<int64_t>{7, 7, 4});
  // Refused ranges and counts change nothing.
  check_throws(
      [&] {
        f.opt.set_param_steps(1, {4, -2});
      },
      SA_ERR_INVALID_ARGUMENT, {"param 'b'", "-2"});
  check_throws([&] { f.opt.param_steps(2, 2); }, SA_ERR_INVALID_ARGUMENT,
               {"not a range of params"});
  check_throws([&] { f.opt.param_steps(0, -1); }, SA_ERR_INVALID_ARGUMENT,
               {"not a range of params"});
  CHECK(f.opt.param_steps() == std::vector<int64_t>{7, 7, 4});
  // A group's count set through the wrapper sets its params' counts too.
  f.opt.set_step_count(0, 10);
  CHECK(f.opt.param_steps() == std::vector<int64_t>{10, 10, 10});
}
