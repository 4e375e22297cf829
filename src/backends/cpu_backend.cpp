// src/backends/cpu_backend.cpp — the CPU backend: host memory, and a step that spreads
// fixed-size chunks of all shards of all buckets over one thread pool.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <thread>
#include <utility>

#include "../../kernels/cpu/adam_cpu.h"
#include "../../kernels/cpu/grad_norm_cpu.h"
#include "../../kernels/cpu/muon_cpu.h"
#include "../../kernels/param_cast.h"
#include "../backend.hpp"
#include "../blas.hpp"
#include "../dtype.hpp"
#include "../errors.hpp"
#include "thread_pool.hpp"

namespace sa {
namespace {

// Elements per unit of work. Big enough that scheduling costs nothing (~1 MiB of traffic
// for fp32), small enough that a few large shards still spread over every thread.
constexpr int64_t kChunkElems = 32768;  // a multiple of kernels::kQuant8Block
static_assert(kChunkElems % kernels::kQuant8Block == 0, "work items start on q8 block boundaries");

// 64-byte aligned (one cache line, any SIMD width) zeroed host memory.
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(std::size_t bytes) : bytes_(bytes) {
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (data_ == nullptr)
      fail(SA_ERR_OUT_OF_MEMORY, "cannot allocate ", bytes, " bytes of host memory");
    std::memset(data_, 0, rounded);
  }
  ~HostBuffer() override { std::free(data_); }
  void* data() const override { return data_; }
  std::size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  std::size_t bytes_;
};

// Staging memory: like HostBuffer, but not zeroed (every byte is written before it is read).
class StagingBuffer final : public Buffer {
 public:
  explicit StagingBuffer(std::size_t bytes) : bytes_(bytes) {
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (data_ == nullptr)
      fail(SA_ERR_OUT_OF_MEMORY, "cannot allocate ", bytes, " bytes of staging memory");
  }
  ~StagingBuffer() override { std::free(data_); }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  void* data() const override { return data_; }
  std::size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  std::size_t bytes_;
};

// One unit of work: elements [begin, end) of one slot of one bucket.
struct WorkItem {
  int32_t bucket;
  int32_t slot;
  int64_t begin;
  int64_t end;
};

// Every element of a set of slots, cut into work items that never straddle two slots, and
// the pool's tasks: task t runs items [task_begin[t], task_begin[t + 1]) in order, runs of
// consecutive items holding about kChunkElems elements (one item each for large shards). A
// task per item would cost more than the arithmetic of tiny shards (measured: at 100k
// shards of 16 elements the pool's per-task hand-out, an atomic all threads share, was ~15%
// of FusedAdam's step); the items and their order are the same either way, so the results
// are bitwise the same.
struct WorkList {
  std::vector<WorkItem> items;
  std::vector<int64_t> task_begin{0};

  void clear() {
    items.clear();
    task_begin.assign(1, 0);
  }

  // Room for the items and tasks of `slots` slots of `elems` elements in all (each slot
  // takes at most one item more than its whole chunks; a task holds at least one item).
  void reserve(std::size_t slots, int64_t elems) {
    const std::size_t most = slots + static_cast<std::size_t>(elems / kChunkElems);
    items.reserve(most);
    task_begin.reserve(most + 2);
  }

  // Items over elements [0, numel) of slot `slot` of bucket `bucket`.
  void add(int32_t bucket, int32_t slot, int64_t numel) {
    for (int64_t begin = 0; begin < numel; begin += kChunkElems)
      items.push_back({bucket, slot, begin, std::min(begin + kChunkElems, numel)});
  }

  // Groups the items added into tasks.
  void group() {
    task_begin.clear();
    int64_t elems = kChunkElems;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (elems >= kChunkElems) {
        task_begin.push_back(static_cast<int64_t>(i));
        elems = 0;
      }
      elems += items[i].end - items[i].begin;
    }
    task_begin.push_back(static_cast<int64_t>(items.size()));
  }

  // Calls body(i) for every item i, spread over `pool` by task.
  template <class Body>
  void run(ThreadPool& pool, const Body& body) const {
    pool.parallel_for(static_cast<int64_t>(task_begin.size()) - 1, [&](int64_t t) {
      for (int64_t i = task_begin[t]; i < task_begin[t + 1]; ++i) body(i);
    });
  }
};

int thread_count(const CpuBackendOptions& options) {
  return options.num_threads > 0
             ? options.num_threads
             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// HostStep on the CPU backend's kernels, with a pool of its own.
class CpuHostStep final : public HostStep {
 public:
  explicit CpuHostStep(const CpuBackendOptions& options)
      : pool_(thread_count(options)), simd_(options.simd) {}

  void reserve(std::size_t slots, int64_t elems) override { work_.reserve(slots, elems); }

  void update(const kernels::Variant& variant, const kernels::TensorSlot* slots, std::size_t n,
              const kernels::GroupCoeffs* coeffs) override {
    work_.clear();
    for (std::size_t s = 0; s < n; ++s) work_.add(0, static_cast<int32_t>(s), slots[s].numel);
    work_.group();
    work_.run(pool_, [&](int64_t i) {
      const WorkItem& item = work_.items[static_cast<std::size_t>(i)];
      const kernels::TensorSlot& slot = slots[item.slot];
      kernels::adam_cpu_range(variant, slot, coeffs[slot.param_index], item.begin, item.end, simd_);
    });
  }

 private:
  ThreadPool pool_;
  bool simd_;
  WorkList work_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options)
      : pool_(thread_count(options)), simd_(options.simd) {}

  DLDevice device() const override { return DLDevice{kDLCPU, 0}; }

  // ---- memory and copies: host memory, so copies are memcpy and nothing waits ---------------

  bool host_memory() const override { return true; }

  std::shared_ptr<Buffer> allocate(std::size_t bytes) override { return make_host_buffer(bytes); }

  // CPU params' state is host memory whatever its placement.
  std::shared_ptr<Buffer> allocate_state(std::size_t bytes, StateKind, bool) override {
    return make_host_buffer(bytes);
  }

  std::shared_ptr<Buffer> allocate_staging(std::size_t bytes) override {
    return std::make_shared<StagingBuffer>(bytes);
  }

  void copy_to_host(void* host, const void* src, std::size_t bytes) override {
    if (bytes != 0) std::memcpy(host, src, bytes);
  }
  void copy_from_host(void* dst, const void* host, std::size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, host, bytes);
  }
  void upload(void* dst, const void* host, std::size_t bytes, void*) override {
    copy_from_host(dst, host, bytes);
  }
  void download(void* staging, const void* src, std::size_t bytes, void*) override {
    copy_to_host(staging, src, bytes);
  }

  void copy_boxes(float* base, const std::vector<BoxCopy>& copies, void*) override {
    for (const BoxCopy& c : copies)
      for (int64_t r = 0; r < c.rows; ++r)
        std::copy_n(base + c.from + r * c.from_ld, c.cols, base + c.to + r * c.to_ld);
  }

  void synchronize() override {}  // every launch returns when it is done
  void synchronize_stream(void*) override {}
  bool capturing(void*) override { return false; }

  // ---- launches ----------------------------------------------------------------------------

  // The work list covers every element of every slot exactly once, in chunks that never
  // straddle two slots.
  void prepare(const Plan& plan, int64_t num_params) override {
    work_.clear();
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      const auto& slots = plan.buckets[b].slots;
      for (std::size_t s = 0; s < slots.size(); ++s)
        work_.add(static_cast<int32_t>(b), static_cast<int32_t>(s), slots[s].numel);
    }
    work_.group();
    partials_.assign(work_.items.size(), 0.0);
    range_amax_.assign(work_.items.size(), 0.0f);
    writes_amax_ = false;
    for (const Bucket& bucket : plan.buckets)
      writes_amax_ = writes_amax_ || bucket.variant.scaling == kernels::ParamScaling::delayed ||
                     kernels::is_current(bucket.variant.scaling);
    coeff_of_param_.resize(static_cast<std::size_t>(num_params));
    int64_t muon_work = 0;  // the largest matrix's scratch, which every matrix reuses in turn
    for (const Bucket& bucket : plan.buckets)
      for (const MatrixShape& m : bucket.matrix_of_slot)
        muon_work = std::max(muon_work, kernels::muon_work_elems(m.rows, m.cols));
    for (const GatheredMatrix& g : plan.gathered)  // owned, maybe without a shard here
      muon_work = std::max(muon_work, kernels::muon_work_elems(g.box.rows, g.box.cols));
    muon_work_.assign(static_cast<std::size_t>(muon_work), 0.0f);
    if (muon_work > 0) sgemm_ = cpu_sgemm();
  }

  void upload_slots(const Plan&, std::size_t, void*) override {}  // runs read the plan itself

  // Every pass is done on return.
  void launch(Pass pass, const Plan& plan, const PassArgs& args, void*) override {
    switch (pass) {
      case Pass::stats:
        return write_stats(plan, args.norm, args.found_inf, args.stats);
      case Pass::fold:
        return fold(*args.fold_tables, *args.fold_inputs);
      case Pass::update:
        return update(plan, *args.verdict);
      case Pass::gather:
        return gather(plan, args);
      case Pass::orthogonalize:
        return orthogonalize(plan, args);
      case Pass::matrices:
        return matrices(plan, args);
      case Pass::current_casts:
        return current_casts(plan, *args.verdict);
    }
    fail(SA_ERR_INTERNAL, "no such pass: ", static_cast<int>(pass));
  }

  void run_slot(kernels::SlotOp op, const kernels::Variant& variant,
                const kernels::TensorSlot& slot) override {
    switch (op) {
      case kernels::SlotOp::init_master:
        return init_master(variant, slot);
      case kernels::SlotOp::measure_amax:
        *slot.scale.amax_bits =
            kernels::master_amax_bits(master_of(slot), 0, slot.numel, kernels::fp8_cast_ops(simd_));
        return;
      case kernels::SlotOp::cast_from_master:
        return cast_from_master(variant, slot);
    }
    fail(SA_ERR_INTERNAL, "no such slot operation: ", static_cast<int>(op));
  }

 private:
  void write_stats(const Plan& plan, kernels::NormType norm, const float* found_inf,
                   double* stats) {
    stats[kernels::kStatNorm] = norm != kernels::NormType::none ? local_norm(plan, norm) : 0.0;
    stats[kernels::kStatFoundInf] = found_inf != nullptr && *found_inf != 0.0f ? 1.0 : 0.0;
  }

  // The coefficients of a step: one entry per distinct (group, next step count) of the
  // active params, and which entry each param uses. Params nearly always share a few
  // counts, so this folds a handful of entries, not one per param.
  void fold(const kernels::FoldTables& t, const kernels::FoldInputs& in) {
    const kernels::StepDecision d = kernels::fold_decide(in);
    kernels::fold_publish(in, d);
    if (d.skip) return;
    for (int32_t g = 0; g < t.num_groups; ++g) kernels::fold_group_step(t, g);
    coeffs_.clear();
    coeff_index_.clear();
    std::pair<int32_t, int64_t> last_key{-1, 0};  // no group is -1
    int32_t last = -1;
    for (int32_t i = 0; i < t.num_params; ++i) {
      const int64_t step = kernels::fold_param_step(t, i);
      if (step == 0) continue;  // no grad in this step
      const std::pair<int32_t, int64_t> key{t.param_group[i], step};
      if (key != last_key) {  // a run of equal keys costs one compare
        const auto [it, added] =
            coeff_index_.try_emplace(key, static_cast<int32_t>(coeffs_.size()));
        if (added) {
          kernels::GroupCoeffs c{};
          c.l2 = kernels::fold_coefficients(t.hyper[key.first], key.second, d.grad_multiplier, c.c);
          coeffs_.push_back(c);
        }
        last = it->second;
        last_key = key;
      }
      coeff_of_param_[i] = last;
    }
  }

  void update(const Plan& plan, const kernels::StepVerdict& verdict) {
    // A current scaling's amax starts from 0 at every step: the reduction left the last
    // step's global amax in place, and an empty shard (no slot) writes none of its own.
    for (const kernels::CurrentScale& c : plan.current) *c.scale.amax_bits = 0.0;
    if (verdict.skip) return;
    for_each_work_item([&](int64_t i) {
      prefetch_slot(plan, static_cast<std::size_t>(i) + kPrefetchItems);
      const WorkItem& item = work_.items[static_cast<std::size_t>(i)];
      const Bucket& bucket = plan.buckets[item.bucket];
      const kernels::TensorSlot& slot = bucket.slots[item.slot];
      if (bucket.variant.rule != kernels::UpdateRule::adam) return;  // the matrices pass's
      if (slot.grad != nullptr) {
        range_amax_[i] = kernels::adam_cpu_range(bucket.variant, slot,
                                                 coeffs_[coeff_of_param_[slot.param_index]],
                                                 item.begin, item.end, simd_);
      } else if (kernels::is_current(bucket.variant.scaling)) {
        // No grad: the master stays, but the second pass casts every current-scaled param
        // again with the tensor's new scale, so its amax is measured all the same.
        range_amax_[i] = kernels::bits_float(static_cast<uint32_t>(kernels::master_amax_bits(
            master_of(slot), item.begin, item.end, kernels::fp8_cast_ops(simd_))));
      }
    });
    if (writes_amax_) write_amax(plan);
  }

  // A Muon kernel's verdict on its slot's Variant: the core builds Muon buckets of Muon
  // Variants only, so a refusal is shardadam's bug.
  static void muon_done(bool visited) {
    if (!visited) fail(SA_ERR_INTERNAL, "a Muon bucket of a Variant without a Muon step");
  }

  // The split matrices' boxes: momentum, and a contributing box's direction at g.dir.
  void gather(const Plan& plan, const PassArgs& args) {
    std::fill(args.gather, args.gather + plan.gather_zero, 0.0);
    if (args.verdict->skip) return;
    for (const GatheredMatrix& g : plan.gathered)
      if (const kernels::TensorSlot* slot = stepped_slot(plan, g))
        muon_done(kernels::muon_box_momentum_cpu(
            gathered_variant(plan, g), args.muon_of(*slot), g.box, args.verdict->grad_multiplier,
            *slot, g.contributes ? args.gather + g.dir : nullptr, g.ld));
  }

  // The owned split matrices' directions orthogonalized in place, one after another in the
  // one scratch. A skipped step's are zeros, and its results are not applied.
  void orthogonalize(const Plan& plan, const PassArgs& args) {
    if (args.verdict->skip) return;
    for (const GatheredMatrix& g : plan.gathered)
      if (g.whole >= 0 && g.box.rows * g.box.cols > 0)
        kernels::newton_schulz_cpu(sgemm_, args.gather + g.whole, g.box.rows, g.box.cols,
                                   args.muon_of(g.param).ns, muon_work_.data());
  }

  // Muon's step of each matrix that has a grad, one after another: its elementwise parts on
  // this thread, its GEMMs on the BLAS's threads, in the one scratch for all. A split
  // matrix's box comes from its orthogonalized direction in args.gather.
  void matrices(const Plan& plan, const PassArgs& args) {
    if (args.verdict->skip) return;
    for (const GatheredMatrix& g : plan.gathered)
      if (const kernels::TensorSlot* slot = stepped_slot(plan, g))
        muon_done(kernels::muon_box_apply_cpu(gathered_variant(plan, g), args.muon_of(*slot), g.box,
                                              args.gather + g.dir, g.ld, *slot));
    for (const Bucket& bucket : plan.buckets) {
      if (bucket.variant.rule != kernels::UpdateRule::muon) continue;
      for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
        const kernels::TensorSlot& slot = bucket.slots[s];
        const MatrixShape m = bucket.matrix_of_slot[s];
        if (slot.grad == nullptr || m.gathered >= 0) continue;
        muon_done(kernels::muon_matrix_cpu(bucket.variant, sgemm_, slot, m.rows, m.cols,
                                           args.muon_of(slot), args.verdict->grad_multiplier,
                                           muon_work_.data()));
      }
    }
  }

  // Small shards lie scattered in memory, each a few cache lines of param, grad and state
  // that the hardware prefetcher cannot guess: the item kPrefetchItems ahead, when it
  // starts a slot, has its first lines asked for before this item's arithmetic, so the
  // misses overlap. (Later items of a large slot run on from lines the prefetcher already
  // follows.) A hint only: it reads nothing and changes no result.
  static constexpr std::size_t kPrefetchItems = 4;
  void prefetch_slot(const Plan& plan, std::size_t i) const {
#if defined(__GNUC__)
    if (i >= work_.items.size() || work_.items[i].begin != 0) return;
    const kernels::TensorSlot& slot =
        plan.buckets[work_.items[i].bucket].slots[work_.items[i].slot];
    __builtin_prefetch(slot.param, 1);
    __builtin_prefetch(slot.grad, 0);
    for (const void* state : slot.state) __builtin_prefetch(state, 1);
#else
    (void)plan;
    (void)i;
#endif
  }

  void current_casts(const Plan& plan, const kernels::StepVerdict& verdict) {
    if (verdict.skip) return;
    for (const kernels::CurrentScale& c : plan.current)
      kernels::write_current_scale(c.param, c.scaling, c.scale);
    for_each_work_item([&](int64_t i) {
      const WorkItem& item = work_.items[static_cast<std::size_t>(i)];
      const Bucket& bucket = plan.buckets[item.bucket];
      if (!kernels::is_current(bucket.variant.scaling)) return;
      const kernels::TensorSlot& slot = bucket.slots[item.slot];
      kernels::cast_param_range(bucket.variant.param, bucket.variant.scaling, master_of(slot),
                                slot.param, slot.scale, item.begin, item.end,
                                kernels::fp8_cast_ops(simd_));
    });
  }

  void init_master(const kernels::Variant& variant, const kernels::TensorSlot& slot) {
    auto* master = static_cast<float*>(slot.state[static_cast<std::size_t>(StateKind::master)]);
    if (variant.scaling == kernels::ParamScaling::none)
      decode_to_f32(variant.param, slot.param, slot.numel, master);
    else
      kernels::dequantize_param(variant.param, variant.scaling, slot.param, slot.scale, slot.numel,
                                master);
  }

  void cast_from_master(const kernels::Variant& variant, const kernels::TensorSlot& slot) {
    if (kernels::is_current(variant.scaling))
      kernels::write_current_scale(variant.param, variant.scaling, slot.scale);
    const float amax =
        kernels::cast_param_range(variant.param, variant.scaling, master_of(slot), slot.param,
                                  slot.scale, 0, slot.numel, kernels::fp8_cast_ops(simd_));
    if (variant.scaling == kernels::ParamScaling::delayed && slot.scale.amax != nullptr)
      *slot.scale.amax = amax;
  }

  ThreadPool pool_;
  bool simd_;
  WorkList work_;
  // The last fold's coefficients (see launch_fold); reused every step.
  std::vector<kernels::GroupCoeffs> coeffs_;
  std::vector<int32_t> coeff_of_param_;
  std::map<std::pair<int32_t, int64_t>, int32_t> coeff_index_;
  std::vector<double> partials_;   // one norm partial per work item
  std::vector<float> range_amax_;  // per work item: max |master| of a scaled param's range
  bool writes_amax_ = false;      // some bucket has a delayed or current scaling (an amax to write)
  std::vector<float> muon_work_;  // the matrices pass's scratch
  kernels::CblasSgemm sgemm_ = nullptr;  // loaded when a plan has a Muon bucket

  static const float* master_of(const kernels::TensorSlot& slot) {
    return static_cast<const float*>(slot.state[static_cast<std::size_t>(StateKind::master)]);
  }

  // Each slot's amax: the largest of its work items', whose ranges are consecutive in the
  // work list. A delayed scaling's goes to the engine's amax tensor, where it asked for one
  // (updated slots only); a current scaling's to its amax_bits (every slot: the second pass
  // casts them all).
  void write_amax(const Plan& plan) {
    const std::vector<WorkItem>& items = work_.items;
    for (std::size_t i = 0; i < items.size();) {
      const WorkItem& first = items[i];
      uint32_t amax = 0;
      for (; i < items.size() && items[i].bucket == first.bucket && items[i].slot == first.slot;
           ++i)
        amax = kernels::quant8_absmax_combine(amax, kernels::quant8_magnitude_bits(range_amax_[i]));
      const Bucket& bucket = plan.buckets[first.bucket];
      const kernels::TensorSlot& slot = bucket.slots[first.slot];
      if (kernels::is_current(bucket.variant.scaling))
        *slot.scale.amax_bits = static_cast<double>(amax);
      else if (slot.grad != nullptr && slot.scale.amax != nullptr)
        *slot.scale.amax = kernels::bits_float(amax);
    }
  }

  // Calls body(i) for every work item i, spread over the pool by task.
  template <class Body>
  void for_each_work_item(const Body& body) {
    work_.run(pool_, body);
  }

  // This rank's partial norm (step_control.h's kStatNorm) over the shards it counts:
  // per work item in parallel, then folded in work-list order, so the result does not
  // depend on the thread count.
  double local_norm(const Plan& plan, kernels::NormType norm) {
    for_each_work_item([&](int64_t i) {
      const WorkItem& item = work_.items[static_cast<std::size_t>(i)];
      const Bucket& bucket = plan.buckets[item.bucket];
      const kernels::TensorSlot& slot = bucket.slots[item.slot];
      partials_[i] = slot.in_norm && slot.grad != nullptr
                         ? kernels::grad_norm_partial(norm, bucket.variant.grad, slot.grad,
                                                      item.begin, item.end, simd_)
                         : 0.0;
    });
    double total = 0.0;
    for (double partial : partials_)
      total = norm == kernels::NormType::inf ? std::max(total, partial) : total + partial;
    return total;
  }
};

}  // namespace

std::shared_ptr<Buffer> make_host_buffer(std::size_t bytes) {
  return std::make_shared<HostBuffer>(bytes);
}

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

const char* cpu_simd_target() { return kernels::adam_cpu_simd_target(); }

std::unique_ptr<HostStep> make_host_step(const CpuBackendOptions& options) {
  return std::make_unique<CpuHostStep>(options);
}

}  // namespace sa
