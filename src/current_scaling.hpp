// src/current_scaling.hpp — the bookkeeping of current-scaled fp8 params
// (kernels::is_current): one amax per param, as magnitude bits in a double of backend
// memory that the step's first pass writes, the communicator max-reduces across ranks,
// and the cast pass reads (kernels/param_scaling.h). The sharded params' amaxes come first,
// so that one collective over a prefix reduces them all; the ranks must hold the same
// sharded params in the same order, which this checks once per set of params and
// communicator.
#ifndef SHARDADAM_SRC_CURRENT_SCALING_HPP_
#define SHARDADAM_SRC_CURRENT_SCALING_HPP_

#include <cstdint>
#include <memory>
#include <vector>

#include "backend.hpp"
#include "comm/comm.hpp"
#include "param.hpp"
#include "stepper.hpp"

namespace sa {

class CurrentScalings {
 public:
  using Params = std::vector<std::unique_ptr<Param>>;

  // What adding a current-scaled param takes: the amax buffer with room for it, and the
  // new order. Made before the add commits (may throw), installed after (cannot).
  struct Slots {
    std::shared_ptr<Buffer> buffer;
    std::vector<int64_t> order;
  };
  // The slots with param `p` added as index `index`, in `backend`'s memory. Changes nothing.
  Slots plan_add(const Param& p, int64_t index, Backend& backend) const;
  // Makes `next` current: every current-scaled param of `params` points its amax_bits into
  // the new buffer. `sharded`: whether the added param is.
  void install(Slots&& next, bool sharded, const Params& params) noexcept;

  // How many are sharded (their amaxes are the buffer's first ones), and the buffer.
  int32_t sharded() const { return sharded_; }
  double* amax_bits() const { return buffer_ ? static_cast<double*>(buffer_->data()) : nullptr; }
  // The index of the first sharded one (sharded() > 0).
  int64_t first_sharded() const { return order_.front(); }

  // The communicator changed: the ranks' agreement is checked again at the next reduce.
  void comm_changed() { agreed_ = false; }

  // Compares this rank's sharded current-scaled params (names, global shapes, dtypes,
  // scalings, margins, order) with the other ranks' through `comm` (a collective, once per
  // set of params and communicator; synchronizes): SA_ERR_MISMATCH if they differ.
  void check_agreement(const Params& params, Comm& comm, Stepper& stepper, Backend& backend);
  // check_agreement, then max-reduces the sharded amaxes through `comm` on `stream`.
  void reduce(const Params& params, Comm& comm, Stepper& stepper, Backend& backend, void* stream);

 private:
  std::shared_ptr<Buffer> buffer_;  // order_.size() doubles of backend memory
  std::vector<int64_t> order_;      // param indices: the sharded ones first, in param order
  int32_t sharded_ = 0;
  bool agreed_ = false;  // checked against the ranks since the set or the comm changed
};

}  // namespace sa

#endif  // SHARDADAM_SRC_CURRENT_SCALING_HPP_
