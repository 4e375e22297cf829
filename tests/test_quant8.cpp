// tests/test_quant8.cpp — 8-bit blockwise moments (moment_dtype uint8, ElemType::q8):
//  - the codec (kernels/quant8.h) picks a nearest code-book entry, checked in float64;
//  - the CPU kernel's SIMD and scalar paths, and any split of a shard on block
//    boundaries, give the same bits;
//  - through the C ABI: the states and their shapes, a first step against float64, a few
//    steps against float32 moments, and the refusals (a uint8 param or grad) that leave
//    nothing changed;
//  - shard files: 8-bit (and float8) moments are saved as their codes and absmax, load
//    back bit for bit onto the same layout and wherever the block grids agree, reshard
//    elsewhere by re-quantizing the values the codes stand for (checked in float64
//    against nearest codes), and cross with float32 moments both ways. (tests/gpu: CUDA
//    equals this CPU kernel bit for bit.)
// bitsandbytes, the independent reference for codes and steps, is used by
// bindings/python/tests/test_quant8_bitsandbytes.py.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../kernels/block_moment.h"
#include "../kernels/cpu/adam_cpu.h"
#include "../kernels/quant8.h"
#include "highway_targets.hpp"
#include "test_state_io_support.hpp"
#include "test_support.hpp"

namespace {

using namespace sa_test;

float encode_q8_block(const sa::kernels::Quant8Book& book, const float* x, int64_t n,
                      uint8_t* codes) {
  return sa::kernels::encode_block<sa::kernels::ElemType::q8>(book, x, n, codes);
}

using sa::StateKind;
using sa::kernels::bits_float;
using sa::kernels::ElemType;
using sa::kernels::kQuant8Block;
using sa::kernels::MasterKind;
using sa::kernels::quant8_decode;
using sa::kernels::quant8_map;
using sa::kernels::TensorSlot;
using sa::kernels::Variant;

double map_value(const uint32_t* map, int c) { return static_cast<double>(bits_float(map[c])); }

std::vector<float> random_block(std::mt19937_64& rng, int64_t n, double scale, bool is_signed) {
  std::normal_distribution<double> normal;
  std::vector<float> x(static_cast<std::size_t>(n));
  for (auto& v : x) {
    const double g = normal(rng) * scale;
    v = static_cast<float>(is_signed ? g : std::fabs(g));
  }
  return x;
}

TEST_CASE("quant8: the code books are sorted, hold 0 and 1, and the unsigned one is >= 0",
          "[quant8]") {
  for (bool is_signed : {true, false}) {
    const uint32_t* map = quant8_map(is_signed);
    for (int c = 0; c + 1 < 256; ++c) CHECK(map_value(map, c) <= map_value(map, c + 1));
    CHECK(map_value(map, 255) == 1.0);
    CHECK(std::count_if(map, map + 256, [](uint32_t b) { return bits_float(b) == 0.0f; }) >= 1);
    if (!is_signed) CHECK(map_value(map, 0) >= 0.0);
    if (is_signed) CHECK(map_value(map, 0) < -0.99);
  }
}

// quant8_code reads the generated tables (kernels/quant8_maps.h); quant8_search is the
// definition. The tables must be the code book's midpoints and each bucket's code by the
// search, no bucket may hold two midpoints, and the two must then agree on every value:
// at, just below and just above every midpoint, map entry and bucket edge, at the ends,
// for NaN and signed zeros, and at random points of [-1, 1].
TEST_CASE("quant8: the bucket tables are the code book's midpoints and each bucket's code",
          "[quant8]") {
  using namespace sa::kernels;
  for (const bool is_signed : {true, false}) {
    const Quant8Book book = quant8_book(is_signed);
    INFO((is_signed ? "signed" : "unsigned") << " map");
    for (int j = 0; j < 255; ++j) REQUIRE(book.mids[j] == float_bits(quant8_midpoint(book.map, j)));
    REQUIRE(bits_float(book.mids[255]) > 1.0f);
    int wrong = 0, misplaced = 0;
    for (int i = 0; i < kQuant8Buckets; ++i) {
      const float low = quant8_bucket_low(i);
      if (book.buckets[i] != quant8_search(book.map, low)) ++wrong;
      const float below = std::nextafter(low, -2.0f);  // outside the bucket, or below -1
      if (quant8_bucket(low) != i || (below >= -1.0f && quant8_bucket(below) == i)) ++misplaced;
    }
    CHECK(wrong == 0);
    CHECK(misplaced == 0);
    std::vector<int> midpoints_in(kQuant8Buckets, 0);
    for (int j = 0; j < 255; ++j) ++midpoints_in[quant8_bucket(quant8_midpoint(book.map, j))];
    CHECK(*std::max_element(midpoints_in.begin(), midpoints_in.end()) <= 1);
  }
}

TEST_CASE("quant8: the bucket search gives quant8_search's code for every value", "[quant8]") {
  using namespace sa::kernels;
  for (const bool is_signed : {true, false}) {
    const Quant8Book book = quant8_book(is_signed);
    std::vector<float> values = {-1.0f, 1.0f, 0.0f, -0.0f, 1e-30f, -1e-30f, 1e-45f};
    const auto around = [&](float x) {
      float lo = x, hi = x;
      values.push_back(x);
      for (int k = 0; k < 3; ++k) {
        values.push_back(lo = std::nextafter(lo, -2.0f));
        values.push_back(hi = std::nextafter(hi, 2.0f));
      }
    };
    for (int j = 0; j < 256; ++j) {
      around(bits_float(book.map[j]));
      if (j < 255) around(quant8_midpoint(book.map, j));
    }
    for (int i = 0; i < kQuant8Buckets; ++i) around(quant8_bucket_low(i));
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::uniform_real_distribution<float> exponent(-40.0f, 0.0f);
    for (int k = 0; k < 100000; ++k) {
      values.push_back(uniform(rng));
      values.push_back(std::copysign(std::pow(2.0f, exponent(rng)), uniform(rng)));
    }
    int mismatches = 0;
    for (const float x : values) {
      const float scaled = quant8_scaled(x, 1.0f);
      if (quant8_code(book.buckets, book.mids, scaled) != quant8_search(book.map, scaled))
        ++mismatches;
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    INFO((is_signed ? "signed" : "unsigned") << " map, " << values.size() << " values");
    CHECK(mismatches == 0);
    CHECK(quant8_code(book.buckets, book.mids, quant8_scaled(nan, 1.0f)) ==
          quant8_search(book.map, nan));
  }
}

// The CUDA kernel's encode (quant8_key_code over a table quant8_fill_keys builds). Its
// domain is |scaled| < 1.0078125, no NaN. Within a bucket both it and quant8_search are
// monotonic step functions of the key that step at most once (at the one midpoint a bucket
// may hold), so agreeing at each bucket's two ends and on either side of each midpoint is
// agreeing everywhere; the GPU test checks every float32 of the domain besides
// (tests/gpu/test_quant8_keys.cu).
std::vector<uint32_t> quant8_key_entries(bool is_signed) {
  using namespace sa::kernels;
  const Quant8KeyTable k = quant8_keys(is_signed);
  int32_t mid_keys[255];
  quant8_mid_keys(quant8_map(is_signed), is_signed, mid_keys);
  std::vector<uint32_t> entries(static_cast<std::size_t>(k.count));
  quant8_fill_keys(k, mid_keys, 0, k.count, entries.data());
  return entries;
}

// The value of a key (the keys' inverse, for keys of values at or above 2^-23 when unsigned).
float quant8_key_value(bool is_signed, int32_t key) {
  if (!is_signed) return sa::kernels::bits_float(static_cast<uint32_t>(key));
  return sa::kernels::bits_float(static_cast<uint32_t>(key ^ ((key >> 31) & 0x7FFFFFFF)));
}

TEST_CASE("quant8: the key tables cover the domain, with at most one midpoint per bucket",
          "[quant8]") {
  using namespace sa::kernels;
  for (const bool is_signed : {true, false}) {
    INFO((is_signed ? "signed" : "unsigned") << " map");
    const Quant8KeyTable k = quant8_keys(is_signed);
    const uint32_t* map = quant8_map(is_signed);
    int32_t mid_keys[255];
    quant8_mid_keys(map, is_signed, mid_keys);
    std::vector<int> in_bucket(static_cast<std::size_t>(k.count), 0);
    for (int j = 0; j < 255; ++j) {
      const float mid = quant8_midpoint(map, j);
      CHECK(mid != 0.0f);
      if (!is_signed) CHECK(mid > kQuant8UnsignedKeyLow);  // the keys below it are one
      if (j > 0) CHECK(mid_keys[j] > mid_keys[j - 1]);
      const int32_t e = (mid_keys[j] >> k.shift) - k.first;
      REQUIRE(e >= 0);
      REQUIRE(e < k.count);
      ++in_bucket[static_cast<std::size_t>(e)];
    }
    CHECK(*std::max_element(in_bucket.begin(), in_bucket.end()) == 1);
    // The domain's ends and 0 fall in the table.
    const float ends[] = {1.0078124f, 0.0f, -0.0f, is_signed ? -1.0078124f : 1e-45f};
    for (const float x : ends) {
      const int32_t e = (quant8_key(is_signed, x) >> k.shift) - k.first;
      CHECK(e >= 0);
      CHECK(e < k.count);
    }
  }
}

TEST_CASE("quant8: the key table gives quant8_search's code across its domain", "[quant8]") {
  using namespace sa::kernels;
  for (const bool is_signed : {true, false}) {
    const Quant8KeyTable k = quant8_keys(is_signed);
    const uint32_t* map = quant8_map(is_signed);
    const std::vector<uint32_t> entries = quant8_key_entries(is_signed);
    int32_t mid_keys[255];
    quant8_mid_keys(map, is_signed, mid_keys);
    std::vector<float> values = {0.0f,
                                 -0.0f,
                                 1e-45f,
                                 -1e-45f,
                                 1e-38f,
                                 kQuant8UnsignedKeyLow,
                                 std::nextafter(kQuant8UnsignedKeyLow, 0.0f),
                                 1.0f,
                                 -1.0f,
                                 1.0078124f,
                                 -1.0078124f};
    const auto keys_around = [&](int32_t key) {
      for (int32_t d = -2; d <= 2; ++d) values.push_back(quant8_key_value(is_signed, key + d));
    };
    for (int32_t e = 0; e < k.count; ++e) {
      const int32_t low = static_cast<int32_t>(static_cast<uint32_t>(k.first + e) << k.shift);
      keys_around(low);
      keys_around(low + (1 << k.shift) - 1);
    }
    for (int j = 0; j < 255; ++j) keys_around(mid_keys[j]);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> uniform(-1.0078f, 1.0078f);
    std::uniform_real_distribution<float> exponent(-130.0f, 0.0f);
    for (int i = 0; i < 100000; ++i) {
      values.push_back(uniform(rng));
      values.push_back(std::copysign(std::pow(2.0f, exponent(rng)), uniform(rng)));
    }
    int checked = 0, mismatches = 0;
    for (float x : values) {
      if (!is_signed) x = std::fabs(x);
      if (!(std::fabs(x) < 1.0078125f)) continue;  // outside the domain
      ++checked;
      const uint8_t want = quant8_search(map, quant8_scaled(x, 1.0f));
      if (quant8_key_code(k, entries.data(), quant8_key(is_signed, x)) != want) {
        if (mismatches++ < 5) UNSCOPED_INFO("x = " << x << " want " << int{want});
      }
    }
    INFO((is_signed ? "signed" : "unsigned") << " map, " << checked << " values");
    CHECK(checked > 200000);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("quant8: a key table filled in slices equals one filled whole", "[quant8]") {
  using namespace sa::kernels;
  for (const bool is_signed : {true, false}) {
    const Quant8KeyTable k = quant8_keys(is_signed);
    int32_t mid_keys[255];
    quant8_mid_keys(quant8_map(is_signed), is_signed, mid_keys);
    for (const int32_t parts : {1, 256, 640, 1024}) {  // thread blocks' sizes
      std::vector<uint32_t> sliced(static_cast<std::size_t>(k.count), 0);
      for (int32_t part = 0; part < parts; ++part)
        quant8_fill_keys_part(k, mid_keys, part, parts, sliced.data());
      INFO(parts << " parts");
      CHECK(sliced == quant8_key_entries(is_signed));
    }
  }
}

TEST_CASE("quant8: the absmax is the block's largest magnitude and every code is a nearest entry",
          "[quant8]") {
  std::mt19937_64 rng(7);
  for (bool is_signed : {true, false}) {
    const uint32_t* map = quant8_map(is_signed);
    for (double scale : {1e-30, 1e-8, 1e-3, 1.0, 1e6}) {
      for (int64_t n : {int64_t{1}, int64_t{17}, kQuant8Block}) {
        std::vector<float> x = random_block(rng, n, scale, is_signed);
        uint8_t codes[kQuant8Block];
        const float absmax =
            encode_q8_block(sa::kernels::quant8_book(is_signed), x.data(), n, codes);
        float largest = 0.0f;
        for (float v : x) largest = std::max(largest, std::fabs(v));
        REQUIRE(absmax == largest);
        for (int64_t i = 0; i < n; ++i) {
          const double scaled = static_cast<double>(x[i]) / absmax;
          const int c = codes[i];
          const double err = std::fabs(map_value(map, c) - scaled);
          // No other entry is nearer (by more than the float rounding of x / absmax).
          for (int other : {c - 1, c + 1}) {
            if (other < 0 || other > 255) continue;
            INFO("x " << x[i] << " absmax " << absmax << " code " << c << " other " << other);
            CHECK(err <= std::fabs(map_value(map, other) - scaled) + 1e-7);
          }
          // And it decodes within half the wider neighbouring gap of the map, times absmax.
          const double gap = std::max(c < 255 ? map_value(map, c + 1) - map_value(map, c) : 0.0,
                                      c > 0 ? map_value(map, c) - map_value(map, c - 1) : 0.0);
          CHECK(std::fabs(quant8_decode(map, codes[i], absmax) - x[i]) <=
                (0.5 * gap + 1e-6) * absmax);
        }
      }
    }
  }
}

TEST_CASE("quant8: an all-zero block decodes to zeros, a NaN makes the whole block NaN",
          "[quant8]") {
  const uint32_t* map = quant8_map(true);
  std::vector<float> x(40, 0.0f);
  uint8_t codes[40];
  float absmax = encode_q8_block(sa::kernels::quant8_book(true), x.data(), 40, codes);
  CHECK(absmax == 0.0f);
  for (int i = 0; i < 40; ++i) CHECK(quant8_decode(map, codes[i], absmax) == 0.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[7] = 5.0f;
  absmax = encode_q8_block(sa::kernels::quant8_book(true), x.data(), 40, codes);
  CHECK(std::isnan(absmax));
  for (int i = 0; i < 40; ++i) CHECK(std::isnan(quant8_decode(map, codes[i], absmax)));
}

// One shard's arrays for the kernel: an f32 param, or a bf16 one with an fp32 master or a
// remainder; f32 or bf16 grads; random codes and absmax values.
struct Q8Shard {
  Variant variant;
  int64_t n;
  std::vector<float> param, grad, master;
  std::vector<uint16_t> param16, grad16;
  std::vector<int16_t> remainder;
  std::vector<uint8_t> codes[3];
  std::vector<float> absmax[3];

  Q8Shard(const Variant& v, int64_t numel, std::mt19937_64& rng) : variant(v), n(numel) {
    std::normal_distribution<float> normal;
    const int64_t blocks = (n + kQuant8Block - 1) / kQuant8Block;
    param.resize(n);
    for (auto& p : param) p = normal(rng);
    new_grads(rng);
    if (v.param == ElemType::bf16) {
      param16.resize(n);
      if (v.master == MasterKind::remainder) {
        remainder.resize(n);
        for (int64_t i = 0; i < n; ++i) sa::kernels::split_remainder(param[i], param16[i], remainder[i]);
      } else {
        master = param;
        for (int64_t i = 0; i < n; ++i) param16[i] = sa::kernels::float_to_bf16(param[i]);
      }
    }
    for (int k = 0; k < 3; ++k) {
      codes[k].resize(n);
      for (auto& c : codes[k]) {
        c = static_cast<uint8_t>(rng() & 0xFF);
        if (v.moment == ElemType::f8e4m3) {  // a finite float8, >= 0 for the second moments
          if (k > 0) c &= 0x7Fu;
          if ((c & 0x7Fu) == 0x7Fu) c ^= 0x01u;
        }
      }
      absmax[k].resize(blocks);
      for (auto& a : absmax[k]) a = std::fabs(normal(rng)) * (k == 0 ? 0.1f : 0.01f);
      absmax[k][0] = 0.0f;  // block 0's moments are zeros (and stay so under zero grads)
    }
  }

  void new_grads(std::mt19937_64& rng) {
    std::normal_distribution<float> normal;
    grad.resize(n);
    for (auto& g : grad) g = normal(rng) * 0.1f;
    grad16.clear();
    if (variant.grad == ElemType::bf16)
      for (float g : grad) grad16.push_back(sa::kernels::float_to_bf16(g));
  }

  TensorSlot slot() {
    TensorSlot s{v_param(), variant.grad == ElemType::bf16 ? static_cast<const void*>(grad16.data())
                                                          : grad.data(),
                 {}, n, 0, 1, {}};
    auto at = [&](StateKind k) -> void*& { return s.state[static_cast<std::size_t>(k)]; };
    if (variant.master == MasterKind::fp32) at(StateKind::master) = master.data();
    if (variant.master == MasterKind::remainder) at(StateKind::remainder) = remainder.data();
    const StateKind code_kinds[] = {StateKind::exp_avg, StateKind::exp_avg_sq,
                                    StateKind::max_exp_avg_sq};
    const StateKind absmax_kinds[] = {StateKind::exp_avg_absmax, StateKind::exp_avg_sq_absmax,
                                      StateKind::max_exp_avg_sq_absmax};
    for (int k = 0; k < (variant.amsgrad ? 3 : 2); ++k) {
      at(code_kinds[k]) = codes[k].data();
      at(absmax_kinds[k]) = absmax[k].data();
    }
    return s;
  }
  void* v_param() {
    return variant.param == ElemType::bf16 ? static_cast<void*>(param16.data()) : param.data();
  }
  // Equal bits, except that any two NaNs are equal (a NaN's payload may differ between the
  // scalar and the SIMD arithmetic; a NaN block's absmax and codes do not).
  bool operator==(const Q8Shard& o) const {
    auto same_floats = [](const std::vector<float>& a, const std::vector<float>& b) {
      if (a.size() != b.size()) return false;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (!(std::isnan(a[i]) && std::isnan(b[i])) &&
            memcmp(&a[i], &b[i], sizeof(float)) != 0)
          return false;
      return true;
    };
    for (int k = 0; k < 3; ++k)
      if (codes[k] != o.codes[k] || !same_floats(absmax[k], o.absmax[k])) return false;
    return same_floats(param, o.param) && param16 == o.param16 && same_floats(master, o.master) &&
           remainder == o.remainder;
  }
};

// The SIMD path of a block moment decodes, updates and measures a block in one pass, then
// encodes it (adam_cpu.cpp's UpdateCodedBlocks); the scalar path decodes, updates and encodes
// element by element. Over every Highway target of this CPU, both block storages, every
// param storage, grad dtype, amsgrad and l2, three steps (the second with a NaN grad in
// block 1 and an infinite one in block 2, whose moments become NaN blocks; the third with
// zero grads in block 0, whose moments start as zeros), and shards whose
// last block is whole, a partial block of whole vectors, or a ragged one.
TEST_CASE(
    "block moments (q8, float8): SIMD and scalar paths, and any split on block boundaries, agree "
    "bitwise on every Highway target",
    "[quant8][fp8][kernel]") {
  const struct {
    ElemType param;
    MasterKind master;
  } storages[] = {{ElemType::f32, MasterKind::none},
                  {ElemType::bf16, MasterKind::fp32},
                  {ElemType::bf16, MasterKind::remainder}};
  int cases = 0;
  for (const int64_t target : sa_test::kernel_targets()) {
    const sa_test::OnlyTarget only(target);
    INFO("kernel target " << sa::kernels::adam_cpu_simd_target());
    for (const ElemType moment : {ElemType::q8, ElemType::f8e4m3})
      for (const auto& storage : storages)
        for (const ElemType grad : {ElemType::f32, ElemType::bf16})
          for (const bool amsgrad : {false, true})
            for (const bool decoupled : {false, true})
              for (const int64_t n : {kQuant8Block, 3 * kQuant8Block + 64, 3 * kQuant8Block + 77}) {
                const Variant v{storage.param, grad,    moment,
                                storage.master, amsgrad, sa::kernels::ParamScaling::none};
                INFO("moment " << static_cast<int>(moment) << " param "
                               << static_cast<int>(storage.param) << " master "
                               << static_cast<int>(storage.master) << " grad "
                               << static_cast<int>(grad) << " amsgrad " << amsgrad
                               << " decoupled " << decoupled << " numel " << n);
                std::mt19937_64 rng(11);
                const Q8Shard start(v, n, rng);
                Q8Shard scalar = start, simd = start, pieces = start;
                for (int step = 1; step <= 3; ++step) {
                  sa::kernels::GroupCoeffs g{};
                  const sa::kernels::AdamHyper h{1e-3, 0.9, 0.999, 1e-8, 0.01, decoupled, true, false};
                  g.l2 = sa::kernels::fold_coefficients(h, step, 1.0, g.c);
                  scalar.new_grads(rng);
                  if (step == 2 && n > 2 * kQuant8Block) {
                    scalar.grad[kQuant8Block + 5] = std::numeric_limits<float>::quiet_NaN();
                    scalar.grad[2 * kQuant8Block + 9] = std::numeric_limits<float>::infinity();
                    if (grad == ElemType::bf16) {
                      scalar.grad16[kQuant8Block + 5] = 0x7FC0;
                      scalar.grad16[2 * kQuant8Block + 9] = 0x7F80;
                    }
                  }
                  if (step == 3) {  // block 0: zero grads, so (decoupled) all-zero moments
                    std::fill(scalar.grad.begin(), scalar.grad.begin() + kQuant8Block, 0.0f);
                    std::fill(scalar.grad16.begin(),
                              scalar.grad16.begin() + (grad == ElemType::bf16 ? kQuant8Block : 0), 0);
                  }
                  simd.grad = pieces.grad = scalar.grad;
                  simd.grad16 = pieces.grad16 = scalar.grad16;
                  sa::kernels::adam_cpu_range(v, scalar.slot(), g, 0, n, false);
                  sa::kernels::adam_cpu_range(v, simd.slot(), g, 0, n, true);
                  const int64_t cuts[] = {0, std::min(n, kQuant8Block), std::min(n, 3 * kQuant8Block), n};
                  for (int k = 0; k < 3; ++k)
                    sa::kernels::adam_cpu_range(v, pieces.slot(), g, cuts[k], cuts[k + 1], true);
                  INFO("step " << step);
                  REQUIRE(scalar == simd);
                  REQUIRE(simd == pieces);
                }
                CHECK_FALSE(simd == start);  // the steps changed something
                ++cases;
              }
  }
  CHECK(cases % (2 * 3 * 2 * 2 * 2 * 3) == 0);
}

// ---- through the C ABI ------------------------------------------------------------------

struct Q8Fixture {
  HostTensor p8{{3, 200}, kFloat32};   // 600 elements: blocks of 256, 256, 88
  HostTensor p32{{3, 200}, kFloat32};  // the same training with float32 moments
  HostTensor grad{{3, 200}, kFloat32};
  OptimizerPtr opt = make_optimizer();
  sa_group_config config = SA_GROUP_CONFIG_INIT;

  Q8Fixture() {
    config.lr = 1e-2;
    config.weight_decay = 0.01;
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < p8.numel(); ++i) p8.as<float>()[i] = p32.as<float>()[i] = normal(rng);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
    const sa_param_options q8 = param_options(kDefaultDtype, kUint8, SA_MASTER_AUTO);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "q8", 0, p8.versioned(), nullptr,
                                                    &q8, nullptr));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "f32", 0, p32.versioned(), nullptr,
                                                    nullptr, nullptr));
  }
  void step(std::mt19937_64& rng) {
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < grad.numel(); ++i) grad.as<float>()[i] = normal(rng) * 0.1f;
    const DLTensor g = grad.dl();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 1, &g));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  }
};

TEST_CASE(
    "q8 moments through the C ABI: uint8 codes of the param's shape, a float32 absmax "
    "per block",
    "[quant8]") {
  Q8Fixture f;
  std::mt19937_64 rng(9);
  f.step(rng);
  const StateView m = state_view(f.opt.get(), 0, "exp_avg");
  const StateView m_absmax = state_view(f.opt.get(), 0, "exp_avg_absmax");
  const StateView v_absmax = state_view(f.opt.get(), 0, "exp_avg_sq_absmax");
  REQUIRE(same_dtype(m.view->dl_tensor.dtype, kUint8));
  REQUIRE(m.view->dl_tensor.ndim == 2);
  CHECK(m.view->dl_tensor.shape[0] == 3);
  CHECK(m.view->dl_tensor.shape[1] == 200);
  REQUIRE(same_dtype(m_absmax.view->dl_tensor.dtype, kFloat32));
  REQUIRE(m_absmax.view->dl_tensor.ndim == 1);
  CHECK(m_absmax.view->dl_tensor.shape[0] == 3);  // ceil(600 / 256)
  CHECK(v_absmax.numel() == 3);
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_state_view(f.opt.get(), 1, "exp_avg_absmax", nullptr), "NULL");

  // Step 1 from zero moments: exp_avg = (1 - beta1) g, so each block's absmax is
  // (1 - beta1) max |g| and every element decodes to within one map gap of (1 - beta1) g.
  const uint32_t* map = quant8_map(true);
  const auto* codes = static_cast<const uint8_t*>(m.data());
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t begin = b * kQuant8Block, end = std::min<int64_t>(begin + kQuant8Block, 600);
    double largest = 0.0;
    for (int64_t i = begin; i < end; ++i)
      largest = std::max(largest, std::fabs(0.1 * f.grad.as<float>()[i]));
    CHECK(m_absmax.get(b) == Approx(largest).epsilon(1e-6));
    for (int64_t i = begin; i < end; ++i) {
      const double want = (1.0 - 0.9) * f.grad.as<float>()[i];
      const double got = quant8_decode(map, codes[i], static_cast<float>(m_absmax.get(b)));
      CHECK(std::fabs(got - want) <= 0.04 * m_absmax.get(b));  // the widest gap is ~0.07
    }
  }
}

TEST_CASE("q8 moments train like float32 moments, to within the quantization error", "[quant8]") {
  Q8Fixture f;
  std::mt19937_64 rng(10);
  const int steps = 20;
  for (int s = 0; s < steps; ++s) f.step(rng);
  // Each step moves a param by at most about lr; 8-bit moments change the direction by a
  // few percent of that.
  double worst = 0.0, moved = 0.0;
  std::mt19937_64 rng0(5);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < f.p8.numel(); ++i) {
    const double start = normal(rng0);
    worst =
        std::max(worst, std::fabs(static_cast<double>(f.p8.as<float>()[i]) - f.p32.as<float>()[i]));
    moved = std::max(moved, std::fabs(static_cast<double>(f.p32.as<float>()[i]) - start));
  }
  INFO("largest difference " << worst << ", largest move " << moved);
  CHECK(moved > 0.5 * f.config.lr * steps);
  CHECK(worst < 0.05 * f.config.lr * steps);
  CHECK(worst > 0.0);  // 8-bit moments are not float32 moments
}

TEST_CASE("q8 moments: uint8 params and grads are refused, changing nothing", "[quant8][errors]") {
  Q8Fixture f;
  std::mt19937_64 rng(3);
  f.step(rng);
  const std::vector<float> before(f.p8.as<float>(), f.p8.as<float>() + f.p8.numel());
  HostTensor u8({4}, kUint8);
  CHECK_SA_FAILS(
      f.opt.get(), SA_ERR_UNSUPPORTED,
      sa_optimizer_add_param(f.opt.get(), "u", 0, u8.versioned(), nullptr, nullptr, nullptr),
      "param dtype uint8 is not supported; use float32, bfloat16, float16, float8_e4m3fn or "
      "float8_e5m2");
  const sa_param_options u8_grad = param_options(kUint8, kDefaultDtype, SA_MASTER_AUTO);
  CHECK_SA_FAILS(
      f.opt.get(), SA_ERR_UNSUPPORTED,
      sa_optimizer_add_param(f.opt.get(), "g", 0, f.grad.versioned(), nullptr, &u8_grad, nullptr),
      "options.grad_dtype is uint8; it must be unset or float32, bfloat16 or float16");
  CHECK(sa_optimizer_num_params(f.opt.get()) == 2);
  CHECK(memcmp(before.data(), f.p8.as<float>(), before.size() * sizeof(float)) == 0);
  f.step(rng);  // still trains
}

// ---- shard files ------------------------------------------------------------------------

// The float32 values a shard file holds for a q8 state, as docs/precision.md specifies them:
// map[code] * absmax, except that in a block of a signed moment where no code is 255 the
// first element with code 0 holds -absmax.
std::vector<float> decoded(sa_optimizer* opt, int64_t param, const std::string& key,
                           bool is_signed) {
  const StateView codes = state_view(opt, param, key.c_str());
  const StateView absmax = state_view(opt, param, (key + "_absmax").c_str());
  const uint32_t* map = quant8_map(is_signed);
  const auto* c = static_cast<const uint8_t*>(codes.data());
  const auto* a = static_cast<const float*>(absmax.data());
  std::vector<float> out(static_cast<std::size_t>(codes.numel()));
  for (int64_t i = 0; i < codes.numel(); ++i)
    out[static_cast<std::size_t>(i)] = bits_float(map[c[i]]) * a[i / kQuant8Block];
  for (int64_t begin = 0; is_signed && begin < codes.numel(); begin += kQuant8Block) {
    const int64_t end = std::min<int64_t>(begin + kQuant8Block, codes.numel());
    bool has_255 = false;
    for (int64_t i = begin; i < end; ++i) has_255 = has_255 || c[i] == 255;
    for (int64_t i = begin; i < end && !has_255 && a[begin / kQuant8Block] > 0.0f; ++i)
      if (c[i] == 0) {
        out[static_cast<std::size_t>(i)] = -a[begin / kQuant8Block];
        break;
      }
  }
  return out;
}

std::vector<float> floats(const StateView& v) {
  const auto* p = static_cast<const float*>(v.data());
  return std::vector<float>(p, p + v.numel());
}

// Checks that m codes and their absmax `a` quantize the float32 values x: `a` is the
// largest |x| exactly, and each code a nearest entry of the map to x / a, in float64.
void check_block_quantizes(const uint8_t* codes, float a, const float* x, int64_t m,
                           bool is_signed) {
  const uint32_t* map = quant8_map(is_signed);
  float largest = 0.0f;
  for (int64_t i = 0; i < m; ++i) largest = std::max(largest, std::fabs(x[i]));
  CHECK(a == largest);
  for (int64_t i = 0; i < m; ++i) {
    const double scaled = a > 0.0f ? static_cast<double>(x[i]) / a : 0.0;
    double nearest = 1e300;
    for (int c = 0; c < 256; ++c) nearest = std::min(nearest, std::fabs(map_value(map, c) - scaled));
    CHECK(std::fabs(map_value(map, codes[i]) - scaled) <= nearest + 1e-6);
  }
}

// Checks that the q8 state `key` of `param` quantizes `x` (its float32 values, in local
// order) by the param's own blocks (check_block_quantizes).
void check_quantizes(sa_optimizer* opt, int64_t param, const std::string& key, bool is_signed,
                     const std::vector<float>& x) {
  const StateView codes = state_view(opt, param, key.c_str());
  const StateView absmax = state_view(opt, param, (key + "_absmax").c_str());
  REQUIRE(codes.numel() == static_cast<int64_t>(x.size()));
  for (int64_t b = 0; b * kQuant8Block < codes.numel(); ++b) {
    const int64_t begin = b * kQuant8Block;
    INFO(key << " block " << b);
    check_block_quantizes(static_cast<const uint8_t*>(codes.data()) + begin,
                          static_cast<const float*>(absmax.data())[b], x.data() + begin,
                          std::min<int64_t>(kQuant8Block, codes.numel() - begin), is_signed);
  }
}

// An optimizer of one param `name` of global shape [n] holding [offset, offset + size),
// its moments in `moment`; `values` holds the param.
OptimizerPtr one_param(const char* name, int64_t n, int64_t offset, HostTensor& values,
                       DLDataType moment) {
  OptimizerPtr opt = make_optimizer();
  sa_group_config config = SA_GROUP_CONFIG_INIT;
  config.lr = 1e-2;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
  sa_layout layout = SA_LAYOUT_INIT;
  layout.ndim = 1;
  layout.global_shape = &n;
  layout.global_offset = &offset;
  const sa_param_options options = param_options(kDefaultDtype, moment, SA_MASTER_AUTO);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), name, 0, values.versioned(), &layout,
                                                  &options, nullptr));
  return opt;
}

void step_with(sa_optimizer* opt, HostTensor& grad) {
  const DLTensor g = grad.dl();
  REQUIRE_SA_OK(opt, sa_optimizer_set_grad(opt, 0, &g));
  REQUIRE_SA_OK(opt, sa_optimizer_step(opt, nullptr, nullptr));
}

// The property a same-layout load rests on, over many blocks of both signs and scales: a
// block's file values (map[code] * absmax, with -absmax for the first code 0 of a signed
// block without a code 255) quantize again to the same codes and absmax.
TEST_CASE("quant8: a block's file values quantize back to its codes and absmax", "[quant8]") {
  std::mt19937_64 rng(13);
  std::uniform_int_distribution<int> length(1, static_cast<int>(kQuant8Block));
  int negative_max = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const bool is_signed = trial % 2 == 0;
    const int64_t n = trial % 5 == 0 ? length(rng) : kQuant8Block;
    const double scale = std::pow(10.0, -12.0 + 14.0 * (trial % 97) / 96.0);
    const std::vector<float> x = random_block(rng, n, scale, is_signed);
    const uint32_t* map = quant8_map(is_signed);
    std::vector<uint8_t> codes(n), again(n);
    const float absmax =
        encode_q8_block(sa::kernels::quant8_book(is_signed), x.data(), n, codes.data());
    std::vector<float> values(n);
    for (int64_t i = 0; i < n; ++i) values[i] = quant8_decode(map, codes[i], absmax);
    if (is_signed && std::find(codes.begin(), codes.end(), 255) == codes.end()) {
      const auto lowest = std::find(codes.begin(), codes.end(), 0);
      if (lowest != codes.end() && absmax > 0.0f) {
        values[lowest - codes.begin()] = -absmax;
        ++negative_max;
      }
    }
    const float absmax_again =
        encode_q8_block(sa::kernels::quant8_book(is_signed), values.data(), n, again.data());
    INFO("trial " << trial << ", n " << n << ", scale " << scale);
    REQUIRE(absmax_again == absmax);
    REQUIRE(again == codes);
  }
  CHECK(negative_max > 1000);  // the case the rule exists for was exercised
}

TEST_CASE(
    "q8 moments in shard files: the values of the codes in float32 moments, the codes and "
    "absmax bit for bit onto the same layout",
    "[quant8][state_io]") {
  Q8Fixture f;
  std::mt19937_64 rng(11);
  for (int s = 0; s < 3; ++s) f.step(rng);
  const Bytes blob = export_blob(f.opt.get());

  // Into float32 moments: exactly the decoded codes.
  HostTensor p8_copy({3, 200}, kFloat32), p32_copy({3, 200}, kFloat32);
  {
    OptimizerPtr g = make_optimizer();
    REQUIRE_SA_OK(g.get(), sa_optimizer_add_group(g.get(), &f.config, nullptr));
    REQUIRE_SA_OK(g.get(), sa_optimizer_add_param(g.get(), "q8", 0, p8_copy.versioned(), nullptr,
                                                  nullptr, nullptr));
    REQUIRE_SA_OK(g.get(), sa_optimizer_add_param(g.get(), "f32", 0, p32_copy.versioned(), nullptr,
                                                  nullptr, nullptr));
    REQUIRE_SA_OK(g.get(), import_blobs(g.get(), {blob}));
    CHECK(floats(state_view(g.get(), 0, "exp_avg")) == decoded(f.opt.get(), 0, "exp_avg", true));
    CHECK(floats(state_view(g.get(), 0, "exp_avg_sq")) ==
          decoded(f.opt.get(), 0, "exp_avg_sq", false));
  }

  // Into 8-bit moments of the same layout: the same codes and absmax values, bit for bit,
  // so training goes on exactly as if it had not stopped. The float32 param "f32" loads
  // into 8-bit moments too: quantized by its blocks.
  HostTensor q8_again({3, 200}, kFloat32), f32_as_q8({3, 200}, kFloat32);
  std::memcpy(q8_again.data(), f.p8.data(), f.p8.bytes());
  std::memcpy(f32_as_q8.data(), f.p32.data(), f.p32.bytes());
  OptimizerPtr h = make_optimizer();
  REQUIRE_SA_OK(h.get(), sa_optimizer_add_group(h.get(), &f.config, nullptr));
  const sa_param_options q8 = param_options(kDefaultDtype, kUint8, SA_MASTER_AUTO);
  REQUIRE_SA_OK(h.get(), sa_optimizer_add_param(h.get(), "q8", 0, q8_again.versioned(), nullptr,
                                                &q8, nullptr));
  REQUIRE_SA_OK(h.get(), sa_optimizer_add_param(h.get(), "f32", 0, f32_as_q8.versioned(), nullptr,
                                                &q8, nullptr));
  REQUIRE_SA_OK(h.get(), import_blobs(h.get(), {blob}));
  for (const char* key : {"exp_avg", "exp_avg_absmax", "exp_avg_sq", "exp_avg_sq_absmax"}) {
    INFO(key);
    const StateView a = state_view(f.opt.get(), 0, key), b = state_view(h.get(), 0, key);
    REQUIRE(a.numel() == b.numel());
    const std::size_t bytes =
        static_cast<std::size_t>(a.numel()) *
        (key == std::string("exp_avg") || key == std::string("exp_avg_sq") ? 1 : 4);
    CHECK(std::memcmp(a.data(), b.data(), bytes) == 0);
  }
  check_quantizes(h.get(), 1, "exp_avg", true, floats(state_view(f.opt.get(), 1, "exp_avg")));
  check_quantizes(h.get(), 1, "exp_avg_sq", false,
                  floats(state_view(f.opt.get(), 1, "exp_avg_sq")));
  int64_t steps[2] = {0, 0};
  REQUIRE_SA_OK(h.get(), sa_optimizer_get_param_steps(h.get(), 0, 2, steps));
  CHECK(steps[0] == 3);
  // One more step on both, with the same grad: the same param bits.
  for (int64_t i = 0; i < f.grad.numel(); ++i)
    f.grad.as<float>()[i] = 0.05f * static_cast<float>(i % 7);
  const DLTensor g = f.grad.dl();
  for (sa_optimizer* opt : {f.opt.get(), h.get()}) {
    REQUIRE_SA_OK(opt, sa_optimizer_set_grad(opt, 0, &g));
    REQUIRE_SA_OK(opt, sa_optimizer_set_grad(opt, 1, &g));
    REQUIRE_SA_OK(opt, sa_optimizer_step(opt, nullptr, nullptr));
  }
  CHECK(std::memcmp(f.p8.data(), q8_again.data(), f.p8.bytes()) == 0);
}

TEST_CASE("q8 moments reshard from 3 ranks onto 2 by re-quantizing with the new blocks",
          "[quant8][state_io]") {
  const int64_t n = 1000;
  const int64_t from[3][2] = {{0, 300}, {300, 400}, {700, 300}};  // offset, size
  const int64_t to[2][2] = {{0, 500}, {500, 500}};
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal;
  std::vector<std::unique_ptr<HostTensor>> params, grads;
  std::vector<OptimizerPtr> sources;
  std::vector<float> global_m(n), global_v(n);
  std::vector<Bytes> blobs;
  for (const auto& box : from) {
    params.push_back(std::make_unique<HostTensor>(std::vector<int64_t>{box[1]}, kFloat32));
    grads.push_back(std::make_unique<HostTensor>(std::vector<int64_t>{box[1]}, kFloat32));
    for (int64_t i = 0; i < box[1]; ++i) params.back()->as<float>()[i] = normal(rng);
    sources.push_back(one_param("w", n, box[0], *params.back(), kUint8));
    for (int s = 0; s < 2; ++s) {
      for (int64_t i = 0; i < box[1]; ++i)
        grads.back()->as<float>()[i] = normal(rng) * (i % 100 == 0 ? 1.0f : 0.01f);
      step_with(sources.back().get(), *grads.back());
    }
    const std::vector<float> m = decoded(sources.back().get(), 0, "exp_avg", true);
    const std::vector<float> v = decoded(sources.back().get(), 0, "exp_avg_sq", false);
    std::copy(m.begin(), m.end(), global_m.begin() + box[0]);
    std::copy(v.begin(), v.end(), global_v.begin() + box[0]);
    blobs.push_back(export_blob(sources.back().get()));
  }
  for (const auto& box : to) {
    INFO("destination [" << box[0] << ", " << box[0] + box[1] << ")");
    HostTensor p({box[1]}, kFloat32);
    OptimizerPtr dst = one_param("w", n, box[0], p, kUint8);
    REQUIRE_SA_OK(dst.get(), import_blobs(dst.get(), blobs));
    check_quantizes(
        dst.get(), 0, "exp_avg", true,
        std::vector<float>(global_m.begin() + box[0], global_m.begin() + box[0] + box[1]));
    check_quantizes(
        dst.get(), 0, "exp_avg_sq", false,
        std::vector<float>(global_v.begin() + box[0], global_v.begin() + box[0] + box[1]));
    // And onto float32 moments: the saved values themselves.
    HostTensor p32({box[1]}, kFloat32);
    OptimizerPtr dst32 = one_param("w", n, box[0], p32, kDefaultDtype);
    REQUIRE_SA_OK(dst32.get(), import_blobs(dst32.get(), blobs));
    CHECK(floats(state_view(dst32.get(), 0, "exp_avg")) ==
          std::vector<float>(global_m.begin() + box[0], global_m.begin() + box[0] + box[1]));
  }
}

// Saved codes of a 1-D param, one rank's box [offset, offset + size) of the global tensor.
struct SavedBox {
  int64_t offset, size;
  std::vector<uint8_t> codes[2];  // exp_avg, exp_avg_sq
  std::vector<float> absmax[2];
};

std::vector<uint8_t> codes_of(sa_optimizer* opt, const char* key) {
  const StateView v = state_view(opt, 0, key);
  const auto* c = static_cast<const uint8_t*>(v.data());
  return std::vector<uint8_t>(c, c + v.numel());
}

std::vector<uint32_t> bits_of(const std::vector<float>& x) {
  std::vector<uint32_t> out(x.size());
  if (!x.empty()) std::memcpy(out.data(), x.data(), x.size() * sizeof(float));
  return out;
}

// Checks that m float8 codes and their absmax `a` quantize the float32 values x: `a` is
// the largest |x| exactly, each code within half a float8 step of x / scale (1/16 of the
// value, or 2^-10 for a subnormal code), scale = max(a, 1e-12) / 448 in float64.
void check_f8_block_quantizes(const uint8_t* codes, float a, const float* x, int64_t m) {
  float largest = 0.0f;
  for (int64_t i = 0; i < m; ++i) largest = std::max(largest, std::fabs(x[i]));
  CHECK(a == largest);
  const double scale = std::max(static_cast<double>(a), 1e-12) / 448.0;
  for (int64_t i = 0; i < m; ++i) {
    const double scaled = x[i] / scale;
    CHECK(std::fabs(sa::kernels::e4m3fn_to_float(codes[i]) - scaled) <=
          std::max(std::fabs(scaled) / 16, std::ldexp(1.0, -10)) * 1.0001);
  }
}

// Where the block grids of the saved and the loading boxes agree, a block is loaded as
// saved, bit for bit (tiny absmax values below float32's normal range included); elsewhere
// it is quantized again from the saved values. Which local blocks a saved block holds
// whole (the same global elements) is worked out here from the boxes alone.
TEST_CASE(
    "8-bit and float8 moments reshard bit for bit where the block grids agree, re-quantized "
    "elsewhere",
    "[quant8][state_io]") {
  const int64_t n = 1000;
  using Boxes = std::vector<std::pair<int64_t, int64_t>>;  // offset, size
  const struct {
    const char* what;
    Boxes from, to;
    int whole;  // local blocks held whole by a saved block, of each moment
  } layouts[] = {
      {"2 ranks onto 2 others, on block boundaries", {{0, 512}, {512, 488}}, {{0, 256}, {256, 744}}, 4},
      {"2 ranks onto 1", {{0, 512}, {512, 488}}, {{0, 1000}}, 4},
      {"2 ranks onto 2 split at 300", {{0, 512}, {512, 488}}, {{0, 300}, {300, 700}}, 1},
      {"3 uneven ranks onto 1", {{0, 300}, {300, 400}, {700, 300}}, {{0, 1000}}, 1},
      {"3 ranks, one empty, onto 2, one empty", {{0, 512}, {512, 0}, {512, 488}}, {{0, 1000}, {1000, 0}}, 4},
  };
  // The moments' global values: block [0, 256) tiny (below 1.2e-38: float32 subnormals,
  // whose decoded values do not quantize back to the same codes), the rest of varied
  // scales, zeros at the end.
  std::mt19937_64 rng(15);
  std::vector<float> global[2];
  for (int k = 0; k < 2; ++k) {
    for (int64_t b = 0; b < n; b += 128) {
      const double scale = b < 256 ? 1e-39 : b >= 768 ? 0.0 : std::pow(10.0, -8.0 + 0.5 * b / 128);
      const std::vector<float> x = random_block(rng, std::min<int64_t>(128, n - b), scale, k == 0);
      global[k].insert(global[k].end(), x.begin(), x.end());
    }
  }
  const char* keys[2] = {"exp_avg", "exp_avg_sq"};
  for (const DLDataType moment : {kUint8, kFloat8E4m3fn}) {
    const bool q8 = same_dtype(moment, kUint8);
    for (const auto& layout : layouts) {
      INFO((q8 ? "uint8: " : "float8_e4m3fn: ") << layout.what);
      std::vector<SavedBox> saved;
      std::vector<Bytes> blobs;
      // The saved values: q8 decoded here (docs/precision.md's rule), float8 by the library.
      std::vector<float> values[2] = {std::vector<float>(n), std::vector<float>(n)};
      for (const auto& [offset, size] : layout.from) {
        HostTensor p({size}, kFloat32);
        OptimizerPtr src = one_param("w", n, offset, p, moment);
        SavedBox box{offset, size, {}, {}};
        for (int k = 0; k < 2; ++k) {
          HostTensor x({size}, kFloat32);
          std::copy_n(global[k].begin() + offset, size, x.as<float>());
          DLTensor t = x.dl();
          REQUIRE_SA_OK(src.get(), sa_optimizer_set_moment_values(src.get(), 0, keys[k], &t));
          box.codes[k] = codes_of(src.get(), keys[k]);
          box.absmax[k] =
              floats(state_view(src.get(), 0, (std::string(keys[k]) + "_absmax").c_str()));
          REQUIRE_SA_OK(src.get(), sa_optimizer_get_moment_values(src.get(), 0, keys[k], &t));
          const std::vector<float> d =
              q8 ? decoded(src.get(), 0, keys[k], k == 0)
                 : std::vector<float>(x.as<float>(), x.as<float>() + size);
          std::copy(d.begin(), d.end(), values[k].begin() + offset);
        }
        saved.push_back(std::move(box));
        blobs.push_back(export_blob(src.get()));
      }
      int whole[2] = {0, 0};
      for (const auto& [offset, size] : layout.to) {
        HostTensor p({size}, kFloat32);
        OptimizerPtr dst = one_param("w", n, offset, p, moment);
        REQUIRE_SA_OK(dst.get(), import_blobs(dst.get(), blobs));
        for (int k = 0; k < 2; ++k) {
          const std::vector<uint8_t> codes = codes_of(dst.get(), keys[k]);
          const std::vector<float> absmax =
              floats(state_view(dst.get(), 0, (std::string(keys[k]) + "_absmax").c_str()));
          for (int64_t b = 0; b * kQuant8Block < size; ++b) {
            const int64_t begin = offset + b * kQuant8Block;  // global
            const int64_t m = std::min<int64_t>(kQuant8Block, size - b * kQuant8Block);
            const auto holder = std::find_if(saved.begin(), saved.end(), [&](const SavedBox& s) {
              return s.offset <= begin && begin < s.offset + s.size;
            });
            REQUIRE(holder != saved.end());
            const int64_t at = begin - holder->offset;  // in the saved box
            const uint8_t* c = codes.data() + b * kQuant8Block;
            const float a = absmax[static_cast<std::size_t>(b)];
            INFO(keys[k] << " local block " << b << " (global " << begin << ")");
            if (at % kQuant8Block == 0 && std::min<int64_t>(kQuant8Block, holder->size - at) == m) {
              ++whole[k];
              CHECK(std::equal(c, c + m, holder->codes[k].begin() + at));
              CHECK(bits_of({a}) ==
                    bits_of({holder->absmax[k][static_cast<std::size_t>(at / kQuant8Block)]}));
            } else if (q8) {  // quantized from the saved values (never the tiny ones here)
              check_block_quantizes(c, a, values[k].data() + begin, m, k == 0);
            } else {
              check_f8_block_quantizes(c, a, values[k].data() + begin, m);
            }
          }
        }
      }
      CHECK(whole[0] == layout.whole);
      CHECK(whole[1] == layout.whole);
    }
  }
}

TEST_CASE(
    "moment values: an 8-bit moment read as float32 and written back is unchanged, float32 "
    "values are quantized by the local blocks",
    "[quant8]") {
  Q8Fixture f;
  std::mt19937_64 rng(14);
  for (int s = 0; s < 3; ++s) f.step(rng);
  for (const char* key : {"exp_avg", "exp_avg_sq"}) {
    INFO(key);
    const bool is_signed = std::string(key) == "exp_avg";
    HostTensor values({3, 200}, kFloat32);
    DLTensor t = values.dl();
    REQUIRE_SA_OK(f.opt.get(), sa_optimizer_get_moment_values(f.opt.get(), 0, key, &t));
    const std::vector<float> got(values.as<float>(), values.as<float>() + values.numel());
    CHECK(got == decoded(f.opt.get(), 0, key, is_signed));
    const std::vector<uint8_t> codes_before = [&] {
      const StateView v = state_view(f.opt.get(), 0, key);
      const auto* c = static_cast<const uint8_t*>(v.data());
      return std::vector<uint8_t>(c, c + v.numel());
    }();
    const std::vector<float> absmax_before =
        floats(state_view(f.opt.get(), 0, (std::string(key) + "_absmax").c_str()));
    REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_moment_values(f.opt.get(), 0, key, &t));
    const StateView after = state_view(f.opt.get(), 0, key);
    CHECK(std::memcmp(after.data(), codes_before.data(), codes_before.size()) == 0);
    CHECK(floats(state_view(f.opt.get(), 0, (std::string(key) + "_absmax").c_str())) ==
          absmax_before);
    // The float32 moments of param 1, written into the 8-bit param 0.
    HostTensor f32({3, 200}, kFloat32);
    DLTensor u = f32.dl();
    REQUIRE_SA_OK(f.opt.get(), sa_optimizer_get_moment_values(f.opt.get(), 1, key, &u));
    CHECK(std::vector<float>(f32.as<float>(), f32.as<float>() + f32.numel()) ==
          floats(state_view(f.opt.get(), 1, key)));
    REQUIRE_SA_OK(f.opt.get(), sa_optimizer_set_moment_values(f.opt.get(), 0, key, &u));
    check_quantizes(f.opt.get(), 0, key, is_signed,
                    std::vector<float>(f32.as<float>(), f32.as<float>() + f32.numel()));
  }
  // What checkpoints hold: the moments, not their block absmax values.
  const char* keys[8] = {};
  int32_t count = -1;
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_checkpoint_keys(f.opt.get(), 0, keys, 8, &count));
  REQUIRE(count == 2);
  CHECK(std::string(keys[0]) == "exp_avg");
  CHECK(std::string(keys[1]) == "exp_avg_sq");
  REQUIRE_SA_OK(f.opt.get(), sa_optimizer_state_keys(f.opt.get(), 0, keys, 8, &count));
  CHECK(count == 4);
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_checkpoint_keys(f.opt.get(), 0, keys, 8, nullptr), "count is NULL");
  HostTensor wrong_shape({600}, kFloat32), wrong_dtype({3, 200}, kBfloat16);
  DLTensor a = wrong_shape.dl(), b = wrong_dtype.dl();
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_set_moment_values(f.opt.get(), 0, "exp_avg", &a), "shape [600]",
                 "local shape [3, 200]");
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_get_moment_values(f.opt.get(), 0, "exp_avg", &b), "bfloat16",
                 "float32");
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_get_moment_values(f.opt.get(), 0, "exp_avg_absmax", &a),
                 "no moment 'exp_avg_absmax'", "exp_avg, exp_avg_sq");
  CHECK_SA_FAILS(f.opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_get_moment_values(f.opt.get(), 0, "exp_avg", nullptr), "out is NULL");
}

}  // namespace
