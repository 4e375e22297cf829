#include "dtype.hpp"

namespace sa {
namespace {

struct DtypeRow {
  ElemType type;
  DLDataType dl;
  std::size_t size;
  const char* name;
};

constexpr DtypeRow kDtypes[] = {
    {ElemType::f32, {kDLFloat, 32, 1}, 4, "float32"},
    {ElemType::bf16, {kDLBfloat, 16, 1}, 2, "bfloat16"},
    {ElemType::f16, {kDLFloat, 16, 1}, 2, "float16"},
    {ElemType::q8, {kDLUInt, 8, 1}, 1, "uint8"},  // the codes of a q8 moment
};

const DtypeRow& row_of(ElemType type) {
  for (const auto& row : kDtypes)
    if (row.type == type) return row;
  return kDtypes[0];  // unreachable: every ElemType has a row
}

struct SafetensorsRow {
  const char* name;
  DLDataType dl;
};

constexpr SafetensorsRow kSafetensorsDtypes[] = {
    {"F32", {kDLFloat, 32, 1}},
    {"BF16", {kDLBfloat, 16, 1}},
    {"F16", {kDLFloat, 16, 1}},
    {"I16", kInt16},
};

}  // namespace

std::optional<DLDataType> dtype_of_safetensors_name(const std::string& name) {
  for (const auto& row : kSafetensorsDtypes)
    if (name == row.name) return row.dl;
  return std::nullopt;
}

const char* safetensors_name(DLDataType dtype) {
  for (const auto& row : kSafetensorsDtypes)
    if (same_dtype(row.dl, dtype)) return row.name;
  return nullptr;
}

std::optional<ElemType> elem_type_of(DLDataType dtype) {
  for (const auto& row : kDtypes)
    if (same_dtype(row.dl, dtype)) return row.type;
  return std::nullopt;
}

DLDataType dl_dtype_of(ElemType type) { return row_of(type).dl; }
std::size_t elem_size(ElemType type) { return row_of(type).size; }
const char* elem_name(ElemType type) { return row_of(type).name; }

std::string dtype_name(DLDataType dtype) {
  if (auto type = elem_type_of(dtype)) return elem_name(*type);
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

}  // namespace sa
