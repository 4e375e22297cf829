// src/dlpack_intake.hpp — checking DLPack tensors at the door, and owning the managed
// tensors a caller hands over.
#ifndef SHARDADAM_SRC_DLPACK_INTAKE_HPP_
#define SHARDADAM_SRC_DLPACK_INTAKE_HPP_

#include <cstdint>
#include <string>

#include <dlpack/dlpack.h>

#include "layout.hpp"
#include "shardadam/shardadam.h"

namespace sa {

// A validated tensor: C-contiguous, lanes == 1, data (byte_offset applied) aligned to
// the element size, non-NULL unless empty.
struct TensorRef {
  void* data;
  DLDataType dtype;
  DLDevice device;
  Dims shape;
  int64_t numel;
};

// Validates `tensor`; `context` starts every error message ("... param 'w': grad").
// Strides that are not C-contiguous fail with `layout_status`.
TensorRef read_tensor(const DLTensor& tensor, const std::string& context,
                      sa_status layout_status = SA_ERR_INVALID_ARGUMENT);

// Whether strides (NULL: row-major) describe the row-major layout of `shape`: equal to the
// row-major strides wherever the size is above 1 (a dim of size 0 or 1 may carry any
// stride). Callers skip it for empty tensors.
inline bool row_major(const int64_t* shape, const int64_t* strides, int32_t ndim) {
  if (strides == nullptr) return true;
  int64_t expected = 1;
  for (int32_t d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string device_name(DLDevice device);

inline bool same_device(DLDevice a, DLDevice b) {
  return a.device_type == b.device_type && a.device_id == b.device_id;
}

// Owns a DLManagedTensorVersioned or a legacy DLManagedTensor and calls its deleter once.
class ManagedTensor {
 public:
  ManagedTensor() = default;
  explicit ManagedTensor(DLManagedTensorVersioned* t) : versioned_(t) {}
  explicit ManagedTensor(DLManagedTensor* t) : legacy_(t) {}
  ManagedTensor(ManagedTensor&& other) noexcept { *this = std::move(other); }
  ManagedTensor& operator=(ManagedTensor&& other) noexcept;
  ManagedTensor(const ManagedTensor&) = delete;
  ManagedTensor& operator=(const ManagedTensor&) = delete;
  ~ManagedTensor() { reset(); }

  void reset();

 private:
  DLManagedTensorVersioned* versioned_ = nullptr;
  DLManagedTensor* legacy_ = nullptr;
};

}  // namespace sa

#endif  // SHARDADAM_SRC_DLPACK_INTAKE_HPP_
