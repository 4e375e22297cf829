// src/fields.cpp — see fields.hpp. At compile time: shardadam.h's option structs and their
// SA_*_INIT macros are schema.hpp's tables, member for member (order, types, defaults).
#include "fields.hpp"

#include <cstddef>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../kernels/param_scaling.h"
#include "dtype.hpp"
#include "errors.hpp"
#include "options.hpp"
#include "schema.hpp"

namespace sa {
namespace {

// ---- the ABI's structs against the tables ----------------------------------------------------

template <int32_t type>
struct FieldStorage {
  using type_t = void*;  // SA_FIELD_POINTER
};
template <>
struct FieldStorage<SA_FIELD_DOUBLE> {
  using type_t = double;
};
template <>
struct FieldStorage<SA_FIELD_FLAG> {
  using type_t = int32_t;
};
template <>
struct FieldStorage<SA_FIELD_INT32> {
  using type_t = int32_t;
};
template <>
struct FieldStorage<SA_FIELD_UINT64> {
  using type_t = uint64_t;
};
template <>
struct FieldStorage<SA_FIELD_DTYPE> {
  using type_t = DLDataType;
};

// A member's size by its type (a pointer's is a pointer's, whatever it points to).
template <class T>
constexpr std::size_t size_of = sizeof(T);

template <class T>
constexpr bool is_default(T value, double default_value) {
  if constexpr (std::is_pointer_v<T>)
    return value == nullptr;
  else if constexpr (std::is_same_v<T, DLDataType>)
    return is_unset(value);
  else
    return value == static_cast<T>(default_value);
}

// A struct with the table's members, each of its type: the ABI's struct must have its
// size (no member the table lacks), and each member its offset, size and default.
#define SA_MIRROR_MEMBER(name, type, ...) FieldStorage<type>::type_t name;
#define SA_CHECK_MEMBER(S, Mirror, kInit, name, type, default_value, ...)         \
  static_assert(offsetof(S, name) == offsetof(Mirror, name),                      \
                #S "::" #name " is not where src/schema.hpp puts it");            \
  static_assert(size_of<decltype(S::name)> == sizeof(FieldStorage<type>::type_t), \
                #S "::" #name " has another type than src/schema.hpp says");      \
  static_assert(is_default(kInit.name, default_value),                            \
                #S "'s SA_*_INIT gives " #name " another default than src/schema.hpp");
#define SA_CHECK_STRUCT(S, INIT, FIELDS, Mirror, kInit, CHECK)                             \
  struct Mirror {                                                                          \
    std::size_t struct_size;                                                               \
    FIELDS(SA_MIRROR_MEMBER)                                                               \
  };                                                                                       \
  static_assert(sizeof(Mirror) == sizeof(S), #S " has members that src/schema.hpp lacks"); \
  constexpr S kInit = INIT;                                                                \
  FIELDS(CHECK)

#define SA_CHECK_STEP(...) SA_CHECK_MEMBER(sa_step_args, StepMirror, kStepInit, __VA_ARGS__)
SA_CHECK_STRUCT(sa_step_args, SA_STEP_ARGS_INIT, SA_STEP_ARGS_FIELDS, StepMirror, kStepInit,
                SA_CHECK_STEP)
#define SA_CHECK_CONFIG(...) \
  SA_CHECK_MEMBER(sa_optimizer_config, ConfigMirror, kConfigInit, __VA_ARGS__)
SA_CHECK_STRUCT(sa_optimizer_config, SA_OPTIMIZER_CONFIG_INIT, SA_OPTIMIZER_CONFIG_FIELDS,
                ConfigMirror, kConfigInit, SA_CHECK_CONFIG)
#define SA_CHECK_PARAM(...) SA_CHECK_MEMBER(sa_param_options, ParamMirror, kParamInit, __VA_ARGS__)
SA_CHECK_STRUCT(sa_param_options, SA_PARAM_OPTIONS_INIT, SA_PARAM_OPTIONS_FIELDS, ParamMirror,
                kParamInit, SA_CHECK_PARAM)
#define SA_CHECK_IMPORT(...) \
  SA_CHECK_MEMBER(sa_import_options, ImportMirror, kImportInit, __VA_ARGS__)
SA_CHECK_STRUCT(sa_import_options, SA_IMPORT_OPTIONS_INIT, SA_IMPORT_OPTIONS_FIELDS, ImportMirror,
                kImportInit, SA_CHECK_IMPORT)
#undef SA_CHECK_STEP
#undef SA_CHECK_CONFIG
#undef SA_CHECK_PARAM
#undef SA_CHECK_IMPORT
#undef SA_CHECK_STRUCT
#undef SA_CHECK_MEMBER
#undef SA_MIRROR_MEMBER

// Bounds the tables write as numbers (and their rules as words) that a library table holds.
constexpr const schema::StructField& param_field(const char* name) {
  for (const schema::StructField& f : schema::kParamOptionFields)
    if (std::string_view(f.name) == name) return f;
  return schema::kParamOptionFields[0];
}
static_assert(param_field("margin").max == kernels::kMaxCurrentMargin,
              "sa_param_options.margin's bound is not kernels::kMaxCurrentMargin");
static_assert(param_field("scaling").max == kernels::kNumParamScalings - 1,
              "sa_param_options.scaling's bound is not kernels/param_scaling.h's last scaling");

schema::StructTable known_table(int32_t kind) {
  const schema::StructTable t = schema::struct_table(kind);
  if (t.fields == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, "struct kind ", kind,
         " is not an sa_struct_kind with a field table (", SA_STRUCT_STEP_ARGS, " .. ",
         SA_STRUCT_IMPORT_OPTIONS, ")");
  return t;
}

// A number field's value as a double (an int32_t one exactly; a uint64_t one rounded,
// which no bound of the tables is near).
double number(const void* s, const schema::StructField& f) {
  const char* at = static_cast<const char*>(s) + f.offset;
  switch (f.type) {
    case SA_FIELD_FLAG:
    case SA_FIELD_INT32: {
      int32_t v;
      std::memcpy(&v, at, sizeof v);
      return v;
    }
    case SA_FIELD_UINT64: {
      uint64_t v;
      std::memcpy(&v, at, sizeof v);
      return static_cast<double>(v);
    }
    default: {
      double v;
      std::memcpy(&v, at, sizeof v);
      return v;
    }
  }
}

// "float32, bfloat16 or float16": the dtypes of the library's table with `role`.
std::string dtypes_with_role(int32_t role) {
  std::vector<const char*> names;
  for (int32_t i = 0; i < num_dtypes(); ++i) {
    const DtypeDescription d = describe_dtype(i);
    if ((d.roles & static_cast<uint32_t>(role)) != 0) names.push_back(d.name);
  }
  return words_list(names);
}

void write_field(void* s, const schema::StructField& f) {
  char* at = static_cast<char*>(s) + f.offset;
  const auto put = [at](auto v) { std::memcpy(at, &v, sizeof v); };
  switch (f.type) {
    case SA_FIELD_DOUBLE:
      put(f.default_value);
      break;
    case SA_FIELD_FLAG:
    case SA_FIELD_INT32:
      put(static_cast<int32_t>(f.default_value));
      break;
    case SA_FIELD_UINT64:
      put(static_cast<uint64_t>(f.default_value));
      break;
    case SA_FIELD_DTYPE:
      put(DLDataType{0, 0, 0});
      break;
    default:
      put(static_cast<void*>(nullptr));
  }
}

}  // namespace

void check_fields(int32_t kind, const void* s, const std::string& context, const char* prefix) {
  const schema::StructTable t = known_table(kind);
  const std::string where = context.empty() ? std::string(prefix) : concat(context, ": ", prefix);
  for (int32_t i = 0; i < t.count; ++i) {
    const schema::StructField& f = t.fields[i];
    const std::string why = f.why[0] != '\0' ? concat(" (", f.why, ")") : std::string();
    if (f.type == SA_FIELD_POINTER) continue;
    if (f.type == SA_FIELD_DTYPE) {
      DLDataType v;
      std::memcpy(&v, static_cast<const char*>(s) + f.offset, sizeof v);
      if (is_unset(v)) continue;  // the default
      const auto type = elem_type_of(v);
      if (!type || (elem_roles(*type) & static_cast<uint32_t>(f.role)) == 0)
        fail(SA_ERR_UNSUPPORTED, where, f.name, " is ", dtype_name(v), "; it must be unset or ",
             dtypes_with_role(f.role), why);
      continue;
    }
    const double v = number(s, f);
    if (v >= f.min && v <= f.max) continue;  // not NaN either
    if (f.type == SA_FIELD_DOUBLE)
      fail(SA_ERR_INVALID_ARGUMENT, where, f.name, " is ", v, "; it must be ", f.rule, why);
    fail(SA_ERR_INVALID_ARGUMENT, where, f.name, " is ", static_cast<int64_t>(v), "; it must be ",
         f.rule, why);
  }
}

int32_t num_fields(int32_t kind) {
  if (kind == SA_STRUCT_GROUP_CONFIG) return schema::kNumGroupFields;
  return schema::struct_table(kind).count;
}

sa_field_info describe_field(int32_t kind, int32_t index) {
  sa_field_info info = SA_FIELD_INFO_INIT;
  const int32_t n =
      kind == SA_STRUCT_GROUP_CONFIG ? schema::kNumGroupFields : known_table(kind).count;
  if (index < 0 || index >= n)
    fail(SA_ERR_INVALID_ARGUMENT, "index ", index, " is not a field: ",
         kind == SA_STRUCT_GROUP_CONFIG ? "sa_group_config" : known_table(kind).struct_name,
         " has ", n, " (0 .. ", n - 1, ")");
  if (kind == SA_STRUCT_GROUP_CONFIG) {
    const schema::GroupField& f = schema::kGroupFields[index];
    const schema::RuleInfo rule = schema::rule_info(f.rule);
    info.name = f.name;
    info.type = rule.type;
    info.offset = f.offset;
    info.default_value = f.default_value;
    info.min = rule.min;
    info.max = rule.max;
    info.max_inclusive = rule.max_inclusive;
    info.fixed_with_params = f.fixed_with_params;
    info.rule = rule.words;
    info.doc = f.doc;
    info.rules = f.rules;
    return info;
  }
  const schema::StructField& f = known_table(kind).fields[index];
  info.name = f.name;
  info.type = f.type;
  info.offset = f.offset;
  info.default_value = f.default_value;
  info.min = f.min;
  info.max = f.max;
  info.max_inclusive = f.type != SA_FIELD_POINTER && f.type != SA_FIELD_DTYPE;
  info.rule = f.rule;
  info.doc = f.doc;
  info.dtype_role = f.role;
  return info;
}

void write_defaults(int32_t kind, void* out) {
  std::size_t size = 0;
  std::memcpy(&size, out, sizeof size);
  if (kind == SA_STRUCT_GROUP_CONFIG) {
    write_options(static_cast<sa_group_config*>(out), schema::default_group_config(), "out");
    return;
  }
  const schema::StructTable t = known_table(kind);
  const std::size_t bytes = t.bytes;
  if (size < sizeof(std::size_t))
    fail(SA_ERR_INVALID_ARGUMENT, "out: struct_size ", size,
         " is too small; set it to the struct's size");
  if (size > bytes)
    fail(SA_ERR_UNSUPPORTED, "out: struct_size ", size, " is larger than this library's ",
         t.struct_name, " (", bytes,
         "): the caller was compiled against a newer shardadam.h than the library loaded");
  std::vector<char> whole(bytes, 0);
  std::memcpy(whole.data(), &bytes, sizeof bytes);
  for (int32_t i = 0; i < t.count; ++i) write_field(whole.data(), t.fields[i]);
  std::memcpy(out, whole.data(), size);
  std::memcpy(out, &size, sizeof size);  // the caller's struct_size stays
}

}  // namespace sa
