// tests/test_struct_fields.cpp — the field tables of the option structs other than
// sa_group_config (tests/test_schema.cpp has that one), as bindings read them
// (sa_struct_num_fields, sa_struct_field, sa_struct_default): each names every member
// where the C compiler puts it, with its type; the defaults are the SA_*_INIT macros'; and
// the calls that take a struct refuse exactly the numbers outside the bounds it states,
// naming the field in the table's words. References: this file's own list of the members
// (from shardadam.h), offsetof and sizeof, the SA_*_INIT macros, and the calls' statuses.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace {

using namespace sa_test;

struct Member {
  const char* name;
  std::size_t offset;
  std::size_t size;
  int32_t type;
};

#define SA_MEMBER(S, name, type) Member{#name, offsetof(S, name), sizeof(S::name), type}

// Every member of each struct after struct_size, in order, as shardadam.h declares it.
struct Kind {
  int32_t kind;
  const char* name;
  std::size_t size;
  std::vector<Member> members;
  std::vector<unsigned char> init;  // the struct as its SA_*_INIT macro gives it
};

template <class S>
std::vector<unsigned char> bytes_of(const S& s) {
  std::vector<unsigned char> out(sizeof s);
  std::memcpy(out.data(), &s, sizeof s);
  return out;
}

std::vector<Kind> kinds() {
  const sa_step_args step = SA_STEP_ARGS_INIT;
  const sa_optimizer_config config = SA_OPTIMIZER_CONFIG_INIT;
  const sa_param_options param = SA_PARAM_OPTIONS_INIT;
  const sa_import_options import = SA_IMPORT_OPTIONS_INIT;
  return {
      {SA_STRUCT_STEP_ARGS,
       "sa_step_args",
       sizeof(sa_step_args),
       {SA_MEMBER(sa_step_args, inv_grad_scale, SA_FIELD_POINTER),
        SA_MEMBER(sa_step_args, found_inf, SA_FIELD_POINTER),
        SA_MEMBER(sa_step_args, skipped, SA_FIELD_POINTER),
        SA_MEMBER(sa_step_args, max_grad_norm, SA_FIELD_DOUBLE),
        SA_MEMBER(sa_step_args, norm_type, SA_FIELD_INT32),
        SA_MEMBER(sa_step_args, grad_norm, SA_FIELD_POINTER),
        SA_MEMBER(sa_step_args, host_grad_norm, SA_FIELD_POINTER)},
       bytes_of(step)},
      {SA_STRUCT_OPTIMIZER_CONFIG,
       "sa_optimizer_config",
       sizeof(sa_optimizer_config),
       {SA_MEMBER(sa_optimizer_config, num_threads, SA_FIELD_INT32),
        SA_MEMBER(sa_optimizer_config, cpu_simd, SA_FIELD_FLAG)},
       bytes_of(config)},
      {SA_STRUCT_PARAM_OPTIONS,
       "sa_param_options",
       sizeof(sa_param_options),
       {SA_MEMBER(sa_param_options, grad_dtype, SA_FIELD_DTYPE),
        SA_MEMBER(sa_param_options, moment_dtype, SA_FIELD_DTYPE),
        SA_MEMBER(sa_param_options, master, SA_FIELD_INT32),
        SA_MEMBER(sa_param_options, scale, SA_FIELD_POINTER),
        SA_MEMBER(sa_param_options, amax, SA_FIELD_POINTER),
        SA_MEMBER(sa_param_options, scaling, SA_FIELD_INT32),
        SA_MEMBER(sa_param_options, margin, SA_FIELD_INT32),
        SA_MEMBER(sa_param_options, state_placement, SA_FIELD_INT32)},
       bytes_of(param)},
      {SA_STRUCT_IMPORT_OPTIONS,
       "sa_import_options",
       sizeof(sa_import_options),
       {SA_MEMBER(sa_import_options, staging_bytes, SA_FIELD_UINT64),
        SA_MEMBER(sa_import_options, allow_missing, SA_FIELD_FLAG),
        SA_MEMBER(sa_import_options, allow_unexpected, SA_FIELD_FLAG),
        SA_MEMBER(sa_import_options, restore_groups, SA_FIELD_FLAG),
        SA_MEMBER(sa_import_options, read_once, SA_FIELD_FLAG)},
       bytes_of(import)},
  };
}

sa_field_info field(int32_t kind, int32_t index) {
  sa_field_info info = SA_FIELD_INFO_INIT;
  REQUIRE_SA_OK(nullptr, sa_struct_field(kind, index, &info));
  return info;
}

// `value` written into a copy of `init` at member m (an int32_t or a uint64_t).
std::vector<unsigned char> with_value(std::vector<unsigned char> s, const Member& m, int64_t value) {
  if (m.size == 4) {
    const auto v = static_cast<int32_t>(value);
    std::memcpy(s.data() + m.offset, &v, sizeof v);
  } else {
    std::memcpy(s.data() + m.offset, &value, sizeof value);
  }
  return s;
}

}  // namespace

TEST_CASE("the field tables name every member of each option struct, where the compiler put it",
          "[schema]") {
  for (const Kind& k : kinds()) {
    INFO(k.name);
    REQUIRE(sa_struct_num_fields(k.kind) == static_cast<int32_t>(k.members.size()));
    for (std::size_t i = 0; i < k.members.size(); ++i) {
      const Member& m = k.members[i];
      const sa_field_info f = field(k.kind, static_cast<int32_t>(i));
      INFO("field " << i);
      CHECK(std::string(f.name) == m.name);
      CHECK(f.offset == m.offset);
      CHECK(f.type == m.type);
      CHECK(f.rule != nullptr);
      CHECK(f.doc != nullptr);
      CHECK(f.fixed_with_params == 0);
      // A number's default is the INIT macro's value; a pointer's NULL; a dtype's unset.
      if (m.type == SA_FIELD_INT32 || m.type == SA_FIELD_FLAG) {
        int32_t v;
        std::memcpy(&v, k.init.data() + m.offset, sizeof v);
        CHECK(f.default_value == v);
        CHECK(f.min <= v);
        CHECK(v <= f.max);
      }
      if (m.type == SA_FIELD_DTYPE) CHECK(f.dtype_role != 0);
    }
    // The last member ends where the struct does, padding aside: none is missing.
    const Member& last = k.members.back();
    CHECK(k.size - (last.offset + last.size) < 8);
  }
  // The group config is a kind too, with its own table (tests/test_schema.cpp).
  CHECK(sa_struct_num_fields(SA_STRUCT_GROUP_CONFIG) == sa_group_config_num_fields());
  CHECK(std::string(field(SA_STRUCT_GROUP_CONFIG, 0).name) == "lr");
  CHECK(std::string(field(SA_STRUCT_PARAM_OPTIONS, 0).name) == "grad_dtype");
  CHECK(field(SA_STRUCT_PARAM_OPTIONS, 0).dtype_role == SA_DTYPE_GRAD);
  CHECK(field(SA_STRUCT_PARAM_OPTIONS, 1).dtype_role == SA_DTYPE_MOMENT);
  // Unknown kinds and indices are refused.
  sa_field_info info = SA_FIELD_INFO_INIT;
  CHECK(sa_struct_num_fields(99) == 0);
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_struct_field(99, 0, &info),
                 "struct kind 99 is not an sa_struct_kind");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_struct_field(SA_STRUCT_IMPORT_OPTIONS, 5, &info),
                 "index 5 is not a field: sa_import_options has 5");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                 sa_struct_field(SA_STRUCT_PARAM_OPTIONS, 0, nullptr), "out is NULL");
}

TEST_CASE("sa_struct_default writes each struct's SA_*_INIT, as far as its struct_size reaches",
          "[schema]") {
  for (const Kind& k : kinds()) {
    INFO(k.name);
    std::vector<unsigned char> out(k.size + 16, 0xAB);
    const std::size_t size = k.size;
    std::memcpy(out.data(), &size, sizeof size);
    REQUIRE_SA_OK(nullptr, sa_struct_default(k.kind, out.data()));
    for (const Member& m : k.members) {
      INFO(m.name);
      CHECK(std::memcmp(out.data() + m.offset, k.init.data() + m.offset, m.size) == 0);
    }
    CHECK(out[k.size] == 0xAB);  // nothing past the struct
    // An older caller's shorter struct: the fields it has, its struct_size kept.
    const Member& first = k.members.front();
    std::vector<unsigned char> short_struct(k.size, 0xAB);
    const std::size_t short_size = first.offset + first.size;
    std::memcpy(short_struct.data(), &short_size, sizeof short_size);
    REQUIRE_SA_OK(nullptr, sa_struct_default(k.kind, short_struct.data()));
    std::size_t kept = 0;
    std::memcpy(&kept, short_struct.data(), sizeof kept);
    CHECK(kept == short_size);
    CHECK(std::memcmp(short_struct.data() + first.offset, k.init.data() + first.offset, first.size) == 0);
    CHECK(short_struct[short_size] == 0xAB);
    // A newer caller's longer one is refused.
    std::vector<unsigned char> longer(k.size + 8, 0);
    const std::size_t long_size = k.size + 8;
    std::memcpy(longer.data(), &long_size, sizeof long_size);
    CHECK_SA_FAILS(nullptr, SA_ERR_UNSUPPORTED, sa_struct_default(k.kind, longer.data()),
                   "newer shardadam.h");
  }
  sa_group_config g{};
  g.struct_size = sizeof g;
  REQUIRE_SA_OK(nullptr, sa_struct_default(SA_STRUCT_GROUP_CONFIG, &g));
  const sa_group_config init = SA_GROUP_CONFIG_INIT;
  CHECK(g.lr == init.lr);
  CHECK(g.beta2 == init.beta2);
  CHECK(g.amsgrad == init.amsgrad);
  std::size_t tiny = 0;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_struct_default(SA_STRUCT_PARAM_OPTIONS, &tiny),
                 "struct_size 0 is too small");
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_struct_default(42, &tiny), "struct kind 42");
}

TEST_CASE("the calls taking an option struct refuse the numbers its table rules out, by name",
          "[schema][errors]") {
  HostTensor w({64}, kFloat32);  // never added: every add below is refused
  for (const Kind& k : kinds()) {
    for (std::size_t i = 0; i < k.members.size(); ++i) {
      const Member& m = k.members[i];
      if (m.type != SA_FIELD_INT32 && m.type != SA_FIELD_FLAG) continue;
      const sa_field_info f = field(k.kind, static_cast<int32_t>(i));
      for (const int64_t bad : {static_cast<int64_t>(f.min) - 1, static_cast<int64_t>(f.max) + 1}) {
        if (bad > INT32_MAX) continue;  // no int32_t lies above the bound
        INFO(k.name << "." << m.name << " = " << bad);
        const std::vector<unsigned char> s = with_value(k.init, m, bad);
        const std::string said = std::string(m.name) + " is " + std::to_string(bad) +
                                 "; it must be " + f.rule;
        switch (k.kind) {
          case SA_STRUCT_OPTIMIZER_CONFIG: {
            sa_optimizer* opt = nullptr;
            CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                           sa_optimizer_create(reinterpret_cast<const sa_optimizer_config*>(s.data()), &opt),
                           "config: " + said);
            CHECK(opt == nullptr);
            break;
          }
          case SA_STRUCT_PARAM_OPTIONS: {
            OptimizerPtr opt = make_optimizer();
            const sa_group_config g = SA_GROUP_CONFIG_INIT;
            REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &g, nullptr));
            CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                           sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), nullptr,
                                                  reinterpret_cast<const sa_param_options*>(s.data()), nullptr),
                           "param 'w': options." + said);
            CHECK(sa_optimizer_num_params(opt.get()) == 0);
            CHECK(w.deleter_calls() == 0);
            break;
          }
          case SA_STRUCT_STEP_ARGS: {
            HostTensor p({8}, kFloat32), gr({8}, kFloat32);  // outlive the optimizer
            OptimizerPtr opt = make_optimizer();
            const sa_group_config g = SA_GROUP_CONFIG_INIT;
            REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &g, nullptr));
            REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "p", 0, p.versioned(), nullptr,
                                                            nullptr, nullptr));
            const DLTensor d = gr.dl();
            REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &d));
            sa_step_args args = SA_STEP_ARGS_INIT;
            std::memcpy(&args, s.data(), sizeof args);
            args.max_grad_norm = 1.0;  // norm_type counts only with a norm
            CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                           sa_optimizer_step(opt.get(), &args, nullptr), "args->" + said);
            CHECK(step_count(opt.get(), 0) == 0);
            break;
          }
          case SA_STRUCT_IMPORT_OPTIONS: {
            OptimizerPtr opt = make_optimizer();
            CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                           sa_optimizer_import(opt.get(), 0, nullptr,
                                               reinterpret_cast<const sa_import_options*>(s.data())),
                           "options->" + said);
            break;
          }
          default:
            FAIL("a kind this test does not know");
        }
      }
    }
  }
}
