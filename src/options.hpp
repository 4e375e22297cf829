// src/options.hpp — reading append-only option structs whose first field is struct_size.
#ifndef SHARDADAM_SRC_OPTIONS_HPP_
#define SHARDADAM_SRC_OPTIONS_HPP_

#include <cstring>

#include "errors.hpp"

namespace sa {

// Checks the struct_size of a caller's struct of type T: at least the struct_size field,
// at most this library's sizeof(T) (a larger one comes from a newer header, whose fields
// this library would silently ignore).
template <class T>
void check_struct_size(std::size_t size, const char* what) {
  if (size < sizeof(std::size_t))
    fail(SA_ERR_INVALID_ARGUMENT, what, ": struct_size ", size,
         " is too small; initialize the struct with its SA_*_INIT macro");
  if (size > sizeof(T))
    fail(SA_ERR_UNSUPPORTED, what, ": struct_size ", size, " is larger than this library's (",
         sizeof(T),
         "): the caller was compiled against a newer shardadam.h than the library loaded (",
         SA_VERSION_MAJOR, ".", SA_VERSION_MINOR, ".", SA_VERSION_PATCH, ")");
}

// Returns `defaults` overlaid with the caller's struct, of which only the first
// `in->struct_size` bytes are read: a caller built against an older header has a shorter
// struct, and the fields it lacks keep their defaults.
template <class T>
T read_options(const T* in, const T& defaults, const char* what) {
  if (in == nullptr) return defaults;
  check_struct_size<T>(in->struct_size, what);
  T out = defaults;
  std::memcpy(static_cast<void*>(&out), in, in->struct_size);
  out.struct_size = sizeof(T);
  return out;
}

// Writes `value` into the caller's struct `*out` as far as out->struct_size reaches (an
// older caller's struct is shorter), keeping the caller's struct_size.
template <class T>
void write_options(T* out, const T& value, const char* what) {
  const std::size_t size = out->struct_size;
  check_struct_size<T>(size, what);
  std::memcpy(static_cast<void*>(out), &value, size);
  out->struct_size = size;
}

}  // namespace sa

#endif  // SHARDADAM_SRC_OPTIONS_HPP_
