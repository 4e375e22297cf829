// src/state_kinds.hpp — the one table of the kinds of optimizer state a param can have:
// each one's key (in state views, shard files and the bindings), how it is stored, and
// which params have it. Allocation, the named states that views, export and import walk,
// the shard files' key and dtype checks, and the C ABI's sa_optimizer_state_key derive
// from it.
//
// A new moment is a row of kernels/state_kind.h's SA_MOMENTS, which this table derives its
// rows from, plus what adam_update does with it.
#ifndef SHARDADAM_SRC_STATE_KINDS_HPP_
#define SHARDADAM_SRC_STATE_KINDS_HPP_

#include <cstddef>
#include <cstdint>
#include <string>

#include <dlpack/dlpack.h>

#include "../kernels/state_kind.h"

namespace sa {

// How a state is stored.
enum class StateStorage : uint8_t {
  moment,  // the param's moment dtype; files may hold any (block codes with their scales)
  f32,     // float32
  i16      // int16
};

struct StateKindInfo {
  StateKind kind;
  const char* key;
  StateStorage storage;
  bool per_block;  // one element per kernels::kQuant8Block elements of the param, not per element
  const char* doc;
};

// In canonical order (StateKind's): the order of named states, views and shard-file
// tensors. The moments and their absmax states are kernels/state_kind.h's SA_MOMENTS.
inline constexpr StateKindInfo kStateKinds[] = {
#define SA_MOMENT_ROW(key, present, is_signed, doc) \
  {StateKind::key, #key, StateStorage::moment, false, doc},
    SA_MOMENTS(SA_MOMENT_ROW)
#undef SA_MOMENT_ROW
        {StateKind::master, "master", StateStorage::f32, false,
         "float32 master copy of a 16-bit param (master kind fp32)"},
    {StateKind::remainder, "remainder", StateStorage::i16, false,
     "int16 low half of the float32 value of a bfloat16 param (master kind remainder)"},
#define SA_ABSMAX_ROW(key, present, is_signed, doc)                  \
  {StateKind::key##_absmax, #key "_absmax", StateStorage::f32, true, \
   "per-block absmax of " #key " when the moment dtype is a block storage"},
    SA_MOMENTS(SA_ABSMAX_ROW)
#undef SA_ABSMAX_ROW
};
static_assert(sizeof(kStateKinds) / sizeof(kStateKinds[0]) == kNumStateKinds,
              "kStateKinds must have a row per StateKind");

inline const StateKindInfo& state_kind_info(StateKind kind) {
  return kStateKinds[static_cast<std::size_t>(kind)];
}

// The kind of a key, or nullptr for a key that names no state.
const StateKindInfo* find_state_kind(const std::string& key);

// Whether a file may hold a state of this kind stored as `dtype`.
bool storage_accepts(StateStorage storage, DLDataType dtype);

// The dtypes a file may hold it as, in safetensors names: "F32 or BF16".
const char* storage_file_dtypes(StateStorage storage);

// "exp_avg, exp_avg_sq, max_exp_avg_sq, master and remainder".
std::string all_state_keys();

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_KINDS_HPP_
