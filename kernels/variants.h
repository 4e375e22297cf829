// kernels/variants.h — the one table of the updates the kernels implement, and the visitor
// that turns a runtime Variant into a compile-time Signature. The CPU kernel, the CUDA
// kernel and the core's checks of add_param's options all read the table below; a new
// unscaled param form, grad dtype or moment storage is a row here plus its loads and
// stores. The forms of an fp8 param dtype come from its row of SA_FP8_PARAM_TYPES
// (kernels/elem_type.h), one per scaling, and need nothing here.
//
// Host code only, except fp8_master_slot and TypedSlot (host and device).
#ifndef SHARDADAM_KERNELS_VARIANTS_H_
#define SHARDADAM_KERNELS_VARIANTS_H_

#include <stddef.h>
#include <stdint.h>

#include <iterator>
#include <type_traits>
#include <utility>

#include "bucket_table.h"
#include "state_kind.h"

namespace sa {
namespace kernels {

// ---- the table --------------------------------------------------------------------------

// How a param of a dtype keeps its full-precision value, and how it is cast from it.
struct ParamForm {
  ElemType param;
  MasterKind master;
  ParamScaling scaling;
};

namespace detail {

// The forms of the unscaled param dtypes: a float32 param is its own master; a 16-bit param
// gets a float32 master unless asked otherwise.
inline constexpr ParamForm kUnscaledParamForms[] = {
    {ElemType::f32, MasterKind::none, ParamScaling::none},
    {ElemType::bf16, MasterKind::fp32, ParamScaling::none},
    {ElemType::bf16, MasterKind::remainder, ParamScaling::none},
    {ElemType::f16, MasterKind::fp32, ParamScaling::none},
};

// The param forms as a C array inside a literal type: a constexpr function fills it from
// the tables, and kParamForms is then the array itself, for std::size, range-for and
// in_table in constant expressions (host and device) as with a hand-written array.
struct ParamFormTable {
  static constexpr size_t kSize =
      std::size(kUnscaledParamForms) + std::size(kFp8ParamTypes) * (std::size(kParamScalings) - 1);
  ParamForm rows[kSize];
};

constexpr ParamFormTable param_form_table() {
  ParamFormTable table{};
  size_t i = 0;
  for (const ParamForm& form : kUnscaledParamForms) table.rows[i++] = form;
  for (const ElemType param : kFp8ParamTypes)
    for (const ParamScaling scaling : kParamScalings)
      if (scaling != ParamScaling::none) table.rows[i++] = {param, MasterKind::fp32, scaling};
  return table;
}

inline constexpr ParamFormTable kParamFormTable = param_form_table();

}  // namespace detail

// The param forms, in the order SA_MASTER_AUTO prefers them for a param dtype: the
// unscaled ones, then for each fp8 param dtype (SA_FP8_PARAM_TYPES) a float32 master with
// each scaling of kernels/param_scaling.h but none, in that table's order.
inline constexpr const auto& kParamForms = detail::kParamFormTable.rows;

// The grad dtypes every param form takes.
inline constexpr ElemType kGradTypes[] = {ElemType::f32, ElemType::bf16, ElemType::f16};

// The moment storages (exp_avg, exp_avg_sq, and max_exp_avg_sq with amsgrad). q8 (8-bit
// blockwise dynamic quantization) and f8e4m3 (float8 with a scale per block) are block
// storages (kernels/block_moment.h; see visit_variant).
inline constexpr ElemType kMomentTypes[] = {ElemType::f32, ElemType::bf16, ElemType::q8,
                                            ElemType::f8e4m3};

// The Muon rule's forms: a float32 param, or a bfloat16 one with a float32 master (the
// update is applied to the master and the param rounded from it); grads and momentum_buffer
// in float32 or bfloat16. Its whole-matrix step (kernels/muon_math.h) computes in float32
// whatever the storage.
inline constexpr ParamForm kMuonParamForms[] = {
    {ElemType::f32, MasterKind::none, ParamScaling::none},
    {ElemType::bf16, MasterKind::fp32, ParamScaling::none},
};
inline constexpr ElemType kMuonGradTypes[] = {ElemType::f32, ElemType::bf16};
inline constexpr ElemType kMuonMomentTypes[] = {ElemType::f32, ElemType::bf16};

inline constexpr bool operator==(const ParamForm& a, const ParamForm& b) {
  return a.param == b.param && a.master == b.master && a.scaling == b.scaling;
}

template <class T, size_t N>
constexpr bool in_table(const T (&table)[N], T x) {
  for (size_t i = 0; i < N; ++i)
    if (table[i] == x) return true;
  return false;
}

// A Variant of the Adam rule is implemented when its (param, master, scaling) is a row of
// kParamForms, its grad is in kGradTypes and its moment in kMomentTypes, with or without
// amsgrad; one of the Muon rule when its rows are Muon's tables', without amsgrad.
constexpr bool variant_supported(const Variant& v) {
  if (v.rule == UpdateRule::muon)
    return in_table(kMuonParamForms, ParamForm{v.param, v.master, v.scaling}) &&
           in_table(kMuonGradTypes, v.grad) && in_table(kMuonMomentTypes, v.moment) && !v.amsgrad;
  return in_table(kParamForms, ParamForm{v.param, v.master, v.scaling}) &&
         in_table(kGradTypes, v.grad) && in_table(kMomentTypes, v.moment);
}

// The state that holds the full-precision value of a param form, if any.
constexpr bool master_state(MasterKind master, StateKind* kind) {
  if (master == MasterKind::none) return false;
  *kind = master == MasterKind::fp32 ? StateKind::master : StateKind::remainder;
  return true;
}

// Whether params of a Variant have moment k (SA_MOMENTS' `present`).
constexpr bool moment_present(const Variant& v, int k) {
  // NOLINTBEGIN(bugprone-branch-clone): a case per moment; two may give the same answer
  switch (k) {
#define SA_MOMENT_PRESENT(key, present, is_signed, doc) \
  case moment::key:                                     \
    return present;
    SA_MOMENTS(SA_MOMENT_PRESENT)
#undef SA_MOMENT_PRESENT
  }
  // NOLINTEND(bugprone-branch-clone)
  return false;
}

// Whether params of a Variant have a state of this kind (the slot's state[kind] is
// non-NULL): the moments it has, their block absmax states when the moment dtype is a block
// storage, and the master state of its param form.
constexpr bool variant_has_state(const Variant& v, StateKind kind) {
  int k = 0;
  if (is_moment_state(kind, &k)) return moment_present(v, k);
  if (is_absmax_state(kind, &k)) return is_block_storage(v.moment) && moment_present(v, k);
  StateKind held = StateKind::exp_avg;
  return master_state(v.master, &held) && held == kind;
}

// The Variant whose update a scaled param's master gets: the master as a float32 param of
// its own (the update of a float32 master and of a float32 param are the same function).
constexpr Variant fp8_master_variant(Variant v) {
  v.param = ElemType::f32;
  v.master = MasterKind::none;
  v.scaling = ParamScaling::none;
  return v;
}

// A scaled param's slot as fp8_master_variant's: the master in the param's place (host and
// device code: the CPU kernel and the CUDA kernels and tables build it).
SA_HD TensorSlot fp8_master_slot(const TensorSlot& slot) {
  TensorSlot inner = slot;
  inner.param = slot.state[static_cast<size_t>(StateKind::master)];
  inner.state[static_cast<size_t>(StateKind::master)] = nullptr;
  inner.scale = ParamScale{};
  return inner;
}

// ---- compile-time signatures ------------------------------------------------------------

// What the master state of a param form holds: the fp32 value, or the int16 remainder.
template <MasterKind K>
using MasterStorageOf = std::conditional_t<K == MasterKind::remainder, int16_t, float>;

// One Variant with its dtypes as template arguments.
template <ElemType kParamType, ElemType kGradType, ElemType kMomentType, MasterKind kMasterKind,
          bool kWithAmsgrad>
struct Signature {
  static constexpr ElemType kParam = kParamType;
  static constexpr ElemType kGrad = kGradType;
  static constexpr ElemType kMoment = kMomentType;
  static constexpr MasterKind kMaster = kMasterKind;
  static constexpr bool kAmsgrad = kWithAmsgrad;
  static constexpr Variant kVariant{kParamType,  kGradType,    kMomentType,
                                    kMasterKind, kWithAmsgrad, ParamScaling::none};
};

// Whether params of Signature S have moment K.
template <class S, int K>
inline constexpr bool kHasMoment = moment_present(S::kVariant, K);

// Moment K as for_each_moment passes it: converts to K in host and device code (the
// conversion of std::integral_constant is host-only in CUDA).
template <int K>
struct MomentTag {
  SA_HD constexpr operator int() const { return K; }  // NOLINT(google-explicit-constructor)
};

namespace detail {
#ifdef __CUDACC__
#pragma nv_exec_check_disable  // fn is a device lambda in device code, a host one on the host
#endif
template <class S, int K, class Fn>
SA_HD void call_if_moment(Fn& fn) {
  if constexpr (kHasMoment<S, K>) fn(MomentTag<K>{});
}
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <class S, class Fn, int... K>
SA_HD void for_each_moment(Fn& fn, std::integer_sequence<int, K...>) {
  (call_if_moment<S, K>(fn), ...);
}
}  // namespace detail

// Calls fn(MomentTag<k>{}) for each moment k that params of Signature S
// have, in SA_MOMENTS' order: the kernels' one loop over the moments, unrolled at compile
// time so that per-moment arrays stay in registers.
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <class S, class Fn>
SA_HD void for_each_moment(Fn&& fn) {
  detail::for_each_moment<S>(fn, std::make_integer_sequence<int, kNumMoments>{});
}

// A TensorSlot's pointers with the element types of Signature S.
template <class S>
struct TypedSlot {
  StorageOf<S::kParam>* param;
  const StorageOf<S::kGrad>* grad;
  MasterStorageOf<S::kMaster>* master;         // the master state; unused with MasterKind::none
  StorageOf<S::kMoment>* moment[kNumMoments];  // [k]: moment k; NULL unless kHasMoment<S, k>

  SA_HD explicit TypedSlot(const TensorSlot& s)
      : param(static_cast<StorageOf<S::kParam>*>(s.param)),
        grad(static_cast<const StorageOf<S::kGrad>*>(s.grad)),
        master(static_cast<MasterStorageOf<S::kMaster>*>(s.state[static_cast<size_t>(
            S::kMaster == MasterKind::remainder ? StateKind::remainder : StateKind::master)])) {
    for (int k = 0; k < kNumMoments; ++k)
      moment[k] =
          static_cast<StorageOf<S::kMoment>*>(s.state[static_cast<size_t>(moment_state(k))]);
  }
};

namespace detail {

template <ElemType P, MasterKind K, ElemType G, ElemType M, class Fn>
bool visit_amsgrad(const Variant& v, Fn& fn) {
  if (v.amsgrad) {
    fn(Signature<P, G, M, K, true>{});
  } else {
    fn(Signature<P, G, M, K, false>{});
  }
  return true;
}

template <ElemType P, MasterKind K, ElemType G, size_t I, class Fn>
bool visit_moment(const Variant& v, Fn& fn) {
  if constexpr (I == std::size(kMomentTypes)) {
    return false;
  } else {
    constexpr ElemType kMoment = kMomentTypes[I];
    if constexpr (is_block_storage(kMoment)) {  // see visit_variant
      return visit_moment<P, K, G, I + 1>(v, fn);
    } else {
      if (v.moment == kMoment) return visit_amsgrad<P, K, G, kMoment>(v, fn);
      return visit_moment<P, K, G, I + 1>(v, fn);
    }
  }
}

template <ElemType P, MasterKind K, size_t I, class Fn>
bool visit_grad(const Variant& v, Fn& fn) {
  if constexpr (I == std::size(kGradTypes)) {
    return false;
  } else {
    constexpr ElemType kGrad = kGradTypes[I];
    if (v.grad == kGrad) return visit_moment<P, K, kGrad, 0>(v, fn);
    return visit_grad<P, K, I + 1>(v, fn);
  }
}

template <size_t I, class Fn>
bool visit_form(const Variant& v, Fn& fn) {
  if constexpr (I == std::size(kParamForms)) {
    return false;
  } else {
    constexpr ParamForm kForm = kParamForms[I];
    if constexpr (kForm.scaling != ParamScaling::none) {  // see visit_variant
      return visit_form<I + 1>(v, fn);
    } else {
      if (v.param == kForm.param && v.master == kForm.master && v.scaling == kForm.scaling)
        return visit_grad<kForm.param, kForm.master, 0>(v, fn);
      return visit_form<I + 1>(v, fn);
    }
  }
}

}  // namespace detail

// Calls fn(Signature<...>{}) for the Signature of `v` and returns true, or returns false
// (calling nothing) when the table has no such Variant. The core builds only supported
// Variants, so false is a bug in shardadam. Signatures are of element moment storages
// and unscaled params only: a block storage (q8, f8e4m3) is not visited; a backend runs it
// a block at a time, decoding into the float32 Variant's update (kernels/block_moment.h).
// Nor is a scaled (fp8) param: a backend runs the update of its float32 master as a
// float32 param's (fp8_master_variant) and casts the param from it (param_scaling.h).
// A Muon Variant is visit_muon_variant's.
template <class Fn>
bool visit_variant(const Variant& v, Fn&& fn) {
  return v.rule == UpdateRule::adam && detail::visit_form<0>(v, fn);
}

namespace detail {

// fn(ElemTag<t>{}) for the entry t of `kTable` equal to `want`; false when none is.
template <const auto& kTable, size_t I, class Fn>
bool visit_elem(ElemType want, Fn& fn) {
  if constexpr (I == std::size(kTable)) {
    return false;
  } else {
    if (want != kTable[I]) return visit_elem<kTable, I + 1>(want, fn);
    fn(ElemTag<kTable[I]>{});
    return true;
  }
}

template <size_t I, class Fn>
bool visit_muon_form(const Variant& v, Fn& fn) {
  if constexpr (I == std::size(kMuonParamForms)) {
    return false;
  } else {
    constexpr ParamForm kForm = kMuonParamForms[I];
    if (!(ParamForm{v.param, v.master, v.scaling} == kForm)) return visit_muon_form<I + 1>(v, fn);
    bool found = false;
    auto with_grad = [&](auto grad) {
      auto with_moment = [&](auto moment) {
        fn(Signature<kForm.param, decltype(grad)::value, decltype(moment)::value, kForm.master,
                     false>{});
      };
      found = visit_elem<kMuonMomentTypes, 0>(v.moment, with_moment);
    };
    return visit_elem<kMuonGradTypes, 0>(v.grad, with_grad) && found;
  }
}

}  // namespace detail

// Calls fn(Signature<...>{}) for a supported Muon Variant (its Signature's kVariant is v with
// the Adam rule: a Signature names dtypes only) and returns true; false, calling nothing, for
// any other Variant.
template <class Fn>
bool visit_muon_variant(const Variant& v, Fn&& fn) {
  return v.rule == UpdateRule::muon && !v.amsgrad && detail::visit_muon_form<0>(v, fn);
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_VARIANTS_H_
