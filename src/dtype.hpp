// src/dtype.hpp — the one table of storage dtypes: DLPack code/bits, kernel ElemType,
// printable name and element size.
#ifndef SHARDADAM_SRC_DTYPE_HPP_
#define SHARDADAM_SRC_DTYPE_HPP_

#include <cstddef>
#include <optional>
#include <string>

#include <dlpack/dlpack.h>

#include "../kernels/bucket_table.h"

namespace sa {

using kernels::ElemType;

// The dtype of an int16 remainder, which is state, never a param/grad/moment dtype.
inline constexpr DLDataType kInt16 = {kDLInt, 16, 1};

// The ElemType a DLPack dtype maps to, or nothing for a dtype shardadam does not store.
std::optional<ElemType> elem_type_of(DLDataType dtype);

DLDataType dl_dtype_of(ElemType type);
std::size_t elem_size(ElemType type);
const char* elem_name(ElemType type);

// "float32", "bfloat16", "int64", "uint8", "float32x4", ... for any DLPack dtype: used in
// error messages, so it must name even the dtypes we reject.
std::string dtype_name(DLDataType dtype);

inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

// ---- shard files ------------------------------------------------------------------------
// The dtypes a shard file (safetensors) may hold, by their safetensors names: F32, BF16,
// F16 and I16 (the remainder). A name outside this table is refused on reading.

// The DLPack dtype of a safetensors dtype name, or nothing for a name not in the table.
std::optional<DLDataType> dtype_of_safetensors_name(const std::string& name);

// The safetensors name of a dtype in the table ("F32"), or nullptr.
const char* safetensors_name(DLDataType dtype);

// Bytes per element of a single-lane dtype of whole bytes.
inline std::size_t dtype_size(DLDataType dtype) { return dtype.bits / 8u; }

}  // namespace sa

#endif  // SHARDADAM_SRC_DTYPE_HPP_
