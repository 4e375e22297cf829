// src/moment_values.cpp — moments as float32 values (see moment_values.hpp).
#include "moment_values.hpp"

#include <algorithm>
#include <cmath>
#include <new>
#include <vector>

#include "../kernels/quant8.h"
#include "dtype.hpp"
#include "errors.hpp"

namespace sa {

void quant8_values(const uint8_t* codes, const float* absmax, int64_t n, bool is_signed,
                   float* out) {
  const int64_t block = kernels::kQuant8Block;
  const uint32_t* map = kernels::quant8_map(is_signed);
  for (int64_t b = 0; b * block < n; ++b) {
    const int64_t m = std::min(block, n - b * block);
    const uint8_t* c = codes + b * block;
    float* x = out + b * block;
    kernels::quant8_decode_block(map, c, absmax[b], m, x);
    if (!is_signed || !(absmax[b] > 0.0f) || std::isinf(absmax[b])) continue;
    if (std::find(c, c + m, uint8_t{255}) != c + m) continue;  // +1 decodes to the absmax
    const uint8_t* lowest = std::find(c, c + m, uint8_t{0});
    if (lowest != c + m) x[lowest - c] = -absmax[b];
  }
}

void quant8_from_values(const float* values, int64_t n, bool is_signed, uint8_t* codes,
                        float* absmax) {
  const int64_t block = kernels::kQuant8Block;
  const kernels::Quant8Book book = kernels::quant8_book(is_signed);
  for (int64_t b = 0; b * block < n; ++b)
    absmax[b] = kernels::quant8_encode_block(book, values + b * block,
                                             std::min(block, n - b * block), codes + b * block);
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
    quant8_values(codes.data(), absmax.data(), n, f.is_signed, out);
  } else if (const ElemType type = moment_type(f); type != ElemType::f32) {
    std::vector<unsigned char> stored =
        host_vector<unsigned char>(n * static_cast<int64_t>(elem_size(type)));
    backend.copy_to_host(stored.data(), data, stored.size());
    decode_to_f32(type, stored.data(), n, out);
  } else {
    backend.copy_to_host(out, data, static_cast<std::size_t>(n) * sizeof(float));
  }
}

void write_moment_values(Backend& backend, const FileState& f, int64_t n, const float* values) {
  if (n == 0) return;
  void* data = f.state.buffer->data();
  if (f.absmax) {
    std::vector<uint8_t> codes = host_vector<uint8_t>(n);
    std::vector<float> absmax = host_vector<float>(blocks_of(n));
    quant8_from_values(values, n, f.is_signed, codes.data(), absmax.data());
    backend.synchronize();
    backend.copy_from_host(data, codes.data(), codes.size());
    backend.copy_from_host(f.absmax->data(), absmax.data(), absmax.size() * sizeof(float));
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

}  // namespace sa
