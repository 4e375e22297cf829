// src/backend.hpp — what the optimizer needs from a device: memory, copies, launches and
// synchronization. The optimizer never knows which backend it drives.
#ifndef SHARDADAM_SRC_BACKEND_HPP_
#define SHARDADAM_SRC_BACKEND_HPP_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "../kernels/muon_math.h"
#include "../kernels/step_control.h"
#include "plan.hpp"

namespace sa {

// Backend memory. Shared ownership lets a state view outlive the optimizer.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() const = 0;
  virtual std::size_t bytes() const = 0;
};

// Zeroed, 64-byte aligned host memory (what the CPU backend allocates, and where the step
// counts live while an optimizer has no backend). Throws SA_ERR_OUT_OF_MEMORY.
std::shared_ptr<Buffer> make_host_buffer(std::size_t bytes);

// The version of the Backend interface below and of what it shares with the kernels
// (Plan, kernels::TensorSlot, the step_control.h tables): a backend module built against
// another is refused when it loads (src/backends/cuda_module.hpp). Bump it with any change.
constexpr uint32_t kBackendInterface = 10;

// The passes of a step, in the order the core (src/stepper.cpp) launches them.
enum class Pass : uint8_t {
  // This rank's step stats into args.stats (kernels::kNumStats doubles, backend memory;
  // step_control.h): the partial args.norm of the counted grads (0 when norm is none) and
  // whether *args.found_inf is set (0 when found_inf is NULL). Deterministic: the partials
  // are folded in a fixed order, whatever the thread count.
  stats,
  // The fold (step_control.h) of *args.fold_tables with *args.fold_inputs: decide, publish
  // the verdict, and unless skipped advance the counts and fold the coefficients that the
  // update reads.
  fold,
  // Unless args.verdict->skip, every slot that has a grad gets its Variant's update with
  // the coefficients of the last fold. A scaled (fp8) param's slot is cast from its updated
  // master (kernels/param_scaling.h) and a delayed scaling's amax written. A current
  // scaling's (kernels::is_current) slots are not cast: each, grad or none, writes max
  // |master| into *slot.scale.amax_bits, which the core then reduces across ranks.
  update,
  // Plans with split Muon matrices (Plan::gathered, laid out as plan.hpp's GatheredMatrix
  // says): the first plan.gather_zero floats of args.gather (plan.gather_elems floats,
  // backend memory) := zeros; then unless args.verdict->skip, each such matrix whose slot
  // here has a grad gets its box's momentum (kernels::MatrixBox), by its group's
  // args.muon_of(slot) and its grad multiplied by args.verdict->grad_multiplier, and when
  // it contributes, writes its box's direction at args.gather + g.dir (row r at + r * g.ld).
  // The core then brings each matrix's whole direction to its owner.
  gather,
  // Each split matrix this rank owns (GatheredMatrix::whole >= 0): its whole direction at
  // args.gather + g.whole orthogonalized in place (Newton-Schulz by its group's
  // hyperparameters, args.muon_of(g.param)), the step skipped or not (a skipped step's
  // directions are zeros). The core then brings each rank its boxes of the results.
  orthogonalize,
  // Unless args.verdict->skip, every slot of a Muon bucket (UpdateRule::muon) that has a grad
  // gets Muon's step (kernels/muon_math.h) by its group's hyperparameters, as the gather
  // pass reads them: a whole matrix (Bucket::matrix_of_slot) all of it, a split one its box
  // of its orthogonalized direction, at args.gather + g.dir. The update pass leaves Muon buckets
  // alone, and this pass every other.
  matrices,
  // A current scaling's second pass, unless args.verdict->skip: every entry of plan.current
  // gets its scale from its reduced amax (param_cast.h's write_current_scale), then each
  // current-scaled slot's codes are cast from its master.
  current_casts,
};

// What a pass reads; the fields another pass does not read may be left as they are.
struct PassArgs {
  kernels::NormType norm = kernels::NormType::none;  // stats
  const float* found_inf = nullptr;                  // stats
  double* stats = nullptr;                           // stats
  const kernels::FoldTables* fold_tables = nullptr;  // fold
  const kernels::FoldInputs* fold_inputs = nullptr;  // fold
  const kernels::StepVerdict* verdict = nullptr;     // update, matrices, current_casts
  const kernels::MuonHyper* muon = nullptr;  // gather, orthogonalize, matrices: per group (host)
  const int32_t* param_group = nullptr;      // gather, orthogonalize, matrices: per param (host)
  float* gather = nullptr;                   // gather, orthogonalize, matrices: backend memory

  // The Muon hyperparameters of a param's group, or of a slot's.
  const kernels::MuonHyper& muon_of(int64_t param) const { return muon[param_group[param]]; }
  const kernels::MuonHyper& muon_of(const kernels::TensorSlot& slot) const {
    return muon_of(slot.param_index);
  }
};

// A device's primitives, as ggml's backend interface has them: memory, copies, launches,
// synchronization. They know nothing of steps: what a step does, in which order, and
// when it is skipped or counted is the core's (src/stepper.cpp), written once for every
// backend. `stream` is the caller's stream (a cudaStream_t; host backends ignore it);
// "enqueue" means stream-ordered on a device backend and done on return on a host one.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual DLDevice device() const = 0;

  // ---- memory ----------------------------------------------------------------------------

  // Whether backend memory is ordinary host memory (which the core may read and write).
  virtual bool host_memory() const = 0;

  // Zero-filled backend memory; throws sa::Error(SA_ERR_OUT_OF_MEMORY) when it cannot.
  virtual std::shared_ptr<Buffer> allocate(std::size_t bytes) = 0;

  // Zero-filled memory for a param's state of `kind`: backend memory, or with `on_host`
  // (state placed on the host, sa_state_placement) host memory that this backend's launches
  // can read and write in place (CUDA: pinned, and mapped into the device's address space
  // at the same address) and the core may read and write as host memory. Allocations of
  // one kind and place lie one after another where they can: a step moves the host states
  // of params added in a row in one copy, and registering many small params costs an
  // allocation per block, not per param. Throws sa::Error(SA_ERR_OUT_OF_MEMORY) when it
  // cannot.
  virtual std::shared_ptr<Buffer> allocate_state(std::size_t bytes, StateKind kind,
                                                 bool on_host) = 0;

  // Host memory for staging copies (pinned on CUDA, so copies run at full speed), not
  // zeroed. Throws sa::Error(SA_ERR_OUT_OF_MEMORY) when it cannot.
  virtual std::shared_ptr<Buffer> allocate_staging(std::size_t bytes) = 0;

  // ---- copies ----------------------------------------------------------------------------

  // Synchronous copies between host memory (`host`) and backend memory. They do not wait
  // for other streams: call synchronize() first when a step may be in flight.
  virtual void copy_to_host(void* host, const void* src, std::size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host, std::size_t bytes) = 0;

  // Enqueues a copy of `bytes` from host memory to backend memory; `host` may be reused as
  // soon as this returns.
  virtual void upload(void* dst, const void* host, std::size_t bytes, void* stream) = 0;

  // Enqueues a copy from backend memory to staging memory (allocate_staging), complete
  // after synchronize_stream(stream).
  virtual void download(void* staging, const void* src, std::size_t bytes, void* stream) = 0;

  // Enqueues `copies` (plan.hpp's BoxCopy: boxes of floats) within the buffer at `base`
  // (backend memory), in order; no copy's source overlaps an earlier copy's destination.
  virtual void copy_boxes(float* base, const std::vector<BoxCopy>& copies, void* stream) = 0;

  // ---- synchronization -------------------------------------------------------------------

  // Waits until no queued work on any stream can still read or write backend memory.
  virtual void synchronize() = 0;
  // Waits for the work enqueued on `stream`.
  virtual void synchronize_stream(void* stream) = 0;
  // Whether `stream` is recording a graph (then nothing may be uploaded or waited for).
  virtual bool capturing(void* stream) = 0;

  // ---- launches ----------------------------------------------------------------------------
  //
  // Two entries, whatever the update rule: `launch` runs a pass of a step over a prepared
  // plan, `run_slot` an operation on one slot outside any step. Neither names a rule or a
  // dtype: each backend hands every bucket's work to its kernels' one dispatch (kernels/cuda's
  // launch_bucket, kernels/cpu's per-range functions), keyed by the bucket's Variant. A new
  // rule or variant is rows in the kernels' tables, not a method here.

  // Builds the launch tables of `plan` (CUDA: device copies of its slot tables) for
  // optimizers of `num_params` params. Called after a plan is (re)built and before it is
  // launched; may allocate and synchronize.
  virtual void prepare(const Plan& plan, int64_t num_params) = 0;

  // Enqueues the upload of bucket `bucket`'s slot table after its grad pointers moved
  // (host backends read the plan itself).
  virtual void upload_slots(const Plan& plan, std::size_t bucket, void* stream) = 0;

  // Enqueues `pass` (what each does: Pass) over every bucket of `plan`, as prepared, with
  // the inputs `args` that pass reads.
  virtual void launch(Pass pass, const Plan& plan, const PassArgs& args, void* stream) = 0;

  // Runs `op` (kernels::SlotOp) on one param's slot `slot` of Variant `variant`, its state in
  // backend memory; synchronous.
  virtual void run_slot(kernels::SlotOp op, const kernels::Variant& variant,
                        const kernels::TensorSlot& slot) = 0;
};

struct CpuBackendOptions {
  int num_threads;  // 0 = hardware concurrency
  bool simd;
};

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

// The SIMD target the CPU backend's kernels use on this CPU ("AVX2", "AVX3", ...), or
// "scalar" (sa_build_info).
const char* cpu_simd_target();

// The host's update over slots in host memory, with coefficients folded elsewhere: what a
// device backend calls to step state the CPU steps (StatePlacement::host_cpu_step) on the
// param and grad it brought down. The core makes it (make_host_step: the CPU backend's
// kernels on a thread pool of its own) and hands a device backend the means to make one,
// so the device module links no CPU kernels.
class HostStep {
 public:
  virtual ~HostStep() = default;
  // Makes room for calls to update over at most `slots` slots and `elems` elements in all,
  // which then allocate nothing (a stream callback cannot report a failure): the device
  // backend calls this when it prepares a plan, outside any callback.
  virtual void reserve(std::size_t slots, int64_t elems) = 0;
  // Updates every element of slots[0, n) (host memory, every grad set; `variant`'s) with
  // coeffs[slot.param_index], as the CPU backend's update pass does (so bit for bit its
  // results and a device's), on all threads; returns when done. One call at a time.
  // `variant` has no scaling (an fp8 param's master is stepped as a float32 param:
  // kernels::fp8_master_variant).
  virtual void update(const kernels::Variant& variant, const kernels::TensorSlot* slots,
                      std::size_t n, const kernels::GroupCoeffs* coeffs) = 0;
};

std::unique_ptr<HostStep> make_host_step(const CpuBackendOptions& options);

// How a device backend makes its HostStep, on first need (a pool of threads costs nothing
// until a param asks for the CPU to step its state).
using HostStepFactory = std::function<std::unique_ptr<HostStep>()>;

}  // namespace sa

#endif  // SHARDADAM_SRC_BACKEND_HPP_
