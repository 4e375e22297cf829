// kernels/cpu/grad_norm_cpu.h — the partial gradient norm of one contiguous element range.
// Threads, chunking and the final sum live in the CPU backend; this file only computes.
#ifndef SHARDADAM_KERNELS_CPU_GRAD_NORM_CPU_H_
#define SHARDADAM_KERNELS_CPU_GRAD_NORM_CPU_H_

#include <stdint.h>

#include "../bucket_table.h"
#include "../step_control.h"

namespace sa {
namespace kernels {

// NormType::l2: the sum of squares of grad[begin, end), accumulated in double;
// NormType::inf: the largest |grad| there, with a NaN counted as +inf.
// `grad` points to elements of `type`. simd: use Highway vectors where they apply (the
// sum of squares of float32 and bfloat16 grads); the sum then depends on the vector width
// in its last bits, never on how a range is split between threads of one machine.
double grad_norm_partial(NormType norm, ElemType type, const void* grad, int64_t begin, int64_t end,
                         bool simd);

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CPU_GRAD_NORM_CPU_H_
