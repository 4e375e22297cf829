// src/backends/cuda_backend.cu — the CUDA backend's primitives: device memory,
// device-resident slot tables, and launches enqueued on the caller's stream.
//
// Where the host must wait, and why:
//  - allocate / widen_to_f32 (add_param) and prepare (the first step after params were
//    added): setup, synchronous by contract.
//  - launches and uploads: never, in steady state. Uploads go through pinned staging
//    slots with async copies on the stream; a slot is reused only after the copy that read
//    it has completed (an event per slot), so a step still in flight never sees its inputs
//    change.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "../../kernels/cuda/adam_cuda.cuh"
#include "../../kernels/cuda/adam_fp8_cuda.cuh"
#include "../../kernels/variants.h"
#include "../backend.hpp"
#include "../errors.hpp"
#include "cuda_module.hpp"

namespace sa {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // a failed call leaves its error for the next launch's check: clear it
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

// Pinned host memory (cudaMallocHost / cudaHostAlloc), freed with cudaFreeHost. Copies from
// and to it run at the link's full speed, without a hidden bounce through the driver's own
// staging.
class PinnedBuffer final : public Buffer {
 public:
  // Staging for state export/import, not zeroed.
  static std::shared_ptr<Buffer> staging(std::size_t bytes) {
    void* data = nullptr;
    check_cuda(cudaMallocHost(&data, std::max<std::size_t>(bytes, 1)),
               "cudaMallocHost of staging memory");
    return std::make_shared<PinnedBuffer>(data, bytes);
  }

  // State placed on the host (SA_STATE_ON_HOST): mapped, zero-filled. Kernels reach it at
  // the address the host uses (unified addressing, checked), so a bucket's slots may point
  // at it as they point at device memory. kStagingAlign bytes past its end belong to no
  // state: states in two allocations are never within kStagingAlign of each other, so a
  // step never moves two allocations in one copy (plan.cpp's stage).
  static std::shared_ptr<Buffer> state(std::size_t bytes) {
    // More than the host has is refused before the driver tries: pinning pages until the
    // host runs out would wake its out-of-memory killer rather than fail this call.
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 &&
        bytes / static_cast<std::size_t>(page) >= static_cast<std::size_t>(pages))
      fail(SA_ERR_OUT_OF_MEMORY, "cannot pin ", bytes,
           " bytes of host memory for state on the host: the host has ",
           static_cast<std::size_t>(pages) * static_cast<std::size_t>(page), " bytes in all");
    void* data = nullptr;
    const cudaError_t status =
        cudaHostAlloc(&data, bytes + kStagingAlign, cudaHostAllocMapped | cudaHostAllocPortable);
    if (status != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it for the caller's next call
      fail(SA_ERR_OUT_OF_MEMORY, "cannot pin ", bytes,
           " bytes of host memory for state on the host (", cudaGetErrorName(status), ": ",
           cudaGetErrorString(status), ")");
    }
    auto buffer = std::make_shared<PinnedBuffer>(data, bytes);  // frees it on a throw below
    void* device = nullptr;
    const cudaError_t mapped = cudaHostGetDevicePointer(&device, data, 0);
    if (mapped != cudaSuccess || device != data)
      fail(SA_ERR_UNSUPPORTED,
           "state on the host needs the device to reach host memory at the "
           "host's address (unified addressing); this one maps it elsewhere");
    std::memset(data, 0, bytes);
    return buffer;
  }

  // Takes `data` over (pinned, `bytes` long).
  PinnedBuffer(void* data, std::size_t bytes) : data_(data), bytes_(bytes) {}
  ~PinnedBuffer() override { cudaFreeHost(data_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const override { return data_; }
  std::size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  std::size_t bytes_;
};

// A part of a PinnedBuffer::state block.
class MappedPart final : public Buffer {
 public:
  MappedPart(std::shared_ptr<Buffer> block, std::size_t offset, std::size_t bytes)
      : block_(std::move(block)), offset_(offset), bytes_(bytes) {}
  void* data() const override { return static_cast<char*>(block_->data()) + offset_; }
  std::size_t bytes() const override { return bytes_; }

 private:
  std::shared_ptr<Buffer> block_;
  std::size_t offset_, bytes_;
};

// State on the host of one StateKind, one allocation after the other (256-byte aligned) in
// pinned blocks that grow with the pool (1 MiB, doubling, up to 64 MiB), so that the states
// of params added one after another are adjacent and a step moves them in one copy
// (plan.cpp's stage). An allocation of more than a quarter of the largest block gets a
// buffer of its own.
class HostStatePool {
 public:
  // Parts start kStagingAlign apart at most past the last one's end: stage() merges those.
  static constexpr std::size_t kAlign = kStagingAlign, kFirst = std::size_t{1} << 20,
                               kLargest = std::size_t{64} << 20;

  std::shared_ptr<Buffer> allocate(std::size_t bytes) {
    if (bytes > kLargest / 4) return PinnedBuffer::state(bytes);
    const std::size_t aligned = (bytes + kAlign - 1) / kAlign * kAlign;
    if (!block_ || used_ + aligned > block_->bytes()) {
      block_ =
          PinnedBuffer::state(std::max(aligned, std::min(kLargest, std::max(kFirst, 2 * total_))));
      total_ += block_->bytes();
      used_ = 0;
    }
    auto part = std::make_shared<MappedPart>(block_, used_, bytes);
    used_ += aligned;
    return part;
  }

 private:
  std::shared_ptr<Buffer> block_;  // where the next allocation goes
  std::size_t used_ = 0, total_ = 0;
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
    check_cuda(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyDefault, stream),
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
  std::shared_ptr<Buffer> work;           // uint32_t[2], zeros: DeviceBucket::work
  kernels::DeviceBucket view{};
  // fp8 params with block moments only: the slots as their masters' update sees them
  // (kernels::fp8_master_slot), for the block-moment kernel; NULL otherwise.
  std::shared_ptr<Buffer> master_slots;
  kernels::DeviceBucket master_view{};
};

// The device side of state on the host: the ring of kStagingSlots device buffers a step
// streams it through, the streams of its uploads and downloads, and an event per ring slot
// for each of the three stages that hand it on.
class StagingPipeline {
 public:
  StagingPipeline() = default;
  StagingPipeline(const StagingPipeline&) = delete;
  StagingPipeline& operator=(const StagingPipeline&) = delete;
  ~StagingPipeline() {
    for (cudaEvent_t e : {start_})
      if (e) cudaEventDestroy(e);
    for (Slot& s : slots_)
      for (cudaEvent_t e : {s.uploaded, s.computed, s.downloaded})
        if (e) cudaEventDestroy(e);
    for (cudaStream_t s : {up_, down_})
      if (s) cudaStreamDestroy(s);
  }

  // Made on first use: a plan without state on the host costs nothing.
  void ensure(const std::function<std::shared_ptr<Buffer>(std::size_t)>& allocate) {
    if (ring_) return;
    ring_ = allocate(kStagingSlots * kStagingSlotBytes);
    check_cuda(cudaStreamCreateWithFlags(&up_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaStreamCreateWithFlags(&down_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming), "cudaEventCreate");
    for (Slot& s : slots_)
      for (cudaEvent_t* e : {&s.uploaded, &s.computed, &s.downloaded})
        check_cuda(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
  }

  char* ring(int slot) const {
    return static_cast<char*>(ring_->data()) + static_cast<std::size_t>(slot) * kStagingSlotBytes;
  }

  // Enqueues one segment after those before it: its state up into ring slot `slot`,
  // `launch` on `stream` once it is there, and its state down when `launch` is done. The
  // upload waits until the ring slot's last segment has gone down.
  // Uploads enqueued after this wait for the work on `stream` so far (the last step's
  // downloads among it, which join() made the stream wait for). Every event a step waits
  // for is recorded within it, so that a step can be captured in a CUDA graph (a capture
  // may not wait for work recorded outside it).
  void begin(cudaStream_t stream) {
    check_cuda(cudaEventRecord(start_, stream), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(up_, start_, 0), "cudaStreamWaitEvent");
    for (Slot& s : slots_) s.used = false;
  }

  template <typename Launch>
  void run(const StagedSegment& seg, int slot, cudaStream_t stream, Launch&& launch) {
    Slot& s = slots_[slot];
    if (s.used)  // the ring slot's last segment of this step must be down first
      check_cuda(cudaStreamWaitEvent(up_, s.downloaded, 0), "cudaStreamWaitEvent");
    s.used = true;
    copies(seg, slot, up_, /*up=*/true);
    check_cuda(cudaEventRecord(s.uploaded, up_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream, s.uploaded, 0), "cudaStreamWaitEvent");
    launch();
    check_cuda(cudaEventRecord(s.computed, stream), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(down_, s.computed, 0), "cudaStreamWaitEvent");
    copies(seg, slot, down_, /*up=*/false);
    check_cuda(cudaEventRecord(s.downloaded, down_), "cudaEventRecord");
  }

  // The caller's stream waits until the last segment's state is back on the host.
  void join(int last_slot, cudaStream_t stream) {
    check_cuda(cudaStreamWaitEvent(stream, slots_[last_slot].downloaded, 0), "cudaStreamWaitEvent");
  }

 private:
  void copies(const StagedSegment& seg, int slot, cudaStream_t stream, bool up) {
    char* ring_base = ring(slot);
    for (const StagedCopy& c : seg.copies) {
      char* on_ring = ring_base + c.ring_offset;
      check_cuda(cudaMemcpyAsync(up ? on_ring : c.host, up ? c.host : on_ring, c.bytes,
                                 up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream),
                 up ? "uploading state from the host" : "downloading state to the host");
    }
  }

  struct Slot {
    cudaEvent_t uploaded = nullptr, computed = nullptr, downloaded = nullptr;
    bool used = false;  // a segment of this step went through it
  };
  std::shared_ptr<Buffer> ring_;
  cudaStream_t up_ = nullptr, down_ = nullptr;
  cudaEvent_t start_ = nullptr;
  Slot slots_[kStagingSlots];
};

// Whether a bucket's fp8 params step in two launches (adam_fp8_cuda.cuh): the update of
// their masters by block moments' kernel, then the cast (or a current scaling's amax).
bool steps_masters_apart(const kernels::Variant& v) {
  return v.scaling != kernels::ParamScaling::none && kernels::is_block_storage(v.moment);
}

// A bucket's slots as fp8_master_slot gives them.
std::vector<kernels::TensorSlot> master_slots_of(const Bucket& bucket) {
  std::vector<kernels::TensorSlot> out;
  out.reserve(bucket.slots.size());
  for (const kernels::TensorSlot& s : bucket.slots) out.push_back(kernels::fp8_master_slot(s));
  return out;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    DeviceScope scope(device);
    cudaDeviceProp prop{};  // fails for a device index the runtime does not know
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  }

  DLDevice device() const override { return DLDevice{kDLCUDA, device_}; }

  // ---- memory and copies ---------------------------------------------------------------------

  bool host_memory() const override { return false; }

  std::shared_ptr<Buffer> allocate(std::size_t bytes) override {
    return std::make_shared<DeviceBuffer>(device_, bytes);
  }

  std::shared_ptr<Buffer> allocate_host_state(std::size_t bytes, StateKind kind) override {
    DeviceScope scope(device_);
    return host_pools_[static_cast<std::size_t>(kind)].allocate(bytes);
  }

  std::shared_ptr<Buffer> allocate_staging(std::size_t bytes) override {
    DeviceScope scope(device_);
    return PinnedBuffer::staging(bytes);
  }

  void copy_to_host(void* host, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    DeviceScope scope(device_);
    check_cuda(cudaMemcpy(host, src, bytes, cudaMemcpyDefault), "copying state to the host");
  }

  void copy_from_host(void* dst, const void* host, std::size_t bytes) override {
    if (bytes == 0) return;
    DeviceScope scope(device_);
    check_cuda(cudaMemcpy(dst, host, bytes, cudaMemcpyDefault), "copying state to the device");
  }

  void upload(void* dst, const void* host, std::size_t bytes, void* stream) override {
    DeviceScope scope(device_);
    staging_.upload(dst, host, bytes, static_cast<cudaStream_t>(stream));
  }

  void download(void* staging, const void* src, std::size_t bytes, void* stream) override {
    if (bytes == 0) return;
    DeviceScope scope(device_);
    check_cuda(
        cudaMemcpyAsync(staging, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync download");
  }

  // ---- synchronization ---------------------------------------------------------------------

  // Steps run on the caller's streams, which may be non-blocking: only a device-wide
  // synchronization guarantees that none of them still reads or writes backend memory.
  void synchronize() override {
    DeviceScope scope(device_);
    check_cuda(cudaDeviceSynchronize(), "synchronizing the device");
  }

  void synchronize_stream(void* stream) override {
    DeviceScope scope(device_);
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
               "synchronizing the stream");
  }

  bool capturing(void* stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status),
               "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }

  // ---- launches ----------------------------------------------------------------------------

  void widen_to_f32(float* dst, const void* src, kernels::ElemType type, int64_t n) override {
    DeviceScope scope(device_);
    check_cuda(kernels::launch_widen_to_f32(dst, src, type, n, nullptr), "master initialisation");
    check_cuda(cudaStreamSynchronize(nullptr), "master initialisation");
  }

  void dequantize_to_f32(float* dst, const void* src, kernels::ElemType type,
                         kernels::ParamScaling scaling, const kernels::ParamScale& scale,
                         int64_t n) override {
    DeviceScope scope(device_);
    check_cuda(kernels::launch_dequantize_param(type, scaling, src, scale, n, dst, nullptr),
               "fp8 master initialisation");
    check_cuda(cudaStreamSynchronize(nullptr), "fp8 master initialisation");
  }

  // The device tables of one launch over `slots`.
  DeviceTables make_tables(const std::vector<kernels::TensorSlot>& slots, int64_t numel) {
    DeviceTables t;
    std::vector<int64_t> offsets(slots.size() + 1, 0);
    for (std::size_t s = 0; s < slots.size(); ++s)
      offsets[s + 1] =
          offsets[s] + (slots[s].numel + kernels::kCudaChunkElems - 1) / kernels::kCudaChunkElems;
    if (offsets.back() > 0x7FFFFFFF)
      fail(SA_ERR_UNSUPPORTED, "a bucket of ", numel, " elements needs more than 2^31 chunks");
    t.slots = allocate(slots.size() * sizeof(kernels::TensorSlot));
    t.chunk_offsets = allocate(offsets.size() * sizeof(int64_t));
    copy_from_host(t.slots->data(), slots.data(), slots.size() * sizeof(kernels::TensorSlot));
    copy_from_host(t.chunk_offsets->data(), offsets.data(), offsets.size() * sizeof(int64_t));
    t.work = allocate(2 * sizeof(uint32_t));  // zero-filled, as allocate's are
    t.view = {static_cast<const kernels::TensorSlot*>(t.slots->data()),
              static_cast<const int64_t*>(t.chunk_offsets->data()),
              static_cast<int32_t>(slots.size()), offsets.back(),
              static_cast<uint32_t*>(t.work->data())};
    return t;
  }

  // The slots of `bucket`'s segment `seg`, their state in the ring slot it streams through.
  std::vector<kernels::TensorSlot> segment_slots(const Bucket& bucket,
                                                 const StagedSegment& seg) const {
    std::vector<kernels::TensorSlot> out;
    out.reserve(seg.pieces.size());
    for (const StagedPiece& piece : seg.pieces)
      out.push_back(staged_slot(bucket, piece, pipeline_.ring(seg.ring_slot)));
    return out;
  }

  void prepare(const Plan& plan, int64_t num_params) override {
    DeviceScope scope(device_);
    std::vector<DeviceTables> tables;
    std::vector<std::vector<DeviceTables>> segment_tables(plan.buckets.size());
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      const Bucket& bucket = plan.buckets[b];
      DeviceTables t = make_tables(bucket.slots, bucket.numel);
      if (steps_masters_apart(bucket.variant)) {
        const std::vector<kernels::TensorSlot> masters = master_slots_of(bucket);
        t.master_slots = allocate(masters.size() * sizeof(kernels::TensorSlot));
        copy_from_host(t.master_slots->data(), masters.data(),
                       masters.size() * sizeof(kernels::TensorSlot));
        t.master_view = t.view;
        t.master_view.slots = static_cast<const kernels::TensorSlot*>(t.master_slots->data());
      }
      tables.push_back(std::move(t));
      if (!bucket.segments.empty())
        pipeline_.ensure([this](std::size_t bytes) { return allocate(bytes); });
      for (const StagedSegment& seg : bucket.segments)
        segment_tables[b].push_back(make_tables(segment_slots(bucket, seg), bucket.numel));
    }
    std::shared_ptr<Buffer> current;
    if (!plan.current.empty()) {
      current = allocate(plan.current.size() * sizeof(kernels::CurrentScale));
      copy_from_host(current->data(), plan.current.data(),
                     plan.current.size() * sizeof(kernels::CurrentScale));
    }
    int64_t total_chunks = 0;
    for (const DeviceTables& t : tables) total_chunks += t.view.num_chunks;
    auto partials =
        allocate(std::max<std::size_t>(static_cast<std::size_t>(total_chunks), 1) * sizeof(double));
    auto coeffs = allocate(std::max<std::size_t>(static_cast<std::size_t>(num_params), 1) *
                           sizeof(kernels::GroupCoeffs));
    tables_ = std::move(tables);
    segment_tables_ = std::move(segment_tables);
    current_ = std::move(current);
    num_current_ = static_cast<int32_t>(plan.current.size());
    partials_ = std::move(partials);
    coeffs_ = std::move(coeffs);
  }

  void upload_slots(const Plan& plan, std::size_t bucket, void* stream) override {
    const auto& slots = plan.buckets[bucket].slots;
    upload(tables_[bucket].slots->data(), slots.data(), slots.size() * sizeof(kernels::TensorSlot),
           stream);
    if (!plan.buckets[bucket].segments.empty()) {  // their slots take their grads from the bucket's
      const Bucket& staged = plan.buckets[bucket];
      for (std::size_t i = 0; i < staged.segments.size(); ++i) {
        const std::vector<kernels::TensorSlot> seg = segment_slots(staged, staged.segments[i]);
        upload(segment_tables_[bucket][i].slots->data(), seg.data(),
               seg.size() * sizeof(kernels::TensorSlot), stream);
      }
    }
    if (tables_[bucket].master_slots == nullptr) return;
    const std::vector<kernels::TensorSlot> masters = master_slots_of(plan.buckets[bucket]);
    upload(tables_[bucket].master_slots->data(), masters.data(),
           masters.size() * sizeof(kernels::TensorSlot), stream);
  }

  // Per-chunk partials of every bucket, then one deterministic finish.
  void launch_stats(const Plan& plan, kernels::NormType norm, const float* found_inf, double* stats,
                    void* stream_handle) override {
    DeviceScope scope(device_);
    auto stream = static_cast<cudaStream_t>(stream_handle);
    auto* partials = static_cast<double*>(partials_->data());
    int64_t num_partials = 0;
    if (norm != kernels::NormType::none) {
      for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
        check_cuda(
            kernels::launch_grad_norm_partials(plan.buckets[b].variant.grad, norm, tables_[b].view,
                                               partials + num_partials, stream),
            "gradient norm launch");
        num_partials += tables_[b].view.num_chunks;
      }
    }
    check_cuda(kernels::launch_grad_norm_finish(
                   norm == kernels::NormType::inf ? norm : kernels::NormType::l2, partials,
                   num_partials, found_inf, stats, stream),
               "gradient norm launch");
  }

  void launch_fold(const kernels::FoldTables& tables, const kernels::FoldInputs& inputs,
                   void* stream) override {
    DeviceScope scope(device_);
    check_cuda(kernels::launch_fold_coefficients(
                   tables, inputs, static_cast<kernels::GroupCoeffs*>(coeffs_->data()),
                   static_cast<cudaStream_t>(stream)),
               "coefficient launch");
  }

  void launch_adam(const Plan& plan, const kernels::StepVerdict* verdict, void* stream) override {
    DeviceScope scope(device_);
    const kernels::DeviceStep step{static_cast<const kernels::GroupCoeffs*>(coeffs_->data()),
                                   verdict};
    const auto s = static_cast<cudaStream_t>(stream);
    check_cuda(kernels::launch_reset_current_amax(current_table(), num_current_, s),
               "current scaling's amax reset");
    bool staged = false;
    for (const Bucket& bucket : plan.buckets) staged = staged || !bucket.segments.empty();
    if (staged) pipeline_.begin(s);  // uploads start now, beside the device buckets' launches
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      const kernels::Variant& v = plan.buckets[b].variant;
      if (!plan.buckets[b].segments.empty()) continue;
      check_cuda(steps_masters_apart(v) ? kernels::launch_adam_bucket_scaled_blocks(
                                              v, tables_[b].view, tables_[b].master_view, step, s)
                                        : kernels::launch_adam_bucket(v, tables_[b].view, step, s),
                 "Adam kernel launch");
    }
    int last = -1;  // the ring slot of the last segment that moved
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      const Bucket& bucket = plan.buckets[b];
      for (std::size_t i = 0; i < bucket.segments.size(); ++i) {
        // A segment none of whose params has a grad (a partial step's others) stays put.
        const auto& pieces = bucket.segments[i].pieces;
        if (std::none_of(pieces.begin(), pieces.end(), [&](const StagedPiece& piece) {
              return bucket.slots[static_cast<std::size_t>(piece.slot)].grad != nullptr;
            }))
          continue;
        const kernels::DeviceBucket& view = segment_tables_[b][i].view;
        last = bucket.segments[i].ring_slot;
        pipeline_.run(bucket.segments[i], last, s, [&] {
          check_cuda(kernels::launch_adam_bucket(bucket.variant, view, step, s),
                     "Adam kernel launch");
        });
      }
    }
    if (last >= 0) pipeline_.join(last, s);
  }

  void launch_current_casts(const Plan& plan, const kernels::StepVerdict* verdict,
                            void* stream) override {
    DeviceScope scope(device_);
    const auto s = static_cast<cudaStream_t>(stream);
    check_cuda(kernels::launch_current_scales(current_table(), num_current_, verdict, s),
               "current scaling's scales");
    for (std::size_t b = 0; b < plan.buckets.size(); ++b)
      if (kernels::is_current(plan.buckets[b].variant.scaling))
        check_cuda(
            kernels::launch_current_cast(plan.buckets[b].variant, tables_[b].view, verdict, s),
            "current scaling's cast");
  }

  // On the legacy default stream, then waited for: synchronous by contract (recast).
  void measure_amax(const kernels::Variant&, const kernels::TensorSlot& slot) override {
    DeviceScope scope(device_);
    check_cuda(kernels::launch_measure_amax(slot, nullptr), "current scaling's amax");
    check_cuda(cudaStreamSynchronize(nullptr), "current scaling's amax");
  }

  // On the legacy default stream, then waited for: synchronous by contract (import).
  void cast_param(const kernels::Variant& variant, const kernels::TensorSlot& slot) override {
    DeviceScope scope(device_);
    check_cuda(kernels::launch_cast_param(variant, slot, nullptr), "fp8 param cast");
    check_cuda(cudaStreamSynchronize(nullptr), "fp8 param cast");
  }

 private:
  const kernels::CurrentScale* current_table() const {
    return current_ ? static_cast<const kernels::CurrentScale*>(current_->data()) : nullptr;
  }

  int device_;
  std::vector<DeviceTables> tables_;
  // Per bucket: the tables of its staged segments (state on the host), else none.
  std::vector<std::vector<DeviceTables>> segment_tables_;
  StagingPipeline pipeline_;
  HostStatePool host_pools_[kNumStateKinds];  // allocate_host_state's, per StateKind
  std::shared_ptr<Buffer> current_;           // plan.current, in device memory
  int32_t num_current_ = 0;
  std::shared_ptr<Buffer> partials_;  // per chunk of every bucket: the norm partials
  std::shared_ptr<Buffer> coeffs_;    // per param: what the last fold folded
  StagingRing staging_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

}  // namespace sa
