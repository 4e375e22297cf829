// src/backends/cuda_backend.cu — the CUDA backend: device memory, device-resident plan
// tables, and a step that is one fold launch plus one launch per bucket, all enqueued on
// the caller's stream.
//
// Where the host must wait, and why:
//  - allocate / widen_to_f32 (add_param) and prepare (the first step after params were
//    added): setup, synchronous by contract.
//  - run(): never, in steady state. Changed grad pointers, hyperparameters and step
//    counts go up through pinned staging slots with async copies on the stream; a slot
//    is reused only after the copy that read it has completed (an event per slot), so a
//    step still in flight never sees its inputs change.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../../kernels/cuda/adam_cuda.cuh"
#include "../backend.hpp"
#include "../comm/comm.hpp"
#include "../errors.hpp"
#include "cuda_module.hpp"

namespace sa {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    fail(status == cudaErrorMemoryAllocation ? SA_ERR_OUT_OF_MEMORY : SA_ERR_DEVICE, what, ": ",
         cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

// Makes `device` current for the scope of a call and restores the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(int device, std::size_t bytes) : device_(device), bytes_(bytes) {
    DeviceScope scope(device);
    if (bytes == 0) return;
    check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc of optimizer state");
    const cudaError_t zeroed = cudaMemset(data_, 0, bytes);
    if (zeroed != cudaSuccess) {
      cudaFree(data_);
      check_cuda(zeroed, "cudaMemset of optimizer state");
    }
  }
  ~DeviceBuffer() override {
    if (data_ == nullptr) return;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    cudaFree(data_);
    cudaSetDevice(previous);
  }
  void* data() const override { return data_; }
  std::size_t bytes() const override { return bytes_; }

 private:
  int device_;
  void* data_ = nullptr;
  std::size_t bytes_;
};

// Pinned host memory for state export/import: copies from and to it run at the link's
// full speed, and without a hidden bounce through the driver's own staging.
class PinnedBuffer final : public Buffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
    check_cuda(cudaMallocHost(&data_, std::max<std::size_t>(bytes, 1)),
               "cudaMallocHost of staging memory");
  }
  ~PinnedBuffer() override { cudaFreeHost(data_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const override { return data_; }
  std::size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

// Pinned host staging for async uploads: a small ring of slots, each guarded by the
// event of the last copy that read it.
class StagingRing {
 public:
  static constexpr int kSlots = 8;  // > the uploads one flush can make with few buckets
  StagingRing() = default;
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  ~StagingRing() {
    for (auto& s : slots_) {
      if (s.event) cudaEventDestroy(s.event);
      if (s.host) cudaFreeHost(s.host);
    }
  }

  // Copies `bytes` from `src` (host) to `dst` (device) on `stream`, asynchronously.
  void upload(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return;
    Slot& s = slots_[next_];
    next_ = (next_ + 1) % kSlots;
    if (s.event) check_cuda(cudaEventSynchronize(s.event), "waiting for a staging slot");
    if (s.capacity < bytes) {
      if (s.host) check_cuda(cudaFreeHost(s.host), "cudaFreeHost");
      s.host = nullptr;
      s.capacity = 0;
      check_cuda(cudaMallocHost(&s.host, bytes), "cudaMallocHost of upload staging");
      s.capacity = bytes;
    }
    if (!s.event)
      check_cuda(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming), "cudaEventCreate");
    std::memcpy(s.host, src, bytes);
    check_cuda(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync upload");
    check_cuda(cudaEventRecord(s.event, stream), "cudaEventRecord");
  }

 private:
  struct Slot {
    void* host = nullptr;
    std::size_t capacity = 0;
    cudaEvent_t event = nullptr;
  };
  Slot slots_[kSlots];
  int next_ = 0;
};

// The device copy of one bucket's tables.
struct DeviceTables {
  std::shared_ptr<Buffer> slots;          // TensorSlot[num_slots]
  std::shared_ptr<Buffer> chunk_offsets;  // int64_t[num_slots + 1]
  kernels::DeviceBucket view{};
  std::vector<const void*> uploaded_grads;  // what the device slots hold now
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    DeviceScope scope(device);
    cudaDeviceProp prop{};  // fails for a device index the runtime does not know
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  }

  DLDevice device() const override { return DLDevice{kDLCUDA, device_}; }

  std::shared_ptr<Buffer> allocate(std::size_t bytes) override {
    return std::make_shared<DeviceBuffer>(device_, bytes);
  }

  void widen_to_f32(float* dst, const void* src, kernels::ElemType type, int64_t n) override {
    DeviceScope scope(device_);
    check_cuda(kernels::launch_widen_to_f32(dst, src, type, n, nullptr), "master initialisation");
    check_cuda(cudaStreamSynchronize(nullptr), "master initialisation");
  }

  void prepare(const Plan& plan) override {
    DeviceScope scope(device_);
    std::vector<DeviceTables> tables;
    for (const Bucket& bucket : plan.buckets) {
      DeviceTables t;
      std::vector<int64_t> offsets(bucket.slots.size() + 1, 0);
      for (std::size_t s = 0; s < bucket.slots.size(); ++s)
        offsets[s + 1] = offsets[s] + (bucket.slots[s].numel + kernels::kCudaChunkElems - 1) /
                                          kernels::kCudaChunkElems;
      if (offsets.back() > 0x7FFFFFFF)
        fail(SA_ERR_UNSUPPORTED, "a bucket of ", bucket.numel,
             " elements needs more than 2^31 chunks");
      t.slots = allocate(bucket.slots.size() * sizeof(kernels::TensorSlot));
      t.chunk_offsets = allocate(offsets.size() * sizeof(int64_t));
      check_cuda(
          cudaMemcpy(t.slots->data(), bucket.slots.data(),
                     bucket.slots.size() * sizeof(kernels::TensorSlot), cudaMemcpyHostToDevice),
          "plan upload");
      check_cuda(cudaMemcpy(t.chunk_offsets->data(), offsets.data(),
                            offsets.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
                 "plan upload");
      t.view = {static_cast<const kernels::TensorSlot*>(t.slots->data()),
                static_cast<const int64_t*>(t.chunk_offsets->data()),
                static_cast<int32_t>(bucket.slots.size()), offsets.back()};
      for (const auto& slot : bucket.slots) t.uploaded_grads.push_back(slot.grad);
      tables.push_back(std::move(t));
    }
    int64_t total_chunks = 0;
    for (const DeviceTables& t : tables) total_chunks += t.view.num_chunks;
    auto scratch =
        allocate(sizeof(kernels::StepVerdict) +
                 (kernels::kNumStats + static_cast<std::size_t>(total_chunks)) * sizeof(double));
    tables_ = std::move(tables);
    scratch_ = std::move(scratch);
  }

  void flush(const Plan& plan, const StepTable& table, void* stream_handle) override {
    DeviceScope scope(device_);
    auto stream = static_cast<cudaStream_t>(stream_handle);
    // A copy recorded into a graph would replay stale staging memory forever: uploads
    // must happen before capture (sa_optimizer_flush), never inside it.
    if (needs_upload(plan, table) && capturing(stream))
      fail(SA_ERR_STATE,
           "grad bindings, hyperparameters or step counts changed since the last "
           "step; call sa_optimizer_flush on the stream before capturing a step");
    upload_groups(table, stream);
    upload_changed_grads(plan, stream);
  }

  StepOutcome run(const Plan& plan, const StepTable& table, const StepInputs& inputs,
                  void* stream_handle) override {
    flush(plan, table, stream_handle);
    DeviceScope scope(device_);
    auto stream = static_cast<cudaStream_t>(stream_handle);
    const bool with_stats = inputs.clip.norm != kernels::NormType::none || inputs.comm != nullptr;
    if (with_stats) reduce_stats(plan, inputs, stream);
    const kernels::FoldInputs fold{
        inputs.inv_grad_scale, inputs.found_inf, with_stats ? stats() : nullptr,
        inputs.clip,           verdict(),        inputs.grad_norm_out};
    const kernels::FoldTables fold_tables{static_cast<const kernels::AdamHyper*>(hyper_->data()),
                                          static_cast<int64_t*>(steps_->data()),
                                          static_cast<int32_t>(table.hyper.size()),
                                          static_cast<const int32_t*>(param_group_->data()),
                                          static_cast<const uint8_t*>(param_active_->data()),
                                          static_cast<int64_t*>(param_steps_->data()),
                                          static_cast<int32_t>(table.param_steps.size())};
    check_cuda(kernels::launch_fold_coefficients(
                   fold_tables, fold, static_cast<kernels::GroupCoeffs*>(coeffs_->data()), stream),
               "coefficient launch");
    const kernels::DeviceStep step{static_cast<const kernels::GroupCoeffs*>(coeffs_->data()),
                                   verdict()};
    for (std::size_t b = 0; b < plan.buckets.size(); ++b)
      check_cuda(
          kernels::launch_adam_bucket(plan.buckets[b].variant, tables_[b].view, step, stream),
          "Adam kernel launch");
    // A captured step advances the device counts once per replay, and a found_inf flag
    // or a norm is read only by the device: then the host's counts must be read back.
    if (capturing(stream) || inputs.found_inf != nullptr || with_stats)
      return StepOutcome::decided_on_device;
    return StepOutcome::stepped;
  }

  StepReport read_report() override {
    if (!scratch_) return {false, NAN};  // no step has run
    DeviceScope scope(device_);
    kernels::StepVerdict v{};
    check_cuda(cudaDeviceSynchronize(), "reading the step's verdict");
    check_cuda(cudaMemcpy(&v, verdict(), sizeof v, cudaMemcpyDeviceToHost),
               "reading the step's verdict");
    return {v.skip != 0, v.norm};
  }

  void read_steps(StepTable& table) override {
    DeviceScope scope(device_);
    if (!steps_) return;  // nothing was ever uploaded, so the host's counts are the truth
    check_cuda(cudaDeviceSynchronize(), "reading step counts");
    // The device holds the counts of the groups and params of the last upload; any added
    // since start from the host's values.
    const std::size_t groups = std::min(table.steps.size(), uploaded_groups_);
    const std::size_t params = std::min(table.param_steps.size(), uploaded_params_);
    if (groups > 0)
      check_cuda(cudaMemcpy(table.steps.data(), steps_->data(), groups * sizeof(int64_t),
                            cudaMemcpyDeviceToHost),
                 "reading step counts");
    if (params > 0)
      check_cuda(cudaMemcpy(table.param_steps.data(), param_steps_->data(),
                            params * sizeof(int64_t), cudaMemcpyDeviceToHost),
                 "reading step counts");
  }

  bool host_memory() const override { return false; }

  std::shared_ptr<Buffer> allocate_staging(std::size_t bytes) override {
    DeviceScope scope(device_);
    return std::make_shared<PinnedBuffer>(bytes);
  }

  // Steps run on the caller's streams, which may be non-blocking: only a device-wide
  // synchronization guarantees that none of them still reads or writes state.
  void synchronize() override {
    DeviceScope scope(device_);
    check_cuda(cudaDeviceSynchronize(), "synchronizing before a state copy");
  }

  void copy_to_host(void* host, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    DeviceScope scope(device_);
    check_cuda(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "copying state to the host");
  }

  void copy_from_host(void* dst, const void* host, std::size_t bytes) override {
    if (bytes == 0) return;
    DeviceScope scope(device_);
    check_cuda(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "copying state to the device");
  }

 private:
  static bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }

  bool needs_upload(const Plan& plan, const StepTable& table) const {
    if (!hyper_ || uploaded_groups_ != table.hyper.size() ||
        uploaded_params_ != table.param_steps.size() || hyper_version_ != table.hyper_version ||
        steps_version_ != table.steps_version || params_version_ != table.params_version)
      return true;
    for (std::size_t b = 0; b < plan.buckets.size(); ++b)
      for (std::size_t s = 0; s < plan.buckets[b].slots.size(); ++s)
        if (tables_[b].uploaded_grads[s] != plan.buckets[b].slots[s].grad) return true;
    return false;
  }

  // Hyperparameters, step counts and which params have grads change rarely (lr schedules:
  // every step, a few bytes per group); each goes up only when the core's version moved.
  // The arrays are reallocated (and all of them uploaded) when groups or params were added.
  void upload_groups(const StepTable& table, cudaStream_t stream) {
    const std::size_t groups = table.hyper.size(), params = table.param_steps.size();
    if (!hyper_ || uploaded_groups_ != groups || uploaded_params_ != params) {
      hyper_ = allocate(std::max<std::size_t>(groups, 1) * sizeof(kernels::AdamHyper));
      steps_ = allocate(std::max<std::size_t>(groups, 1) * sizeof(int64_t));
      param_group_ = allocate(std::max<std::size_t>(params, 1) * sizeof(int32_t));
      param_active_ = allocate(std::max<std::size_t>(params, 1) * sizeof(uint8_t));
      param_steps_ = allocate(std::max<std::size_t>(params, 1) * sizeof(int64_t));
      coeffs_ = allocate(std::max<std::size_t>(params, 1) * sizeof(kernels::GroupCoeffs));
      uploaded_groups_ = groups;
      uploaded_params_ = params;
      hyper_version_ = steps_version_ = params_version_ = ~uint64_t{0};
    }
    if (hyper_version_ != table.hyper_version) {
      staging_.upload(hyper_->data(), table.hyper.data(), groups * sizeof(kernels::AdamHyper),
                      stream);
      hyper_version_ = table.hyper_version;
    }
    if (steps_version_ != table.steps_version) {
      staging_.upload(steps_->data(), table.steps.data(), groups * sizeof(int64_t), stream);
      staging_.upload(param_steps_->data(), table.param_steps.data(), params * sizeof(int64_t),
                      stream);
      steps_version_ = table.steps_version;
    }
    if (params_version_ != table.params_version) {
      staging_.upload(param_group_->data(), table.param_group.data(), params * sizeof(int32_t),
                      stream);
      staging_.upload(param_active_->data(), table.param_active.data(), params * sizeof(uint8_t),
                      stream);
      params_version_ = table.params_version;
    }
  }

  // Grad rebinding: compare with what the device holds; upload a bucket's slot table
  // only if one of its grad pointers moved. Stable grad buffers cost one compare each.
  void upload_changed_grads(const Plan& plan, cudaStream_t stream) {
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      const auto& slots = plan.buckets[b].slots;
      auto& uploaded = tables_[b].uploaded_grads;
      bool changed = false;
      for (std::size_t s = 0; s < slots.size(); ++s) {
        if (uploaded[s] != slots[s].grad) {
          uploaded[s] = slots[s].grad;
          changed = true;
        }
      }
      if (changed)
        staging_.upload(tables_[b].slots->data(), slots.data(),
                        slots.size() * sizeof(kernels::TensorSlot), stream);
    }
  }

  // Device scratch of a step: the verdict, then the stats (kNumStats doubles), then the
  // per-chunk norm partials of every bucket.
  kernels::StepVerdict* verdict() const {
    return static_cast<kernels::StepVerdict*>(scratch_->data());
  }
  double* stats() const {
    return reinterpret_cast<double*>(static_cast<char*>(scratch_->data()) +
                                     sizeof(kernels::StepVerdict));
  }
  double* partials() const { return stats() + kernels::kNumStats; }

  // This rank's step stats into stats(), then, with a communicator, their reduction
  // across ranks: NCCL on the stream; host callbacks through pinned memory, which needs
  // the stream drained first (and so cannot be captured).
  void reduce_stats(const Plan& plan, const StepInputs& inputs, cudaStream_t stream) {
    const kernels::NormType norm = inputs.clip.norm;
    int64_t num_partials = 0;
    if (norm != kernels::NormType::none) {
      for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
        check_cuda(
            kernels::launch_grad_norm_partials(plan.buckets[b].variant.grad, norm, tables_[b].view,
                                               partials() + num_partials, stream),
            "gradient norm launch");
        num_partials += tables_[b].view.num_chunks;
      }
    }
    check_cuda(kernels::launch_grad_norm_finish(
                   norm == kernels::NormType::inf ? norm : kernels::NormType::l2, partials(),
                   num_partials, inputs.found_inf, stats(), stream),
               "gradient norm launch");
    if (inputs.comm == nullptr) return;
    const ReduceOp op = norm == kernels::NormType::inf ? ReduceOp::max : ReduceOp::sum;
    if (inputs.comm->reduces_device_memory()) {
      inputs.comm->all_reduce(stats(), kernels::kNumStats, op, stream);
      return;
    }
    if (capturing(stream))
      fail(SA_ERR_STATE,
           "a step with a host-callback communicator cannot be captured in a CUDA graph "
           "(the host must read the stats); use an NCCL communicator");
    if (!host_stats_)
      host_stats_ = std::make_shared<PinnedBuffer>(kernels::kNumStats * sizeof(double));
    auto* host = static_cast<double*>(host_stats_->data());
    check_cuda(cudaMemcpyAsync(host, stats(), kernels::kNumStats * sizeof(double),
                               cudaMemcpyDeviceToHost, stream),
               "reading the step stats");
    check_cuda(cudaStreamSynchronize(stream), "reading the step stats");
    inputs.comm->all_reduce(host, kernels::kNumStats, op, nullptr);
    staging_.upload(stats(), host, kernels::kNumStats * sizeof(double), stream);
  }

  int device_;
  std::vector<DeviceTables> tables_;
  std::shared_ptr<Buffer> scratch_;     // verdict, stats, norm partials (see verdict())
  std::shared_ptr<Buffer> host_stats_;  // pinned: the stats for a host communicator
  // Device copies of the StepTable (hyper_, steps_: per group; the rest per param) and
  // the per-param coefficients the fold kernel writes.
  std::shared_ptr<Buffer> hyper_, steps_, param_group_, param_active_, param_steps_, coeffs_;
  std::size_t uploaded_groups_ = 0, uploaded_params_ = 0;  // sizes of those arrays
  uint64_t hyper_version_ = ~uint64_t{0};
  uint64_t steps_version_ = ~uint64_t{0};
  uint64_t params_version_ = ~uint64_t{0};
  StagingRing staging_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

}  // namespace sa
