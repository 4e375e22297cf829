// tests/test_state_io_files.cpp — the ready readers and writers, and the inspection report:
// a file writer never leaves a file that looks complete unless it committed, and never
// leaves its temporary file; readers fail with SA_ERR_IO naming the path; sa_inspect
// describes whole and broken sets of files.
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "test_state_io_support.hpp"

namespace {

using namespace sa_test;
namespace fs = std::filesystem;

// A fresh directory, removed with its contents at the end of the scope.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("shardadam_io_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

Bytes read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

nlohmann::json inspect(const std::vector<Bytes>& blobs, int32_t verify) {
  Readers readers(blobs);
  char* report = nullptr;
  REQUIRE_SA_OK(nullptr, sa_inspect(readers.n(), readers.data(), verify, &report));
  REQUIRE(report != nullptr);
  nlohmann::json j = nlohmann::json::parse(report);
  sa_free(report);
  return j;
}

}  // namespace

TEST_CASE("a file writer released without commit leaves no file and no temporary file", "[state_io][files]") {
  TempDir dir;
  const std::string path = (dir.path / "rank0.safetensors").string();
  sa_writer writer = SA_WRITER_INIT;
  REQUIRE_SA_OK(nullptr, sa_file_writer(path.c_str(), &writer));
  // The bytes go to a temporary file beside the target, never to the target.
  const std::vector<std::string> during = dir.entries();
  REQUIRE(during.size() == 1);
  CHECK_THAT(during[0], Catch::StartsWith("rank0.safetensors.tmp."));
  REQUIRE(writer.write(writer.ctx, "abc", 3) == 0);
  CHECK_FALSE(fs::exists(path));
  sa_writer_release(&writer);
  CHECK(dir.entries().empty());
  CHECK(writer.write == nullptr);
  sa_writer_release(&writer);  // released twice: a no-op
}

// A file writer whose disk fills up: at the reservation, or after `good_bytes` bytes of
// positioned or appended writes (the failing call writes nothing). ctx is the real file
// writer's, so release still removes its temporary file.
struct FullDisk {
  static inline std::atomic<int64_t> budget{0};
  static int write(void* ctx, const void* data, std::size_t bytes) {
    if ((budget -= static_cast<int64_t>(bytes)) < 0) return 1;
    return real.write(ctx, data, bytes);
  }
  static int write_at(void* ctx, uint64_t offset, const void* data, std::size_t bytes) {
    if ((budget -= static_cast<int64_t>(bytes)) < 0) return 1;
    return real.write_at(ctx, offset, data, bytes);
  }
  static int no_room(void*, uint64_t) { return 1; }
  static inline sa_writer real = SA_WRITER_INIT;
};

TEST_CASE("a failed export leaves an existing file untouched and no temporary file", "[state_io][files]") {
  const Problem& prob = io_problem();
  Rank rank(prob, unsharded_scenario(), 0, prob.initial_values());
  rank.step(0);
  const std::size_t blob_bytes = rank.export_blob().size();
  REQUIRE(blob_bytes > (std::size_t{2} << 20));  // several checksum blocks: "mid-file" means something
  // Each way the disk can fill: before anything is written (the reservation), mid-file
  // through positioned writes (the file writer's own path), mid-file through appends (a
  // writer without write_at), and at the very last write.
  struct Case {
    const char* what;
    bool positional, reserve_fails;
    int64_t good_bytes;
    const char* message;
  };
  const Case cases[] = {
      {"full at the reservation", true, true, 0, "could not make room for the blob's"},
      {"full mid-file, positioned writes", true, false, int64_t{1} << 20, "failed to write"},
      {"full mid-file, appends", false, false, int64_t{1} << 20, "failed to write"},
      {"full at the last append", false, false, static_cast<int64_t>(blob_bytes) - 1, "failed to write"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    TempDir dir;
    const std::string path = (dir.path / "ckpt.safetensors").string();
    { std::ofstream(path) << "the previous checkpoint"; }
    REQUIRE_SA_OK(nullptr, sa_file_writer(path.c_str(), &FullDisk::real));
    sa_writer broken = FullDisk::real;
    broken.write = FullDisk::write;
    broken.write_at = c.positional ? FullDisk::write_at : nullptr;
    if (c.reserve_fails) broken.reserve = FullDisk::no_room;
    FullDisk::budget = c.good_bytes;
    CHECK_SA_FAILS(rank.opt(), SA_ERR_IO, sa_optimizer_export(rank.opt(), &broken), c.message);
    sa_writer_release(&FullDisk::real);
    CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});
    const Bytes old = read_file(path);
    CHECK(std::string(old.begin(), old.end()) == "the previous checkpoint");
  }
  // The optimizer is unchanged and exports as before.
  CHECK(rank.export_blob().size() == blob_bytes);
}

// A positional writer that records which bytes each write_at covered (from several threads).
struct RecordingBlob {
  std::mutex mutex;
  Bytes bytes;
  std::vector<int> writes;  // per byte: how many times it was written
  static int reserve(void* ctx, uint64_t n) {
    auto* self = static_cast<RecordingBlob*>(ctx);
    self->bytes.assign(static_cast<std::size_t>(n), 0);
    self->writes.assign(static_cast<std::size_t>(n), 0);
    return 0;
  }
  static int write_at(void* ctx, uint64_t offset, const void* data, std::size_t n) {
    auto* self = static_cast<RecordingBlob*>(ctx);
    std::lock_guard<std::mutex> lock(self->mutex);
    if (offset + n > self->bytes.size()) return 1;
    std::memcpy(self->bytes.data() + offset, data, n);
    for (std::size_t i = 0; i < n; ++i) ++self->writes[static_cast<std::size_t>(offset) + i];
    return 0;
  }
  static int fail(void*, const void*, std::size_t) { return 1; }  // write: never called
};

TEST_CASE("positioned and appending writers get the same bytes, each written once", "[state_io][files]") {
  const Problem& prob = io_problem();
  Rank rank(prob, unsharded_scenario(), 0, prob.initial_values());
  rank.step(0);
  const Bytes from_memory_writer = rank.export_blob();  // write_at + reserve

  CHECK(export_appended(rank.opt()) == from_memory_writer);

  RecordingBlob recorded;
  sa_writer recorder = SA_WRITER_INIT;
  recorder.ctx = &recorded;
  recorder.write = RecordingBlob::fail;
  recorder.write_at = RecordingBlob::write_at;
  recorder.reserve = RecordingBlob::reserve;
  REQUIRE_SA_OK(rank.opt(), sa_optimizer_export(rank.opt(), &recorder));
  CHECK(recorded.bytes == from_memory_writer);
  CHECK(std::all_of(recorded.writes.begin(), recorded.writes.end(), [](int n) { return n == 1; }));

  // The header is padded with spaces to the length it would have with every checksum at
  // its widest: a JSON text ending in spaces, the data 8-byte aligned after it.
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, from_memory_writer.data(), 8);
  const std::string text(from_memory_writer.begin() + 8, from_memory_writer.begin() + 8 + header_bytes);
  CHECK((8 + header_bytes) % 8 == 0);
  const std::size_t end = text.find_last_not_of(' ');
  REQUIRE(end != std::string::npos);
  CHECK(text[end] == '}');
  CHECK(nlohmann::json::parse(text).contains("__metadata__"));
}

// The process dies at a chosen point of a file export (a child process _exits from inside
// the writer): after some data, or after everything but before the rename. The target
// keeps the previous checkpoint, and the temporary file left behind is not a shard file
// that loads (the header, written last, is missing or the data are unsynced; either way
// an import of it fails before changing anything).
TEST_CASE("an export killed before its rename leaves the previous file and nothing that loads",
          "[state_io][files]") {
  const Problem& prob = io_problem();
  Rank rank(prob, unsharded_scenario(), 0, prob.initial_values());
  rank.step(0);
  static std::atomic<int64_t> budget{0};
  static sa_writer real = SA_WRITER_INIT;
  for (const bool before_rename : {false, true}) {
    INFO((before_rename ? "killed after the last write, before the rename" : "killed mid-file"));
    TempDir dir;
    const std::string path = (dir.path / "ckpt.safetensors").string();
    { std::ofstream(path) << "the previous checkpoint"; }
    std::fflush(nullptr);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // no Catch assertions here: _exit only
      if (sa_file_writer(path.c_str(), &real) != SA_OK) ::_exit(3);
      sa_writer dying = real;
      budget = before_rename ? INT64_MAX : int64_t{3} << 19;
      dying.write_at = [](void* ctx, uint64_t offset, const void* data, std::size_t bytes) {
        if ((budget -= static_cast<int64_t>(bytes)) < 0) ::_exit(0);  // killed mid-file
        return real.write_at(ctx, offset, data, bytes);
      };
      dying.commit = [](void*) -> int { ::_exit(0); };  // killed before fsync and rename
      sa_optimizer_export(rank.opt(), &dying);
      ::_exit(4);  // not reached
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    const Bytes old = read_file(path);
    CHECK(std::string(old.begin(), old.end()) == "the previous checkpoint");
    const std::vector<std::string> names = dir.entries();
    REQUIRE(names.size() == 2);  // the target and the dead writer's temporary file
    const std::string temp = (dir.path / (names[0] == "ckpt.safetensors" ? names[1] : names[0])).string();
    CHECK_THAT(temp, Catch::Contains("ckpt.safetensors.tmp."));
    if (!before_rename) {  // no header yet: not a shard file
      Rank target(prob, unsharded_scenario(), 0, prob.initial_values());
      const Bytes before = target.export_blob();
      sa_reader reader = SA_READER_INIT;
      REQUIRE_SA_OK(nullptr, sa_file_reader(temp.c_str(), &reader));
      const sa_reader* readers[] = {&reader};
      CHECK(sa_optimizer_import(target.opt(), 1, readers, nullptr) == SA_ERR_FORMAT);
      sa_reader_release(&reader);
      CHECK(target.export_blob() == before);
    }
  }
}

TEST_CASE("a committed export replaces the file atomically and leaves only it", "[state_io][files]") {
  TempDir dir;
  const std::string path = (dir.path / "ckpt.safetensors").string();
  { std::ofstream(path) << "the previous checkpoint"; }
  const Problem& prob = io_problem();
  Rank rank(prob, unsharded_scenario(), 0, prob.initial_values());
  rank.step(0);
  sa_writer writer = SA_WRITER_INIT;
  REQUIRE_SA_OK(nullptr, sa_file_writer(path.c_str(), &writer));
  REQUIRE_SA_OK(rank.opt(), sa_optimizer_export(rank.opt(), &writer));
  sa_writer_release(&writer);
  CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});
  CHECK(read_file(path) == rank.export_blob());
  // Two writers of one path at once get distinct temporary files.
  sa_writer a = SA_WRITER_INIT, b = SA_WRITER_INIT;
  REQUIRE_SA_OK(nullptr, sa_file_writer(path.c_str(), &a));
  REQUIRE_SA_OK(nullptr, sa_file_writer(path.c_str(), &b));
  CHECK(dir.entries().size() == 3);
  sa_writer_release(&a);
  sa_writer_release(&b);
  CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});
}

TEST_CASE("readers and writers of paths that cannot work fail with SA_ERR_IO naming the path", "[state_io][files]") {
  TempDir dir;
  sa_reader reader = SA_READER_INIT;
  const std::string missing = (dir.path / "missing.safetensors").string();
  CHECK_SA_FAILS(nullptr, SA_ERR_IO, sa_file_reader(missing.c_str(), &reader), "cannot open", missing.c_str());
  CHECK_SA_FAILS(nullptr, SA_ERR_IO, sa_file_reader(dir.path.string().c_str(), &reader), "not a regular file");
  sa_writer writer = SA_WRITER_INIT;
  const std::string nowhere = (dir.path / "no" / "such" / "dir.safetensors").string();
  CHECK_SA_FAILS(nullptr, SA_ERR_IO, sa_file_writer(nowhere.c_str(), &writer), "cannot create", "no/such/dir.safetensors");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_file_writer(nullptr, &writer), "path is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_file_reader("", &reader), "path is NULL or empty");
  CHECK(dir.entries().empty());
  // A file that shrinks after it was opened: the read fails, it does not return garbage.
  const std::string path = (dir.path / "shrinks").string();
  { std::ofstream(path) << "0123456789"; }
  REQUIRE_SA_OK(nullptr, sa_file_reader(path.c_str(), &reader));
  CHECK(reader.size == 10);
  fs::resize_file(path, 4);
  char buffer[10];
  CHECK(reader.read_at(reader.ctx, 0, buffer, 10) != 0);
  CHECK(reader.read_at(reader.ctx, 0, buffer, 4) == 0);
  sa_reader_release(&reader);
}

TEST_CASE("sa_inspect reports a whole set, a gap, an overlap, bad checksums and foreign files", "[state_io][inspect]") {
  const Problem& prob = io_problem();
  auto ranks = make_ranks(prob, mesh_scenario("Shard(0) over 3", {3}, {shard(0)}), prob.initial_values());
  for (auto& r : ranks) r->step(0);
  std::vector<Bytes> blobs;
  for (auto& r : ranks) blobs.push_back(r->export_blob());

  const nlohmann::json whole = inspect(blobs, 1);
  CHECK(whole["ok"] == true);
  CHECK(whole["groups"] == "consistent");
  REQUIRE(whole["files"].size() == 3);
  CHECK(whole["files"][1]["checksums"] == "ok");
  CHECK(whole["files"][1]["meshes"][0]["coord"] == nlohmann::json::array({1}));
  CHECK(whole["files"][0]["groups"][1]["step"] == 1);
  std::size_t keys = 0;
  for (const GlobalParam& p : prob.params) keys += state_keys(p).size();
  CHECK(whole["tensors"].size() == keys);
  for (const auto& t : whole["tensors"]) {
    INFO(t.dump());
    CHECK(t["coverage"] == "exact");
    CHECK(t["boxes"].size() == 3);
  }

  const nlohmann::json gap = inspect({blobs[0], blobs[2]}, 0);
  CHECK(gap["ok"] == false);
  CHECK(gap["files"][0]["checksums"] == "not verified");
  bool saw_gap = false;
  for (const auto& t : gap["tensors"])
    if (t["name"] == "big/exp_avg") {
      saw_gap = true;
      CHECK(t["coverage"] == "gap");
      CHECK_THAT(t["detail"].get<std::string>(), Catch::Contains("element [174, 0] is in no saved box"));
    }
  CHECK(saw_gap);

  const nlohmann::json overlap = inspect({blobs[0], blobs[1], blobs[2], blobs[1]}, 0);
  CHECK(overlap["ok"] == false);
  CHECK(overlap["tensors"][0]["coverage"] == "overlap");
  CHECK_THAT(overlap["tensors"][0]["detail"].get<std::string>(), Catch::Contains("file 1's box"));
  CHECK_THAT(overlap["tensors"][0]["detail"].get<std::string>(), Catch::Contains("file 3's box"));

  Bytes corrupt = blobs[2];
  corrupt[corrupt.size() - 5] ^= 1;
  const nlohmann::json bad = inspect({blobs[0], blobs[1], corrupt}, 1);
  CHECK(bad["ok"] == false);
  CHECK(bad["files"][2]["checksums"] == "bad");
  CHECK(bad["files"][2]["bad_blocks"] == 1);
  CHECK(inspect({blobs[0], blobs[1], corrupt}, 0)["ok"] == true);  // headers only: unseen

  const std::string text = "not a shard file";
  const nlohmann::json foreign = inspect({blobs[0], Bytes(text.begin(), text.end())}, 1);
  CHECK(foreign["files"][1]["header"] == "bad");
  CHECK_THAT(foreign["files"][1]["error"].get<std::string>(), Catch::Contains("header length field"));

  char* report = reinterpret_cast<char*>(1);
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_inspect(0, nullptr, 2, &report), "verify_data");
  CHECK(report == nullptr);
  sa_free(nullptr);
}

TEST_CASE("sa_inspect of no files is an error, not a report that says ok", "[state_io][inspect]") {
  // Nothing inspected is nothing proven whole: a glob that matched no file must not pass.
  char* report = reinterpret_cast<char*>(1);
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_inspect(0, nullptr, 1, &report), "sa_inspect",
                 "n is 0", "no shard files");
  CHECK(report == nullptr);
  const sa_reader* none[1] = {nullptr};
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_inspect(0, none, 0, &report), "n is 0");
  CHECK(report == nullptr);
}

TEST_CASE("sa_inspect reports bytes after the data section and which group field files disagree on",
          "[state_io][inspect]") {
  const Problem& prob = io_problem();
  auto ranks =
      make_ranks(prob, mesh_scenario("Shard(0) over 2", {2}, {shard(0)}), prob.initial_values());
  for (auto& r : ranks) r->step(0);
  std::vector<Bytes> blobs;
  for (auto& r : ranks) blobs.push_back(r->export_blob());
  REQUIRE(inspect(blobs, 1)["ok"] == true);

  Rng rng(5);
  for (std::size_t extra : {std::size_t{1}, std::size_t{13}, std::size_t{1} << 12}) {
    INFO(extra << " extra bytes");
    Bytes longer = blobs[1];
    for (std::size_t i = 0; i < extra; ++i)
      longer.push_back(static_cast<unsigned char>(rng.integer(0, 255)));
    for (int32_t verify : {0, 1}) {
      const nlohmann::json r = inspect({blobs[0], longer}, verify);
      CHECK(r["ok"] == false);
      CHECK(r["files"][0]["header"] == "ok");
      CHECK(r["files"][1]["header"] == "bad");
      CHECK_THAT(r["files"][1]["error"].get<std::string>(),
                 Catch::Contains(std::to_string(extra) + " bytes after the data section"));
    }
  }

  // Rank 1's file from another run: another lr in group 0, one step more.
  std::vector<sa_group_config> groups = io_groups();
  groups[0].lr = 0.25;
  auto other = make_ranks(prob, mesh_scenario("Shard(0) over 2", {2}, {shard(0)}),
                          prob.initial_values(), groups);
  for (auto& r : other) {
    r->step(0);
    r->step(1);
  }
  const nlohmann::json mixed = inspect({blobs[0], other[1]->export_blob()}, 0);
  CHECK(mixed["ok"] == false);
  const std::string status = mixed["groups"].get<std::string>();
  CHECK_THAT(
      status,
      Catch::Contains("group 0: lr 0.01 in file 0, 0.25 in file 1; step 1 in file 0, 2 in file 1"));
}
