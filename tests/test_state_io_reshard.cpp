// tests/test_state_io_reshard.cpp — a state saved on N ranks loads on M ranks of any layout:
// every loaded state is bit for bit the box of the unsharded state, the groups and step
// counts come back, and training on from the loaded state is bit for bit training without
// the interruption.
#include <cstdio>
#include <unistd.h>

#include <filesystem>

#include "../kernels/quant8.h"
#include "test_state_io_support.hpp"

namespace {

using namespace sa_test;

constexpr int kSaveAt = 3;  // steps before the save
constexpr int kSteps = 6;   // steps in all

const std::vector<GlobalResult>& expected_at_save() {
  static const std::vector<GlobalResult> r = unsharded_after(io_problem(), kSaveAt);
  return r;
}

const std::vector<GlobalResult>& expected_at_end() {
  static const std::vector<GlobalResult> r = unsharded_after(io_problem(), kSteps);
  return r;
}

// Trains `save` for kSaveAt steps and exports every rank.
std::vector<Bytes> train_and_save(const Scenario& save) {
  const Problem& prob = io_problem();
  auto ranks = make_ranks(prob, save, prob.initial_values());
  for (int s = 0; s < kSaveAt; ++s)
    for (auto& r : ranks) r->step(s);
  std::vector<Bytes> blobs;
  for (auto& r : ranks) blobs.push_back(r->export_blob());
  return blobs;
}

// Loads `blobs` into every rank of `load` (created with other hyperparameters and the
// params at their saved values), checks the state and the groups, trains to the end and
// checks params and states against the uninterrupted unsharded run.
void load_and_continue(const std::vector<Bytes>& blobs, const Scenario& load, uint64_t staging_bytes,
                       bool read_once = false) {
  const Problem& prob = io_problem();
  INFO("loaded on " << load.label << " (" << load.ranks << " ranks), staging_bytes " << staging_bytes
                    << (read_once ? ", read once" : ""));
  auto ranks = make_ranks(prob, load, param_values(expected_at_save()), other_groups());
  sa_import_options options = import_options(staging_bytes);
  options.read_once = read_once ? 1 : 0;
  for (int64_t r = 0; r < load.ranks; ++r) {
    INFO("rank " << r);
    Rank& rank = *ranks[static_cast<std::size_t>(r)];
    REQUIRE_SA_OK(rank.opt(), import_blobs(rank.opt(), blobs, &options));
    check_rank_matches(io_problem(), rank, expected_at_save(), true);
    check_groups_restored(rank.opt(), io_groups(), kSaveAt);
  }
  for (int s = kSaveAt; s < kSteps; ++s)
    for (auto& r : ranks) r->step(s);
  for (int64_t r = 0; r < load.ranks; ++r) {
    INFO("rank " << r << " after training on to step " << kSteps);
    check_rank_matches(io_problem(), *ranks[static_cast<std::size_t>(r)], expected_at_end(), true);
  }
}

void reshard(const Scenario& save, const std::vector<Scenario>& loads) {
  INFO("saved on " << save.label << " (" << save.ranks << " ranks)");
  const std::vector<Bytes> blobs = train_and_save(save);
  for (const Scenario& load : loads) load_and_continue(blobs, load, 0);
}

}  // namespace

TEST_CASE("the expectations moved: the states at the save differ from zero and from the end",
          "[state_io]") {
  // Guards the tests below against comparing states that nothing wrote.
  for (std::size_t k = 0; k < io_problem().params.size(); ++k) {
    if (io_problem().initial[k].numel() == 0) continue;
    INFO(io_problem().params[k].name);
    const Bytes& saved = expected_at_save()[k].states.at("exp_avg");
    CHECK(saved != Bytes(saved.size(), 0));
    CHECK(saved != expected_at_end()[k].states.at("exp_avg"));
  }
}

TEST_CASE("4 ranks of uneven Shard(0) (one empty) load on 1, 2 and 3 ranks bitwise", "[state_io]") {
  // 9 rows over 4: 3, 3, 3, 0; "big"'s 520 rows: 130 each; "3d"'s 5: 2, 2, 1, 0.
  reshard(mesh_scenario("Shard(0) over 4", {4}, {shard(0)}),
          {unsharded_scenario(), mesh_scenario("Shard(0) over 2", {2}, {shard(0)}),
           mesh_scenario("Shard(0) over 3", {3}, {shard(0)})});
}

TEST_CASE("a 2x2 mesh of Shard(0),Shard(1) loads on a 1-D mesh of 3, by rows and by columns",
          "[state_io]") {
  reshard(mesh_scenario("2x2 Shard(0),Shard(1)", {2, 2}, {shard(0), shard(1)}),
          {mesh_scenario("Shard(0) over 3", {3}, {shard(0)}),
           mesh_scenario("Shard(1) over 3", {3}, {shard(1)})});
}

TEST_CASE("HSDP (Replicate, Shard(0)): only replica 0 writes shards, and the files load anywhere",
          "[state_io]") {
  const Scenario hsdp = mesh_scenario("2x3 Replicate,Shard(0)", {2, 3}, {replicate(), shard(0)});
  const std::vector<Bytes> blobs = train_and_save(hsdp);
  std::size_t keys = 0;
  for (const GlobalParam& p : io_problem().params) keys += state_keys(p).size();
  // Ranks 3..5 are replica 1: their files hold the groups (every rank writes them) and no
  // tensor; a file's tensor count is visible to any safetensors reader as its entries.
  for (std::size_t r = 0; r < blobs.size(); ++r) {
    INFO("rank " << r);
    const std::vector<Bytes> file = {blobs[r]};
    Readers one(file);
    char* report = nullptr;
    REQUIRE_SA_OK(nullptr, sa_inspect(1, one.data(), 1, &report));
    const std::string text = report;
    sa_free(report);
    CHECK_THAT(text, Catch::Contains("\"tensors\": " + std::to_string(r < 3 ? keys : 0) + ","));
    CHECK_THAT(text, Catch::Contains("\"step\": 3"));
  }
  for (const Scenario& load : {mesh_scenario("Shard(1) over 2", {2}, {shard(1)}),
                               mesh_scenario("2x2 Replicate,Shard(0)", {2, 2}, {replicate(), shard(0)})})
    load_and_continue(blobs, load, 0);
  // Replica 1's files alone hold no state at all.
  auto lone = make_ranks(io_problem(), unsharded_scenario(), param_values(expected_at_save()));
  CHECK_SA_FAILS(lone[0]->opt(), SA_ERR_MISMATCH,
                 import_blobs(lone[0]->opt(), {blobs[3], blobs[4], blobs[5]}),
                 "param 'f32' is in none of the 3 shard files", "allow_missing");
}

TEST_CASE("explicit boxes (uneven, one empty, a column split) load on meshes and back", "[state_io]") {
  reshard(box_scenario(), {mesh_scenario("Shard(1) over 2", {2}, {shard(1)}), unsharded_scenario()});
  reshard(mesh_scenario("Shard(1) over 3", {3}, {shard(1)}), {box_scenario()});
}

TEST_CASE("the staging size and read_once change nothing: one block, two halves of one block, a few blocks, "
          "everything at once",
          "[state_io]") {
  // 1 byte is raised to one checksum block (1 MiB): "big"'s ~2 MiB states then take a
  // second, re-checked read; 2 MiB is two halves of one block each, one read while the
  // other is copied (pipelined), 3 MiB two of 1.5 MiB; 0 (64 MiB) holds everything. Each
  // reads once with read_once.
  const std::vector<Bytes> blobs = train_and_save(mesh_scenario("Shard(1) over 3", {3}, {shard(1)}));
  for (const bool read_once : {false, true})
    for (uint64_t staging : {uint64_t{1}, uint64_t{2} << 20, uint64_t{3} << 20, uint64_t{0}})
      load_and_continue(blobs, mesh_scenario("Shard(0) over 2", {2}, {shard(0)}), staging, read_once);
}

TEST_CASE("shard files written with sa_file_writer load with sa_file_reader", "[state_io]") {
  const std::vector<Bytes> blobs = train_and_save(mesh_scenario("Shard(0) over 2", {2}, {shard(0)}));
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("shardadam_files_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // Re-export from loaded optimizers through the file writer, then load those files.
  auto ranks = make_ranks(io_problem(), mesh_scenario("Shard(0) over 2", {2}, {shard(0)}),
                          param_values(expected_at_save()), other_groups());
  std::vector<std::string> paths;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    REQUIRE_SA_OK(ranks[r]->opt(), import_blobs(ranks[r]->opt(), blobs));
    paths.push_back((dir / ("rank" + std::to_string(r) + ".safetensors")).string());
    sa_writer writer = SA_WRITER_INIT;
    REQUIRE_SA_OK(nullptr, sa_file_writer(paths.back().c_str(), &writer));
    REQUIRE_SA_OK(ranks[r]->opt(), sa_optimizer_export(ranks[r]->opt(), &writer));
    sa_writer_release(&writer);
    // The file holds exactly the bytes of a memory export.
    sa_reader reader = SA_READER_INIT;
    REQUIRE_SA_OK(nullptr, sa_file_reader(paths.back().c_str(), &reader));
    CHECK(reader.size == blobs[r].size());
    Bytes file(reader.size);
    REQUIRE(reader.read_at(reader.ctx, 0, file.data(), file.size()) == 0);
    CHECK(file == blobs[r]);
    CHECK_THAT(std::string(reader.name), Catch::Contains("rank"));
    sa_reader_release(&reader);
  }
  auto loaded = make_ranks(io_problem(), unsharded_scenario(), param_values(expected_at_save()), other_groups());
  std::vector<sa_reader> readers(paths.size());
  std::vector<const sa_reader*> pointers;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    REQUIRE_SA_OK(nullptr, sa_file_reader(paths[i].c_str(), &readers[i]));
    pointers.push_back(&readers[i]);
  }
  REQUIRE_SA_OK(loaded[0]->opt(), sa_optimizer_import(loaded[0]->opt(), 2, pointers.data(), nullptr));
  for (sa_reader& r : readers) sa_reader_release(&r);
  check_rank_matches(io_problem(), *loaded[0], expected_at_save(), true);
  check_groups_restored(loaded[0]->opt(), io_groups(), kSaveAt);
  std::filesystem::remove_all(dir);
}

TEST_CASE("float32 moments load into bfloat16 moments (round to nearest even) and back (exactly)",
          "[state_io]") {
  // The same problem twice, moments flipped between float32 and bfloat16 for every param.
  std::vector<GlobalParam> flipped = io_params();
  for (auto& p : flipped) p.moment_dtype = same_dtype(p.moment_dtype, kFloat32) ? kBfloat16 : kFloat32;
  const Problem other(flipped);
  const Problem& prob = io_problem();
  const std::vector<Bytes> blobs = train_and_save(mesh_scenario("Shard(0) over 3", {3}, {shard(0)}));
  auto ranks = make_ranks(other, mesh_scenario("Shard(1) over 2", {2}, {shard(1)}),
                          param_values(expected_at_save()));
  for (auto& rank : ranks) {
    REQUIRE_SA_OK(rank->opt(), import_blobs(rank->opt(), blobs));
    for (std::size_t k = 0; k < prob.params.size(); ++k) {
      const GlobalParam& saved = prob.params[k];
      const Box& box = rank->box(k);
      INFO("param '" << saved.name << "'");
      for (const char* key : state_keys(saved)) {
        INFO("state " << key);
        const Bytes want_saved = bytes_of_box(expected_at_save()[k].states.at(key), saved.shape, box,
                                              state_elem_size(key, saved));
        const Bytes got = rank->state_bytes(k, key);
        if (std::string(key) == "master" || std::string(key) == "remainder") {
          CHECK(got == want_saved);  // not moments: never converted
          continue;
        }
        const std::size_t n = static_cast<std::size_t>(numel_of(box.shape));
        Bytes want(n * (same_dtype(saved.moment_dtype, kFloat32) ? 2 : 4));
        for (std::size_t i = 0; i < n; ++i) {
          if (same_dtype(saved.moment_dtype, kFloat32)) {
            float f;
            std::memcpy(&f, &want_saved[4 * i], 4);
            // The reference rounding (test_support.hpp), then the bfloat16 bits of the result.
            const float rounded = static_cast<float>(round_to_bf16(f));
            uint32_t bits;
            std::memcpy(&bits, &rounded, 4);
            const uint16_t hi = static_cast<uint16_t>(bits >> 16);
            std::memcpy(&want[2 * i], &hi, 2);
          } else {
            uint16_t h;
            std::memcpy(&h, &want_saved[2 * i], 2);
            const uint32_t bits = static_cast<uint32_t>(h) << 16;
            std::memcpy(&want[4 * i], &bits, 4);
          }
        }
        CHECK(got == want);
      }
    }
  }
}

TEST_CASE("an import into the optimizer that wrote the file restores the saved state", "[state_io]") {
  const Problem& prob = io_problem();
  Rank rank(prob, mesh_scenario("Shard(0) over 1", {1}, {shard(0)}), 0, prob.initial_values());
  for (int s = 0; s < kSaveAt; ++s) rank.step(s);
  const Bytes blob = rank.export_blob();
  const Snapshot saved = snapshot(rank.opt(), prob);
  rank.step(kSaveAt);
  CHECK_FALSE(snapshot(rank.opt(), prob) == saved);
  REQUIRE_SA_OK(rank.opt(), import_blobs(rank.opt(), {blob}));
  CHECK(snapshot(rank.opt(), prob) == saved);
  // And the same bytes come out again.
  CHECK(rank.export_blob() == blob);
}

// Every storage variant with 8-bit moments, loaded from float32 and bfloat16 moments saved
// on another layout: each moment is the saved values quantized by the local shard's own
// blocks (absmax: the block's largest |x| exactly; codes: nearest entries of bitsandbytes'
// maps to x / absmax), checked in float64.
TEST_CASE("float32 and bfloat16 moments load into 8-bit moments on another layout, quantized by "
          "the local blocks",
          "[state_io][quant8]") {
  std::vector<GlobalParam> eight = io_params();
  for (auto& p : eight) p.moment_dtype = kUint8;
  const Problem q8(eight);
  const Problem& prob = io_problem();
  const std::vector<Bytes> blobs = train_and_save(mesh_scenario("Shard(0) over 3", {3}, {shard(0)}));
  auto ranks = make_ranks(q8, mesh_scenario("Shard(1) over 2", {2}, {shard(1)}),
                          param_values(expected_at_save()));
  int64_t blocks_checked = 0;
  for (auto& rank : ranks) {
    REQUIRE_SA_OK(rank->opt(), import_blobs(rank->opt(), blobs));
    for (std::size_t k = 0; k < prob.params.size(); ++k) {
      const GlobalParam& saved = prob.params[k];
      const Box& box = rank->box(k);
      const std::size_t n = static_cast<std::size_t>(numel_of(box.shape));
      INFO("param '" << saved.name << "'");
      for (const char* key : state_keys(saved)) {
        const std::string name = key;
        if (name == "master" || name == "remainder") continue;
        INFO("state " << key);
        const Bytes raw = bytes_of_box(expected_at_save()[k].states.at(key), saved.shape, box,
                                       state_elem_size(key, saved));
        std::vector<double> x(n);
        for (std::size_t i = 0; i < n; ++i) {
          if (same_dtype(saved.moment_dtype, kFloat32)) {
            float f;
            std::memcpy(&f, &raw[4 * i], 4);
            x[i] = f;
          } else {
            uint16_t h;
            std::memcpy(&h, &raw[2 * i], 2);
            const uint32_t bits = static_cast<uint32_t>(h) << 16;
            float f;
            std::memcpy(&f, &bits, 4);
            x[i] = f;
          }
        }
        const Bytes codes = rank->state_bytes(k, key);
        const Bytes absmax_bytes = rank->state_bytes(k, (name + "_absmax").c_str());
        REQUIRE(codes.size() == n);
        const uint32_t* map = sa::kernels::quant8_map(name == "exp_avg");
        for (std::size_t b = 0; b * 256 < n; ++b, ++blocks_checked) {
          float a;
          std::memcpy(&a, &absmax_bytes[4 * b], 4);
          double largest = 0.0;
          for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i)
            largest = std::max(largest, std::fabs(x[i]));
          CHECK(static_cast<double>(a) == largest);
          for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i) {
            const double scaled = a > 0.0f ? x[i] / a : 0.0;
            double nearest = 1e300;
            for (int c = 0; c < 256; ++c)
              nearest = std::min(nearest, std::fabs(sa::kernels::bits_float(map[c]) - scaled));
            CHECK(std::fabs(sa::kernels::bits_float(map[codes[i]]) - scaled) <= nearest + 1e-6);
          }
        }
      }
    }
  }
  CHECK(blocks_checked > 100);
}

TEST_CASE(
    "8-bit moments land in rounds of the staging size: a round per moment loads what one "
    "round loads",
    "[state_io][quant8]") {
  // Staging 1 byte makes each 8-bit moment of each param a landing round of its own
  // (sa_import_options::staging_bytes); 0 (64 MiB) takes them all in one. Both reshard
  // Shard(1) over 3 to Shard(0) over 2, where the blocks differ, so every moment is
  // quantized again.
  std::vector<GlobalParam> eight = io_params();
  for (auto& p : eight) p.moment_dtype = kUint8;
  const Problem q8(eight);
  auto saving =
      make_ranks(q8, mesh_scenario("Shard(1) over 3", {3}, {shard(1)}), q8.initial_values());
  for (int s = 0; s < kSaveAt; ++s)
    for (auto& r : saving) r->step(s);
  std::vector<Bytes> blobs;
  for (auto& r : saving) blobs.push_back(r->export_blob());
  std::vector<std::vector<Bytes>> loaded;  // [staging choice][rank, param, key]
  for (uint64_t staging : {uint64_t{0}, uint64_t{1}, uint64_t{2} << 20}) {
    INFO("staging_bytes " << staging);
    auto ranks =
        make_ranks(q8, mesh_scenario("Shard(0) over 2", {2}, {shard(0)}), q8.initial_values());
    sa_import_options options = import_options(staging);
    options.read_once = staging == (uint64_t{2} << 20) ? 1 : 0;  // two halves, read once
    std::vector<Bytes> states;
    for (auto& rank : ranks) {
      REQUIRE_SA_OK(rank->opt(), import_blobs(rank->opt(), blobs, &options));
      for (std::size_t k = 0; k < q8.params.size(); ++k)
        for (const char* key : state_keys(q8.params[k]))
          states.push_back(rank->state_bytes(k, key));
    }
    loaded.push_back(states);
  }
  REQUIRE(loaded[0].size() == loaded[1].size());
  REQUIRE(loaded[0].size() == loaded[2].size());
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < loaded[0].size(); ++i) {
    INFO("state " << i);
    CHECK(loaded[0][i] == loaded[1][i]);
    CHECK(loaded[0][i] == loaded[2][i]);
    nonzero += loaded[0][i] != Bytes(loaded[0][i].size(), 0);
  }
  CHECK(nonzero > loaded[0].size() / 2);  // the states hold what training wrote, not zeros
}
