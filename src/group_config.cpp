// src/group_config.cpp — group hyperparameters: validation (from the schema's table), and
// their kernel-side form (folded into coefficients by kernels/adam_math.h's
// fold_coefficients).
#include <type_traits>

#include "../kernels/adam_math.h"

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
  for (const schema::GroupField& f : schema::kGroupFields) {
    const double value = schema::get(c, f);
    if (!schema::accepts(f.rule, value))
      fail(SA_ERR_INVALID_ARGUMENT, context, ": ", f.name, " is ", value, "; it must be ",
           schema::rule_info(f.rule).words);
  }
}

void check_group_change(const sa_group_config& current, const sa_group_config& next,
                        int64_t num_params, const std::string& context) {
  if (num_params == 0) return;
  for (const schema::GroupField& f : schema::kGroupFields)
    if (f.fixed_with_params && schema::get(current, f) != schema::get(next, f))
      fail(SA_ERR_STATE, context, ": ", f.name, " cannot change once the group holds params (",
           num_params, " now); the params' state was allocated by it");
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

}  // namespace sa
