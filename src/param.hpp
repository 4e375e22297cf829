// src/param.hpp — a param as the core keeps it (its shard, dtypes, form, scaling and state
// placement), its optimizer state, and what follows from them: its Variant, which states it
// has and their dtypes, shapes and devices, and what its grads must be. Plain data and
// functions of it: the plan, state I/O and moment values read these without the optimizer.
#ifndef SHARDADAM_SRC_PARAM_HPP_
#define SHARDADAM_SRC_PARAM_HPP_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "dlpack_intake.hpp"
#include "layout.hpp"
#include "plan.hpp"
#include "shardadam/shardadam.h"
#include "state_kinds.hpp"

namespace sa {

using kernels::ElemType;
using kernels::MasterKind;

// Optimizer state of one param, in backend memory: a buffer per kind it has (see
// has_state), none for the others. Buffers are shared so that state views stay valid
// after the optimizer is gone.
struct ParamState {
  std::shared_ptr<Buffer> buffers[kNumStateKinds];
  const std::shared_ptr<Buffer>& operator[](StateKind kind) const {
    return buffers[static_cast<std::size_t>(kind)];
  }
  std::shared_ptr<Buffer>& operator[](StateKind kind) {
    return buffers[static_cast<std::size_t>(kind)];
  }
};

// One state of a param as export and import see it: its key ("exp_avg", ...), its
// buffer and its storage dtype.
struct NamedState {
  const char* key;
  std::shared_ptr<Buffer> buffer;
  DLDataType dtype;
  StateKind kind;
};

struct Param;

// Whether a param has a grad for the next steps.
enum class GradBinding : uint8_t {
  never,  // nothing bound since it was added: a step refuses (a forgotten bind is an error)
  none,   // "no grad" (torch's p.grad is None): steps skip the param
  bound   // the optimizer holds the grad's data (NULL for an empty param)
};

// The Variant of a param's updates (its bucket; kernels/variants.h).
kernels::Variant variant_of(const Param& p);

// Whether a param has a state of this kind (kernels::variant_has_state of its Variant).
bool has_state(const Param& p, StateKind kind);

// The dtype the param keeps a state of this kind in.
DLDataType state_dtype(const Param& p, StateKind kind);

// The device a param's state is on: the param's, or the CPU for state placed on the host.
DLDevice state_device(const Param& p);

// The shape of a param's state of this kind: the param's local shape, or for a per-block
// state (state_kinds.hpp) [number of kernels::kQuant8Block blocks of the local shard].
std::vector<int64_t> state_shape(const Param& p, StateKind kind);

// The states a param has, in kStateKinds' order: exp_avg, exp_avg_sq, max_exp_avg_sq
// (amsgrad), master (fp32 master) or remainder (int16), and the block absmax values of
// 8-bit moments.
std::vector<NamedState> named_states(const Param& p);

// A state as shard files hold it: in its own dtype, and a block moment (8-bit, float8) as
// its codes together with its blocks' absmax (the per-block state "<moment>_absmax").
struct FileState {
  NamedState state;                // the state itself (the codes of a block moment)
  std::shared_ptr<Buffer> absmax;  // a block moment's absmax values, else null
  bool is_signed;                  // a block moment: exp_avg (q8: coded by the signed map)
  ElemType block;                  // a block moment: its storage (q8, f8e4m3)
};

// The states of `p` that shard files hold, in named_states' order.
std::vector<FileState> file_states(const Param& p);

// The moments of `p` (states stored in its moment dtype), in file_states' order: what
// get_moment_values and set_moment_values take.
std::vector<FileState> moment_states(const Param& p);

struct Param {
  std::string name;
  int32_t group = 0;
  Layout layout;
  int64_t numel = 0;
  DLDevice device{};
  void* data = nullptr;  // the local shard, updated in place
  ElemType param_type{};
  ElemType grad_type{};
  ElemType moment_type{};
  MasterKind master{};
  bool amsgrad = false;
  kernels::UpdateRule rule{};       // its group's (sa_group_config.update_rule)
  kernels::ParamScaling scaling{};  // an fp8 param's (sa_param_scaling); none otherwise
  kernels::ParamScale scale{};      // its scale tensors' data (param_scaling.h), else NULLs
  StatePlacement placement{};       // where `state` lives (Backend::allocate_state)
  ParamState state;
  ManagedTensor owner;        // released (deleter called) with the param
  ManagedTensor scale_owner;  // sa_param_options.scale and .amax, likewise
  ManagedTensor amax_owner;
};

// What a grad of a param must be (its grad dtype, device, local shape), kept per param in
// one contiguous table that checking a grad reads instead of the Param: a set_grads of
// 100k grads then reads one cache line per param where the Param and its shape vector
// cost a cache miss each (measured: the check was ~14% of FusedAdam's grad intake at 100k
// params of 16 elements). Params do not change once added, so neither does this.
struct GradSpec {
  static constexpr int32_t kInlineDims = 4;  // deeper local shapes are read from the Param
  DLDataType dtype{};
  DLDevice device{};
  int32_t ndim = 0;
  uint32_t elem_bytes = 0;
  int64_t numel = 0;
  int64_t shape[kInlineDims] = {};  // the local shape, when ndim <= kInlineDims
};

// The GradSpec of a param.
GradSpec grad_spec_of(const Param& p);

}  // namespace sa

#endif  // SHARDADAM_SRC_PARAM_HPP_
