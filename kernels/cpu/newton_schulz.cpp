// kernels/cpu/newton_schulz.cpp — see newton_schulz.h.
#include "newton_schulz.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sa {
namespace kernels {

void newton_schulz_cpu(CblasSgemm sgemm, float* x, int64_t rows, int64_t cols,
                       const NewtonSchulz& ns, float* work) {
  const NsShape s = ns_shape(rows, cols);
  const int order = s.transposed ? kCblasColMajor : kCblasRowMajor;
  const auto m = static_cast<int>(s.m), n = static_cast<int>(s.n);
  const auto ld = static_cast<int>(s.ld);
  const std::size_t elems = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);

  double squares = 0.0;
  for (std::size_t i = 0; i < elems; ++i) squares += static_cast<double>(x[i]) * x[i];
  const float inverse = 1.0f / std::max(static_cast<float>(std::sqrt(squares)), ns.eps);
  for (std::size_t i = 0; i < elems; ++i) x[i] *= inverse;

  float* a = work;           // A = X X^T, m x m (symmetric: either order reads it)
  float* b = a + s.m * s.m;  // B = b A + c A A, m x m (symmetric)
  float* y = b + s.m * s.m;  // the next X, laid out as X
  float* cur = x;
  for (int32_t step = 0; step < ns.steps; ++step) {
    sgemm(order, kCblasNoTrans, kCblasTrans, m, m, n, 1.0f, cur, ld, cur, ld, 0.0f, a, m);
    std::memcpy(b, a, static_cast<std::size_t>(s.m * s.m) * sizeof(float));
    sgemm(order, kCblasNoTrans, kCblasNoTrans, m, m, m, ns.c, a, m, a, m, ns.b, b, m);
    std::memcpy(y, cur, elems * sizeof(float));
    sgemm(order, kCblasNoTrans, kCblasNoTrans, m, n, m, 1.0f, b, m, cur, ld, ns.a, y, ld);
    std::swap(cur, y);
  }
  if (cur != x) std::memcpy(x, cur, elems * sizeof(float));
}

}  // namespace kernels
}  // namespace sa
