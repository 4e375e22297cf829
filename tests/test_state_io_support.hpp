// tests/test_state_io_support.hpp — what the shard-file tests share: a seeded problem
// (params of every storage variant, groups, grads), simulated ranks that train, export to
// memory blobs and import them, the unsharded expectation, and snapshots that show an
// optimizer unchanged by a failed import.
//
// The expected state after resharding is that of one unsharded optimizer trained on the
// same data: sharded training is bit for bit equal to unsharded training (test_sharding.cpp),
// so a correct save/load on any layout must reproduce the unsharded state exactly.
#ifndef SHARDADAM_TESTS_TEST_STATE_IO_SUPPORT_HPP_
#define SHARDADAM_TESTS_TEST_STATE_IO_SUPPORT_HPP_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "test_ranks.hpp"
#include "test_support.hpp"

namespace sa_test {

using Bytes = std::vector<unsigned char>;

// Group 0: AdamW. Group 1: Adam with L2 decay and amsgrad.
inline std::vector<sa_group_config> io_groups() {
  sa_group_config adamw = group_config(1e-2, 1e-2, 1);
  sa_group_config adam = group_config(5e-3, 1e-2, 0);
  adam.amsgrad = 1;
  adam.beta1 = 0.8;
  return {adamw, adam};
}

// The same groups with other hyperparameters (amsgrad kept: it shapes the state), for the
// optimizers an import must restore the saved ones into.
inline std::vector<sa_group_config> other_groups() {
  std::vector<sa_group_config> groups = io_groups();
  for (auto& g : groups) {
    g.lr *= 3;
    g.eps = 1e-6;
    g.beta2 = 0.99;
  }
  return groups;
}

// Every storage variant, all of 2 or more dims so every placement applies. "big" has
// states of ~2 MiB (several checksum blocks, runs crossing block boundaries); one name
// holds a '/', which the "<param>/<key>" naming must survive.
inline std::vector<GlobalParam> io_params() {
  return {
      {"f32", {9, 37}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"layers.0/f32.amsgrad", {9, 37}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 1},
      {"bf16.master", {9, 37}, kBfloat16, kBfloat16, kFloat32, SA_MASTER_FP32, 0},
      {"bf16.master.amsgrad.bf16moments", {9, 37}, kBfloat16, kFloat32, kBfloat16, SA_MASTER_FP32, 1},
      {"bf16.remainder", {9, 37}, kBfloat16, kBfloat16, kFloat32, SA_MASTER_REMAINDER, 0},
      {"bf16.remainder.amsgrad.bf16moments", {9, 37}, kBfloat16, kBfloat16, kBfloat16, SA_MASTER_REMAINDER, 1},
      {"f16.master", {9, 37}, kFloat16, kFloat16, kFloat32, SA_MASTER_FP32, 0},
      {"empty", {0, 37}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"3d", {5, 6, 7}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"big", {520, 1031}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 1},
  };
}

inline std::vector<const char*> state_keys(const GlobalParam& p) {
  std::vector<const char*> keys = {"exp_avg", "exp_avg_sq"};
  if (io_groups()[static_cast<std::size_t>(p.group)].amsgrad) keys.push_back("max_exp_avg_sq");
  if (p.master == SA_MASTER_FP32) keys.push_back("master");
  if (p.master == SA_MASTER_REMAINDER) keys.push_back("remainder");
  if (same_dtype(p.moment_dtype, kUint8)) {  // 8-bit moments: their block absmax values too
    const std::size_t moments = keys.size() >= 3 && std::string(keys[2]) == "max_exp_avg_sq" ? 3 : 2;
    const char* absmax[] = {"exp_avg_absmax", "exp_avg_sq_absmax", "max_exp_avg_sq_absmax"};
    for (std::size_t k = 0; k < moments; ++k) keys.push_back(absmax[k]);
  }
  return keys;
}

inline const Problem& io_problem() {
  static const Problem p(io_params());
  return p;
}

// A param's final value and states as global arrays (the unsharded run).
struct GlobalResult {
  Bytes param;
  std::map<std::string, Bytes> states;
};

// ---- blobs ----------------------------------------------------------------------------------

// Memory readers of `blobs`, which must outlive this.
struct Readers {
  std::vector<sa_reader> readers;
  std::vector<const sa_reader*> pointers;
  explicit Readers(const std::vector<Bytes>& blobs) : readers(blobs.size()) {
    for (std::size_t i = 0; i < blobs.size(); ++i) {
      REQUIRE_SA_OK(nullptr, sa_memory_reader(blobs[i].data(), blobs[i].size(), &readers[i]));
      pointers.push_back(&readers[i]);
    }
  }
  Readers(const Readers&) = delete;
  Readers& operator=(const Readers&) = delete;
  ~Readers() {
    for (sa_reader& r : readers) sa_reader_release(&r);
  }
  int32_t n() const { return static_cast<int32_t>(pointers.size()); }
  const sa_reader* const* data() const { return pointers.data(); }
};

// A writer callback that only appends (a table without write_at or reserve, as a user's may
// be), into the Bytes at ctx.
inline int append_to_vector(void* ctx, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  static_cast<Bytes*>(ctx)->insert(static_cast<Bytes*>(ctx)->end(), p, p + bytes);
  return 0;
}

// What an export writes through an appending writer (append_to_vector: two passes).
inline Bytes export_appended(sa_optimizer* opt) {
  Bytes appended;
  sa_writer appender = SA_WRITER_INIT;
  appender.ctx = &appended;
  appender.write = append_to_vector;
  REQUIRE_SA_OK(opt, sa_optimizer_export(opt, &appender));
  return appended;
}

inline Bytes export_blob(sa_optimizer* opt) {
  sa_writer writer = SA_WRITER_INIT;
  REQUIRE_SA_OK(nullptr, sa_memory_writer(&writer));
  REQUIRE_SA_OK(opt, sa_optimizer_export(opt, &writer));
  const void* data = nullptr;
  std::size_t size = 0;
  REQUIRE_SA_OK(nullptr, sa_memory_writer_data(&writer, &data, &size));
  const auto* p = static_cast<const unsigned char*>(data);
  Bytes out(p, p + size);
  sa_writer_release(&writer);
  return out;
}

inline sa_status import_blobs(sa_optimizer* opt, const std::vector<Bytes>& blobs,
                              const sa_import_options* options = nullptr) {
  Readers readers(blobs);
  return sa_optimizer_import(opt, readers.n(), readers.data(), options);
}

inline sa_import_options import_options(uint64_t staging_bytes = 0) {
  sa_import_options o = SA_IMPORT_OPTIONS_INIT;
  o.staging_bytes = staging_bytes;
  return o;
}

// ---- simulated ranks ------------------------------------------------------------------------

class Rank : public RankShards {
 public:
  // Params start at `values` (global arrays, one per problem param, in the param dtype);
  // groups are created from `groups`.
  Rank(const Problem& prob, const Scenario& scenario, int64_t rank, const std::vector<Bytes>& values,
       const std::vector<sa_group_config>& groups = io_groups(), int32_t threads = 1, int32_t simd = 1)
      : RankShards(
            prob, groups, [&](std::size_t k) { return scenario.place(prob.params[k].shape, rank); }, threads,
            simd, &values),
        prob_(prob) {}

  void step(int s) {
    load_grads(s);
    REQUIRE_SA_OK(opt(), sa_optimizer_step(opt(), nullptr, nullptr));
  }

  Bytes param_bytes(std::size_t k) const { return param(k).raw_bytes(); }
  Bytes state_bytes(std::size_t k, const char* key) const {
    return state_view(opt(), static_cast<int64_t>(k), key).raw_bytes();
  }
  Bytes export_blob() const { return sa_test::export_blob(opt()); }

  GlobalResult result(std::size_t k) const {
    GlobalResult r;
    r.param = param_bytes(k);
    for (const char* key : state_keys(prob_.params[k])) r.states[key] = state_bytes(k, key);
    return r;
  }

 private:
  const Problem& prob_;
};

inline std::vector<std::unique_ptr<Rank>> make_ranks(const Problem& prob, const Scenario& scenario,
                                                     const std::vector<Bytes>& values,
                                                     const std::vector<sa_group_config>& groups = io_groups()) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int64_t r = 0; r < scenario.ranks; ++r)
    ranks.push_back(std::make_unique<Rank>(prob, scenario, r, values, groups));
  return ranks;
}

inline Scenario unsharded_scenario() { return mesh_scenario("unsharded", {}, {}); }

// One unsharded optimizer (one thread, scalar code) after `steps` steps: every param's
// value and states as global arrays.
inline std::vector<GlobalResult> unsharded_after(const Problem& prob, int steps) {
  Rank single(prob, unsharded_scenario(), 0, prob.initial_values(), io_groups(), 1, 0);
  for (int s = 0; s < steps; ++s) single.step(s);
  std::vector<GlobalResult> out;
  for (std::size_t k = 0; k < prob.params.size(); ++k) out.push_back(single.result(k));
  return out;
}

inline std::vector<Bytes> param_values(const std::vector<GlobalResult>& results) {
  std::vector<Bytes> out;
  for (const GlobalResult& r : results) out.push_back(r.param);
  return out;
}

// Every state of every param of `rank` equals its box of `expected`, bit for bit; with
// `params`, the params too.
inline void check_rank_matches(const Problem& prob, const Rank& rank, const std::vector<GlobalResult>& expected,
                               bool params) {
  for (std::size_t k = 0; k < prob.params.size(); ++k) {
    const GlobalParam& g = prob.params[k];
    const Box& box = rank.box(k);
    INFO("param '" << g.name << "', box offset " << Catch::Detail::stringify(box.offset) << " shape "
                   << Catch::Detail::stringify(box.shape));
    if (params) CHECK(rank.param_bytes(k) == bytes_of_box(expected[k].param, g.shape, box, dtype_bytes(g.dtype)));
    for (const char* key : state_keys(g)) {
      INFO("state " << key);
      CHECK(rank.state_bytes(k, key) ==
            bytes_of_box(expected[k].states.at(key), g.shape, box, state_elem_size(key, g)));
    }
  }
}

inline void check_groups_restored(sa_optimizer* opt, const std::vector<sa_group_config>& groups, int64_t step) {
  for (std::size_t g = 0; g < groups.size(); ++g) {
    INFO("group " << g);
    sa_group_config got = SA_GROUP_CONFIG_INIT;
    REQUIRE_SA_OK(opt, sa_optimizer_get_group(opt, static_cast<int32_t>(g), &got));
    CHECK(std::memcmp(&got, &groups[g], sizeof got) == 0);
    CHECK(step_count(opt, static_cast<int32_t>(g)) == step);
  }
}

// ---- "nothing changed" ----------------------------------------------------------------------

// Everything an import could change: every state's bytes, the groups and step counts (the
// groups' and the params'), and whether a step is allowed.
struct Snapshot {
  std::vector<std::map<std::string, Bytes>> states;
  std::vector<Bytes> groups;
  std::vector<int64_t> steps;
  std::vector<int64_t> param_steps;

  bool operator==(const Snapshot& o) const {
    return states == o.states && groups == o.groups && steps == o.steps && param_steps == o.param_steps;
  }
};

inline Snapshot snapshot(sa_optimizer* opt, const Problem& prob) {
  Snapshot s;
  for (std::size_t k = 0; k < prob.params.size(); ++k) {
    s.states.emplace_back();
    for (const char* key : state_keys(prob.params[k]))
      s.states.back()[key] = state_view(opt, static_cast<int64_t>(k), key).raw_bytes();
  }
  for (int32_t g = 0; g < sa_optimizer_num_groups(opt); ++g) {
    sa_group_config c = SA_GROUP_CONFIG_INIT;
    REQUIRE_SA_OK(opt, sa_optimizer_get_group(opt, g, &c));
    const auto* p = reinterpret_cast<const unsigned char*>(&c);
    s.groups.emplace_back(p, p + sizeof c);
    s.steps.push_back(step_count(opt, g));
  }
  s.param_steps.assign(static_cast<std::size_t>(sa_optimizer_num_params(opt)), -1);
  REQUIRE_SA_OK(opt, sa_optimizer_get_param_steps(opt, 0, sa_optimizer_num_params(opt), s.param_steps.data()));
  return s;
}

}  // namespace sa_test

#endif  // SHARDADAM_TESTS_TEST_STATE_IO_SUPPORT_HPP_
