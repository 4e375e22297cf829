// src/step_args.cpp — a step's arguments checked from src/schema.hpp's table (see
// step_args.hpp), and compile-time checks that shardadam.h's sa_step_args and
// SA_STEP_ARGS_INIT are the table's: the same members, in order, with its types and
// defaults.
#include "step_args.hpp"

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "errors.hpp"
#include "schema.hpp"

namespace sa {
namespace {

template <int32_t type>
struct StepStorage {
  using type_t = void*;
};
template <>
struct StepStorage<SA_FIELD_DOUBLE> {
  using type_t = double;
};
template <>
struct StepStorage<SA_FIELD_INT32> {
  using type_t = int32_t;
};
struct StepArgsMirror {
  std::size_t struct_size;
#define SA_MIRROR_MEMBER(name, type, ...) StepStorage<type>::type_t name;
  SA_STEP_ARGS_FIELDS(SA_MIRROR_MEMBER)
#undef SA_MIRROR_MEMBER
};
static_assert(sizeof(StepArgsMirror) == sizeof(sa_step_args),
              "sa_step_args has members that src/schema.hpp's SA_STEP_ARGS_FIELDS lacks");
constexpr sa_step_args kStepInit = SA_STEP_ARGS_INIT;
template <class T>
constexpr bool is_default(T value, double default_value) {
  if constexpr (std::is_pointer_v<T>)
    return value == nullptr;
  else
    return value == static_cast<T>(default_value);
}
#define SA_CHECK_STEP_FIELD(name, type, default_value, ...)                           \
  static_assert(offsetof(sa_step_args, name) == offsetof(StepArgsMirror, name),       \
                "sa_step_args::" #name " is not where src/schema.hpp puts it");       \
  static_assert(sizeof(sa_step_args::name) == sizeof(StepStorage<type>::type_t),      \
                "sa_step_args::" #name " has another type than src/schema.hpp says"); \
  static_assert(is_default(kStepInit.name, default_value),                            \
                "SA_STEP_ARGS_INIT's " #name " is not src/schema.hpp's default");
SA_STEP_ARGS_FIELDS(SA_CHECK_STEP_FIELD)
#undef SA_CHECK_STEP_FIELD

// A number field's value as a double (an int32_t one converted exactly).
double number(const sa_step_args& args, const schema::StepField& f) {
  const char* at = reinterpret_cast<const char*>(&args) + f.offset;
  if (f.type == SA_FIELD_INT32) {
    int32_t v;
    std::memcpy(&v, at, sizeof v);
    return v;
  }
  double v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

}  // namespace

kernels::ClipSpec checked_clip(const sa_step_args& args) {
  for (const schema::StepField& f : schema::kStepFields) {
    if (f.type == SA_FIELD_POINTER) continue;
    const double v = number(args, f);
    if (!(v >= f.min && v <= f.max))  // NaN too
      fail(SA_ERR_INVALID_ARGUMENT, f.name, " is ", v, "; it must be ", f.rule, " (", f.doc, ")");
  }
  if (args.max_grad_norm == 0.0) {
    if (args.grad_norm != nullptr || args.host_grad_norm != nullptr)
      fail(SA_ERR_INVALID_ARGUMENT,
           "grad_norm or host_grad_norm is set but max_grad_norm is 0, so no "
           "norm is computed; set max_grad_norm (INFINITY to measure without clipping)");
    return {kernels::NormType::none, 0.0};
  }
  return {args.norm_type == SA_NORM_INF ? kernels::NormType::inf : kernels::NormType::l2,
          args.max_grad_norm};
}

}  // namespace sa
