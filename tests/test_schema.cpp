// tests/test_schema.cpp — the library's table of group hyperparameters, as the bindings
// read it (sa_group_config_default, sa_group_config_num_fields, sa_group_config_field):
// it names every member of sa_group_config where the struct has it, its defaults are
// torch.optim.AdamW's, and the valid values it states are the ones the library enforces.
// References: the struct as the C compiler lays it out, torch's documented AdamW defaults,
// and the statuses of sa_optimizer_add_group / sa_optimizer_set_group.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace {

using namespace sa_test;

std::vector<sa_field_info> fields() {
  std::vector<sa_field_info> out;
  for (int32_t i = 0; i < sa_group_config_num_fields(); ++i) {
    sa_field_info info = SA_FIELD_INFO_INIT;
    REQUIRE_SA_OK(nullptr, sa_group_config_field(i, &info));
    out.push_back(info);
  }
  return out;
}

// Whether a field is stored as an int32_t (a flag or an enum).
bool integral(const sa_field_info& f) { return f.type == SA_FIELD_FLAG || f.type == SA_FIELD_INT32; }

// A config whose field `f` holds `value` (an integral one as an int32_t), the rest defaults.
sa_group_config with_value(const sa_field_info& f, double value) {
  sa_group_config c = SA_GROUP_CONFIG_INIT;
  char* at = reinterpret_cast<char*>(&c) + f.offset;
  if (integral(f)) {
    const auto v = static_cast<int32_t>(value);
    std::memcpy(at, &v, sizeof v);
  } else {
    std::memcpy(at, &value, sizeof value);
  }
  return c;
}

bool accepted(const sa_group_config& c) {
  OptimizerPtr opt = make_optimizer();
  int32_t group = -1;
  return sa_optimizer_add_group(opt.get(), &c, &group) == SA_OK;
}

}  // namespace

TEST_CASE("the field table names every member of sa_group_config, in struct order", "[schema]") {
  struct Expected {
    const char* name;
    std::size_t offset;
    int32_t type;
    int32_t rules;  // which update rules read it
  };
  constexpr int32_t kAdamW = 1 << SA_RULE_ADAMW, kMuon = 1 << SA_RULE_MUON, kBoth = kAdamW | kMuon;
  const Expected expected[] = {
      {"lr", offsetof(sa_group_config, lr), SA_FIELD_DOUBLE, kBoth},
      {"beta1", offsetof(sa_group_config, beta1), SA_FIELD_DOUBLE, kAdamW},
      {"beta2", offsetof(sa_group_config, beta2), SA_FIELD_DOUBLE, kAdamW},
      {"eps", offsetof(sa_group_config, eps), SA_FIELD_DOUBLE, kBoth},
      {"weight_decay", offsetof(sa_group_config, weight_decay), SA_FIELD_DOUBLE, kBoth},
      {"decoupled_weight_decay", offsetof(sa_group_config, decoupled_weight_decay), SA_FIELD_FLAG,
       kAdamW},
      {"bias_correction", offsetof(sa_group_config, bias_correction), SA_FIELD_FLAG, kAdamW},
      {"maximize", offsetof(sa_group_config, maximize), SA_FIELD_FLAG, kAdamW},
      {"amsgrad", offsetof(sa_group_config, amsgrad), SA_FIELD_FLAG, kAdamW},
      {"update_rule", offsetof(sa_group_config, update_rule), SA_FIELD_INT32, kBoth},
      {"nesterov", offsetof(sa_group_config, nesterov), SA_FIELD_FLAG, kMuon},
      {"momentum", offsetof(sa_group_config, momentum), SA_FIELD_DOUBLE, kMuon},
      {"ns_a", offsetof(sa_group_config, ns_a), SA_FIELD_DOUBLE, kMuon},
      {"ns_b", offsetof(sa_group_config, ns_b), SA_FIELD_DOUBLE, kMuon},
      {"ns_c", offsetof(sa_group_config, ns_c), SA_FIELD_DOUBLE, kMuon},
      {"ns_steps", offsetof(sa_group_config, ns_steps), SA_FIELD_INT32, kMuon},
      {"adjust_lr", offsetof(sa_group_config, adjust_lr), SA_FIELD_INT32, kMuon},
  };
  const std::vector<sa_field_info> got = fields();
  REQUIRE(got.size() == std::size(expected));
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("field " << i);
    CHECK(std::string(got[i].name) == expected[i].name);
    CHECK(got[i].offset == expected[i].offset);
    CHECK(got[i].type == expected[i].type);
    CHECK(got[i].rules == expected[i].rules);
    CHECK(std::string(got[i].doc).size() > 5);
    CHECK(got[i].struct_size == sizeof(sa_field_info));
  }
  // Only amsgrad and the update rule decide what state a param gets.
  for (const sa_field_info& f : got) {
    const std::string name = f.name;
    CHECK(f.fixed_with_params == (name == "amsgrad" || name == "update_rule" ? 1 : 0));
  }
}

TEST_CASE("the defaults are torch.optim.AdamW's, by the table and by sa_group_config_default",
          "[schema]") {
  // torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
  // amsgrad=False, maximize=False): decoupled decay, bias-corrected.
  sa_group_config d{};
  d.struct_size = sizeof d;
  REQUIRE_SA_OK(nullptr, sa_group_config_default(&d));
  CHECK(d.struct_size == sizeof d);
  CHECK(d.lr == 1e-3);
  CHECK(d.beta1 == 0.9);
  CHECK(d.beta2 == 0.999);
  CHECK(d.eps == 1e-8);
  CHECK(d.weight_decay == 1e-2);
  CHECK(d.decoupled_weight_decay == 1);
  CHECK(d.bias_correction == 1);
  CHECK(d.maximize == 0);
  CHECK(d.amsgrad == 0);
  // torch.optim.Muon(momentum=0.95, nesterov=True, ns_coefficients=(3.4445, -4.775, 2.0315),
  // ns_steps=5, adjust_lr_fn=None): its own fields' defaults.
  CHECK(d.update_rule == SA_RULE_ADAMW);
  CHECK(d.momentum == 0.95);
  CHECK(d.nesterov == 1);
  CHECK(d.ns_a == 3.4445);
  CHECK(d.ns_b == -4.775);
  CHECK(d.ns_c == 2.0315);
  CHECK(d.ns_steps == 5);
  CHECK(d.adjust_lr == SA_MUON_LR_ORIGINAL);
  const sa_group_config init = SA_GROUP_CONFIG_INIT;
  CHECK(std::memcmp(&d, &init, sizeof d) == 0);
  for (const sa_field_info& f : fields()) {
    INFO(f.name);
    double value = 0;
    if (integral(f)) {
      int32_t v = 0;
      std::memcpy(&v, reinterpret_cast<const char*>(&d) + f.offset, sizeof v);
      value = v;
    } else {
      std::memcpy(&value, reinterpret_cast<const char*>(&d) + f.offset, sizeof value);
    }
    CHECK(f.default_value == value);
  }
}

TEST_CASE("the valid values the table states are the ones add_group and set_group enforce",
          "[schema]") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const sa_field_info& f : fields()) {
    INFO(f.name << " rule " << f.rule);
    CHECK(accepted(with_value(f, f.default_value)));
    CHECK(accepted(with_value(f, f.min)));
    CHECK_FALSE(accepted(with_value(f, integral(f) ? f.min - 1 : std::nextafter(f.min, -inf))));
    if (integral(f)) {
      CHECK(f.max_inclusive == 1);
      CHECK(accepted(with_value(f, f.max)));
      CHECK_FALSE(accepted(with_value(f, f.max + 1)));
      continue;
    }
    CHECK(f.max_inclusive == 0);
    CHECK_FALSE(accepted(with_value(f, f.max)));
    CHECK_FALSE(accepted(with_value(f, nan)));
    if (std::isfinite(f.max))
      CHECK(accepted(with_value(f, std::nextafter(f.max, -inf))));
    else
      CHECK(accepted(with_value(f, std::numeric_limits<double>::max())));
    // The message says the field and the rule, in the table's words.
    OptimizerPtr opt = make_optimizer();
    const sa_group_config good = SA_GROUP_CONFIG_INIT;
    int32_t group = -1;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &good, &group));
    sa_group_config bad = with_value(f, f.max);
    const std::string field = std::string(f.name) + " is ",
                      rule = std::string("it must be ") + f.rule;
    CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_set_group(opt.get(), 0, &bad),
                   "group 0", field.c_str(), rule.c_str());
  }
}

TEST_CASE("the table queries check their arguments and honour an older caller's struct_size",
          "[schema][errors]") {
  sa_field_info info = SA_FIELD_INFO_INIT;
  const int32_t n = sa_group_config_num_fields();
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_group_config_field(n, &info),
                 "sa_group_config_field", "index 17 is not a field");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_group_config_field(-1, &info), "index -1");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_group_config_field(0, nullptr),
                 "out is NULL");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_group_config_default(nullptr), "out is NULL");
  info.struct_size = sizeof(sa_field_info) + 8;
  CHECK_SA_FAILS(nullptr, SA_ERR_UNSUPPORTED, sa_group_config_field(0, &info), "struct_size");

  // A struct from an older header: the fields past its size are not written.
  struct {
    sa_group_config config;
    unsigned char canary[8];
  } older;
  std::memset(&older, 0xAB, sizeof older);
  older.config.struct_size = offsetof(sa_group_config, eps);
  REQUIRE_SA_OK(nullptr, sa_group_config_default(&older.config));
  CHECK(older.config.struct_size == offsetof(sa_group_config, eps));
  CHECK(older.config.lr == 1e-3);
  CHECK(older.config.beta2 == 0.999);
  const auto* after =
      reinterpret_cast<const unsigned char*>(&older.config) + offsetof(sa_group_config, eps);
  for (std::size_t i = 0; i < sizeof(sa_group_config) - offsetof(sa_group_config, eps); ++i)
    CHECK(after[i] == 0xAB);
}

TEST_CASE("sa_optimizer_state_keys lists the states a param has, each one a view", "[schema]") {
  struct Case {
    DLDataType param_dtype;
    int32_t master;
    int32_t amsgrad;
    std::vector<std::string> keys;
  };
  const Case cases[] = {
      {kFloat32, SA_MASTER_AUTO, 0, {"exp_avg", "exp_avg_sq"}},
      {kFloat32, SA_MASTER_AUTO, 1, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
      {kBfloat16, SA_MASTER_AUTO, 0, {"exp_avg", "exp_avg_sq", "master"}},
      {kBfloat16, SA_MASTER_REMAINDER, 1, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "remainder"}},
  };
  const char* const every_key[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master",
                                   "remainder"};
  for (const Case& c : cases) {
    HostTensor t({5}, c.param_dtype);  // outlives the optimizer, which owns a view of it
    OptimizerPtr opt = make_optimizer();
    sa_group_config group = SA_GROUP_CONFIG_INIT;
    group.amsgrad = c.amsgrad;
    int32_t g = -1;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &group, &g));
    const sa_param_options options = param_options(kDefaultDtype, kDefaultDtype, c.master);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "p", g, t.versioned(), nullptr,
                                                    &options, nullptr));
    int32_t count = -1;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_state_keys(opt.get(), 0, nullptr, 0, &count));
    REQUIRE(count == static_cast<int32_t>(c.keys.size()));
    std::vector<const char*> keys(8, nullptr);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_state_keys(opt.get(), 0, keys.data(), 8, &count));
    for (int32_t i = 0; i < count; ++i) CHECK(std::string(keys[i]) == c.keys[i]);
    CHECK(keys[count] == nullptr);  // nothing written past count
    // A short array gets the first ones.
    keys.assign(8, nullptr);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_state_keys(opt.get(), 0, keys.data(), 1, &count));
    CHECK(std::string(keys[0]) == "exp_avg");
    CHECK(keys[1] == nullptr);
    // Exactly the listed keys have views.
    for (const char* key : every_key) {
      DLManagedTensorVersioned* view = nullptr;
      const bool listed = std::find(c.keys.begin(), c.keys.end(), key) != c.keys.end();
      INFO(key);
      CHECK((sa_optimizer_state_view(opt.get(), 0, key, &view) == SA_OK) == listed);
      if (view) view->deleter(view);
    }
  }
  OptimizerPtr opt = make_optimizer();
  int32_t count = 0;
  const char* key = nullptr;
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_state_keys(opt.get(), 0, &key, 1, &count), "param 0 does not exist");
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_state_keys(opt.get(), 0, nullptr, 1, &count), "keys is NULL");
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_state_keys(opt.get(), 0, &key, 1, nullptr), "count is NULL");
}

TEST_CASE("sa_optimizer_moment_keys lists the moments, the keys get_moment_values takes",
          "[schema]") {
  struct Case {
    DLDataType param_dtype;
    int32_t master;
    int32_t amsgrad;
    DLDataType moment;
    std::vector<std::string> moments;  // torch.optim.Adam's state keys, less "step"
  };
  const Case cases[] = {
      {kFloat32, SA_MASTER_AUTO, 0, kFloat32, {"exp_avg", "exp_avg_sq"}},
      {kBfloat16, SA_MASTER_AUTO, 1, kFloat32, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
      {kBfloat16, SA_MASTER_REMAINDER, 1, kBfloat16, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
      {kFloat32, SA_MASTER_AUTO, 1, kUint8, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
  };
  for (const Case& c : cases) {
    HostTensor t({300}, c.param_dtype);  // outlives the optimizer, which owns a view of it
    OptimizerPtr opt = make_optimizer();
    sa_group_config group = SA_GROUP_CONFIG_INIT;
    group.amsgrad = c.amsgrad;
    int32_t g = -1;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &group, &g));
    sa_param_options options = param_options(kDefaultDtype, kDefaultDtype, c.master);
    options.moment_dtype = c.moment;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "p", g, t.versioned(), nullptr,
                                                    &options, nullptr));
    std::vector<const char*> keys(8, nullptr);
    int32_t count = -1;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_moment_keys(opt.get(), 0, keys.data(), 8, &count));
    REQUIRE(count == static_cast<int32_t>(c.moments.size()));
    for (int32_t i = 0; i < count; ++i) CHECK(std::string(keys[i]) == c.moments[i]);
    CHECK(keys[count] == nullptr);
    // Each listed key is one get_moment_values takes; the param form's state is not.
    HostTensor out({300}, kFloat32);
    const DLTensor dl = out.dl();
    for (const std::string& key : c.moments)
      CHECK(sa_optimizer_get_moment_values(opt.get(), 0, key.c_str(), &dl) == SA_OK);
    CHECK(sa_optimizer_get_moment_values(opt.get(), 0, "master", &dl) != SA_OK);
  }
  OptimizerPtr opt = make_optimizer();
  int32_t count = 0;
  const char* key = nullptr;
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_moment_keys(opt.get(), 0, &key, 1, &count), "param 0 does not exist");
}

// The by-name calls against the struct calls, which the C compiler lays out: a binding
// that uses only names gets exactly what a C caller gets with the struct.
TEST_CASE("group fields by name: add, set and get agree with the struct calls", "[schema]") {
  OptimizerPtr opt = make_optimizer();
  const char* const names[] = {"lr", "amsgrad", "beta2"};
  const double values[] = {0.25, 1.0, 0.5};
  int32_t g = -1;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group_fields(opt.get(), 3, names, values, &g));
  CHECK(g == 0);
  sa_group_config want = SA_GROUP_CONFIG_INIT;  // the defaults, but for the named three
  want.lr = 0.25;
  want.amsgrad = 1;
  want.beta2 = 0.5;
  sa_group_config got = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_get_group(opt.get(), 0, &got));
  CHECK(std::memcmp(&got, &want, sizeof got) == 0);

  // n == 0: the defaults.
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group_fields(opt.get(), 0, nullptr, nullptr, &g));
  const sa_group_config defaults = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_get_group(opt.get(), 1, &got));
  CHECK(std::memcmp(&got, &defaults, sizeof got) == 0);

  // set replaces the named fields only.
  const char* const set_names[] = {"weight_decay", "maximize"};
  const double set_values[] = {0.0, 1.0};
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_group_fields(opt.get(), 0, 2, set_names, set_values));
  want.weight_decay = 0.0;
  want.maximize = 1;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_get_group(opt.get(), 0, &got));
  CHECK(std::memcmp(&got, &want, sizeof got) == 0);

  // get reads every field the table lists, in any order.
  std::vector<const char*> all;
  for (const sa_field_info& f : fields()) all.push_back(f.name);
  std::reverse(all.begin(), all.end());
  std::vector<double> read(all.size(), -1.0);
  REQUIRE_SA_OK(opt.get(),
                sa_optimizer_get_group_fields(opt.get(), 0, static_cast<int32_t>(all.size()),
                                              all.data(), read.data()));
  // adjust_lr .. update_rule: Muon's defaults; amsgrad .. lr: as set above.
  const double expected[] = {SA_MUON_LR_ORIGINAL, 5, 2.0315, -4.775, 3.4445, 0.95, 1, SA_RULE_ADAMW,
                             1.0, 1.0, 1.0, 1.0, 0.0, 1e-8, 0.5, 0.9, 0.25};
  REQUIRE(read.size() == std::size(expected));
  for (std::size_t i = 0; i < read.size(); ++i) {
    INFO(all[i]);
    CHECK(read[i] == expected[i]);
  }
}

TEST_CASE("group fields by name refuse unknown, repeated and non-flag values, changing nothing",
          "[schema]") {
  HostTensor t({5}, kFloat32);  // outlives the optimizer, which owns a view of it
  OptimizerPtr opt = make_optimizer();
  int32_t g = -1;
  const char* const unknown[] = {"lr", "betas"};
  const double values[] = {0.1, 0.5};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_group_fields(opt.get(), 2, unknown, values, &g),
                 "names[1] is 'betas'", "known: lr, beta1, beta2, eps");
  const char* const twice[] = {"eps", "eps"};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_group_fields(opt.get(), 2, twice, values, &g),
                 "names[0] and names[1] are both 'eps'");
  const char* const flag[] = {"amsgrad"};
  const double half[] = {0.5};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_group_fields(opt.get(), 1, flag, half, &g), "amsgrad is 0.5",
                 "0 or 1");
  const char* const beta[] = {"beta1"};
  const double one[] = {1.0};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_group_fields(opt.get(), 1, beta, one, &g), "beta1 is 1",
                 "in [0, 1)");
  const char* const null_name[] = {nullptr};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_group_fields(opt.get(), 1, null_name, one, &g),
                 "names[0] is NULL");
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_group_fields(opt.get(), 1, nullptr, one, &g), "names is NULL");
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_group_fields(opt.get(), -1, unknown, values, &g),
                 "n is negative");
  CHECK(sa_optimizer_num_groups(opt.get()) == 0);

  // set: a bad entry anywhere leaves the group as it was; amsgrad is fixed once it has params.
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group_fields(opt.get(), 0, nullptr, nullptr, &g));
  const char* const lr_then_bad[] = {"lr", "beta9"};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_set_group_fields(opt.get(), g, 2, lr_then_bad, values), "'beta9'");
  double lr = -1.0;
  const char* const lr_name[] = {"lr"};
  REQUIRE_SA_OK(opt.get(), sa_optimizer_get_group_fields(opt.get(), g, 1, lr_name, &lr));
  CHECK(lr == 1e-3);
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_get_group_fields(opt.get(), 7, 1, lr_name, &lr), "group 7");
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "p", g, t.versioned(), nullptr,
                                                  nullptr, nullptr));
  CHECK_SA_FAILS(opt.get(), SA_ERR_STATE, sa_optimizer_set_group_fields(opt.get(), g, 1, flag, one),
                 "amsgrad cannot change");
}

// The step arguments' table against the struct as the C compiler lays it out and
// SA_STEP_ARGS_INIT: a binding that fills sa_step_args by name from it fills the member.
TEST_CASE(
    "the step-args table names every member of sa_step_args, in order, with its type and default",
    "[schema]") {
  struct Expected {
    const char* name;
    std::size_t offset;
    int32_t type;
  };
  const Expected expected[] = {
      {"inv_grad_scale", offsetof(sa_step_args, inv_grad_scale), SA_FIELD_POINTER},
      {"found_inf", offsetof(sa_step_args, found_inf), SA_FIELD_POINTER},
      {"skipped", offsetof(sa_step_args, skipped), SA_FIELD_POINTER},
      {"max_grad_norm", offsetof(sa_step_args, max_grad_norm), SA_FIELD_DOUBLE},
      {"norm_type", offsetof(sa_step_args, norm_type), SA_FIELD_INT32},
      {"grad_norm", offsetof(sa_step_args, grad_norm), SA_FIELD_POINTER},
      {"host_grad_norm", offsetof(sa_step_args, host_grad_norm), SA_FIELD_POINTER},
  };
  REQUIRE(sa_step_args_num_fields() == static_cast<int32_t>(std::size(expected)));
  const sa_step_args init = SA_STEP_ARGS_INIT;
  for (int32_t i = 0; i < sa_step_args_num_fields(); ++i) {
    sa_field_info f = SA_FIELD_INFO_INIT;
    REQUIRE_SA_OK(nullptr, sa_step_args_field(i, &f));
    INFO(f.name);
    CHECK(std::string(f.name) == expected[i].name);
    CHECK(f.offset == expected[i].offset);
    CHECK(f.type == expected[i].type);
    CHECK(f.doc != nullptr);
    CHECK(f.rule != nullptr);
    const char* at = reinterpret_cast<const char*>(&init) + f.offset;
    if (f.type == SA_FIELD_POINTER) {
      void* p = reinterpret_cast<void*>(1);
      std::memcpy(&p, at, sizeof p);
      CHECK(p == nullptr);
    } else if (f.type == SA_FIELD_DOUBLE) {
      double d = -1.0;
      std::memcpy(&d, at, sizeof d);
      CHECK(d == f.default_value);
    } else {
      int32_t v = -1;
      std::memcpy(&v, at, sizeof v);
      CHECK(v == f.default_value);
    }
  }
  sa_field_info f = SA_FIELD_INFO_INIT;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_step_args_field(7, &f), "index 7",
                 "sa_step_args has 7");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_step_args_field(0, nullptr), "out is NULL");
}

// The dtype table (sa_num_dtypes, sa_dtype) against dlpack.h's codes and the safetensors
// format's names, and its roles against what add_param accepts: a binding that maps its
// dtypes by this table gets exactly the dtypes the library takes.
TEST_CASE("the dtype table names each stored dtype with dlpack.h's code and its roles",
          "[schema][dtype]") {
  struct Expected {
    const char* name;
    DLDataType dtype;
    int32_t roles;
    const char* safetensors_name;  // nullptr: none
  };
  const int32_t all =
      SA_DTYPE_PARAM | SA_DTYPE_GRAD | SA_DTYPE_MOMENT | SA_DTYPE_STATE | SA_DTYPE_FILE;
  const Expected expected[] = {
      {"float32", {kDLFloat, 32, 1}, all | SA_DTYPE_SCALE, "F32"},
      {"bfloat16", {kDLBfloat, 16, 1}, all, "BF16"},
      {"float16", {kDLFloat, 16, 1}, SA_DTYPE_PARAM | SA_DTYPE_GRAD | SA_DTYPE_FILE, "F16"},
      {"uint8",
       {kDLUInt, 8, 1},
       SA_DTYPE_MOMENT | SA_DTYPE_STATE | SA_DTYPE_BLOCK_MOMENT | SA_DTYPE_FILE,
       "U8"},
      {"float8_e4m3fn",
       {kDLFloat8_e4m3fn, 8, 1},
       SA_DTYPE_PARAM | SA_DTYPE_SCALED_PARAM | SA_DTYPE_MOMENT | SA_DTYPE_STATE |
           SA_DTYPE_BLOCK_MOMENT | SA_DTYPE_FILE,
       "F8_E4M3"},
      {"float8_e5m2", {kDLFloat8_e5m2, 8, 1}, SA_DTYPE_PARAM | SA_DTYPE_SCALED_PARAM, nullptr},
      {"float8_e8m0fnu", {kDLFloat8_e8m0fnu, 8, 1}, SA_DTYPE_SCALE, nullptr},
      {"int16", {kDLInt, 16, 1}, SA_DTYPE_STATE | SA_DTYPE_FILE, "I16"},
  };
  REQUIRE(sa_num_dtypes() == static_cast<int32_t>(std::size(expected)));
  for (int32_t i = 0; i < sa_num_dtypes(); ++i) {
    sa_dtype_info info = SA_DTYPE_INFO_INIT;
    REQUIRE_SA_OK(nullptr, sa_dtype(i, &info));
    const Expected& e = expected[i];
    INFO(e.name);
    CHECK(std::string(info.name) == e.name);
    CHECK(same_dtype(info.dtype, e.dtype));
    CHECK(info.roles == e.roles);
    if (e.safetensors_name == nullptr) {
      CHECK(info.safetensors_name == nullptr);
    } else {
      REQUIRE(info.safetensors_name != nullptr);
      CHECK(std::string(info.safetensors_name) == e.safetensors_name);
    }
    CHECK(std::strlen(info.doc) > 0);
  }
  sa_dtype_info info = SA_DTYPE_INFO_INIT;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_dtype(sa_num_dtypes(), &info), "sa_dtype",
                 "index 8 is not a dtype: the library has 8 (0 .. 7)");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_dtype(-1, &info), "index -1");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_dtype(0, nullptr), "out is NULL");
  info.struct_size = sizeof(sa_dtype_info) + 8;
  CHECK_SA_FAILS(nullptr, SA_ERR_UNSUPPORTED, sa_dtype(0, &info), "struct_size");
}

TEST_CASE("the dtype table's param, grad and moment roles are what add_param accepts",
          "[schema][dtype]") {
  for (int32_t i = 0; i < sa_num_dtypes(); ++i) {
    sa_dtype_info info = SA_DTYPE_INFO_INIT;
    REQUIRE_SA_OK(nullptr, sa_dtype(i, &info));
    INFO(info.name);
    // With scaling `scaling` (an sa_param_scaling) and, for one other than NONE, a scale
    // tensor as the scaling table describes it (a scale of 1).
    const auto adds = [&](DLDataType param, DLDataType grad, DLDataType moment,
                          int32_t scaling = SA_SCALING_NONE) {
      HostTensor t({256}, param);  // these outlive the optimizer
      sa_param_scaling_info s = SA_PARAM_SCALING_INFO_INIT;
      REQUIRE_SA_OK(nullptr, sa_param_scaling_describe(scaling, &s));
      HostTensor scale({s.block == 0 ? 1 : 256 / s.block}, s.scale_dtype);
      if (s.block == 0) scale.set(0, 1.0f);
      OptimizerPtr opt = make_optimizer();
      int32_t g = -1;
      const sa_group_config group = SA_GROUP_CONFIG_INIT;
      REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &group, &g));
      sa_param_options options = param_options(grad, moment, SA_MASTER_AUTO);
      options.scaling = scaling;
      options.scale = scaling == SA_SCALING_NONE ? nullptr : scale.versioned();
      return sa_optimizer_add_param(opt.get(), "p", g, t.versioned(), nullptr, &options, nullptr) ==
             SA_OK;
    };
    bool param_added = false;  // with some scaling of the table (NONE included)
    for (int32_t s = 0; s < sa_num_param_scalings(); ++s)
      param_added = param_added || adds(info.dtype, kDefaultDtype, kDefaultDtype, s);
    CHECK(param_added == ((info.roles & SA_DTYPE_PARAM) != 0));
    CHECK(adds(kFloat32, info.dtype, kDefaultDtype) == ((info.roles & SA_DTYPE_GRAD) != 0));
    CHECK(adds(kFloat32, kDefaultDtype, info.dtype) == ((info.roles & SA_DTYPE_MOMENT) != 0));
  }
}
