// kernels/cpu/grad_norm_cpu.cpp — grad_norm_partial. Four independent double accumulators
// keep the FPU busy; the grads are read once, so the loop runs at memory speed.
#include "grad_norm_cpu.h"

#include <cmath>
#include <limits>

namespace sa {
namespace kernels {
namespace {

template <class Load>
double sum_squares(Load load, int64_t begin, int64_t end) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = begin;
  for (; i + 4 <= end; i += 4)
    for (int k = 0; k < 4; ++k) {
      const double g = load(i + k);
      acc[k] = std::fma(g, g, acc[k]);
    }
  for (; i < end; ++i) {
    const double g = load(i);
    acc[0] = std::fma(g, g, acc[0]);
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

template <class Load>
double abs_max(Load load, int64_t begin, int64_t end) {
  double best = 0.0;
  for (int64_t i = begin; i < end; ++i) {
    double a = std::fabs(load(i));
    if (std::isnan(a)) a = std::numeric_limits<double>::infinity();
    best = a > best ? a : best;
  }
  return best;
}

template <class Load>
double partial(NormType norm, Load load, int64_t begin, int64_t end) {
  return norm == NormType::inf ? abs_max(load, begin, end) : sum_squares(load, begin, end);
}

}  // namespace

double grad_norm_partial(NormType norm, ElemType type, const void* grad, int64_t begin, int64_t end) {
  const auto* bits = static_cast<const uint16_t*>(grad);
  switch (type) {
    case ElemType::f32: {
      const auto* f = static_cast<const float*>(grad);
      return partial(norm, [f](int64_t i) { return static_cast<double>(f[i]); }, begin, end);
    }
    case ElemType::bf16:
      return partial(norm, [bits](int64_t i) { return static_cast<double>(bf16_to_float(bits[i])); },
                     begin, end);
    case ElemType::f16:
      return partial(norm, [bits](int64_t i) { return static_cast<double>(half_to_float(bits[i])); },
                     begin, end);
  }
  return 0.0;
}

}  // namespace kernels
}  // namespace sa
