// src/step_args.cpp — a step's arguments checked from src/schema.hpp's table (see
// step_args.hpp).
#include "step_args.hpp"

#include "errors.hpp"
#include "fields.hpp"

namespace sa {

kernels::ClipSpec checked_clip(const sa_step_args& args) {
  check_fields(SA_STRUCT_STEP_ARGS, &args, "", "args->");
  if (args.max_grad_norm == 0.0) {
    if (args.grad_norm != nullptr || args.host_grad_norm != nullptr)
      fail(SA_ERR_INVALID_ARGUMENT,
           "grad_norm or host_grad_norm is set but max_grad_norm is 0, so no "
           "norm is computed; set max_grad_norm (INFINITY to measure without clipping)");
    return {kernels::NormType::none, 0.0};
  }
  return {args.norm_type == SA_NORM_INF ? kernels::NormType::inf : kernels::NormType::l2,
          args.max_grad_norm};
}

}  // namespace sa
