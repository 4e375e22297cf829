// kernels/cpu/grad_norm_cpu.cpp — grad_norm_partial: independent double accumulators over
// one read of the grads.
#include "grad_norm_cpu.h"

#include <cmath>
#include <limits>

namespace sa {
namespace kernels {
namespace {

// A float's square is exact in double (24 + 24 significand bits < 53), so a plain
// multiply and add round once per element, like an fma would, and vectorize on any x86-64.
template <class Load>
double sum_squares(Load load, int64_t begin, int64_t end) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const double g = load(i + k);
      acc[k] += g * g;
    }
  for (; i < end; ++i) {
    const double g = load(i);
    acc[0] += g * g;
  }
  double total = 0.0;
  for (double a : acc) total += a;
  return total;
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
