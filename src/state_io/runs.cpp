#include "runs.hpp"

namespace sa {
namespace {

Dims row_major_strides(const Dims& shape) {
  Dims strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d > 1; --d) strides[d - 2] = strides[d - 1] * shape[d - 1];
  return strides;
}

}  // namespace

RunCursor::RunCursor(const Box& box, const Box& from, const Box& to)
    : box_(box), from_offset_(from.offset), to_offset_(to.offset) {
  const std::size_t ndim = box.shape.size();
  src_strides_ = row_major_strides(from.shape);
  dst_strides_ = row_major_strides(to.shape);
  // The run spans dims [outer_, ndim): every dim after outer_ is full in all three boxes.
  outer_ = ndim == 0 ? 0 : ndim - 1;
  while (outer_ > 0 && box.shape[outer_] == from.shape[outer_] &&
         box.shape[outer_] == to.shape[outer_])
    --outer_;
  run_ = 1;
  for (std::size_t d = outer_; d < ndim; ++d) run_ *= box.shape[d];
  index_.assign(outer_, 0);
  done_ = run_ == 0;
  for (std::size_t d = 0; d < outer_; ++d) done_ = done_ || box.shape[d] == 0;
  if (!done_) locate();
}

void RunCursor::locate() {
  src_ = dst_ = 0;
  for (std::size_t d = 0; d < box_.shape.size(); ++d) {
    const int64_t global = box_.offset[d] + (d < outer_ ? index_[d] : 0);
    src_ += (global - from_offset_[d]) * src_strides_[d];
    dst_ += (global - to_offset_[d]) * dst_strides_[d];
  }
  consumed_ = 0;
}

void RunCursor::advance(int64_t n) {
  consumed_ += n;
  if (consumed_ < run_) return;
  std::size_t d = outer_;
  while (d > 0) {
    --d;
    if (++index_[d] < box_.shape[d]) {
      locate();
      return;
    }
    index_[d] = 0;
  }
  done_ = true;
}

}  // namespace sa
