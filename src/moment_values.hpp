// src/moment_values.hpp — a moment's values as float32, whatever its storage: float32 as
// is, bfloat16 widened, block codes (8-bit, float8) decoded. The torch face's state dicts
// hold moments so, and shard files reshard block moments through them. Coming in, they are
// stored in the moment's dtype: block ones quantized by the local shard's blocks, as a step
// quantizes them.
#ifndef SHARDADAM_SRC_MOMENT_VALUES_HPP_
#define SHARDADAM_SRC_MOMENT_VALUES_HPP_

#include <cstdint>

#include <string>
#include <utility>

#include "backend.hpp"
#include "param.hpp"

namespace sa {

// The float32 values of n elements of a block moment (kernels/block_moment.h: q8,
// f8e4m3) that start at a block boundary: each code decoded with its block's absmax,
// except that the element the absmax came from reads as the absmax (q8: in a block of a
// signed moment with no code 255, the first element of code 0 is -absmax; f8e4m3: the
// elements of the block's largest code magnitude are +-absmax). Written so, the block's
// absmax, and with it every code, comes back exactly when the values are quantized again
// by the same blocks. `absmax` has one entry per block of the n elements; `is_signed`:
// the moment is exp_avg (q8's signed map).
void block_values(ElemType type, bool is_signed, const uint8_t* codes, const float* absmax,
                  int64_t n, float* out);

// Quantizes n float32 values by blocks of kernels::kQuant8Block from the first: codes[n]
// and absmax[one per block], as a step encodes them.
void block_from_values(ElemType type, bool is_signed, const float* values, int64_t n,
                       uint8_t* codes, float* absmax);

// The moment `f` (a FileState whose state is a moment) of a param of n elements as n
// float32 values in host memory. Synchronizes the backend.
void read_moment_values(Backend& backend, const FileState& f, int64_t n, float* out);

// Stores n codes and their blocks' absmax values (host memory) into the block moment `f`
// of a param of n elements. Synchronizes the backend.
void write_block_codes(Backend& backend, const FileState& f, int64_t n, const uint8_t* codes,
                       const float* absmax);

// Stores n float32 values (host memory) into the moment `f` of a param of n elements, in
// its dtype (bfloat16: rounded to nearest even; block moments: block_from_values). Synchronizes
// the backend; throws SA_ERR_OUT_OF_MEMORY before changing anything when it cannot stage
// the values.
void write_moment_values(Backend& backend, const FileState& f, int64_t n, const float* values);

// The moment `key` of `p` and the float32 host array of `values` (a tensor of p's local
// shape) that get_moment_values / set_moment_values read or write, or the error that says
// why not (`what` names `values` in it).
std::pair<FileState, float*> checked_moment_values(const Param& p, const std::string& key,
                                                   const DLTensor& values, const char* what);

}  // namespace sa

#endif  // SHARDADAM_SRC_MOMENT_VALUES_HPP_
