// src/moment_values.cpp — moments as float32 values (see moment_values.hpp).
#include "moment_values.hpp"

#include <algorithm>
#include <cmath>
#include <new>
#include <vector>

#include "../kernels/block_moment.h"
#include "dtype.hpp"
#include "errors.hpp"

namespace sa {

namespace {

// The values of a block (its n codes, its absmax) that quantize back to the same codes
// and absmax: decoded, then the element the absmax came from written as the absmax.
// q8: the signed map holds +1 but not -1 (bitsandbytes' dynamic map), so in a block of a
// signed moment with no code 255 the first element of code 0 (the map's lowest entry,
// which decodes to less than the absmax) is -absmax. f8e4m3: an element of the block's
// largest code magnitude decodes to 448 * scale, an ulp or so from the absmax (or, below
// absmax 1e-12 where the scale is clipped, less), and reads as +-absmax.
template <ElemType T>
void exact_block_values(const uint8_t* c, int64_t m, float absmax, bool is_signed, float* x) {
  if (!(absmax > 0.0f) || std::isinf(absmax)) return;
  if constexpr (T == ElemType::q8) {
    if (!is_signed || std::find(c, c + m, uint8_t{255}) != c + m) return;  // +1 decodes exactly
    const uint8_t* lowest = std::find(c, c + m, uint8_t{0});
    if (lowest != c + m) x[lowest - c] = -absmax;
  } else {
    uint8_t top = 0;
    for (int64_t i = 0; i < m; ++i) top = std::max<uint8_t>(top, c[i] & 0x7Fu);
    for (int64_t i = 0; i < m; ++i)
      if ((c[i] & 0x7Fu) == top) x[i] = (c[i] & 0x80u) ? -absmax : absmax;
  }
}

}  // namespace

void block_values(ElemType type, bool is_signed, const uint8_t* codes, const float* absmax,
                  int64_t n, float* out) {
  const bool block_type = kernels::visit_block_storage(type, [&](auto tag) {
    constexpr ElemType kType = decltype(tag)::value;
    const auto book = kernels::block_book<kType>(is_signed);
    const int64_t block = kernels::kQuant8Block;
    for (int64_t b = 0; b * block < n; ++b) {
      const int64_t m = std::min(block, n - b * block);
      kernels::decode_block<kType>(book, codes + b * block, absmax[b], m, out + b * block);
      exact_block_values<kType>(codes + b * block, m, absmax[b], is_signed, out + b * block);
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

void write_moment_values(Backend& backend, const FileState& f, int64_t n, const float* values) {
  if (n == 0) return;
  void* data = f.state.buffer->data();
  if (f.absmax) {
    std::vector<uint8_t> codes = host_vector<uint8_t>(n);
    std::vector<float> absmax = host_vector<float>(blocks_of(n));
    block_from_values(f.block, f.is_signed, values, n, codes.data(), absmax.data());
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
