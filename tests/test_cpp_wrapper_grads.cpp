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
#include "test_trio.hpp"

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

// The Trio's params (test_trio.hpp) in an optimizer made through the wrapper.
struct Trio : TrioTensors {
  shardadam::Optimizer opt;

  Trio() : TrioTensors(83) {
    opt.add_group(config);
    for (int i = 0; i < 3; ++i) opt.add_param(kNames[i], 0, param(i).versioned());
  }
  void step_and_check(const bool present[3], const std::vector<int64_t>& steps) {
    TrioTensors::step_and_check(opt.get(), present, steps, [&] { opt.step(); });
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

TEST_CASE("C++ wrapper: step_params steps the listed params as a step does, the others stay, and "
          "a repeated index throws",
          "[cpp][partial]") {
  Trio f;
  f.fresh_grads();
  std::vector<const DLTensor*> grads;
  std::vector<DLTensor> dl;
  for (int i = 0; i < 3; ++i) dl.push_back(f.grad(i).dl());
  for (const DLTensor& g : dl) grads.push_back(&g);
  f.opt.set_grads(grads);
  const bool w_only[3] = {false, true, false};
  f.TrioTensors::step_and_check(f.opt.get(), w_only, {0, 0, 0}, [&] { f.opt.step_params({1}); });
  check_throws([&] { f.opt.step_params({0, 2, 0}); }, SA_ERR_INVALID_ARGUMENT, {"params[2] is 0 again"});
  CHECK(f.opt.param_steps(0, 3) == std::vector<int64_t>{0, 1, 0});
}
