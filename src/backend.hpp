// src/backend.hpp — what the optimizer needs from a device: memory, a widening copy,
// running a plan, and the groups' step counts. The optimizer never knows which backend it drives.
#ifndef SHARDADAM_SRC_BACKEND_HPP_
#define SHARDADAM_SRC_BACKEND_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "../kernels/bucket_table.h"
#include "../kernels/step_control.h"
#include "plan.hpp"

namespace sa {

// The groups and params as a step needs them. The core owns this table and bumps a
// version whenever it changes a part, so device backends upload only what moved.
//
// Step counts: each group's (steps the optimizer took and did not skip) and each
// param's (steps in which it had a grad and the step was not skipped); bias correction
// uses the param's. A param is `active` at a step when it has a grad: only active params
// are updated and advance.
struct StepTable {
  std::vector<kernels::AdamHyper> hyper;  // per group
  std::vector<int64_t> steps;             // per group
  std::vector<int32_t> param_group;       // per param: its group
  std::vector<int64_t> param_steps;       // per param
  std::vector<uint8_t> param_active;      // per param: 1 = has a grad
  uint64_t hyper_version = 0;
  uint64_t steps_version = 0;   // steps or param_steps changed
  uint64_t params_version = 0;  // param_group or param_active changed

  // Advances the counts of a step that ran (not skipped): every group's, and every
  // active param's.
  void advance() {
    for (auto& s : steps) ++s;
    for (std::size_t i = 0; i < param_steps.size(); ++i) param_steps[i] += param_active[i];
  }
};

class Comm;

// Per-step inputs. The float pointers point to one float in backend memory, or are NULL.
struct StepInputs {
  const float* inv_grad_scale;  // grads are multiplied by it
  const float* found_inf;       // nonzero: skip the step
  kernels::ClipSpec clip;       // norm == none: no gradient norm
  float* grad_norm_out;         // receives the global norm (needs clip.norm != none)
  Comm* comm;                   // non-NULL: reduce the step stats across ranks with it
};

// How the last step went, as the backend decided it.
struct StepReport {
  bool skipped;
  double norm;  // the global norm of the unscaled grads; NaN when not computed
};

enum class StepOutcome {
  stepped,           // the step ran and the counts advanced (host knows)
  skipped,           // found_inf was set: nothing changed (host knows)
  decided_on_device  // the device decided (found_inf on device, or a captured step)
};

// Backend memory. Shared ownership lets a state view outlive the optimizer.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() const = 0;
  virtual std::size_t bytes() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DLDevice device() const = 0;

  // Zero-filled memory; throws sa::Error(SA_ERR_OUT_OF_MEMORY) when it cannot.
  virtual std::shared_ptr<Buffer> allocate(std::size_t bytes) = 0;

  // dst[i] = float(src[i]) for n elements of `type`, both in backend memory (master init).
  virtual void widen_to_f32(float* dst, const void* src, kernels::ElemType type, int64_t n) = 0;

  // Called after a plan is (re)built, before it is run: the place to upload tables.
  // May synchronize.
  virtual void prepare(const Plan& plan) = 0;

  // Makes the backend's copies of grad bindings, hyperparameters and step counts match
  // `plan` and `groups` (device backends: async uploads on `stream`). run() does it first.
  virtual void flush(const Plan& plan, const StepTable& groups, void* stream) = 0;

  // One step: when asked, compute this rank's gradient norm and reduce it (and the
  // found-inf flag) with inputs.comm; decide the step (kernels::decide_step); fold each
  // active param's coefficients at its next step count; update every slot of `plan` that
  // has a grad; device backends advance their copy of the step counts (the core advances
  // the host's, StepTable::advance). A skipped step changes nothing. Enqueues on `stream`
  // for device backends. A communicator failure throws before anything was updated.
  virtual StepOutcome run(const Plan& plan, const StepTable& groups, const StepInputs& inputs,
                          void* stream) = 0;

  // The decision of the last run() (synchronizes on device backends).
  virtual StepReport read_report() = 0;

  // Device backends keep the authoritative step counts in device memory (so a skipped or
  // graph-replayed step needs no host); this reads them back into table.steps and
  // table.param_steps, synchronizing. Host backends leave the table as it is.
  virtual void read_steps(StepTable& table) = 0;

  // ---- state export/import ---------------------------------------------------------------

  // Whether backend memory is ordinary host memory, which export can write from directly.
  virtual bool host_memory() const = 0;

  // Host memory for staging copies (pinned on CUDA, so copies run at full speed), not
  // zeroed. Throws sa::Error(SA_ERR_OUT_OF_MEMORY) when it cannot.
  virtual std::shared_ptr<Buffer> allocate_staging(std::size_t bytes) = 0;

  // Waits until no queued work can still read or write state (a step in flight).
  virtual void synchronize() = 0;

  // Synchronous copies between host memory (`host`) and backend memory.
  virtual void copy_to_host(void* host, const void* src, std::size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host, std::size_t bytes) = 0;
};

// The host side of a step's decision: this rank's stats (local_norm, the found_inf
// flag), reduced with inputs.comm (a host communicator) when there is one, then
// kernels::decide_step; writes *inputs.grad_norm_out (host memory). Throws before
// anything changed when the communicator fails. For the CPU backend and for an optimizer
// that has no params (and so no backend).
kernels::StepDecision decide_on_host(const StepInputs& inputs, double local_norm);

struct CpuBackendOptions {
  int num_threads;  // 0 = hardware concurrency
  bool simd;
};

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

}  // namespace sa

#endif  // SHARDADAM_SRC_BACKEND_HPP_
