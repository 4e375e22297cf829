// tests/test_grad_presence.cpp — grads that are absent at some steps, per-param step counts,
// and grads checked at every binding: a param without a grad is left exactly as it is and
// does not advance (torch skips a param whose .grad is None); every param's bias
// correction uses its own count; sa_optimizer_set_grads refuses expanded, transposed,
// reshaped or retyped grads before it binds anything. References: the float64 update of
// test_support.hpp, one step at a time from the library's own state.
#include "test_trio.hpp"

namespace {

using namespace sa_test;

std::vector<int64_t> param_steps(const sa_optimizer* opt) {
  std::vector<int64_t> steps(static_cast<std::size_t>(sa_optimizer_num_params(opt)), -1);
  REQUIRE_SA_OK(opt, sa_optimizer_get_param_steps(opt, 0, static_cast<int64_t>(steps.size()), steps.data()));
  return steps;
}

// The Trio's params in an optimizer of the C ABI.
struct Trio : TrioTensors {
  OptimizerPtr opt = make_optimizer();

  Trio() : TrioTensors(41) {
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
    for (int i = 0; i < 3; ++i)
      REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), kNames[i], 0, param(i).versioned(), nullptr,
                                                      nullptr, nullptr));
  }
  void step_and_check(const bool present[3], const std::vector<int64_t>& steps) {
    TrioTensors::step_and_check(opt.get(), present, steps,
                                [&] { REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr)); });
  }
};

constexpr bool kAll[3] = {true, true, true};

// Binds the Trio's grads in one sa_optimizer_set_grads call, NULL ("no grad") where absent.
void set_present_grads(Trio& f, const bool present[3]) {
  DLTensor g[3];
  const DLTensor* grads[3];
  for (int i = 0; i < 3; ++i) {
    g[i] = f.grad(i).dl();
    grads[i] = present[i] ? &g[i] : nullptr;
  }
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_grads(f.opt.get(), 3, grads));
}

}  // namespace

TEST_CASE("a param without a grad is skipped: unchanged bit for bit, its step count stays, and the "
          "others step with their own bias correction",
          "[grads][steps]") {
  Trio f;
  // Which params have a grad at each step, and how "no grad" is said: clear_grad,
  // SA_NO_GRAD in set_grad_ptrs, a NULL entry of set_grads.
  const bool present[6][3] = {{1, 1, 1}, {1, 0, 1}, {1, 0, 0}, {0, 1, 1}, {1, 1, 0}, {1, 1, 1}};
  std::vector<int64_t> want_steps = {0, 0, 0};
  for (int step = 0; step < 6; ++step) {
    f.fresh_grads();
    const int way = step % 3;
    if (way == 0) {
      for (int i = 0; i < 3; ++i) {
        const DLTensor g = f.grad(i).dl();
        REQUIRE_SA_OK(f.opt.get(), present[step][i] ? sa_optimizer_set_grad(f.opt.get(), i, &g)
                                                    : sa_optimizer_clear_grad(f.opt.get(), i));
      }
    } else if (way == 1) {
      const void* ptrs[3];
      for (int i = 0; i < 3; ++i) ptrs[i] = present[step][i] ? f.grad(i).data() : SA_NO_GRAD;
      REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_grad_ptrs(f.opt.get(), 3, ptrs));
    } else {
      set_present_grads(f, present[step]);
    }
    INFO("step " << step);
    f.step_and_check(present[step], want_steps);
    for (int i = 0; i < 3; ++i) want_steps[i] += present[step][i] ? 1 : 0;
    CHECK(param_steps(f.opt.get()) == want_steps);
  }
  CHECK(want_steps == std::vector<int64_t>{5, 4, 4});
  CHECK(step_count(f.opt.get(), 0) == 6);  // the group counts the optimizer's steps
}

TEST_CASE("grads bound before each step and all unbound after it (FusedAdam's way): each step skips "
          "exactly the params bound without a grad, whether the pattern repeats or changes",
          "[grads][steps]") {
  Trio f;
  // Repeated patterns leave the active table as the last step's (its upload is skipped);
  // changed ones must reach the step.
  const bool present[7][3] = {{1, 1, 1}, {1, 1, 1}, {1, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}, {1, 1, 1}};
  std::vector<int64_t> want_steps = {0, 0, 0};
  const DLTensor* none[3] = {nullptr, nullptr, nullptr};
  for (int step = 0; step < 7; ++step) {
    f.fresh_grads();
    set_present_grads(f, present[step]);
    INFO("step " << step);
    f.step_and_check(present[step], want_steps);
    REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_grads(f.opt.get(), 3, none));
    for (int i = 0; i < 3; ++i) want_steps[i] += present[step][i] ? 1 : 0;
    CHECK(param_steps(f.opt.get()) == want_steps);
  }
  CHECK(want_steps == std::vector<int64_t>{6, 5, 7});
}

TEST_CASE("per-param step counts set to [6, 6, 3] give each param torch's bias correction at its own count",
          "[steps]") {
  Trio f;
  const int64_t steps[3] = {6, 6, 3};
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_param_steps(f.opt.get(), 0, 3, steps));
  f.fresh_grads();
  for (int i = 0; i < 3; ++i) {
    const DLTensor g = f.grad(i).dl();
    REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_grad(f.opt.get(), i, &g));
  }
  // The moments start at zero, so a wrong count changes lr / (1 - beta1^t) by far more
  // than the tolerance: at t = 4 against t = 7, by a factor 1.5.
  f.step_and_check(kAll, {6, 6, 3});
  CHECK(param_steps(f.opt.get()) == std::vector<int64_t>{7, 7, 4});
  CHECK(step_count(f.opt.get(), 0) == 1);
  // A group's count set later sets its params' counts too (a resume from a group count).
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_step(f.opt.get(), 0, 10));
  CHECK(param_steps(f.opt.get()) == std::vector<int64_t>{10, 10, 10});
}

TEST_CASE("per-param step counts: ranges and negative counts are refused and change nothing", "[steps][errors]") {
  Trio f;
  const int64_t good[3] = {1, 2, 3};
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_param_steps(f.opt.get(), 0, 3, good));
  int64_t out[4] = {-1, -1, -1, -1};
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_get_param_steps(f.opt.get(), 1, 3, out),
                 "params [1, 1 + 3) is not a range of params (the optimizer has 3)");
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_get_param_steps(f.opt.get(), -1, 1, out),
                 "not a range of params");
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_get_param_steps(f.opt.get(), 0, 1, nullptr),
                 "steps is NULL");
  const int64_t bad[2] = {4, -2};
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_param_steps(f.opt.get(), 1, 2, bad),
                 "steps[1] (param 'b') is -2");
  CHECK(param_steps(f.opt.get()) == std::vector<int64_t>{1, 2, 3});
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_get_param_steps(f.opt.get(), 1, 2, out));
  CHECK(out[0] == 2);
  CHECK(out[1] == 3);
}

TEST_CASE("set_grads checks every grad at every call: expanded, transposed, reshaped, retyped and misplaced "
          "grads are refused, naming the param, and no binding changes",
          "[grads][errors]") {
  Trio f;
  f.fresh_grads();
  DLTensor good[3];
  const DLTensor* grads[3];
  for (int i = 0; i < 3; ++i) {
    good[i] = f.grad(i).dl();
    grads[i] = &good[i];
  }
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_grads(f.opt.get(), 3, grads));
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_step(f.opt.get(), nullptr, nullptr));

  // Decoys far from the bound grads: a step that read any of them would show.
  HostTensor row({1, 4}, kFloat32), transposed({4, 5}, kFloat32), flat({20}, kFloat32), bf16({5, 4}, kBfloat16);
  HostTensor fresh_w({7}, kFloat32);
  for (HostTensor* t : {&row, &transposed, &flat, &bf16, &fresh_w}) fill_normal(*t, f.rng, 100.0);
  struct Case {
    const char* what;
    DLTensor grad;
    std::vector<int64_t> shape, strides;
    sa_status status;
    const char* message;
  };
  std::vector<Case> cases = {
      // torch.randn(1, 4).expand(5, 4): 20 elements read from a 4-element buffer.
      {"expanded", row.dl(), {5, 4}, {0, 1}, SA_ERR_MISMATCH, "strides [0, 1]"},
      // torch.randn(4, 5).t(): the right shape, the wrong order.
      {"transposed", transposed.dl(), {5, 4}, {1, 5}, SA_ERR_MISMATCH, "strides [1, 5]"},
      {"overlapping", flat.dl(), {5, 4}, {1, 1}, SA_ERR_MISMATCH, "strides [1, 1]"},
      {"reshaped", flat.dl(), {}, {}, SA_ERR_MISMATCH, "grad shape [20] does not match the local shape [5, 4]"},
      {"retyped", bf16.dl(), {}, {}, SA_ERR_MISMATCH, "grad dtype bfloat16 does not match"},
      {"on another device", f.grad(0).dl(), {}, {}, SA_ERR_MISMATCH, "grad is on cuda:0 but the param is on cpu"},
  };
  cases.back().grad.device = DLDevice{kDLCUDA, 0};
  for (Case& c : cases) {
    INFO(c.what);
    if (!c.shape.empty()) {
      c.grad.shape = c.shape.data();
      c.grad.strides = c.strides.data();
      c.grad.ndim = static_cast<int32_t>(c.shape.size());
    }
    // Param 1 gets a fresh, valid grad in the same call: it must not be bound either.
    DLTensor w = fresh_w.dl();
    const DLTensor* bad[3] = {&c.grad, &w, &good[2]};
    CHECK_SA_FAILS(f.opt.get(), c.status, sa_optimizer_set_grads(f.opt.get(), 3, bad), "sa_optimizer_set_grads",
                   "param 'emb': grad", c.message);
  }
  // The step still reads the grads bound before the refused calls.
  f.step_and_check(kAll, {1, 1, 1});
  const DLTensor* short_list[2] = {&good[0], &good[1]};
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grads(f.opt.get(), 2, short_list),
                 "n is 2 but the optimizer has 3 params");
}

TEST_CASE("set_grad_ptrs trusts pointers but refuses NULL for a non-empty param, pointing to SA_NO_GRAD",
          "[grads][errors]") {
  Trio f;
  const void* ptrs[3] = {f.g_emb.data(), nullptr, f.g_b.data()};
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad_ptrs(f.opt.get(), 3, ptrs),
                 "ptrs[1] (param 'w', 7 elements) is NULL", "SA_NO_GRAD");
  // Nothing was bound: the step still refuses, naming the first param never given a grad.
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_STATE, sa_optimizer_step(f.opt.get(), nullptr, nullptr),
                 "param 'emb' was never given a grad");
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_grad(f.opt.get(), 0, nullptr),
                 "sa_optimizer_clear_grad");
}

TEST_CASE("the gradient norm counts only the params that have a grad", "[grads][clip]") {
  Trio f;
  f.fresh_grads();
  const DLTensor g0 = f.g_emb.dl(), g2 = f.g_b.dl();
  const DLTensor* grads[3] = {&g0, nullptr, &g2};
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_grads(f.opt.get(), 3, grads));
  double want = 0.0;
  for (int i : {0, 2})
    for (int64_t k = 0; k < f.grad(i).numel(); ++k) want += static_cast<double>(f.grad(i).get(k)) * f.grad(i).get(k);
  want = std::sqrt(want);
  double norm = -1.0;
  sa_step_args args = SA_STEP_ARGS_INIT;
  args.max_grad_norm = INFINITY;
  args.host_grad_norm = &norm;
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_step(f.opt.get(), &args, nullptr));
  CHECK(std::fabs(norm - want) <= 1e-12 * want);
}

// ---- partial steps (sa_optimizer_step_params) -------------------------------------------------

TEST_CASE("a partial step updates its params as a step does and leaves the others bit for bit, "
          "per-param counts advance and group counts do not",
          "[grads][steps][partial]") {
  Trio f;
  const int64_t first[2] = {2, 0}, second[1] = {1};
  std::vector<int64_t> steps = {0, 0, 0};
  for (int round = 0; round < 3; ++round) {
    f.fresh_grads();
    std::vector<const void*> ptrs;
    for (int i = 0; i < 3; ++i) ptrs.push_back(f.grad(i).data());
    REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_grad_ptrs(f.opt.get(), 3, ptrs.data()));
    const bool emb_and_b[3] = {true, false, true}, only_w[3] = {false, true, false};
    f.TrioTensors::step_and_check(f.opt.get(), emb_and_b, steps, [&] {
      REQUIRE_SA_OK(f.opt.get(), sa_optimizer_step_params(f.opt.get(), 2, first, nullptr, nullptr));
    });
    steps[0] += 1;
    steps[2] += 1;
    CHECK(param_steps(f.opt.get()) == steps);
    f.TrioTensors::step_and_check(f.opt.get(), only_w, steps, [&] {
      REQUIRE_SA_OK(f.opt.get(), sa_optimizer_step_params(f.opt.get(), 1, second, nullptr, nullptr));
    });
    steps[1] += 1;
    CHECK(param_steps(f.opt.get()) == steps);
    CHECK(step_count(f.opt.get(), 0) == round);  // partial steps leave it; full ones advance it
    // A full step after partial ones steps every param again.
    f.fresh_grads();
    f.step_and_check(kAll, steps);
    for (int64_t& s : steps) s += 1;
    CHECK(param_steps(f.opt.get()) == steps);
    CHECK(step_count(f.opt.get(), 0) == round + 1);
  }
}

TEST_CASE("partial steps over disjoint params, one after the other, give a full step's bits",
          "[grads][steps][partial]") {
  Trio whole, parts;  // the same seed: the same params and grads
  for (int step = 0; step < 4; ++step) {
    whole.fresh_grads();
    parts.fresh_grads();
    for (Trio* t : {&whole, &parts}) {
      std::vector<const void*> ptrs;
      for (int i = 0; i < 3; ++i) ptrs.push_back(t->grad(i).data());
      REQUIRE_SA_OK(t->opt.get(), sa_optimizer_set_grad_ptrs(t->opt.get(), 3, ptrs.data()));
    }
    REQUIRE_SA_OK(whole.opt.get(), sa_optimizer_step(whole.opt.get(), nullptr, nullptr));
    const int64_t a[1] = {1}, b[2] = {0, 2};
    REQUIRE_SA_OK(parts.opt.get(), sa_optimizer_step_params(parts.opt.get(), 1, a, nullptr, nullptr));
    REQUIRE_SA_OK(parts.opt.get(), sa_optimizer_step_params(parts.opt.get(), 2, b, nullptr, nullptr));
  }
  for (int i = 0; i < 3; ++i) CHECK(parts.bytes_of(parts.opt.get(), i) == whole.bytes_of(whole.opt.get(), i));
  CHECK(param_steps(parts.opt.get()) == param_steps(whole.opt.get()));
}

TEST_CASE("a partial step checks everything first (bad, repeated or missing indices, clipping, "
          "a listed param never given a grad), and found_inf skips it",
          "[grads][steps][partial][errors]") {
  Trio f;
  f.fresh_grads();
  const DLTensor g0 = f.grad(0).dl(), g2 = f.grad(2).dl();
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_grad(f.opt.get(), 0, &g0));
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_grad(f.opt.get(), 2, &g2));  // w (1): never given one
  std::vector<std::vector<unsigned char>> before;
  for (int i = 0; i < 3; ++i) before.push_back(f.bytes_of(f.opt.get(), i));
  sa_optimizer* opt = f.opt.get();
  const int64_t out_of_range[2] = {0, 3}, repeated[3] = {2, 0, 2}, negative[1] = {-1}, never[2] = {0, 1};
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step_params(opt, 2, out_of_range, nullptr, nullptr),
                 "params[1] is 3", "3 params (indices 0 to 2)");
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step_params(opt, 3, repeated, nullptr, nullptr),
                 "params[2] is 2 again", "param 'b'");
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step_params(opt, 1, negative, nullptr, nullptr),
                 "params[0] is -1");
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step_params(opt, -1, negative, nullptr, nullptr),
                 "n is -1");
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step_params(opt, 2, nullptr, nullptr, nullptr),
                 "params is NULL");
  sa_step_args clip = SA_STEP_ARGS_INIT;
  clip.max_grad_norm = 1.0;
  const int64_t emb[1] = {0};
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step_params(opt, 1, emb, &clip, nullptr),
                 "max_grad_norm is 1 in a partial step", "clip in a full step");
  CHECK_SA_FAILS(opt, SA_ERR_STATE, sa_optimizer_step_params(opt, 2, never, nullptr, nullptr),
                 "param 'w' was never given a grad");
  for (int i = 0; i < 3; ++i) CHECK(f.bytes_of(opt, i) == before[i]);
  CHECK(param_steps(opt) == std::vector<int64_t>{0, 0, 0});

  // found_inf skips it: nothing changes, and the caller learns so.
  const float inf_found = 1.0f;
  int32_t skipped = -1;
  sa_step_args args = SA_STEP_ARGS_INIT;
  args.found_inf = &inf_found;
  args.skipped = &skipped;
  REQUIRE_SA_OK(opt, sa_optimizer_step_params(opt, 1, emb, &args, nullptr));
  CHECK(skipped == 1);
  for (int i = 0; i < 3; ++i) CHECK(f.bytes_of(opt, i) == before[i]);
  // w needs no grad when it is not listed; n = 0 steps nothing.
  REQUIRE_SA_OK(opt, sa_optimizer_step_params(opt, 0, nullptr, nullptr, nullptr));
  for (int i = 0; i < 3; ++i) CHECK(f.bytes_of(opt, i) == before[i]);
  const int64_t listed[2] = {2, 0};
  REQUIRE_SA_OK(opt, sa_optimizer_step_params(opt, 2, listed, nullptr, nullptr));
  CHECK(param_steps(opt) == std::vector<int64_t>{1, 0, 1});
  CHECK(f.bytes_of(opt, 1) == before[1]);
  CHECK(f.bytes_of(opt, 0) != before[0]);
}

TEST_CASE("a flush after a partial step readies a full step", "[grads][steps][partial]") {
  Trio f;
  f.fresh_grads();
  std::vector<const void*> ptrs;
  for (int i = 0; i < 3; ++i) ptrs.push_back(f.grad(i).data());
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_grad_ptrs(f.opt.get(), 3, ptrs.data()));
  const int64_t only_b[1] = {2};
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_step_params(f.opt.get(), 1, only_b, nullptr, nullptr));
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_flush(f.opt.get(), nullptr));
  f.step_and_check(kAll, {0, 0, 1});
  CHECK(param_steps(f.opt.get()) == std::vector<int64_t>{1, 1, 2});
}

TEST_CASE("a partial step of an optimizer without params leaves the group counts", "[steps][partial]") {
  OptimizerPtr opt = make_optimizer();
  const sa_group_config config = group_config(1e-3, 0.0, 1);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step_params(opt.get(), 0, nullptr, nullptr, nullptr));
  CHECK(step_count(opt.get(), 0) == 0);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  CHECK(step_count(opt.get(), 0) == 1);
}
