// src/schema.hpp — the one table of the group hyperparameters: each one's name, valid
// values, default and meaning. Everything else derives from it: validation and its
// messages (group_config.cpp), a saved group's JSON and its parsing (state_io/), the
// comparison of two files' groups, the field table of the C ABI that the bindings read
// (sa_group_config_field), and compile-time checks that sa_group_config and
// SA_GROUP_CONFIG_INIT (shardadam.h, the ABI's spelling) agree with it. At the end, the
// same for the step arguments (sa_step_args_field).
//
// A new hyperparameter is a row here, a member (and its default) in shardadam.h, and what
// the kernels do with it (kernels/adam_math.h, hyper_of in group_config.cpp).
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
  flag            // int32_t, 0 or 1
};

// X(name, rule, default, fixed_with_params, since, doc). `fixed_with_params`: the field
// cannot change once the group holds a param (the params' state was allocated by it).
// `since`: the first shard-file format version (state_io/metadata.hpp) whose files hold
// the field. Files of an older version lack it and load with its default, so a field added
// later must default to the value under which the update is what it was before the field
// existed (and it bumps kShardFormatVersion, so that older libraries refuse its files
// instead of ignoring it).
#define SA_GROUP_FIELDS(X)                                                                 \
  X(lr, nonnegative, 1e-3, false, 1, "learning rate")                                      \
  X(beta1, unit_interval, 0.9, false, 1, "decay rate of the first moment (exp_avg)")       \
  X(beta2, unit_interval, 0.999, false, 1, "decay rate of the second moment (exp_avg_sq)") \
  X(eps, nonnegative, 1e-8, false, 1, "added to the denominator")                          \
  X(weight_decay, nonnegative, 1e-2, false, 1,                                             \
    "weight decay: decoupled (AdamW) or an L2 term on the grad (Adam)")                    \
  X(decoupled_weight_decay, flag, 1, false, 1,                                             \
    "1: AdamW (decay the param); 0: Adam (L2 term on the grad)")                           \
  X(bias_correction, flag, 1, false, 1, "1: divide the moments by 1 - beta^t")             \
  X(maximize, flag, 0, false, 1, "1: ascend instead of descend")                           \
  X(amsgrad, flag, 0, true, 1,                                                             \
    "1: keep max_exp_avg_sq, the running maximum of exp_avg_sq, and use it in the "        \
    "denominator")

struct RuleInfo {
  double min;  // valid: min <= v, and v < max (or v <= max when max_inclusive)
  double max;
  bool max_inclusive;
  bool integral;      // stored as int32_t
  const char* words;  // as error messages say it
};

constexpr RuleInfo rule_info(Rule rule) {
  switch (rule) {
    case Rule::nonnegative:
      return {0.0, std::numeric_limits<double>::infinity(), false, false, "finite and >= 0"};
    case Rule::unit_interval:
      return {0.0, 1.0, false, false, "in [0, 1)"};
    case Rule::flag:
      return {0.0, 1.0, true, true, "0 or 1"};
  }
  return {0.0, 0.0, false, false, ""};
}

// NaN is never valid (every comparison with it is false).
inline bool accepts(Rule rule, double value) {
  const RuleInfo r = rule_info(rule);
  return value >= r.min && (r.max_inclusive ? value <= r.max : value < r.max);
}

template <Rule rule>
struct Storage {
  using type = double;
};
template <>
struct Storage<Rule::flag> {
  using type = int32_t;
};

struct GroupField {
  const char* name;  // the struct member's name, and the shard files' JSON key
  Rule rule;
  std::size_t offset;  // in sa_group_config
  double default_value;
  bool fixed_with_params;
  int since;  // the first shard-file format version that holds it
  const char* doc;
};

#define SA_SCHEMA_GROUP_ROW(name, rule, default_value, fixed, since, doc) \
  GroupField{#name, Rule::rule, offsetof(sa_group_config, name), default_value, fixed, since, doc},
inline constexpr GroupField kGroupFields[] = {SA_GROUP_FIELDS(SA_SCHEMA_GROUP_ROW)};
#undef SA_SCHEMA_GROUP_ROW
inline constexpr int32_t kNumGroupFields =
    static_cast<int32_t>(sizeof(kGroupFields) / sizeof(kGroupFields[0]));

// A field's value (a flag as 0.0 or 1.0, or whatever int32_t it holds).
inline double get(const sa_group_config& c, const GroupField& f) {
  const char* at = reinterpret_cast<const char*>(&c) + f.offset;
  if (rule_info(f.rule).integral) {
    int32_t v;
    std::memcpy(&v, at, sizeof v);
    return v;
  }
  double v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

// Sets a field; a flag takes the value converted to int32_t (the caller checked the range).
inline void set(sa_group_config& c, const GroupField& f, double value) {
  char* at = reinterpret_cast<char*>(&c) + f.offset;
  if (rule_info(f.rule).integral) {
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

// ---- the step arguments ----------------------------------------------------------------
// sa_step_args after struct_size, in order. X(name, type, default, min, max, rule, doc):
// `type` is an sa_field_type; min and max bound a number (inclusive; 0 for a pointer).
// The ABI spells the struct and SA_STEP_ARGS_INIT; step_args.cpp checks them against this at
// compile time, and checks every step's numbers against min and max, naming `rule`.
#define SA_STEP_ARGS_FIELDS(X)                                                             \
  X(inv_grad_scale, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a pointer or NULL",                  \
    "const float*, backend memory (host for the CPU backend), optional: every grad is "    \
    "multiplied by it (the inverse loss scale); NULL means 1")                             \
  X(found_inf, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a pointer or NULL",                       \
    "const float*, backend memory, optional: nonzero skips the whole step")                \
  X(skipped, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a pointer or NULL",                         \
    "int32_t*, host memory, optional: receives 1 if the step was skipped, else 0")         \
  X(max_grad_norm, SA_FIELD_DOUBLE, 0.0, 0.0, std::numeric_limits<double>::infinity(),     \
    ">= 0 (INFINITY too)",                                                                 \
    "0: no norm; > 0: clip the global gradient norm to it; INFINITY: measure, never clip") \
  X(norm_type, SA_FIELD_INT32, SA_NORM_L2, SA_NORM_L2, SA_NORM_INF,                        \
    "SA_NORM_L2 (0) or SA_NORM_INF (1)", "the norm of max_grad_norm")                      \
  X(grad_norm, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a pointer or NULL",                       \
    "float*, backend memory, optional: receives the global norm, on the stream")           \
  X(host_grad_norm, SA_FIELD_POINTER, 0.0, 0.0, 0.0, "a pointer or NULL",                  \
    "double*, host memory, optional: receives the global norm (synchronizes device backends)")

struct StepField {
  const char* name;
  int32_t type;  // sa_field_type
  std::size_t offset;
  double default_value;
  double min;
  double max;
  const char* rule;
  const char* doc;
};

#define SA_SCHEMA_STEP_ROW(name, type, default_value, min, max, rule, doc) \
  StepField{#name, type, offsetof(sa_step_args, name), default_value, min, max, rule, doc},
inline constexpr StepField kStepFields[] = {SA_STEP_ARGS_FIELDS(SA_SCHEMA_STEP_ROW)};
#undef SA_SCHEMA_STEP_ROW
inline constexpr int32_t kNumStepFields =
    static_cast<int32_t>(sizeof(kStepFields) / sizeof(kStepFields[0]));

}  // namespace sa::schema

#endif  // SHARDADAM_SRC_SCHEMA_HPP_
