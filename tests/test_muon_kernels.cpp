// tests/test_newton_schulz.cpp — kernels/cpu/newton_schulz.h against the float64 Newton-Schulz
// of muon_reference.hpp.
#include <catch2/catch.hpp>
#include <cblas.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/muon_cpu.h"
#include "kernels/cpu/newton_schulz.h"
#include "muon_reference.hpp"

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
    sa::kernels::muon_matrix_cpu(kSgemm, p.data(), g.data(), buf.data(), rows, cols, h, 1.0f,
                                 work.data());
    sa::test::muon_reference(p64, Matrix(g.begin(), g.end()), buf64, rows, cols, h);
  }
  CHECK(max_error(buf, buf64) < 1e-6);
  // The params moved by about lr * adjustment per step; float32 keeps them within a few
  // ulps of the float64 run.
  CHECK(max_error(p, p64) < 2e-5);
  // ...and they did move: 4 steps of an orthogonalized direction at lr 0.02.
  CHECK(max_error(start, p64) > 0.01);
}
