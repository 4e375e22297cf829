// src/api.cpp — the C ABI. Each entry point checks its arguments, calls the core inside
// guarded(), and turns an exception into a status plus the handle's last-error text.
// No optimizer logic lives here.
#include <cstddef>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "api_support.hpp"
#include "backend.hpp"
#include "backends/cuda_module.hpp"
#include "comm/comm.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "fields.hpp"
#include "layout.hpp"
#include "optimizer.hpp"
#include "options.hpp"
#include "schema.hpp"
#include "shardadam/shardadam.h"

namespace {

// Option structs grow at the end, and a caller of an older header passes the struct_size
// it knows, which covers that struct's tail padding (undefined bytes): a field added must
// begin past it. sa_param_options as version 0.2 had it:
struct ParamOptions02 {
  std::size_t struct_size;
  DLDataType grad_dtype;
  DLDataType moment_dtype;
  int32_t master;
};
static_assert(offsetof(sa_param_options, scale) >= sizeof(ParamOptions02),
              "sa_param_options: the fields after `master` begin past 0.2's tail padding");

using sa::api::guarded;
using sa::api::require;
using sa::api::with_optimizer;

thread_local std::string t_last_error;

// A state view: owns a reference to the state buffer and the shape array.
struct StateView {
  DLManagedTensorVersioned tensor;
  std::shared_ptr<sa::Buffer> buffer;
  sa::Dims shape;
};

void delete_state_view(DLManagedTensorVersioned* self) {
  delete static_cast<StateView*>(self->manager_ctx);
}

}  // namespace

sa_status sa::api::record(const sa_optimizer* opt, const char* fn, sa_status status,
                          const char* what) {
  std::string message = std::string(fn) + ": " + what;
  (opt ? opt->last_error : t_last_error) = std::move(message);
  return status;
}

namespace {

// The keys of the states `states_of()` gives into keys[0..capacity), their count into
// *count; the arguments are checked first.
template <class StatesOf, class Key>
void list_keys(const StatesOf& states_of, const Key& key_of, const char** keys, int32_t capacity,
               int32_t* count) {
  require(count != nullptr, "count is NULL");
  require(capacity >= 0, "capacity is negative");
  require(keys != nullptr || capacity == 0, "keys is NULL but capacity is not 0");
  const auto states = states_of();
  for (std::size_t i = 0; i < states.size() && i < static_cast<std::size_t>(capacity); ++i)
    keys[i] = key_of(states[i]);
  *count = static_cast<int32_t>(states.size());
}

}  // namespace

extern "C" {

int sa_version(void) { return SA_VERSION_NUMBER; }

const char* sa_build_info(void) {
  static const std::string info = sa::concat(
      "shardadam ", SA_VERSION_MAJOR, ".", SA_VERSION_MINOR, ".", SA_VERSION_PATCH,
      "; cpu: highway (", sa::cpu_simd_target(), " dispatched); cuda: ", sa::cuda_module_status(),
      sa::nccl_available() ? "; nccl: built (loaded on first use)" : "; nccl: not available");
  return info.c_str();
}

const char* sa_status_string(sa_status status) {
  switch (status) {
    case SA_OK:
      return "SA_OK";
    case SA_ERR_INVALID_ARGUMENT:
      return "SA_ERR_INVALID_ARGUMENT";
    case SA_ERR_UNSUPPORTED:
      return "SA_ERR_UNSUPPORTED";
    case SA_ERR_OUT_OF_MEMORY:
      return "SA_ERR_OUT_OF_MEMORY";
    case SA_ERR_DEVICE:
      return "SA_ERR_DEVICE";
    case SA_ERR_COMM:
      return "SA_ERR_COMM";
    case SA_ERR_IO:
      return "SA_ERR_IO";
    case SA_ERR_FORMAT:
      return "SA_ERR_FORMAT";
    case SA_ERR_MISMATCH:
      return "SA_ERR_MISMATCH";
    case SA_ERR_STATE:
      return "SA_ERR_STATE";
    case SA_ERR_INTERNAL:
      return "SA_ERR_INTERNAL";
  }
  return "unknown sa_status";
}

const char* sa_last_error(void) { return t_last_error.c_str(); }

const char* sa_optimizer_last_error(const sa_optimizer* opt) {
  return opt ? opt->last_error.c_str() : t_last_error.c_str();
}

sa_status sa_layout_local_box(const sa_layout* layout, int64_t* local_shape,
                              int64_t* global_offset) {
  return guarded(nullptr, "sa_layout_local_box", [&] {
    require(layout != nullptr, "layout is NULL");
    require(local_shape != nullptr && global_offset != nullptr,
            "local_shape or global_offset is NULL");
    const sa::Layout box = sa::resolve_mesh_layout(*layout, "layout");
    std::copy(box.local_shape.begin(), box.local_shape.end(), local_shape);
    std::copy(box.global_offset.begin(), box.global_offset.end(), global_offset);
  });
}

sa_status sa_optimizer_create(const sa_optimizer_config* config, sa_optimizer** out) {
  if (out != nullptr) *out = nullptr;
  return guarded(nullptr, "sa_optimizer_create", [&] {
    require(out != nullptr, "out is NULL");
    const sa_optimizer_config defaults = SA_OPTIMIZER_CONFIG_INIT;
    *out = new sa_optimizer(sa::read_options(config, defaults, "config"));
  });
}

void sa_optimizer_destroy(sa_optimizer* opt) { delete opt; }

sa_status sa_optimizer_add_group(sa_optimizer* opt, const sa_group_config* config, int32_t* group) {
  return with_optimizer(opt, "sa_optimizer_add_group", [&] {
    require(config != nullptr, "config is NULL");
    const int32_t index =
        opt->core.add_group(sa::read_options(config, sa::schema::default_group_config(), "config"));
    if (group) *group = index;
  });
}

sa_status sa_group_config_default(sa_group_config* out) {
  return guarded(nullptr, "sa_group_config_default", [&] {
    require(out != nullptr, "out is NULL");
    sa::write_options(out, sa::schema::default_group_config(), "out");
  });
}

int32_t sa_group_config_num_fields(void) { return sa::num_fields(SA_STRUCT_GROUP_CONFIG); }

namespace {

// sa_struct_field, as the entry point `fn` reports it.
sa_status describe_field(const char* fn, int32_t kind, int32_t index, sa_field_info* out) {
  return guarded(nullptr, fn, [&] {
    require(out != nullptr, "out is NULL");
    sa::write_options(out, sa::describe_field(kind, index), "out");
  });
}

}  // namespace

sa_status sa_group_config_field(int32_t index, sa_field_info* out) {
  return describe_field("sa_group_config_field", SA_STRUCT_GROUP_CONFIG, index, out);
}

int32_t sa_struct_num_fields(int32_t kind) { return sa::num_fields(kind); }

sa_status sa_struct_field(int32_t kind, int32_t index, sa_field_info* out) {
  return describe_field("sa_struct_field", kind, index, out);
}

sa_status sa_struct_default(int32_t kind, void* out) {
  return guarded(nullptr, "sa_struct_default", [&] {
    require(out != nullptr, "out is NULL");
    sa::write_defaults(kind, out);
  });
}

int32_t sa_num_dtypes(void) { return sa::num_dtypes(); }

sa_status sa_dtype(int32_t index, sa_dtype_info* out) {
  return guarded(nullptr, "sa_dtype", [&] {
    require(out != nullptr, "out is NULL");
    const int32_t n = sa::num_dtypes();
    if (index < 0 || index >= n)
      sa::fail(SA_ERR_INVALID_ARGUMENT, "index ", index, " is not a dtype: the library has ", n,
               " (0 .. ", n - 1, ")");
    const sa::DtypeDescription d = sa::describe_dtype(index);
    sa_dtype_info info = SA_DTYPE_INFO_INIT;
    info.name = d.name;
    info.dtype = d.dtype;
    info.roles = static_cast<int32_t>(d.roles);
    info.safetensors_name = d.safetensors_name;
    info.doc = d.doc;
    sa::write_options(out, info, "out");
  });
}

int32_t sa_num_param_scalings(void) { return sa::num_param_scalings(); }

sa_status sa_param_scaling_describe(int32_t index, sa_param_scaling_info* out) {
  return guarded(nullptr, "sa_param_scaling_describe", [&] {
    require(out != nullptr, "out is NULL");
    const int32_t n = sa::num_param_scalings();
    if (index < 0 || index >= n)
      sa::fail(SA_ERR_INVALID_ARGUMENT, "index ", index,
               " is not a param scaling: the library has ", n, " (0 .. ", n - 1, ")");
    const sa::ScalingDescription d = sa::describe_scaling(index);
    sa_param_scaling_info info = SA_PARAM_SCALING_INFO_INIT;
    info.value = index;
    info.name = d.name;
    info.block = d.block;
    info.scale_dtype = sa::dl_dtype_of(d.scale_type);
    info.step_writes_scale = d.step_writes ? 1 : 0;
    info.doc = d.doc;
    sa::write_options(out, info, "out");
  });
}

int32_t sa_step_args_num_fields(void) { return sa::num_fields(SA_STRUCT_STEP_ARGS); }

sa_status sa_step_args_field(int32_t index, sa_field_info* out) {
  return describe_field("sa_step_args_field", SA_STRUCT_STEP_ARGS, index, out);
}

int32_t sa_optimizer_num_groups(const sa_optimizer* opt) {
  return opt ? opt->core.num_groups() : 0;
}

sa_status sa_optimizer_get_group(const sa_optimizer* opt, int32_t group, sa_group_config* out) {
  return with_optimizer(opt, "sa_optimizer_get_group", [&] {
    require(out != nullptr, "out is NULL");
    sa::write_options(out, opt->core.group(group, "group").config, "out");
  });
}

sa_status sa_optimizer_set_group(sa_optimizer* opt, int32_t group, const sa_group_config* config) {
  return with_optimizer(opt, "sa_optimizer_set_group", [&] {
    require(config != nullptr, "config is NULL");
    // Fields the caller's (older) struct lacks keep the group's current values.
    const sa_group_config current = opt->core.group(group, "group").config;
    opt->core.set_group(group, sa::read_options(config, current, "config"));
  });
}

namespace {

void require_fields(int32_t n, const void* names, const void* values) {
  require(n >= 0, "n is negative");
  require(n == 0 || names != nullptr, "names is NULL");
  require(n == 0 || values != nullptr, "values is NULL");
}

}  // namespace

sa_status sa_optimizer_add_group_fields(sa_optimizer* opt, int32_t n, const char* const* names,
                                        const double* values, int32_t* group) {
  return with_optimizer(opt, "sa_optimizer_add_group_fields", [&] {
    require_fields(n, names, values);
    const int32_t index =
        opt->core.add_group(sa::with_fields(sa::schema::default_group_config(), n, names, values));
    if (group) *group = index;
  });
}

sa_status sa_optimizer_set_group_fields(sa_optimizer* opt, int32_t group, int32_t n,
                                        const char* const* names, const double* values) {
  return with_optimizer(opt, "sa_optimizer_set_group_fields", [&] {
    require_fields(n, names, values);
    const sa_group_config current = opt->core.group(group, "group").config;
    opt->core.set_group(group, sa::with_fields(current, n, names, values));
  });
}

sa_status sa_optimizer_get_group_fields(const sa_optimizer* opt, int32_t group, int32_t n,
                                        const char* const* names, double* values) {
  return with_optimizer(opt, "sa_optimizer_get_group_fields", [&] {
    require_fields(n, names, values);
    sa::get_fields(opt->core.group(group, "group").config, n, names, values);
  });
}

sa_status sa_optimizer_set_lr(sa_optimizer* opt, int32_t group, double lr) {
  return with_optimizer(opt, "sa_optimizer_set_lr", [&] { opt->core.set_lr(group, lr); });
}

sa_status sa_optimizer_get_step(const sa_optimizer* opt, int32_t group, int64_t* step) {
  return with_optimizer(opt, "sa_optimizer_get_step", [&] {
    require(step != nullptr, "step is NULL");
    *step = opt->core.get_step(group);
  });
}

sa_status sa_optimizer_set_step(sa_optimizer* opt, int32_t group, int64_t step) {
  return with_optimizer(opt, "sa_optimizer_set_step", [&] { opt->core.set_step(group, step); });
}

sa_status sa_optimizer_add_param(sa_optimizer* opt, const char* name, int32_t group,
                                 DLManagedTensorVersioned* local_shard, const sa_layout* layout,
                                 const sa_param_options* options, int64_t* param) {
  return with_optimizer(opt, "sa_optimizer_add_param", [&] {
    const int64_t index = opt->core.add_param({name, group, local_shard, nullptr, layout, options});
    if (param) *param = index;
  });
}

sa_status sa_optimizer_add_param_legacy(sa_optimizer* opt, const char* name, int32_t group,
                                        DLManagedTensor* local_shard, const sa_layout* layout,
                                        const sa_param_options* options, int64_t* param) {
  return with_optimizer(opt, "sa_optimizer_add_param_legacy", [&] {
    const int64_t index = opt->core.add_param({name, group, nullptr, local_shard, layout, options});
    if (param) *param = index;
  });
}

int64_t sa_optimizer_num_params(const sa_optimizer* opt) {
  return opt ? opt->core.num_params() : 0;
}

sa_status sa_optimizer_find_param(const sa_optimizer* opt, const char* name, int64_t* param) {
  return with_optimizer(opt, "sa_optimizer_find_param", [&] {
    require(name != nullptr && param != nullptr, "name or param is NULL");
    *param = opt->core.find_param(name);
  });
}

sa_status sa_optimizer_param_info(const sa_optimizer* opt, int64_t param, sa_param_info* out) {
  return with_optimizer(opt, "sa_optimizer_param_info", [&] {
    require(out != nullptr, "out is NULL");
    const sa::Param& p = opt->core.param(param, "param");
    sa_param_info info = SA_PARAM_INFO_INIT;
    info.name = p.name.c_str();
    info.group = p.group;
    info.ndim = static_cast<int32_t>(p.layout.local_shape.size());
    info.local_shape = p.layout.local_shape.data();
    info.global_shape = p.layout.global_shape.data();
    info.global_offset = p.layout.global_offset.data();
    info.numel = p.numel;
    info.param_dtype = sa::dl_dtype_of(p.param_type);
    info.grad_dtype = sa::dl_dtype_of(p.grad_type);
    info.moment_dtype = sa::dl_dtype_of(p.moment_type);
    info.master = p.master == sa::MasterKind::none   ? SA_MASTER_NONE
                  : p.master == sa::MasterKind::fp32 ? SA_MASTER_FP32
                                                     : SA_MASTER_REMAINDER;
    info.device = p.device;
    info.scaling = static_cast<int32_t>(p.scaling);
    info.margin = p.scale.margin;
    info.state_placement = static_cast<int32_t>(p.placement);
    sa::write_options(out, info, "out");
  });
}

sa_status sa_optimizer_set_grad(sa_optimizer* opt, int64_t param, const DLTensor* grad) {
  return with_optimizer(opt, "sa_optimizer_set_grad", [&] {
    require(grad != nullptr,
            "grad is NULL (for a param without a grad, use sa_optimizer_clear_grad)");
    opt->core.set_grad(param, *grad);
  });
}

sa_status sa_optimizer_set_grad_ptrs(sa_optimizer* opt, int64_t n, const void* const* ptrs) {
  return with_optimizer(opt, "sa_optimizer_set_grad_ptrs",
                        [&] { opt->core.set_grad_ptrs(n, ptrs); });
}

sa_status sa_optimizer_set_grads(sa_optimizer* opt, int64_t n, const DLTensor* const* grads) {
  return with_optimizer(opt, "sa_optimizer_set_grads", [&] {
    require(n == 0 || grads != nullptr, "grads is NULL");
    opt->core.set_grads(n, grads);
  });
}

sa_status sa_optimizer_clear_grad(sa_optimizer* opt, int64_t param) {
  return with_optimizer(opt, "sa_optimizer_clear_grad", [&] { opt->core.clear_grad(param); });
}

sa_status sa_optimizer_get_param_steps(const sa_optimizer* opt, int64_t first, int64_t n,
                                       int64_t* steps) {
  return with_optimizer(opt, "sa_optimizer_get_param_steps", [&] {
    require(n == 0 || steps != nullptr, "steps is NULL");
    opt->core.get_param_steps(first, n, steps);
  });
}

sa_status sa_optimizer_set_param_steps(sa_optimizer* opt, int64_t first, int64_t n,
                                       const int64_t* steps) {
  return with_optimizer(opt, "sa_optimizer_set_param_steps", [&] {
    require(n == 0 || steps != nullptr, "steps is NULL");
    opt->core.set_param_steps(first, n, steps);
  });
}

sa_status sa_optimizer_recast_params(sa_optimizer* opt, int64_t first, int64_t n) {
  return with_optimizer(opt, "sa_optimizer_recast_params",
                        [&] { opt->core.recast_params(first, n); });
}

sa_status sa_optimizer_reset_masters(sa_optimizer* opt, int64_t first, int64_t n) {
  return with_optimizer(opt, "sa_optimizer_reset_masters",
                        [&] { opt->core.reset_masters(first, n); });
}

sa_status sa_optimizer_step(sa_optimizer* opt, const sa_step_args* args, void* stream) {
  return with_optimizer(opt, "sa_optimizer_step", [&] {
    const sa_step_args defaults = SA_STEP_ARGS_INIT;
    const sa_step_args a = sa::read_options(args, defaults, "args");
    const std::optional<bool> skipped = opt->core.step(a, stream);
    if (a.skipped == nullptr && a.host_grad_norm == nullptr) return;
    // Only ask the backend (which may synchronize) when the host cannot know.
    const bool known = skipped.has_value() && a.host_grad_norm == nullptr;
    const sa::StepReport report = known ? sa::StepReport{*skipped, 0.0} : opt->core.last_report();
    if (a.skipped) *a.skipped = report.skipped ? 1 : 0;
    if (a.host_grad_norm) *a.host_grad_norm = report.norm;
  });
}

sa_status sa_optimizer_step_params(sa_optimizer* opt, int64_t n, const int64_t* params,
                                   const sa_step_args* args, void* stream) {
  return with_optimizer(opt, "sa_optimizer_step_params", [&] {
    const sa_step_args defaults = SA_STEP_ARGS_INIT;
    const sa_step_args a = sa::read_options(args, defaults, "args");
    const std::optional<bool> skipped = opt->core.step_params(n, params, a, stream);
    if (a.skipped == nullptr) return;
    *a.skipped = (skipped.has_value() ? *skipped : opt->core.last_report().skipped) ? 1 : 0;
  });
}

sa_status sa_optimizer_flush(sa_optimizer* opt, void* stream) {
  return with_optimizer(opt, "sa_optimizer_flush", [&] { opt->core.flush(stream); });
}

sa_status sa_optimizer_get_moment_values(const sa_optimizer* opt, int64_t param, const char* key,
                                         const DLTensor* out) {
  return with_optimizer(opt, "sa_optimizer_get_moment_values", [&] {
    require(key != nullptr, "key is NULL");
    require(out != nullptr, "out is NULL");
    opt->core.get_moment_values(param, key, *out);
  });
}

sa_status sa_optimizer_set_moment_values(sa_optimizer* opt, int64_t param, const char* key,
                                         const DLTensor* values) {
  return with_optimizer(opt, "sa_optimizer_set_moment_values", [&] {
    require(key != nullptr, "key is NULL");
    require(values != nullptr, "values is NULL");
    opt->core.set_moment_values(param, key, *values);
  });
}

sa_status sa_optimizer_state_keys(const sa_optimizer* opt, int64_t param, const char** keys,
                                  int32_t capacity, int32_t* count) {
  return with_optimizer(opt, "sa_optimizer_state_keys", [&] {
    list_keys([&] { return sa::named_states(opt->core.param(param, "param")); },
              [](const sa::NamedState& s) { return s.key; }, keys, capacity, count);
  });
}

sa_status sa_optimizer_checkpoint_keys(const sa_optimizer* opt, int64_t param, const char** keys,
                                       int32_t capacity, int32_t* count) {
  return with_optimizer(opt, "sa_optimizer_checkpoint_keys", [&] {
    list_keys([&] { return sa::file_states(opt->core.param(param, "param")); },
              [](const sa::FileState& f) { return f.state.key; }, keys, capacity, count);
  });
}

sa_status sa_optimizer_moment_keys(const sa_optimizer* opt, int64_t param, const char** keys,
                                   int32_t capacity, int32_t* count) {
  return with_optimizer(opt, "sa_optimizer_moment_keys", [&] {
    list_keys([&] { return sa::moment_states(opt->core.param(param, "param")); },
              [](const sa::FileState& f) { return f.state.key; }, keys, capacity, count);
  });
}

sa_status sa_optimizer_state_view(sa_optimizer* opt, int64_t param, const char* key,
                                  DLManagedTensorVersioned** out) {
  if (out != nullptr) *out = nullptr;
  return with_optimizer(opt, "sa_optimizer_state_view", [&] {
    require(key != nullptr && out != nullptr, "key or out is NULL");
    const sa::Optimizer::StateRef ref = opt->core.state(param, key);
    auto view = std::make_unique<StateView>();
    view->buffer = ref.buffer;
    view->shape = ref.shape;
    DLManagedTensorVersioned& t = view->tensor;
    t.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    t.manager_ctx = view.get();
    t.deleter = delete_state_view;
    t.flags = 0;
    t.dl_tensor.data = ref.buffer->data();
    t.dl_tensor.device = ref.device;
    t.dl_tensor.ndim = static_cast<int32_t>(view->shape.size());
    t.dl_tensor.dtype = ref.dtype;
    t.dl_tensor.shape = view->shape.data();
    t.dl_tensor.strides = nullptr;
    t.dl_tensor.byte_offset = 0;
    *out = &view.release()->tensor;
  });
}

// ---- communicators ---------------------------------------------------------------------

sa_status sa_comm_create_host(const sa_host_comm* callbacks, sa_comm** out) {
  if (out != nullptr) *out = nullptr;
  return guarded(nullptr, "sa_comm_create_host", [&] {
    require(callbacks != nullptr && out != nullptr, "callbacks or out is NULL");
    const sa_host_comm defaults = SA_HOST_COMM_INIT;
    // The handle first: once the communicator exists it owns ctx (release runs with it), so
    // nothing may fail after it is made.
    auto handle = std::make_unique<sa_comm>();
    handle->core = sa::make_host_comm(sa::read_options(callbacks, defaults, "callbacks"));
    *out = handle.release();
  });
}

sa_status sa_nccl_unique_id_create(sa_nccl_unique_id* out) {
  return guarded(nullptr, "sa_nccl_unique_id_create", [&] {
    require(out != nullptr, "out is NULL");
    sa::nccl_unique_id(*out);
  });
}

sa_status sa_comm_create_nccl(const sa_nccl_unique_id* id, int32_t nranks, int32_t rank,
                              int32_t device, sa_comm** out) {
  if (out != nullptr) *out = nullptr;
  return guarded(nullptr, "sa_comm_create_nccl", [&] {
    require(id != nullptr && out != nullptr, "id or out is NULL");
    auto handle = std::make_unique<sa_comm>();
    handle->core = sa::make_nccl_comm(*id, nranks, rank, device);
    *out = handle.release();
  });
}

sa_status sa_comm_wrap_nccl(void* nccl_comm, sa_comm** out) {
  if (out != nullptr) *out = nullptr;
  return guarded(nullptr, "sa_comm_wrap_nccl", [&] {
    require(out != nullptr, "out is NULL");
    auto handle = std::make_unique<sa_comm>();
    handle->core = sa::wrap_nccl_comm(nccl_comm);
    *out = handle.release();
  });
}

sa_status sa_comm_info(const sa_comm* comm, int32_t* rank, int32_t* nranks) {
  return guarded(nullptr, "sa_comm_info", [&] {
    require(comm != nullptr, "comm is NULL");
    if (rank != nullptr) *rank = comm->core->rank();
    if (nranks != nullptr) *nranks = comm->core->nranks();
  });
}

void sa_comm_destroy(sa_comm* comm) { delete comm; }

sa_status sa_optimizer_set_comm(sa_optimizer* opt, sa_comm* comm) {
  return with_optimizer(opt, "sa_optimizer_set_comm",
                        [&] { opt->core.set_comm(comm != nullptr ? comm->core : nullptr); });
}

}  // extern "C"
