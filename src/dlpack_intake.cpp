#include "dlpack_intake.hpp"

#include <cstdint>
#include <utility>

#include "dtype.hpp"
#include "errors.hpp"

namespace sa {

std::string device_name(DLDevice device) {
  const char* type = nullptr;
  switch (device.device_type) {
    case kDLCPU:
      type = "cpu";
      break;
    case kDLCUDA:
      type = "cuda";
      break;
    case kDLCUDAHost:
      type = "cuda_host";
      break;
    case kDLCUDAManaged:
      type = "cuda_managed";
      break;
    case kDLROCM:
      type = "rocm";
      break;
    case kDLMetal:
      type = "metal";
      break;
    default:
      return concat("device_type ", static_cast<int>(device.device_type), ":", device.device_id);
  }
  return device.device_type == kDLCPU && device.device_id == 0
             ? std::string(type)
             : concat(type, ":", device.device_id);
}

TensorRef read_tensor(const DLTensor& t, const std::string& context, sa_status layout_status) {
  if (t.ndim < 0 || t.ndim > SA_MAX_NDIM)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": ndim ", t.ndim, " is outside [0, ", SA_MAX_NDIM, "]");
  if (t.ndim > 0 && t.shape == nullptr) fail(SA_ERR_INVALID_ARGUMENT, context, ": shape is NULL");
  TensorRef ref{};
  ref.dtype = t.dtype;
  ref.device = t.device;
  ref.shape.assign(t.shape, t.shape + t.ndim);
  ref.numel = 1;
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (ref.shape[d] < 0)
      fail(SA_ERR_INVALID_ARGUMENT, context, ": shape ", format_dims(ref.shape),
           " has a negative size");
    ref.numel *= ref.shape[d];
  }
  if (t.dtype.lanes != 1)
    fail(SA_ERR_UNSUPPORTED, context, ": dtype ", dtype_name(t.dtype), " has ", t.dtype.lanes,
         " lanes; only scalar dtypes are supported");
  // C-contiguous: strides NULL, or equal to the row-major strides wherever the size is
  // above 1 (a dim of size 0 or 1 may carry any stride).
  if (ref.numel > 0 && !row_major(t.shape, t.strides, t.ndim))
    fail(layout_status, context, ": tensor of shape ", format_dims(ref.shape), " has strides ",
         format_dims(Dims(t.strides, t.strides + t.ndim)),
         "; it must be C-contiguous (an expanded, transposed, sliced or otherwise strided "
         "tensor is refused: shardadam reads the elements in row-major order)");
  ref.data = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;
  if (ref.numel > 0 && ref.data == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": data is NULL for a tensor of ", ref.numel,
         " elements");
  const std::size_t align = (t.dtype.bits + 7u) / 8u;
  if (ref.data != nullptr && align > 1 && reinterpret_cast<std::uintptr_t>(ref.data) % align != 0)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": data + byte_offset (", ref.data,
         ") is not aligned to the element size of ", align, " bytes");
  return ref;
}

ManagedTensor& ManagedTensor::operator=(ManagedTensor&& other) noexcept {
  if (this != &other) {
    reset();
    versioned_ = std::exchange(other.versioned_, nullptr);
    legacy_ = std::exchange(other.legacy_, nullptr);
  }
  return *this;
}

void ManagedTensor::reset() {
  if (versioned_ && versioned_->deleter) versioned_->deleter(versioned_);
  if (legacy_ && legacy_->deleter) legacy_->deleter(legacy_);
  versioned_ = nullptr;
  legacy_ = nullptr;
}

}  // namespace sa
