// kernels/cpu/visit_kernel.h — a runtime Variant plus the group's l2 flag, turned into
// compile-time arguments once per call, so that the element loops (scalar and SIMD alike)
// carry no dtype branches.
#ifndef SHARDADAM_KERNELS_CPU_VISIT_KERNEL_H_
#define SHARDADAM_KERNELS_CPU_VISIT_KERNEL_H_

#include <stdio.h>
#include <stdlib.h>

#include <type_traits>

#include "../variants.h"

namespace sa {
namespace kernels {

// Calls fn(Signature<...>{}, std::bool_constant<l2>{}). The core builds only the Variants
// of kernels/variants.h's table, so another one is a bug in shardadam, not a user error:
// stop rather than compute garbage.
template <class Fn>
void visit_kernel(const Variant& v, bool l2, Fn&& fn) {
  const bool found = visit_variant(v, [&](auto signature) {
    if (l2) {
      fn(signature, std::true_type{});
    } else {
      fn(signature, std::false_type{});
    }
  });
  if (found) return;
  fprintf(stderr,
          "shardadam: internal error in the CPU Adam kernel: no kernel for the variant (param %d, "
          "grad %d, moment %d, master %d, amsgrad %d)\n",
          static_cast<int>(v.param), static_cast<int>(v.grad), static_cast<int>(v.moment),
          static_cast<int>(v.master), static_cast<int>(v.amsgrad));
  abort();
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CPU_VISIT_KERNEL_H_
