// tests/test_fp8_moments.cpp — float8 e4m3fn moments (moment_dtype float8_e4m3fn,
// ElemType::f8e4m3, kernels/block_moment.h):
//  - the e4m3fn codec against float64: every code decodes to sign * 2^(e-7) * (1 + m/8)
//    (2^-6 * m/8 for subnormals), and encoding is nearest with ties to even, saturating;
//  - the block codec: the absmax, its clipped scale, codes within half a float8 step, a
//    NaN making the whole block NaN, and file values that quantize back exactly;
//  - through the C ABI: the states, and a first step whose param equals float32 moments'.
// torch's and ml_dtypes' float8 casts, the independent references for the codes after a
// step, are used by bindings/python/tests/test_fp8_moments.py; the SIMD/scalar and
// CPU/CUDA agreement by tests/test_quant8.cpp and tests/gpu.
#include <math.h>
#include <stdint.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "../kernels/block_moment.h"
#include "../src/moment_values.hpp"
#include "test_support.hpp"

namespace {

using namespace sa_test;
using sa::kernels::e4m3fn_to_float;
using sa::kernels::ElemType;
using sa::kernels::float_to_e4m3fn;
using sa::kernels::kQuant8Block;

// The value of code c by the format's definition, in float64.
double e4m3_value(int c) {
  const int sign = (c & 0x80) ? -1 : 1, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 0) return sign * std::ldexp(m / 8.0, -6);
  return sign * std::ldexp(1.0 + m / 8.0, e - 7);
}

bool is_nan_code(int c) { return (c & 0x7F) == 0x7F; }

TEST_CASE("float8 e4m3fn: every code decodes to the format's value", "[fp8]") {
  for (int c = 0; c < 256; ++c) {
    INFO("code " << c);
    if (is_nan_code(c)) {
      CHECK(std::isnan(e4m3fn_to_float(static_cast<uint8_t>(c))));
    } else {
      CHECK(static_cast<double>(e4m3fn_to_float(static_cast<uint8_t>(c))) == e4m3_value(c));
      CHECK(std::signbit(e4m3fn_to_float(static_cast<uint8_t>(c))) == ((c & 0x80) != 0));
    }
  }
  CHECK(e4m3_value(0x7E) == 448.0);  // the largest
  CHECK(e4m3_value(0x01) == std::ldexp(1.0, -9));
}

TEST_CASE("float8 e4m3fn: encoding is nearest, ties to even, saturating at 448", "[fp8]") {
  for (int c = 0; c < 0x7E; ++c) {  // consecutive non-negative codes c, c + 1
    const float lo = e4m3fn_to_float(static_cast<uint8_t>(c));
    const float hi = e4m3fn_to_float(static_cast<uint8_t>(c + 1));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact
    const int even = (c % 2 == 0) ? c : c + 1;
    INFO("codes " << c << ", " << c + 1);
    for (const float sign : {1.0f, -1.0f}) {
      const int s = sign < 0 ? 0x80 : 0;
      CHECK(float_to_e4m3fn(sign * lo) == (c | s));
      CHECK(float_to_e4m3fn(sign * hi) == ((c + 1) | s));
      CHECK(float_to_e4m3fn(sign * mid) == (even | s));
      CHECK(float_to_e4m3fn(sign * std::nextafter(mid, 0.0f)) == (c | s));
      CHECK(float_to_e4m3fn(sign * std::nextafter(mid, 1e9f)) == ((c + 1) | s));
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (const float big : {448.0f, 463.99f, 464.0f, 1e6f, inf}) {
    CHECK(float_to_e4m3fn(big) == 0x7E);
    CHECK(float_to_e4m3fn(-big) == 0xFE);
  }
  CHECK(float_to_e4m3fn(1e-30f) == 0x00);
  CHECK(float_to_e4m3fn(-0.0f) == 0x80);
  CHECK(is_nan_code(float_to_e4m3fn(std::numeric_limits<float>::quiet_NaN())));
}

// On a GPU the codec encodes by multiplying with the scale's inverse and divides only near
// a rounding boundary (BlockCodec<f8e4m3>::encode_by_inverse, here with the portable pair
// conversion that tests/gpu checks the hardware one against); the codes must be torchao's,
// those of the division, for every x and scale. The hard cases are quotients within a few float
// steps of an e4m3fn midpoint (and of 464, where saturation starts), around powers of two, and the
// special values; random x over wide exponent ranges cover the rest.
TEST_CASE("float8 moments: encoding by the scale's inverse equals encoding the quotient", "[fp8]") {
  using Codec = sa::kernels::BlockCodec<ElemType::f8e4m3>;
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> unit(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-40, 40);
  int64_t checked = 0, mismatches = 0;
  const auto check = [&](float x, float absmax) {
    const auto f = Codec::encode_factor(absmax);
    const uint8_t want = float_to_e4m3fn(x / f.scale);
    const uint8_t got = Codec::encode_by_inverse(x, f);
    ++checked;
    // NaN codes of either sign are both NaN; every other code must be the same bits.
    if (is_nan_code(want) ? !is_nan_code(got) : got != want) {
      if (++mismatches <= 5)
        FAIL_CHECK("x " << x << " absmax " << absmax << ": " << int(got) << " != " << int(want));
    }
  };
  std::vector<float> boundaries;  // quotients where e4m3fn rounding changes: every midpoint
  for (int c = 0; c < 0x7E; ++c)
    boundaries.push_back(static_cast<float>((e4m3_value(c) + e4m3_value(c + 1)) / 2));
  boundaries.push_back(464.0f);
  for (float p2 = 0x1p-12f; p2 <= 512.0f; p2 *= 2) boundaries.push_back(p2);
  for (int trial = 0; trial < 300; ++trial) {
    const float absmax = std::ldexp(unit(rng), exponent(rng));
    const float scale = Codec::encode_factor(absmax).scale;
    for (float b : boundaries) {
      float x = b * scale;  // within half a step of b * scale
      for (int i = 0; i < 24; ++i) x = std::nextafter(x, 0.0f);
      for (int i = 0; i < 49; ++i, x = std::nextafter(x, 1e38f)) {
        check(x, absmax);
        check(-x, absmax);
      }
    }
    for (int i = 0; i < 2000; ++i) {
      const float x = std::ldexp(unit(rng) - 1.0f, -30 + static_cast<int>(rng() % 40)) * absmax;
      check(x, absmax);
      check(-x, absmax);
    }
  }
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  for (float absmax : {0.0f, 1e-30f, 1e-12f, 1.0f, 3e38f, inf, nan})
    for (float x : {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-38f, 1e-12f, 1.0f, -1.0f, 448.0f, 3e38f,
                    -3e38f, inf, -inf, nan, -nan})
      check(x, absmax);
  CHECK(mismatches == 0);
  CHECK(checked > 5'000'000);
}

TEST_CASE("float8 moments: a block's scale, codes, NaN, and file values that quantize back",
          "[fp8]") {
  using Codec = sa::kernels::BlockCodec<ElemType::f8e4m3>;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal;
  for (const float magnitude : {1e-20f, 1e-13f, 1e-6f, 1.0f, 1e8f}) {
    for (const int64_t n : {int64_t{1}, int64_t{37}, kQuant8Block}) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (float& v : x) v = normal(rng) * magnitude;
      std::vector<uint8_t> codes(x.size());
      const float absmax =
          sa::kernels::encode_block<ElemType::f8e4m3>({}, x.data(), n, codes.data());
      double largest = 0;
      for (float v : x) largest = std::max(largest, std::fabs(static_cast<double>(v)));
      REQUIRE(static_cast<double>(absmax) == largest);
      const double scale = std::max(static_cast<double>(absmax), 1e-12) / 448.0;
      INFO("magnitude " << magnitude << ", n " << n);
      CHECK(std::fabs(Codec::scale(absmax) - scale) <= scale * 1e-7);
      for (int64_t i = 0; i < n; ++i) {
        // Nearest float8 of x / scale: within half a step (1/16 of the value, or 2^-10).
        const double scaled = x[i] / static_cast<double>(Codec::scale(absmax));
        const double got = e4m3_value(codes[i]);
        CHECK(std::fabs(got - scaled) <=
              std::max(std::fabs(scaled) / 16, std::ldexp(1.0, -10)) * 1.0001);
      }
      // The file values (moment_values) quantize back to the same codes and absmax.
      std::vector<float> values(x.size());
      sa::block_values(ElemType::f8e4m3, true, codes.data(), &absmax, n, values.data());
      std::vector<uint8_t> again(x.size());
      float absmax_again = 0;
      sa::block_from_values(ElemType::f8e4m3, true, values.data(), n, again.data(), &absmax_again);
      CHECK(sa::kernels::float_bits(absmax_again) == sa::kernels::float_bits(absmax));
      CHECK(again == codes);
    }
  }
  std::vector<float> x(40, 1.0f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> codes(40);
  const float absmax = sa::kernels::encode_block<ElemType::f8e4m3>({}, x.data(), 40, codes.data());
  CHECK(std::isnan(absmax));
  for (int i = 0; i < 40; ++i)
    CHECK(std::isnan(
        Codec::decode({}, codes[static_cast<std::size_t>(i)], Codec::decode_factor(absmax))));
}

TEST_CASE("float8 moments through the C ABI: the states, and a first step equal to float32's",
          "[fp8]") {
  HostTensor p8{{3, 200}, kFloat32}, p32{{3, 200}, kFloat32}, grad{{3, 200}, kFloat32};
  OptimizerPtr opt = make_optimizer();
  sa_group_config config = SA_GROUP_CONFIG_INIT;
  config.lr = 1e-2;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &config, nullptr));
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < p8.numel(); ++i) {
    p8.as<float>()[i] = p32.as<float>()[i] = normal(rng);
    grad.as<float>()[i] = normal(rng) * 0.1f;
  }
  const sa_param_options f8 = param_options(kDefaultDtype, kFloat8E4m3fn, SA_MASTER_AUTO);
  REQUIRE_SA_OK(opt.get(),
                sa_optimizer_add_param(opt.get(), "f8", 0, p8.versioned(), nullptr, &f8, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "f32", 0, p32.versioned(), nullptr,
                                                  nullptr, nullptr));
  const DLTensor g = grad.dl();
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 1, &g));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  for (const char* key : {"exp_avg", "exp_avg_sq"}) {
    const StateView m = state_view(opt.get(), 0, key);
    CHECK(same_dtype(m.view->dl_tensor.dtype, kFloat8E4m3fn));
    CHECK(m.numel() == 600);
  }
  for (const char* key : {"exp_avg_absmax", "exp_avg_sq_absmax"}) {
    const StateView a = state_view(opt.get(), 0, key);
    CHECK(same_dtype(a.view->dl_tensor.dtype, kFloat32));
    CHECK(a.numel() == 3);  // blocks of 256, 256, 88
  }
  // The first update uses the float32 moments it computed, before they are encoded.
  for (int64_t i = 0; i < p8.numel(); ++i) REQUIRE(p8.as<float>()[i] == p32.as<float>()[i]);
}

}  // namespace
