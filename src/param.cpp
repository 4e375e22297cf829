// src/param.cpp — what follows from a param's fields (see param.hpp).
#include "param.hpp"

#include <algorithm>

#include "../kernels/block_moment.h"
#include "../kernels/variants.h"
#include "dtype.hpp"

namespace sa {

kernels::Variant variant_of(const Param& p) {
  return {p.param_type, p.grad_type, p.moment_type, p.master, p.amsgrad, p.scaling, p.rule};
}

bool has_state(const Param& p, StateKind kind) {
  return kernels::variant_has_state(variant_of(p), kind);
}

DLDataType state_dtype(const Param& p, StateKind kind) {
  switch (state_kind_info(kind).storage) {
    case StateStorage::moment:
      return dl_dtype_of(p.moment_type);
    case StateStorage::f32:
      return dl_dtype_of(ElemType::f32);
    case StateStorage::i16:
      return kInt16;
  }
  return {};
}

DLDevice state_device(const Param& p) {
  return on_host(p.placement) ? DLDevice{kDLCPU, 0} : p.device;
}

std::vector<int64_t> state_shape(const Param& p, StateKind kind) {
  if (!state_kind_info(kind).per_block) return p.layout.local_shape;
  return {(p.numel + kernels::kQuant8Block - 1) / kernels::kQuant8Block};
}

std::vector<NamedState> named_states(const Param& p) {
  std::vector<NamedState> states;
  for (const StateKindInfo& k : kStateKinds)
    if (has_state(p, k.kind))
      states.push_back({k.key, p.state[k.kind], state_dtype(p, k.kind), k.kind});
  return states;
}

std::vector<FileState> file_states(const Param& p) {
  std::vector<FileState> out;
  for (const NamedState& s : named_states(p)) {
    if (state_kind_info(s.kind).per_block) continue;  // in its moment's FileState (absmax)
    FileState f{s, nullptr, false, p.moment_type};
    if (kernels::is_block_storage(p.moment_type) &&
        state_kind_info(s.kind).storage == StateStorage::moment) {
      int k = 0;
      is_moment_state(s.kind, &k);  // a moment: StateStorage::moment
      f.absmax = p.state[moment_absmax_state(k)];
      f.is_signed = moment_signed(k);
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<FileState> moment_states(const Param& p) {
  std::vector<FileState> out;
  for (FileState& f : file_states(p))
    if (state_kind_info(f.state.kind).storage == StateStorage::moment) out.push_back(std::move(f));
  return out;
}

GradSpec grad_spec_of(const Param& p) {
  GradSpec spec;
  spec.dtype = dl_dtype_of(p.grad_type);
  spec.device = p.device;
  spec.ndim = static_cast<int32_t>(p.layout.local_shape.size());
  spec.elem_bytes = static_cast<uint32_t>(elem_size(p.grad_type));
  spec.numel = p.numel;
  if (spec.ndim <= GradSpec::kInlineDims)
    std::copy(p.layout.local_shape.begin(), p.layout.local_shape.end(), spec.shape);
  return spec;
}

}  // namespace sa
