// src/state_io/import_plan.hpp — phase 1 of an import (import.cpp): the shard files'
// headers checked against this optimizer (the name index, tiling, dtypes, keys, groups,
// step counts), and what the copy will do: which saved boxes go to which local state, and
// in which chunks of checksum blocks they are read. It reads the headers only and changes
// nothing.
#ifndef SHARDADAM_SRC_STATE_IO_IMPORT_PLAN_HPP_
#define SHARDADAM_SRC_STATE_IO_IMPORT_PLAN_HPP_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <dlpack/dlpack.h>

#include "../dtype.hpp"
#include "../optimizer.hpp"
#include "blob.hpp"
#include "box.hpp"
#include "metadata.hpp"
#include "shardadam/shardadam.h"

namespace sa {

// An import's options (sa_import_options), checked: the staging size (0 there: the
// default), and the flags.
struct ImportSettings {
  uint64_t staging_bytes;
  bool allow_missing, allow_unexpected, restore_groups, read_once;
};

// The settings `options` asks for; SA_ERR_INVALID_ARGUMENT for a flag other than 0 or 1.
ImportSettings import_settings(const sa_import_options& options);

// Everything phase 1 decides. Pieces point into `headers`' tensors, so a plan is moved,
// never copied.
struct ImportPlan {
  // What one saved tensor gives one local state: the box they share.
  struct Piece {
    std::size_t file = 0;
    const SavedTensor* saved = nullptr;
    Box box;                 // the intersection, in global coordinates
    Box from;                // the saved tensor's box
    Box to;                  // the local state's box
    void* dst = nullptr;     // backend memory, or null for a block moment (see `landing`)
    DLDataType dst_dtype{};  // as the state is held (float32 for a block moment: its values)
    std::string what;        // "param 'w' state exp_avg", for messages
    int landing = -1;        // a block moment: its Landing, else -1
    // The saved tensor holds block codes (version 3): their scales, and what decodes them.
    const SavedTensor* scales = nullptr;
    ElemType coded = ElemType::f32;  // the codes' storage (q8, f8e4m3)
    bool is_signed = false;          // exp_avg (q8's signed map)
    int64_t saved_numel = 0;
    // The saved elements [src_begin, src_end) hold every run (plan_import's chunks), and
    // phase 2 reads the scales of their blocks, from block scales_first on.
    int64_t src_begin = 0, src_end = 0;
    int64_t scales_first = 0;
    std::vector<float> scale_values;
  };

  // A block moment (8-bit, float8) lands in host memory, then is stored: a block that the
  // files hold whole (the same elements in one saved block of the same storage: the block
  // grids agree there) as its saved codes and absmax, bit for bit; any other block as
  // float32 values (decoded from the saved codes, or the saved float32 or bfloat16 values),
  // which are quantized by this param's blocks, as a step quantizes. Landings go in rounds
  // of at most the staging size (or one landing, if larger), each round in the same host
  // arenas: peak memory stays the staging size, not 5 bytes per element of every block
  // moment.
  struct Landing {
    FileState state;
    int64_t numel;
    int64_t blocks;
    int round = 0;    // landings of one round share the arenas
    uint64_t at = 0;  // its entries in them (import.cpp): values_ its values, then its
                      // blocks' absmax; codes_ its codes, then a flag per block: held whole
  };

  // Whole checksum blocks of one piece's saved tensor, read at once.
  struct Chunk {
    std::size_t piece;
    uint64_t begin;  // tensor-relative byte offset, at a block boundary
    uint64_t bytes;
    uint64_t cache_at = 0;  // where phase 2 kept it (when everything fits in staging)
  };

  ImportPlan() = default;
  ImportPlan(ImportPlan&&) = default;
  ImportPlan& operator=(ImportPlan&&) = default;
  ImportPlan(const ImportPlan&) = delete;
  ImportPlan& operator=(const ImportPlan&) = delete;

  std::vector<ShardHeader> headers;  // one per reader, in the readers' order
  std::vector<Piece> pieces;
  std::vector<Landing> landings;
  int rounds = 1;                 // of landings (1 when there are none)
  uint64_t arena_entries = 0;     // each arena's entries: the most a round needs (see Landing::at)
  std::vector<Chunk> chunks;      // in blob order
  bool converts = false;          // a piece's saved dtype differs from its state's
  bool cached = false;            // phase 2 keeps everything it reads in staging
  bool pipelined = false;         // else, phase 3 reads into one half while copying from the other
  uint64_t slot_bytes = 0;        // uncached: a batch's share of the staging (half when pipelined)
  uint64_t staging_bytes = 0;     // the staging phase 2 allocates (unless pipelined)
  int64_t skipped_params = 0;     // params allow_missing skips
  std::vector<int64_t> imported;  // the params the files hold, which the import loads
  std::vector<std::pair<int64_t, int64_t>> restored_steps;  // (param index, saved step count)
};

// Phase 1: reads the headers of `readers`, checks them against `opt` as `settings` asks
// (SA_ERR_MISMATCH, SA_ERR_FORMAT naming the problem), and plans the copy.
ImportPlan plan_import(const Optimizer& opt, const std::vector<BlobReader>& readers,
                       const ImportSettings& settings);

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_IMPORT_PLAN_HPP_
