#include "dtype.hpp"

#include <cstring>
#include <vector>

#include "../kernels/variants.h"
#include "errors.hpp"
#include "shardadam/shardadam.h"

namespace sa {
namespace {

struct DtypeRow {
  DLDataType dl;
  const char* name;
  const char* safetensors;  // nullptr: shard files never hold it
  const char* doc;
};

// SA_ELEM_TYPES' rows, by ElemType.
constexpr DtypeRow kElemRows[] = {
#define SA_DTYPE_ROW(name, storage, code, bits, text, st_name, form, doc) \
  {{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1}, text, st_name, doc},
    SA_ELEM_TYPES(SA_DTYPE_ROW)
#undef SA_DTYPE_ROW
};
static_assert(std::size(kElemRows) == kernels::kNumElemTypes, "a row per ElemType");

// The table's codes are dlpack.h's (elem_type.h spells them as numbers: kernels do not
// include dlpack.h).
static_assert(kDLFloat == 2 && kDLBfloat == 4 && kDLUInt == 1 && kDLFloat8_e4m3fn == 10 &&
                  kDLFloat8_e5m2 == 12 && kDLFloat8_e8m0fnu == 14,
              "DLPack's type codes");

// A state dtype that is not an element dtype: the remainder's.
constexpr DtypeRow kInt16Row = {kInt16, "int16", "I16",
                                "the int16 low half of a float32 (state \"remainder\")"};

const DtypeRow& row_of(ElemType type) { return kElemRows[static_cast<std::size_t>(type)]; }

// Every dtype the library stores, in the C ABI's order: SA_ELEM_TYPES', then int16.
constexpr int32_t kNumDtypes = kernels::kNumElemTypes + 1;
const DtypeRow& public_row(int32_t index) {
  return index < kernels::kNumElemTypes ? kElemRows[index] : kInt16Row;
}

}  // namespace

int32_t num_dtypes() { return kNumDtypes; }

DtypeDescription describe_dtype(int32_t index) {
  const DtypeRow& row = public_row(index);
  const uint32_t roles = index < kernels::kNumElemTypes ? elem_roles(static_cast<ElemType>(index))
                                                        : SA_DTYPE_STATE | SA_DTYPE_FILE;
  return {row.name, row.dl, roles, row.safetensors, row.doc};
}

std::optional<ElemType> elem_type_of(DLDataType dtype) {
  for (int i = 0; i < kernels::kNumElemTypes; ++i)
    if (same_dtype(kElemRows[i].dl, dtype)) return static_cast<ElemType>(i);
  return std::nullopt;
}

DLDataType dl_dtype_of(ElemType type) { return row_of(type).dl; }
std::size_t elem_size(ElemType type) { return static_cast<std::size_t>(kernels::elem_bytes(type)); }
const char* elem_name(ElemType type) { return row_of(type).name; }

uint32_t elem_roles(ElemType type) {
  using kernels::in_table;
  uint32_t roles = 0;
  for (const kernels::ParamForm& form : kernels::kParamForms)
    if (form.param == type)
      roles |= SA_DTYPE_PARAM |
               (form.scaling != kernels::ParamScaling::none ? SA_DTYPE_SCALED_PARAM : 0);
  if (in_table(kernels::kGradTypes, type)) roles |= SA_DTYPE_GRAD;
  if (in_table(kernels::kMomentTypes, type))
    roles |= SA_DTYPE_MOMENT | (kernels::is_block_storage(type) ? SA_DTYPE_BLOCK_MOMENT : 0);
  // States: the moments, and float32 (a master, a float32 param's own value, block absmax).
  if (in_table(kernels::kMomentTypes, type) || type == ElemType::f32) roles |= SA_DTYPE_STATE;
  for (int32_t i = 0; i < kernels::kNumParamScalings; ++i) {
    const ScalingDescription d = describe_scaling(i);
    if (d.scaling != kernels::ParamScaling::none && d.scale_type == type) roles |= SA_DTYPE_SCALE;
  }
  if (row_of(type).safetensors != nullptr) roles |= SA_DTYPE_FILE;
  return roles;
}

namespace {

constexpr ScalingDescription kScalings[] = {
#define SA_SCALING_ROW(name, value, block, scale_type, writes, doc) \
  {kernels::ParamScaling::name, #name, block, ElemType::scale_type, writes, doc},
    SA_PARAM_SCALINGS(SA_SCALING_ROW)
#undef SA_SCALING_ROW
};
static_assert(std::size(kScalings) == kernels::kNumParamScalings, "a row per ParamScaling");

// The C ABI's values are the table's (shardadam.h spells them as an enum).
#define SA_SCALING_VALUE_CHECK(name, value, block, scale_type, writes, doc) \
  static_assert(static_cast<int>(kernels::ParamScaling::name) == (value), #name);
SA_PARAM_SCALINGS(SA_SCALING_VALUE_CHECK)
#undef SA_SCALING_VALUE_CHECK
static_assert(SA_SCALING_NONE == 0 && SA_SCALING_DELAYED == 1 && SA_SCALING_MXFP8 == 2 &&
                  SA_SCALING_BLOCK128 == 3 && SA_SCALING_CURRENT == 4 &&
                  SA_SCALING_CURRENT_POW2 == 5,
              "sa_param_scaling is SA_PARAM_SCALINGS' values");

}  // namespace

int32_t num_param_scalings() { return kernels::kNumParamScalings; }

ScalingDescription describe_scaling(int32_t index) {
  for (const ScalingDescription& d : kScalings)
    if (static_cast<int32_t>(d.scaling) == index) return d;
  fail(SA_ERR_INTERNAL, "no param scaling has value ", index);
}

std::optional<DLDataType> dtype_of_safetensors_name(const std::string& name) {
  for (int32_t i = 0; i < kNumDtypes; ++i) {
    const DtypeRow& row = public_row(i);
    if (row.safetensors != nullptr && name == row.safetensors) return row.dl;
  }
  return std::nullopt;
}

const char* safetensors_name(DLDataType dtype) {
  for (int32_t i = 0; i < kNumDtypes; ++i)
    if (same_dtype(public_row(i).dl, dtype)) return public_row(i).safetensors;
  return nullptr;
}

const char* safetensors_names() {
  static const std::string names = [] {
    std::vector<const char*> found;
    for (int32_t i = 0; i < kNumDtypes; ++i)
      if (public_row(i).safetensors != nullptr) found.push_back(public_row(i).safetensors);
    return words_list(found, " and ");
  }();
  return names.c_str();
}

std::string dtype_name(DLDataType dtype) {
  for (int32_t i = 0; i < kNumDtypes; ++i)
    if (same_dtype(public_row(i).dl, dtype)) return public_row(i).name;
  const char* base = nullptr;
  switch (dtype.code) {
    case kDLInt:
      base = "int";
      break;
    case kDLUInt:
      base = "uint";
      break;
    case kDLFloat:
      base = "float";
      break;
    case kDLBfloat:
      base = "bfloat";
      break;
    case kDLBool:
      base = "bool";
      break;
    case kDLComplex:
      base = "complex";
      break;
    default:
      return "dtype(code=" + std::to_string(dtype.code) + ", bits=" + std::to_string(dtype.bits) +
             ", lanes=" + std::to_string(dtype.lanes) + ")";
  }
  std::string name = base + std::to_string(dtype.bits);
  if (dtype.lanes != 1) name += "x" + std::to_string(dtype.lanes);
  return name;
}

// ---- conversions ------------------------------------------------------------------------

namespace {

// Element i of an unaligned array of T's storage.
template <ElemType T>
kernels::StorageOf<T> read_elem(const void* base, int64_t i) {
  kernels::StorageOf<T> x;
  std::memcpy(&x, static_cast<const unsigned char*>(base) + i * sizeof x, sizeof x);
  return x;
}

template <ElemType T>
void write_elem(void* base, int64_t i, kernels::StorageOf<T> x) {
  std::memcpy(static_cast<unsigned char*>(base) + i * sizeof x, &x, sizeof x);
}

[[noreturn]] void not_an_element_dtype(ElemType type) {
  fail(SA_ERR_INTERNAL, elem_name(type), " is a block storage, not converted by element");
}

}  // namespace

void decode_to_f32(ElemType from, const void* src, int64_t n, float* dst) {
  const bool visited = kernels::visit_elem_type(from, [&](auto tag) {
    constexpr ElemType kFrom = decltype(tag)::value;
    for (int64_t i = 0; i < n; ++i)
      dst[i] = kernels::Codec<kFrom>::decode(read_elem<kFrom>(src, i));
  });
  if (!visited) not_an_element_dtype(from);
}

void encode_from_f32(ElemType to, const float* src, int64_t n, void* dst) {
  const bool visited = kernels::visit_elem_type(to, [&](auto tag) {
    constexpr ElemType kTo = decltype(tag)::value;
    for (int64_t i = 0; i < n; ++i) write_elem<kTo>(dst, i, kernels::Codec<kTo>::encode(src[i]));
  });
  if (!visited) not_an_element_dtype(to);
}

void convert_elems(ElemType from, const void* src, ElemType to, void* dst, int64_t n) {
  constexpr int64_t kChunk = 1024;
  float values[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    decode_to_f32(from, static_cast<const unsigned char*>(src) + i * elem_size(from), m, values);
    encode_from_f32(to, values, m, static_cast<unsigned char*>(dst) + i * elem_size(to));
  }
}

}  // namespace sa
