// src/current_scaling.cpp — see current_scaling.hpp.
#include "current_scaling.hpp"

#include "errors.hpp"
#include "layout.hpp"

namespace sa {
namespace {

// FNV-1a, 64 bits: what the ranks compare of their sharded current-scaled params.
void fnv1a(uint64_t& h, const void* data, std::size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001B3ull;
}

}  // namespace

CurrentScalings::Slots CurrentScalings::plan_add(const Param& p, int64_t index,
                                                 Backend& backend) const {
  Slots next;
  next.order = order_;
  const auto at = is_sharded(p.layout) ? next.order.begin() + sharded_ : next.order.end();
  next.order.insert(at, index);
  next.buffer = backend.allocate(next.order.size() * sizeof(double));
  return next;
}

void CurrentScalings::install(Slots&& next, bool sharded, const Params& params) noexcept {
  buffer_ = std::move(next.buffer);
  order_ = std::move(next.order);
  auto* bits = static_cast<double*>(buffer_->data());
  for (std::size_t i = 0; i < order_.size(); ++i) params[order_[i]]->scale.amax_bits = bits + i;
  if (sharded) ++sharded_;
  agreed_ = false;
}

void CurrentScalings::check_agreement(const Params& params, Comm& comm, Stepper& stepper,
                                      Backend& backend) {
  if (agreed_ || sharded_ == 0) return;
  uint64_t h = 0xCBF29CE484222325ull;
  for (int32_t i = 0; i < sharded_; ++i) {
    const Param& p = *params[order_[static_cast<std::size_t>(i)]];
    fnv1a(h, p.name.c_str(), p.name.size() + 1);
    fnv1a(h, p.layout.global_shape.data(), p.layout.global_shape.size() * sizeof(int64_t));
    const unsigned char tags[3] = {static_cast<unsigned char>(p.param_type),
                                   static_cast<unsigned char>(p.scaling),
                                   static_cast<unsigned char>(p.scale.margin)};
    fnv1a(h, tags, sizeof tags);
  }
  // Equal on every rank exactly when max(x) == -max(-x) for each value (all exact doubles).
  const double hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xFFFFFFFFu);
  const double mine[6] = {double(sharded_), -double(sharded_), hi, -hi, lo, -lo};
  std::shared_ptr<Buffer> values = backend.allocate(sizeof mine);
  backend.copy_from_host(values->data(), mine, sizeof mine);
  stepper.all_reduce(comm, static_cast<double*>(values->data()), 6, ReduceOp::max, nullptr);
  backend.synchronize();
  double all[6];
  backend.copy_to_host(all, values->data(), sizeof all);
  if (all[0] != -all[1])
    fail(SA_ERR_MISMATCH, "the ranks of ", comm.describe(),
         " hold different numbers of current-scaled sharded params (from ", -all[1], " to ", all[0],
         "; this rank: ", sharded_,
         "): every rank must add the same ones in the same order, empty shards included, "
         "since their amax is reduced as one vector (nothing was changed)");
  if (all[2] != -all[3] || all[4] != -all[5])
    fail(SA_ERR_MISMATCH, "the ranks of ", comm.describe(), " hold ", sharded_,
         " current-scaled sharded params each, but not the same ones (names, global shapes, "
         "dtypes, scalings, margins or order differ; this rank's first is '",
         params[order_[0]]->name,
         "'): every rank must add the same ones in the same order, since their amax is "
         "reduced as one vector (nothing was changed)");
  agreed_ = true;
}

void CurrentScalings::reduce(const Params& params, Comm& comm, Stepper& stepper, Backend& backend,
                             void* stream) {
  check_agreement(params, comm, stepper, backend);
  stepper.all_reduce(comm, amax_bits(), sharded_, ReduceOp::max, stream);
}

}  // namespace sa
