// src/group_config.cpp — group hyperparameters: validation, and their kernel-side form
// (folded into coefficients by kernels/adam_math.h's fold_coefficients).
#include <cmath>

#include "../kernels/adam_math.h"

#include "errors.hpp"
#include "optimizer.hpp"

namespace sa {

void check_group_config(const sa_group_config& c, const std::string& context) {
  auto check = [&](bool ok, const char* field, double value, const char* rule) {
    if (!ok) fail(SA_ERR_INVALID_ARGUMENT, context, ": ", field, " is ", value, "; it must be ", rule);
  };
  check(std::isfinite(c.lr) && c.lr >= 0, "lr", c.lr, "finite and >= 0");
  check(c.beta1 >= 0 && c.beta1 < 1, "beta1", c.beta1, "in [0, 1)");
  check(c.beta2 >= 0 && c.beta2 < 1, "beta2", c.beta2, "in [0, 1)");
  check(std::isfinite(c.eps) && c.eps >= 0, "eps", c.eps, "finite and >= 0");
  check(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "weight_decay", c.weight_decay,
        "finite and >= 0");
  auto check_flag = [&](int32_t value, const char* field) {
    if (value != 0 && value != 1)
      fail(SA_ERR_INVALID_ARGUMENT, context, ": ", field, " is ", value, "; it must be 0 or 1");
  };
  check_flag(c.decoupled_weight_decay, "decoupled_weight_decay");
  check_flag(c.bias_correction, "bias_correction");
  check_flag(c.maximize, "maximize");
  check_flag(c.amsgrad, "amsgrad");
}

kernels::AdamHyper hyper_of(const sa_group_config& c) {
  return {c.lr,
          c.beta1,
          c.beta2,
          c.eps,
          c.weight_decay,
          c.decoupled_weight_decay != 0,
          c.bias_correction != 0,
          c.maximize != 0};
}

}  // namespace sa
