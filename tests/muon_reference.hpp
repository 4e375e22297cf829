// tests/muon_reference.hpp — Muon in float64, written from torch.optim.Muon (torch 2.11's
// _zeropower_via_newtonschulz and _single_tensor_muon) with explicit transposes and triple
// loops: nothing shared with the implementations under test (kernels/cpu, kernels/cuda)
// but the constants' types. Small matrices only.
#ifndef SHARDADAM_TESTS_MUON_REFERENCE_HPP_
#define SHARDADAM_TESTS_MUON_REFERENCE_HPP_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/muon_math.h"

namespace sa::test {

using Matrix = std::vector<double>;  // row-major

// A rows x cols float32 matrix of normal(0, scale) values from a generator seeded with
// `seed`: the tests' inputs, the same on every run.
inline std::vector<float> random_matrix(int64_t rows, int64_t cols, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> m(static_cast<std::size_t>(rows * cols));
  for (float& v : m) v = normal(rng);
  return m;
}

inline Matrix multiply(const Matrix& p, const Matrix& q, int64_t rows, int64_t inner, int64_t cols) {
  Matrix out(static_cast<std::size_t>(rows * cols), 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = 0; k < inner; ++k)
      for (int64_t j = 0; j < cols; ++j) out[i * cols + j] += p[i * inner + k] * q[k * cols + j];
  return out;
}

inline Matrix transpose(const Matrix& p, int64_t rows, int64_t cols) {
  Matrix out(p.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[j * rows + i] = p[i * cols + j];
  return out;
}

// torch's algorithm in float64: transpose a tall matrix, normalise, iterate, transpose back.
inline Matrix ns_reference(Matrix g, int64_t rows, int64_t cols, const sa::kernels::NewtonSchulz& ns) {
  const bool tall = rows > cols;
  if (tall) g = transpose(g, rows, cols);
  const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
  double norm = 0.0;
  for (double v : g) norm += v * v;
  norm = std::max(std::sqrt(norm), static_cast<double>(ns.eps));
  for (double& v : g) v /= norm;
  for (int32_t step = 0; step < ns.steps; ++step) {
    const Matrix a = multiply(g, transpose(g, m, n), m, n, m);
    Matrix b = multiply(a, a, m, m, m);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = ns.b * a[i] + ns.c * b[i];
    Matrix next = multiply(b, g, m, m, n);
    for (std::size_t i = 0; i < next.size(); ++i) next[i] += ns.a * g[i];
    g = std::move(next);
  }
  return tall ? transpose(g, m, n) : g;
}

// One Muon step of a rows x cols matrix: buf and p updated in place; `keep` is what storing
// buf does to each element (nothing, or a rounding to the buffer's dtype: test_support.hpp's
// round_to_bf16).
inline void muon_reference(Matrix& p, const Matrix& g, Matrix& buf, int64_t rows, int64_t cols,
                           const sa::kernels::MuonHyper& h, double (*keep)(double) = nullptr) {
  Matrix u(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    buf[i] += (1.0 - h.momentum) * (g[i] - buf[i]);
    if (keep != nullptr) buf[i] = keep(buf[i]);
    u[i] = h.nesterov ? g[i] + h.momentum * (buf[i] - g[i]) : buf[i];
  }
  const Matrix o = ns_reference(u, rows, cols, h.ns);
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  const double adjusted =
      h.lr * (h.adjust_lr == sa::kernels::MuonLrAdjust::original ? std::sqrt(std::max(1.0, r / c))
                                                                 : 0.2 * std::sqrt(std::max(r, c)));
  for (std::size_t i = 0; i < p.size(); ++i)
    p[i] = p[i] * (1.0 - h.lr * h.weight_decay) - adjusted * o[i];
}

}  // namespace sa::test

#endif  // SHARDADAM_TESTS_MUON_REFERENCE_HPP_
