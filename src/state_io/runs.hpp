// src/state_io/runs.hpp — copying a box between two row-major arrays that hold different
// boxes of the same global tensor, as runs contiguous in both. Trailing dims that the box,
// the source and the destination all span fully merge into one run, so an FSDP dim-0
// reshard is one run per saved shard whatever the trailing dims.
#ifndef SHARDADAM_SRC_STATE_IO_RUNS_HPP_
#define SHARDADAM_SRC_STATE_IO_RUNS_HPP_

#include <cstdint>

#include "box.hpp"

namespace sa {

// Walks the runs of copying `box` from an array holding `from` to one holding `to` (both
// contain `box`), in increasing order of source (and destination) offset. Offsets and
// lengths are in elements. Keeps O(ndim) state: a strided copy of millions of runs is
// never materialized as a list.
class RunCursor {
 public:
  RunCursor(const Box& box, const Box& from, const Box& to);

  bool done() const { return done_; }
  // The rest of the current run: where it starts in the source and the destination, and
  // how many elements it still has.
  int64_t src() const { return src_ + consumed_; }
  int64_t dst() const { return dst_ + consumed_; }
  int64_t remaining() const { return run_ - consumed_; }
  // Consumes n <= remaining() elements; moves to the next run when the current one ends.
  void advance(int64_t n);

 private:
  void locate();  // src_, dst_ of the run at index_

  Box box_;
  Dims from_offset_, to_offset_;
  Dims src_strides_, dst_strides_;
  std::size_t outer_ = 0;  // dims [0, outer_) index the runs; the rest are inside a run
  Dims index_;             // over the outer dims
  int64_t run_ = 0;
  int64_t src_ = 0, dst_ = 0, consumed_ = 0;
  bool done_ = false;
};

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_RUNS_HPP_
