// tests/gpu/cuda_test_support.hpp — what the GPU tests share: CUDA status checks, device
// tensors handed to an optimizer as kDLCUDA DLPack tensors, a device float, and reading a
// state view back to the host.
#ifndef SHARDADAM_TESTS_GPU_CUDA_TEST_SUPPORT_HPP_
#define SHARDADAM_TESTS_GPU_CUDA_TEST_SUPPORT_HPP_

#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace sa_test {

#define CUDA_OK(call)                                                              \
  do {                                                                             \
    const cudaError_t cuda_status_ = (call);                                       \
    INFO(#call << ": " << cudaGetErrorString(cuda_status_));                       \
    REQUIRE(cuda_status_ == cudaSuccess);                                          \
  } while (0)

// Device memory handed to an optimizer as a kDLCUDA DLPack tensor. The memory is the
// test's (freed with this object, which must outlive the optimizer); the managed form's
// deleter only counts. `offset_elems` shifts the data off the allocation's alignment, so
// the kernel's scalar path (and its vector/scalar boundary) gets exercised.
class DeviceTensor {
 public:
  DeviceTensor(std::vector<int64_t> shape, DLDataType dtype, int64_t offset_elems = 0)
      : shape_(std::move(shape)), dtype_(dtype) {
    CUDA_OK(cudaGetDevice(&device_));  // the tensor lives on the current device
    numel_ = 1;
    for (int64_t d : shape_) numel_ *= d;
    bytes_ = static_cast<std::size_t>(numel_) * dtype_bytes(dtype);
    const std::size_t offset = static_cast<std::size_t>(offset_elems) * dtype_bytes(dtype);
    CUDA_OK(cudaMalloc(&base_, bytes_ + offset + 256));
    CUDA_OK(cudaMemset(base_, 0, bytes_ + offset + 256));
    data_ = static_cast<char*>(base_) + offset;
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() { cudaFree(base_); }

  void* data() const { return data_; }
  int64_t numel() const { return numel_; }
  std::size_t bytes() const { return bytes_; }

  void upload(const HostTensor& h) {
    REQUIRE(h.bytes() == bytes_);
    CUDA_OK(cudaMemcpy(data_, h.data(), bytes_, cudaMemcpyHostToDevice));
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(bytes_);
    CUDA_OK(cudaMemcpy(out.data(), data_, bytes_, cudaMemcpyDeviceToHost));
    return out;
  }
  DLTensor dl() const {
    DLTensor t{};
    t.data = data_;
    t.device = DLDevice{kDLCUDA, device_};
    t.ndim = static_cast<int32_t>(shape_.size());
    t.dtype = dtype_;
    t.shape = const_cast<int64_t*>(shape_.data());
    return t;
  }
  DLManagedTensorVersioned* versioned() {
    managed_.version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    managed_.manager_ctx = this;
    managed_.deleter = [](DLManagedTensorVersioned* self) {
      ++static_cast<DeviceTensor*>(self->manager_ctx)->deleter_calls_;
    };
    managed_.flags = 0;
    managed_.dl_tensor = dl();
    return &managed_;
  }
  int deleter_calls() const { return deleter_calls_; }

 private:
  std::vector<int64_t> shape_;
  DLDataType dtype_;
  int device_ = 0;
  int64_t numel_ = 0;
  std::size_t bytes_ = 0;
  void* base_ = nullptr;
  void* data_ = nullptr;
  DLManagedTensorVersioned managed_{};
  int deleter_calls_ = 0;
};

// One float in device memory (inv_grad_scale, found_inf).
class DeviceFloat {
 public:
  DeviceFloat() { CUDA_OK(cudaMalloc(&p_, sizeof(float))); }
  ~DeviceFloat() { cudaFree(p_); }
  DeviceFloat(const DeviceFloat&) = delete;
  DeviceFloat& operator=(const DeviceFloat&) = delete;
  void set(float v) { CUDA_OK(cudaMemcpy(p_, &v, sizeof v, cudaMemcpyHostToDevice)); }
  const float* get() const { return p_; }

 private:
  float* p_ = nullptr;
};

// Where the CUDA optimizer of a GPU test keeps its params' state (sa_state_placement).
enum class GpuState {
  device,    // every param's in device memory
  host,      // every param's in pinned host memory (SA_STATE_ON_HOST)
  mixed,     // every other param's on the host, the others' on the device: buckets of both
  cpu_step,  // every param's on the host, stepped by the CPU (SA_STATE_ON_HOST_CPU_STEP)
  all_three  // the i-th param's on the device, on the host, stepped by the CPU, by i % 3
};

// The placement `mode` gives the i-th param added.
inline int32_t placement_of(GpuState mode, std::size_t i) {
  switch (mode) {
    case GpuState::device:
      return SA_STATE_ON_DEVICE;
    case GpuState::host:
      return SA_STATE_ON_HOST;
    case GpuState::mixed:
      return i % 2 == 1 ? SA_STATE_ON_HOST : SA_STATE_ON_DEVICE;
    case GpuState::cpu_step:
      return SA_STATE_ON_HOST_CPU_STEP;
    case GpuState::all_three:
      break;
  }
  const int32_t placements[3] = {SA_STATE_ON_DEVICE, SA_STATE_ON_HOST, SA_STATE_ON_HOST_CPU_STEP};
  return placements[i % 3];
}

// One sa_optimizer_step recorded on `stream` (args NULL): its status and message, and the
// capture already ended, so that no REQUIRE after it can leave a capture open (one that
// outlives its test breaks every test after it).
struct CapturedStep {
  sa_status status;
  std::string message;  // sa_optimizer_last_error after the step
  cudaError_t ended;    // cudaStreamEndCapture's
  cudaGraph_t graph;    // NULL when the capture was invalidated; the caller destroys it
};

inline CapturedStep capture_step(sa_optimizer* opt, cudaStream_t stream) {
  CapturedStep c{SA_OK, "", cudaSuccess, nullptr};
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  c.status = sa_optimizer_step(opt, nullptr, stream);
  c.message = sa_optimizer_last_error(opt);
  c.ended = cudaStreamEndCapture(stream, &c.graph);
  return c;
}

inline std::vector<unsigned char> download_view(const StateView& v) {
  std::vector<unsigned char> out(static_cast<std::size_t>(v.numel()) * dtype_bytes(v.view->dl_tensor.dtype));
  // Default: the view is device memory, or pinned host memory (state on the host).
  CUDA_OK(cudaMemcpy(out.data(), v.data(), out.size(), cudaMemcpyDefault));
  return out;
}

}  // namespace sa_test

#endif  // SHARDADAM_TESTS_GPU_CUDA_TEST_SUPPORT_HPP_
