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
#include "fields.hpp"
#include "moment_values.hpp"
#include "options.hpp"
#include "schema.hpp"
#include "step_args.hpp"

namespace sa {

Optimizer::Optimizer(const sa_optimizer_config& config) : config_(config) {
  check_fields(SA_STRUCT_OPTIMIZER_CONFIG, &config, "config", "");
}

// ---- groups -------------------------------------------------------------------------

int32_t Optimizer::add_group(const sa_group_config& config) {
  check_group_config(config, concat("group ", groups_.size()));
  groups_.reserve(groups_.size() + 1);
  stepper_.reserve_group();
  // No throw past this point: both have room.
  groups_.push_back(Group{config, 0});
  stepper_.add_group(hyper_of(config), muon_hyper_of(config));
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
  // Each field's value, then a fixed field's change, then how the fields go together (no
  // value of the others would make a changed update rule valid).
  check_group_fields(config, concat("group ", index));
  check_group_change(current.config, config, current.num_params, concat("group ", index));
  check_group_rule(config, concat("group ", index));
}

void Optimizer::set_group(int32_t index, const sa_group_config& config) {
  check_group_replacement(index, config);
  groups_[index].config = config;
  stepper_.set_hyper(index, hyper_of(config), muon_hyper_of(config));
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

void Optimizer::allocate_state(Param& p, int64_t index) {
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
      p.state[k.kind] = backend_->allocate_state(n, k.kind, on_host(p.placement));
    } catch (const Error& e) {
      if (e.status() != SA_ERR_OUT_OF_MEMORY) throw;
      fail(SA_ERR_OUT_OF_MEMORY, "its state needs ", total, " bytes of ",
           on_host(p.placement) ? "pinned host" : "backend", " memory (", k.key, ": ", n,
           "): ", e.what());
    }
  }
  init_master(p, index);
}

void Optimizer::init_master(const Param& p, int64_t index) {
  if (has_state(p, StateKind::master))
    backend_->run_slot(kernels::SlotOp::init_master, variant_of(p), slot_of(p, index));
}

void Optimizer::cast_params_from_master(const std::vector<int64_t>& params) {
  // Current scalings first measure every amax, then reduce the sharded ones' (a collective,
  // when the list holds one: every rank's list holds the same), then cast.
  bool reduce = false;
  for (int64_t index : params) {
    const Param& p = *params_[index];
    if (!kernels::is_current(p.scaling)) continue;
    backend_->run_slot(kernels::SlotOp::measure_amax, variant_of(p), slot_of(p, index));
    reduce = reduce || is_sharded(p.layout);
  }
  if (reduce) current_.reduce(params_, *comm_, stepper_, *backend_, nullptr);
  for (int64_t index : params) {
    const Param& p = *params_[index];
    // An empty current-scaled shard still gets the tensor's scale.
    if (p.scaling != kernels::ParamScaling::none && (p.numel > 0 || kernels::is_current(p.scaling)))
      backend_->run_slot(kernels::SlotOp::cast_from_master, variant_of(p), slot_of(p, index));
  }
}

void Optimizer::set_comm(std::shared_ptr<Comm> comm) {
  if (!comm && current_.sharded() > 0)
    fail(SA_ERR_STATE, param_context(params_[current_.first_sharded()]->name), " is ",
         scaling_c_name(params_[current_.first_sharded()]->scaling),
         " and sharded, so every step reduces its amax through the communicator; it cannot be "
         "removed");
  if (!comm && split_matrices_ > 0)
    fail(SA_ERR_STATE, "the optimizer holds ", split_matrices_,
         " Muon matrices split across ranks, whose directions every step sums through the "
         "communicator; it cannot be removed");
  comm_ = std::move(comm);
  current_.comm_changed();
  stepper_.comm_changed();
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
    init_master(p, i);
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
  const std::string context = param_context(request.name);
  if (const int64_t same = index_of_name_.find(request.name, name_of()); same >= 0)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": a param of this name is already registered (index ",
         same, ")");
  const Group& group = this->group(request.group, (context + ": group").c_str());
  CheckedParam checked = checked_param(request, group.config, comm_ != nullptr);
  std::unique_ptr<Param>& param = checked.param;
  const sa_param_options& options = checked.options;
  const bool current = kernels::is_current(param->scaling);
  check_start_scale(backend_for(param->device, context), *param, context);

  try {
    allocate_state(*param, num_params());
  } catch (const Error& e) {
    fail(e.status(), context, ": ", e.what());
  } catch (const std::bad_alloc&) {
    fail(SA_ERR_OUT_OF_MEMORY, context, ": cannot allocate the state of ", param->numel,
         " elements");
  }

  // An empty shard needs no grad memory, so it counts as bound (as it always has): an
  // engine need not bind grads of params it holds no elements of.
  const GradBinding binding = param->numel == 0 ? GradBinding::bound : GradBinding::never;
  // Room for one more, growing geometrically: an exact reserve would copy the tables at
  // every add (quadratic over 100k params).
  if (grad_specs_.size() == grad_specs_.capacity()) {
    const std::size_t capacity = std::max<std::size_t>(16, 2 * grad_specs_.capacity());
    grad_specs_.reserve(capacity);
    bindings_.reserve(capacity);
    step_grads_.reserve(capacity);
  }
  stepper_.reserve_param();
  index_of_name_.reserve_one();

  const int64_t index = num_params();
  CurrentScalings::Slots current_slots;
  if (current) current_slots = current_.plan_add(*param, index, *backend_);

  // Commit: from here on only this push can fail (nothing changed then); no throw past it,
  // capacity was reserved above.
  params_.push_back(std::move(param));
  index_of_name_.insert(params_.back()->name, index);
  if (current)
    current_.install(std::move(current_slots), is_sharded(params_.back()->layout), params_);
  stepper_.add_param(request.group, binding == GradBinding::bound);
  grad_specs_.push_back(grad_spec_of(*params_.back()));
  bindings_.push_back(binding);
  step_grads_.push_back(nullptr);
  params_.back()->owner =
      request.versioned ? ManagedTensor(request.versioned) : ManagedTensor(request.legacy);
  if (options.scale != nullptr) params_.back()->scale_owner = ManagedTensor(options.scale);
  if (options.amax != nullptr) params_.back()->amax_owner = ManagedTensor(options.amax);
  ++groups_[request.group].num_params;
  if (params_.back()->rule == kernels::UpdateRule::muon && is_sharded(params_.back()->layout))
    ++split_matrices_;
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
  const int64_t index = index_of_name_.find(name, name_of());
  if (index < 0) fail(SA_ERR_INVALID_ARGUMENT, "no param is named '", name, "'");
  return index;
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
  bindings_[index] = binding;
  step_grads_[index] = binding == GradBinding::bound ? grad : nullptr;
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
  const kernels::ClipSpec clip = checked_clip(args);
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (bindings_[i] == GradBinding::never && (!partial || subset[i]))
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
  Comm* amax_comm = current_.sharded() > 0 ? comm_.get() : nullptr;
  // Split Muon matrices sum their directions at every step, whatever the arguments.
  Comm* matrix_comm = split_matrices_ > 0 ? comm_.get() : nullptr;
  const StepInputs inputs{
      args.inv_grad_scale,  args.found_inf,     clip,       args.grad_norm, comm, amax_comm,
      current_.amax_bits(), current_.sharded(), matrix_comm};
  if (backend_) {
    if (comm != nullptr || amax_comm != nullptr || matrix_comm != nullptr)
      check_comm_fits(*comm_);  // the one comm, before any change
    if (amax_comm != nullptr)   // before any change
      current_.check_agreement(params_, *comm_, stepper_, *backend_);
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
    grads_stale_ = true;  // a new plan holds no grads
  }
  if (grads_stale_) {
    rebind_grads(plan_, step_grads_, subset_);
    grads_stale_ = false;
  }
}

void Optimizer::flush(void* stream) {
  require_usable("the flush");
  if (!backend_) return;
  // The ranks' agreement synchronizes once: here, not inside a step being captured.
  if (current_.sharded() > 0) current_.check_agreement(params_, *comm_, stepper_, *backend_);
  if (!subset_.empty()) {  // a flush readies a full step (the one a graph captures)
    subset_.clear();
    stepper_.set_subset(subset_);
    grads_stale_ = true;
  }
  update_plan();
  // So do the split Muon matrices' layout and agreement (the step would do them first).
  if (!plan_.gathered.empty()) stepper_.prepare_gather(plan_, comm_.get());
  stepper_.flush(plan_, stream);
}

// ---- state --------------------------------------------------------------------------

void Optimizer::get_moment_values(int64_t index, const std::string& key,
                                  const DLTensor& values) const {
  const Param& p = param(index, "param");
  const auto [f, out] = checked_moment_values(p, key, values, "out");
  read_moment_values(*backend_, f, p.numel, out);
}

void Optimizer::set_moment_values(int64_t index, const std::string& key, const DLTensor& values) {
  require_usable("setting a moment");
  const Param& p = param(index, "param");
  const auto [f, in] = checked_moment_values(p, key, values, "values");
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
