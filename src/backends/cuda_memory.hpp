// src/backends/cuda_memory.hpp — the CUDA backend's memory and copy machinery: device and
// pinned host buffers, the pool of pinned host state, the staging ring of uploads, and the
// three-stream pipeline that moves segments through a ring (state on the host: the GPU
// step's device ring and the CPU step's pinned mirror). Internal to the CUDA module
// (cuda_backend.cu), which holds the backend's logic; nothing here knows the optimizer or
// its kernels.
#ifndef SHARDADAM_SRC_BACKENDS_CUDA_MEMORY_HPP_
#define SHARDADAM_SRC_BACKENDS_CUDA_MEMORY_HPP_

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "../backend.hpp"
#include "../errors.hpp"

namespace sa {
namespace cuda {

inline void check_cuda(cudaError_t status, const char* what) {
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

// A part of a StatePool block.
class BlockPart final : public Buffer {
 public:
  BlockPart(std::shared_ptr<Buffer> block, std::size_t offset, std::size_t bytes)
      : block_(std::move(block)), offset_(offset), bytes_(bytes) {}
  void* data() const override { return static_cast<char*>(block_->data()) + offset_; }
  std::size_t bytes() const override { return bytes_; }

 private:
  std::shared_ptr<Buffer> block_;
  std::size_t offset_, bytes_;
};

// State of one StateKind and place, one allocation after the other (256-byte aligned) in
// zero-filled blocks that grow with the pool (1 MiB, doubling, up to 64 MiB): the states of
// params added one after another are adjacent, so that a step moves host states in one copy
// (plan.cpp's stage), and 100k small params cost a few hundred allocations, not 200k
// cudaMalloc + cudaMemset pairs (1.5 s of FusedAdam's construction on an H100 host). An
// allocation of more than a quarter of the largest block gets a buffer of its own. A block
// lives while any part of it does.
class StatePool {
 public:
  // Parts start kStagingAlign apart at most past the last one's end: stage() merges those.
  static constexpr std::size_t kAlign = kStagingAlign, kFirst = std::size_t{1} << 20,
                               kLargest = std::size_t{64} << 20;

  // `make_block(n)`: n zero-filled bytes (PinnedBuffer::state, a DeviceBuffer).
  template <class MakeBlock>
  std::shared_ptr<Buffer> allocate(std::size_t bytes, const MakeBlock& make_block) {
    if (bytes > kLargest / 4) return make_block(bytes);
    const std::size_t aligned = (bytes + kAlign - 1) / kAlign * kAlign;
    if (!block_ || used_ + aligned > block_->bytes()) {
      block_ = make_block(std::max(aligned, std::min(kLargest, std::max(kFirst, 2 * total_))));
      total_ += block_->bytes();
      used_ = 0;
    }
    auto part = std::make_shared<BlockPart>(block_, used_, bytes);
    used_ += aligned;
    return part;
  }

 private:
  std::shared_ptr<Buffer> block_;  // where the next allocation goes
  std::size_t used_ = 0, total_ = 0;
};

// Pinned host staging for async uploads: a ring of slots, each guarded by the event of the
// last copy that read it. A flush uploads a table per bucket whose grads moved; when the
// oldest slot's copy is still queued (behind the last step's kernels), the ring grows by a
// slot instead of waiting for it, so that a step's uploads never wait for the GPU. An engine
// that hands fresh grad pointers every step made a ring of 8 slots wait on its own copies:
// 121 us of host time per step against 8.7 with stable pointers; 38 us with the growing
// ring (bench/gpu_host_time, 1,516 shards, an H200). Past kMaxSlots in flight it waits for
// the oldest.
class StagingRing {
 public:
  static constexpr std::size_t kMaxSlots = 1024;
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
    Slot& s = take_slot();
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

  // The oldest slot (next_) when its copy is done; else a new slot placed before it (the
  // newest in the ring's order); past kMaxSlots, the oldest once its copy is done.
  Slot& take_slot() {
    if (!slots_.empty()) {
      Slot& oldest = slots_[next_];
      const cudaError_t status = oldest.event ? cudaEventQuery(oldest.event) : cudaSuccess;
      if (status != cudaErrorNotReady) {
        check_cuda(status, "querying a staging slot's copy");
        next_ = (next_ + 1) % slots_.size();
        return oldest;
      }
      if (slots_.size() >= kMaxSlots) {
        check_cuda(cudaEventSynchronize(oldest.event), "waiting for a staging slot");
        next_ = (next_ + 1) % slots_.size();
        return oldest;
      }
    }
    slots_.insert(slots_.begin() + static_cast<std::ptrdiff_t>(next_), Slot{});
    Slot& fresh = slots_[next_];
    next_ = (next_ + 1) % slots_.size();
    return fresh;
  }

  std::vector<Slot> slots_;
  std::size_t next_ = 0;  // the oldest slot
};

// One copy a pipeline stage enqueues: `bytes` from `src` to `dst` (either side host or
// device memory).
struct Copy {
  void* dst;
  const void* src;
  std::size_t bytes;
};

// Adds a copy to `copies`, extending the last one where both ends continue it.
inline void add_copy(std::vector<Copy>& copies, void* dst, const void* src, std::size_t bytes) {
  if (!copies.empty()) {
    Copy& last = copies.back();
    if (static_cast<char*>(last.dst) + last.bytes == dst &&
        static_cast<const char*>(last.src) + last.bytes == src) {
      last.bytes += bytes;
      return;
    }
  }
  copies.push_back({dst, src, bytes});
}

inline void enqueue_copies(const std::vector<Copy>& copies, cudaStream_t stream, const char* what) {
  for (const Copy& c : copies)
    check_cuda(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, stream), what);
}

// A ring of kStagingSlots buffers of kStagingSlotBytes that a step streams segments
// through, in three stages on three streams: copies in (on in_), the segment's compute (on
// the stream the caller names), copies out (on out_), with an event per ring slot for each
// stage that hands it on. State on the host (GPU step): a device ring, state in, kernels on
// the caller's stream, state out. State the CPU steps: a pinned host ring (the mirror),
// param and grad in, the host's Adam as a stream callback, param out.
class StagingPipeline {
 public:
  StagingPipeline() = default;
  StagingPipeline(const StagingPipeline&) = delete;
  StagingPipeline& operator=(const StagingPipeline&) = delete;
  ~StagingPipeline() {
    for (cudaEvent_t e : {start_})
      if (e) cudaEventDestroy(e);
    for (Slot& s : slots_)
      for (cudaEvent_t e : {s.in, s.computed, s.out})
        if (e) cudaEventDestroy(e);
    for (cudaStream_t s : {in_, out_})
      if (s) cudaStreamDestroy(s);
  }

  // Made on first use (the ring by `allocate`): a plan without such state costs nothing.
  void ensure(const std::function<std::shared_ptr<Buffer>(std::size_t)>& allocate) {
    if (ring_) return;
    ring_ = allocate(kStagingSlots * kStagingSlotBytes);
    check_cuda(cudaStreamCreateWithFlags(&in_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaStreamCreateWithFlags(&out_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming), "cudaEventCreate");
    for (Slot& s : slots_)
      for (cudaEvent_t* e : {&s.in, &s.computed, &s.out})
        check_cuda(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
  }

  char* ring(int slot) const {
    return static_cast<char*>(ring_->data()) + static_cast<std::size_t>(slot) * kStagingSlotBytes;
  }

  // Copies in enqueued after this wait for the work on `stream` so far (the last step's
  // copies out among it, which join() made the stream wait for). Every event a step waits
  // for is recorded within it, so that a step can be captured in a CUDA graph (a capture
  // may not wait for work recorded outside it).
  void begin(cudaStream_t stream) {
    check_cuda(cudaEventRecord(start_, stream), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(in_, start_, 0), "cudaStreamWaitEvent");
    for (Slot& s : slots_) s.used = false;
  }

  // Enqueues one segment after those before it: `in` (its copies) into ring slot `slot`,
  // `compute` on `compute_stream` once they are there, and `out` when it is done. The copies
  // in wait until the ring slot's last segment's copies out are done.
  void run(int slot, const std::vector<Copy>& in, cudaStream_t compute_stream,
           const std::function<void()>& compute, const std::vector<Copy>& out) {
    Slot& s = slots_[slot];
    if (s.used)  // the ring slot's last segment of this step must be out first
      check_cuda(cudaStreamWaitEvent(in_, s.out, 0), "cudaStreamWaitEvent");
    s.used = true;
    enqueue_copies(in, in_, "staging a segment in");
    check_cuda(cudaEventRecord(s.in, in_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(compute_stream, s.in, 0), "cudaStreamWaitEvent");
    compute();
    check_cuda(cudaEventRecord(s.computed, compute_stream), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(out_, s.computed, 0), "cudaStreamWaitEvent");
    enqueue_copies(out, out_, "staging a segment out");
    check_cuda(cudaEventRecord(s.out, out_), "cudaEventRecord");
  }

  // The caller's stream waits until the last segment's copies out are done.
  void join(int last_slot, cudaStream_t stream) {
    check_cuda(cudaStreamWaitEvent(stream, slots_[last_slot].out, 0), "cudaStreamWaitEvent");
  }

 private:
  struct Slot {
    cudaEvent_t in = nullptr, computed = nullptr, out = nullptr;
    bool used = false;  // a segment of this step went through it
  };
  std::shared_ptr<Buffer> ring_;
  cudaStream_t in_ = nullptr, out_ = nullptr;
  cudaEvent_t start_ = nullptr;
  Slot slots_[kStagingSlots];
};

}  // namespace cuda
}  // namespace sa

#endif  // SHARDADAM_SRC_BACKENDS_CUDA_MEMORY_HPP_
