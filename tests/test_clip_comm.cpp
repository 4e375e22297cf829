// tests/test_clip_comm.cpp — global gradient-norm clipping and the found-inf consensus
// across ranks, with a host-callback communicator.
//
// Four ranks run as threads, each with its own optimizer over its local shards (uneven
// splits, an empty shard, params replicated along a mesh dim or the whole mesh, a bf16
// param with bf16 grads), all-reducing through callbacks. The norm and the clipped update
// are checked against a float64 reference computed on the full tensors: the norm of every
// element counted once, torch's clip coefficient, then AdamW.
#include <limits>
#include <thread>

#include "shardadam/shardadam.hpp"
#include "test_ranks.hpp"
#include "test_support.hpp"
#include "test_thread_comm.hpp"

namespace {

using namespace sa_test;

// ---- the problem -------------------------------------------------------------------------------

constexpr int kRanks = 4;
constexpr int kSteps = 4;

// Where each param lives on the 4 ranks (row-major coordinates of the mesh).
struct ParamSpec {
  GlobalParam param;
  Dims mesh;
  std::vector<sa_placement> placements;
};

std::vector<ParamSpec> specs() {
  return {
      // 10 rows over 4: 3, 3, 3, 1.
      {{"w", {10, 7}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0}, {4}, {shard(0)}},
      // 3 rows over 4: 1, 1, 1, 0 (rank 3 holds an empty shard).
      {{"e", {3, 5}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0}, {4}, {shard(0)}},
      // HSDP: replicated along mesh dim 0, split along dim 1 (ranks 2, 3 hold replicas).
      {{"b", {6}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
       {2, 2},
       {replicate(), shard(0)}},
      // On every rank in full.
      {{"n", {5}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0}, {4}, {replicate()}},
      // A 2-D block split of a bf16 param with bf16 grads and an fp32 master.
      {{"h", {9, 4}, kBfloat16, kBfloat16, kFloat32, SA_MASTER_FP32, 0},
       {2, 2},
       {shard(0), shard(1)}},
  };
}

std::vector<GlobalParam> global_params() {
  std::vector<GlobalParam> out;
  for (const ParamSpec& s : specs()) out.push_back(s.param);
  return out;
}

// Adam is nearly blind to a grad scale that is the same every step (m / sqrt(v) cancels
// it), so the grads of each step are scaled differently: clipping then changes the update
// for real, and a step that clipped wrongly (or not at all) shows.
constexpr double kStepScale[kSteps] = {1.0, 8.0, 0.5, 3.0};

const Problem& problem() {
  static const Problem p = [] {
    Problem prob(global_params(), kSteps, 9090);
    for (int s = 0; s < kSteps; ++s)
      for (HostTensor& g : prob.grads[static_cast<std::size_t>(s)])
        for (int64_t i = 0; i < g.numel(); ++i)
          g.set(i, static_cast<float>(g.get(i) * kStepScale[s]));
    return prob;
  }();
  return p;
}

constexpr double kMaxNormL2 = 1.0;
constexpr double kMaxNormInf = 0.25;

const sa_group_config& adamw() {
  static const sa_group_config c = group_config(1e-2, 1e-2, 1);
  return c;
}

// One rank of the 4, with its communicator.
class Rank : public RankShards {
 public:
  Rank(int rank, sa_comm* comm)
      : RankShards(
            problem(), {adamw()},
            [&](std::size_t k) {
              const ParamSpec spec = specs()[k];
              return mesh_scenario("", spec.mesh, spec.placements).place(spec.param.shape, rank);
            },
            1, 1) {
    REQUIRE_SA_OK(opt(), sa_optimizer_set_comm(opt(), comm));
  }

  // What a step reported; filled on the rank's thread, checked on the main thread.
  struct Outcome {
    sa_status status = SA_ERR_INTERNAL;
    std::string error;
    int32_t skipped = -1;
    double norm = -1.0;
    float device_norm = -1.0f;  // sa_step_args.grad_norm (host memory on the CPU backend)
  };

  Outcome step(double max_grad_norm, int32_t norm_type, float found_inf) {
    Outcome out;
    sa_step_args args = SA_STEP_ARGS_INIT;
    args.max_grad_norm = max_grad_norm;
    args.norm_type = norm_type;
    args.found_inf = &found_inf;
    args.skipped = &out.skipped;
    if (max_grad_norm > 0.0) {
      args.host_grad_norm = &out.norm;
      args.grad_norm = &out.device_norm;
    }
    out.status = sa_optimizer_step(opt(), &args, nullptr);
    out.error = sa_optimizer_last_error(opt());
    return out;
  }
};

// All ranks with their communicators.
struct World {
  ThreadComms comms{kRanks};
  ThreadGroup& group = comms.group;
  std::vector<std::unique_ptr<Rank>> ranks;

  World() {
    for (int r = 0; r < kRanks; ++r) ranks.push_back(std::make_unique<Rank>(r, comms[r]));
  }

  // One step on every rank at once (the all-reduce needs them all). found_inf[r] is rank r's.
  std::vector<Rank::Outcome> step(double max_grad_norm, int32_t norm_type,
                                  std::vector<float> found_inf = std::vector<float>(kRanks, 0.0f)) {
    std::vector<Rank::Outcome> out(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
      threads.emplace_back(
          [&, r] { out[r] = ranks[r]->step(max_grad_norm, norm_type, found_inf[r]); });
    for (auto& t : threads) t.join();
    return out;
  }
};

// ---- the float64 reference --------------------------------------------------------------------

// The norm of the unscaled global grads of step s, each element once, as stored (in the
// grad dtype), in double.
double reference_norm(int s, int32_t norm_type) {
  const Problem& prob = problem();
  double sum = 0.0, max = 0.0;
  for (const HostTensor& g : prob.grads[static_cast<std::size_t>(s)])
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double x = g.get(i);
      sum += x * x;
      max = std::max(max, std::fabs(x));
    }
  return norm_type == SA_NORM_INF ? max : std::sqrt(sum);
}

// torch.nn.utils.clip_grad_norm_: grads *= min(1, max_norm / (norm + 1e-6)).
double clip_coefficient(double norm, double max_norm) {
  return std::min(1.0, max_norm / (norm + 1e-6));
}

// Full-tensor float64 AdamW of every param over the given steps (grad multipliers per step).
struct Reference {
  std::vector<RefState> states;
  std::vector<double> step_sizes;  // lr / bc1 of each step taken, for tolerances
  int64_t t = 0;

  Reference() {
    for (const HostTensor& init : problem().initial) {
      std::vector<double> v(static_cast<std::size_t>(init.numel()));
      for (int64_t i = 0; i < init.numel(); ++i) v[static_cast<std::size_t>(i)] = init.get(i);
      states.emplace_back(std::move(v), Storage::f32);
    }
  }

  void step(int s, double multiplier) {
    ++t;
    const Problem& prob = problem();
    for (std::size_t k = 0; k < states.size(); ++k) {
      const HostTensor& g = prob.grads[static_cast<std::size_t>(s)][k];
      std::vector<double> grad(static_cast<std::size_t>(g.numel()));
      for (int64_t i = 0; i < g.numel(); ++i) grad[static_cast<std::size_t>(i)] = g.get(i);
      RefScales scales;
      reference_step(states[k], adamw(), t, grad, multiplier, RefBug::none, &scales);
      if (k == 0) step_sizes.push_back(scales.step_size);
    }
  }
};

// Every rank's full-precision values against the reference, within the free-running
// tolerance of the steps taken.
void check_against_reference(const World& world, const Reference& ref) {
  const Problem& prob = problem();
  double allowance = 0.0;
  for (double step_size : ref.step_sizes)
    allowance += free_running_allowance(step_size, Storage::f32);
  for (int r = 0; r < kRanks; ++r) {
    const Rank& rank = *world.ranks[static_cast<std::size_t>(r)];
    for (std::size_t k = 0; k < prob.params.size(); ++k) {
      const GlobalParam& g = prob.params[k];
      const Box& box = rank.box(k);
      // The full-precision value: the fp32 param, or the fp32 master of the bf16 one.
      std::vector<double> got(static_cast<std::size_t>(numel_of(box.shape)));
      if (g.master == SA_MASTER_FP32) {
        const StateView master = state_view(rank.opt(), static_cast<int64_t>(k), "master");
        for (std::size_t i = 0; i < got.size(); ++i) got[i] = master.get(static_cast<int64_t>(i));
      } else {
        for (std::size_t i = 0; i < got.size(); ++i)
          got[i] = rank.param(k).get(static_cast<int64_t>(i));
      }
      std::vector<double> want_box(got.size());
      copy_box(ref.states[k].value.data(), want_box.data(), g.shape, box, sizeof(double), true);
      Worst worst("rank " + std::to_string(r) + " param '" + g.name + "'");
      for (std::size_t i = 0; i < got.size(); ++i)
        worst.add(static_cast<int64_t>(i), got[i], want_box[i],
                  step_value_tolerance(want_box[i], ref.step_sizes.back()) + allowance);
      INFO(worst.describe());
      CHECK(worst.ok());
    }
  }
}

std::vector<std::vector<unsigned char>> all_param_bytes(const World& world) {
  std::vector<std::vector<unsigned char>> out;
  for (const auto& rank : world.ranks)
    for (std::size_t k = 0; k < problem().params.size(); ++k)
      out.push_back(rank->param(k).raw_bytes());
  return out;
}

void require_all_ok(const std::vector<Rank::Outcome>& outcomes) {
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    INFO("rank " << r << ": " << sa_status_string(outcomes[r].status) << ": " << outcomes[r].error);
    REQUIRE(outcomes[r].status == SA_OK);
  }
}

}  // namespace

TEST_CASE("the problem clips: its grads' norm is well above the bound used below", "[clip]") {
  // Otherwise the clipping tests would pass with clipping switched off.
  for (int s = 0; s < kSteps; ++s) CHECK(reference_norm(s, SA_NORM_L2) > 1.2 * kMaxNormL2);
  for (int s = 0; s < kSteps; ++s) CHECK(reference_norm(s, SA_NORM_INF) > 1.2 * kMaxNormInf);
}

TEST_CASE(
    "4 ranks with a host communicator: the global norm (L2 summed, inf maxed) and the clipped "
    "AdamW step match a float64 reference on the full tensors",
    "[clip][comm]") {
  const int32_t norm_type = GENERATE(SA_NORM_L2, SA_NORM_INF);
  INFO((norm_type == SA_NORM_L2 ? "L2 norm" : "inf norm"));
  World world;
  Reference ref;
  const double max_norm = norm_type == SA_NORM_L2 ? kMaxNormL2 : kMaxNormInf;
  for (int s = 0; s < kSteps; ++s) {
    for (auto& rank : world.ranks) rank->load_grads(s);
    const auto outcomes = world.step(max_norm, norm_type);
    require_all_ok(outcomes);
    const double want = reference_norm(s, norm_type);
    for (int r = 0; r < kRanks; ++r) {
      INFO("step " << s << ", rank " << r);
      CHECK(outcomes[r].skipped == 0);
      // Each element once: counting the replicas of 'b', 'n' twice would be off by far more
      // (and a max is exact).
      CHECK(std::fabs(outcomes[r].norm - want) <= (norm_type == SA_NORM_L2 ? 1e-12 * want : 0.0));
      // Every rank got the same bits, so every rank clips by the same float.
      CHECK(outcomes[r].norm == outcomes[0].norm);
      CHECK(outcomes[r].device_norm == static_cast<float>(outcomes[r].norm));
    }
    ref.step(s, clip_coefficient(want, max_norm));
  }
  CHECK(world.group.calls() == kSteps * kRanks);
  CHECK(world.group.last_op() == (norm_type == SA_NORM_L2 ? SA_REDUCE_SUM : SA_REDUCE_MAX));
  for (const auto& rank : world.ranks) CHECK(step_count(rank->opt(), 0) == kSteps);
  check_against_reference(world, ref);
}

TEST_CASE("4 ranks: a bound above the norm, or INFINITY, measures without clipping",
          "[clip][comm]") {
  World world;
  Reference ref;
  for (int s = 0; s < 2; ++s) {
    for (auto& rank : world.ranks) rank->load_grads(s);
    const double bound = s == 0 ? std::numeric_limits<double>::infinity() : 1e6;
    const auto outcomes = world.step(bound, SA_NORM_L2);
    require_all_ok(outcomes);
    CHECK(std::fabs(outcomes[0].norm - reference_norm(s, SA_NORM_L2)) <= 1e-12 * outcomes[0].norm);
    ref.step(s, 1.0);
  }
  check_against_reference(world, ref);
}

TEST_CASE("4 ranks: found_inf on one rank, or a NaN grad on one rank, skips the step on all ranks",
          "[clip][comm]") {
  World world;
  Reference ref;
  const double max_norm = kMaxNormL2;
  auto clipped_step = [&](int s) {
    for (auto& rank : world.ranks) rank->load_grads(s);
    require_all_ok(world.step(max_norm, SA_NORM_L2));
    ref.step(s, clip_coefficient(reference_norm(s, SA_NORM_L2), max_norm));
  };
  clipped_step(0);
  const auto before = all_param_bytes(world);

  SECTION("found_inf set on rank 2 only (with clipping)") {
    for (auto& rank : world.ranks) rank->load_grads(1);
    const auto outcomes = world.step(max_norm, SA_NORM_L2, {0.0f, 0.0f, 1.0f, 0.0f});
    require_all_ok(outcomes);
    for (const auto& o : outcomes) CHECK(o.skipped == 1);
  }
  SECTION("found_inf set on rank 0 only (no clipping: a found-inf consensus alone)") {
    for (auto& rank : world.ranks) rank->load_grads(1);
    const auto outcomes = world.step(0.0, SA_NORM_L2, {1.0f, 0.0f, 0.0f, 0.0f});
    require_all_ok(outcomes);
    for (const auto& o : outcomes) CHECK(o.skipped == 1);
  }
  SECTION("a NaN in rank 1's shard of 'w'") {
    for (auto& rank : world.ranks) rank->load_grads(1);
    world.ranks[1]->grad(0).set(4, std::numeric_limits<float>::quiet_NaN());
    const auto outcomes = world.step(max_norm, SA_NORM_L2);
    require_all_ok(outcomes);
    for (const auto& o : outcomes) {
      CHECK(o.skipped == 1);
      CHECK(std::isnan(o.norm));
    }
  }
  SECTION("an infinite grad on rank 3 under the inf norm") {
    for (auto& rank : world.ranks) rank->load_grads(1);
    world.ranks[3]->grad(0).set(0, std::numeric_limits<float>::infinity());
    const auto outcomes = world.step(max_norm, SA_NORM_INF);
    require_all_ok(outcomes);
    for (const auto& o : outcomes) {
      CHECK(o.skipped == 1);
      CHECK(std::isinf(o.norm));
    }
  }
  // Nothing moved anywhere, and no step count advanced.
  CHECK(all_param_bytes(world) == before);
  for (const auto& rank : world.ranks) CHECK(step_count(rank->opt(), 0) == 1);
  // The next good step is the reference's second.
  clipped_step(1);
  check_against_reference(world, ref);
}

TEST_CASE(
    "without a communicator the norm is the rank's own: one unsharded optimizer clips like the "
    "reference, with SIMD and scalar code",
    "[clip]") {
  const int32_t simd = GENERATE(0, 1);
  INFO("cpu_simd " << simd);
  const Problem& prob = problem();
  std::vector<HostTensor> params, grads;  // first: they outlive the optimizer that updates them
  OptimizerPtr opt = make_optimizer(2, simd);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &adamw(), nullptr));
  for (std::size_t k = 0; k < prob.params.size(); ++k) {
    const GlobalParam& g = prob.params[k];
    params.emplace_back(g.shape, g.dtype);
    grads.emplace_back(g.shape, g.grad_dtype);
    std::memcpy(params.back().data(), prob.initial[k].data(), prob.initial[k].bytes());
  }
  for (std::size_t k = 0; k < prob.params.size(); ++k) {
    const GlobalParam& g = prob.params[k];
    const sa_param_options options = param_options(g.grad_dtype, g.moment_dtype, g.master);
    REQUIRE_SA_OK(opt.get(),
                  sa_optimizer_add_param(opt.get(), g.name.c_str(), 0, params[k].versioned(),
                                         nullptr, &options, nullptr));
    const DLTensor grad = grads[k].dl();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), static_cast<int64_t>(k), &grad));
  }
  Reference ref;
  for (int s = 0; s < kSteps; ++s) {
    for (std::size_t k = 0; k < prob.params.size(); ++k)
      std::memcpy(grads[k].data(), prob.grads[static_cast<std::size_t>(s)][k].data(),
                  grads[k].bytes());
    double norm = -1.0;
    sa_step_args args = SA_STEP_ARGS_INIT;
    args.max_grad_norm = 1.0;
    args.host_grad_norm = &norm;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), &args, nullptr));
    const double want = reference_norm(s, SA_NORM_L2);
    CHECK(std::fabs(norm - want) <= 1e-12 * want);
    ref.step(s, clip_coefficient(want, 1.0));
  }
  const StateView master = state_view(opt.get(), 4, "master");
  Worst worst("unsharded");
  for (std::size_t k = 0; k < prob.params.size(); ++k)
    for (int64_t i = 0; i < params[k].numel(); ++i) {
      const double got = prob.params[k].master == SA_MASTER_FP32 ? master.get(i) : params[k].get(i);
      const double want = ref.states[k].value[static_cast<std::size_t>(i)];
      worst.add(i, got, want,
                step_value_tolerance(want, ref.step_sizes.back()) + 2e-4 * ref.step_sizes.back());
    }
  INFO(worst.describe());
  CHECK(worst.ok());
}

// ---- bad input --------------------------------------------------------------------------------

namespace {

struct Counting {
  int calls = 0;
  int releases = 0;
  int result = 0;
};

int counting_all_reduce(void* ctx, double*, int32_t, sa_reduce_op) {
  auto* c = static_cast<Counting*>(ctx);
  ++c->calls;
  return c->result;
}
void counting_release(void* ctx) { ++static_cast<Counting*>(ctx)->releases; }

sa_host_comm counting_callbacks(Counting& counting) {
  sa_host_comm callbacks = SA_HOST_COMM_INIT;
  callbacks.ctx = &counting;
  callbacks.all_reduce = counting_all_reduce;
  callbacks.release = counting_release;
  return callbacks;
}

// One fp32 param of 8 elements with a bound grad.
struct OneParam {
  HostTensor param{{8}, kFloat32};
  HostTensor grad{{8}, kFloat32};
  OptimizerPtr opt = make_optimizer(1, 1);
  OneParam() {
    for (int64_t i = 0; i < 8; ++i) {
      param.set(i, 0.5f * static_cast<float>(i));
      grad.set(i, 1.0f + static_cast<float>(i));
    }
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &adamw(), nullptr));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "p", 0, param.versioned(), nullptr,
                                                    nullptr, nullptr));
    const DLTensor g = grad.dl();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
  }
};

}  // namespace

TEST_CASE("bad clipping arguments are refused before anything changes", "[clip][errors]") {
  OneParam one;
  sa_optimizer* opt = one.opt.get();
  const auto before = one.param.raw_bytes();
  float norm_out = 0.0f;
  double host_norm = 0.0;
  sa_step_args args = SA_STEP_ARGS_INIT;

  args.max_grad_norm = -1.0;
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step(opt, &args, nullptr),
                 "max_grad_norm is -1", "it must be >= 0 (INFINITY too)");
  args.max_grad_norm = std::numeric_limits<double>::quiet_NaN();
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step(opt, &args, nullptr),
                 "max_grad_norm is nan", "it must be >= 0");
  args.max_grad_norm = -std::numeric_limits<double>::infinity();
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step(opt, &args, nullptr),
                 "max_grad_norm is -inf");
  args.max_grad_norm = 1.0;
  args.norm_type = 7;
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step(opt, &args, nullptr),
                 "norm_type is 7", "SA_NORM_L2 (0) or SA_NORM_INF (1)");
  args = SA_STEP_ARGS_INIT;
  args.grad_norm = &norm_out;
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step(opt, &args, nullptr),
                 "max_grad_norm is 0");
  args.grad_norm = nullptr;
  args.host_grad_norm = &host_norm;
  CHECK_SA_FAILS(opt, SA_ERR_INVALID_ARGUMENT, sa_optimizer_step(opt, &args, nullptr),
                 "max_grad_norm is 0");

  CHECK(one.param.raw_bytes() == before);
  CHECK(step_count(opt, 0) == 0);
}

TEST_CASE("a failing communicator fails the step with SA_ERR_COMM and changes nothing",
          "[clip][comm][errors]") {
  OneParam one;
  sa_optimizer* opt = one.opt.get();
  Counting counting;
  counting.result = 3;
  {
    CommPtr comm = host_comm(counting_callbacks(counting));
    REQUIRE_SA_OK(opt, sa_optimizer_set_comm(opt, comm.get()));
  }  // the optimizer keeps the communicator alive
  CHECK(counting.releases == 0);
  const auto before = one.param.raw_bytes();
  sa_step_args args = SA_STEP_ARGS_INIT;
  args.max_grad_norm = 1.0;
  CHECK_SA_FAILS(opt, SA_ERR_COMM, sa_optimizer_step(opt, &args, nullptr), "all_reduce",
                 "returned 3");
  CHECK(counting.calls == 1);
  CHECK(one.param.raw_bytes() == before);
  CHECK(step_count(opt, 0) == 0);

  // A step that needs neither a norm nor a found-inf consensus does not communicate.
  REQUIRE_SA_OK(opt, sa_optimizer_step(opt, nullptr, nullptr));
  CHECK(counting.calls == 1);
  CHECK(step_count(opt, 0) == 1);

  // Detaching releases the last reference: release runs exactly once.
  REQUIRE_SA_OK(opt, sa_optimizer_set_comm(opt, nullptr));
  CHECK(counting.releases == 1);
}

TEST_CASE("communicator handles: bad arguments, info, and lifetime", "[comm][errors]") {
  sa_comm* comm = nullptr;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_comm_create_host(nullptr, &comm), "NULL");
  sa_host_comm no_reduce = SA_HOST_COMM_INIT;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_comm_create_host(&no_reduce, &comm),
                 "all_reduce is NULL");
  CHECK(comm == nullptr);
  sa_host_comm too_new = SA_HOST_COMM_INIT;
  too_new.struct_size = sizeof(sa_host_comm) + 8;
  CHECK_SA_FAILS(nullptr, SA_ERR_UNSUPPORTED, sa_comm_create_host(&too_new, &comm), "struct_size");

  Counting counting;
  {
    CommPtr host = host_comm(counting_callbacks(counting));
    int32_t rank = 0, nranks = 0;
    REQUIRE_SA_OK(nullptr, sa_comm_info(host.get(), &rank, &nranks));
    CHECK(rank == -1);
    CHECK(nranks == -1);
  }
  CHECK(counting.releases == 1);
  sa_comm_destroy(nullptr);  // ignored

  const bool with_nccl = std::string(sa_build_info()).find("nccl: built") != std::string::npos;
  sa_nccl_unique_id id{};
  if (with_nccl) {
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_comm_create_nccl(&id, 0, 0, 0, &comm),
                   "nranks is 0");
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_comm_create_nccl(&id, 2, 2, 0, &comm),
                   "rank is 2");
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_comm_wrap_nccl(nullptr, &comm), "NULL");
  } else {
    // No CUDA module, or one without NCCL: either way the message says so and what to use.
    CHECK_SA_FAILS(nullptr, SA_ERR_UNSUPPORTED, sa_nccl_unique_id_create(&id), "NCCL",
                   "sa_comm_create_host");
    CHECK_SA_FAILS(nullptr, SA_ERR_UNSUPPORTED, sa_comm_create_nccl(&id, 1, 0, 0, &comm), "NCCL",
                   "sa_comm_create_host");
  }
  CHECK(comm == nullptr);
}

TEST_CASE("an optimizer without params still takes part in the collective", "[clip][comm]") {
  // A rank that holds no params must not leave the others waiting in the all-reduce.
  OptimizerPtr opt = make_optimizer(1, 1);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &adamw(), nullptr));
  Counting counting;
  CommPtr comm = host_comm(counting_callbacks(counting));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_comm(opt.get(), comm.get()));
  sa_step_args args = SA_STEP_ARGS_INIT;
  args.max_grad_norm = 1.0;
  double norm = -1.0;
  args.host_grad_norm = &norm;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), &args, nullptr));
  CHECK(counting.calls == 1);
  CHECK(norm == 0.0);  // the callback left the zero partial as it was
  CHECK(step_count(opt.get(), 0) == 1);
}

TEST_CASE("the C++ wrapper's Comm::host: a lambda reduces, a throwing one fails the step cleanly",
          "[clip][comm][cpp]") {
  HostTensor param({8}, kFloat32), grad({8}, kFloat32);
  for (int64_t i = 0; i < 8; ++i) grad.set(i, 3.0f);  // norm sqrt(72)
  shardadam::Optimizer opt;
  opt.add_group(adamw());
  const int64_t p = opt.add_param("p", 0, param.versioned(), nullptr);
  const DLTensor g = grad.dl();
  opt.set_grad(p, g);
  int calls = 0;
  {
    shardadam::Comm comm =
        shardadam::Comm::host([&](double* values, int32_t count, sa_reduce_op op) {
          ++calls;
          return count == 2 && op == SA_REDUCE_SUM && values[0] == 72.0;
        });
    opt.set_comm(comm);
  }  // the optimizer keeps it
  sa_step_args args = shardadam::default_step_args();
  double norm = 0.0;
  args.max_grad_norm = 1.0;
  args.host_grad_norm = &norm;
  opt.step(&args);
  CHECK(calls == 1);
  CHECK(norm == std::sqrt(72.0));

  opt.set_comm(shardadam::Comm::host(
      [](double*, int32_t, sa_reduce_op) -> bool { throw std::runtime_error("x"); }));
  try {
    opt.step(&args);
    FAIL("the step should have thrown");
  } catch (const shardadam::Error& e) {
    CHECK(e.status() == SA_ERR_COMM);
  }
  CHECK(opt.step_count(0) == 1);
}
