#include "state_kinds.hpp"

#include <optional>
#include <vector>

#include "dtype.hpp"
#include "errors.hpp"
#include "shardadam/shardadam.h"

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
    case StateStorage::moment: {  // a moment dtype (a block storage's codes come with scales)
      const std::optional<ElemType> type = elem_type_of(dtype);
      return type && (elem_roles(*type) & SA_DTYPE_MOMENT);
    }
    case StateStorage::f32:
      return same_dtype(dtype, dl_dtype_of(ElemType::f32));
    case StateStorage::i16:
      return same_dtype(dtype, kInt16);
  }
  return false;
}

const char* storage_file_dtypes(StateStorage storage) {
  switch (storage) {
    case StateStorage::moment: {  // "F32, BF16, U8 or F8_E4M3": the moment dtypes of
                                  // storage_accepts
      static const std::string names = [] {
        std::vector<const char*> found;
        for (int i = 0; i < kernels::kNumElemTypes; ++i) {
          const DLDataType dtype = dl_dtype_of(static_cast<ElemType>(i));
          if (storage_accepts(StateStorage::moment, dtype))
            found.push_back(safetensors_name(dtype));
        }
        return words_list(found);
      }();
      return names.c_str();
    }
    case StateStorage::f32:
      return "F32";
    case StateStorage::i16:
      return "I16";
  }
  return "";
}

std::string all_state_keys() {
  std::vector<const char*> keys;
  for (const StateKindInfo& k : kStateKinds) keys.push_back(k.key);
  return words_list(keys, " and ");
}

}  // namespace sa
