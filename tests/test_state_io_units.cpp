// tests/test_state_io_units.cpp — the pieces under shard files, each against an independent
// reference: CRC-32C against published check values and a bit-at-a-time CRC; the
// safetensors header parser against hand-made headers (every rule it enforces); box
// coverage and the run cursor against brute force over every element.
#include <nlohmann/json.hpp>

#include "src/errors.hpp"
#include "src/state_io/box.hpp"
#include "src/state_io/crc32c.hpp"
#include "src/state_io/metadata.hpp"
#include "src/state_io/runs.hpp"
#include "src/state_io/safetensors.hpp"
#include "test_support.hpp"

namespace {

using namespace sa_test;
using Bytes = std::vector<unsigned char>;

// CRC-32C one bit at a time, straight from the definition (reflected 0x82F63B78).
uint32_t crc32c_bitwise(const unsigned char* p, std::size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// A safetensors blob: the 8-byte length, `json`, then `data_bytes` zero bytes.
Bytes blob_of(const std::string& json, std::size_t data_bytes) {
  Bytes out(8);
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<unsigned char>(n >> (8 * i));
  out.insert(out.end(), json.begin(), json.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

sa::SafetensorsHeader parse(const std::string& json, std::size_t data_bytes) {
  return sa::parse_safetensors_header(json, 8 + json.size() + data_bytes, "test blob");
}

#define CHECK_FORMAT_ERROR(expr, part)                                        \
  do {                                                                        \
    try {                                                                     \
      (void)(expr);                                                           \
      FAIL_CHECK("no error from " #expr);                                     \
    } catch (const sa::Error& e) {                                            \
      INFO(e.what());                                                         \
      CHECK(e.status() == SA_ERR_FORMAT);                                     \
      CHECK_THAT(std::string(e.what()), Catch::Contains(part));               \
    }                                                                         \
  } while (0)

}  // namespace

TEST_CASE("crc32c gives the published check values (RFC 3720 B.4, and \"123456789\")", "[state_io][crc]") {
  const std::string digits = "123456789";
  CHECK(sa::crc32c(0, digits.data(), digits.size()) == 0xE3069283u);
  Bytes zeros(32, 0), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
    down[static_cast<std::size_t>(i)] = static_cast<unsigned char>(31 - i);
  }
  CHECK(sa::crc32c(0, zeros.data(), 32) == 0x8A9136AAu);
  CHECK(sa::crc32c(0, ones.data(), 32) == 0x62A8AB43u);
  CHECK(sa::crc32c(0, up.data(), 32) == 0x46DD794Eu);
  CHECK(sa::crc32c(0, down.data(), 32) == 0x113FDB5Cu);
  CHECK(sa::crc32c(0, nullptr, 0) == 0u);
}

TEST_CASE("crc32c (instruction and slicing-by-8 paths) equals the bitwise CRC at every length and alignment, and chains",
          "[state_io][crc]") {
  Rng rng(31);
  Bytes data((std::size_t{1} << 20) + 64);
  for (auto& b : data) b = static_cast<unsigned char>(rng.integer(0, 255));
  for (std::size_t start = 0; start < 9; ++start) {
    // The long ones take the instruction path's three lanes of 4096 bytes (12288 at once).
    for (std::size_t n : std::initializer_list<std::size_t>{0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4096, 12287,
                                                            12288, 12289, 24576 + 4096 + 13, std::size_t{1} << 20}) {
      INFO("start " << start << ", length " << n);
      const uint32_t want = crc32c_bitwise(data.data() + start, n);
      CHECK(sa::crc32c(0, data.data() + start, n) == want);
      CHECK(sa::crc32c_table(0, data.data() + start, n) == want);
      // crc(a + b) from crc(a), split anywhere.
      const std::size_t split = n / 3;
      CHECK(sa::crc32c(sa::crc32c(0, data.data() + start, split), data.data() + start + split, n - split) == want);
      CHECK(sa::crc32c_table(sa::crc32c_table(0, data.data() + start, split), data.data() + start + split,
                             n - split) == want);
    }
  }
}

TEST_CASE("crc32c_blocks gives each block's CRC, on one thread or many", "[state_io][crc]") {
  Rng rng(77);
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1000}, std::size_t{3} << 20, (std::size_t{37} << 20) + 123}) {
    Bytes data(bytes);
    for (std::size_t i = 0; i < bytes; i += 4096) data[i] = static_cast<unsigned char>(rng.integer(0, 255));
    for (std::size_t block : {std::size_t{64}, std::size_t{1} << 20}) {
      INFO(bytes << " bytes in blocks of " << block);
      std::vector<uint32_t> got((bytes + block - 1) / block, 0);
      sa::crc32c_blocks(data.data(), bytes, block, got.data());
      for (std::size_t b = 0; b < got.size(); ++b)
        REQUIRE(got[b] == sa::crc32c(0, data.data() + b * block, std::min(block, bytes - b * block)));
    }
  }
}

TEST_CASE("the safetensors header round-trips and is padded to an 8-byte data section", "[state_io][safetensors]") {
  std::vector<sa::SafetensorsTensor> tensors = {
      {"a/exp_avg", "F32", {kDLFloat, 32, 1}, {2, 3}, 0, 24},
      {"b/remainder", "I16", {kDLInt, 16, 1}, {3}, 24, 30},
      {"c/exp_avg", "BF16", {kDLBfloat, 16, 1}, {0, 5}, 30, 30},
  };
  const std::string header = sa::encode_safetensors_header({{"k", "v"}, {"format", "x\"y"}}, tensors);
  CHECK(header.size() % 8 == 0);
  const std::string json = header.substr(8);
  const sa::SafetensorsHeader h = sa::parse_safetensors_header(json, header.size() + 30, "blob");
  CHECK(h.data_section == header.size());
  CHECK(h.has_metadata);
  CHECK(h.metadata.at("format") == "x\"y");
  REQUIRE(h.tensors.size() == 3);
  CHECK(h.tensors[1].name == "b/remainder");
  CHECK(h.tensors[1].shape == std::vector<int64_t>{3});
  CHECK(h.tensors[1].begin == 24);
  CHECK(h.tensors[2].end == 30);
  const unsigned char* prefix = reinterpret_cast<const unsigned char*>(header.data());
  CHECK(sa::parse_header_length(prefix, header.size() + 30, "blob") == json.size());
}

TEST_CASE("the safetensors parser refuses every malformed header with SA_ERR_FORMAT", "[state_io][safetensors]") {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK_NOTHROW(parse(ok, 8));

  SECTION("length field") {
    Bytes b = blob_of(ok, 8);
    CHECK_FORMAT_ERROR(sa::parse_header_length(b.data(), 7, "x"), "truncated");
    CHECK_FORMAT_ERROR(sa::parse_header_length(b.data(), 8 + ok.size() - 1, "x"), "only");
    b[0] = 1;
    b[1] = b[2] = b[3] = b[4] = b[5] = b[6] = b[7] = 0;
    CHECK_FORMAT_ERROR(sa::parse_header_length(b.data(), b.size(), "x"), "between 2 and");
    b[7] = 0x40;  // ~4.6e18
    CHECK_FORMAT_ERROR(sa::parse_header_length(b.data(), b.size(), "x"), "between 2 and");
  }
  SECTION("JSON") {
    CHECK_FORMAT_ERROR(parse("[1, 2]", 0), "start with '{'");
    CHECK_FORMAT_ERROR(parse(R"({"t": )", 0), "not valid JSON");
    CHECK_FORMAT_ERROR(parse(ok + "x", 8), "not valid JSON");
    CHECK_FORMAT_ERROR(parse(std::string("{\"\xff\":1}"), 0), "not valid JSON");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"t":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", 0),
                       "names 't' twice");
    CHECK_FORMAT_ERROR(parse(R"({"__metadata__":{"a":"1","a":"2"}})", 0), "twice in one object");
    CHECK_FORMAT_ERROR(parse(R"({"__metadata__":{"a":1}})", 0), "not a string");
    CHECK_FORMAT_ERROR(parse(R"({"__metadata__":[]})", 0), "not a JSON object");
  }
  SECTION("tensor entries") {
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8), "dtype 'F64'");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4), "no string \"dtype\"");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "integer >= 0");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), "integer >= 0");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4),
                       "17 dims");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 7), "outside the data section");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "outside the data section");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 12), "needs 12 bytes");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
                       "needs");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "data_offsets");
    CHECK_FORMAT_ERROR(parse(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}})", 8),
                       "not an integer");
  }
  SECTION("overlapping data, also across an empty tensor in between") {
    CHECK_FORMAT_ERROR(parse(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                                 "b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},
                                 "c":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
                       "overlap");
    CHECK_NOTHROW(parse(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                            "b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},
                            "c":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16));
  }
}

namespace {

// Whether each element of `target` is covered 0, 1 or more times, by counting.
std::vector<int> cover_counts(const sa::Box& target, const std::vector<sa::Box>& parts) {
  int64_t volume = 1;
  for (int64_t d : target.shape) volume *= d;
  std::vector<int> counts(static_cast<std::size_t>(volume), 0);
  for (int64_t i = 0; i < volume; ++i) {
    std::vector<int64_t> point(target.shape.size());
    for (int64_t d = static_cast<int64_t>(point.size()) - 1, r = i; d >= 0; --d) {
      point[static_cast<std::size_t>(d)] = target.offset[static_cast<std::size_t>(d)] + r % target.shape[static_cast<std::size_t>(d)];
      r /= target.shape[static_cast<std::size_t>(d)];
    }
    for (const sa::Box& p : parts) {
      bool in = true;
      for (std::size_t d = 0; d < point.size(); ++d)
        in = in && point[d] >= p.offset[d] && point[d] < p.offset[d] + p.shape[d];
      counts[static_cast<std::size_t>(i)] += in;
    }
  }
  return counts;
}

}  // namespace

TEST_CASE("coverage: exact, overlap and gap agree with counting every element", "[state_io][box]") {
  Rng rng(5);
  int exact = 0, overlap = 0, gap = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::size_t ndim = static_cast<std::size_t>(rng.integer(1, 3));
    sa::Box target;
    for (std::size_t d = 0; d < ndim; ++d) {
      target.offset.push_back(rng.integer(0, 3));
      target.shape.push_back(rng.integer(1, 5));
    }
    // Mostly a grid cut of the target (exact), then perturbed: a part dropped, grown or duplicated.
    std::vector<std::vector<int64_t>> cuts(ndim);
    for (std::size_t d = 0; d < ndim; ++d) {
      cuts[d] = {target.offset[d], target.offset[d] + target.shape[d]};
      for (int64_t c = target.offset[d] + 1; c < target.offset[d] + target.shape[d]; ++c)
        if (rng.chance(0.4)) cuts[d].push_back(c);
      std::sort(cuts[d].begin(), cuts[d].end());
    }
    std::vector<sa::Box> parts(1);
    for (std::size_t d = 0; d < ndim; ++d) {
      std::vector<sa::Box> next;
      for (const sa::Box& p : parts)
        for (std::size_t c = 0; c + 1 < cuts[d].size(); ++c) {
          sa::Box q = p;
          q.offset.push_back(cuts[d][c]);
          q.shape.push_back(cuts[d][c + 1] - cuts[d][c]);
          next.push_back(q);
        }
      parts = next;
    }
    const int mutation = static_cast<int>(rng.integer(0, 3));
    std::size_t victim = static_cast<std::size_t>(rng.integer(0, static_cast<int64_t>(parts.size()) - 1));
    if (mutation == 1) parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(victim));
    if (mutation == 2) parts.push_back(parts[victim]);
    if (mutation == 3) {  // grow a part by one along a dim, clipped to the target
      const std::size_t d = static_cast<std::size_t>(rng.integer(0, static_cast<int64_t>(ndim) - 1));
      if (parts[victim].offset[d] + parts[victim].shape[d] < target.offset[d] + target.shape[d]) ++parts[victim].shape[d];
    }
    if (rng.chance(0.3)) parts.push_back({target.offset, std::vector<int64_t>(ndim, 0)});  // empty parts are ignored
    std::reverse(parts.begin(), parts.end());

    const std::vector<int> counts = cover_counts(target, parts);
    const bool want_overlap = std::any_of(counts.begin(), counts.end(), [](int c) { return c > 1; });
    const bool want_exact = std::all_of(counts.begin(), counts.end(), [](int c) { return c == 1; });
    const sa::Coverage c = sa::check_coverage(target, parts);
    INFO("trial " << trial);
    REQUIRE(c.exact == want_exact);
    REQUIRE(c.overlap == want_overlap);
    if (c.overlap) {
      sa::Box both;
      CHECK(sa::intersect(parts[c.first], parts[c.second], both));
      ++overlap;
    } else if (!c.exact) {
      REQUIRE(c.gap.size() == ndim);  // small enough to search: a gap is always named
      CHECK(cover_counts({c.gap, std::vector<int64_t>(ndim, 1)}, parts)[0] == 0);
      bool inside = true;
      for (std::size_t d = 0; d < ndim; ++d)
        inside = inside && c.gap[d] >= target.offset[d] && c.gap[d] < target.offset[d] + target.shape[d];
      CHECK(inside);
      ++gap;
    } else {
      ++exact;
    }
  }
  // The trials covered every outcome many times.
  CHECK(exact > 300);
  CHECK(overlap > 300);
  CHECK(gap > 300);
}

TEST_CASE("the run cursor copies a box between any two boxes holding it, in few runs", "[state_io][runs]") {
  Rng rng(9);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t ndim = static_cast<std::size_t>(rng.integer(0, 4));
    // Global shape, then `from` and `to` inside it, then `box` inside both.
    sa::Box from, to, box;
    bool empty = false;
    for (std::size_t d = 0; d < ndim; ++d) {
      const int64_t n = rng.integer(1, 6);
      auto pick = [&](sa::Box& b) {
        const int64_t lo = rng.integer(0, n - 1), hi = rng.integer(lo + 1, n);
        b.offset.push_back(rng.chance(0.5) ? 0 : lo);
        b.shape.push_back((rng.chance(0.5) ? n : hi) - b.offset.back());
      };
      pick(from);
      pick(to);
      const int64_t lo = std::max(from.offset[d], to.offset[d]);
      const int64_t hi = std::min(from.offset[d] + from.shape[d], to.offset[d] + to.shape[d]);
      if (hi <= lo) empty = true;
      const int64_t a = hi > lo ? rng.integer(lo, hi - 1) : lo;
      const int64_t b = hi > lo ? rng.integer(a + 1, hi) : lo;
      box.offset.push_back(rng.chance(0.5) ? lo : a);
      box.shape.push_back(std::max<int64_t>(0, rng.chance(0.5) ? hi - box.offset.back() : b - box.offset.back()));
    }
    auto volume = [](const sa::Box& b) {
      int64_t v = 1;
      for (int64_t d : b.shape) v *= d;
      return v;
    };
    std::vector<int64_t> src(static_cast<std::size_t>(volume(from)));
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int64_t>(i) + 1;
    std::vector<int64_t> got(static_cast<std::size_t>(volume(to)), 0), want = got;
    // Brute force: every element of the box, by its global coordinate.
    for (int64_t i = 0; !empty && i < volume(box); ++i) {
      int64_t s = 0, t = 0, r = i;
      std::vector<int64_t> g(ndim);
      for (std::size_t d = ndim; d-- > 0;) {
        g[d] = box.offset[d] + r % box.shape[d];
        r /= box.shape[d];
      }
      for (std::size_t d = 0; d < ndim; ++d) {
        s = s * from.shape[d] + (g[d] - from.offset[d]);
        t = t * to.shape[d] + (g[d] - to.offset[d]);
      }
      want[static_cast<std::size_t>(t)] = src[static_cast<std::size_t>(s)];
    }
    int64_t runs = 0, last_src = -1;
    for (sa::RunCursor c(box, from, to); !empty && !c.done();) {
      CHECK(c.src() > last_src);  // increasing source order
      last_src = c.src();
      // Consume each run in two bites, as a chunk boundary would cut it.
      const int64_t bite = std::max<int64_t>(1, c.remaining() / 2);
      for (int64_t k = 0; k < bite; ++k) got[static_cast<std::size_t>(c.dst() + k)] = src[static_cast<std::size_t>(c.src() + k)];
      const bool whole = bite == c.remaining();
      c.advance(bite);
      runs += whole;
      if (!whole) {
        for (int64_t k = 0; k < c.remaining(); ++k) got[static_cast<std::size_t>(c.dst() + k)] = src[static_cast<std::size_t>(c.src() + k)];
        c.advance(c.remaining());
        ++runs;
      }
    }
    INFO("trial " << trial << ", ndim " << ndim);
    REQUIRE(got == want);
    if (!empty && ndim > 0 && volume(box) > 0) {
      // At most one run per index of the dims before the last partial dim.
      std::size_t k = ndim - 1;
      while (k > 0 && box.shape[k] == from.shape[k] && box.shape[k] == to.shape[k]) --k;
      int64_t expected_runs = 1;
      for (std::size_t d = 0; d < k; ++d) expected_runs *= box.shape[d];
      CHECK(runs == expected_runs);
    }
  }
}

TEST_CASE("a Shard(0) reshard is one run per saved shard", "[state_io][runs]") {
  // Local rows [2, 9) of [10, 37] from a saved shard of rows [0, 4): rows 2..3, one run.
  const sa::Box local{{2, 0}, {7, 37}}, saved{{0, 0}, {4, 37}}, shared{{2, 0}, {2, 37}};
  sa::RunCursor c(shared, saved, local);
  CHECK(c.src() == 2 * 37);
  CHECK(c.dst() == 0);
  CHECK(c.remaining() == 2 * 37);
  c.advance(2 * 37);
  CHECK(c.done());
}

// schema.hpp's rule for a hyperparameter added later: a file older than the field's
// `since` lacks it and loads with its default; a file of a version that holds it must have
// it. The field here is made up (a row as a later version would add it); the real ones are
// checked below.
TEST_CASE("a group field added in a later format version loads older files with its default",
          "[state_io][metadata]") {
  const sa::schema::GroupField future = {"lr_scale", sa::schema::Rule::nonnegative,
                                         offsetof(sa_group_config, lr), 0.25, false, 3,
                                         sa::schema::kAllRules, "a field of format version 3"};
  const nlohmann::json without = {{"lr", 0.1}, {"step", 4}};
  const nlohmann::json with = {{"lr", 0.1}, {"lr_scale", 2.5}, {"step", 4}};
  CHECK(sa::saved_group_field(without, future, 2, "old.safetensors", "groups[0]") == 0.25);
  CHECK(sa::saved_group_field(with, future, 2, "old.safetensors", "groups[0]") == 2.5);
  CHECK(sa::saved_group_field(with, future, 3, "new.safetensors", "groups[0]") == 2.5);
  CHECK_FORMAT_ERROR(sa::saved_group_field(without, future, 3, "new.safetensors", "groups[0]"),
                     "new.safetensors: groups[0] has no \"lr_scale\"");
  const nlohmann::json text = {{"lr_scale", "2.5"}};
  CHECK_FORMAT_ERROR(sa::saved_group_field(text, future, 2, "old.safetensors", "groups[1]"),
                     "groups[1].lr_scale is not a number");
  // AdamW's fields are in every version; the update rule and Muon's came with version 4, so
  // a group of an older file is an AdamW group. A group of a version that holds a field but
  // lacks it is refused.
  const nlohmann::json empty = nlohmann::json::object();
  int muon_fields = 0;
  for (const sa::schema::GroupField& f : sa::schema::kGroupFields) {
    INFO(f.name);
    const bool adam = (f.rules & sa::schema::kAdamW) != 0 && std::string(f.name) != "update_rule";
    CHECK(f.since == (adam ? sa::kOldestShardFormatVersion : 4));
    CHECK_FORMAT_ERROR(sa::saved_group_field(empty, f, f.since, "a.safetensors", "g"), "has no");
    if (f.since > sa::kOldestShardFormatVersion) {
      ++muon_fields;
      CHECK(sa::saved_group_field(empty, f, f.since - 1, "a.safetensors", "g") == f.default_value);
    }
  }
  CHECK(muon_fields == 8);  // update_rule, nesterov, momentum, ns_a, ns_b, ns_c, ns_steps, adjust_lr
  const sa::schema::GroupField& rule = *std::find_if(
      std::begin(sa::schema::kGroupFields), std::end(sa::schema::kGroupFields),
      [](const sa::schema::GroupField& f) { return std::string(f.name) == "update_rule"; });
  CHECK(sa::saved_group_field(empty, rule, 3, "old.safetensors", "g") == SA_RULE_ADAMW);
}
