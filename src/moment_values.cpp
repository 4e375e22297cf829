// src/moment_values.cpp — moments as float32 values (see moment_values.hpp).
#include "moment_values.hpp"

#include <algorithm>
#include <cmath>
#include <new>
#include <vector>

#include "../kernels/block_moment.h"
#include "dlpack_intake.hpp"
#include "dtype.hpp"
#include "errors.hpp"

namespace sa {

void block_values(ElemType type, bool is_signed, const uint8_t* codes, const float* absmax,
                  int64_t n, float* out) {
  const bool block_type = kernels::visit_block_storage(type, [&](auto tag) {
    constexpr ElemType kType = decltype(tag)::value;
    const auto book = kernels::block_book<kType>(is_signed);
    const int64_t block = kernels::kQuant8Block;
    for (int64_t b = 0; b * block < n; ++b) {
      const int64_t m = std::min(block, n - b * block);
      kernels::decode_block<kType>(book, codes + b * block, absmax[b], m, out + b * block);
      // Written so that they quantize back to the same absmax (a finite, nonzero one).
      if (absmax[b] > 0.0f && !std::isinf(absmax[b]))
        kernels::BlockCodec<kType>::keep_absmax(codes + b * block, m, absmax[b], is_signed,
                                                out + b * block);
    }
  });
  if (!block_type) fail(SA_ERR_INTERNAL, "block values of a ", elem_name(type), " moment");
}

void block_from_values(ElemType type, bool is_signed, const float* values, int64_t n,
                       uint8_t* codes, float* absmax) {
  const bool block_type = kernels::visit_block_storage(type, [&](auto tag) {
    constexpr ElemType kType = decltype(tag)::value;
    const auto book = kernels::block_book<kType>(is_signed);
    const int64_t block = kernels::kQuant8Block;
    for (int64_t b = 0; b * block < n; ++b)
      absmax[b] = kernels::encode_block<kType>(book, values + b * block,
                                               std::min(block, n - b * block), codes + b * block);
  });
  if (!block_type) fail(SA_ERR_INTERNAL, "block codes of a ", elem_name(type), " moment");
}

namespace {

int64_t blocks_of(int64_t n) { return (n + kernels::kQuant8Block - 1) / kernels::kQuant8Block; }

template <class T>
std::vector<T> host_vector(int64_t n) {
  try {
    return std::vector<T>(static_cast<std::size_t>(n));
  } catch (const std::bad_alloc&) {
    fail(SA_ERR_OUT_OF_MEMORY, "cannot allocate ", n * static_cast<int64_t>(sizeof(T)),
         " bytes of host memory to stage a moment");
  }
}

// The element dtype a moment that is not 8-bit is stored in.
ElemType moment_type(const FileState& f) {
  const std::optional<ElemType> type = elem_type_of(f.state.dtype);
  if (!type) fail(SA_ERR_INTERNAL, "a moment of dtype ", dtype_name(f.state.dtype));
  return *type;
}

}  // namespace

void read_moment_values(Backend& backend, const FileState& f, int64_t n, float* out) {
  if (n == 0) return;
  backend.synchronize();  // a step in flight may still write the moment
  const void* data = f.state.buffer->data();
  if (f.absmax) {
    std::vector<uint8_t> codes = host_vector<uint8_t>(n);
    std::vector<float> absmax = host_vector<float>(blocks_of(n));
    backend.copy_to_host(codes.data(), data, codes.size());
    backend.copy_to_host(absmax.data(), f.absmax->data(), absmax.size() * sizeof(float));
    block_values(f.block, f.is_signed, codes.data(), absmax.data(), n, out);
  } else if (const ElemType type = moment_type(f); type != ElemType::f32) {
    std::vector<unsigned char> stored =
        host_vector<unsigned char>(n * static_cast<int64_t>(elem_size(type)));
    backend.copy_to_host(stored.data(), data, stored.size());
    decode_to_f32(type, stored.data(), n, out);
  } else {
    backend.copy_to_host(out, data, static_cast<std::size_t>(n) * sizeof(float));
  }
}

void write_block_codes(Backend& backend, const FileState& f, int64_t n, const uint8_t* codes,
                       const float* absmax) {
  if (n == 0) return;
  backend.synchronize();
  backend.copy_from_host(f.state.buffer->data(), codes, static_cast<std::size_t>(n));
  backend.copy_from_host(f.absmax->data(), absmax,
                         static_cast<std::size_t>(blocks_of(n)) * sizeof(float));
}

void write_moment_values(Backend& backend, const FileState& f, int64_t n, const float* values) {
  if (n == 0) return;
  void* data = f.state.buffer->data();
  if (f.absmax) {
    std::vector<uint8_t> codes = host_vector<uint8_t>(n);
    std::vector<float> absmax = host_vector<float>(blocks_of(n));
    block_from_values(f.block, f.is_signed, values, n, codes.data(), absmax.data());
    write_block_codes(backend, f, n, codes.data(), absmax.data());
  } else if (const ElemType type = moment_type(f); type != ElemType::f32) {
    std::vector<unsigned char> stored =
        host_vector<unsigned char>(n * static_cast<int64_t>(elem_size(type)));
    encode_from_f32(type, values, n, stored.data());
    backend.synchronize();
    backend.copy_from_host(data, stored.data(), stored.size());
  } else {
    backend.synchronize();
    backend.copy_from_host(data, values, static_cast<std::size_t>(n) * sizeof(float));
  }
}

// The moment `key` of `p` and the host float32 array of `values`, or the error that says
// why not.
std::pair<FileState, float*> checked_moment_values(const Param& p, const std::string& key,
                                                   const DLTensor& values, const char* what) {
  const std::string context = concat("param '", p.name, "': ", what);
  std::string moments;
  for (const FileState& f : moment_states(p)) {
    if (key == f.state.key) {
      const TensorRef t = read_tensor(values, context);
      if (!same_dtype(t.dtype, dl_dtype_of(ElemType::f32)))
        fail(SA_ERR_INVALID_ARGUMENT, context, " is ", dtype_name(t.dtype), "; it must be float32");
      if (t.device.device_type != kDLCPU)
        fail(SA_ERR_INVALID_ARGUMENT, context, " is on ", device_name(t.device),
             "; it must be in host memory (cpu)");
      if (t.shape != p.layout.local_shape)
        fail(SA_ERR_INVALID_ARGUMENT, context, " has shape ", format_dims(t.shape),
             "; it must have the local shape ", format_dims(p.layout.local_shape));
      return {f, static_cast<float*>(t.data)};
    }
    moments += moments.empty() ? f.state.key : concat(", ", f.state.key);
  }
  fail(SA_ERR_INVALID_ARGUMENT, "param '", p.name, "' has no moment '", key,
       "'; it has: ", moments);
}

}  // namespace sa
