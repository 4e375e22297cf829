// tests/test_newton_schulz.cpp — kernels/cpu/newton_schulz.h against the float64 Newton-Schulz
// of muon_reference.hpp.
#include <catch2/catch.hpp>
#include <cblas.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/muon_cpu.h"
#include "kernels/cpu/newton_schulz.h"
#include "muon_reference.hpp"
#include "muon_slots.hpp"
#include "test_support.hpp"

namespace {

using sa::test::Matrix;

// The BLAS these tests link, as the kernels take it (the library loads one: src/blas.hpp).
const sa::kernels::CblasSgemm kSgemm = reinterpret_cast<sa::kernels::CblasSgemm>(&cblas_sgemm);
using sa::test::ns_reference;

// The largest |got - want| over the matrix.
double max_error(const std::vector<float>& got, const Matrix& want) {
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  return worst;
}

std::vector<float> orthogonalized(std::vector<float> x, int64_t rows, int64_t cols,
                                  const sa::kernels::NewtonSchulz& ns) {
  std::vector<float> work(static_cast<std::size_t>(sa::kernels::ns_work_elems(rows, cols)));
  sa::kernels::newton_schulz_cpu(kSgemm, x.data(), rows, cols, ns, work.data());
  return x;
}

}  // namespace

TEST_CASE("Newton-Schulz on the CPU matches a float64 reference: wide, tall, square, 1 to 8 steps",
          "[newton_schulz]") {
  const auto [rows, cols] = GENERATE(std::pair<int64_t, int64_t>{8, 24}, std::pair<int64_t, int64_t>{24, 8},
                                     std::pair<int64_t, int64_t>{17, 17}, std::pair<int64_t, int64_t>{1, 9},
                                     std::pair<int64_t, int64_t>{9, 1}, std::pair<int64_t, int64_t>{33, 70});
  const int32_t steps = GENERATE(1, 2, 5, 8);
  CAPTURE(rows, cols, steps);
  const std::vector<float> g = sa::test::random_matrix(
      rows, cols, static_cast<unsigned>(rows * 1000 + cols * 10 + steps), 0.02f);
  sa::kernels::NewtonSchulz ns;
  ns.steps = steps;
  const std::vector<float> got = orthogonalized(g, rows, cols, ns);
  const Matrix want = ns_reference(Matrix(g.begin(), g.end()), rows, cols, ns);
  // float32 GEMMs against float64: a few ulps of values of order 1, grown over the steps.
  CHECK(max_error(got, want) < 2e-5 * steps);
  // Not the input scaled: the iteration moved the singular values towards 1.
  double moved = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) moved = std::max(moved, static_cast<double>(std::abs(got[i] - g[i])));
  CHECK(moved > 1e-2);
}

TEST_CASE("Newton-Schulz takes its constants from the caller and keeps a zero matrix zero",
          "[newton_schulz]") {
  const std::vector<float> g = sa::test::random_matrix(6, 10, 7, 1.0f);
  sa::kernels::NewtonSchulz other;
  other.a = 2.0f;
  other.b = -1.5f;
  other.c = 0.5f;
  other.steps = 3;
  const std::vector<float> got = orthogonalized(g, 6, 10, other);
  CHECK(max_error(got, ns_reference(Matrix(g.begin(), g.end()), 6, 10, other)) < 1e-4);
  CHECK(max_error(got, ns_reference(Matrix(g.begin(), g.end()), 6, 10, sa::kernels::NewtonSchulz{})) >
        1e-2);

  // ||0|| = 0 is clamped to eps: the zero matrix stays zero, with no NaN.
  const std::vector<float> zero = orthogonalized(std::vector<float>(12, 0.0f), 3, 4, {});
  for (float v : zero) CHECK(v == 0.0f);
}

TEST_CASE("A Muon matrix step on the CPU matches a float64 Muon over several steps: nesterov on and "
          "off, both learning rate adjustments, wide and tall",
          "[muon]") {
  const auto [rows, cols] = GENERATE(std::pair<int64_t, int64_t>{12, 40},
                                     std::pair<int64_t, int64_t>{40, 12},
                                     std::pair<int64_t, int64_t>{16, 16});
  const bool nesterov = GENERATE(true, false);
  const auto adjust = GENERATE(sa::kernels::MuonLrAdjust::original,
                               sa::kernels::MuonLrAdjust::match_rms_adamw);
  CAPTURE(rows, cols, nesterov, static_cast<int>(adjust));
  sa::kernels::MuonHyper h;
  h.lr = 0.02;
  h.weight_decay = 0.1;
  h.momentum = 0.9;
  h.nesterov = nesterov;
  h.adjust_lr = adjust;
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  const unsigned seed = static_cast<unsigned>(rows + 7 * cols + (nesterov ? 1 : 0));
  std::vector<float> p = sa::test::random_matrix(rows, cols, seed, 1.0f), buf(n, 0.0f);
  std::vector<float> work(static_cast<std::size_t>(sa::kernels::muon_work_elems(rows, cols)));
  const std::vector<float> start = p;
  Matrix p64(p.begin(), p.end()), buf64(n, 0.0);
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> g = sa::test::random_matrix(rows, cols, seed + 100 + step, 0.01f);
    REQUIRE(sa::kernels::muon_matrix_cpu(sa::test::muon_variant(), kSgemm,
                                         sa::test::muon_slot(p.data(), g.data(), buf.data()), rows,
                                         cols, h, 1.0f, work.data()));
    sa::test::muon_reference(p64, Matrix(g.begin(), g.end()), buf64, rows, cols, h);
  }
  CHECK(max_error(buf, buf64) < 1e-6);
  // The params moved by about lr * adjustment per step; float32 keeps them within a few
  // ulps of the float64 run.
  CHECK(max_error(p, p64) < 2e-5);
  // ...and they did move: 4 steps of an orthogonalized direction at lr 0.02.
  CHECK(max_error(start, p64) > 0.01);
}

namespace {

using sa::kernels::ElemType;

std::vector<uint16_t> bf16_bits_of(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float r = static_cast<float>(sa_test::round_to_bf16(x[i]));
    uint32_t bits = 0;
    std::memcpy(&bits, &r, sizeof bits);
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
  return out;
}

float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f = 0.0f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

// Muon's storage forms (kernels/variants.h's Muon tables) on the CPU, each against what it
// must equal: a bfloat16 param's float32 master steps as a float32 param does, bit for bit,
// and the param is its master rounded; bfloat16 grads step as float32 grads of the same
// values; a bfloat16 momentum_buffer is the float64 reference's kept in bfloat16.
TEST_CASE("Muon on the CPU over bfloat16 params (float32 master), grads and momentum_buffer",
          "[muon]") {
  const auto [rows, cols] =
      GENERATE(std::pair<int64_t, int64_t>{12, 40}, std::pair<int64_t, int64_t>{40, 12});
  CAPTURE(rows, cols);
  sa::kernels::MuonHyper h;
  h.lr = 0.02;
  h.momentum = 0.9;
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  std::vector<float> work(static_cast<std::size_t>(sa::kernels::muon_work_elems(rows, cols)));
  const std::vector<float> start = sa::test::random_matrix(rows, cols, 11, 1.0f);
  auto grad_at = [&](int step) { return sa::test::random_matrix(rows, cols, 20 + step, 0.01f); };
  auto step_f32 = [&](std::vector<float>& p, const std::vector<float>& g, std::vector<float>& buf) {
    REQUIRE(sa::kernels::muon_matrix_cpu(sa::test::muon_variant(), kSgemm,
                                         sa::test::muon_slot(p.data(), g.data(), buf.data()), rows,
                                         cols, h, 1.0f, work.data()));
  };

  SECTION("a bfloat16 param's master steps as a float32 param; the param is it rounded") {
    std::vector<float> p = start, buf(n, 0.0f), master = start, buf2(n, 0.0f);
    std::vector<uint16_t> param = bf16_bits_of(start);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> g = grad_at(step);
      step_f32(p, g, buf);
      REQUIRE(sa::kernels::muon_matrix_cpu(
          sa::test::muon_variant(ElemType::bf16), kSgemm,
          sa::test::muon_slot(param.data(), g.data(), buf2.data(), master.data()), rows, cols, h,
          1.0f, work.data()));
      CHECK(master == p);
      CHECK(buf2 == buf);
      CHECK(param == bf16_bits_of(p));
    }
  }
  SECTION("bfloat16 grads step as float32 grads of the same values") {
    std::vector<float> p = start, buf(n, 0.0f), p2 = start, buf2(n, 0.0f);
    for (int step = 0; step < 3; ++step) {
      const std::vector<uint16_t> g16 = bf16_bits_of(grad_at(step));
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = bf16_value(g16[i]);
      step_f32(p, g, buf);
      REQUIRE(sa::kernels::muon_matrix_cpu(
          sa::test::muon_variant(ElemType::f32, ElemType::bf16), kSgemm,
          sa::test::muon_slot(p2.data(), g16.data(), buf2.data()), rows, cols, h, 1.0f,
          work.data()));
      CHECK(p2 == p);
      CHECK(buf2 == buf);
    }
  }
  SECTION("a bfloat16 momentum_buffer is the float64 reference's kept in bfloat16") {
    std::vector<float> p = start;
    std::vector<uint16_t> buf(n, 0);
    Matrix p64(start.begin(), start.end()), buf64(n, 0.0);
    for (int step = 0; step < 4; ++step) {
      const std::vector<float> g = grad_at(step);
      REQUIRE(sa::kernels::muon_matrix_cpu(
          sa::test::muon_variant(ElemType::f32, ElemType::f32, ElemType::bf16), kSgemm,
          sa::test::muon_slot(p.data(), g.data(), buf.data()), rows, cols, h, 1.0f, work.data()));
      sa::test::muon_reference(p64, Matrix(g.begin(), g.end()), buf64, rows, cols, h,
                               sa_test::round_to_bf16);
    }
    double worst_buf = 0.0;  // in units of the reference's bfloat16 spacing
    for (std::size_t i = 0; i < n; ++i)
      worst_buf = std::max(worst_buf, std::abs(bf16_value(buf[i]) - buf64[i]) /
                                          std::max(std::abs(buf64[i]) * std::ldexp(1.0, -8), 1e-30));
    CHECK(worst_buf <= 1.0);  // a tie rounded the other way at most
    CHECK(max_error(p, p64) < 1e-4);
    CHECK(max_error(start, p64) > 0.01);
  }
  SECTION("not a Muon Variant: refused, nothing changed") {
    std::vector<float> p = start, buf(n, 0.0f);
    const std::vector<float> g = grad_at(0);
    sa::kernels::Variant adam = sa::test::muon_variant();
    adam.rule = sa::kernels::UpdateRule::adam;
    CHECK_FALSE(sa::kernels::muon_matrix_cpu(adam, kSgemm,
                                             sa::test::muon_slot(p.data(), g.data(), buf.data()),
                                             rows, cols, h, 1.0f, work.data()));
    CHECK(p == start);
  }
}
