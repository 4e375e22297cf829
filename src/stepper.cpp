// src/stepper.cpp — a step, once for every backend (see stepper.hpp).
#include "stepper.hpp"

#include <algorithm>
#include <cstring>

#include "comm/comm.hpp"
#include "errors.hpp"

namespace sa {
namespace {

constexpr std::size_t kScratchBytes =
    sizeof(kernels::StepVerdict) + kernels::kNumStats * sizeof(double);

// The reduction of the step stats: a max for the inf norm, else a sum (step_control.h).
ReduceOp stats_op(kernels::NormType norm) {
  return norm == kernels::NormType::inf ? ReduceOp::max : ReduceOp::sum;
}

}  // namespace

Stepper::Stepper() : scratch_(make_host_buffer(kScratchBytes)) {
  static_cast<kernels::StepVerdict*>(scratch_->data())->norm = 0.0;  // no step yet
}

std::shared_ptr<Buffer> Stepper::allocate(std::size_t bytes) const {
  return backend_ ? backend_->allocate(bytes) : make_host_buffer(bytes);
}

kernels::StepVerdict* Stepper::verdict() const {
  return static_cast<kernels::StepVerdict*>(scratch_->data());
}

double* Stepper::stats() const {
  return reinterpret_cast<double*>(static_cast<char*>(scratch_->data()) +
                                   sizeof(kernels::StepVerdict));
}

// ---- tables -------------------------------------------------------------------------------

namespace {

// Room for one more, growing geometrically: an exact reserve would copy the tables at
// every add (quadratic over 100k params).
template <class Vector>
void make_room(Vector& v) {
  if (v.size() == v.capacity()) v.reserve(std::max<std::size_t>(16, 2 * v.capacity()));
}

}  // namespace

void Stepper::reserve_group() {
  make_room(hyper_);
  make_room(muon_);
  reserve_counts(group_steps_, hyper_.size(), hyper_.size() + 1);
}

void Stepper::add_group(const kernels::AdamHyper& hyper, const kernels::MuonHyper& muon) noexcept {
  hyper_.push_back(hyper);  // its count is 0: counts are zeroed past the used ones
  muon_.push_back(muon);
  ++hyper_version_;
}

void Stepper::set_hyper(int32_t group, const kernels::AdamHyper& hyper,
                        const kernels::MuonHyper& muon) {
  hyper_[group] = hyper;
  muon_[group] = muon;
  ++hyper_version_;
}

void Stepper::reserve_param() {
  make_room(param_group_);
  make_room(param_active_);
  reserve_counts(param_steps_, param_group_.size(), param_group_.size() + 1);
}

void Stepper::add_param(int32_t group, bool active) noexcept {
  param_group_.push_back(group);
  param_active_.push_back(active ? 1 : 0);
  ++params_version_;
}

void Stepper::set_subset(const std::vector<uint8_t>& subset) {
  subset_ = subset;
  ++params_version_;
}

void Stepper::set_active(int64_t param, bool active) {
  const uint8_t value = active ? 1 : 0;
  if (param_active_[param] == value) return;
  param_active_[param] = value;
  ++params_version_;
}

// ---- step counts --------------------------------------------------------------------------

void Stepper::read_counts(const Array& array, int64_t first, int64_t n, int64_t* out) const {
  if (n == 0) return;
  const auto* at = static_cast<const int64_t*>(array.buffer->data()) + first;
  const auto bytes = static_cast<std::size_t>(n) * sizeof(int64_t);
  if (backend_ == nullptr) {
    std::memcpy(out, at, bytes);
    return;
  }
  backend_->synchronize();  // a step in flight may still advance them
  backend_->copy_to_host(out, at, bytes);
}

void Stepper::write_counts(Array& array, int64_t first, int64_t n, const int64_t* in) {
  if (n == 0) return;
  auto* at = static_cast<int64_t*>(array.buffer->data()) + first;
  const auto bytes = static_cast<std::size_t>(n) * sizeof(int64_t);
  if (backend_ == nullptr) {
    std::memcpy(at, in, bytes);
    return;
  }
  backend_->synchronize();
  backend_->copy_from_host(at, in, bytes);
}

void Stepper::reserve_counts(Array& array, std::size_t used, std::size_t needed) {
  if (needed <= array.capacity) return;
  const std::size_t capacity = std::max<std::size_t>({needed, 2 * array.capacity, 16});
  std::vector<int64_t> kept(used);
  if (used > 0) read_counts(array, 0, static_cast<int64_t>(used), kept.data());
  Array grown{allocate(capacity * sizeof(int64_t)), capacity};
  write_counts(grown, 0, static_cast<int64_t>(used), kept.data());
  array = std::move(grown);
}

int64_t Stepper::group_step(int32_t group) const {
  int64_t step = 0;
  read_counts(group_steps_, group, 1, &step);
  return step;
}

void Stepper::set_group_step(int32_t group, int64_t step) {
  std::vector<int64_t> steps(param_group_.size());
  get_param_steps(0, num_params(), steps.data());
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (param_group_[i] == group) steps[i] = step;
  set_param_steps(0, num_params(), steps.data());
  write_counts(group_steps_, group, 1, &step);
}

void Stepper::get_param_steps(int64_t first, int64_t n, int64_t* steps) const {
  read_counts(param_steps_, first, n, steps);
}

void Stepper::set_param_steps(int64_t first, int64_t n, const int64_t* steps) {
  write_counts(param_steps_, first, n, steps);
}

// ---- steps --------------------------------------------------------------------------------

void Stepper::attach(Backend& backend) {
  std::vector<int64_t> groups(hyper_.size()), params(param_group_.size());
  get_param_steps(0, num_params(), params.data());
  read_counts(group_steps_, 0, num_groups(), groups.data());
  Stepper moved;  // built in full before anything of *this changes
  moved.backend_ = &backend;
  moved.scratch_ = backend.allocate(kScratchBytes);
  moved.reserve_counts(moved.group_steps_, 0, std::max(group_steps_.capacity, std::size_t{1}));
  moved.reserve_counts(moved.param_steps_, 0, std::max(param_steps_.capacity, std::size_t{1}));
  moved.write_counts(moved.group_steps_, 0, num_groups(), groups.data());
  moved.write_counts(moved.param_steps_, 0, num_params(), params.data());
  backend_ = &backend;
  scratch_ = std::move(moved.scratch_);
  group_steps_ = std::move(moved.group_steps_);
  param_steps_ = std::move(moved.param_steps_);
  hyper_copy_ = param_group_copy_ = param_active_copy_ = nullptr;
  copied_groups_ = copied_params_ = 0;
}

bool Stepper::tables_stale() const {
  return !hyper_copy_ || copied_groups_ != hyper_.size() || copied_params_ != param_group_.size() ||
         copied_hyper_version_ != hyper_version_ || copied_params_version_ != params_version_;
}

// Hyperparameters and which params have grads change rarely (lr schedules: every step, a
// few bytes per group); each goes up only when its version moved. The copies are
// reallocated (and all uploaded) when groups or params were added.
void Stepper::upload_tables(void* stream) {
  const std::size_t groups = hyper_.size(), params = param_group_.size();
  if (!hyper_copy_ || copied_groups_ != groups || copied_params_ != params) {
    auto hyper = allocate(std::max<std::size_t>(groups, 1) * sizeof(kernels::AdamHyper));
    auto param_group = allocate(std::max<std::size_t>(params, 1) * sizeof(int32_t));
    auto param_active = allocate(std::max<std::size_t>(params, 1) * sizeof(uint8_t));
    hyper_copy_ = std::move(hyper);
    param_group_copy_ = std::move(param_group);
    param_active_copy_ = std::move(param_active);
    copied_groups_ = groups;
    copied_params_ = params;
    copied_hyper_version_ = copied_params_version_ = ~uint64_t{0};
    uploaded_active_.clear();  // the new copy holds nothing yet
    // A param's group never changes: the table changes only by growing, as here.
    backend_->upload(param_group_copy_->data(), param_group_.data(), params * sizeof(int32_t),
                     stream);
  }
  if (copied_hyper_version_ != hyper_version_) {
    backend_->upload(hyper_copy_->data(), hyper_.data(), groups * sizeof(kernels::AdamHyper),
                     stream);
    copied_hyper_version_ = hyper_version_;
  }
  if (copied_params_version_ != params_version_) {
    // The active table as the fold reads it. An engine that binds every grad before a step
    // and unbinds them after it (FusedAdam) flips each flag twice between two steps and
    // leaves it as it was: the table goes up only when it differs from the copy's.
    active_scratch_.resize(params);
    for (std::size_t i = 0; i < params; ++i)
      active_scratch_[i] = subset_.empty() ? param_active_[i] : param_active_[i] & subset_[i];
    if (active_scratch_ != uploaded_active_) {
      backend_->upload(param_active_copy_->data(), active_scratch_.data(), params * sizeof(uint8_t),
                       stream);
      uploaded_active_.swap(active_scratch_);  // the scratch is rewritten whole next time
    }
    copied_params_version_ = params_version_;
  }
}

void Stepper::flush(Plan& plan, void* stream) {
  if (backend_ == nullptr) return;
  const bool tables = tables_stale();
  bool slots = false;
  for (const Bucket& b : plan.buckets) slots = slots || b.grads_moved;
  // A copy recorded into a graph would replay stale staging memory forever: uploads must
  // happen before capture (sa_optimizer_flush), never inside it.
  if ((tables || slots) && backend_->capturing(stream))
    fail(SA_ERR_STATE,
         "grad bindings or hyperparameters changed since the last step; call "
         "sa_optimizer_flush on the stream before capturing a step");
  if (tables) upload_tables(stream);
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    if (!plan.buckets[b].grads_moved) continue;
    backend_->upload_slots(plan, b, stream);
    plan.buckets[b].grads_moved = false;
  }
}

namespace {

// comm.all_reduce in pieces of at most INT32_MAX doubles, the ABI's count.
void all_reduce_in_pieces(Comm& comm, double* values, int64_t count, ReduceOp op, void* stream) {
  for (int64_t first = 0; first < count; first += INT32_MAX)
    comm.all_reduce(values + first,
                    static_cast<int32_t>(std::min<int64_t>(INT32_MAX, count - first)), op, stream);
}

}  // namespace

void Stepper::all_reduce(Comm& comm, double* values, int64_t count, ReduceOp op, void* stream) {
  const bool device_comm = comm.reduces_device_memory();
  auto reduce = [&](double* at) {
    all_reduce_in_pieces(comm, at, count, op, device_comm ? stream : nullptr);
  };
  if (device_comm || backend_->host_memory()) return reduce(values);
  const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(double);
  auto* host = static_cast<double*>(host_staging(bytes, stream));
  backend_->download(host, values, bytes, stream);
  backend_->synchronize_stream(stream);
  reduce(host);
  backend_->upload(values, host, bytes, stream);  // `host` is reusable once this returns
}

void* Stepper::host_staging(std::size_t bytes, void* stream) {
  if (backend_->capturing(stream))
    fail(SA_ERR_STATE,
         "a step with a host-callback communicator cannot be captured in a CUDA graph (the "
         "host must read the values it communicates); use an NCCL communicator");
  if (!host_staging_ || host_staging_->bytes() < bytes)
    host_staging_ = backend_->allocate_staging(bytes);
  return host_staging_->data();
}

// No params, so no device: the inputs are host floats and only the groups count.
std::optional<bool> Stepper::step_without_backend(const StepInputs& in, bool advance_groups) {
  const bool with_stats = in.clip.norm != kernels::NormType::none || in.comm != nullptr;
  double* s = stats();
  s[kernels::kStatNorm] = 0.0;
  s[kernels::kStatFoundInf] = in.found_inf != nullptr && *in.found_inf != 0.0f ? 1.0 : 0.0;
  if (in.comm != nullptr)
    in.comm->all_reduce(s, kernels::kNumStats, stats_op(in.clip.norm), nullptr);
  const kernels::FoldInputs fold{in.inv_grad_scale, in.found_inf, with_stats ? s : nullptr,
                                 in.clip,           verdict(),    in.grad_norm_out};
  const kernels::StepDecision d = kernels::fold_decide(fold);
  kernels::fold_publish(fold, d);
  if (!d.skip && advance_groups)
    for (int32_t g = 0; g < num_groups(); ++g)
      ++static_cast<int64_t*>(group_steps_.buffer->data())[g];
  return d.skip;
}

std::optional<bool> Stepper::step(Plan& plan, const StepInputs& in, void* stream,
                                  bool advance_groups) {
  if (backend_ == nullptr) return step_without_backend(in, advance_groups);
  if (!plan.gathered.empty()) prepare_gather(plan, in.matrix_comm);  // before anything changes
  flush(plan, stream);
  const bool with_stats = in.clip.norm != kernels::NormType::none || in.comm != nullptr;
  PassArgs args;  // what the passes read; the fold's tables and inputs are added below
  args.norm = in.clip.norm;
  args.found_inf = in.found_inf;
  args.stats = stats();
  args.verdict = verdict();
  args.muon = muon_.data();
  args.param_group = param_group_.data();
  if (with_stats) {
    backend_->launch(Pass::stats, plan, args, stream);
    if (in.comm != nullptr)
      all_reduce(*in.comm, stats(), kernels::kNumStats, stats_op(in.clip.norm), stream);
  }
  const kernels::FoldTables tables{static_cast<const kernels::AdamHyper*>(hyper_copy_->data()),
                                   static_cast<int64_t*>(group_steps_.buffer->data()),
                                   advance_groups ? num_groups() : 0,  // 0: the fold leaves them
                                   static_cast<const int32_t*>(param_group_copy_->data()),
                                   static_cast<const uint8_t*>(param_active_copy_->data()),
                                   static_cast<int64_t*>(param_steps_.buffer->data()),
                                   num_params()};
  const kernels::FoldInputs fold{in.inv_grad_scale, in.found_inf, with_stats ? stats() : nullptr,
                                 in.clip,           verdict(),    in.grad_norm_out};
  args.fold_tables = &tables;
  args.fold_inputs = &fold;
  backend_->launch(Pass::fold, plan, args, stream);
  backend_->launch(Pass::update, plan, args, stream);
  if (!plan.gathered.empty()) gather_matrices(plan, *in.matrix_comm, args, stream);  // and NS
  backend_->launch(Pass::matrices, plan, args, stream);
  if (!plan.current.empty()) {
    try {
      // Reduced whether or not the step is skipped: every rank calls the collective.
      if (in.amax_comm != nullptr && in.amax_count > 0)
        all_reduce(*in.amax_comm, in.amax_bits, in.amax_count, ReduceOp::max, stream);
      backend_->launch(Pass::current_casts, plan, args, stream);
    } catch (const Error& e) {
      // The update is done and cannot be taken back; say what is stale and how to mend it.
      fail(e.status(), e.what(),
           "; this step's update was applied, but the current-scaled fp8 params were not cast "
           "from their new masters: sa_optimizer_recast_params casts them (on every rank)");
    }
  }
  if (backend_->host_memory()) return verdict()->skip != 0;
  if (in.found_inf == nullptr && !with_stats) return false;  // nothing could skip it
  return std::nullopt;
}

// The split Muon matrices' layout for the communicator (plan.hpp's GatheredMatrix), after
// the ranks' agreement on it, when the plan or the communicator changed (else the
// collectives would mix matrices, or hang); and its buffer. Before the step changes anything.
void Stepper::prepare_gather(Plan& plan, Comm* comm) {
  if (comm == nullptr)
    fail(SA_ERR_STATE,
         "the plan has Muon matrices split across ranks, whose directions are "
         "gathered across the ranks, and the optimizer has no communicator "
         "(sa_optimizer_set_comm)");
  if (!gather_agreed_ || plan.gather_ranks == 0) {  // a new plan, or a new communicator
    const int32_t ranks = comm->nranks() > 1 ? comm->nranks() : 1;  // -1: a host comm unsaid
    const int32_t rank = ranks > 1 ? comm->rank() : 0;
    lay_out_gathered(plan, rank, ranks, agree_on_gather(plan, *comm, rank, ranks));
    gather_agreed_ = true;
  }
  const auto bytes = static_cast<std::size_t>(plan.gather_elems) * sizeof(float);
  if (!gather_ || gather_->bytes() < bytes) gather_ = backend_->allocate(bytes);
}

// The split Muon matrices' whole directions, orthogonalized by their owners: the boxes sent
// to the owners (summed: every rank's boxes summed whole on every rank), the owners'
// Newton-Schulz, then each rank's boxes of the results sent back. Every rank calls it at
// every step, skipped or not: it is collective.
void Stepper::gather_matrices(const Plan& plan, Comm& comm, PassArgs& args, void* stream) {
  args.gather = static_cast<float*>(gather_->data());
  backend_->launch(Pass::gather, plan, args, stream);
  if (plan.gather_ranks > 1)
    exchange(comm, plan.to_owners, args.gather, stream);
  else if (comm.nranks() < 0)  // a host communicator that does not say its ranks
    sum_directions(comm, args.gather, plan.gather_elems, stream);
  backend_->launch(Pass::orthogonalize, plan, args, stream);
  if (plan.gather_ranks > 1) exchange(comm, plan.from_owners, args.gather, stream);
}

// One MatrixExchange within the buffer at `base`: its copies here, and its transfers
// through `comm`, a host communicator's through host staging on a device backend (which
// drains the stream, as all_reduce's does).
void Stepper::exchange(Comm& comm, const MatrixExchange& x, float* base, void* stream) {
  backend_->copy_boxes(base, x.before, stream);
  constexpr std::size_t kElem = sizeof(float);
  const auto bytes_of = [](const Transfer& t) { return static_cast<int64_t>(kElem) * t.count; };
  std::vector<Comm::Transfer> sends, recvs;
  // The rounds, each one exchange: the transfers of [first, round end).
  auto by_rounds = [&](void* at_stream) {
    std::size_t sent = 0, received = 0;
    for (const MatrixExchange::Round& round : x.rounds) {
      comm.exchange({sends.begin() + static_cast<std::ptrdiff_t>(sent),
                     sends.begin() + static_cast<std::ptrdiff_t>(round.sends_end)},
                    {recvs.begin() + static_cast<std::ptrdiff_t>(received),
                     recvs.begin() + static_cast<std::ptrdiff_t>(round.recvs_end)},
                    at_stream);
      sent = round.sends_end;
      received = round.recvs_end;
    }
  };
  if (comm.reduces_device_memory() || backend_->host_memory()) {
    for (const Transfer& t : x.sends) sends.push_back({t.peer, base + t.at, bytes_of(t)});
    for (const Transfer& t : x.recvs) recvs.push_back({t.peer, base + t.at, bytes_of(t)});
    by_rounds(stream);
  } else {
    int64_t total = 0;
    for (const Transfer& t : x.sends) total += t.count;
    for (const Transfer& t : x.recvs) total += t.count;
    auto* host = static_cast<float*>(host_staging(static_cast<std::size_t>(total) * kElem, stream));
    for (const Transfer& t : x.sends) {
      backend_->download(host, base + t.at, static_cast<std::size_t>(bytes_of(t)), stream);
      sends.push_back({t.peer, host, bytes_of(t)});
      host += t.count;
    }
    for (const Transfer& t : x.recvs) {
      recvs.push_back({t.peer, host, bytes_of(t)});
      host += t.count;
    }
    backend_->synchronize_stream(stream);
    by_rounds(nullptr);
    for (std::size_t i = 0; i < recvs.size(); ++i)
      backend_->upload(base + x.recvs[i].at, recvs[i].data,
                       static_cast<std::size_t>(recvs[i].bytes), stream);
  }
  backend_->copy_boxes(base, x.after, stream);
}

// The summed layout's whole directions (`count` floats at `values`, backend memory) summed
// across the ranks of a host communicator, whose all_reduce takes doubles: widened on the
// host (through host staging on a device backend), reduced, and narrowed back, exactly (each
// sum is one rank's float and zeros).
void Stepper::sum_directions(Comm& comm, float* values, int64_t count, void* stream) {
  const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(float);
  float* host = values;
  if (!backend_->host_memory()) {
    host = static_cast<float*>(host_staging(bytes, stream));
    backend_->download(host, values, bytes, stream);
    backend_->synchronize_stream(stream);
  }
  wide_.assign(host, host + count);
  all_reduce_in_pieces(comm, wide_.data(), count, ReduceOp::sum, nullptr);
  std::copy(wide_.begin(), wide_.end(), host);
  if (host != values) backend_->upload(values, host, bytes, stream);
}

// values (host memory) := their `op` over the ranks of `comm`, through backend memory as a
// step's reductions go. Synchronizes: for agreements, when a layout changes.
void Stepper::reduce_now(Comm& comm, std::vector<double>& values, ReduceOp op) {
  const std::size_t bytes = values.size() * sizeof(double);
  std::shared_ptr<Buffer> at = backend_->allocate(bytes);
  backend_->copy_from_host(at->data(), values.data(), bytes);
  all_reduce(comm, static_cast<double*>(at->data()), static_cast<int64_t>(values.size()), op,
             nullptr);
  backend_->synchronize();
  backend_->copy_to_host(values.data(), at->data(), bytes);
}

// The ranks' agreement on the split matrices: the same count and elements over the same
// rank count (a max-reduction of each and its negation); then with said ranks, a table of
// one row a rank (summed: each rank writes its own), which holds a 1 (each rank number must
// be said once) and the rank's box of each matrix. Returns every rank's boxes
// (lay_out_gathered's `boxes`, which it checks; none when the ranks are unsaid).
std::vector<kernels::MatrixBox> Stepper::agree_on_gather(const Plan& plan, Comm& comm, int32_t rank,
                                                         int32_t ranks) {
  const std::size_t n = plan.gathered.size();
  double elems = 0;
  for (const GatheredMatrix& g : plan.gathered)
    elems += static_cast<double>(g.box.rows) * static_cast<double>(g.box.cols);
  const double count = static_cast<double>(n), k = static_cast<double>(ranks);
  std::vector<double> all = {elems, -elems, count, -count, k, -k};
  reduce_now(comm, all, ReduceOp::max);
  if (all[0] != -all[1] || all[2] != -all[3] || all[4] != -all[5])
    fail(SA_ERR_MISMATCH, "the ranks of ", comm.describe(),
         " hold different split Muon matrices (from ", -all[3], " to ", all[2], " matrices of ",
         -all[1], " to ", all[0], " elements in all, over ", -all[5], " to ", all[4],
         " ranks; this rank: ", n, " of ", elems, " over ", ranks,
         "): register the same params, in the same order and groups, on every rank");
  if (comm.nranks() < 1) return {};  // ranks unsaid: nothing to check the boxes against
  constexpr std::size_t kBoxFields = 6;
  const std::size_t width = 1 + kBoxFields * n;
  std::vector<double> table(static_cast<std::size_t>(ranks) * width, 0.0);
  double* mine = table.data() + static_cast<std::size_t>(rank) * width;
  mine[0] = 1.0;
  for (std::size_t m = 0; m < n; ++m) {
    const kernels::MatrixBox& b = plan.gathered[m].box;
    const double fields[kBoxFields] = {
        static_cast<double>(b.rows),     static_cast<double>(b.cols),
        static_cast<double>(b.row0),     static_cast<double>(b.col0),
        static_cast<double>(b.box_rows), static_cast<double>(b.box_cols)};
    std::copy(fields, fields + kBoxFields, mine + 1 + kBoxFields * m);
  }
  reduce_now(comm, table, ReduceOp::sum);
  for (std::size_t r = 0; r < static_cast<std::size_t>(ranks); ++r)
    if (table[r * width] != 1.0)
      fail(SA_ERR_MISMATCH, comm.describe(), ": ", table[r * width], " ranks say they are rank ", r,
           " of ", ranks, "; each rank must say its own number, 0 to ", ranks - 1, " once");
  std::vector<kernels::MatrixBox> boxes(static_cast<std::size_t>(ranks) * n);
  for (std::size_t r = 0; r < static_cast<std::size_t>(ranks); ++r)
    for (std::size_t m = 0; m < n; ++m) {
      const double* f = table.data() + r * width + 1 + kBoxFields * m;
      boxes[r * n + m] = {static_cast<int64_t>(f[0]), static_cast<int64_t>(f[1]),
                          static_cast<int64_t>(f[2]), static_cast<int64_t>(f[3]),
                          static_cast<int64_t>(f[4]), static_cast<int64_t>(f[5])};
    }
  return boxes;
}

StepReport Stepper::last_report() const {
  kernels::StepVerdict v{};
  if (backend_ == nullptr || backend_->host_memory()) {
    v = *verdict();
  } else {
    backend_->synchronize();
    backend_->copy_to_host(&v, verdict(), sizeof v);
  }
  return {v.skip != 0, v.norm};
}

}  // namespace sa
