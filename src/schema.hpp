// src/schema.hpp — the one table of the group hyperparameters: each one's name, valid
// values, default and meaning. Everything else derives from it: validation and its
// messages (group_config.cpp), a saved group's JSON and its parsing (state_io/), the
// comparison of two files' groups, the field table of the C ABI that the bindings read
// (sa_struct_field), and compile-time checks that sa_group_config and
// SA_GROUP_CONFIG_INIT (shardadam.h, the ABI's spelling) agree with it. At the end, the
// tables of the other option structs (step arguments, optimizer config, param options,
// import options), from which fields.cpp checks every struct a call passes.
//
// A new hyperparameter is a row here, a member (and its default) in shardadam.h, and what
// the kernels do with it (kernels/adam_math.h or kernels/muon_math.h, and hyper_of or
// muon_hyper_of in group_config.cpp).
#ifndef SHARDADAM_SRC_SCHEMA_HPP_
#define SHARDADAM_SRC_SCHEMA_HPP_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "shardadam/shardadam.h"

namespace sa::schema {

// The valid values of a field, and how it is stored.
enum class Rule : int32_t {
  nonnegative,    // double, finite and >= 0
  unit_interval,  // double, in [0, 1)
  finite,         // double, finite
  flag,           // int32_t, 0 or 1
  update_rule,    // int32_t, an sa_update_rule
  lr_adjust,      // int32_t, an sa_muon_lr_adjust
  ns_steps        // int32_t, 0 to 99 (torch.optim.Muon refuses 100 and more)
};

// Which update rules read a field: a bit (1 << sa_update_rule) per rule (sa_field_info.rules).
inline constexpr int32_t kAdamW = 1 << SA_RULE_ADAMW;
inline constexpr int32_t kMuon = 1 << SA_RULE_MUON;
inline constexpr int32_t kAllRules = kAdamW | kMuon;

// X(name, rule, default, fixed_with_params, since, rules, doc). `fixed_with_params`: the
// field cannot change once the group holds a param (the params' state was allocated by it).
// `rules`: the update rules that read it (kAdamW, kMuon), so that a binding's face of one
// rule shows only its fields; a field stays in every group, whatever its rule.
// `since`: the first shard-file format version (state_io/metadata.hpp) whose files hold
// the field. Files of an older version lack it and load with its default, so a field added
// later must default to the value under which the update is what it was before the field
// existed (and it bumps kShardFormatVersion, so that older libraries refuse its files
// instead of ignoring it).
#define SA_GROUP_FIELDS(X)                                                                         \
  X(lr, nonnegative, 1e-3, false, 1, kAllRules, "learning rate")                                   \
  X(beta1, unit_interval, 0.9, false, 1, kAdamW, "decay rate of the first moment (exp_avg)")       \
  X(beta2, unit_interval, 0.999, false, 1, kAdamW, "decay rate of the second moment (exp_avg_sq)") \
  X(eps, nonnegative, 1e-8, false, 1, kAllRules,                                                   \
    "AdamW: added to the denominator; Muon: the floor of the norm Newton-Schulz divides by")       \
  X(weight_decay, nonnegative, 1e-2, false, 1, kAllRules,                                          \
    "weight decay: decoupled (AdamW, Muon) or an L2 term on the grad (Adam)")                      \
  X(decoupled_weight_decay, flag, 1, false, 1, kAdamW,                                             \
    "1: AdamW (decay the param); 0: Adam (L2 term on the grad); Muon: must be 1")                  \
  X(bias_correction, flag, 1, false, 1, kAdamW, "1: divide the moments by 1 - beta^t")             \
  X(maximize, flag, 0, false, 1, kAdamW, "1: ascend instead of descend; Muon: must be 0")          \
  X(amsgrad, flag, 0, true, 1, kAdamW,                                                             \
    "1: keep max_exp_avg_sq, the running maximum of exp_avg_sq, and use it in the "                \
    "denominator; Muon: must be 0")                                                                \
  X(update_rule, update_rule, SA_RULE_ADAMW, true, 4, kAllRules,                                   \
    "the update: SA_RULE_ADAMW (Adam, AdamW) or SA_RULE_MUON (Muon, 2-D float32 params)")          \
  X(nesterov, flag, 1, false, 4, kMuon, "1: Nesterov momentum")                                    \
  X(momentum, unit_interval, 0.95, false, 4, kMuon,                                                \
    "decay rate of the momentum buffer (momentum_buffer)")                                         \
  X(ns_a, finite, 3.4445, false, 4, kMuon, "Newton-Schulz coefficient a (of X)")                   \
  X(ns_b, finite, -4.775, false, 4, kMuon, "Newton-Schulz coefficient b (of X X^T X)")             \
  X(ns_c, finite, 2.0315, false, 4, kMuon, "Newton-Schulz coefficient c (of (X X^T)^2 X)")         \
  X(ns_steps, ns_steps, 5, false, 4, kMuon, "Newton-Schulz iterations")                            \
  X(adjust_lr, lr_adjust, SA_MUON_LR_ORIGINAL, false, 4, kMuon,                                    \
    "how lr scales with a matrix's shape: SA_MUON_LR_ORIGINAL (lr sqrt(max(1, rows/cols))) "       \
    "or SA_MUON_LR_MATCH_RMS_ADAMW (lr 0.2 sqrt(max(rows, cols)))")

struct RuleInfo {
  double min;  // valid: min <= v, and v < max (or v <= max when max_inclusive)
  double max;
  bool max_inclusive;
  int32_t type;       // SA_FIELD_DOUBLE, SA_FIELD_FLAG or SA_FIELD_INT32 (an int32_t)
  const char* words;  // as error messages say it
};

constexpr RuleInfo rule_info(Rule rule) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  switch (rule) {
    case Rule::nonnegative:
      return {0.0, kInf, false, SA_FIELD_DOUBLE, "finite and >= 0"};
    case Rule::unit_interval:
      return {0.0, 1.0, false, SA_FIELD_DOUBLE, "in [0, 1)"};
    case Rule::finite:
      return {std::numeric_limits<double>::lowest(), kInf, false, SA_FIELD_DOUBLE, "finite"};
    case Rule::flag:
      return {0.0, 1.0, true, SA_FIELD_FLAG, "0 or 1"};
    case Rule::update_rule:
      return {SA_RULE_ADAMW, SA_RULE_MUON, true, SA_FIELD_INT32,
              "SA_RULE_ADAMW (0) or SA_RULE_MUON (1)"};
    case Rule::lr_adjust:
      return {SA_MUON_LR_ORIGINAL, SA_MUON_LR_MATCH_RMS_ADAMW, true, SA_FIELD_INT32,
              "SA_MUON_LR_ORIGINAL (0) or SA_MUON_LR_MATCH_RMS_ADAMW (1)"};
    case Rule::ns_steps:
      return {0.0, 99.0, true, SA_FIELD_INT32, "an integer from 0 to 99"};
  }
  return {0.0, 0.0, false, SA_FIELD_DOUBLE, ""};
}

// Whether a rule's values are stored as int32_t (a flag or an enum).
constexpr bool integral(Rule rule) { return rule_info(rule).type != SA_FIELD_DOUBLE; }

// NaN is never valid (every comparison with it is false); an integral rule takes integers
// only.
inline bool accepts(Rule rule, double value) {
  const RuleInfo r = rule_info(rule);
  return value >= r.min && (r.max_inclusive ? value <= r.max : value < r.max) &&
         (!integral(rule) || value == std::floor(value));
}

template <Rule rule, bool kIntegral = integral(rule)>
struct Storage {
  using type = double;
};
template <Rule rule>
struct Storage<rule, true> {
  using type = int32_t;
};

struct GroupField {
  const char* name;  // the struct member's name, and the shard files' JSON key
  Rule rule;
  std::size_t offset;  // in sa_group_config
  double default_value;
  bool fixed_with_params;
  int since;      // the first shard-file format version that holds it
  int32_t rules;  // the update rules that read it (kAdamW, kMuon)
  const char* doc;
};

#define SA_SCHEMA_GROUP_ROW(name, rule, default_value, fixed, since, rules, doc)              \
  GroupField{#name, Rule::rule, offsetof(sa_group_config, name), default_value, fixed, since, \
             rules, doc},
inline constexpr GroupField kGroupFields[] = {SA_GROUP_FIELDS(SA_SCHEMA_GROUP_ROW)};
#undef SA_SCHEMA_GROUP_ROW
inline constexpr int32_t kNumGroupFields =
    static_cast<int32_t>(sizeof(kGroupFields) / sizeof(kGroupFields[0]));

// A field's value (an integral one as whatever int32_t it holds).
inline double get(const sa_group_config& c, const GroupField& f) {
  const char* at = reinterpret_cast<const char*>(&c) + f.offset;
  if (integral(f.rule)) {
    int32_t v;
    std::memcpy(&v, at, sizeof v);
    return v;
  }
  double v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

// Sets a field; an integral one takes the value converted to int32_t (the caller checked
// the range).
inline void set(sa_group_config& c, const GroupField& f, double value) {
  char* at = reinterpret_cast<char*>(&c) + f.offset;
  if (integral(f.rule)) {
    const auto v = static_cast<int32_t>(value);
    std::memcpy(at, &v, sizeof v);
  } else {
    std::memcpy(at, &value, sizeof value);
  }
}

// The defaults, built from the table (group_config.cpp checks SA_GROUP_CONFIG_INIT against
// them at compile time).
inline sa_group_config default_group_config() {
  sa_group_config c{};
  c.struct_size = sizeof(sa_group_config);
  for (const GroupField& f : kGroupFields) set(c, f, f.default_value);
  return c;
}

// ---- the other option structs ------------------------------------------------------------
// Every option struct the C ABI takes but sa_group_config, field by field after
// struct_size, in order: X(name, type, default, min, max, rule, why, role, doc). `type` is
// an sa_field_type; a number is valid when min <= v <= max (a NaN never is), a pointer
// always; a dtype (SA_FIELD_DTYPE) when unset (all zero: the default) or a dtype of the
// library's table with the sa_dtype_role `role`. `rule` says the valid values, `why` (may
// be empty) why there are no others, as the error messages say them: "<name> is <value>;
// it must be <rule> (<why>)". The ABI spells the structs and their SA_*_INIT macros;
// fields.cpp checks them against these tables at compile time, and checks every struct a
// call passes against them (check_fields).
#define SA_STEP_ARGS_FIELDS(X)                                                             \
  X(inv_grad_scale, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a pointer or NULL", "", 0,           \
    "const float*, backend memory (host for the CPU backend), optional: every grad is "    \
    "multiplied by it (the inverse loss scale); NULL means 1")                             \
  X(found_inf, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a pointer or NULL", "", 0,                \
    "const float*, backend memory, optional: nonzero skips the whole step")                \
  X(skipped, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a pointer or NULL", "", 0,                  \
    "int32_t*, host memory, optional: receives 1 if the step was skipped, else 0")         \
  X(max_grad_norm, SA_FIELD_DOUBLE, 0.0, 0.0, std::numeric_limits<double>::infinity(),     \
    ">= 0 (INFINITY too)", "0: no norm, INFINITY: measure, never clip", 0,                 \
    "0: no norm; > 0: clip the global gradient norm to it; INFINITY: measure, never clip") \
  X(norm_type, SA_FIELD_INT32, SA_NORM_L2, SA_NORM_L2, SA_NORM_INF,                        \
    "SA_NORM_L2 (0) or SA_NORM_INF (1)", "", 0, "the norm of max_grad_norm")               \
  X(grad_norm, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a pointer or NULL", "", 0,                \
    "float*, backend memory, optional: receives the global norm, on the stream")           \
  X(host_grad_norm, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a pointer or NULL", "", 0,           \
    "double*, host memory, optional: receives the global norm (synchronizes device backends)")

#define SA_OPTIMIZER_CONFIG_FIELDS(X)                                                      \
  X(num_threads, SA_FIELD_INT32, 0, 0, INT32_MAX, ">= 0", "0: one per hardware thread", 0, \
    "worker threads of the CPU backend, of the CPU step of state placed "                  \
    "SA_STATE_ON_HOST_CPU_STEP, and of state export")                                      \
  X(cpu_simd, SA_FIELD_FLAG, 1, 0, 1, "0 or 1", "", 0,                                     \
    "CPU backend and CPU steps: 1 = SIMD when the CPU has FMA, 0 = scalar only")

#define SA_PARAM_OPTIONS_FIELDS(X)                                                         \
  X(grad_dtype, SA_FIELD_DTYPE, 0, 0, 0, "unset or a grad dtype", "", SA_DTYPE_GRAD,       \
    "the grads' dtype; unset: the param's (float32 for an fp8 param)")                     \
  X(moment_dtype, SA_FIELD_DTYPE, 0, 0, 0, "unset or a moment dtype", "", SA_DTYPE_MOMENT, \
    "the moments' storage (exp_avg, exp_avg_sq, max_exp_avg_sq); unset: float32")          \
  X(master, SA_FIELD_INT32, SA_MASTER_AUTO, SA_MASTER_AUTO, SA_MASTER_REMAINDER,           \
    "an sa_master_kind: SA_MASTER_AUTO 0, SA_MASTER_NONE 1, SA_MASTER_FP32 2 or "          \
    "SA_MASTER_REMAINDER 3",                                                               \
    "", 0, "the param's form: its master copy, if any")                                    \
  X(scale, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a DLManagedTensorVersioned* or NULL", "", 0,  \
    "an fp8 param's scale tensor (scaling says which); NULL for other params")             \
  X(amax, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a DLManagedTensorVersioned* or NULL", "", 0,   \
    "delayed and current scalings, optional: the float32 scalar each step writes the "     \
    "amax into")                                                                           \
  X(scaling, SA_FIELD_INT32, SA_SCALING_NONE, SA_SCALING_NONE, SA_SCALING_CURRENT_POW2,    \
    "an sa_param_scaling, SA_SCALING_NONE 0 to SA_SCALING_CURRENT_POW2 5", "", 0,          \
    "how an fp8 param is cast from its master (sa_param_scaling_describe); NONE for "      \
    "other params")                                                                        \
  X(margin, SA_FIELD_INT32, 0, 0, 6, "0 to 6",                                             \
    "a larger one would take the scale of a large finite amax below float32's normal "     \
    "range",                                                                               \
    0, "current scalings: the scale is divided by 2^margin")                               \
  X(state_placement, SA_FIELD_INT32, SA_STATE_ON_DEVICE, SA_STATE_ON_DEVICE,               \
    SA_STATE_ON_HOST_CPU_STEP,                                                             \
    "an sa_state_placement: SA_STATE_ON_DEVICE 0, SA_STATE_ON_HOST 1 or "                  \
    "SA_STATE_ON_HOST_CPU_STEP 2",                                                         \
    "", 0, "where the param's state lives")

#define SA_IMPORT_OPTIONS_FIELDS(X)                                                  \
  X(staging_bytes, SA_FIELD_UINT64, 0, 0, 18446744073709551615.0, "any size", "", 0, \
    "bytes of the staging buffer data goes through; 0: 64 MiB")                      \
  X(allow_missing, SA_FIELD_FLAG, 0, 0, 1, "0 or 1", "", 0,                          \
    "1: params absent from the blobs keep their state (else an error)")              \
  X(allow_unexpected, SA_FIELD_FLAG, 0, 0, 1, "0 or 1", "", 0,                       \
    "1: params in the blobs that this optimizer lacks are ignored (else an error)")  \
  X(restore_groups, SA_FIELD_FLAG, 1, 0, 1, "0 or 1", "", 0,                         \
    "1: restore the groups' hyperparameters and the step counts from the blobs")     \
  X(read_once, SA_FIELD_FLAG, 0, 0, 1, "0 or 1", "", 0,                              \
    "1: read every byte once even when the data exceed the staging buffer")

struct StructField {
  const char* name;
  int32_t type;  // sa_field_type
  std::size_t offset;
  double default_value;
  double min;
  double max;
  const char* rule;
  const char* why;
  int32_t role;  // SA_FIELD_DTYPE: the sa_dtype_role a dtype must have
  const char* doc;
};

// A table of StructFields, and the struct it describes (its name, as messages say it).
struct StructTable {
  const char* struct_name;
  const StructField* fields;
  int32_t count;
  std::size_t bytes;  // sizeof the struct
};

#define SA_SCHEMA_FIELD_ROW(s, name, type, default_value, min, max, rule, why, role, doc) \
  StructField{#name, type, offsetof(s, name), default_value, min, max, rule, why, role, doc},
#define SA_STEP_ROW(...) SA_SCHEMA_FIELD_ROW(sa_step_args, __VA_ARGS__)
#define SA_CONFIG_ROW(...) SA_SCHEMA_FIELD_ROW(sa_optimizer_config, __VA_ARGS__)
#define SA_PARAM_ROW(...) SA_SCHEMA_FIELD_ROW(sa_param_options, __VA_ARGS__)
#define SA_IMPORT_ROW(...) SA_SCHEMA_FIELD_ROW(sa_import_options, __VA_ARGS__)
inline constexpr StructField kStepFields[] = {SA_STEP_ARGS_FIELDS(SA_STEP_ROW)};
inline constexpr StructField kConfigFields[] = {SA_OPTIMIZER_CONFIG_FIELDS(SA_CONFIG_ROW)};
inline constexpr StructField kParamOptionFields[] = {SA_PARAM_OPTIONS_FIELDS(SA_PARAM_ROW)};
inline constexpr StructField kImportFields[] = {SA_IMPORT_OPTIONS_FIELDS(SA_IMPORT_ROW)};
#undef SA_STEP_ROW
#undef SA_CONFIG_ROW
#undef SA_PARAM_ROW
#undef SA_IMPORT_ROW
#undef SA_SCHEMA_FIELD_ROW

template <class S, std::size_t N>
constexpr StructTable table_of(const char* name, const StructField (&fields)[N]) {
  return {name, fields, static_cast<int32_t>(N), sizeof(S)};
}
inline constexpr int32_t kNumStepFields = table_of<sa_step_args>("", kStepFields).count;

// The table of an sa_struct_kind other than SA_STRUCT_GROUP_CONFIG (whose table is
// kGroupFields), or a table of no fields for a kind this library does not know.
constexpr StructTable struct_table(int32_t kind) {
  switch (kind) {
    case SA_STRUCT_STEP_ARGS:
      return table_of<sa_step_args>("sa_step_args", kStepFields);
    case SA_STRUCT_OPTIMIZER_CONFIG:
      return table_of<sa_optimizer_config>("sa_optimizer_config", kConfigFields);
    case SA_STRUCT_PARAM_OPTIONS:
      return table_of<sa_param_options>("sa_param_options", kParamOptionFields);
    case SA_STRUCT_IMPORT_OPTIONS:
      return table_of<sa_import_options>("sa_import_options", kImportFields);
    default:
      return {"", nullptr, 0, 0};
  }
}

}  // namespace sa::schema

#endif  // SHARDADAM_SRC_SCHEMA_HPP_
