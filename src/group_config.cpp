// src/group_config.cpp — group hyperparameters: validation (from the schema's table), and
// their kernel-side form (folded into coefficients by kernels/adam_math.h's
// fold_coefficients).
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../kernels/adam_math.h"
#include "../kernels/muon_math.h"

#include "errors.hpp"
#include "optimizer.hpp"
#include "schema.hpp"

namespace sa {

namespace {

// shardadam.h spells sa_group_config and its defaults for the ABI; they must be the
// schema's: the same members in the same order with the same types, and the same defaults.
struct SchemaMirror {
  std::size_t struct_size;
#define SA_MIRROR_MEMBER(name, rule, ...) schema::Storage<schema::Rule::rule>::type name;
  SA_GROUP_FIELDS(SA_MIRROR_MEMBER)
#undef SA_MIRROR_MEMBER
};
static_assert(sizeof(SchemaMirror) == sizeof(sa_group_config),
              "sa_group_config has members that src/schema.hpp's SA_GROUP_FIELDS lacks");
constexpr sa_group_config kInit = SA_GROUP_CONFIG_INIT;
#define SA_CHECK_FIELD(name, rule, default_value, ...)                                            \
  static_assert(offsetof(sa_group_config, name) == offsetof(SchemaMirror, name),                  \
                "sa_group_config::" #name " is not where src/schema.hpp puts it");                \
  static_assert(                                                                                  \
      std::is_same_v<decltype(sa_group_config::name), schema::Storage<schema::Rule::rule>::type>, \
      "sa_group_config::" #name " has another type than its schema rule");                        \
  static_assert(kInit.name == default_value,                                                      \
                "SA_GROUP_CONFIG_INIT's " #name " is not src/schema.hpp's default");
SA_GROUP_FIELDS(SA_CHECK_FIELD)
#undef SA_CHECK_FIELD

}  // namespace

void check_group_config(const sa_group_config& c, const std::string& context) {
  check_group_fields(c, context);
  check_group_rule(c, context);
}

void check_group_fields(const sa_group_config& c, const std::string& context) {
  for (const schema::GroupField& f : schema::kGroupFields) {
    const double value = schema::get(c, f);
    if (!schema::accepts(f.rule, value))
      fail(SA_ERR_INVALID_ARGUMENT, context, ": ", f.name, " is ", value, "; it must be ",
           schema::rule_info(f.rule).words);
  }
}

void check_group_rule(const sa_group_config& c, const std::string& context) {
  // Muon has no L2 decay, no ascent and no amsgrad: a group asking for them would get an
  // update other than the one it names.
  if (c.update_rule == SA_RULE_MUON) {
    const char* refused = c.decoupled_weight_decay == 0 ? "decoupled_weight_decay is 0"
                          : c.maximize != 0             ? "maximize is 1"
                          : c.amsgrad != 0              ? "amsgrad is 1"
                                                        : nullptr;
    if (refused != nullptr)
      fail(SA_ERR_INVALID_ARGUMENT, context, ": ", refused,
           ", but the group's update_rule is SA_RULE_MUON, whose weight decay is always "
           "decoupled and which has no maximize or amsgrad");
  }
}

void check_group_change(const sa_group_config& current, const sa_group_config& next,
                        int64_t num_params, const std::string& context) {
  if (num_params == 0) return;
  for (const schema::GroupField& f : schema::kGroupFields)
    if (f.fixed_with_params && schema::get(current, f) != schema::get(next, f))
      fail(SA_ERR_STATE, context, ": ", f.name,
           " cannot change once the group holds params (it holds ", num_params,
           "); the params' state was allocated by it");
}

namespace {

const schema::GroupField& field_named(const char* name, const char* what, int32_t i) {
  if (name == nullptr) fail(SA_ERR_INVALID_ARGUMENT, what, "[", i, "] is NULL");
  for (const schema::GroupField& f : schema::kGroupFields)
    if (std::strcmp(f.name, name) == 0) return f;
  std::string known;
  for (const schema::GroupField& f : schema::kGroupFields)
    known += known.empty() ? f.name : concat(", ", f.name);
  fail(SA_ERR_INVALID_ARGUMENT, what, "[", i, "] is '", name,
       "', which is not a group hyperparameter; known: ", known);
}

// The fields `names` names, each once.
std::vector<const schema::GroupField*> fields_named(int32_t n, const char* const* names) {
  std::vector<const schema::GroupField*> fields;
  for (int32_t i = 0; i < n; ++i) {
    const schema::GroupField& f = field_named(names[i], "names", i);
    for (int32_t j = 0; j < i; ++j)
      if (fields[j] == &f)
        fail(SA_ERR_INVALID_ARGUMENT, "names[", j, "] and names[", i, "] are both '", f.name, "'");
    fields.push_back(&f);
  }
  return fields;
}

}  // namespace

sa_group_config with_fields(const sa_group_config& base, int32_t n, const char* const* names,
                            const double* values) {
  sa_group_config c = base;
  const std::vector<const schema::GroupField*> fields = fields_named(n, names);
  for (int32_t i = 0; i < n; ++i) {
    const schema::GroupField& f = *fields[i];
    // An integral field is stored as int32_t: refuse what the conversion would change
    // (0.5, NaN, 1e10); the rest is checked with the whole config.
    if (schema::integral(f.rule) && !schema::accepts(f.rule, values[i]))
      fail(SA_ERR_INVALID_ARGUMENT, f.name, " is ", values[i], "; it must be ",
           schema::rule_info(f.rule).words);
    schema::set(c, f, values[i]);
  }
  return c;
}

void get_fields(const sa_group_config& c, int32_t n, const char* const* names, double* values) {
  const std::vector<const schema::GroupField*> fields = fields_named(n, names);
  for (int32_t i = 0; i < n; ++i) values[i] = schema::get(c, *fields[i]);
}

kernels::AdamHyper hyper_of(const sa_group_config& c) {
  return {c.lr,
          c.beta1,
          c.beta2,
          c.eps,
          c.weight_decay,
          c.decoupled_weight_decay != 0,
          c.bias_correction != 0,
          c.maximize != 0};
}

kernels::MuonHyper muon_hyper_of(const sa_group_config& c) {
  kernels::MuonHyper h;
  h.lr = c.lr;
  h.weight_decay = c.weight_decay;
  h.momentum = c.momentum;
  h.nesterov = c.nesterov != 0;
  h.adjust_lr = static_cast<kernels::MuonLrAdjust>(c.adjust_lr);
  h.ns.a = static_cast<float>(c.ns_a);
  h.ns.b = static_cast<float>(c.ns_b);
  h.ns.c = static_cast<float>(c.ns_c);
  h.ns.steps = c.ns_steps;
  h.ns.eps = static_cast<float>(c.eps);
  return h;
}

}  // namespace sa
