// kernels/cpu/adam_cpu.h — the CPU Adam kernel: one contiguous element range of one slot.
// Threads and chunking live in the CPU backend (src/backends); this file only computes.
#ifndef SHARDADAM_KERNELS_CPU_ADAM_CPU_H_
#define SHARDADAM_KERNELS_CPU_ADAM_CPU_H_

#include <stdint.h>

#include "../bucket_table.h"
#include "../param_cast.h"  // CastOps

namespace sa {
namespace kernels {

// Updates elements [begin, end) of `slot` (a shard of a bucket of `variant`) with the
// coefficients `g`. With simd == true the Highway path runs when the CPU's best target
// has a fused multiply-add (x86 AVX2/AVX-512, Arm NEON/SVE); otherwise, and for the
// ragged tail, the scalar path runs. Both compute adam_update() with fma and give
// bitwise identical results (tested), so where a shard's chunk boundaries fall does not
// change any result.
//
// A scaled (fp8) param's range is updated as its float32 master (fp8_master_variant) and
// then cast (param_scaling.h), a run of kCastRun elements at a time while the master is in
// cache; begin must then be a multiple of kQuant8Block (so of every scaling's block) and
// end too, or the shard's end. A current scaling's range is updated only: its cast needs
// the whole tensor's amax (cpu_backend.cpp's second pass). Returns max |master| over the
// range for a scaled param (quant8_absmax's rule; a delayed or current scaling's amax is
// folded from it), else 0.
float adam_cpu_range(const Variant& variant, const TensorSlot& slot, const GroupCoeffs& g,
                     int64_t begin, int64_t end, bool simd);

// codes[i] = cast_value(master[i], factor) (param_cast.h) for an fp8 param dtype `type`, and
// quant8_absmax(master, n): the scalar loops, or Highway's lanes for the whole vectors and
// then the scalar loop, which give the same bits (tests/test_cpu_kernel.cpp checks every
// class of float). fp8_cast_ops picks them as adam_cpu_range's `simd` does.
void cast_fp8_run_scalar(ElemType type, const float* master, int64_t n, float factor,
                         uint8_t* codes);
void cast_fp8_run_simd(ElemType type, const float* master, int64_t n, float factor, uint8_t* codes);
float absmax_scalar(const float* master, int64_t n);
float absmax_simd(const float* master, int64_t n);
const CastOps& fp8_cast_ops(bool simd);

// decode_block<q8> and encode_block<q8> (block_moment.h) of one block of a moment (signed:
// exp_avg's map): the scalar loops, or when `simd` Highway's lanes for the whole vectors
// (gathers from the map, the midpoints and the bucket table) and then the scalar loop, which
// give the same bits (tests/test_cpu_kernel.cpp checks every code and every midpoint, NaNs
// and infinities included). encode_q8 returns the block's absmax.
void decode_q8(bool is_signed, const uint8_t* codes, float absmax, int64_t n, float* x, bool simd);
float encode_q8(bool is_signed, const float* x, int64_t n, uint8_t* codes, bool simd);
// The same for a float8 moment's block (block_moment.h's f8e4m3).
void decode_f8e4m3(const uint8_t* codes, float absmax, int64_t n, float* x, bool simd);
float encode_f8e4m3(const float* x, int64_t n, uint8_t* codes, bool simd);

// Elements a scaled param's range is updated and cast by at a time: 4 KiB of master.
constexpr int64_t kCastRun = 1024;

// The SIMD target adam_cpu_range uses on this CPU ("AVX2", "AVX3", ...), or "scalar" when
// the CPU has no target with a fused multiply-add.
const char* adam_cpu_simd_target();

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_CPU_ADAM_CPU_H_
