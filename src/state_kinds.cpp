#include "state_kinds.hpp"

#include "dtype.hpp"
#include "errors.hpp"

namespace sa {

namespace {

constexpr bool rows_in_kind_order() {
  for (std::size_t i = 0; i < kNumStateKinds; ++i)
    if (static_cast<std::size_t>(kStateKinds[i].kind) != i) return false;
  return true;
}
static_assert(rows_in_kind_order(), "kStateKinds must list the kinds in StateKind's order");

}  // namespace

const StateKindInfo* find_state_kind(const std::string& key) {
  for (const StateKindInfo& k : kStateKinds)
    if (key == k.key) return &k;
  return nullptr;
}

bool storage_accepts(StateStorage storage, DLDataType dtype) {
  switch (storage) {
    case StateStorage::moment:
      return same_dtype(dtype, dl_dtype_of(ElemType::f32)) ||
             same_dtype(dtype, dl_dtype_of(ElemType::bf16));
    case StateStorage::f32:
      return same_dtype(dtype, dl_dtype_of(ElemType::f32));
    case StateStorage::i16:
      return same_dtype(dtype, kInt16);
  }
  return false;
}

const char* storage_file_dtypes(StateStorage storage) {
  switch (storage) {
    case StateStorage::moment:
      return "F32 or BF16";
    case StateStorage::f32:
      return "F32";
    case StateStorage::i16:
      return "I16";
  }
  return "";
}

std::string all_state_keys() {
  std::string out;
  for (std::size_t i = 0; i < kNumStateKinds; ++i)
    out += concat(i == 0 ? "" : i + 1 == kNumStateKinds ? " and " : ", ", kStateKinds[i].key);
  return out;
}

}  // namespace sa
