// kernels/cpu/adam_cpu.h — the CPU Adam kernel: one contiguous element range of one slot.
// Threads and chunking live in the CPU backend (src/backends); this file only computes.
#ifndef SHARDADAM_KERNELS_CPU_ADAM_CPU_H_
#define SHARDADAM_KERNELS_CPU_ADAM_CPU_H_

#include <stdint.h>

#include "../bucket_table.h"

namespace sa {
namespace kernels {

// Updates elements [begin, end) of `slot` (a shard of a bucket of `variant`) with the
// coefficients `g`. With simd == true the Highway path runs when the CPU's best target
// has a fused multiply-add (x86 AVX2/AVX-512, Arm NEON/SVE); otherwise, and for the
// ragged tail, the scalar path runs. Both compute adam_update() with fma and give
// bitwise identical results (tested), so where a shard's chunk boundaries fall does not
// change any result.
void adam_cpu_range(const Variant& variant, const TensorSlot& slot, const GroupCoeffs& g,
                    int64_t begin, int64_t end, bool simd);

// The SIMD target adam_cpu_range uses on this CPU ("AVX2", "AVX3", ...), or "scalar" when
// the CPU has no target with a fused multiply-add.
const char* adam_cpu_simd_target();

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CPU_ADAM_CPU_H_
