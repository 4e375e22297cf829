// tests/newton_schulz_reference.hpp — Muon's Newton-Schulz iteration in float64, written from
// torch.optim.Muon's _zeropower_via_newtonschulz with explicit transposes and triple loops:
// nothing shared with the implementations under test (kernels/cpu, kernels/cuda) but the
// constants. Small matrices only.
#ifndef SHARDADAM_TESTS_NEWTON_SCHULZ_REFERENCE_HPP_
#define SHARDADAM_TESTS_NEWTON_SCHULZ_REFERENCE_HPP_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/newton_schulz.h"

namespace sa::test {

using Matrix = std::vector<double>;  // row-major

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

}  // namespace sa::test

#endif  // SHARDADAM_TESTS_NEWTON_SCHULZ_REFERENCE_HPP_
