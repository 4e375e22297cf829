// src/stepper.hpp — a step, written once for every backend: the groups' and params' tables
// as the fold reads them, the step counts, and the order of the backend primitives that
// make a step (stats, their reduction, the fold, the update and matrices passes).
//
// The step counts have one home. Before an optimizer has a backend (no params yet) they
// are in host memory; attach() moves them into the backend's memory, where the fold
// advances them; they are never copied back into a second table. On a device backend that
// makes a found_inf skip and a graph replay cost the host nothing, and reading or setting
// a count synchronizes the device.
#ifndef SHARDADAM_SRC_STEPPER_HPP_
#define SHARDADAM_SRC_STEPPER_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "../kernels/muon_math.h"
#include "../kernels/step_control.h"
#include "backend.hpp"
#include "comm/comm.hpp"
#include "plan.hpp"

namespace sa {

// Per-step inputs. The float pointers point to one float in backend memory (host memory
// while there is no backend), or are NULL.
struct StepInputs {
  const float* inv_grad_scale;  // grads are multiplied by it
  const float* found_inf;       // nonzero: skip the step
  kernels::ClipSpec clip;       // norm == none: no gradient norm
  float* grad_norm_out;         // receives the global norm (needs clip.norm != none)
  Comm* comm;                   // non-NULL: reduce the step stats across ranks with it
  // Current scaling: the first amax_count doubles at amax_bits (backend memory; the
  // sharded current-scaled params' ParamScale::amax_bits) are max-reduced through
  // amax_comm between the passes (kernels/param_scaling.h). amax_comm NULL: none are.
  Comm* amax_comm;
  double* amax_bits;
  int32_t amax_count;
  // Split Muon matrices (Plan::gathered): the communicator their directions are gathered
  // across (every rank holding a box of one); NULL when there is none.
  Comm* matrix_comm = nullptr;
};

// How the last step went.
struct StepReport {
  bool skipped;
  double norm;  // the global norm of the unscaled grads; NaN when not computed
};

class Stepper {
 public:
  Stepper();

  // ---- the tables (host memory; they reach the backend at the next flush) ----------------

  // Room for one more group or param (may throw, changing nothing), then adding it, which
  // cannot fail: so that the optimizer adds a group or param everywhere or nowhere.
  void reserve_group();
  // With no steps yet; `muon`: what a group of the Muon rule reads instead of `hyper`.
  void add_group(const kernels::AdamHyper& hyper, const kernels::MuonHyper& muon) noexcept;
  void reserve_param();
  // A param of `group`, with no steps yet; `active`: it has a grad.
  void add_param(int32_t group, bool active) noexcept;

  void set_hyper(int32_t group, const kernels::AdamHyper& hyper, const kernels::MuonHyper& muon);
  void set_active(int64_t param, bool active);
  // A new communicator: the next step with split Muon matrices checks the ranks' agreement
  // on their layout again.
  void comm_changed() { gather_agreed_ = false; }
  // The split Muon matrices' layout for `comm`, after the ranks' agreement on it when the
  // plan or the communicator changed (a collective that synchronizes), and their buffer:
  // what a step with split matrices does first, before it changes anything; a flush does
  // it too, so that a captured step need not.
  void prepare_gather(Plan& plan, Comm* comm);
  // The fold sees params i without subset[i] as inactive (a partial step's); empty: none.
  void set_subset(const std::vector<uint8_t>& subset);

  // ---- step counts -----------------------------------------------------------------------
  // Each group's: steps taken and not skipped. Each param's: steps in which it had a grad
  // and the step was not skipped (bias correction uses the param's).

  int64_t group_step(int32_t group) const;
  // Sets the group's count and the count of every param in it.
  void set_group_step(int32_t group, int64_t step);
  void get_param_steps(int64_t first, int64_t n, int64_t* steps) const;
  void set_param_steps(int64_t first, int64_t n, const int64_t* steps);

  // ---- steps -----------------------------------------------------------------------------

  // Moves the counts into `backend`'s memory: the optimizer's first param chose it. All
  // or nothing.
  void attach(Backend& backend);

  // Enqueues the uploads of what changed on the host since the last step: hyperparameters,
  // params' groups and grad presence, and the slot tables of buckets whose grads moved.
  // Refuses (SA_ERR_STATE) on a capturing stream when there is anything to upload.
  void flush(Plan& plan, void* stream);

  // One step (flush first), as sa_optimizer_step documents it; `plan` is ignored without
  // a backend. Returns whether the step was skipped when the host knows it without
  // waiting for the device, else nothing (then last_report() reads the verdict).
  // `advance_groups` false (a partial step): the group counts stay.
  std::optional<bool> step(Plan& plan, const StepInputs& inputs, void* stream,
                           bool advance_groups = true);

  // The last step's verdict (synchronizes a device backend).
  StepReport last_report() const;

  // values[0, count), memory of the attached backend, := their `op` over the ranks of
  // `comm`: NCCL on the stream; a host communicator directly on host memory, or on a device
  // backend through one pinned staging buffer (grown as needed), which drains the stream and
  // so cannot be captured (SA_ERR_STATE). The step's reductions (its stats, a current
  // scaling's amax) and the optimizer's (the ranks' agreement, a recast's amax) all use it.
  void all_reduce(Comm& comm, double* values, int64_t count, ReduceOp op, void* stream);

 private:
  // A growable array in backend memory (host memory without a backend).
  struct Array {
    std::shared_ptr<Buffer> buffer;
    std::size_t capacity = 0;  // elements
  };

  int32_t num_groups() const { return static_cast<int32_t>(hyper_.size()); }
  int32_t num_params() const { return static_cast<int32_t>(param_group_.size()); }
  std::shared_ptr<Buffer> allocate(std::size_t bytes) const;
  // Reads or writes n counts of `array` from element `first`.
  void read_counts(const Array& array, int64_t first, int64_t n, int64_t* out) const;
  void write_counts(Array& array, int64_t first, int64_t n, const int64_t* in);
  // Makes room for `needed` counts, keeping the first `used`.
  void reserve_counts(Array& array, std::size_t used, std::size_t needed);
  bool tables_stale() const;
  void upload_tables(void* stream);
  std::optional<bool> step_without_backend(const StepInputs& inputs, bool advance_groups);
  kernels::StepVerdict* verdict() const;
  double* stats() const;

  Backend* backend_ = nullptr;  // where counts, mirrors and scratch live; nullptr: the host

  // The tables, as the host keeps them.
  std::vector<kernels::AdamHyper> hyper_;  // per group
  std::vector<kernels::MuonHyper> muon_;   // per group; the matrices pass reads it here
  std::vector<int32_t> param_group_;       // per param
  std::vector<uint8_t> param_active_;      // per param: 1 = has a grad
  std::vector<uint8_t> subset_;            // set_subset's (empty: every param)
  std::vector<uint8_t> active_scratch_;    // param_active_ & subset_, as the fold reads it
  std::vector<uint8_t> uploaded_active_;   // what param_active_copy_ holds (empty: nothing yet)
  uint64_t hyper_version_ = 0;             // bumped by every change of hyper_
  uint64_t params_version_ = 0;            // ... of param_group_, param_active_ or subset_

  // Their backend copies, and which versions those hold.
  std::shared_ptr<Buffer> hyper_copy_, param_group_copy_, param_active_copy_;
  std::size_t copied_groups_ = 0, copied_params_ = 0;
  uint64_t copied_hyper_version_ = ~uint64_t{0};
  uint64_t copied_params_version_ = ~uint64_t{0};

  Array group_steps_, param_steps_;  // the counts (int64_t each)
  // The verdict (kernels::StepVerdict), then the stats (kernels::kNumStats doubles).
  std::shared_ptr<Buffer> scratch_;
  std::shared_ptr<Buffer> host_staging_;  // all_reduce's copy for a host communicator
  // Split Muon matrices: their directions (Plan::gather_elems floats, backend memory), and
  // whether the ranks agreed on the plan's layout since the communicator changed.
  std::shared_ptr<Buffer> gather_;
  bool gather_agreed_ = false;
  void gather_matrices(const Plan& plan, Comm& comm, PassArgs& args, void* stream);
  std::vector<double> wide_;  // sum_directions's doubles
  void exchange(Comm& comm, const MatrixExchange& x, float* base, void* stream);
  void sum_directions(Comm& comm, float* values, int64_t count, void* stream);
  void reduce_now(Comm& comm, std::vector<double>& values, ReduceOp op);
  // Host staging for a host communicator on a device backend: `bytes` of it, on a stream
  // that is not being captured.
  void* host_staging(std::size_t bytes, void* stream);
  std::vector<kernels::MatrixBox> agree_on_gather(const Plan& plan, Comm& comm, int32_t rank,
                                                  int32_t ranks);
};

}  // namespace sa

#endif  // SHARDADAM_SRC_STEPPER_HPP_
