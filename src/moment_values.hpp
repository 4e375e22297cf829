// src/moment_values.hpp — a moment's values as float32, whatever its storage, the one form
// in which moments leave and enter the library for checkpoints (shard files, the torch
// face's state dicts): float32 as is, bfloat16 widened, 8-bit codes decoded. Coming in,
// they are stored in the moment's dtype: 8-bit ones quantized by the local shard's blocks,
// as a step quantizes them.
#ifndef SHARDADAM_SRC_MOMENT_VALUES_HPP_
#define SHARDADAM_SRC_MOMENT_VALUES_HPP_

#include <cstdint>

#include "backend.hpp"
#include "optimizer.hpp"

namespace sa {

// The float32 values of n elements of an 8-bit moment that start at a block boundary:
// map[code] * absmax, except that in a block of a signed moment (exp_avg) with no code 255
// the first element of code 0 is -absmax. The signed map holds +1 but not -1
// (bitsandbytes' dynamic map), so a block whose largest magnitude was negative coded that
// element as the map's lowest entry, which decodes to less than the absmax; written as
// the value it was quantized from, the block's absmax, and with it every code, comes back
// exactly when the values are quantized again by the same blocks. `absmax` has one entry
// per block of the n elements.
void quant8_values(const uint8_t* codes, const float* absmax, int64_t n, bool is_signed,
                   float* out);

// Quantizes n float32 values by blocks of kernels::kQuant8Block from the first: codes[n]
// and absmax[one per block], as a step encodes them (kernels/quant8.h).
void quant8_from_values(const float* values, int64_t n, bool is_signed, uint8_t* codes,
                        float* absmax);

// The moment `f` (a FileState whose state is a moment) of a param of n elements as n
// float32 values in host memory. Synchronizes the backend.
void read_moment_values(Backend& backend, const FileState& f, int64_t n, float* out);

// Stores n float32 values (host memory) into the moment `f` of a param of n elements, in
// its dtype (bfloat16: rounded to nearest even; 8-bit: quant8_from_values). Synchronizes
// the backend; throws SA_ERR_OUT_OF_MEMORY before changing anything when it cannot stage
// the values.
void write_moment_values(Backend& backend, const FileState& f, int64_t n, const float* values);

}  // namespace sa

#endif  // SHARDADAM_SRC_MOMENT_VALUES_HPP_
