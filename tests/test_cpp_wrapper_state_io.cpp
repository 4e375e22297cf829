// tests/test_cpp_wrapper_state_io.cpp — the C++ wrapper's shard-file calls (Writer, Reader,
// export_state, import_state, inspect): a round trip through memory and through files
// restores the state bit for bit into another layout, and failures throw shardadam::Error
// with the C status.
#include <cstdio>
#include <string>
#include <vector>

#include "shardadam/shardadam.hpp"
#include "test_support.hpp"

using namespace sa_test;

namespace {

// A 2-rank run of one [7, 3] param (Shard(0): 4 + 3 rows) stepped twice, or its 1-rank
// counterpart; the tensors outlive the optimizer.
struct Run {
  std::vector<HostTensor> params, grads;
  std::vector<shardadam::Optimizer> ranks;

  explicit Run(int nranks) {
    int64_t offset = 0;
    for (int r = 0; r < nranks; ++r) {
      const int64_t rows = nranks == 1 ? 7 : (r == 0 ? 4 : 3);
      params.emplace_back(std::vector<int64_t>{rows, 3}, kFloat32);
      grads.emplace_back(std::vector<int64_t>{rows, 3}, kFloat32);
      for (int64_t i = 0; i < rows * 3; ++i) {
        params.back().set(i, 0.1f * static_cast<float>(offset * 3 + i));
        grads.back().set(i, 1.0f - 0.05f * static_cast<float>(offset * 3 + i));
      }
      offset += rows;
    }
    for (int r = 0; r < nranks; ++r) {
      ranks.emplace_back();
      shardadam::Optimizer& opt = ranks.back();
      opt.add_group(shardadam::default_group_config());
      MeshLayout layout{{7, 3}, {nranks}, {r}, {shard(0)}};
      const sa_layout l = layout.get();
      const int64_t p = opt.add_param("w", 0, params[r].versioned(), &l);
      opt.set_grad(p, grads[r].dl());
    }
  }
  ~Run() { ranks.clear(); }  // optimizers first: they hold the tensors

  void step() {
    for (auto& opt : ranks) opt.step();
  }
  // The state `key` of the whole [7, 3] param, from every rank's view in row order.
  std::vector<unsigned char> whole(const char* key) {
    std::vector<unsigned char> out;
    for (auto& opt : ranks) {
      const auto view = opt.state_view(0, key);
      const auto* p = view.data<const unsigned char>();
      out.insert(out.end(), p, p + view.numel() * 4);
    }
    return out;
  }
};

}  // namespace

TEST_CASE("C++ wrapper: export on 2 ranks to memory, inspect, import on 1 rank bit for bit", "[cpp][state_io]") {
  Run two(2);
  two.step();
  two.step();
  std::vector<shardadam::Writer> writers;
  for (auto& opt : two.ranks) {
    writers.push_back(shardadam::Writer::memory());
    opt.export_state(writers.back());
  }
  std::vector<std::vector<unsigned char>> blobs;
  for (const auto& w : writers) blobs.push_back(w.data());
  std::vector<shardadam::Reader> readers;
  for (const auto& b : blobs) readers.push_back(shardadam::Reader::memory(b.data(), b.size()));

  const std::string report = shardadam::inspect(readers);
  CHECK_THAT(report, Catch::Contains("\"ok\":true") || Catch::Contains("\"ok\": true"));

  Run one(1);
  one.ranks[0].import_state(readers);
  CHECK(one.whole("exp_avg") == two.whole("exp_avg"));
  CHECK(one.whole("exp_avg_sq") == two.whole("exp_avg_sq"));
  CHECK(one.ranks[0].step_count(0) == 2);
}

TEST_CASE("C++ wrapper: export to files and import them, a bad blob throws with its status", "[cpp][state_io]") {
  Run two(2);
  two.step();
  const std::string dir = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
  const std::vector<std::string> paths = {dir + "/sa_cpp_wrapper_0.safetensors", dir + "/sa_cpp_wrapper_1.safetensors"};
  for (std::size_t r = 0; r < paths.size(); ++r) two.ranks[r].export_state(paths[r]);
  Run one(1);
  one.ranks[0].import_state(paths);
  CHECK(one.whole("exp_avg") == two.whole("exp_avg"));

  const std::vector<unsigned char> garbage(64, 0x5a);
  std::vector<shardadam::Reader> bad;
  bad.push_back(shardadam::Reader::memory(garbage.data(), garbage.size()));
  try {
    one.ranks[0].import_state(bad);
    FAIL("importing garbage should throw");
  } catch (const shardadam::Error& e) {
    CHECK(e.status() == SA_ERR_FORMAT);
  }
  try {
    shardadam::Reader::file(dir + "/sa_cpp_wrapper_missing.safetensors");
    FAIL("opening a missing file should throw");
  } catch (const shardadam::Error& e) {
    CHECK(e.status() == SA_ERR_IO);
  }
  for (const std::string& p : paths) std::remove(p.c_str());
}

TEST_CASE("C++ wrapper: export_async writes the state of its call while steps go on, a failing writer throws from wait",
          "[cpp][state_io][async]") {
  Run two(2);
  two.step();
  const std::vector<unsigned char> before = [&] {
    shardadam::Writer w = shardadam::Writer::memory();
    two.ranks[0].export_state(w);
    return w.data();
  }();
  shardadam::ExportJob job = two.ranks[0].export_async(shardadam::Writer::memory());
  two.step();  // changes the state while (or after) the job writes
  job.wait();
  CHECK(job.done());
  CHECK(job.writer().data() == before);

  sa_writer failing = SA_WRITER_INIT;
  failing.write = [](void*, const void*, std::size_t) { return 1; };
  shardadam::ExportJob bad = two.ranks[0].export_async(shardadam::Writer(failing));
  try {
    bad.wait();
    FAIL("a failing writer should throw from wait");
  } catch (const shardadam::Error& e) {
    CHECK(e.status() == SA_ERR_IO);
    CHECK_THAT(e.what(), Catch::Contains("the writer failed to write"));
  }
}
