// kernels/cpu/grad_norm_cpu.cpp — grad_norm_partial: one read of the grads into double
// accumulators. The sum of squares of float32 and bfloat16 grads runs in Highway vectors of
// doubles (whole vectors; the scalar loop takes the rest and the other cases).
//
// A float's square is exact in double (24 + 24 significand bits < 53), so every path
// rounds once per element (the add), whether it uses an fma or not.

// hwy/foreach_target.h re-includes this file once per SIMD target, by the name below.
#if __has_include("kernels/cpu/grad_norm_cpu.cpp")
#define HWY_TARGET_INCLUDE "kernels/cpu/grad_norm_cpu.cpp"
#elif __has_include("cpu/grad_norm_cpu.cpp")
#define HWY_TARGET_INCLUDE "cpu/grad_norm_cpu.cpp"
#else
#error "grad_norm_cpu.cpp: put the repository root (or kernels/) on the include path"
#endif
#include "grad_norm_cpu.h"

#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <stdint.h>

#include <cmath>
#include <limits>

// ---- per SIMD target --------------------------------------------------------------------

HWY_BEFORE_NAMESPACE();
namespace sa {
namespace kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Adds the squares of the whole vectors of p[0, n) to *sum; returns how many elements it
// took. T is float or hwy::bfloat16_t.
template <class T>
int64_t SumSquaresWholeVectors(const T* p, int64_t n, double* sum) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;  // as many floats as dd has doubles
  const hn::Rebind<T, decltype(dd)> dt;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dd));
  auto widen = [&](int64_t i) {
    if constexpr (std::is_same<T, float>::value) {
      return hn::PromoteTo(dd, hn::LoadU(dt, p + i));
    } else {
      return hn::PromoteTo(dd, hn::PromoteTo(df, hn::LoadU(dt, p + i)));
    }
  };
  auto a0 = hn::Zero(dd), a1 = hn::Zero(dd), a2 = hn::Zero(dd), a3 = hn::Zero(dd);
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const auto x0 = widen(i), x1 = widen(i + lanes), x2 = widen(i + 2 * lanes),
               x3 = widen(i + 3 * lanes);
    a0 = hn::MulAdd(x0, x0, a0);
    a1 = hn::MulAdd(x1, x1, a1);
    a2 = hn::MulAdd(x2, x2, a2);
    a3 = hn::MulAdd(x3, x3, a3);
  }
  for (; i + lanes <= n; i += lanes) {
    const auto x = widen(i);
    a0 = hn::MulAdd(x, x, a0);
  }
  *sum += hn::GetLane(hn::SumOfLanes(dd, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  return i;
}

int64_t SumSquaresF32(const float* p, int64_t n, double* sum) {
  return SumSquaresWholeVectors(p, n, sum);
}
int64_t SumSquaresBf16(const uint16_t* p, int64_t n, double* sum) {
  return SumSquaresWholeVectors(reinterpret_cast<const hwy::bfloat16_t*>(p), n, sum);
}

}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace sa
HWY_AFTER_NAMESPACE();

// ---- once: the scalar path and the entry point -------------------------------------------

#if HWY_ONCE

namespace sa {
namespace kernels {
namespace {

template <class Load>
double sum_squares(Load load, int64_t begin, int64_t end) {
  double acc[4] = {};
  int64_t i = begin;
  for (; i + 4 <= end; i += 4)
    for (int k = 0; k < 4; ++k) {
      const double g = load(i + k);
      acc[k] += g * g;
    }
  for (; i < end; ++i) {
    const double g = load(i);
    acc[0] += g * g;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

template <class Load>
double abs_max(Load load, int64_t begin, int64_t end) {
  double best = 0.0;
  for (int64_t i = begin; i < end; ++i) {
    double a = std::fabs(load(i));
    if (std::isnan(a)) a = std::numeric_limits<double>::infinity();  // must not vanish in the max
    best = a > best ? a : best;
  }
  return best;
}

template <class Load>
double scalar_partial(NormType norm, Load load, int64_t begin, int64_t end) {
  return norm == NormType::inf ? abs_max(load, begin, end) : sum_squares(load, begin, end);
}

}  // namespace

HWY_EXPORT(SumSquaresF32);
HWY_EXPORT(SumSquaresBf16);

double grad_norm_partial(NormType norm, ElemType type, const void* grad, int64_t begin, int64_t end,
                         bool simd) {
  const auto* f = static_cast<const float*>(grad);
  const auto* bits = static_cast<const uint16_t*>(grad);
  double simd_sum = 0.0;
  if (simd && norm == NormType::l2 && begin < end) {
    if (type == ElemType::f32)
      begin += HWY_DYNAMIC_DISPATCH(SumSquaresF32)(f + begin, end - begin, &simd_sum);
    if (type == ElemType::bf16)
      begin += HWY_DYNAMIC_DISPATCH(SumSquaresBf16)(bits + begin, end - begin, &simd_sum);
  }
  double rest = 0.0;
  visit_elem_type(type, [&](auto tag) {  // a block storage is a moment's, never a grad's
    constexpr ElemType kType = decltype(tag)::value;
    const auto* p = static_cast<const StorageOf<kType>*>(grad);
    rest = scalar_partial(
        norm, [p](int64_t i) { return static_cast<double>(Codec<kType>::decode(p[i])); }, begin,
        end);
  });
  return norm == NormType::inf ? rest : simd_sum + rest;
}

}  // namespace kernels
}  // namespace sa

#endif  // HWY_ONCE
