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
#include "../../kernels/param_cast.h"
#include "../backend.hpp"
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

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options)
      : pool_(options.num_threads > 0 ? options.num_threads
                                      : std::max(1u, std::thread::hardware_concurrency())),
        simd_(options.simd) {}

  DLDevice device() const override { return DLDevice{kDLCPU, 0}; }

  // ---- memory and copies: host memory, so copies are memcpy and nothing waits ---------------

  bool host_memory() const override { return true; }

  std::shared_ptr<Buffer> allocate(std::size_t bytes) override { return make_host_buffer(bytes); }

  // CPU params' state is host memory whatever its placement.
  std::shared_ptr<Buffer> allocate_host_state(std::size_t bytes, StateKind) override {
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

  void synchronize() override {}  // every launch returns when it is done
  void synchronize_stream(void*) override {}
  bool capturing(void*) override { return false; }

  // ---- launches ----------------------------------------------------------------------------

  void widen_to_f32(float* dst, const void* src, kernels::ElemType type, int64_t n) override {
    decode_to_f32(type, src, n, dst);
  }

  void dequantize_to_f32(float* dst, const void* src, kernels::ElemType type,
                         kernels::ParamScaling scaling, const kernels::ParamScale& scale,
                         int64_t n) override {
    kernels::dequantize_param(type, scaling, src, scale, n, dst);
  }

  // The work list covers every element of every slot exactly once, in chunks that never
  // straddle two slots.
  void prepare(const Plan& plan, int64_t num_params) override {
    work_.clear();
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      const auto& slots = plan.buckets[b].slots;
      for (std::size_t s = 0; s < slots.size(); ++s)
        for (int64_t begin = 0; begin < slots[s].numel; begin += kChunkElems)
          work_.push_back({static_cast<int32_t>(b), static_cast<int32_t>(s), begin,
                           std::min(begin + kChunkElems, slots[s].numel)});
    }
    partials_.assign(work_.size(), 0.0);
    range_amax_.assign(work_.size(), 0.0f);
    writes_amax_ = false;
    for (const Bucket& bucket : plan.buckets)
      writes_amax_ = writes_amax_ || bucket.variant.scaling == kernels::ParamScaling::delayed ||
                     kernels::is_current(bucket.variant.scaling);
    coeff_of_param_.resize(static_cast<std::size_t>(num_params));
    // Tasks: runs of consecutive work items holding about kChunkElems elements (one item
    // each for large shards).
    task_begin_.clear();
    int64_t elems = kChunkElems;
    for (std::size_t i = 0; i < work_.size(); ++i) {
      if (elems >= kChunkElems) {
        task_begin_.push_back(static_cast<int64_t>(i));
        elems = 0;
      }
      elems += work_[i].end - work_[i].begin;
    }
    task_begin_.push_back(static_cast<int64_t>(work_.size()));
  }

  void upload_slots(const Plan&, std::size_t, void*) override {}  // runs read the plan itself

  void launch_stats(const Plan& plan, kernels::NormType norm, const float* found_inf, double* stats,
                    void*) override {
    stats[kernels::kStatNorm] = norm != kernels::NormType::none ? local_norm(plan, norm) : 0.0;
    stats[kernels::kStatFoundInf] = found_inf != nullptr && *found_inf != 0.0f ? 1.0 : 0.0;
  }

  // The coefficients of a step: one entry per distinct (group, next step count) of the
  // active params, and which entry each param uses. Params nearly always share a few
  // counts, so this folds a handful of entries, not one per param.
  void launch_fold(const kernels::FoldTables& t, const kernels::FoldInputs& in, void*) override {
    const kernels::StepDecision d = kernels::fold_decide(in);
    kernels::fold_publish(in, d);
    if (d.skip) return;
    for (int32_t g = 0; g < t.num_groups; ++g) ++t.group_steps[g];
    coeffs_.clear();
    coeff_index_.clear();
    std::pair<int32_t, int64_t> last_key{-1, 0};  // no group is -1
    int32_t last = -1;
    for (int32_t i = 0; i < t.num_params; ++i) {
      if (!t.param_active[i]) continue;
      const std::pair<int32_t, int64_t> key{t.param_group[i], t.param_steps[i] + 1};
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
      t.param_steps[i] = key.second;
    }
  }

  void launch_adam(const Plan& plan, const kernels::StepVerdict* verdict, void*) override {
    // A current scaling's amax starts from 0 at every step: the reduction left the last
    // step's global amax in place, and an empty shard (no slot) writes none of its own.
    for (const kernels::CurrentScale& c : plan.current) *c.scale.amax_bits = 0.0;
    if (verdict->skip) return;
    for_each_work_item([&](int64_t i) {
      const WorkItem& item = work_[i];
      const Bucket& bucket = plan.buckets[item.bucket];
      const kernels::TensorSlot& slot = bucket.slots[item.slot];
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

  void launch_current_casts(const Plan& plan, const kernels::StepVerdict* verdict, void*) override {
    if (verdict->skip) return;
    for (const kernels::CurrentScale& c : plan.current)
      kernels::write_current_scale(c.param, c.scaling, c.scale);
    for_each_work_item([&](int64_t i) {
      const WorkItem& item = work_[i];
      const Bucket& bucket = plan.buckets[item.bucket];
      if (!kernels::is_current(bucket.variant.scaling)) return;
      const kernels::TensorSlot& slot = bucket.slots[item.slot];
      kernels::cast_param_range(bucket.variant.param, bucket.variant.scaling, master_of(slot),
                                slot.param, slot.scale, item.begin, item.end,
                                kernels::fp8_cast_ops(simd_));
    });
  }

  void measure_amax(const kernels::Variant&, const kernels::TensorSlot& slot) override {
    *slot.scale.amax_bits =
        kernels::master_amax_bits(master_of(slot), 0, slot.numel, kernels::fp8_cast_ops(simd_));
  }

  void cast_param(const kernels::Variant& variant, const kernels::TensorSlot& slot) override {
    if (kernels::is_current(variant.scaling))
      kernels::write_current_scale(variant.param, variant.scaling, slot.scale);
    const float amax =
        kernels::cast_param_range(variant.param, variant.scaling, master_of(slot), slot.param,
                                  slot.scale, 0, slot.numel, kernels::fp8_cast_ops(simd_));
    if (variant.scaling == kernels::ParamScaling::delayed && slot.scale.amax != nullptr)
      *slot.scale.amax = amax;
  }

 private:
  ThreadPool pool_;
  bool simd_;
  std::vector<WorkItem> work_;
  // The pool's tasks: task t runs work items [task_begin_[t], task_begin_[t + 1]) in order.
  // A task per work item would cost more than the arithmetic of tiny shards (measured: at
  // 100k shards of 16 elements the pool's per-task hand-out, an atomic all threads share,
  // was ~15% of FusedAdam's step); the items and their order are unchanged, so the
  // results are bitwise the same.
  std::vector<int64_t> task_begin_{0};
  // The last fold's coefficients (see launch_fold); reused every step.
  std::vector<kernels::GroupCoeffs> coeffs_;
  std::vector<int32_t> coeff_of_param_;
  std::map<std::pair<int32_t, int64_t>, int32_t> coeff_index_;
  std::vector<double> partials_;   // one norm partial per work item
  std::vector<float> range_amax_;  // per work item: max |master| of a scaled param's range
  bool writes_amax_ = false;  // some bucket has a delayed or current scaling (an amax to write)

  static const float* master_of(const kernels::TensorSlot& slot) {
    return static_cast<const float*>(slot.state[static_cast<std::size_t>(StateKind::master)]);
  }

  // Each slot's amax: the largest of its work items', whose ranges are consecutive in the
  // work list. A delayed scaling's goes to the engine's amax tensor, where it asked for one
  // (updated slots only); a current scaling's to its amax_bits (every slot: the second pass
  // casts them all).
  void write_amax(const Plan& plan) {
    for (std::size_t i = 0; i < work_.size();) {
      const WorkItem& first = work_[i];
      uint32_t amax = 0;
      for (; i < work_.size() && work_[i].bucket == first.bucket && work_[i].slot == first.slot;
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
    pool_.parallel_for(static_cast<int64_t>(task_begin_.size()) - 1, [&](int64_t t) {
      for (int64_t i = task_begin_[t]; i < task_begin_[t + 1]; ++i) body(i);
    });
  }

  // This rank's partial norm (step_control.h's kStatNorm) over the shards it counts:
  // per work item in parallel, then folded in work-list order, so the result does not
  // depend on the thread count.
  double local_norm(const Plan& plan, kernels::NormType norm) {
    for_each_work_item([&](int64_t i) {
      const WorkItem& item = work_[i];
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

}  // namespace sa
