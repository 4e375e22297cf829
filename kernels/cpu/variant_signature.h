// kernels/cpu/variant_signature.h — a runtime Variant plus the group's l2 flag, turned
// into a compile-time Signature once per call, so that the element loops (scalar and SIMD
// alike) carry no dtype branches.
#ifndef SHARDADAM_KERNELS_CPU_VARIANT_SIGNATURE_H_
#define SHARDADAM_KERNELS_CPU_VARIANT_SIGNATURE_H_

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <type_traits>

#include "../bucket_table.h"

namespace sa {
namespace kernels {

// How one element of a tensor of type T is stored: float32 as float, the 16-bit types as
// their bits.
template <ElemType T>
using StorageOf = std::conditional_t<T == ElemType::f32, float, uint16_t>;

// What TensorSlot::master points to: the fp32 value, or the int16 remainder.
template <MasterKind K>
using MasterStorageOf = std::conditional_t<K == MasterKind::remainder, int16_t, float>;

// One kernel instantiation: a Variant with its dtypes as template arguments, plus the
// group's l2 flag (which picks adam_update<kL2, ...>).
template <ElemType kParamType, ElemType kGradType, ElemType kMomentType, MasterKind kMasterKind,
          bool kWithL2, bool kWithAmsgrad>
struct Signature {
  static constexpr ElemType kParam = kParamType;
  static constexpr ElemType kGrad = kGradType;
  static constexpr ElemType kMoment = kMomentType;
  static constexpr MasterKind kMaster = kMasterKind;
  static constexpr bool kL2 = kWithL2;
  static constexpr bool kAmsgrad = kWithAmsgrad;
};

// A TensorSlot's pointers with the element types of Signature S.
template <class S>
struct TypedSlot {
  StorageOf<S::kParam>* param;
  const StorageOf<S::kGrad>* grad;
  MasterStorageOf<S::kMaster>* master;  // unused with MasterKind::none
  StorageOf<S::kMoment>* exp_avg;
  StorageOf<S::kMoment>* exp_avg_sq;
  StorageOf<S::kMoment>* max_exp_avg_sq;  // used only when S::kAmsgrad

  explicit TypedSlot(const TensorSlot& s)
      : param(static_cast<StorageOf<S::kParam>*>(s.param)),
        grad(static_cast<const StorageOf<S::kGrad>*>(s.grad)),
        master(static_cast<MasterStorageOf<S::kMaster>*>(s.master)),
        exp_avg(static_cast<StorageOf<S::kMoment>*>(s.exp_avg)),
        exp_avg_sq(static_cast<StorageOf<S::kMoment>*>(s.exp_avg_sq)),
        max_exp_avg_sq(static_cast<StorageOf<S::kMoment>*>(s.max_exp_avg_sq)) {}
};

namespace detail {

template <ElemType T>
using ElemConstant = std::integral_constant<ElemType, T>;

// The core validates variants before it builds a bucket (src/optimizer.cpp), so reaching
// this is a bug in shardadam, not a user error: stop rather than compute garbage.
[[noreturn]] inline void abort_unsupported_variant(const Variant& v, const char* why) {
  fprintf(stderr,
          "shardadam: internal error in the CPU Adam kernel: unsupported variant (param %d, "
          "grad %d, moment %d, master %d, amsgrad %d; ElemType 0=f32 1=bf16 2=f16, MasterKind "
          "0=none 1=fp32 2=remainder): %s\n",
          static_cast<int>(v.param), static_cast<int>(v.grad), static_cast<int>(v.moment),
          static_cast<int>(v.master), static_cast<int>(v.amsgrad), why);
  abort();
}

template <class Fn>
void visit_bool(bool b, Fn&& fn) {
  if (b) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

template <class Fn>
void visit_grad_type(const Variant& v, Fn&& fn) {
  switch (v.grad) {
    case ElemType::f32:
      return fn(ElemConstant<ElemType::f32>{});
    case ElemType::bf16:
      return fn(ElemConstant<ElemType::bf16>{});
    case ElemType::f16:
      return fn(ElemConstant<ElemType::f16>{});
  }
  abort_unsupported_variant(v, "unknown grad ElemType");
}

template <class Fn>
void visit_moment_type(const Variant& v, Fn&& fn) {
  switch (v.moment) {
    case ElemType::f32:
      return fn(ElemConstant<ElemType::f32>{});
    case ElemType::bf16:
      return fn(ElemConstant<ElemType::bf16>{});
    case ElemType::f16:
      break;
  }
  abort_unsupported_variant(v, "moments are float32 or bfloat16");
}

template <ElemType kParam, MasterKind kMaster, class Fn>
void visit_with_param(const Variant& v, bool l2, Fn& fn) {
  visit_grad_type(v, [&](auto grad) {
    visit_moment_type(v, [&](auto moment) {
      visit_bool(l2, [&](auto with_l2) {
        visit_bool(v.amsgrad, [&](auto with_amsgrad) {
          fn(Signature<kParam, decltype(grad)::value, decltype(moment)::value, kMaster,
                       decltype(with_l2)::value, decltype(with_amsgrad)::value>{});
        });
      });
    });
  });
}

}  // namespace detail

// Calls fn(Signature<...>{}) for the instantiation that matches `v` and `l2`. The valid
// param/master pairs are those the core accepts: f32 with none, bf16 with fp32 or
// remainder, f16 with fp32. Anything else aborts with a message.
template <class Fn>
void visit_signature(const Variant& v, bool l2, Fn&& fn) {
  using detail::visit_with_param;
  if (v.param == ElemType::f32 && v.master == MasterKind::none) {
    visit_with_param<ElemType::f32, MasterKind::none>(v, l2, fn);
  } else if (v.param == ElemType::bf16 && v.master == MasterKind::fp32) {
    visit_with_param<ElemType::bf16, MasterKind::fp32>(v, l2, fn);
  } else if (v.param == ElemType::bf16 && v.master == MasterKind::remainder) {
    visit_with_param<ElemType::bf16, MasterKind::remainder>(v, l2, fn);
  } else if (v.param == ElemType::f16 && v.master == MasterKind::fp32) {
    visit_with_param<ElemType::f16, MasterKind::fp32>(v, l2, fn);
  } else {
    detail::abort_unsupported_variant(
        v, "param/master must be f32/none, bf16/fp32, bf16/remainder or f16/fp32");
  }
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CPU_VARIANT_SIGNATURE_H_
