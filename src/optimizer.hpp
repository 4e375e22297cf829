// src/optimizer.hpp — the optimizer core: groups, params, their state, and the step.
// Every method validates fully before it changes anything, and throws sa::Error.
#ifndef SHARDADAM_SRC_OPTIMIZER_HPP_
#define SHARDADAM_SRC_OPTIMIZER_HPP_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend.hpp"
#include "comm/comm.hpp"
#include "dlpack_intake.hpp"
#include "layout.hpp"
#include "plan.hpp"
#include "shardadam/shardadam.h"
#include "state_kinds.hpp"
#include "stepper.hpp"

namespace sa {

struct IoScratch;  // src/state_io/state_io.hpp

using kernels::ElemType;
using kernels::MasterKind;

struct Group {
  sa_group_config config;
  int64_t num_params = 0;
};

// Optimizer state of one param, in backend memory: a buffer per kind it has (see
// has_state), none for the others. Buffers are shared so that state views stay valid
// after the optimizer is gone.
struct ParamState {
  std::shared_ptr<Buffer> buffers[kNumStateKinds];
  const std::shared_ptr<Buffer>& operator[](StateKind kind) const {
    return buffers[static_cast<std::size_t>(kind)];
  }
  std::shared_ptr<Buffer>& operator[](StateKind kind) {
    return buffers[static_cast<std::size_t>(kind)];
  }
};

// One state of a param as export and import see it: its key ("exp_avg", ...), its
// buffer and its storage dtype.
struct NamedState {
  const char* key;
  std::shared_ptr<Buffer> buffer;
  DLDataType dtype;
  StateKind kind;
};

struct Param;

// Whether a param has a grad for the next steps.
enum class GradBinding : uint8_t {
  never,  // nothing bound since it was added: a step refuses (a forgotten bind is an error)
  none,   // "no grad" (torch's p.grad is None): steps skip the param
  bound   // Param::grad holds the grad's data (NULL for an empty param)
};

// The Variant of a param's updates (its bucket; kernels/variants.h).
kernels::Variant variant_of(const Param& p);

// Whether a param has a state of this kind (kernels::variant_has_state of its Variant).
bool has_state(const Param& p, StateKind kind);

// The dtype the param keeps a state of this kind in.
DLDataType state_dtype(const Param& p, StateKind kind);

// The device a param's state is on: the param's, or the CPU for state placed on the host.
DLDevice state_device(const Param& p);

// The shape of a param's state of this kind: the param's local shape, or for a per-block
// state (state_kinds.hpp) [number of kernels::kQuant8Block blocks of the local shard].
std::vector<int64_t> state_shape(const Param& p, StateKind kind);

// The states a param has, in kStateKinds' order: exp_avg, exp_avg_sq, max_exp_avg_sq
// (amsgrad), master (fp32 master) or remainder (int16), and the block absmax values of
// 8-bit moments.
std::vector<NamedState> named_states(const Param& p);

// A state as shard files hold it: in its own dtype, and a block moment (8-bit, float8) as
// its codes together with its blocks' absmax (the per-block state "<moment>_absmax").
struct FileState {
  NamedState state;                // the state itself (the codes of a block moment)
  std::shared_ptr<Buffer> absmax;  // a block moment's absmax values, else null
  bool is_signed;                  // a block moment: exp_avg (q8: coded by the signed map)
  ElemType block;                  // a block moment: its storage (q8, f8e4m3)
};

// The states of `p` that shard files hold, in named_states' order.
std::vector<FileState> file_states(const Param& p);

// The moments of `p` (states stored in its moment dtype), in file_states' order: what
// get_moment_values and set_moment_values take.
std::vector<FileState> moment_states(const Param& p);

struct Param {
  std::string name;
  int32_t group = 0;
  Layout layout;
  int64_t numel = 0;
  DLDevice device{};
  void* data = nullptr;  // the local shard, updated in place
  ElemType param_type{};
  ElemType grad_type{};
  ElemType moment_type{};
  MasterKind master{};
  bool amsgrad = false;
  kernels::ParamScaling scaling{};  // an fp8 param's (sa_param_scaling); none otherwise
  kernels::ParamScale scale{};      // its scale tensors' data (param_scaling.h), else NULLs
  StatePlacement placement{};       // where `state` lives (host: Backend::allocate_host_state)
  ParamState state;
  GradBinding binding = GradBinding::never;
  const void* grad = nullptr;  // the bound grad's data (binding == bound), kept until rebound
  ManagedTensor owner;         // released (deleter called) with the param
  ManagedTensor scale_owner;   // sa_param_options.scale and .amax, likewise
  ManagedTensor amax_owner;
};

// What a grad of a param must be (its grad dtype, device, local shape), kept per param in
// one contiguous table that checking a grad reads instead of the Param: a set_grads of
// 100k grads then reads one cache line per param where the Param and its shape vector
// cost a cache miss each (measured: the check was ~14% of FusedAdam's grad intake at 100k
// params of 16 elements). Params do not change once added, so neither does this.
struct GradSpec {
  static constexpr int32_t kInlineDims = 4;  // deeper local shapes are read from the Param
  DLDataType dtype{};
  DLDevice device{};
  int32_t ndim = 0;
  uint32_t elem_bytes = 0;
  int64_t numel = 0;
  int64_t shape[kInlineDims] = {};  // the local shape, when ndim <= kInlineDims
};

// What an add_param caller hands over, before validation.
struct ParamRequest {
  const char* name;
  int32_t group;
  DLManagedTensorVersioned* versioned;  // exactly one of versioned / legacy is set
  DLManagedTensor* legacy;
  const sa_layout* layout;
  const sa_param_options* options;
};

class Optimizer {
 public:
  explicit Optimizer(const sa_optimizer_config& config);

  int32_t add_group(const sa_group_config& config);
  int32_t num_groups() const { return static_cast<int32_t>(groups_.size()); }
  const Group& group(int32_t index, const char* fn) const;
  void set_group(int32_t index, const sa_group_config& config);
  void set_lr(int32_t index, double lr);
  int64_t get_step(int32_t index) const;  // may synchronize a device backend
  void set_step(int32_t index, int64_t step);

  // Validates the request, allocates state, and only then registers the param and takes
  // ownership of its managed tensor. On error the caller keeps that ownership. Returns
  // the param's index.
  int64_t add_param(const ParamRequest& request);
  // Casts the fp8 params among `params` (indices) from their masters, with their scalings
  // (import: the master was loaded; the param and its scales follow from it).
  void cast_params_from_master(const std::vector<int64_t>& params);
  // Params [first, first + n) again from their masters, or their masters from them, as
  // sa_optimizer_recast_params / sa_optimizer_reset_masters document it. Synchronous.
  void recast_params(int64_t first, int64_t n);
  void reset_masters(int64_t first, int64_t n);
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  const Param& param(int64_t index, const char* fn) const;
  int64_t find_param(const std::string& name) const;

  // Grad bindings, as the sa_optimizer_set_grad* calls document them. Each checks every
  // entry before it changes any binding.
  void set_grad(int64_t index, const DLTensor& grad);
  void set_grads(int64_t n, const DLTensor* const* grads);
  void clear_grad(int64_t index);
  void set_grad_ptrs(int64_t n, const void* const* ptrs);

  // Per-param step counts of params [first, first + n) (get may synchronize).
  void get_param_steps(int64_t first, int64_t n, int64_t* steps) const;
  void set_param_steps(int64_t first, int64_t n, const int64_t* steps);

  // One step over all params, as sa_optimizer_step documents it (args validated here).
  // The float pointers of `args` point into backend memory (host memory when the
  // optimizer has no params and no device communicator). Returns whether the step was
  // skipped when the host knows without waiting for the device (Stepper::step).
  std::optional<bool> step(const sa_step_args& args, void* stream);
  // A step of the params indices[0, n) only, as sa_optimizer_step_params documents it.
  std::optional<bool> step_params(int64_t n, const int64_t* indices, const sa_step_args& args,
                                  void* stream);

  // How the last step went: skipped or not, and the norm (may synchronize).
  StepReport last_report() const;

  // The communicator of later steps (nullptr: none; refused while a current-scaled param is
  // sharded, since its amax is reduced through it).
  void set_comm(std::shared_ptr<Comm> comm);

  // Brings the backend's copies of grads, hyperparameters and step counts up to date on
  // `stream` (what step() does first; needed before replaying a captured step).
  void flush(void* stream);

  // The buffer behind a state key of a param, with its storage dtype.
  struct StateRef {
    std::shared_ptr<Buffer> buffer;
    DLDataType dtype;
    std::vector<int64_t> shape;  // state_shape
    DLDevice device;             // state_device
  };
  StateRef state(int64_t index, const std::string& key) const;

  // A moment of param `index` (exp_avg, exp_avg_sq, max_exp_avg_sq) as float32 values
  // (moment_values.hpp), to or from `values`: a float32 host tensor of the local shape.
  // Everything is checked before anything changes; both synchronize a device backend.
  void get_moment_values(int64_t index, const std::string& key, const DLTensor& values) const;
  void set_moment_values(int64_t index, const std::string& key, const DLTensor& values);

  DLDevice device() const;

  // ---- what state export/import (src/state_io) needs ----------------------------------

  // The params in index order; their state buffers are written through Buffer::data().
  const std::vector<std::unique_ptr<Param>>& params() const { return params_; }

  // The backend, or nullptr while the optimizer has no params (and hence no state).
  Backend* backend() const { return backend_.get(); }

  // Checks that `config` may replace group `index`'s hyperparameters, as set_group does,
  // without changing anything.
  void check_group_replacement(int32_t index, const sa_group_config& config) const;

  // A state import that failed halfway leaves the state partly overwritten: step() and
  // export refuse (SA_ERR_STATE, with `reason`) until an import succeeds.
  void mark_unusable(std::string reason) { unusable_reason_ = std::move(reason); }
  void clear_unusable() { unusable_reason_.clear(); }
  bool unusable() const { return !unusable_reason_.empty(); }
  const std::string& unusable_reason() const { return unusable_reason_; }
  // Throws SA_ERR_STATE when unusable; `action` names what was refused ("step").
  void require_usable(const char* action) const;

  // Worker threads the config asks for (sa_optimizer_config.num_threads; 0: one per
  // hardware thread): the CPU backend's, and an export's.
  int32_t num_threads() const;

  // What exports and imports keep between calls (pinned staging, threads, an async
  // export's snapshot and job): made on first use, released with the optimizer. Pinning
  // host memory costs more than a chunk's copy.
  std::shared_ptr<IoScratch>& io_scratch() { return io_scratch_; }

 private:
  Backend& backend_for(DLDevice device, const std::string& context);
  void allocate_state(Param& param);
  // The master of `param` from its value, as a param starts (16-bit: widened; fp8: times
  // its scale's inverse); a no-op without one. Synchronous.
  void init_master(Param& param);
  std::vector<const Param*> param_list() const;
  // Makes `backend` the optimizer's and moves the step counts into its memory.
  Backend& attach(std::unique_ptr<Backend> backend);
  void update_plan();
  // A step, or a partial step (`partial`: param i steps where subset[i]), all checked first.
  std::optional<bool> run_step(const sa_step_args& args, void* stream, bool partial,
                               std::vector<uint8_t> subset);
  void check_param_range(int64_t first, int64_t n, const char* what) const;
  // The grad's data pointer if `grad` is what the kernel of param `index` reads, else
  // throws the error that says why.
  const void* checked_grad(int64_t index, const DLTensor& grad) const;
  void bind(int64_t index, GradBinding binding, const void* grad);

  sa_optimizer_config config_;
  void check_comm_fits(const Comm& comm) const;

  // ---- current scaling (kernels::is_current) ----
  // Prepares adding param `p` (current-scaled) as the param of index `index`: the amax
  // buffer with room for it. May throw; changes nothing.
  struct CurrentSlotPlan {
    std::shared_ptr<Buffer> buffer;
    std::vector<int64_t> order;
  };
  CurrentSlotPlan plan_current_param(const Param& p, int64_t index) const;
  // Installs what plan_current_param prepared (no throw): every current-scaled param's
  // amax_bits points into the new buffer.
  void install_current_params(CurrentSlotPlan&& next, bool sharded) noexcept;
  // Compares this rank's sharded current-scaled params with the other ranks' through
  // comm_ (a collective, once per set of params and communicator); SA_ERR_MISMATCH if
  // they differ.
  void check_current_agreement();
  // Max-reduces the sharded current-scaled params' amax through comm_ (a collective).
  void reduce_current_amax(void* stream);

  std::unique_ptr<Backend> backend_;  // created by the first param's device
  std::shared_ptr<Comm> comm_;        // shared with the C handle that made it
  // The amax of every current-scaled param as magnitude bits in doubles of backend memory
  // (their ParamScale::amax_bits point here), in current_order_: the sharded ones first, in
  // param order (the prefix of current_sharded_ that a step max-reduces across the ranks),
  // then the others.
  std::shared_ptr<Buffer> current_amax_;
  std::vector<int64_t> current_order_;
  int32_t current_sharded_ = 0;
  bool current_agreed_ = false;  // checked against the ranks since the set or comm_ changed
  std::vector<Group> groups_;
  std::vector<std::unique_ptr<Param>> params_;  // unique_ptr: info pointers stay stable
  std::vector<GradSpec> grad_specs_;            // per param, what its grads must be
  std::unordered_map<std::string, int64_t> index_of_name_;
  Plan plan_;
  bool plan_stale_ = true;   // params changed since the plan was built
  bool grads_stale_ = true;  // grad bindings changed since the plan last saw them
  // Hyperparameters, params' groups and grad presence as the fold reads them, the step
  // counts, and the step itself.
  Stepper stepper_;
  std::vector<const void*> grad_scratch_;  // set_grads: checked pointers before they are bound
  // The last partial step's params (1: stepped), in force in the plan and the fold's tables
  // until a step with another subset; empty after a full step.
  std::vector<uint8_t> subset_;
  std::string unusable_reason_;  // non-empty: see mark_unusable
  std::shared_ptr<IoScratch> io_scratch_;
};

// Validates hyperparameters against the schema (src/schema.hpp); `context` starts the
// error message.
void check_group_config(const sa_group_config& config, const std::string& context);

// Refuses (SA_ERR_STATE) a change of a field the schema fixes once a group holds params.
void check_group_change(const sa_group_config& current, const sa_group_config& next,
                        int64_t num_params, const std::string& context);

// `base` with the n fields `names` names set to `values` (unchecked but for the names
// and the flags' 0 or 1: check_group_config validates the result).
sa_group_config with_fields(const sa_group_config& base, int32_t n, const char* const* names,
                            const double* values);

// values[i] = the field names[i] of `config`.
void get_fields(const sa_group_config& config, int32_t n, const char* const* names, double* values);

// The hyperparameters of a validated config, as the kernels take them.
kernels::AdamHyper hyper_of(const sa_group_config& config);

}  // namespace sa

#endif  // SHARDADAM_SRC_OPTIMIZER_HPP_
