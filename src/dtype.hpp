// src/dtype.hpp — the core's view of the storage dtypes, derived from the one table of
// them (kernels/elem_type.h's SA_ELEM_TYPES): DLPack dtypes, printable and safetensors
// names, sizes, the roles a dtype may play (kernels/variants.h's tables), and the
// conversions of element dtypes to and from float32 with the kernels' Codecs.
#ifndef SHARDADAM_SRC_DTYPE_HPP_
#define SHARDADAM_SRC_DTYPE_HPP_

#include <cstddef>
#include <cstdint>
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

// What a dtype may be, as a bit set of the C ABI's sa_dtype_role (kernels/variants.h's
// tables say which params, grads and moments the kernels implement).
uint32_t elem_roles(ElemType type);

// Every dtype the library stores (SA_ELEM_TYPES' rows, then int16), as the C ABI's
// sa_dtype describes them.
struct DtypeDescription {
  const char* name;
  DLDataType dtype;
  uint32_t roles;
  const char* safetensors_name;  // nullptr: shard files never hold it
  const char* doc;
};
int32_t num_dtypes();
DtypeDescription describe_dtype(int32_t index);  // index in [0, num_dtypes())

// A row of kernels/param_scaling.h's SA_PARAM_SCALINGS, as the C ABI's sa_param_scaling
// describes it; index is its value, in [0, kernels::kNumParamScalings).
struct ScalingDescription {
  kernels::ParamScaling scaling;
  const char* name;
  int64_t block;        // elements per block along the last dim; 0: per tensor
  ElemType scale_type;  // the scale tensor's dtype
  bool step_writes;     // the step writes the scale tensor (else reads it)
  const char* doc;
};
ScalingDescription describe_scaling(int32_t index);
int32_t num_param_scalings();  // describe_scaling's index range: [0, num_param_scalings())

// Elements per block of a block moment (is_block_moment): each block has one absmax, and
// a shard's blocks start every kMomentBlock elements of it.
constexpr int64_t kMomentBlock = kernels::kQuant8Block;

// Whether moments of dtype `t` are stored in blocks: codes plus a float32 absmax a block
// (q8, float8_e4m3fn moments).
constexpr bool is_block_moment(ElemType t) { return kernels::is_block_storage(t); }

// "float32", "bfloat16", "int64", "uint8", "float32x4", ... for any DLPack dtype: used in
// error messages, so it must name even the dtypes we reject.
std::string dtype_name(DLDataType dtype);

// Whether an optional dtype option is unset (all zero): it takes its default.
constexpr bool is_unset(DLDataType dtype) {
  return dtype.code == 0 && dtype.bits == 0 && dtype.lanes == 0;
}

inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

// ---- conversions ------------------------------------------------------------------------
// Element dtypes only (not block storages: is_block_storage); the kernels' rounding, bit
// for bit. `src` and `dst` need no alignment.

// dst[i] = the float32 value of element i of src.
void decode_to_f32(ElemType from, const void* src, int64_t n, float* dst);

// Element i of dst = src[i] rounded to `to`.
void encode_from_f32(ElemType to, const float* src, int64_t n, void* dst);

// Element i of dst (of `to`) = element i of src (of `from`) through float32.
void convert_elems(ElemType from, const void* src, ElemType to, void* dst, int64_t n);

// ---- shard files ------------------------------------------------------------------------
// The dtypes a shard file (safetensors) may hold, by their safetensors names: those of
// SA_ELEM_TYPES that have one (F32, BF16, F16, and U8 and F8_E4M3 for block moments' codes)
// and I16 (the remainder). A name outside this table is refused on reading.

// The DLPack dtype of a safetensors dtype name, or nothing for a name not in the table.
std::optional<DLDataType> dtype_of_safetensors_name(const std::string& name);

// The safetensors name of a dtype in the table ("F32"), or nullptr.
const char* safetensors_name(DLDataType dtype);

// The safetensors names shard files may hold, for messages: "F32, BF16, F16, U8, F8_E4M3
// and I16".
const char* safetensors_names();

// Bytes per element of a single-lane dtype of whole bytes.
inline std::size_t dtype_size(DLDataType dtype) { return dtype.bits / 8u; }

}  // namespace sa

#endif  // SHARDADAM_SRC_DTYPE_HPP_
