// kernels/cpu/adam_cpu.cpp — adam_cpu_range: the scalar element loop, and the dispatch to
// the Highway loop of adam_cpu_simd-inl.h for the whole vectors of a range.
//
// Build this file with -ffp-contract=off (adam_math.h, rule 1): the compiler must not
// fuse a multiply and an add of its own accord, or the scalar and SIMD paths (and the CUDA
// kernel) would round differently.
//
// No allocation and no locking here: the CPU backend calls adam_cpu_range from its worker
// threads on disjoint ranges.

// hwy/foreach_target.h re-includes this file once per SIMD target, by the name below.
// The quoted-include search for that name starts in hwy/, not next to this file, so the
// build must put the repository root or kernels/ on the include path.
#if __has_include("kernels/cpu/adam_cpu.cpp")
#define HWY_TARGET_INCLUDE "kernels/cpu/adam_cpu.cpp"
#elif __has_include("cpu/adam_cpu.cpp")
#define HWY_TARGET_INCLUDE "cpu/adam_cpu.cpp"
#else
#error "adam_cpu.cpp: put the repository root (or kernels/) on the include path"
#endif
#include "adam_cpu.h"

#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <stdint.h>

#include <cassert>
#include <cmath>

#include "../adam_math.h"
#include "../block_moment.h"
#include "../bucket_table.h"
#include "../param_cast.h"
#include "adam_cpu_simd-inl.h"
#include "visit_kernel.h"

// ---- per SIMD target --------------------------------------------------------------------

HWY_BEFORE_NAMESPACE();
namespace sa {
namespace kernels {
namespace HWY_NAMESPACE {

// Updates the whole vectors of [begin, end) and returns where the rest begins; on a
// target without a fused multiply-add it updates nothing and returns `begin`.
int64_t UpdateWholeVectorsOfVariant(const Variant& variant, const TensorSlot& slot,
                                    const GroupCoeffs& g, int64_t begin, int64_t end) {
#if HWY_NATIVE_FMA
  int64_t rest_begin = begin;
  visit_kernel(variant, g.l2, [&](auto signature, auto l2) HWY_ATTR {
    rest_begin =
        UpdateWholeVectors<decltype(signature), decltype(l2)::value>(slot, g.c, begin, end);
  });
  return rest_begin;
#else
  (void)variant;
  (void)slot;
  (void)g;
  (void)end;
  return begin;
#endif
}

const char* SimdTargetName() { return HWY_NATIVE_FMA ? hwy::TargetName(HWY_TARGET) : "scalar"; }

}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace sa
HWY_AFTER_NAMESPACE();

// ---- once: the scalar path and the entry points -----------------------------------------

#if HWY_ONCE

namespace sa {
namespace kernels {
namespace {

// The arithmetic adam_update() uses, on one float. std::fma is a correctly rounded fused
// multiply-add on every CPU (glibc emulates it where the hardware has none).
struct ScalarOps {
  float mul(float a, float b) const { return a * b; }
  float fma(float a, float b, float c) const { return std::fma(a, b, c); }
  float sqrt(float a) const { return std::sqrt(a); }
  float div(float a, float b) const { return a / b; }
  float max(float a, float b) const { return a > b ? a : b; }
};

template <ElemType T>
float load_elem(const StorageOf<T>* p) {
  return Codec<T>::decode(*p);
}

template <ElemType T>
void store_elem(float f, StorageOf<T>* p) {
  *p = Codec<T>::encode(f);
}

// The full-precision value of param i, wherever it is kept.
template <class S>
float load_param_value(const TypedSlot<S>& s, int64_t i) {
  if constexpr (S::kMaster == MasterKind::none) {
    return load_elem<S::kParam>(s.param + i);
  } else if constexpr (S::kMaster == MasterKind::fp32) {
    return s.master[i];
  } else {
    return join_remainder(s.param[i], s.master[i]);
  }
}

template <class S>
void store_param_value(const TypedSlot<S>& s, int64_t i, float p) {
  if constexpr (S::kMaster == MasterKind::none) {
    store_elem<S::kParam>(p, s.param + i);
  } else if constexpr (S::kMaster == MasterKind::fp32) {
    s.master[i] = p;
    store_elem<S::kParam>(p, s.param + i);
  } else {
    split_remainder(p, s.param[i], s.master[i]);
  }
}

template <class S, bool kL2>
void update_range_scalar(const TensorSlot& slot, const AdamCoeffs<float>& c, int64_t begin,
                         int64_t end) {
  const TypedSlot<S> s(slot);
  for (int64_t i = begin; i < end; ++i) {
    float p = load_param_value(s, i);
    float mom[kNumMoments];
    for_each_moment<S>([&](auto k) { mom[k] = load_elem<S::kMoment>(s.moment[k] + i); });
    adam_update<kL2, S::kAmsgrad>(ScalarOps(), c, load_elem<S::kGrad>(s.grad + i), p, mom);
    store_param_value(s, i, p);
    for_each_moment<S>([&](auto k) { store_elem<S::kMoment>(mom[k], s.moment[k] + i); });
  }
}

HWY_EXPORT(UpdateWholeVectorsOfVariant);
HWY_EXPORT(SimdTargetName);

void* state_at(const TensorSlot& slot, StateKind kind) {
  return slot.state[static_cast<size_t>(kind)];
}

void*& state_at(TensorSlot& slot, StateKind kind) { return slot.state[static_cast<size_t>(kind)]; }

void* offset(void* p, int64_t elems, int64_t bytes) {
  return p == nullptr ? nullptr : static_cast<char*>(p) + elems * bytes;
}

// Block moments (kernels/block_moment.h: q8, f8e4m3), a block at a time: decode the
// block's moments into float32, run the float32 moment update over it (adam_cpu_range with
// moment f32: the same element function, SIMD included), and encode them again with the
// block's new absmax.
template <ElemType T>
void adam_cpu_range_blocks(const Variant& variant, const TensorSlot& slot, const GroupCoeffs& g,
                           int64_t begin, int64_t end, bool simd) {
  assert(begin % kQuant8Block == 0 && (end % kQuant8Block == 0 || end == slot.numel));
  Variant inner = variant;
  inner.moment = ElemType::f32;
  const int64_t master_bytes = variant.master == MasterKind::remainder ? 2 : 4;
  alignas(64) float values[kNumMoments][kQuant8Block];
  for (int64_t block_begin = begin; block_begin < end; block_begin += kQuant8Block) {
    const int64_t n = end - block_begin < kQuant8Block ? end - block_begin : kQuant8Block;
    const int64_t block = block_begin / kQuant8Block;
    TensorSlot inner_slot = slot;
    inner_slot.param = offset(slot.param, block_begin, elem_bytes(variant.param));
    inner_slot.grad = offset(const_cast<void*>(slot.grad), block_begin, elem_bytes(variant.grad));
    for (StateKind k : {StateKind::master, StateKind::remainder})
      state_at(inner_slot, k) = offset(state_at(slot, k), block_begin, master_bytes);
    for (int k = 0; k < kNumMoments; ++k) {
      if (!moment_present(variant, k)) continue;
      const auto* codes =
          static_cast<const uint8_t*>(state_at(slot, moment_state(k))) + block_begin;
      const float absmax = static_cast<const float*>(state_at(slot, moment_absmax_state(k)))[block];
      decode_block<T>(block_book<T>(moment_signed(k)), codes, absmax, n, values[k]);
      state_at(inner_slot, moment_state(k)) = values[k];
      state_at(inner_slot, moment_absmax_state(k)) = nullptr;
    }
    inner_slot.numel = n;
    adam_cpu_range(inner, inner_slot, g, 0, n, simd);
    for (int k = 0; k < kNumMoments; ++k) {
      if (!moment_present(variant, k)) continue;
      auto* codes = static_cast<uint8_t*>(state_at(slot, moment_state(k))) + block_begin;
      static_cast<float*>(state_at(slot, moment_absmax_state(k)))[block] =
          encode_block<T>(block_book<T>(moment_signed(k)), values[k], n, codes);
    }
  }
}

static_assert(kCastRun % kQuant8Block == 0, "cast runs start on block boundaries");

// A scaled param: its master updated as a float32 param (the same function as an fp32
// master's update), then the param cast from it, run by run. A current scaling's cast
// waits for the tensor's amax (the second pass, cpu_backend.cpp): here its runs are only
// updated and measured.
float adam_cpu_range_scaled(const Variant& variant, const TensorSlot& slot, const GroupCoeffs& g,
                            int64_t begin, int64_t end, bool simd) {
  assert(begin % kQuant8Block == 0 && (end % kQuant8Block == 0 || end == slot.numel));
  const Variant inner = fp8_master_variant(variant);
  const TensorSlot inner_slot = fp8_master_slot(slot);
  const auto* master = static_cast<const float*>(inner_slot.param);
  uint32_t amax = 0;
  for (int64_t run = begin; run < end; run += kCastRun) {
    const int64_t run_end = end - run < kCastRun ? end : run + kCastRun;
    adam_cpu_range(inner, inner_slot, g, run, run_end, simd);
    const float run_amax = is_current(variant.scaling)
                               ? quant8_absmax(master + run, run_end - run)
                               : cast_param_range(variant.param, variant.scaling, master,
                                                  slot.param, slot.scale, run, run_end);
    amax = quant8_absmax_combine(amax, quant8_magnitude_bits(run_amax));
  }
  return bits_float(amax);
}

}  // namespace

float adam_cpu_range(const Variant& variant, const TensorSlot& slot, const GroupCoeffs& g,
                     int64_t begin, int64_t end, bool simd) {
  assert(0 <= begin && begin <= end && end <= slot.numel);
  if (begin >= end) return 0.0f;
  if (variant.scaling != ParamScaling::none)
    return adam_cpu_range_scaled(variant, slot, g, begin, end, simd);
  if (visit_block_storage(variant.moment, [&](auto tag) {
        adam_cpu_range_blocks<decltype(tag)::value>(variant, slot, g, begin, end, simd);
      }))
    return 0.0f;
  const int64_t rest_begin =
      simd ? HWY_DYNAMIC_DISPATCH(UpdateWholeVectorsOfVariant)(variant, slot, g, begin, end)
           : begin;
  if (rest_begin == end) return 0.0f;
  visit_kernel(variant, g.l2, [&](auto signature, auto l2) {
    update_range_scalar<decltype(signature), decltype(l2)::value>(slot, g.c, rest_begin, end);
  });
  return 0.0f;
}

const char* adam_cpu_simd_target() { return HWY_DYNAMIC_DISPATCH(SimdTargetName)(); }

}  // namespace kernels
}  // namespace sa

#endif  // HWY_ONCE
