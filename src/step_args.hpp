// src/step_args.hpp — a step's arguments (sa_step_args) checked against src/schema.hpp's
// table of them, into what the step needs of them beyond their pointers.
#ifndef SHARDADAM_SRC_STEP_ARGS_HPP_
#define SHARDADAM_SRC_STEP_ARGS_HPP_

#include "../kernels/step_control.h"
#include "shardadam/shardadam.h"

namespace sa {

// The clipping request of `args`: every number field within its bounds in the table
// (SA_STEP_ARGS_FIELDS: a NaN is never within them), and a norm output only where a norm is
// computed (max_grad_norm > 0). Throws SA_ERR_INVALID_ARGUMENT naming the field.
kernels::ClipSpec checked_clip(const sa_step_args& args);

}  // namespace sa

#endif  // SHARDADAM_SRC_STEP_ARGS_HPP_
