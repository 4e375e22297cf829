// tests/test_state_io_errors.cpp — bad shard files and bad calls: each gets its own status
// and a message that says what is wrong and where, and leaves the optimizer exactly as it
// was (states, groups, step counts, and a step still allowed). A failure while the state
// is being copied marks the optimizer unusable until an import succeeds.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>
#include <utility>

#include "src/state_io/crc32c.hpp"
#include "test_state_io_support.hpp"

namespace {

using namespace sa_test;
using nlohmann::json;

constexpr int kSaveAt = 3;

uint64_t header_length(const Bytes& blob) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | blob[static_cast<std::size_t>(i)];
  return n;
}

// "offset [a, b] shape [c, d]", as the messages write a box.
std::string box_text(const json& offset, const json& shape) {
  auto dims = [](const json& d) {
    std::string out = "[";
    for (std::size_t i = 0; i < d.size(); ++i)
      out += (i ? ", " : "") + std::to_string(d[i].get<int64_t>());
    return out + "]";
  };
  return "offset " + dims(offset) + " shape " + dims(shape);
}

json header_of(const Bytes& blob) {
  const uint64_t n = header_length(blob);
  return json::parse(blob.begin() + 8, blob.begin() + 8 + static_cast<std::ptrdiff_t>(n));
}

// The header checksum as docs/shard-files.md defines it, written from that text:
// CRC-32C of the compact, key-sorted JSON of the metadata without header_crc32c plus each
// tensor's dtype and shape.
std::string header_crc_of(const json& header) {
  json canonical = json::object();
  canonical["__metadata__"] = header.at("__metadata__");
  canonical["__metadata__"].erase("header_crc32c");
  for (const auto& [name, entry] : header.items())
    if (name != "__metadata__") canonical[name] = {{"dtype", entry.at("dtype")}, {"shape", entry.at("shape")}};
  const std::string text = canonical.dump();
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", sa::crc32c(0, text.data(), text.size()));
  return hex;
}

// `blob` with its header edited by `edit` and, with `reseal`, its header checksum
// recomputed (so the edit is seen by the checks after it). The data section is kept.
Bytes edit_header(const Bytes& blob, const std::function<void(json&)>& edit, bool reseal = true) {
  const uint64_t n = header_length(blob);
  json header = json::parse(blob.begin() + 8, blob.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  edit(header);
  if (reseal) header["__metadata__"]["header_crc32c"] = header_crc_of(header);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  Bytes out;
  out.reserve(8 + text.size() + blob.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(text.size() >> (8 * i)));
  for (char c : text) out.push_back(static_cast<unsigned char>(c));
  out.insert(out.end(), blob.begin() + 8 + static_cast<std::ptrdiff_t>(n), blob.end());
  return out;
}

// Edits the JSON held in the metadata string `key`.
void edit_metadata(json& header, const char* key, const std::function<void(json&)>& edit) {
  json value = json::parse(header["__metadata__"][key].get<std::string>());
  edit(value);
  header["__metadata__"][key] = value.dump();
}

// A checkpoint saved on 2 ranks (Shard(0)) after kSaveAt steps.
const std::vector<Bytes>& saved_blobs() {
  static const std::vector<Bytes> blobs = [] {
    const Problem& prob = io_problem();
    auto ranks = make_ranks(prob, mesh_scenario("Shard(0) over 2", {2}, {shard(0)}), prob.initial_values());
    for (int s = 0; s < kSaveAt; ++s)
      for (auto& r : ranks) r->step(s);
    std::vector<Bytes> out;
    for (auto& r : ranks) out.push_back(r->export_blob());
    return out;
  }();
  return blobs;
}

// The optimizer imports are tried on: unsharded, one step in, other hyperparameters; its
// snapshot before the import is what every failed import must leave.
struct Target {
  const Problem& prob;
  Rank rank;
  Snapshot before;
  explicit Target(const Problem& p = io_problem())
      : prob(p), rank(p, unsharded_scenario(), 0, p.initial_values(), other_groups()) {
    rank.step(0);
    before = snapshot(rank.opt(), prob);
  }
  sa_optimizer* opt() const { return rank.opt(); }
  // Nothing changed, and a step is still allowed (on a copy of the state, so the
  // snapshot stays comparable: the step's result is not looked at).
  void check_unchanged() const {
    CHECK(snapshot(rank.opt(), prob) == before);
    CHECK_FALSE(has_failure_marker());
  }
  bool has_failure_marker() const {
    // A step on a sound optimizer succeeds; export succeeding shows the same without
    // changing the state.
    sa_writer writer = SA_WRITER_INIT;
    REQUIRE_SA_OK(nullptr, sa_memory_writer(&writer));
    const sa_status status = sa_optimizer_export(rank.opt(), &writer);
    sa_writer_release(&writer);
    return status != SA_OK;
  }
};

// A reader over a blob that can fail its n-th read, or return corrupted bytes when a range
// is read a second time (the blob changing under the import).
// With `concurrent` it says so (sa_reader.concurrent), keeps its books under a lock, notes
// the threads that call it, can fail every read from an offset on, and sleeps a little
// per read so that a parallel import spreads its reads over its threads.
struct TestReader {
  const Bytes* blob = nullptr;
  int64_t fail_read = -1;
  bool corrupt_rereads = false;
  int64_t reads = 0;
  std::vector<uint64_t> seen;   // offsets read
  std::vector<uint64_t> asked;  // offsets asked for, failed reads too
  bool concurrent = false;
  uint64_t fail_from = UINT64_MAX;
  std::set<std::thread::id> threads;
  std::mutex mutex;

  TestReader() = default;
  TestReader(const TestReader& other) : blob(other.blob), concurrent(other.concurrent) {}

  static int read_at(void* ctx, uint64_t offset, void* dst, std::size_t bytes) {
    auto* r = static_cast<TestReader*>(ctx);
    std::unique_lock<std::mutex> lock(r->mutex, std::defer_lock);
    if (r->concurrent) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
      r->threads.insert(std::this_thread::get_id());
    }
    const int64_t index = r->reads++;
    r->asked.push_back(offset);
    if (index == r->fail_read || offset >= r->fail_from || offset + bytes > r->blob->size()) return 1;
    std::memcpy(dst, r->blob->data() + offset, bytes);
    const bool again = std::find(r->seen.begin(), r->seen.end(), offset) != r->seen.end();
    r->seen.push_back(offset);
    if (again && r->corrupt_rereads && bytes > 0) static_cast<unsigned char*>(dst)[bytes / 2] ^= 0x40;
    return 0;
  }
  sa_reader reader() {
    sa_reader out = SA_READER_INIT;
    out.ctx = this;
    out.size = blob->size();
    out.read_at = read_at;
    out.name = "test reader";
    out.concurrent = concurrent ? 1 : 0;
    return out;
  }
};

sa_status import_with(sa_optimizer* opt, std::vector<TestReader>& test_readers, const sa_import_options* options) {
  std::vector<sa_reader> readers;
  for (TestReader& t : test_readers) readers.push_back(t.reader());
  std::vector<const sa_reader*> pointers;
  for (const sa_reader& r : readers) pointers.push_back(&r);
  return sa_optimizer_import(opt, static_cast<int32_t>(pointers.size()), pointers.data(), options);
}

}  // namespace

TEST_CASE("a good import into the test target works, so the failures below are the inputs' fault",
          "[state_io][errors]") {
  Target target;
  REQUIRE_SA_OK(target.opt(), import_blobs(target.opt(), saved_blobs()));
  CHECK_FALSE(snapshot(target.opt(), io_problem()) == target.before);
  check_groups_restored(target.opt(), io_groups(), kSaveAt);
}

TEST_CASE("a NUL byte in the header padding: SA_ERR_FORMAT (not the end of the JSON)", "[state_io][errors]") {
  Target target;
  Bytes blob = saved_blobs()[0];
  const std::size_t header_end = 8 + static_cast<std::size_t>(header_length(blob));
  REQUIRE(blob[header_end - 1] == ' ');  // the data section is 8-byte aligned by padding
  blob[header_end - 1] = 0;
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {blob, saved_blobs()[1]}),
                 "NUL byte");
  target.check_unchanged();
}

TEST_CASE("truncated files: SA_ERR_FORMAT, nothing changed", "[state_io][errors]") {
  Target target;
  const Bytes& blob = saved_blobs()[1];
  const std::size_t header_end = 8 + static_cast<std::size_t>(header_length(blob));
  for (std::size_t size : {std::size_t{0}, std::size_t{5}, std::size_t{8}, std::size_t{9}, header_end / 2,
                           header_end - 1, header_end, header_end + 100, blob.size() - 1}) {
    INFO("truncated to " << size << " of " << blob.size() << " bytes");
    const Bytes cut(blob.begin(), blob.begin() + static_cast<std::ptrdiff_t>(size));
    CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {saved_blobs()[0], cut}),
                   "sa_optimizer_import: blob 1");
  }
  target.check_unchanged();
}

TEST_CASE(
    "bytes after the data section: SA_ERR_FORMAT naming the blob and how many, nothing changed",
    "[state_io][errors]") {
  // The safetensors package refuses such files ("file not fully covered"); so do we, for
  // any count and content, and for a file with no tensors at all (an HSDP replica's).
  Target target;
  Rng rng(99);
  const Problem& prob = io_problem();
  auto replicas = make_ranks(prob, mesh_scenario("Replicate over 2", {2}, {replicate()}),
                             prob.initial_values());
  for (int s = 0; s < kSaveAt; ++s)
    for (auto& r : replicas) r->step(s);  // the same checkpoint as saved_blobs()
  const Bytes no_tensors = replicas[1]->export_blob();
  REQUIRE(header_of(no_tensors).size() == 1);  // __metadata__ only
  for (std::size_t extra : {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{4096}}) {
    Bytes longer = saved_blobs()[1];
    for (std::size_t i = 0; i < extra; ++i)
      longer.push_back(static_cast<unsigned char>(rng.integer(0, 255)));
    INFO(extra << " extra bytes");
    const std::string count = std::to_string(extra) + " bytes after the data section";
    CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT,
                   import_blobs(target.opt(), {saved_blobs()[0], longer}), "blob 1", count.c_str());
    Bytes empty_longer = no_tensors;
    empty_longer.resize(no_tensors.size() + extra, 0);
    CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT,
                   import_blobs(target.opt(), {saved_blobs()[0], saved_blobs()[1], empty_longer}),
                   "blob 2", count.c_str());
  }
  target.check_unchanged();
}

TEST_CASE(
    "a header that is not JSON: SA_ERR_FORMAT saying where and what was expected, no file bytes "
    "echoed",
    "[state_io][errors]") {
  Target target;
  const Bytes& blob = saved_blobs()[0];
  const std::string header(blob.begin() + 8,
                           blob.begin() + 8 + static_cast<std::ptrdiff_t>(header_length(blob)));
  const std::size_t in_string = header.find("shardadam");       // inside a metadata value
  const std::size_t separator = header.find("\"format\"") + 8;  // the ':' after a key
  REQUIRE(header[separator] == ':');
  struct Case {
    std::size_t at;
    unsigned char byte;
    const char* says;
  };
  for (const Case& c :
       {Case{in_string, 0xFF, "ill-formed UTF-8"}, Case{in_string, 0x01, "control character"},
        Case{separator, 0xC3, "expected ':'"}, Case{separator, 'x', "expected ':'"}}) {
    Bytes bad = blob;
    bad[8 + c.at] = c.byte;
    INFO("header byte " << c.at << " set to " << int(c.byte));
    const std::string where = "at byte " + std::to_string(c.at) + " of the header";
    CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {bad, saved_blobs()[1]}),
                   "blob 0", "the header is not valid JSON", where.c_str(), c.says);
    const std::string message = sa_optimizer_last_error(target.opt());
    // Only printable ASCII: the message is no carrier of the file's bytes.
    CHECK(std::all_of(message.begin(), message.end(),
                      [](char ch) { return ch >= 0x20 && ch < 0x7F; }));
    CHECK_THAT(message, !Catch::Contains("last read"));
  }
  target.check_unchanged();
}

TEST_CASE("a header length pointing past the end of the file: SA_ERR_FORMAT", "[state_io][errors]") {
  Target target;
  Bytes blob = saved_blobs()[0];
  const uint64_t past = blob.size() - 8 + 1;
  for (int i = 0; i < 8; ++i) blob[static_cast<std::size_t>(i)] = static_cast<unsigned char>(past >> (8 * i));
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {blob, saved_blobs()[1]}),
                 "blob 0", "header length field says", "truncated");
  target.check_unchanged();
}

TEST_CASE("a flipped bit anywhere in the header: SA_ERR_FORMAT, nothing changed", "[state_io][errors]") {
  // Every byte of the length field, the JSON and its padding, one bit at a time: JSON
  // syntax, the container's checks and the header checksum leave no flip unnoticed.
  Target target;
  const Bytes& blob = saved_blobs()[0];
  const std::size_t header_end = 8 + static_cast<std::size_t>(header_length(blob));
  int checksum_catches = 0;
  std::vector<Bytes> blobs = saved_blobs();
  Bytes& bad = blobs[0];  // flipped in place and back: a copy per flip would cost more than the import
  for (std::size_t at = 0; at < header_end; ++at) {
    for (unsigned char bit : {0x01, 0x20}) {
      bad[at] ^= bit;
      const sa_status status = import_blobs(target.opt(), blobs);
      bad[at] ^= bit;
      const std::string message = sa_optimizer_last_error(target.opt());
      INFO("byte " << at << " ('" << static_cast<char>(blob[at]) << "') ^ " << int(bit) << ": "
                   << sa_status_string(status) << ": " << message);
      REQUIRE(status == SA_ERR_FORMAT);
      checksum_catches += message.find("header checksum") != std::string::npos;
    }
  }
  CHECK(checksum_catches > 100);  // flips inside names and values, which parse fine
  target.check_unchanged();
}

TEST_CASE("a flipped bit in the data: SA_ERR_FORMAT naming the tensor and block, nothing changed",
          "[state_io][errors]") {
  Target target;
  const Bytes& blob = saved_blobs()[0];
  const std::size_t header_end = 8 + static_cast<std::size_t>(header_length(blob));
  Rng rng(17);
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t at = static_cast<std::size_t>(rng.integer(static_cast<int64_t>(header_end),
                                                                static_cast<int64_t>(blob.size()) - 1));
    Bytes bad = blob;
    bad[at] ^= static_cast<unsigned char>(1u << rng.integer(0, 7));
    INFO("data byte " << at);
    CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {bad, saved_blobs()[1]}),
                   "blob 0", "tensor '", "block", "has checksum", "the file is corrupt");
  }
  target.check_unchanged();
}

TEST_CASE("overlapping saved boxes: SA_ERR_MISMATCH naming both files, nothing changed", "[state_io][errors]") {
  Target target;
  CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH,
                 import_blobs(target.opt(), {saved_blobs()[0], saved_blobs()[1], saved_blobs()[0]}),
                 "param 'f32' state exp_avg", "exactly once", "blob 0's box", "blob 2's box", "both hold");
  // Overlap between different layouts of one checkpoint (rank 0 of 3 with rank 0 of 2).
  const Problem& prob = io_problem();
  auto three = make_ranks(prob, mesh_scenario("Shard(0) over 3", {3}, {shard(0)}), prob.initial_values());
  for (int s = 0; s < kSaveAt; ++s)
    for (auto& r : three) r->step(s);
  CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH,
                 import_blobs(target.opt(), {saved_blobs()[0], saved_blobs()[1], three[0]->export_blob()}),
                 "both hold the elements at offset [0, 0]");
  target.check_unchanged();
}

TEST_CASE(
    "a forged header whose saved boxes overlap elsewhere is refused by every rank, also one whose "
    "own box is covered once",
    "[state_io][errors]") {
  // Rank 1's file claims one of its boxes a few rows higher (checksums recomputed: the file
  // is self-consistent). The set of boxes then overlaps rank 0's and leaves the last rows
  // uncovered; a rank of 3 whose own rows avoid both (rows [0, 3) of 'f32' for the first
  // forgery) sees its box covered exactly once, yet the files are not one checkpoint.
  const Problem& prob = io_problem();
  const Scenario three = mesh_scenario("Shard(0) over 3", {3}, {shard(0)});
  auto targets = make_ranks(prob, three, prob.initial_values(), other_groups());
  std::vector<Snapshot> before;
  for (auto& t : targets) {
    t->step(0);
    before.push_back(snapshot(t->opt(), prob));
  }
  const json saved0 = header_of(saved_blobs()[0]);
  const json saved1 = header_of(saved_blobs()[1]);
  const json boxes0 = json::parse(saved0["__metadata__"]["tensors"].get<std::string>());
  const json boxes1 = json::parse(saved1["__metadata__"]["tensors"].get<std::string>());
  // The tensors rank 1's box can move up along dim 0 (non-empty, below row 0).
  std::vector<std::string> movable;
  for (const auto& [name, entry] : boxes1.items())
    if (entry["global_offset"][0] > 0 && saved1[name]["shape"][0] > 0 &&
        saved1[name]["shape"][1] > 0)
      movable.push_back(name);
  REQUIRE(movable.size() > 10);

  Rng rng(2024);
  for (int trial = 0; trial < 6; ++trial) {
    const std::string name = trial == 0 ? "f32/exp_avg"
                                        : movable[static_cast<std::size_t>(rng.integer(
                                              0, static_cast<int64_t>(movable.size()) - 1))];
    const int64_t at = boxes1[name]["global_offset"][0].get<int64_t>();
    const int64_t up = trial == 0 ? 1 : rng.integer(1, at);
    json moved_offset = boxes1[name]["global_offset"];
    moved_offset[0] = at - up;
    const Bytes forged = edit_header(saved_blobs()[1], [&](json& h) {
      edit_metadata(h, "tensors", [&](json& t) { t[name]["global_offset"] = moved_offset; });
    });
    const std::size_t slash = name.rfind('/');
    const std::string what =
        "param '" + name.substr(0, slash) + "' state " + name.substr(slash + 1);
    const std::string first =
        "blob 0's box (" + box_text(boxes0[name]["global_offset"], saved0[name]["shape"]) + ")";
    const std::string second =
        "blob 1's box (" + box_text(moved_offset, saved1[name]["shape"]) + ")";
    INFO(name << " moved up " << up << " rows");
    for (std::size_t r = 0; r < targets.size(); ++r) {
      INFO("rank " << r << " of 3");
      CHECK_SA_FAILS(targets[r]->opt(), SA_ERR_MISMATCH,
                     import_blobs(targets[r]->opt(), {saved_blobs()[0], forged}), what.c_str(),
                     "exactly once", first.c_str(), second.c_str(), "both hold the elements at");
      CHECK(snapshot(targets[r]->opt(), prob) == before[r]);
    }
  }
  // The same ranks take the true files.
  for (auto& t : targets) REQUIRE_SA_OK(t->opt(), import_blobs(t->opt(), saved_blobs()));
}

TEST_CASE("allow_unexpected: the tiling of params this optimizer does not have is not checked",
          "[state_io][errors]") {
  // The ignored params are never read, so whether their boxes tile is none of this
  // import's business (header and checksums are still checked: every header is).
  std::vector<GlobalParam> params = io_params();
  params.erase(params.begin() + 8);  // no "3d"
  const Problem fewer(params);
  Target target(fewer);
  const Bytes forged = edit_header(saved_blobs()[1], [](json& h) {
    edit_metadata(h, "tensors", [](json& t) { t["3d/exp_avg"]["global_offset"] = {1, 0, 0}; });
  });
  sa_import_options allow = import_options();
  allow.allow_unexpected = 1;
  REQUIRE_SA_OK(target.opt(), import_blobs(target.opt(), {saved_blobs()[0], forged}, &allow));
  // The same forgery in a param it has is refused.
  Target whole;
  CHECK_SA_FAILS(whole.opt(), SA_ERR_MISMATCH,
                 import_blobs(whole.opt(), {saved_blobs()[0], forged}, &allow),
                 "param '3d' state exp_avg", "both hold");
  whole.check_unchanged();
}

TEST_CASE("a coverage gap: SA_ERR_MISMATCH naming an uncovered element, nothing changed", "[state_io][errors]") {
  Target target;
  CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH, import_blobs(target.opt(), {saved_blobs()[0]}),
                 "param 'f32' state exp_avg", "do not cover its global shape [9, 37] exactly once",
                 "185 of 333 elements are covered", "element [5, 0] is in no saved box");
  target.check_unchanged();
}

TEST_CASE("a wrong global shape: SA_ERR_MISMATCH with both shapes, nothing changed", "[state_io][errors]") {
  // An optimizer whose 'f32' is [9, 38] ...
  std::vector<GlobalParam> params = io_params();
  params[0].shape = {9, 38};
  const Problem wider(params);
  Target target(wider);
  CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH, import_blobs(target.opt(), saved_blobs()),
                 "param 'f32' state exp_avg", "global shape [9, 37]", "global shape is [9, 38]");
  target.check_unchanged();
  // ... and a file that claims another global shape.
  Target plain;
  const Bytes edited = edit_header(saved_blobs()[1], [](json& h) {
    edit_metadata(h, "tensors", [](json& t) { t["big/exp_avg_sq"]["global_shape"] = {521, 1031}; });
  });
  CHECK_SA_FAILS(plain.opt(), SA_ERR_MISMATCH, import_blobs(plain.opt(), {saved_blobs()[0], edited}),
                 "param 'big' state exp_avg_sq", "blob 1 holds it with global shape [521, 1031]");
  plain.check_unchanged();
}

TEST_CASE("an unknown dtype, or a dtype a state key never has: SA_ERR_FORMAT", "[state_io][errors]") {
  Target target;
  const Bytes f64 = edit_header(saved_blobs()[0], [](json& h) { h["f32/exp_avg"]["dtype"] = "F64"; });
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {f64, saved_blobs()[1]}),
                 "blob 0", "tensor 'f32/exp_avg' has dtype 'F64'");
  const Bytes f16 = edit_header(saved_blobs()[0], [](json& h) {
    h["bf16.master.amsgrad.bf16moments/exp_avg"]["dtype"] = "F16";
  });
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {f16, saved_blobs()[1]}),
                 "stored as F16", "exp_avg is stored as F32, BF16, U8 or F8_E4M3");
  target.check_unchanged();
}

TEST_CASE("files of another format: SA_ERR_FORMAT saying what they are not", "[state_io][errors]") {
  Target target;
  // A plain safetensors file (what safetensors.numpy.save_file writes), no metadata.
  const std::string plain = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  Bytes st(8);
  st[0] = static_cast<unsigned char>(plain.size());
  st.insert(st.end(), plain.begin(), plain.end());
  st.resize(st.size() + 8, 0);
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {st}),
                 "a safetensors file, but not a shardadam shard file", "__metadata__ is missing");
  // A safetensors file with someone else's metadata.
  const Bytes other = edit_header(saved_blobs()[0], [](json& h) { h["__metadata__"]["format"] = "pt"; });
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {other}),
                 "not a shardadam shard file", "has no \"format\": \"shardadam\"");
  // Random bytes, text, nothing.
  Rng rng(3);
  Bytes noise(4096);
  for (auto& b : noise) b = static_cast<unsigned char>(rng.integer(0, 255));
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {noise}), "header length field");
  const std::string text = "{\"not\": \"a shard file\", \"just\": \"json text\"}\n";
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {Bytes(text.begin(), text.end())}),
                 "header length field");
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {Bytes()}), "blob 0", "empty");
  target.check_unchanged();
}

TEST_CASE("a newer format version: SA_ERR_UNSUPPORTED, an edit without resealing: the header checksum",
          "[state_io][errors]") {
  Target target;
  const Bytes v5 = edit_header(saved_blobs()[0], [](json& h) { h["__metadata__"]["format_version"] = "5"; });
  CHECK_SA_FAILS(target.opt(), SA_ERR_UNSUPPORTED, import_blobs(target.opt(), {v5, saved_blobs()[1]}),
                 "format version '5'", "reads versions 1 to 4", "newer shardadam");
  const Bytes edited = edit_header(
      saved_blobs()[0],
      [](json& h) { edit_metadata(h, "groups", [](json& g) { g[0]["lr"] = 1.0; }); }, false);
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {edited, saved_blobs()[1]}),
                 "the header checksum does not match", "corrupted or edited");
  // A rewrite that keeps the meaning (another key order and spacing) keeps the checksum.
  const Bytes respelled = edit_header(saved_blobs()[0], [](json&) {}, false);
  CHECK(respelled != saved_blobs()[0]);
  Target other;
  REQUIRE_SA_OK(other.opt(), import_blobs(other.opt(), {respelled, saved_blobs()[1]}));
  target.check_unchanged();
}

TEST_CASE("per-param step counts travel in the files (format 2), a version 1 file gives each param its "
          "group's count, files that disagree about a param's count are SA_ERR_MISMATCH",
          "[state_io][errors][steps]") {
  const Problem& prob = io_problem();
  const auto n = static_cast<int64_t>(prob.params.size());
  auto ranks = make_ranks(prob, mesh_scenario("Shard(0) over 2", {2}, {shard(0)}), prob.initial_values());
  for (int s = 0; s < kSaveAt; ++s)
    for (auto& r : ranks) r->step(s);
  // Counts as a torch state dict brings them: every param its own.
  std::vector<int64_t> saved_steps(prob.params.size());
  for (std::size_t k = 0; k < saved_steps.size(); ++k) saved_steps[k] = 3 + static_cast<int64_t>(k % 3) * 4;
  for (auto& r : ranks) REQUIRE_SA_OK(r->opt(), sa_optimizer_set_param_steps(r->opt(), 0, n, saved_steps.data()));
  const std::vector<Bytes> blobs = {ranks[0]->export_blob(), ranks[1]->export_blob()};
  {
    Target target;
    REQUIRE_SA_OK(target.opt(), import_blobs(target.opt(), blobs));
    CHECK(snapshot(target.opt(), prob).param_steps == saved_steps);
  }
  {  // the same files written by a version 1 writer: no "params"
    std::vector<Bytes> v1;
    for (const Bytes& b : blobs)
      v1.push_back(edit_header(b, [](json& h) {
        h["__metadata__"]["format_version"] = "1";
        h["__metadata__"].erase("params");
      }));
    Target target;
    REQUIRE_SA_OK(target.opt(), import_blobs(target.opt(), v1));
    std::vector<int64_t> group_steps;
    for (const GlobalParam& p : prob.params) group_steps.push_back(step_count(ranks[0]->opt(), p.group));
    CHECK(snapshot(target.opt(), prob).param_steps == group_steps);
  }
  {  // rank 1's file says another count for a param both files hold
    const Bytes forged = edit_header(blobs[1], [&](json& h) {
      edit_metadata(h, "params", [&](json& params) { params[prob.params[0].name]["step"] = 99; });
    });
    Target target;
    CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH, import_blobs(target.opt(), {blobs[0], forged}),
                   ("param '" + prob.params[0].name + "'").c_str(), "says its step count is", "99");
    target.check_unchanged();
    // A file whose "params" lacks a param it holds tensors of is not a sound shard file.
    const Bytes lacking = edit_header(blobs[1], [&](json& h) {
      edit_metadata(h, "params", [&](json& params) { params.erase(prob.params[0].name); });
    });
    CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {blobs[0], lacking}),
                   "has no entry for its param in __metadata__ \"params\"");
    target.check_unchanged();
  }
}

TEST_CASE("state keys that differ (master kind, amsgrad): SA_ERR_MISMATCH listing both sets",
          "[state_io][errors]") {
  std::vector<GlobalParam> params = io_params();
  params[2].master = SA_MASTER_REMAINDER;  // bf16.master keeps a remainder here
  const Problem remainder(params);
  Target target(remainder);
  CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH, import_blobs(target.opt(), saved_blobs()),
                 "param 'bf16.master'", "the shard files hold the states {exp_avg, exp_avg_sq, master}",
                 "this param has {exp_avg, exp_avg_sq, remainder}");
  target.check_unchanged();
}

TEST_CASE("groups: a different number, or amsgrad where the params lack its state: SA_ERR_MISMATCH",
          "[state_io][errors]") {
  Target target;
  sa_group_config extra = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(target.opt(), sa_optimizer_add_group(target.opt(), &extra, nullptr));
  target.before = snapshot(target.opt(), io_problem());
  CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH, import_blobs(target.opt(), saved_blobs()),
                 "the shard files hold 2 groups but this optimizer has 3", "restore_groups = 0");
  target.check_unchanged();
  // restore_groups = 0: the states load, the groups and steps stay.
  sa_import_options keep = import_options();
  keep.restore_groups = 0;
  REQUIRE_SA_OK(target.opt(), import_blobs(target.opt(), saved_blobs(), &keep));
  const Snapshot after = snapshot(target.opt(), io_problem());
  CHECK(after.groups == target.before.groups);
  CHECK(after.steps == target.before.steps);
  CHECK(after.states != target.before.states);
}

TEST_CASE("files of different checkpoints (other step counts): SA_ERR_MISMATCH", "[state_io][errors]") {
  Target target;
  const Problem& prob = io_problem();
  auto later = make_ranks(prob, mesh_scenario("Shard(0) over 2", {2}, {shard(0)}), prob.initial_values());
  for (int s = 0; s <= kSaveAt; ++s)
    for (auto& r : later) r->step(s);
  CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH,
                 import_blobs(target.opt(), {saved_blobs()[0], later[1]->export_blob()}),
                 "the shard files disagree about group 0: step 3 in blob 0, 4 in blob 1",
                 "different checkpoints");
  target.check_unchanged();
}

TEST_CASE(
    "files that disagree about a group's hyperparameter: SA_ERR_MISMATCH naming the field and both "
    "values",
    "[state_io][errors]") {
  // Whatever restore_groups says: files that disagree are not one checkpoint. The values
  // are spelled as the files spell them (JSON numbers), e.g. "lr 0.005 in blob 0".
  struct Edit {
    int group;
    const char* field;
    json value;
    const char* want;
  };
  const std::vector<Edit> edits = {
      {1, "lr", 0.25, "group 1: lr 0.005 in blob 0, 0.25 in blob 1"},
      {0, "eps", 1e-6, "group 0: eps 1e-08 in blob 0, 1e-06 in blob 1"},
      {1, "beta1", 0.75, "group 1: beta1 0.8 in blob 0, 0.75 in blob 1"},
      {0, "maximize", 1, "group 0: maximize 0 in blob 0, 1 in blob 1"},
      {1, "amsgrad", 0, "group 1: amsgrad 1 in blob 0, 0 in blob 1"},
  };
  Target target;
  for (int32_t restore : {1, 0}) {
    sa_import_options options = import_options();
    options.restore_groups = restore;
    for (const Edit& e : edits) {
      INFO("restore_groups " << restore << ", group " << e.group << " " << e.field);
      const Bytes edited = edit_header(saved_blobs()[1], [&](json& h) {
        edit_metadata(h, "groups", [&](json& g) { g[e.group][e.field] = e.value; });
      });
      CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH,
                     import_blobs(target.opt(), {saved_blobs()[0], edited}, &options), e.want,
                     "different checkpoints");
    }
  }
  target.check_unchanged();
}

TEST_CASE("params missing from the files, or only in the files: errors unless allowed", "[state_io][errors]") {
  std::vector<GlobalParam> params = io_params();
  params.push_back({"extra", {4, 4}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0});
  const Problem with_extra(params);
  Target target(with_extra);
  CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH, import_blobs(target.opt(), saved_blobs()),
                 "param 'extra' is in none of the 2 shard files", "allow_missing = 1");
  target.check_unchanged();
  sa_import_options allow = import_options();
  allow.allow_missing = 1;
  REQUIRE_SA_OK(target.opt(), import_blobs(target.opt(), saved_blobs(), &allow));
  const Snapshot after = snapshot(target.opt(), with_extra);
  CHECK(after.states.back() == target.before.states.back());  // 'extra' kept its state
  CHECK(after.states.front() != target.before.states.front());

  params = io_params();
  params.erase(params.begin() + 8);  // no "3d"
  const Problem fewer(params);
  Target small(fewer);
  CHECK_SA_FAILS(small.opt(), SA_ERR_MISMATCH, import_blobs(small.opt(), saved_blobs()),
                 "the shard files hold 1 param(s) this optimizer does not have: '3d'",
                 "allow_unexpected = 1");
  small.check_unchanged();
  allow = import_options();
  allow.allow_unexpected = 1;
  REQUIRE_SA_OK(small.opt(), import_blobs(small.opt(), saved_blobs(), &allow));
}

TEST_CASE("a reader that fails before the copy: SA_ERR_IO naming the blob, nothing changed",
          "[state_io][errors]") {
  Target target;
  for (int64_t fail_read : {0, 1, 2}) {  // the length, the header, the first data block
    std::vector<TestReader> readers(2);
    readers[0].blob = &saved_blobs()[0];
    readers[1].blob = &saved_blobs()[1];
    readers[1].fail_read = fail_read;
    INFO("read " << fail_read << " fails");
    CHECK_SA_FAILS(target.opt(), SA_ERR_IO, import_with(target.opt(), readers, nullptr),
                   "blob 1 ('test reader')", "failed");
  }
  target.check_unchanged();
}

TEST_CASE("a concurrent reader is read on the import's threads, and a failed block read is reported as a sequential "
          "one is, nothing changed",
          "[state_io][errors]") {
  const Problem& prob = io_problem();
  Rank target(prob, unsharded_scenario(), 0, prob.initial_values(), other_groups(), 4);
  target.step(0);
  const Snapshot before = snapshot(target.opt(), prob);
  // Every read from 1 MiB into blob 1's data on fails: the report names the first failed
  // read in the blob's order (the lowest such offset asked for), whichever thread met a
  // failure first.
  std::vector<TestReader> readers(2);
  for (int f = 0; f < 2; ++f) {
    readers[f].blob = &saved_blobs()[f];
    readers[f].concurrent = true;
  }
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, saved_blobs()[1].data(), 8);
  readers[1].fail_from = 8 + header_bytes + (uint64_t{1} << 20);
  CHECK(import_with(target.opt(), readers, nullptr) == SA_ERR_IO);
  uint64_t first_failed = UINT64_MAX;
  for (uint64_t offset : readers[1].asked)
    if (offset >= readers[1].fail_from) first_failed = std::min(first_failed, offset);
  CHECK_THAT(sa_optimizer_last_error(target.opt()),
             Catch::Contains("blob 1 ('test reader')") &&
                 Catch::Contains("at offset " + std::to_string(first_failed) + ") failed"));
  CHECK(snapshot(target.opt(), prob) == before);

  std::vector<TestReader> good(2);
  for (int f = 0; f < 2; ++f) {
    good[f].blob = &saved_blobs()[f];
    good[f].concurrent = true;
  }
  REQUIRE_SA_OK(target.opt(), import_with(target.opt(), good, nullptr));
  CHECK(good[0].threads.size() + good[1].threads.size() > 2);  // not all on one thread
  Rank reference(prob, unsharded_scenario(), 0, prob.initial_values(), other_groups(), 1);
  REQUIRE_SA_OK(reference.opt(), import_blobs(reference.opt(), saved_blobs()));
  CHECK(snapshot(target.opt(), prob) == snapshot(reference.opt(), prob));

  sa_reader bad = good[0].reader();
  bad.concurrent = 2;
  const sa_reader* list[] = {&bad};
  CHECK_SA_FAILS(target.opt(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_import(target.opt(), 1, list, nullptr),
                 "concurrent is 2; it must be 0 or 1");
}

TEST_CASE("a file cut short after its reader opened it (reads come back short): SA_ERR_IO, nothing changed",
          "[state_io][errors]") {
  Target target;
  const std::string dir = std::filesystem::temp_directory_path().string();
  std::vector<std::string> paths;
  std::vector<sa_reader> readers(2);
  for (int f = 0; f < 2; ++f) {
    paths.push_back(dir + "/shardadam_short_" + std::to_string(::getpid()) + "_" + std::to_string(f) + ".safetensors");
    std::ofstream(paths[f], std::ios::binary)
        .write(reinterpret_cast<const char*>(saved_blobs()[f].data()),
               static_cast<std::streamsize>(saved_blobs()[f].size()));
    REQUIRE_SA_OK(nullptr, sa_file_reader(paths[f].c_str(), &readers[f]));
  }
  // The reader took the size at open; the file loses its last 100 000 bytes after that.
  std::filesystem::resize_file(paths[1], saved_blobs()[1].size() - 100000);
  const sa_reader* list[] = {&readers[0], &readers[1]};
  CHECK_SA_FAILS(target.opt(), SA_ERR_IO, sa_optimizer_import(target.opt(), 2, list, nullptr), "blob 1 ('",
                 "shardadam_short_", ") failed");
  target.check_unchanged();
  for (int f = 0; f < 2; ++f) {
    sa_reader_release(&readers[f]);
    std::filesystem::remove(paths[f]);
  }
}

TEST_CASE("read_once: data larger than the staging are read once, and a damaged block met while copying is "
          "SA_ERR_FORMAT and leaves the optimizer unusable",
          "[state_io][errors]") {
  sa_import_options once = import_options(1);  // one 1 MiB block of staging: less than the data
  once.read_once = 1;
  Target target;
  {
    std::vector<TestReader> readers(2);
    readers[0].blob = &saved_blobs()[0];
    readers[1].blob = &saved_blobs()[1];
    REQUIRE_SA_OK(target.opt(), import_with(target.opt(), readers, &once));
    for (const TestReader& r : readers) {
      std::vector<uint64_t> offsets = r.seen;
      std::sort(offsets.begin(), offsets.end());
      CHECK(std::adjacent_find(offsets.begin(), offsets.end()) == offsets.end());  // no offset twice
    }
    Target reference;
    const sa_import_options twice = import_options(1);
    std::vector<TestReader> again(2);
    again[0].blob = &saved_blobs()[0];
    again[1].blob = &saved_blobs()[1];
    REQUIRE_SA_OK(reference.opt(), import_with(reference.opt(), again, &twice));
    CHECK(snapshot(target.opt(), target.prob) == snapshot(reference.opt(), reference.prob));
    std::vector<uint64_t> offsets = again[0].seen;
    std::sort(offsets.begin(), offsets.end());
    CHECK(std::adjacent_find(offsets.begin(), offsets.end()) != offsets.end());  // the default reads twice
  }
  // The last data byte of blob 1 damaged: found after other blocks were copied.
  Bytes bad = saved_blobs()[1];
  bad.back() ^= 0x10;
  CHECK_SA_FAILS(target.opt(), SA_ERR_FORMAT, import_blobs(target.opt(), {saved_blobs()[0], bad}, &once),
                 "blob 1", "has checksum", "the file is corrupt", "partly overwritten", "refuses to step");
  CHECK(target.has_failure_marker());
  REQUIRE_SA_OK(target.opt(), import_blobs(target.opt(), saved_blobs(), &once));  // clears it
  CHECK_FALSE(target.has_failure_marker());
  // Data that fit the staging are checked before anything is copied, read_once or not.
  sa_import_options fits = import_options(0);
  fits.read_once = 1;
  Target unchanged;
  CHECK_SA_FAILS(unchanged.opt(), SA_ERR_FORMAT, import_blobs(unchanged.opt(), {saved_blobs()[0], bad}, &fits),
                 "the file is corrupt");
  unchanged.check_unchanged();
  fits.read_once = 2;
  CHECK_SA_FAILS(unchanged.opt(), SA_ERR_INVALID_ARGUMENT, import_blobs(unchanged.opt(), saved_blobs(), &fits),
                 "read_once is 2; it must be 0 or 1");
}

TEST_CASE("a failure while copying marks the optimizer unusable until an import succeeds",
          "[state_io][errors]") {
  // staging_bytes 1 (one 1 MiB block) is less than the data, so the copy re-reads it:
  // the last read of a blob is in the copy phase.
  const sa_import_options small = import_options(1);
  int64_t total_reads = 0;
  {
    Target probe;
    std::vector<TestReader> readers(2);
    readers[0].blob = &saved_blobs()[0];
    readers[1].blob = &saved_blobs()[1];
    REQUIRE_SA_OK(probe.opt(), import_with(probe.opt(), readers, &small));
    total_reads = readers[1].reads;
  }
  for (const char* how : {"read fails", "blob changed"}) {
    INFO(how);
    Target target;
    std::vector<TestReader> readers(2);
    readers[0].blob = &saved_blobs()[0];
    readers[1].blob = &saved_blobs()[1];
    if (std::string(how) == "read fails") {
      readers[1].fail_read = total_reads - 1;
      CHECK_SA_FAILS(target.opt(), SA_ERR_IO, import_with(target.opt(), readers, &small),
                     "blob 1 ('test reader')", "failed", "partly overwritten", "refuses to step");
    } else {
      readers[1].corrupt_rereads = true;
      CHECK_SA_FAILS(target.opt(), SA_ERR_IO, import_with(target.opt(), readers, &small),
                     "has checksum", "the blob changed during the import", "partly overwritten");
    }
    CHECK_SA_FAILS(target.opt(), SA_ERR_STATE, sa_optimizer_step(target.opt(), nullptr, nullptr),
                   "sa_optimizer_step: the optimizer state is unusable", "an import failed while it was copying",
                   "blob 1", "A successful sa_optimizer_import");
    CHECK(target.has_failure_marker());  // export refuses too
    {  // and so does an async export, with no job started
      sa_writer writer = SA_WRITER_INIT;
      REQUIRE_SA_OK(nullptr, sa_memory_writer(&writer));
      sa_export_job* job = nullptr;
      CHECK_SA_FAILS(target.opt(), SA_ERR_STATE, sa_optimizer_export_async(target.opt(), &writer, &job),
                     "unusable");
      CHECK(job == nullptr);
      sa_writer_release(&writer);
    }
    // A failed validation does not clear it ...
    CHECK_SA_FAILS(target.opt(), SA_ERR_MISMATCH, import_blobs(target.opt(), {saved_blobs()[0]}), "do not cover");
    CHECK_SA_FAILS(target.opt(), SA_ERR_STATE, sa_optimizer_step(target.opt(), nullptr, nullptr), "unusable");
    // ... a successful import does.
    REQUIRE_SA_OK(target.opt(), import_blobs(target.opt(), saved_blobs(), &small));
    CHECK_FALSE(target.has_failure_marker());
    REQUIRE_SA_OK(target.opt(), sa_optimizer_step(target.opt(), nullptr, nullptr));
  }
}

TEST_CASE("bad arguments to import, export and the readers and writers", "[state_io][errors]") {
  Target target;
  const sa_reader* null_reader = nullptr;
  CHECK_SA_FAILS(target.opt(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_import(target.opt(), -1, nullptr, nullptr),
                 "n is negative");
  CHECK_SA_FAILS(target.opt(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_import(target.opt(), 1, nullptr, nullptr),
                 "readers is NULL");
  CHECK_SA_FAILS(target.opt(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_import(target.opt(), 1, &null_reader, nullptr),
                 "blob 0: the reader is NULL");
  sa_reader released = SA_READER_INIT;
  REQUIRE_SA_OK(nullptr, sa_memory_reader(saved_blobs()[0].data(), saved_blobs()[0].size(), &released));
  sa_reader_release(&released);
  sa_reader_release(&released);  // twice: a no-op
  CHECK(released.concurrent == 0);
  {  // a released writer is cleared whole: no callback is left for a later call to reach
    sa_writer writer = SA_WRITER_INIT;
    REQUIRE_SA_OK(nullptr, sa_memory_writer(&writer));
    REQUIRE(writer.write_at != nullptr);
    sa_writer_release(&writer);
    const sa_writer cleared = SA_WRITER_INIT;
    CHECK(std::memcmp(&writer, &cleared, sizeof writer) == 0);
  }
  const sa_reader* pr = &released;
  CHECK_SA_FAILS(target.opt(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_import(target.opt(), 1, &pr, nullptr),
                 "read_at is NULL");
  sa_import_options options = import_options();
  options.allow_missing = 2;
  CHECK_SA_FAILS(target.opt(), SA_ERR_INVALID_ARGUMENT, import_blobs(target.opt(), saved_blobs(), &options),
                 "allow_missing is 2");
  options = import_options();
  options.struct_size = sizeof options + 8;
  CHECK_SA_FAILS(target.opt(), SA_ERR_UNSUPPORTED, import_blobs(target.opt(), saved_blobs(), &options),
                 "newer shardadam.h");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_optimizer_import(nullptr, 0, nullptr, nullptr), "opt is NULL");
  CHECK_SA_FAILS(target.opt(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_export(target.opt(), nullptr), "writer is NULL");
  sa_writer empty = SA_WRITER_INIT;
  CHECK_SA_FAILS(target.opt(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_export(target.opt(), &empty), "write is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_memory_reader(nullptr, 4, &released), "data is NULL");
  const void* data = nullptr;
  std::size_t size = 0;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_memory_writer_data(&empty, &data, &size),
                 "not a memory writer");
  target.check_unchanged();
}

TEST_CASE("a writer that fails: SA_ERR_IO, and commit is never called", "[state_io][errors]") {
  Target target;
  struct Failing {
    int64_t fail_at;
    int64_t writes = 0;
    int commits = 0;
    bool commit_fails = false;
  };
  for (int64_t fail_at : {0, 1, 5, -1}) {
    Failing f{fail_at};
    f.commit_fails = fail_at == -1;
    sa_writer writer = SA_WRITER_INIT;
    writer.ctx = &f;
    writer.write = [](void* ctx, const void*, std::size_t) {
      auto* w = static_cast<Failing*>(ctx);
      return w->writes++ == w->fail_at ? 1 : 0;
    };
    writer.commit = [](void* ctx) {
      auto* w = static_cast<Failing*>(ctx);
      ++w->commits;
      return w->commit_fails ? 1 : 0;
    };
    INFO("write " << fail_at << " fails");
    if (fail_at >= 0) {
      CHECK_SA_FAILS(target.opt(), SA_ERR_IO, sa_optimizer_export(target.opt(), &writer),
                     "sa_optimizer_export: the writer failed to write");
      CHECK(f.commits == 0);
    } else {
      CHECK_SA_FAILS(target.opt(), SA_ERR_IO, sa_optimizer_export(target.opt(), &writer),
                     "the writer failed to commit");
    }
  }
  target.check_unchanged();
}

namespace {

// Block moments: an optimizer of an 8-bit param "q8", a float8 one "f8" (600 elements:
// blocks of 256, 256, 88) and a float32 one "f32", one step in with grads of `scale`.
struct BlockMoments {
  HostTensor params[3] = {HostTensor({3, 200}, kFloat32), HostTensor({3, 200}, kFloat32),
                          HostTensor({3, 200}, kFloat32)};
  OptimizerPtr opt = make_optimizer();
  explicit BlockMoments(float scale) {
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &io_groups()[0], nullptr));
    const char* names[3] = {"q8", "f8", "f32"};
    const DLDataType moments[3] = {kUint8, kFloat8E4m3fn, kFloat32};
    HostTensor grad({3, 200}, kFloat32);
    for (int64_t i = 0; i < grad.numel(); ++i) grad.as<float>()[i] = scale * static_cast<float>(i % 17 - 8);
    for (int k = 0; k < 3; ++k) {
      const sa_param_options options = param_options(kDefaultDtype, moments[k], SA_MASTER_AUTO);
      REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), names[k], 0, params[k].versioned(),
                                                      nullptr, &options, nullptr));
      const DLTensor g = grad.dl();
      REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), k, &g));
    }
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  }
};

// Where tensor `name`'s data sits in `blob`.
std::pair<std::size_t, std::size_t> data_range(const Bytes& blob, const std::string& name) {
  const json entry = header_of(blob).at(name);
  const std::size_t base = 8 + header_length(blob);
  return {base + entry["data_offsets"][0].get<std::size_t>(), base + entry["data_offsets"][1].get<std::size_t>()};
}

}  // namespace

// The shard-file corpus for block moments: codes without their scales, scales without
// codes or of the wrong length or shape, another block size, checksum blocks that cut a
// block of codes, a negative absmax. Each is refused with a message naming the tensor,
// and the optimizer is left as it was.
TEST_CASE("block moments' codes and scales that do not belong together: SA_ERR_FORMAT, nothing changed",
          "[state_io][errors][quant8]") {
  BlockMoments saved(0.01f);
  const Bytes blob = export_blob(saved.opt.get());
  BlockMoments target(0.02f);
  const Bytes before = export_blob(target.opt.get());
  const auto unchanged = [&] { CHECK(export_blob(target.opt.get()) == before); };
  REQUIRE(header_of(blob).at("q8/exp_avg")["dtype"] == "U8");
  REQUIRE(header_of(blob).at("f8/exp_avg_sq")["dtype"] == "F8_E4M3");
  REQUIRE(header_of(blob).at("q8/exp_avg_absmax")["shape"] == json::array({3}));

  const auto without = [](const std::string& name) {
    return [name](json& h) {
      h.erase(name);
      edit_metadata(h, "tensors", [&](json& t) { t.erase(name); });
    };
  };
  CHECK_SA_FAILS(target.opt.get(), SA_ERR_FORMAT, import_blobs(target.opt.get(), {edit_header(blob, without("q8/exp_avg_absmax"))}),
                 "blob 0", "tensor 'q8/exp_avg' holds U8 codes but the file has no tensor 'q8/exp_avg_absmax'");
  unchanged();
  // The scales of a float32 moment (renamed from q8's): no codes to go with.
  const Bytes moved = edit_header(blob, [](json& h) {
    h["f32/exp_avg_absmax"] = h["q8/exp_avg_absmax"];
    h.erase("q8/exp_avg_absmax");
    edit_metadata(h, "tensors", [](json& t) {
      t["f32/exp_avg_absmax"] = t["q8/exp_avg_absmax"];
      t.erase("q8/exp_avg_absmax");
    });
  });
  CHECK_SA_FAILS(target.opt.get(), SA_ERR_FORMAT, import_blobs(target.opt.get(), {moved}),
                 "tensor 'f32/exp_avg_absmax' holds block scales but the file holds no block codes as tensor 'f32/exp_avg'");
  unchanged();
  // Two scales for three blocks (the third's bytes left out of every tensor).
  const Bytes shorter = edit_header(blob, [](json& h) {
    json& e = h["f8/exp_avg_absmax"];
    e["shape"] = {2};
    e["data_offsets"][1] = e["data_offsets"][0].get<int64_t>() + 8;
    edit_metadata(h, "tensors", [](json& t) { t["f8/exp_avg_absmax"]["crc32c"] = {0}; });
  });
  CHECK_SA_FAILS(target.opt.get(), SA_ERR_FORMAT, import_blobs(target.opt.get(), {shorter}),
                 "tensor 'f8/exp_avg_absmax' has shape [2] but 'f8/exp_avg' has 600 elements: 3 blocks of 256");
  unchanged();
  const Bytes square = edit_header(blob, [](json& h) { h["q8/exp_avg_sq_absmax"]["shape"] = {3, 1}; });
  CHECK_SA_FAILS(target.opt.get(), SA_ERR_FORMAT, import_blobs(target.opt.get(), {square}),
                 "tensor 'q8/exp_avg_sq_absmax' has shape [3, 1]", "one-dimensional");
  unchanged();
  const Bytes other_blocks = edit_header(blob, [](json& h) {
    edit_metadata(h, "tensors", [](json& t) { t["q8/exp_avg_absmax"]["block_elems"] = 128; });
  });
  CHECK_SA_FAILS(target.opt.get(), SA_ERR_UNSUPPORTED, import_blobs(target.opt.get(), {other_blocks}),
                 "tensors['q8/exp_avg_absmax'].block_elems is 128", "blocks of 256 elements");
  unchanged();
  // Checksum blocks of 200 bytes cut blocks of codes (every checksum recomputed to match).
  const Bytes cut = edit_header(blob, [&](json& h) {
    edit_metadata(h, "checksum", [](json& c) { c["block_bytes"] = 200; });
    edit_metadata(h, "tensors", [&](json& t) {
      for (auto& [name, entry] : t.items()) {
        const auto [begin, end] = data_range(blob, name);
        json crcs = json::array();
        for (std::size_t at = begin; at < end; at += 200)
          crcs.push_back(sa::crc32c(0, blob.data() + at, std::min<std::size_t>(200, end - at)));
        entry["crc32c"] = crcs;
      }
    });
  });
  CHECK_SA_FAILS(target.opt.get(), SA_ERR_FORMAT, import_blobs(target.opt.get(), {cut}),
                 "checksum.block_bytes 200 is not a multiple of 256");
  unchanged();
  // An absmax that no block has, its checksum made to match: found when the data are read.
  // A negative one, and those a `< 0` test lets through: -0.0 and a NaN with its sign bit
  // set; a NaN and an infinity (the writer writes neither).
  const auto [begin, end] = data_range(blob, "q8/exp_avg_absmax");
  const auto with_absmax_bits = [&](uint32_t bits, bool keep_magnitude) {
    Bytes damaged = blob;
    unsigned char* block1 = damaged.data() + begin + 4;  // block 1's absmax, little-endian
    uint32_t value = 0;
    std::memcpy(&value, block1, 4);
    value = keep_magnitude ? (value | bits) : bits;
    std::memcpy(block1, &value, 4);
    return edit_header(damaged, [&](json& h) {
      edit_metadata(h, "tensors", [&](json& t) {
        t["q8/exp_avg_absmax"]["crc32c"] = {sa::crc32c(0, damaged.data() + begin, end - begin)};
      });
    });
  };
  const std::pair<uint32_t, const char*> damaged_absmax[] = {
      {0x80000000u, "absmax -0.0"}, {0xffc00000u, "a NaN with its sign bit"},
      {0x7fc00000u, "a NaN"}, {0x7f800000u, "infinity"}};
  CHECK_SA_FAILS(target.opt.get(), SA_ERR_FORMAT, import_blobs(target.opt.get(), {with_absmax_bits(0x80000000u, true)}),
                 "tensor 'q8/exp_avg_absmax': block 1 has absmax -", "finite, its sign bit clear");
  unchanged();
  for (const auto& [bits, what] : damaged_absmax) {
    INFO(what);
    CHECK_SA_FAILS(target.opt.get(), SA_ERR_FORMAT, import_blobs(target.opt.get(), {with_absmax_bits(bits, false)}),
                   "tensor 'q8/exp_avg_absmax': block 1 has absmax ", "finite, its sign bit clear");
    unchanged();
  }
  // The blob itself loads, and restores the saved state bit for bit.
  REQUIRE(before != blob);
  REQUIRE_SA_OK(target.opt.get(), import_blobs(target.opt.get(), {blob}));
  CHECK(export_blob(target.opt.get()) == blob);
}
