// tests/test_state_io_async.cpp — sa_optimizer_export_async: the file is the one a
// synchronous export would have written at the moment of the call, whatever happens to
// the state afterwards; two saves in flight, a destroy while one writes, a writer that
// fails in the background, and the errors found before anything starts.
//
// A GatedWriter holds every write until the test opens its gate, so "during the write" is
// a fact of the test, not a race it hopes to win.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "test_state_io_support.hpp"

namespace {

using namespace sa_test;
namespace fs = std::filesystem;

// Forwards to a memory writer (or, with a path, a file writer) once its gate is open;
// write_at and write block until then.
struct GatedWriter {
  sa_writer inner = SA_WRITER_INIT;
  std::mutex mutex;
  std::condition_variable opened;
  bool open = false;
  int entered = 0;  // calls that reached the gate
  int commits = 0;
  bool fail_writes = false;

  explicit GatedWriter(const std::string& path = "") {
    if (path.empty()) {
      REQUIRE_SA_OK(nullptr, sa_memory_writer(&inner));
    } else {
      REQUIRE_SA_OK(nullptr, sa_file_writer(path.c_str(), &inner));
    }
  }
  ~GatedWriter() { sa_writer_release(&inner); }

  // The table the library gets: positional (write_at) unless `appending`.
  sa_writer table(bool appending = false) {
    sa_writer w = SA_WRITER_INIT;
    w.ctx = this;
    w.write = [](void* ctx, const void* data, std::size_t bytes) {
      auto* g = static_cast<GatedWriter*>(ctx);
      g->pass();
      return g->fail_writes ? 1 : g->inner.write(g->inner.ctx, data, bytes);
    };
    if (!appending) {
      w.write_at = [](void* ctx, uint64_t offset, const void* data, std::size_t bytes) {
        auto* g = static_cast<GatedWriter*>(ctx);
        g->pass();
        return g->fail_writes ? 1 : g->inner.write_at(g->inner.ctx, offset, data, bytes);
      };
      w.reserve = [](void* ctx, uint64_t bytes) {
        auto* g = static_cast<GatedWriter*>(ctx);
        return g->inner.reserve(g->inner.ctx, bytes);
      };
    }
    w.commit = [](void* ctx) {
      auto* g = static_cast<GatedWriter*>(ctx);
      {
        std::lock_guard<std::mutex> lock(g->mutex);
        ++g->commits;
      }
      return g->inner.commit == nullptr ? 0 : g->inner.commit(g->inner.ctx);
    };
    return w;
  }

  void pass() {
    std::unique_lock<std::mutex> lock(mutex);
    ++entered;
    opened.wait(lock, [&] { return open; });
  }
  void open_gate() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      open = true;
    }
    opened.notify_all();
  }
  // Runs `blocking` (a call that must wait for the held job) while another thread opens
  // the gate 50 ms later.
  template <class Blocking>
  void open_during(Blocking&& blocking) {
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      open_gate();
    });
    blocking();
    opener.join();
  }
  // Waits until the library's thread is held at the gate: the export is in flight.
  void wait_until_held() {
    for (int i = 0; i < 10000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (entered > 0) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    FAIL("the async export never reached its writer");
  }
  int commit_count() {
    std::lock_guard<std::mutex> lock(mutex);
    return commits;
  }
  Bytes bytes() const {
    const void* data = nullptr;
    std::size_t size = 0;
    REQUIRE_SA_OK(nullptr, sa_memory_writer_data(&inner, &data, &size));
    const auto* p = static_cast<const unsigned char*>(data);
    return Bytes(p, p + size);
  }
};

sa_export_job* start(sa_optimizer* opt, const sa_writer& writer) {
  sa_export_job* job = nullptr;
  REQUIRE_SA_OK(opt, sa_optimizer_export_async(opt, &writer, &job));
  REQUIRE(job != nullptr);
  return job;
}

// A trained rank of every storage variant (the shard-file tests' problem).
struct Trained {
  const Problem& prob = io_problem();
  Rank rank{prob, unsharded_scenario(), 0, prob.initial_values()};
  Trained() { rank.step(0); }
  sa_optimizer* opt() const { return rank.opt(); }
};

}  // namespace

TEST_CASE("an async export writes what a synchronous one would have, and a step during the write does not reach it",
          "[state_io][async]") {
  Trained t;
  for (const bool appending : {false, true}) {
    INFO((appending ? "an appending writer" : "a positional writer"));
    const Bytes at_call = t.rank.export_blob();
    GatedWriter gated;
    const sa_writer table = gated.table(appending);
    sa_export_job* job = start(t.opt(), table);
    gated.wait_until_held();
    int32_t done = 1;
    CHECK(sa_export_job_poll(job, &done) == SA_OK);
    CHECK(done == 0);
    // The state changes while the job writes: a step, and a group's lr and step count.
    t.rank.step(1);
    REQUIRE_SA_OK(t.opt(), sa_optimizer_set_lr(t.opt(), 0, 0.5));
    REQUIRE_SA_OK(t.opt(), sa_optimizer_set_step(t.opt(), 1, 40));
    CHECK(gated.commit_count() == 0);
    gated.open_gate();
    CHECK(sa_export_job_wait(job) == SA_OK);
    CHECK(std::string(sa_export_job_last_error(job)).empty());
    CHECK(sa_export_job_poll(job, &done) == SA_OK);
    CHECK(done == 1);
    CHECK(sa_export_job_wait(job) == SA_OK);  // again: the same
    sa_export_job_release(job);
    CHECK(gated.commit_count() == 1);
    CHECK(gated.bytes() == at_call);
    CHECK(t.rank.export_blob() != at_call);  // the state did change
  }
}

TEST_CASE("an async export to a file: renamed into place only when the job ends, the same bytes",
          "[state_io][async]") {
  Trained t;
  const fs::path dir = fs::temp_directory_path() / ("shardadam_async_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / "rank0.safetensors";
  const Bytes expected = t.rank.export_blob();
  {
    GatedWriter gated(path.string());
    sa_export_job* job = start(t.opt(), gated.table());
    gated.wait_until_held();
    t.rank.step(1);
    CHECK_FALSE(fs::exists(path));
    gated.open_gate();
    REQUIRE(sa_export_job_wait(job) == SA_OK);
    sa_export_job_release(job);
  }
  std::ifstream in(path, std::ios::binary);
  const Bytes written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(written == expected);
  fs::remove_all(dir);
}

TEST_CASE("two async exports in flight: the second waits for the first, each file holds its own moment",
          "[state_io][async]") {
  Trained t;
  const Bytes first_state = t.rank.export_blob();
  GatedWriter first, second;
  sa_export_job* job1 = start(t.opt(), first.table());
  first.wait_until_held();
  t.rank.step(1);
  // The second export needs the snapshot the first is still writing from: it waits, so
  // the gate is opened from another thread while it does.
  second.open_gate();
  sa_export_job* job2 = nullptr;
  first.open_during([&] { job2 = start(t.opt(), second.table()); });
  int32_t done = 0;
  CHECK(sa_export_job_poll(job1, &done) == SA_OK);
  CHECK(done == 1);  // it had to end before the second could start
  CHECK(sa_export_job_wait(job2) == SA_OK);
  CHECK(sa_export_job_wait(job1) == SA_OK);
  sa_export_job_release(job1);
  sa_export_job_release(job2);
  const Bytes second_state = t.rank.export_blob();
  CHECK(first.bytes() == first_state);
  CHECK(second.bytes() == second_state);
  CHECK(first_state != second_state);
}

TEST_CASE("a synchronous export while an async one writes waits for it", "[state_io][async]") {
  Trained t;
  const Bytes expected = t.rank.export_blob();
  GatedWriter gated;
  sa_export_job* job = start(t.opt(), gated.table());
  gated.wait_until_held();
  gated.open_during([&] { CHECK(t.rank.export_blob() == expected); });
  int32_t done = 0;
  CHECK(sa_export_job_poll(job, &done) == SA_OK);
  CHECK(done == 1);
  sa_export_job_release(job);
  CHECK(gated.bytes() == expected);
}

TEST_CASE("destroying the optimizer while an async export writes waits for it, and the job handle outlives it",
          "[state_io][async]") {
  const Problem& prob = io_problem();
  auto rank = std::make_unique<Rank>(prob, unsharded_scenario(), 0, prob.initial_values());
  rank->step(0);
  const Bytes expected = rank->export_blob();
  GatedWriter gated;
  sa_export_job* job = start(rank->opt(), gated.table());
  gated.wait_until_held();
  gated.open_during([&] { rank.reset(); });  // sa_optimizer_destroy: blocks until the job committed
  CHECK(gated.commit_count() == 1);
  int32_t done = 0;
  CHECK(sa_export_job_poll(job, &done) == SA_OK);
  CHECK(done == 1);
  CHECK(sa_export_job_wait(job) == SA_OK);
  sa_export_job_release(job);
  CHECK(gated.bytes() == expected);
}

TEST_CASE("a job released without a wait waits for its writes first", "[state_io][async]") {
  Trained t;
  const Bytes expected = t.rank.export_blob();
  GatedWriter gated;
  sa_export_job* job = start(t.opt(), gated.table());
  gated.wait_until_held();
  gated.open_during([&] { sa_export_job_release(job); });
  CHECK(gated.commit_count() == 1);
  CHECK(gated.bytes() == expected);
}

TEST_CASE("a writer that fails in the background: wait returns SA_ERR_IO with the message, nothing committed",
          "[state_io][async]") {
  Trained t;
  for (const bool appending : {false, true}) {
    INFO((appending ? "an appending writer" : "a positional writer"));
    GatedWriter gated;
    gated.fail_writes = true;
    gated.open_gate();
    sa_export_job* job = start(t.opt(), gated.table(appending));
    CHECK(sa_export_job_wait(job) == SA_ERR_IO);
    CHECK_THAT(sa_export_job_last_error(job),
               Catch::Contains("sa_optimizer_export_async") && Catch::Contains("the writer failed to write"));
    int32_t done = 0;
    CHECK(sa_export_job_poll(job, &done) == SA_ERR_IO);
    CHECK(done == 1);
    sa_export_job_release(job);
    CHECK(gated.commit_count() == 0);
    // The optimizer is unharmed: the next export works.
    CHECK_FALSE(t.rank.export_blob().empty());
  }
}

TEST_CASE("async export: errors found before it starts are returned at once, with no job", "[state_io][async]") {
  Trained t;
  GatedWriter gated;
  gated.open_gate();
  const sa_writer table = gated.table();
  sa_export_job* job = reinterpret_cast<sa_export_job*>(&gated);  // must be cleared
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_export_async(nullptr, &table, &job), "opt is NULL");
  CHECK(job == nullptr);
  CHECK_SA_FAILS(t.opt(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_export_async(t.opt(), &table, nullptr),
                 "job is NULL");
  sa_writer empty = SA_WRITER_INIT;
  job = reinterpret_cast<sa_export_job*>(&gated);
  CHECK_SA_FAILS(t.opt(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_export_async(t.opt(), &empty, &job), "write is NULL");
  CHECK(job == nullptr);
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_export_job_wait(nullptr), "job is NULL");
  int32_t done = 7;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_export_job_poll(nullptr, &done), "job or done is NULL");
  CHECK(done == 0);
  sa_export_job_release(nullptr);
  CHECK(std::string(sa_export_job_last_error(nullptr)).empty());

  CHECK(gated.commit_count() == 0);
}
