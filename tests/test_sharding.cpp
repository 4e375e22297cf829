// tests/test_sharding.cpp — sharding changes nothing: N optimizers, one per simulated rank,
// each holding its local shards of the same global params, end up bit for bit where one
// unsharded optimizer does, whatever the mesh (uneven 1-D splits with empty ranks, 2-D
// blocks, HSDP replicas, explicit boxes), the thread count and SIMD or scalar code.
//
// The expected values come from one unsharded optimizer running single-threaded scalar
// code; its agreement with the float64 reference is test_optimizer_reference.cpp's job.
#include <functional>
#include <map>

#include "test_ranks.hpp"
#include "test_support.hpp"

namespace {

using namespace sa_test;

constexpr int kSteps = 20;

// Group 0: AdamW. Group 1: Adam with L2 decay and amsgrad.
std::vector<sa_group_config> groups() {
  sa_group_config adamw = group_config(1e-2, 1e-2, 1);
  sa_group_config adam = group_config(5e-3, 1e-2, 0);
  adam.amsgrad = 1;
  return {adamw, adam};
}

// Every param is 2-D, so that every placement below applies to all of them. "big" has
// more elements than one work chunk of the CPU backend, so threads split it.
std::vector<GlobalParam> global_params() {
  return {
      {"f32", {9, 37}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"f32.amsgrad", {9, 37}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 1},
      {"bf16.master", {9, 37}, kBfloat16, kBfloat16, kFloat32, SA_MASTER_FP32, 0},
      {"bf16.master.amsgrad.bf16moments",
       {9, 37},
       kBfloat16,
       kFloat32,
       kBfloat16,
       SA_MASTER_FP32,
       1},
      {"bf16.remainder", {9, 37}, kBfloat16, kBfloat16, kFloat32, SA_MASTER_REMAINDER, 0},
      {"bf16.remainder.amsgrad.bf16moments",
       {9, 37},
       kBfloat16,
       kBfloat16,
       kBfloat16,
       SA_MASTER_REMAINDER,
       1},
      {"f16.master", {9, 37}, kFloat16, kFloat16, kFloat32, SA_MASTER_FP32, 0},
      {"empty", {0, 37}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"big", {301, 263}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 1},
  };
}

const Problem& problem() {
  static const Problem p(global_params(), kSteps, 4242);
  return p;
}

std::vector<const char*> state_keys(const GlobalParam& p) {
  std::vector<const char*> keys = {"exp_avg", "exp_avg_sq"};
  if (groups()[p.group].amsgrad) keys.push_back("max_exp_avg_sq");
  if (p.master == SA_MASTER_FP32) keys.push_back("master");
  if (p.master == SA_MASTER_REMAINDER) keys.push_back("remainder");
  return keys;
}

// ---- running -----------------------------------------------------------------------------------

// Final params and states of every param, as global arrays (the unsharded run) or boxes.
struct ParamResult {
  std::vector<unsigned char> param;
  std::map<std::string, std::vector<unsigned char>> states;
};

// One simulated rank of `scenario`, fed the boxes of the global grads.
class Rank : public RankShards {
 public:
  Rank(const Scenario& scenario, int64_t rank, int32_t threads, int32_t simd)
      : RankShards(
            problem(), groups(),
            [&](std::size_t k) { return scenario.place(problem().params[k].shape, rank); }, threads, simd) {}

  void step(int s) {
    load_grads(s);
    REQUIRE_SA_OK(opt(), sa_optimizer_step(opt(), nullptr, nullptr));
  }

  ParamResult result(std::size_t k) const {
    ParamResult r;
    r.param = param(k).raw_bytes();
    for (const char* key : state_keys(problem().params[k]))
      r.states[key] = state_view(opt(), static_cast<int64_t>(k), key).raw_bytes();
    return r;
  }
};

// The expected result: one unsharded optimizer, one thread, scalar code.
const std::vector<ParamResult>& unsharded() {
  static const std::vector<ParamResult> results = [] {
    const Scenario whole = mesh_scenario("unsharded", {}, {});
    Rank single(whole, 0, 1, 0);
    for (int s = 0; s < kSteps; ++s) single.step(s);
    std::vector<ParamResult> out;
    for (std::size_t k = 0; k < problem().params.size(); ++k) out.push_back(single.result(k));
    return out;
  }();
  return results;
}

// Runs every rank of `scenario` for kSteps and checks each rank's params and states
// bitwise against the boxes of the unsharded result.
void check_scenario(const Scenario& scenario) {
  const Problem& prob = problem();
  const auto& expected = unsharded();
  for (int32_t threads : {1, 2}) {
    for (int32_t simd : {0, 1}) {
      INFO(scenario.label << ", num_threads " << threads << ", cpu_simd " << simd);
      std::vector<std::unique_ptr<Rank>> ranks;
      for (int64_t r = 0; r < scenario.ranks; ++r)
        ranks.push_back(std::make_unique<Rank>(scenario, r, threads, simd));
      for (int s = 0; s < kSteps; ++s)
        for (auto& rank : ranks) rank->step(s);

      for (int64_t r = 0; r < scenario.ranks; ++r) {
        const Rank& rank = *ranks[static_cast<std::size_t>(r)];
        CHECK(step_count(rank.opt(), 0) == kSteps);
        CHECK(step_count(rank.opt(), 1) == kSteps);
        for (std::size_t k = 0; k < prob.params.size(); ++k) {
          const GlobalParam& g = prob.params[k];
          const Box& box = rank.box(k);
          INFO("rank " << r << ", param '" << g.name << "', box offset "
                       << Catch::Detail::stringify(box.offset) << " shape "
                       << Catch::Detail::stringify(box.shape));
          const ParamResult got = rank.result(k);
          CHECK(got.param == bytes_of_box(expected[k].param, g.shape, box, dtype_bytes(g.dtype)));
          for (const char* key : state_keys(g)) {
            INFO("state " << key);
            CHECK(got.states.at(key) ==
                  bytes_of_box(expected[k].states.at(key), g.shape, box, state_elem_size(key, g)));
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("the unsharded expectation moved every param away from its initial value", "[sharding]") {
  // Guards the tests below against comparing runs that did nothing.
  const Problem& prob = problem();
  for (std::size_t k = 0; k < prob.params.size(); ++k) {
    if (prob.initial[k].numel() == 0) continue;
    INFO(prob.params[k].name);
    CHECK(unsharded()[k].param != prob.initial[k].raw_bytes());
  }
}

TEST_CASE(
    "1-D meshes of 2, 3, 4, 5 and 7 ranks with uneven Shard(0) (empty ranks included) match the "
    "unsharded run bitwise",
    "[sharding]") {
  // 9 rows: 5,4 | 3,3,3 | 3,3,3,0 | 2,2,2,2,1 | 2,2,2,2,1,0,0.
  for (int64_t ranks : {2, 3, 4, 5, 7})
    check_scenario(mesh_scenario("Shard(0) over " + std::to_string(ranks), {ranks}, {shard(0)}));
}

TEST_CASE(
    "1-D meshes of 2, 3, 4, 5 and 7 ranks with uneven Shard(1) match the unsharded run bitwise",
    "[sharding]") {
  // 37 columns over 7: 6,6,6,6,6,6,1; "big"'s 263 over 5: 53,53,53,53,51. Each rank's box
  // is a strided block of the global tensor.
  for (int64_t ranks : {2, 3, 4, 5, 7})
    check_scenario(mesh_scenario("Shard(1) over " + std::to_string(ranks), {ranks}, {shard(-1)}));
}

TEST_CASE("a 2x2 mesh with Shard(0),Shard(1) matches the unsharded run bitwise", "[sharding]") {
  check_scenario(mesh_scenario("2x2 Shard(0),Shard(1)", {2, 2}, {shard(0), shard(1)}));
}

TEST_CASE("a (4,2) mesh nesting Shard(0),Shard(0) matches the unsharded run bitwise",
          "[sharding]") {
  check_scenario(mesh_scenario("4x2 Shard(0),Shard(0)", {4, 2}, {shard(0), shard(0)}));
}

TEST_CASE("an HSDP mesh (Replicate, Shard(0)): every replica matches the unsharded run bitwise",
          "[sharding]") {
  check_scenario(mesh_scenario("2x3 Replicate,Shard(0)", {2, 3}, {replicate(), shard(0)}));
}

TEST_CASE("explicit-box layouts with an empty box match the unsharded run bitwise", "[sharding]") {
  check_scenario(box_scenario());
}
