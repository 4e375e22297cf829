#include "optimizer.hpp"

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <new>
#include <numeric>
#include <type_traits>

#include "../kernels/block_moment.h"
#include "../kernels/variants.h"
#include "backends/cuda_module.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "moment_values.hpp"
#include "options.hpp"
#include "schema.hpp"

namespace sa {
namespace {

std::string param_context(const std::string& name) { return concat("param '", name, "'"); }

GradSpec grad_spec_of(const Param& p) {
  GradSpec spec;
  spec.dtype = dl_dtype_of(p.grad_type);
  spec.device = p.device;
  spec.ndim = static_cast<int32_t>(p.layout.local_shape.size());
  spec.elem_bytes = static_cast<uint32_t>(elem_size(p.grad_type));
  spec.numel = p.numel;
  if (spec.ndim <= GradSpec::kInlineDims)
    std::copy(p.layout.local_shape.begin(), p.layout.local_shape.end(), spec.shape);
  return spec;
}

// "float32, bfloat16 or float16": the distinct dtypes of `types`, in table order.
template <class Range, class Get>
std::string dtype_list(const Range& rows, Get get) {
  std::vector<ElemType> types;
  std::vector<const char*> names;
  for (const auto& row : rows)
    if (std::find(types.begin(), types.end(), get(row)) == types.end()) {
      types.push_back(get(row));
      names.push_back(elem_name(get(row)));
    }
  return words_list(names);
}

const char* master_name(int32_t requested) {
  switch (requested) {
    case SA_MASTER_NONE:
      return "SA_MASTER_NONE";
    case SA_MASTER_FP32:
      return "SA_MASTER_FP32";
    case SA_MASTER_REMAINDER:
      return "SA_MASTER_REMAINDER";
  }
  return "SA_MASTER_AUTO";
}

static_assert(static_cast<int>(StatePlacement::device) == SA_STATE_ON_DEVICE &&
                  static_cast<int>(StatePlacement::host) == SA_STATE_ON_HOST &&
                  static_cast<int>(StatePlacement::host_cpu_step) == SA_STATE_ON_HOST_CPU_STEP,
              "StatePlacement mirrors sa_state_placement");

// The placement of a param's state on `device`: a CPU param's state is host memory whatever
// it asks for, so it resolves to device (one bucket for all of them).
StatePlacement resolve_placement(int32_t requested, DLDevice device, const std::string& context) {
  if (requested != SA_STATE_ON_DEVICE && requested != SA_STATE_ON_HOST &&
      requested != SA_STATE_ON_HOST_CPU_STEP)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": state_placement is ", requested,
         ", not an sa_state_placement (SA_STATE_ON_DEVICE ", SA_STATE_ON_DEVICE,
         ", SA_STATE_ON_HOST ", SA_STATE_ON_HOST, ", SA_STATE_ON_HOST_CPU_STEP ",
         SA_STATE_ON_HOST_CPU_STEP, ")");
  if (device.device_type == kDLCPU) return StatePlacement::device;
  return static_cast<StatePlacement>(requested);
}

// A param's form from kernels::kParamForms: AUTO picks the dtype's first row.
MasterKind resolve_master(int32_t requested, ElemType param_type, const std::string& context) {
  MasterKind kind{};
  switch (requested) {
    case SA_MASTER_AUTO:
      for (const kernels::ParamForm& form : kernels::kParamForms)
        if (form.param == param_type) return form.master;
      fail(SA_ERR_INTERNAL, context, ": no param form for ", elem_name(param_type));
    case SA_MASTER_NONE:
      kind = MasterKind::none;
      break;
    case SA_MASTER_FP32:
      kind = MasterKind::fp32;
      break;
    case SA_MASTER_REMAINDER:
      kind = MasterKind::remainder;
      break;
    default:
      fail(SA_ERR_INVALID_ARGUMENT, context, ": master is ", requested, ", not an sa_master_kind");
  }
  std::vector<kernels::ParamForm> with_kind;
  for (const kernels::ParamForm& form : kernels::kParamForms) {
    if (form.master != kind) continue;
    if (form.param == param_type) return kind;
    with_kind.push_back(form);
  }
  fail(SA_ERR_UNSUPPORTED, context, ": master ", master_name(requested), " needs a ",
       dtype_list(with_kind, [](const kernels::ParamForm& f) { return f.param; }), " param, not ",
       elem_name(param_type));
}

// An optional dtype option: unset (all zero) is `fallback`, else one of `table`.
template <std::size_t N>
ElemType resolve_optional_dtype(DLDataType requested, ElemType fallback, const ElemType (&table)[N],
                                const std::string& context, const char* field) {
  if (requested.bits == 0 && requested.code == 0 && requested.lanes == 0) return fallback;
  const auto type = elem_type_of(requested);
  if (!type || !kernels::in_table(table, *type))
    fail(SA_ERR_UNSUPPORTED, context, ": ", field, " ", dtype_name(requested),
         " is not supported; use ", dtype_list(table, [](ElemType t) { return t; }));
  return *type;
}

// "SA_SCALING_MXFP8": a scaling as the C ABI names it.
std::string scaling_c_name(kernels::ParamScaling scaling) {
  std::string name = describe_scaling(static_cast<int32_t>(scaling)).name;
  for (char& c : name) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return "SA_SCALING_" + name;
}

// A param's scaling: one of kernels::kParamForms' for its dtype and master (fp8 params
// name one; others take none).
kernels::ParamScaling resolve_scaling(int32_t requested, ElemType param_type, MasterKind master,
                                      const std::string& context) {
  if (requested < 0 || requested >= kernels::kNumParamScalings)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": scaling is ", requested, ", not an sa_param_scaling");
  const auto scaling = static_cast<kernels::ParamScaling>(requested);
  std::vector<std::string> fits;  // the scalings of this dtype's forms
  for (const kernels::ParamForm& form : kernels::kParamForms) {
    if (form.param != param_type || form.master != master) continue;
    if (form.scaling == scaling) return scaling;
    fits.push_back(scaling_c_name(form.scaling));
  }
  if (scaling == kernels::ParamScaling::none)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": a ", elem_name(param_type),
         " param needs a scaling (sa_param_options.scaling): ", words_list(fits));
  std::vector<kernels::ParamForm> scaled;
  for (const kernels::ParamForm& form : kernels::kParamForms)
    if (form.scaling == scaling) scaled.push_back(form);
  fail(SA_ERR_INVALID_ARGUMENT, context, ": scaling ", scaling_c_name(scaling), " is for ",
       dtype_list(scaled, [](const kernels::ParamForm& f) { return f.param; }), " params, not ",
       elem_name(param_type));
}

// One of the scale tensors of sa_param_options: a DLPack 1.x tensor on the param's device,
// C-contiguous, of `dtype` and `shape`, writable when the step writes it.
void* checked_scale_tensor(const DLManagedTensorVersioned& t, const char* field, ElemType dtype,
                           const Dims& shape, bool written, DLDevice device,
                           const std::string& context) {
  const std::string what = concat(context, ": ", field);
  if (t.version.major != DLPACK_MAJOR_VERSION)
    fail(SA_ERR_UNSUPPORTED, what, " is a DLPack ", t.version.major, ".", t.version.minor,
         " tensor; this library reads DLPack ", DLPACK_MAJOR_VERSION, ".x");
  if (written && (t.flags & DLPACK_FLAG_BITMASK_READ_ONLY))
    fail(SA_ERR_INVALID_ARGUMENT, what,
         " is read-only (DLPACK_FLAG_BITMASK_READ_ONLY); the step writes it");
  const TensorRef ref = read_tensor(t.dl_tensor, what);
  if (!same_device(ref.device, device))
    fail(SA_ERR_MISMATCH, what, " is on ", device_name(ref.device), " but the param is on ",
         device_name(device));
  if (!same_dtype(ref.dtype, dl_dtype_of(dtype)))
    fail(SA_ERR_INVALID_ARGUMENT, what, " is ", dtype_name(ref.dtype), "; it must be ",
         elem_name(dtype));
  const bool one = shape.empty();  // a scalar: any shape of one element
  if (one ? ref.numel != 1 : ref.shape != shape)
    fail(SA_ERR_INVALID_ARGUMENT, what, " has shape ", format_dims(ref.shape), "; it must ",
         one ? std::string("hold one element") : concat("be ", format_dims(shape)));
  return ref.data;
}

// Checks the scale tensors of an fp8 param against its scaling and layout, and returns
// their data. Blocks run along the last dim: every rank's box must hold whole blocks.
kernels::ParamScale checked_scales(const sa_param_options& options, kernels::ParamScaling scaling,
                                   const Layout& layout, DLDevice device,
                                   const std::string& context) {
  kernels::ParamScale scale{};
  if (options.margin != 0 && !kernels::is_current(scaling))
    fail(SA_ERR_INVALID_ARGUMENT, context, ": options.margin is ", options.margin,
         ", but only SA_SCALING_CURRENT and SA_SCALING_CURRENT_POW2 take a margin",
         scaling == kernels::ParamScaling::delayed
             ? " (a delayed scaling casts with the engine's scale: apply the margin there)"
             : "");
  if (options.margin < 0 || options.margin > kernels::kMaxCurrentMargin)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": options.margin is ", options.margin,
         "; it must be 0 to ", kernels::kMaxCurrentMargin,
         " (a larger one would take the scale of a large finite amax below float32's normal "
         "range)");
  scale.margin = options.margin;
  if (scaling == kernels::ParamScaling::none) {
    if (options.scale != nullptr || options.amax != nullptr)
      fail(SA_ERR_INVALID_ARGUMENT, context, ": options.", options.scale ? "scale" : "amax",
           " is set but the param is not scaled (scaling SA_SCALING_NONE)");
    return scale;
  }
  const ScalingDescription d = describe_scaling(static_cast<int32_t>(scaling));
  const std::string name = scaling_c_name(scaling);
  if (options.scale == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": options.scale is NULL; ", name, " needs one");
  if (d.block == 0) {
    // delayed: one element the step reads; current: [scale, scale_inv], which it writes.
    scale.scale =
        checked_scale_tensor(*options.scale, "options.scale", d.scale_type,
                             d.step_writes ? Dims{2} : Dims{}, d.step_writes, device, context);
    if (options.amax != nullptr) {
      // The optimizer would own one tensor twice, and the step's amax would overwrite the
      // scale it reads.
      if (options.amax == options.scale)
        fail(SA_ERR_INVALID_ARGUMENT, context,
             ": options.scale and options.amax are the same tensor; pass two");
      scale.amax = static_cast<float*>(checked_scale_tensor(
          *options.amax, "options.amax", ElemType::f32, {}, true, device, context));
      if (static_cast<void*>(scale.amax) == scale.scale)
        fail(SA_ERR_INVALID_ARGUMENT, context,
             ": options.scale and options.amax share their element; the step writes the amax "
             "and reads the scale, so pass two tensors");
    }
    return scale;
  }
  if (options.amax != nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": options.amax is set, but ", name,
         " writes block scales, not an amax; pass NULL");
  const std::size_t ndim = layout.global_shape.size();
  if (ndim == 0)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": ", name, " scales blocks of ", d.block,
         " elements along the last dim, and a 0-d param has none");
  const std::size_t last = ndim - 1;
  if (layout.global_shape[last] % d.block != 0)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": ", name, " scales blocks of ", d.block,
         " elements along the last dim, but dim ", last, " has ", layout.global_shape[last],
         " elements, not a multiple of ", d.block);
  const int64_t begin = layout.global_offset[last], extent = layout.local_shape[last];
  if (begin % d.block != 0 || extent % d.block != 0)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": this rank holds elements [", begin, ", ",
         begin + extent, ") of dim ", last, ", which cuts a block of ", d.block, " (", name,
         " blocks run along the last dim); shard the last dim only at multiples of ", d.block,
         ", or shard another dim");
  Dims shape = layout.local_shape;
  shape[last] /= d.block;
  scale.scale = checked_scale_tensor(*options.scale, "options.scale", d.scale_type, shape, true,
                                     device, context);
  return scale;
}

}  // namespace

Optimizer::Optimizer(const sa_optimizer_config& config) : config_(config) {
  if (config.num_threads < 0)
    fail(SA_ERR_INVALID_ARGUMENT, "num_threads is ", config.num_threads,
         "; use 0 (all) or a count");
  if (config.cpu_simd != 0 && config.cpu_simd != 1)
    fail(SA_ERR_INVALID_ARGUMENT, "cpu_simd is ", config.cpu_simd, "; it must be 0 or 1");
}

// ---- groups -------------------------------------------------------------------------

int32_t Optimizer::add_group(const sa_group_config& config) {
  check_group_config(config, concat("group ", groups_.size()));
  groups_.reserve(groups_.size() + 1);
  stepper_.reserve_group();
  // No throw past this point: both have room.
  groups_.push_back(Group{config, 0});
  stepper_.add_group(hyper_of(config));
  return static_cast<int32_t>(groups_.size() - 1);
}

const Group& Optimizer::group(int32_t index, const char* what) const {
  if (index < 0 || index >= num_groups())
    fail(SA_ERR_INVALID_ARGUMENT, what, " ", index, " does not exist (the optimizer has ",
         num_groups(), " groups)");
  return groups_[index];
}

void Optimizer::check_group_replacement(int32_t index, const sa_group_config& config) const {
  const Group& current = group(index, "group");
  check_group_config(config, concat("group ", index));
  check_group_change(current.config, config, current.num_params, concat("group ", index));
}

void Optimizer::set_group(int32_t index, const sa_group_config& config) {
  check_group_replacement(index, config);
  groups_[index].config = config;
  stepper_.set_hyper(index, hyper_of(config));
}

void Optimizer::set_lr(int32_t index, double lr) {
  sa_group_config config = group(index, "group").config;
  config.lr = lr;
  set_group(index, config);
}

int64_t Optimizer::get_step(int32_t index) const {
  group(index, "group");
  return stepper_.group_step(index);
}

void Optimizer::set_step(int32_t index, int64_t step) {
  group(index, "group");
  if (step < 0) fail(SA_ERR_INVALID_ARGUMENT, "group ", index, ": step ", step, " is negative");
  stepper_.set_group_step(index, step);
}

void Optimizer::check_param_range(int64_t first, int64_t n, const char* what) const {
  if (first < 0 || n < 0 || first > num_params() || n > num_params() - first)
    fail(SA_ERR_INVALID_ARGUMENT, what, " [", first, ", ", first, " + ", n,
         ") is not a range of params (the optimizer has ", num_params(), ")");
}

void Optimizer::get_param_steps(int64_t first, int64_t n, int64_t* steps) const {
  check_param_range(first, n, "params");
  stepper_.get_param_steps(first, n, steps);
}

void Optimizer::set_param_steps(int64_t first, int64_t n, const int64_t* steps) {
  check_param_range(first, n, "params");
  for (int64_t i = 0; i < n; ++i)
    if (steps[i] < 0)
      fail(SA_ERR_INVALID_ARGUMENT, "steps[", i, "] (param '", params_[first + i]->name, "') is ",
           steps[i], "; a step count is >= 0");
  stepper_.set_param_steps(first, n, steps);
}

// ---- params -------------------------------------------------------------------------

Backend& Optimizer::backend_for(DLDevice device, const std::string& context) {
  if (backend_) {
    if (!same_device(device, backend_->device()))
      fail(SA_ERR_MISMATCH, context, ": the shard is on ", device_name(device),
           " but this optimizer's params are on ", device_name(backend_->device()),
           "; one optimizer serves one device");
    return *backend_;
  }
  switch (device.device_type) {
    case kDLCPU:
      if (device.device_id != 0)
        fail(SA_ERR_INVALID_ARGUMENT, context, ": the shard is on cpu with device_id ",
             device.device_id, "; host tensors must have device_id 0");
      return attach(make_cpu_backend({config_.num_threads, config_.cpu_simd != 0}));
    case kDLCUDA: {
      const CudaModule* cuda = cuda_module();
      if (cuda == nullptr)
        fail(SA_ERR_UNSUPPORTED, context, ": the shard is on ", device_name(device),
             " but this library has no CUDA backend (cuda: ", cuda_module_status(), ")");
      try {
        const CpuBackendOptions host{config_.num_threads, config_.cpu_simd != 0};
        return attach(
            cuda->make_backend(device.device_id, [host] { return make_host_step(host); }));
      } catch (const Error& e) {
        fail(e.status(), context, ": cannot use ", device_name(device), ": ", e.what());
      }
    }
    default:
      fail(SA_ERR_UNSUPPORTED, context, ": the shard is on ", device_name(device),
           "; shardadam supports cpu (and cuda where built with it)");
  }
}

Backend& Optimizer::attach(std::unique_ptr<Backend> backend) {
  stepper_.attach(*backend);  // all or nothing
  backend_ = std::move(backend);
  return *backend_;
}

void Optimizer::allocate_state(Param& p) {
  std::size_t bytes[kNumStateKinds] = {};
  std::size_t total = 0;
  for (const StateKindInfo& k : kStateKinds) {
    if (!has_state(p, k.kind)) continue;
    int64_t elems = 1;
    for (int64_t d : state_shape(p, k.kind)) elems *= d;
    bytes[static_cast<std::size_t>(k.kind)] =
        static_cast<std::size_t>(elems) * dtype_size(state_dtype(p, k.kind));
    total += bytes[static_cast<std::size_t>(k.kind)];
  }
  // Zeroed: moments start at 0, and a zero remainder restores exactly the bfloat16 value
  // the param holds now.
  for (const StateKindInfo& k : kStateKinds) {
    if (!has_state(p, k.kind)) continue;
    const std::size_t n = bytes[static_cast<std::size_t>(k.kind)];
    try {
      p.state[k.kind] =
          on_host(p.placement) ? backend_->allocate_host_state(n, k.kind) : backend_->allocate(n);
    } catch (const Error& e) {
      if (e.status() != SA_ERR_OUT_OF_MEMORY) throw;
      fail(SA_ERR_OUT_OF_MEMORY, "its state needs ", total, " bytes of ",
           on_host(p.placement) ? "pinned host" : "backend", " memory (", k.key, ": ", n,
           "): ", e.what());
    }
  }
  init_master(p);
}

void Optimizer::init_master(Param& p) {
  if (!has_state(p, StateKind::master)) return;
  auto* master = static_cast<float*>(p.state[StateKind::master]->data());
  if (p.scaling == kernels::ParamScaling::none) {
    backend_->widen_to_f32(master, p.data, p.param_type, p.numel);
  } else {
    backend_->dequantize_to_f32(master, p.data, p.param_type, p.scaling, p.scale, p.numel);
  }
}

void Optimizer::cast_params_from_master(const std::vector<int64_t>& params) {
  // Current scalings first measure every amax, then reduce the sharded ones' (a collective,
  // when the list holds one: every rank's list holds the same), then cast.
  bool reduce = false;
  for (int64_t index : params) {
    const Param& p = *params_[index];
    if (!kernels::is_current(p.scaling)) continue;
    backend_->measure_amax(variant_of(p), slot_of(p, index));
    reduce = reduce || is_sharded(p.layout);
  }
  if (reduce) reduce_current_amax(nullptr);
  for (int64_t index : params) {
    const Param& p = *params_[index];
    // An empty current-scaled shard still gets the tensor's scale.
    if (p.scaling != kernels::ParamScaling::none && (p.numel > 0 || kernels::is_current(p.scaling)))
      backend_->cast_param(variant_of(p), slot_of(p, index));
  }
}

Optimizer::CurrentSlotPlan Optimizer::plan_current_param(const Param& p, int64_t index) const {
  CurrentSlotPlan next;
  next.order = current_order_;
  const auto at = is_sharded(p.layout) ? next.order.begin() + current_sharded_ : next.order.end();
  next.order.insert(at, index);
  next.buffer = backend_->allocate(next.order.size() * sizeof(double));
  return next;
}

void Optimizer::install_current_params(CurrentSlotPlan&& next, bool sharded) noexcept {
  current_amax_ = std::move(next.buffer);
  current_order_ = std::move(next.order);
  auto* bits = static_cast<double*>(current_amax_->data());
  for (std::size_t i = 0; i < current_order_.size(); ++i)
    params_[current_order_[i]]->scale.amax_bits = bits + i;
  if (sharded) ++current_sharded_;
  current_agreed_ = false;
}

void Optimizer::set_comm(std::shared_ptr<Comm> comm) {
  if (!comm && current_sharded_ > 0)
    fail(SA_ERR_STATE, param_context(params_[current_order_[0]]->name), " is ",
         scaling_c_name(params_[current_order_[0]]->scaling),
         " and sharded, so every step reduces its amax through the communicator; it cannot be "
         "removed");
  comm_ = std::move(comm);
  current_agreed_ = false;
}

namespace {

// FNV-1a, 64 bits: what the ranks compare of their sharded current-scaled params.
void fnv1a(uint64_t& h, const void* data, std::size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001B3ull;
}

}  // namespace

void Optimizer::check_current_agreement() {
  if (current_agreed_ || current_sharded_ == 0) return;
  uint64_t h = 0xCBF29CE484222325ull;
  for (int32_t i = 0; i < current_sharded_; ++i) {
    const Param& p = *params_[current_order_[static_cast<std::size_t>(i)]];
    fnv1a(h, p.name.c_str(), p.name.size() + 1);
    fnv1a(h, p.layout.global_shape.data(), p.layout.global_shape.size() * sizeof(int64_t));
    const unsigned char tags[3] = {static_cast<unsigned char>(p.param_type),
                                   static_cast<unsigned char>(p.scaling),
                                   static_cast<unsigned char>(p.scale.margin)};
    fnv1a(h, tags, sizeof tags);
  }
  // Equal on every rank exactly when max(x) == -max(-x) for each value (all exact doubles).
  const double hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xFFFFFFFFu);
  const double mine[6] = {double(current_sharded_), -double(current_sharded_), hi, -hi, lo, -lo};
  std::shared_ptr<Buffer> values = backend_->allocate(sizeof mine);
  backend_->copy_from_host(values->data(), mine, sizeof mine);
  stepper_.all_reduce(*comm_, static_cast<double*>(values->data()), 6, ReduceOp::max, nullptr);
  backend_->synchronize();
  double all[6];
  backend_->copy_to_host(all, values->data(), sizeof all);
  if (all[0] != -all[1])
    fail(SA_ERR_MISMATCH, "the ranks of ", comm_->describe(),
         " hold different numbers of current-scaled sharded params (from ", -all[1], " to ", all[0],
         "; this rank: ", current_sharded_,
         "): every rank must add the same ones in the same order, empty shards included, "
         "since their amax is reduced as one vector (nothing was changed)");
  if (all[2] != -all[3] || all[4] != -all[5])
    fail(SA_ERR_MISMATCH, "the ranks of ", comm_->describe(), " hold ", current_sharded_,
         " current-scaled sharded params each, but not the same ones (names, global shapes, "
         "dtypes, scalings, margins or order differ; this rank's first is '",
         params_[current_order_[0]]->name,
         "'): every rank must add the same ones in the same order, since their amax is "
         "reduced as one vector (nothing was changed)");
  current_agreed_ = true;
}

void Optimizer::reduce_current_amax(void* stream) {
  check_current_agreement();
  stepper_.all_reduce(*comm_, static_cast<double*>(current_amax_->data()), current_sharded_,
                      ReduceOp::max, stream);
}

void Optimizer::recast_params(int64_t first, int64_t n) {
  check_param_range(first, n, "params");
  require_usable("recasting params");
  if (n == 0) return;       // params exist, so the backend does
  backend_->synchronize();  // a step still running may be writing the masters
  std::vector<int64_t> range(static_cast<std::size_t>(n));
  std::iota(range.begin(), range.end(), first);
  cast_params_from_master(range);
  backend_->synchronize();
}

void Optimizer::reset_masters(int64_t first, int64_t n) {
  check_param_range(first, n, "params");
  require_usable("resetting masters");
  if (n == 0) return;
  backend_->synchronize();
  for (int64_t i = first; i < first + n; ++i) {
    Param& p = *params_[i];
    init_master(p);
    if (has_state(p, StateKind::remainder)) {
      Buffer& remainder = *p.state[StateKind::remainder];
      const std::vector<char> zeros(remainder.bytes());
      backend_->copy_from_host(remainder.data(), zeros.data(), zeros.size());
    }
  }
  backend_->synchronize();
}

int64_t Optimizer::add_param(const ParamRequest& request) {
  if (request.name == nullptr || request.name[0] == '\0')
    fail(SA_ERR_INVALID_ARGUMENT, "name is NULL or empty; params are matched by name");
  if (num_params() >= INT32_MAX)
    fail(SA_ERR_UNSUPPORTED, "an optimizer holds at most ", INT32_MAX, " params");
  auto param = std::make_unique<Param>();
  param->name = request.name;
  const std::string context = param_context(param->name);
  if (index_of_name_.count(param->name))
    fail(SA_ERR_INVALID_ARGUMENT, context, ": a param of this name is already registered (index ",
         index_of_name_.at(param->name), ")");
  const Group& group = this->group(request.group, (context + ": group").c_str());
  if (request.versioned == nullptr && request.legacy == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": local_shard is NULL");
  if (request.versioned) {
    const DLPackVersion version = request.versioned->version;
    if (version.major != DLPACK_MAJOR_VERSION)
      fail(SA_ERR_UNSUPPORTED, context, ": the local shard is a DLPack ", version.major, ".",
           version.minor, " tensor; this library reads DLPack ", DLPACK_MAJOR_VERSION, ".x");
    if (request.versioned->flags & DLPACK_FLAG_BITMASK_READ_ONLY)
      fail(SA_ERR_INVALID_ARGUMENT, context,
           ": the local shard is read-only (DLPACK_FLAG_BITMASK_READ_ONLY); the step writes it");
  }
  const DLTensor& tensor =
      request.versioned ? request.versioned->dl_tensor : request.legacy->dl_tensor;
  const TensorRef shard = read_tensor(tensor, context + ": local shard");
  const auto param_type = elem_type_of(shard.dtype);
  const auto param_dtype = [](const kernels::ParamForm& f) { return f.param; };
  if (!param_type ||
      !std::any_of(std::begin(kernels::kParamForms), std::end(kernels::kParamForms),
                   [&](const kernels::ParamForm& f) { return f.param == *param_type; }))
    fail(SA_ERR_UNSUPPORTED, context, ": param dtype ", dtype_name(shard.dtype),
         " is not supported; use ", dtype_list(kernels::kParamForms, param_dtype));
  const sa_param_options defaults = SA_PARAM_OPTIONS_INIT;
  const sa_param_options options =
      read_options(request.options, defaults, (context + ": options").c_str());

  param->group = request.group;
  param->layout = resolve_layout(request.layout, shard.shape, context);
  param->numel = shard.numel;
  param->device = shard.device;
  param->data = shard.data;
  param->param_type = *param_type;
  // The default grad dtype is the param's, or float32 (the master's) for an fp8 param.
  const ElemType default_grad =
      kernels::in_table(kernels::kGradTypes, *param_type) ? *param_type : ElemType::f32;
  param->grad_type = resolve_optional_dtype(options.grad_dtype, default_grad, kernels::kGradTypes,
                                            context, "grad_dtype");
  param->moment_type = resolve_optional_dtype(options.moment_dtype, kernels::kMomentTypes[0],
                                              kernels::kMomentTypes, context, "moment_dtype");
  param->master = resolve_master(options.master, *param_type, context);
  param->scaling = resolve_scaling(options.scaling, *param_type, param->master, context);
  param->amsgrad = group.config.amsgrad != 0;
  param->placement = resolve_placement(options.state_placement, shard.device, context);
  param->scale = checked_scales(options, param->scaling, param->layout, shard.device, context);
  const bool current = kernels::is_current(param->scaling);
  if (current && is_sharded(param->layout) && !comm_)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": ", scaling_c_name(param->scaling),
         " scales the whole tensor by its amax, and this layout splits the tensor across "
         "ranks, so the amax must be reduced across them: set a communicator "
         "(sa_optimizer_set_comm) before adding the param");
  Backend& backend = backend_for(shard.device, context);
  if (param->scaling == kernels::ParamScaling::delayed || current) {
    // The scale the codes were cast with: delayed: the scale; current: [1], scale_inv.
    float s = 0.0f;  // on the param's device, perhaps just written on another stream
    backend.synchronize();
    backend.copy_to_host(&s, static_cast<const float*>(param->scale.scale) + (current ? 1 : 0),
                         sizeof s);
    if (!(s > 0.0f && s <= FLT_MAX))
      fail(SA_ERR_INVALID_ARGUMENT, context,
           current ? ": the scale_inv (scale[1]) is " : ": the scale is ", s,
           "; it must be > 0 and finite (the master starts as the fp8 value ",
           current ? "* scale_inv)" : "/ scale)");
  }

  try {
    allocate_state(*param);
  } catch (const Error& e) {
    fail(e.status(), context, ": ", e.what());
  } catch (const std::bad_alloc&) {
    fail(SA_ERR_OUT_OF_MEMORY, context, ": cannot allocate the state of ", param->numel,
         " elements");
  }

  // An empty shard needs no grad memory, so it counts as bound (as it always has): an
  // engine need not bind grads of params it holds no elements of.
  param->binding = param->numel == 0 ? GradBinding::bound : GradBinding::never;
  // Room for one more, growing geometrically: an exact reserve would copy the tables at
  // every add (quadratic over 100k params).
  if (grad_specs_.size() == grad_specs_.capacity())
    grad_specs_.reserve(std::max<std::size_t>(16, 2 * grad_specs_.capacity()));
  stepper_.reserve_param();

  const int64_t index = num_params();
  CurrentSlotPlan current_slots;
  if (current) current_slots = plan_current_param(*param, index);

  // Commit: from here on only allocation of the bookkeeping can fail, and it is undone.
  params_.push_back(std::move(param));
  try {
    index_of_name_.emplace(params_.back()->name, index);
  } catch (...) {
    params_.pop_back();
    throw;
  }
  // No throw past this point: capacity was reserved above.
  if (current) install_current_params(std::move(current_slots), is_sharded(params_.back()->layout));
  stepper_.add_param(request.group, params_.back()->binding == GradBinding::bound);
  grad_specs_.push_back(grad_spec_of(*params_.back()));
  params_.back()->owner =
      request.versioned ? ManagedTensor(request.versioned) : ManagedTensor(request.legacy);
  if (options.scale != nullptr) params_.back()->scale_owner = ManagedTensor(options.scale);
  if (options.amax != nullptr) params_.back()->amax_owner = ManagedTensor(options.amax);
  ++groups_[request.group].num_params;
  plan_stale_ = true;
  return index;
}

const Param& Optimizer::param(int64_t index, const char* what) const {
  if (index < 0 || index >= num_params())
    fail(SA_ERR_INVALID_ARGUMENT, what, " ", index, " does not exist (the optimizer has ",
         num_params(), " params)");
  return *params_[index];
}

int64_t Optimizer::find_param(const std::string& name) const {
  auto it = index_of_name_.find(name);
  if (it == index_of_name_.end()) fail(SA_ERR_INVALID_ARGUMENT, "no param is named '", name, "'");
  return it->second;
}

DLDevice Optimizer::device() const { return backend_ ? backend_->device() : DLDevice{kDLCPU, 0}; }

// ---- grads --------------------------------------------------------------------------

namespace {

// Whether `t` is exactly what the kernel of `p` reads: p's grad dtype, local shape and
// device, C-contiguous, aligned. No allocation: this runs for every param at every step
// of an engine that hands over fresh grads (sa_optimizer_set_grads).
bool grad_fits(const GradSpec& spec, const int64_t* local_shape, const DLTensor& t) {
  if (t.ndim != spec.ndim) return false;
  if (t.ndim > 0 && t.shape == nullptr) return false;
  if (!same_dtype(t.dtype, spec.dtype) || !same_device(t.device, spec.device)) return false;
  for (int32_t d = 0; d < t.ndim; ++d)
    if (t.shape[d] != local_shape[d]) return false;
  if (spec.numel == 0) return true;
  if (!row_major(t.shape, t.strides, t.ndim)) return false;
  const auto address = reinterpret_cast<std::uintptr_t>(t.data) + t.byte_offset;
  return t.data != nullptr && address % spec.elem_bytes == 0;
}

}  // namespace

const void* Optimizer::checked_grad(int64_t index, const DLTensor& grad) const {
  const GradSpec& spec = grad_specs_[index];
  const int64_t* local_shape =
      spec.ndim <= GradSpec::kInlineDims ? spec.shape : params_[index]->layout.local_shape.data();
  if (grad_fits(spec, local_shape, grad))
    return grad.data == nullptr ? nullptr : static_cast<const char*>(grad.data) + grad.byte_offset;
  // The slow path says why (and must find a reason: grad_fits and these checks agree).
  const Param& p = *params_[index];
  const DLDataType dtype = spec.dtype;
  const std::string context = param_context(p.name) + ": grad";
  if (!same_device(grad.device, p.device))
    fail(SA_ERR_MISMATCH, context, " is on ", device_name(grad.device), " but the param is on ",
         device_name(p.device));
  if (!same_dtype(grad.dtype, dtype))
    fail(SA_ERR_MISMATCH, context, " dtype ", dtype_name(grad.dtype),
         " does not match registered grad dtype ", elem_name(p.grad_type));
  if (grad.ndim >= 0 && grad.ndim <= SA_MAX_NDIM && (grad.ndim == 0 || grad.shape != nullptr)) {
    const Dims shape(grad.shape, grad.shape + grad.ndim);
    if (shape != p.layout.local_shape)
      fail(SA_ERR_MISMATCH, context, " shape ", format_dims(shape),
           " does not match the local shape ", format_dims(p.layout.local_shape));
  }
  const TensorRef ref = read_tensor(grad, context, SA_ERR_MISMATCH);  // strides, data, alignment
  return ref.data;
}

void Optimizer::bind(int64_t index, GradBinding binding, const void* grad) {
  Param& p = *params_[index];
  p.binding = binding;
  p.grad = grad;
  stepper_.set_active(index, binding == GradBinding::bound);
  grads_stale_ = true;
}

void Optimizer::set_grad(int64_t index, const DLTensor& grad) {
  param(index, "param");
  bind(index, GradBinding::bound, checked_grad(index, grad));
}

void Optimizer::set_grads(int64_t n, const DLTensor* const* grads) {
  if (n != num_params())
    fail(SA_ERR_INVALID_ARGUMENT, "n is ", n, " but the optimizer has ", num_params(),
         " params; pass one grad (or NULL: no grad) per param, in param order");
  // All checked before any binding changes. The pointers go to a scratch vector kept
  // between calls, so a steady step allocates nothing.
  grad_scratch_.resize(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    grad_scratch_[i] = grads[i] == nullptr ? nullptr : checked_grad(i, *grads[i]);
  for (int64_t i = 0; i < n; ++i)
    bind(i, grads[i] == nullptr ? GradBinding::none : GradBinding::bound, grad_scratch_[i]);
}

void Optimizer::clear_grad(int64_t index) {
  param(index, "param");
  bind(index, GradBinding::none, nullptr);
}

// The ABI's "no grad" sentinel, an address made from an integer (written once here).
const void* const kNoGrad = SA_NO_GRAD;  // NOLINT(performance-no-int-to-ptr)

void Optimizer::set_grad_ptrs(int64_t n, const void* const* ptrs) {
  if (n != num_params())
    fail(SA_ERR_INVALID_ARGUMENT, "n is ", n, " but the optimizer has ", num_params(),
         " params; pass one pointer per param, in param order");
  if (n > 0 && ptrs == nullptr) fail(SA_ERR_INVALID_ARGUMENT, "ptrs is NULL");
  for (int64_t i = 0; i < n; ++i) {
    const Param& p = *params_[i];
    if (ptrs[i] == kNoGrad) continue;
    const std::size_t align = elem_size(p.grad_type);
    if (ptrs[i] == nullptr && p.numel > 0)
      fail(SA_ERR_INVALID_ARGUMENT, "ptrs[", i, "] (param '", p.name, "', ", p.numel,
           " elements) is NULL; pass SA_NO_GRAD for a param without a grad");
    if (reinterpret_cast<std::uintptr_t>(ptrs[i]) % align != 0)
      fail(SA_ERR_INVALID_ARGUMENT, "ptrs[", i, "] (param '", p.name, "') is not aligned to its ",
           elem_name(p.grad_type), " elements");
  }
  for (int64_t i = 0; i < n; ++i)
    bind(i, ptrs[i] == kNoGrad ? GradBinding::none : GradBinding::bound,
         ptrs[i] == kNoGrad ? nullptr : ptrs[i]);
}

// ---- step ---------------------------------------------------------------------------

std::vector<const Param*> Optimizer::param_list() const {
  std::vector<const Param*> list;
  list.reserve(params_.size());
  for (const auto& p : params_) list.push_back(p.get());
  return list;
}

void Optimizer::require_usable(const char* action) const {
  if (unusable())
    fail(SA_ERR_STATE, "the optimizer state is unusable, so ", action,
         " is refused: ", unusable_reason_,
         ". A successful sa_optimizer_import of the whole state clears this");
}

namespace {

// The clipping request of a step, validated.
// shardadam.h spells sa_step_args and SA_STEP_ARGS_INIT for the ABI; they must be the
// schema's: the same members, in order, with the types and defaults it says.
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

kernels::ClipSpec clip_spec_of(const sa_step_args& args) {
  if (!(args.max_grad_norm >= 0.0))
    fail(SA_ERR_INVALID_ARGUMENT, "max_grad_norm is ", args.max_grad_norm,
         "; use 0 (no norm), a positive bound, or INFINITY (measure the norm, never clip)");
  if (args.norm_type != SA_NORM_L2 && args.norm_type != SA_NORM_INF)
    fail(SA_ERR_INVALID_ARGUMENT, "norm_type is ", args.norm_type,
         "; use SA_NORM_L2 or SA_NORM_INF");
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

}  // namespace

void Optimizer::check_comm_fits(const Comm& comm) const {
  if (!comm.reduces_device_memory()) return;  // host callbacks serve every backend
  const DLDevice device = backend_->device();
  if (device.device_type != kDLCUDA)
    fail(SA_ERR_MISMATCH, "the optimizer's params are on ", device_name(device), " but its ",
         comm.describe(),
         " reduces CUDA memory; give a CPU optimizer a host-callback communicator");
  if (device.device_id != comm.device())
    fail(SA_ERR_MISMATCH, "the optimizer's params are on ", device_name(device), " but its ",
         comm.describe(), " is on cuda:", comm.device());
}

std::optional<bool> Optimizer::step(const sa_step_args& args, void* stream) {
  return run_step(args, stream, false, {});
}

std::optional<bool> Optimizer::step_params(int64_t n, const int64_t* indices,
                                           const sa_step_args& args, void* stream) {
  if (n < 0) fail(SA_ERR_INVALID_ARGUMENT, "n is ", n, "; it must be >= 0");
  if (n > 0 && indices == nullptr) fail(SA_ERR_INVALID_ARGUMENT, "params is NULL but n is ", n);
  std::vector<uint8_t> subset(params_.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t index = indices[i];
    if (index < 0 || index >= num_params())
      fail(SA_ERR_INVALID_ARGUMENT, "params[", i, "] is ", index, "; the optimizer has ",
           num_params(), " params (indices 0 to ", num_params() - 1, ")");
    if (subset[static_cast<std::size_t>(index)])
      fail(SA_ERR_INVALID_ARGUMENT, "params[", i, "] is ", index, " again (",
           param_context(params_[index]->name), "); each param is stepped at most once");
    subset[static_cast<std::size_t>(index)] = 1;
  }
  if (args.max_grad_norm != 0.0)
    fail(SA_ERR_INVALID_ARGUMENT, "max_grad_norm is ", args.max_grad_norm,
         " in a partial step, which sees only its params' grads; the norm clipping needs is of "
         "every grad: clip in a full step (sa_optimizer_step)");
  return run_step(args, stream, true, std::move(subset));
}

std::optional<bool> Optimizer::run_step(const sa_step_args& args, void* stream, bool partial,
                                        std::vector<uint8_t> subset) {
  require_usable("the step");
  const kernels::ClipSpec clip = clip_spec_of(args);
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i]->binding == GradBinding::never && (!partial || subset[i]))
      fail(SA_ERR_STATE, param_context(params_[i]->name),
           " was never given a grad; bind one (sa_optimizer_set_grad, sa_optimizer_set_grads, "
           "sa_optimizer_set_grad_ptrs) or say it has none (sa_optimizer_clear_grad) before "
           "stepping "
           "(nothing was updated)");
  // Only steps that need a global norm or a found-inf consensus communicate; every rank
  // decides this from the same arguments, so the ranks agree on whether to call.
  Comm* comm = comm_ && (clip.norm != kernels::NormType::none || args.found_inf != nullptr)
                   ? comm_.get()
                   : nullptr;
  if (!backend_ && comm != nullptr && comm->reduces_device_memory())
    backend_for(DLDevice{kDLCUDA, comm->device()}, "the communicator");  // joins on its device
  // Current-scaled sharded params reduce their amax at every step, whatever the arguments.
  Comm* amax_comm = current_sharded_ > 0 ? comm_.get() : nullptr;
  const StepInputs inputs{args.inv_grad_scale,
                          args.found_inf,
                          clip,
                          args.grad_norm,
                          comm,
                          amax_comm,
                          current_amax_ ? static_cast<double*>(current_amax_->data()) : nullptr,
                          current_sharded_};
  if (backend_) {
    if (comm != nullptr || amax_comm != nullptr) check_comm_fits(*comm_);  // the one comm
    if (amax_comm != nullptr) check_current_agreement();                   // before any change
  }
  // The params outside a partial step's subset step as if they had no grad (their slots'
  // grads NULL, inactive in the fold) until a step with another subset, or a full one.
  if (subset != subset_) {
    subset_ = std::move(subset);
    stepper_.set_subset(subset_);
    grads_stale_ = true;
  }
  if (backend_) update_plan();
  return stepper_.step(plan_, inputs, stream, /*advance_groups=*/!partial);
}

StepReport Optimizer::last_report() const { return stepper_.last_report(); }

void Optimizer::update_plan() {
  if (plan_stale_) {
    Plan plan = build_plan(param_list());
    backend_->prepare(plan, num_params());
    plan_ = std::move(plan);
    plan_stale_ = false;
    grads_stale_ = !subset_.empty();  // the plan took every bound grad: mask the others
  }
  if (grads_stale_) {
    rebind_grads(plan_, param_list(), subset_);
    grads_stale_ = false;
  }
}

void Optimizer::flush(void* stream) {
  require_usable("the flush");
  if (!backend_) return;
  // The ranks' agreement synchronizes once: here, not inside a step being captured.
  if (current_sharded_ > 0) check_current_agreement();
  if (!subset_.empty()) {  // a flush readies a full step (the one a graph captures)
    subset_.clear();
    stepper_.set_subset(subset_);
    grads_stale_ = true;
  }
  update_plan();
  stepper_.flush(plan_, stream);
}

// ---- state --------------------------------------------------------------------------

kernels::Variant variant_of(const Param& p) {
  return {p.param_type, p.grad_type, p.moment_type, p.master, p.amsgrad, p.scaling};
}

bool has_state(const Param& p, StateKind kind) {
  return kernels::variant_has_state(variant_of(p), kind);
}

DLDataType state_dtype(const Param& p, StateKind kind) {
  switch (state_kind_info(kind).storage) {
    case StateStorage::moment:
      return dl_dtype_of(p.moment_type);
    case StateStorage::f32:
      return dl_dtype_of(ElemType::f32);
    case StateStorage::i16:
      return kInt16;
  }
  return {};
}

DLDevice state_device(const Param& p) {
  return on_host(p.placement) ? DLDevice{kDLCPU, 0} : p.device;
}

std::vector<int64_t> state_shape(const Param& p, StateKind kind) {
  if (!state_kind_info(kind).per_block) return p.layout.local_shape;
  return {(p.numel + kernels::kQuant8Block - 1) / kernels::kQuant8Block};
}

std::vector<NamedState> named_states(const Param& p) {
  std::vector<NamedState> states;
  for (const StateKindInfo& k : kStateKinds)
    if (has_state(p, k.kind))
      states.push_back({k.key, p.state[k.kind], state_dtype(p, k.kind), k.kind});
  return states;
}

std::vector<FileState> file_states(const Param& p) {
  std::vector<FileState> out;
  for (const NamedState& s : named_states(p)) {
    if (state_kind_info(s.kind).per_block) continue;  // in its moment's FileState (absmax)
    FileState f{s, nullptr, false, p.moment_type};
    if (kernels::is_block_storage(p.moment_type) &&
        state_kind_info(s.kind).storage == StateStorage::moment) {
      int k = 0;
      is_moment_state(s.kind, &k);  // a moment: StateStorage::moment
      f.absmax = p.state[moment_absmax_state(k)];
      f.is_signed = moment_signed(k);
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<FileState> moment_states(const Param& p) {
  std::vector<FileState> out;
  for (FileState& f : file_states(p))
    if (state_kind_info(f.state.kind).storage == StateStorage::moment) out.push_back(std::move(f));
  return out;
}

namespace {

// The moment `key` of `p` and the host float32 array of `values`, or the error that says
// why not.
std::pair<FileState, float*> moment_and_values(const Param& p, const std::string& key,
                                               const DLTensor& values, const char* what) {
  const std::string context = concat("param '", p.name, "': ", what);
  std::string moments;
  for (const FileState& f : moment_states(p)) {
    if (key == f.state.key) {
      const TensorRef t = read_tensor(values, context);
      if (!same_dtype(t.dtype, dl_dtype_of(ElemType::f32)))
        fail(SA_ERR_INVALID_ARGUMENT, context, " is ", dtype_name(t.dtype), "; it must be float32");
      if (t.device.device_type != kDLCPU)
        fail(SA_ERR_INVALID_ARGUMENT, context, " is on ", device_name(t.device),
             "; it must be in host memory (cpu)");
      if (t.shape != p.layout.local_shape)
        fail(SA_ERR_INVALID_ARGUMENT, context, " has shape ", format_dims(t.shape),
             "; it must have the local shape ", format_dims(p.layout.local_shape));
      return {f, static_cast<float*>(t.data)};
    }
    moments += moments.empty() ? f.state.key : concat(", ", f.state.key);
  }
  fail(SA_ERR_INVALID_ARGUMENT, "param '", p.name, "' has no moment '", key,
       "'; it has: ", moments);
}

}  // namespace

void Optimizer::get_moment_values(int64_t index, const std::string& key,
                                  const DLTensor& values) const {
  const Param& p = param(index, "param");
  const auto [f, out] = moment_and_values(p, key, values, "out");
  read_moment_values(*backend_, f, p.numel, out);
}

void Optimizer::set_moment_values(int64_t index, const std::string& key, const DLTensor& values) {
  require_usable("setting a moment");
  const Param& p = param(index, "param");
  const auto [f, in] = moment_and_values(p, key, values, "values");
  write_moment_values(*backend_, f, p.numel, in);
}

Optimizer::StateRef Optimizer::state(int64_t index, const std::string& key) const {
  const Param& p = param(index, "param");
  std::string keys;
  for (const NamedState& s : named_states(p)) {
    if (key == s.key) return {s.buffer, s.dtype, state_shape(p, s.kind), state_device(p)};
    keys += keys.empty() ? s.key : concat(", ", s.key);
  }
  fail(SA_ERR_INVALID_ARGUMENT, param_context(p.name), " has no state '", key, "'; it has: ", keys);
}

int32_t Optimizer::num_threads() const { return config_.num_threads; }

}  // namespace sa
