// src/optimizer.hpp — the optimizer core: groups, params, their state, and the step.
// Every method validates fully before it changes anything, and throws sa::Error.
#ifndef SHARDADAM_SRC_OPTIMIZER_HPP_
#define SHARDADAM_SRC_OPTIMIZER_HPP_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../kernels/muon_math.h"
#include "backend.hpp"
#include "comm/comm.hpp"
#include "current_scaling.hpp"
#include "name_index.hpp"
#include "param.hpp"
#include "param_checks.hpp"
#include "plan.hpp"
#include "shardadam/shardadam.h"
#include "stepper.hpp"

namespace sa {

struct IoScratch;  // src/state_io/state_io.hpp

struct Group {
  sa_group_config config;
  int64_t num_params = 0;
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
  // The state of `param`, to be param `index`, allocated and its master initialised.
  void allocate_state(Param& param, int64_t index);
  // The master of param `index` from its value, as a param starts (16-bit: widened; fp8:
  // times its scale's inverse); a no-op without one. Synchronous.
  void init_master(const Param& param, int64_t index);
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
  // Param i's name, as index_of_name_ reads it.
  auto name_of() const {
    return [this](int64_t i) { return std::string_view(params_[i]->name); };
  }

  sa_optimizer_config config_;
  void check_comm_fits(const Comm& comm) const;

  std::unique_ptr<Backend> backend_;  // created by the first param's device
  std::shared_ptr<Comm> comm_;        // shared with the C handle that made it
  CurrentScalings current_;           // the current-scaled params' amaxes
  std::vector<Group> groups_;
  std::vector<std::unique_ptr<Param>> params_;  // unique_ptr: info pointers stay stable
  // Per param, in contiguous tables that binding every grad at every step walks (a Param
  // is a cache miss of its own): what its grads must be, whether one is bound, and the
  // grad its step reads (the bound grad's data; NULL unless bound).
  std::vector<GradSpec> grad_specs_;
  std::vector<GradBinding> bindings_;
  std::vector<const void*> step_grads_;
  NameIndex index_of_name_;
  Plan plan_;
  bool plan_stale_ = true;      // params changed since the plan was built
  int64_t split_matrices_ = 0;  // Muon params split across ranks (their directions are gathered)
  bool grads_stale_ = true;     // grad bindings changed since the plan last saw them
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

// Validates hyperparameters against the schema (src/schema.hpp): each field's value
// (check_group_fields), then the fields together (check_group_rule: a Muon group's
// decoupled_weight_decay, maximize and amsgrad); `context` starts the error message.
void check_group_config(const sa_group_config& config, const std::string& context);
void check_group_fields(const sa_group_config& config, const std::string& context);
void check_group_rule(const sa_group_config& config, const std::string& context);

// Refuses (SA_ERR_STATE) a change of a field the schema fixes once a group holds params.
void check_group_change(const sa_group_config& current, const sa_group_config& next,
                        int64_t num_params, const std::string& context);

// `base` with the n fields `names` names set to `values` (unchecked but for the names and
// the integral fields' values: check_group_config validates the result).
sa_group_config with_fields(const sa_group_config& base, int32_t n, const char* const* names,
                            const double* values);

// values[i] = the field names[i] of `config`.
void get_fields(const sa_group_config& config, int32_t n, const char* const* names, double* values);

// The hyperparameters of a validated config, as the kernels take them: AdamW's, and
// Muon's (read by a group of update_rule SA_RULE_MUON).
kernels::AdamHyper hyper_of(const sa_group_config& config);
kernels::MuonHyper muon_hyper_of(const sa_group_config& config);

}  // namespace sa

#endif  // SHARDADAM_SRC_OPTIMIZER_HPP_
