// src/param_checks.hpp — add_param's validation: a param request (its DLPack shard, layout
// and sa_param_options) checked against the library's tables of param forms, dtypes,
// scalings and placements, into a Param with every field set but its state. The optimizer
// then allocates the state and registers it (optimizer.cpp); nothing here changes an
// optimizer.
#ifndef SHARDADAM_SRC_PARAM_CHECKS_HPP_
#define SHARDADAM_SRC_PARAM_CHECKS_HPP_

#include <memory>
#include <string>

#include "backend.hpp"
#include "param.hpp"
#include "shardadam/shardadam.h"

namespace sa {

// "param 'name'": how errors about a param begin.
std::string param_context(const std::string& name);

// "SA_SCALING_MXFP8": a scaling as the C ABI names it.
std::string scaling_c_name(kernels::ParamScaling scaling);

// What add_param is handed, before validation.
struct ParamRequest {
  const char* name;
  int32_t group;
  DLManagedTensorVersioned* versioned;  // exactly one of versioned / legacy is set
  DLManagedTensor* legacy;
  const sa_layout* layout;
  const sa_param_options* options;
};

// A request checked: the param (state unallocated, binding `never`, no owners yet) and the
// options read (defaults for the fields a shorter struct lacks).
struct CheckedParam {
  std::unique_ptr<Param> param;
  sa_param_options options;
};

// Checks `request` (a non-empty name; name clashes and the group index are the optimizer's
// to check) for a param joining a group of config `group`: the shard's DLPack version,
// flags, dtype and strides, the layout, and every option. `has_comm`: whether the
// optimizer has a communicator (a sharded current-scaled param reduces its amax through
// it). Throws sa::Error naming the param and what is wrong.
CheckedParam checked_param(const ParamRequest& request, const sa_group_config& group,
                           bool has_comm);

// Checks the scale an fp8 param's codes were cast with (delayed: the scale; current: the
// scale_inv), read from `backend`'s memory: > 0 and finite, since the master starts from
// it. A no-op for other params. Synchronizes the backend.
void check_start_scale(Backend& backend, const Param& param, const std::string& context);

}  // namespace sa

#endif  // SHARDADAM_SRC_PARAM_CHECKS_HPP_
