// src/backends/cuda_backend.cu — the CUDA backend's primitives: device-resident slot
// tables, and launches enqueued on the caller's stream (its memory and copy machinery:
// cuda_memory.hpp).
//
// Where the host must wait, and why:
//  - allocate / widen_to_f32 (add_param) and prepare (the first step after params were
//    added): setup, synchronous by contract.
//  - launches and uploads: never, in steady state. Uploads go through pinned staging
//    slots with async copies on the stream; a slot is reused only after the copy that read
//    it has completed (an event per slot), so a step still in flight never sees its inputs
//    change.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "../../kernels/cuda/adam_cuda.cuh"
#include "../../kernels/cuda/adam_fp8_cuda.cuh"
#include "../../kernels/cuda/muon_cuda.cuh"
#include "../../kernels/variants.h"
#include "../backend.hpp"
#include "../errors.hpp"
#include "cublas_api.hpp"
#include "cuda_memory.hpp"
#include "cuda_module.hpp"

namespace sa {
namespace {

using cuda::add_copy;
using cuda::check_cuda;
using cuda::Copy;
using cuda::DeviceBuffer;
using cuda::DeviceScope;
using cuda::PinnedBuffer;
using cuda::StagingPipeline;
using cuda::StagingRing;
using cuda::StatePool;

// The device copy of one bucket's tables.
struct DeviceTables {
  std::shared_ptr<Buffer> slots;          // TensorSlot[num_slots]
  std::shared_ptr<Buffer> chunk_offsets;  // int64_t[num_slots + 1]
  std::shared_ptr<Buffer> work;           // uint32_t[2], zeros: DeviceBucket::work
  kernels::DeviceBucket view{};
  // fp8 params with block moments only: the slots as their masters' update sees them
  // (kernels::fp8_master_slot), for the block-moment kernel; NULL otherwise.
  std::shared_ptr<Buffer> master_slots;
  kernels::DeviceBucket master_view{};
};

// The copies of a staged (GPU-step) segment between its host state and ring slot `ring`:
// up (in) or down (out).
std::vector<Copy> staged_copies(const StagedSegment& seg, char* ring, bool up) {
  std::vector<Copy> out;
  out.reserve(seg.copies.size());
  for (const StagedCopy& c : seg.copies)
    out.push_back(up ? Copy{ring + c.ring_offset, c.host, c.bytes}
                     : Copy{c.host, ring + c.ring_offset, c.bytes});
  return out;
}

// A staged segment as the backend launches it: its tables (slots in the ring) and the
// copies that move its state up before the kernel and down after, made once per plan.
struct SegmentLaunch {
  DeviceTables tables;
  std::vector<Copy> up, down;
};

// What the host does for one mirrored segment, as a stream callback: unless the step was
// skipped, the host's Adam over its slots (grad in the mirror; the param too, or for an
// fp8 param its master in the param's place). It owns itself: the callback deletes it.
struct HostJob {
  HostStep* host;
  kernels::Variant variant;
  std::vector<kernels::TensorSlot> slots;  // param_index: into coeffs
  const kernels::GroupCoeffs* coeffs;
  const kernels::StepVerdict* verdict;  // the step's, downloaded (pinned)
  std::atomic<bool>* failed;            // set if the host's Adam throws (it should not:
                                        // HostStep::reserve made room for everything)

  static void CUDART_CB run(void* data) {
    std::unique_ptr<HostJob> job(static_cast<HostJob*>(data));
    if (job->verdict->skip != 0) return;  // the mirror's param goes back up as it came down
    try {
      job->host->update(job->variant, job->slots.data(), job->slots.size(), job->coeffs);
    } catch (...) {
      job->failed->store(true);
    }
  }
};

// A bucket's slots as fp8_master_slot gives them.
std::vector<kernels::TensorSlot> master_slots_of(const Bucket& bucket) {
  std::vector<kernels::TensorSlot> out;
  out.reserve(bucket.slots.size());
  for (const kernels::TensorSlot& s : bucket.slots) out.push_back(kernels::fp8_master_slot(s));
  return out;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, HostStepFactory host_step)
      : device_(device), make_host_step_(std::move(host_step)) {
    DeviceScope scope(device);
    cudaDeviceProp prop{};  // fails for a device index the runtime does not know
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  }

  // A CPU step's callbacks read the host step, the mirror and host_coeffs_: let them finish.
  ~CudaBackend() override {
    if (blas_ != nullptr) cuda::cublas().destroy(blas_);  // loaded: blas_ was made with it
    if (!cpu_stream_) return;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    cudaDeviceSynchronize();
    cudaStreamDestroy(cpu_stream_);
    cudaSetDevice(previous);
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  DLDevice device() const override { return DLDevice{kDLCUDA, device_}; }

  // ---- memory and copies ---------------------------------------------------------------------

  bool host_memory() const override { return false; }

  std::shared_ptr<Buffer> allocate(std::size_t bytes) override {
    return std::make_shared<DeviceBuffer>(device_, bytes);
  }

  std::shared_ptr<Buffer> allocate_state(std::size_t bytes, StateKind kind, bool on_host) override {
    DeviceScope scope(device_);
    const auto k = static_cast<std::size_t>(kind);
    if (on_host) return host_pools_[k].allocate(bytes, PinnedBuffer::state);
    return device_pools_[k].allocate(
        bytes, [this](std::size_t n) { return std::make_shared<DeviceBuffer>(device_, n); });
  }

  std::shared_ptr<Buffer> allocate_staging(std::size_t bytes) override {
    DeviceScope scope(device_);
    return PinnedBuffer::staging(bytes);
  }

  void copy_to_host(void* host, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    DeviceScope scope(device_);
    check_cuda(cudaMemcpy(host, src, bytes, cudaMemcpyDefault), "copying state to the host");
  }

  void copy_from_host(void* dst, const void* host, std::size_t bytes) override {
    if (bytes == 0) return;
    DeviceScope scope(device_);
    check_cuda(cudaMemcpy(dst, host, bytes, cudaMemcpyDefault), "copying state to the device");
  }

  void upload(void* dst, const void* host, std::size_t bytes, void* stream) override {
    DeviceScope scope(device_);
    staging_.upload(dst, host, bytes, static_cast<cudaStream_t>(stream));
  }

  void download(void* staging, const void* src, std::size_t bytes, void* stream) override {
    if (bytes == 0) return;
    DeviceScope scope(device_);
    check_cuda(
        cudaMemcpyAsync(staging, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync download");
  }

  // One cudaMemcpy2DAsync a box (a box of whole rows is one run, copied as one row).
  void copy_boxes(float* base, const std::vector<BoxCopy>& copies, void* stream) override {
    if (copies.empty()) return;
    DeviceScope scope(device_);
    const auto s = static_cast<cudaStream_t>(stream);
    constexpr std::size_t kElem = sizeof(float);
    for (const BoxCopy& c : copies) {
      if (c.rows * c.cols == 0) continue;
      const bool run = c.from_ld == c.cols && c.to_ld == c.cols;
      const auto width = static_cast<std::size_t>(run ? c.rows * c.cols : c.cols) * kElem;
      check_cuda(
          cudaMemcpy2DAsync(
              base + c.to, run ? width : static_cast<std::size_t>(c.to_ld) * kElem, base + c.from,
              run ? width : static_cast<std::size_t>(c.from_ld) * kElem, width,
              run ? 1 : static_cast<std::size_t>(c.rows), cudaMemcpyDeviceToDevice, s),
          "Muon's box copies");
    }
  }

  // ---- synchronization ---------------------------------------------------------------------

  // Steps run on the caller's streams, which may be non-blocking: only a device-wide
  // synchronization guarantees that none of them still reads or writes backend memory.
  void synchronize() override {
    DeviceScope scope(device_);
    check_cuda(cudaDeviceSynchronize(), "synchronizing the device");
  }

  void synchronize_stream(void* stream) override {
    DeviceScope scope(device_);
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
               "synchronizing the stream");
  }

  bool capturing(void* stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status),
               "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }

  // ---- launches ----------------------------------------------------------------------------

  // On the legacy default stream, then waited for: synchronous by contract.
  void run_slot(kernels::SlotOp op, const kernels::Variant& variant,
                const kernels::TensorSlot& slot) override {
    DeviceScope scope(device_);
    const char* what = op == kernels::SlotOp::init_master    ? "master initialisation"
                       : op == kernels::SlotOp::measure_amax ? "current scaling's amax"
                                                             : "fp8 param cast";
    check_cuda(kernels::launch_slot(op, variant, slot, nullptr), what);
    check_cuda(cudaStreamSynchronize(nullptr), what);
  }

  void launch(Pass pass, const Plan& plan, const PassArgs& args, void* stream) override {
    DeviceScope scope(device_);
    const auto s = static_cast<cudaStream_t>(stream);
    switch (pass) {
      case Pass::stats:
        return launch_stats(plan, args, s);
      case Pass::fold:
        check_cuda(kernels::launch_fold_coefficients(
                       *args.fold_tables, *args.fold_inputs,
                       static_cast<kernels::GroupCoeffs*>(coeffs_->data()), s),
                   "coefficient launch");
        return;
      case Pass::update:
        return launch_update(plan, args.verdict, s);
      case Pass::gather:
        return launch_gather(plan, args, s);
      case Pass::orthogonalize:
        return launch_orthogonalize(plan, args, s);
      case Pass::matrices:
        return launch_matrices(plan, args, s);
      case Pass::current_casts:
        check_cuda(kernels::launch_current_scales(current_table(), num_current_, args.verdict, s),
                   "current scaling's scales");
        for (std::size_t b = 0; b < plan.buckets.size(); ++b)
          launch_bucket(kernels::BucketOp::current_cast, plan.buckets[b].variant,
                        bucket_args(tables_[b], args.verdict), s, "current scaling's cast");
        return;
    }
    fail(SA_ERR_INTERNAL, "no such pass: ", static_cast<int>(pass));
  }

  static void check_muon(const kernels::NsStatus& st, int64_t rows, int64_t cols) {
    check_cuda(st.cuda, "Muon's step");
    if (st.blas != CUBLAS_STATUS_SUCCESS)
      fail(st.blas == CUBLAS_STATUS_ALLOC_FAILED ? SA_ERR_OUT_OF_MEMORY : SA_ERR_DEVICE,
           "Muon's Newton-Schulz of a ", rows, " x ", cols, " matrix: cuBLAS status ",
           static_cast<int>(st.blas));
  }

  // The split matrices' boxes: momentum, and a contributing box's direction at g.dir (the
  // first plan.gather_zero doubles zeroed first). The kernels read the verdict, so a skipped
  // step writes only the zeros.
  void launch_gather(const Plan& plan, const PassArgs& args, cudaStream_t s) {
    check_cuda(cudaMemsetAsync(args.gather, 0,
                               static_cast<std::size_t>(plan.gather_zero) * sizeof(float), s),
               "zeroing Muon's directions");
    for (const GatheredMatrix& g : plan.gathered)
      if (const kernels::TensorSlot* slot = stepped_slot(plan, g))
        check_cuda(kernels::muon_box_momentum_cuda(
                       gathered_variant(plan, g), args.muon_of(*slot), g.box, args.verdict, *slot,
                       g.contributes ? args.gather + g.dir : nullptr, g.ld, s),
                   "Muon's momentum");
  }

  // The owned split matrices' directions orthogonalized in place, one after another on the
  // stream in the one scratch. (A skipped step's are zeros; its results are not applied.)
  void launch_orthogonalize(const Plan& plan, const PassArgs& args, cudaStream_t s) {
    const kernels::CublasCalls& calls = cuda::cublas().calls;
    for (const GatheredMatrix& g : plan.gathered)
      if (g.whole >= 0 && g.box.rows * g.box.cols > 0)
        check_muon(
            kernels::newton_schulz_cuda(calls, blas_, args.gather + g.whole, g.box.rows, g.box.cols,
                                        args.muon_of(g.param).ns, muon_work_->data(), s),
            g.box.rows, g.box.cols);
  }

  // Muon's step of each matrix that has a grad, one after another on the stream, in the one
  // scratch (stream order keeps them apart); a split matrix's box from its orthogonalized
  // direction in args.gather. The kernels read the verdict: a skipped step leaves every
  // param and momentum as it was.
  void launch_matrices(const Plan& plan, const PassArgs& args, cudaStream_t s) {
    const kernels::CublasCalls& calls = cuda::cublas().calls;
    for (const GatheredMatrix& g : plan.gathered)
      if (const kernels::TensorSlot* slot = stepped_slot(plan, g))
        check_cuda(
            kernels::muon_box_apply_cuda(gathered_variant(plan, g), args.muon_of(*slot), g.box,
                                         args.verdict, args.gather + g.dir, g.ld, *slot, s),
            "Muon's step");
    for (const Bucket& bucket : plan.buckets) {
      if (bucket.variant.rule != kernels::UpdateRule::muon) continue;
      for (std::size_t i = 0; i < bucket.slots.size(); ++i) {
        const kernels::TensorSlot& slot = bucket.slots[i];
        const MatrixShape m = bucket.matrix_of_slot[i];
        if (slot.grad == nullptr || m.gathered >= 0) continue;
        check_muon(
            kernels::muon_matrix_cuda(bucket.variant, calls, blas_, slot, m.rows, m.cols,
                                      args.muon_of(slot), args.verdict, muon_work_->data(), s),
            m.rows, m.cols);
      }
    }
  }

  // The device tables of one launch over `slots`.
  DeviceTables make_tables(const std::vector<kernels::TensorSlot>& slots, int64_t numel) {
    DeviceTables t;
    std::vector<int64_t> offsets(slots.size() + 1, 0);
    for (std::size_t s = 0; s < slots.size(); ++s)
      offsets[s + 1] =
          offsets[s] + (slots[s].numel + kernels::kCudaChunkElems - 1) / kernels::kCudaChunkElems;
    if (offsets.back() > 0x7FFFFFFF)
      fail(SA_ERR_UNSUPPORTED, "a bucket of ", numel, " elements needs more than 2^31 chunks");
    t.slots = allocate(slots.size() * sizeof(kernels::TensorSlot));
    t.chunk_offsets = allocate(offsets.size() * sizeof(int64_t));
    copy_from_host(t.slots->data(), slots.data(), slots.size() * sizeof(kernels::TensorSlot));
    copy_from_host(t.chunk_offsets->data(), offsets.data(), offsets.size() * sizeof(int64_t));
    t.work = allocate(2 * sizeof(uint32_t));  // zero-filled, as allocate's are
    t.view = {static_cast<const kernels::TensorSlot*>(t.slots->data()),
              static_cast<const int64_t*>(t.chunk_offsets->data()),
              static_cast<int32_t>(slots.size()), offsets.back(),
              static_cast<uint32_t*>(t.work->data())};
    return t;
  }

  // The slots of `bucket`'s segment `seg`, their state in the ring slot it streams through.
  std::vector<kernels::TensorSlot> segment_slots(const Bucket& bucket,
                                                 const StagedSegment& seg) const {
    std::vector<kernels::TensorSlot> out;
    out.reserve(seg.pieces.size());
    for (const StagedPiece& piece : seg.pieces)
      out.push_back(staged_slot(bucket, piece, pipeline_.ring(seg.ring_slot)));
    return out;
  }

  void prepare(const Plan& plan, int64_t num_params) override {
    DeviceScope scope(device_);
    // A CPU step still running reads host_coeffs_, which this may replace.
    if (host_coeffs_) check_cuda(cudaDeviceSynchronize(), "waiting for the last CPU step");
    std::vector<DeviceTables> tables;
    std::vector<std::vector<SegmentLaunch>> segment_launches(plan.buckets.size());
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      const Bucket& bucket = plan.buckets[b];
      DeviceTables t = make_tables(bucket.slots, bucket.numel);
      if (kernels::needs_master_slots(bucket.variant)) {
        const std::vector<kernels::TensorSlot> masters = master_slots_of(bucket);
        t.master_slots = allocate(masters.size() * sizeof(kernels::TensorSlot));
        copy_from_host(t.master_slots->data(), masters.data(),
                       masters.size() * sizeof(kernels::TensorSlot));
        t.master_view = t.view;
        t.master_view.slots = static_cast<const kernels::TensorSlot*>(t.master_slots->data());
      }
      tables.push_back(std::move(t));
      if (!bucket.segments.empty())
        pipeline_.ensure([this](std::size_t bytes) { return allocate(bytes); });
      for (const StagedSegment& seg : bucket.segments)
        segment_launches[b].push_back({make_tables(segment_slots(bucket, seg), bucket.numel),
                                       staged_copies(seg, pipeline_.ring(seg.ring_slot), true),
                                       staged_copies(seg, pipeline_.ring(seg.ring_slot), false)});
    }
    std::shared_ptr<Buffer> current;
    if (!plan.current.empty()) {
      current = allocate(plan.current.size() * sizeof(kernels::CurrentScale));
      copy_from_host(current->data(), plan.current.data(),
                     plan.current.size() * sizeof(kernels::CurrentScale));
    }
    int64_t total_chunks = 0;
    for (const DeviceTables& t : tables) total_chunks += t.view.num_chunks;
    auto partials =
        allocate(std::max<std::size_t>(static_cast<std::size_t>(total_chunks), 1) * sizeof(double));
    auto coeffs = allocate(std::max<std::size_t>(static_cast<std::size_t>(num_params), 1) *
                           sizeof(kernels::GroupCoeffs));
    // State the CPU steps: the param indices whose coefficients it reads.
    int64_t lo = num_params, hi = -1;
    for (const Bucket& bucket : plan.buckets)
      for (const MirroredSegment& seg : bucket.mirrored)
        for (const MirroredPiece& piece : seg.pieces) {
          const int32_t index = bucket.slots[static_cast<std::size_t>(piece.slot)].param_index;
          lo = std::min<int64_t>(lo, index);
          hi = std::max<int64_t>(hi, index);
        }
    std::shared_ptr<Buffer> host_coeffs;
    if (hi >= 0) {
      if (!host_step_) host_step_ = make_host_step_();
      std::size_t most_pieces = 0;  // of one segment: what one callback steps at most
      int64_t most_elems = 0;
      for (const Bucket& bucket : plan.buckets)
        for (const MirroredSegment& seg : bucket.mirrored) {
          int64_t elems = 0;
          for (const MirroredPiece& piece : seg.pieces) elems += piece.count;
          most_pieces = std::max(most_pieces, seg.pieces.size());
          most_elems = std::max(most_elems, elems);
        }
      host_step_->reserve(most_pieces, most_elems);
      mirror_.ensure([](std::size_t bytes) { return PinnedBuffer::staging(bytes); });
      if (!cpu_stream_)
        check_cuda(cudaStreamCreateWithFlags(&cpu_stream_, cudaStreamNonBlocking),
                   "cudaStreamCreate");
      host_coeffs = PinnedBuffer::staging(sizeof(kernels::StepVerdict) +
                                          static_cast<std::size_t>(hi - lo + 1) *
                                              sizeof(kernels::GroupCoeffs));
    }
    tables_ = std::move(tables);
    segment_launches_ = std::move(segment_launches);
    host_coeffs_ = std::move(host_coeffs);
    coeffs_first_ = lo;
    coeffs_count_ = hi - lo + 1;
    current_ = std::move(current);
    num_current_ = static_cast<int32_t>(plan.current.size());
    partials_ = std::move(partials);
    coeffs_ = std::move(coeffs);
    prepare_matrices(plan);
  }

  // The Muon buckets' cuBLAS handle (cuBLAS loaded on first need) and their scratch: the
  // largest matrix's, which every matrix reuses in turn.
  void prepare_matrices(const Plan& plan) {
    std::size_t bytes = 0;
    for (const Bucket& bucket : plan.buckets)
      for (const MatrixShape& m : bucket.matrix_of_slot)
        bytes = std::max(bytes, kernels::muon_cuda_work_bytes(m.rows, m.cols));
    for (const GatheredMatrix& g : plan.gathered)  // owned, maybe without a shard here
      bytes = std::max(bytes, kernels::muon_cuda_work_bytes(g.box.rows, g.box.cols));
    if (bytes == 0) return;
    if (blas_ == nullptr) {
      const cublasStatus_t st = cuda::cublas().create(&blas_);
      if (st != CUBLAS_STATUS_SUCCESS) {
        blas_ = nullptr;
        fail(SA_ERR_DEVICE, "cublasCreate failed for Muon's Newton-Schulz: status ",
             static_cast<int>(st));
      }
    }
    if (!muon_work_ || muon_work_->bytes() < bytes) muon_work_ = allocate(bytes);
  }

  void upload_slots(const Plan& plan, std::size_t bucket, void* stream) override {
    const auto& slots = plan.buckets[bucket].slots;
    upload(tables_[bucket].slots->data(), slots.data(), slots.size() * sizeof(kernels::TensorSlot),
           stream);
    if (!plan.buckets[bucket].segments.empty()) {  // their slots take their grads from the bucket's
      const Bucket& staged = plan.buckets[bucket];
      for (std::size_t i = 0; i < staged.segments.size(); ++i) {
        const std::vector<kernels::TensorSlot> seg = segment_slots(staged, staged.segments[i]);
        upload(segment_launches_[bucket][i].tables.slots->data(), seg.data(),
               seg.size() * sizeof(kernels::TensorSlot), stream);
      }
    }
    if (tables_[bucket].master_slots == nullptr) return;
    const std::vector<kernels::TensorSlot> masters = master_slots_of(plan.buckets[bucket]);
    upload(tables_[bucket].master_slots->data(), masters.data(),
           masters.size() * sizeof(kernels::TensorSlot), stream);
  }

  // ---- the passes ----------------------------------------------------------------------

  // What a bucket launch over `t` reads at a step with `verdict`.
  kernels::BucketArgs bucket_args(const DeviceTables& t,
                                  const kernels::StepVerdict* verdict) const {
    return {t.view, t.master_view,
            kernels::DeviceStep{static_cast<const kernels::GroupCoeffs*>(coeffs_->data()), verdict},
            kernels::NormType::none, nullptr};
  }

  static void launch_bucket(kernels::BucketOp op, const kernels::Variant& variant,
                            const kernels::BucketArgs& args, cudaStream_t s, const char* what) {
    check_cuda(kernels::launch_bucket(op, variant, args, s), what);
  }

  // Per-chunk partials of every bucket, then one deterministic finish.
  void launch_stats(const Plan& plan, const PassArgs& pass, cudaStream_t stream) {
    auto* partials = static_cast<double*>(partials_->data());
    int64_t num_partials = 0;
    if (pass.norm != kernels::NormType::none) {
      for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
        kernels::BucketArgs args = bucket_args(tables_[b], nullptr);
        args.norm = pass.norm;
        args.partials = partials + num_partials;
        launch_bucket(kernels::BucketOp::grad_norm, plan.buckets[b].variant, args, stream,
                      "gradient norm launch");
        num_partials += tables_[b].view.num_chunks;
      }
    }
    check_cuda(kernels::launch_grad_norm_finish(
                   pass.norm == kernels::NormType::inf ? pass.norm : kernels::NormType::l2,
                   partials, num_partials, pass.found_inf, pass.stats, stream),
               "gradient norm launch");
  }

  void launch_update(const Plan& plan, const kernels::StepVerdict* verdict, cudaStream_t s) {
    if (host_failed_.exchange(false))
      fail(SA_ERR_INTERNAL,
           "the host's part of an earlier step of state placed SA_STATE_ON_HOST_CPU_STEP threw "
           "(a bug: prepare reserves all it needs); those params were not updated at that step");
    if (host_coeffs_ && capturing(s))
      fail(SA_ERR_STATE,
           "a step of state placed SA_STATE_ON_HOST_CPU_STEP cannot be captured in a CUDA graph "
           "(its host part is a stream callback with per-step data)");
    check_cuda(kernels::launch_reset_current_amax(current_table(), num_current_, s),
               "current scaling's amax reset");
    bool staged = false;
    for (const Bucket& bucket : plan.buckets) staged = staged || !bucket.segments.empty();
    if (staged) pipeline_.begin(s);  // uploads start now, beside the device buckets' launches
    // Its copies and callbacks start now too, on their own streams; `s` waits for them below.
    const int last_host = host_coeffs_ ? launch_host_steps(plan, verdict, s) : -1;
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      if (!plan.buckets[b].segments.empty() ||
          plan.buckets[b].placement == StatePlacement::host_cpu_step)
        continue;
      launch_bucket(kernels::BucketOp::update, plan.buckets[b].variant,
                    bucket_args(tables_[b], verdict), s, "update launch");
    }
    int last = -1;  // the ring slot of the last segment that moved
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      const Bucket& bucket = plan.buckets[b];
      for (std::size_t i = 0; i < bucket.segments.size(); ++i) {
        // A segment none of whose params has a grad (a partial step's others) stays put.
        const auto& pieces = bucket.segments[i].pieces;
        if (std::none_of(pieces.begin(), pieces.end(), [&](const StagedPiece& piece) {
              return bucket.slots[static_cast<std::size_t>(piece.slot)].grad != nullptr;
            }))
          continue;
        const SegmentLaunch& launch = segment_launches_[b][i];
        last = bucket.segments[i].ring_slot;
        pipeline_.run(
            last, launch.up, s,
            [&] {
              launch_bucket(kernels::BucketOp::update, bucket.variant,
                            bucket_args(launch.tables, verdict), s, "update launch");
            },
            launch.down);
      }
    }
    if (last >= 0) pipeline_.join(last, s);
    if (last_host < 0) return;
    mirror_.join(last_host, s);
    // fp8 params the CPU stepped: their masters are new, in mapped host memory; the device
    // casts them (or a current scaling's amax pass reads them), as after the block kernel.
    for (std::size_t b = 0; b < plan.buckets.size(); ++b)
      if (plan.buckets[b].placement == StatePlacement::host_cpu_step)
        launch_bucket(kernels::BucketOp::cast_from_master, plan.buckets[b].variant,
                      bucket_args(tables_[b], verdict), s, "fp8 cast launch");
  }

  // State the CPU steps: the step's verdict and coefficients come down, then each mirrored
  // segment whose params have grads: param and grad down into the mirror, the host's Adam
  // (a callback on cpu_stream_), the param back up. An fp8 param's master is what the host
  // updates (fp8_master_slot): only its grad comes down, and nothing goes up (the device
  // casts it after). Returns the ring slot of the last segment enqueued (-1: none), for
  // the caller's stream to join.
  int launch_host_steps(const Plan& plan, const kernels::StepVerdict* verdict, cudaStream_t s) {
    auto* host_verdict = static_cast<kernels::StepVerdict*>(host_coeffs_->data());
    auto* host_coeffs = reinterpret_cast<kernels::GroupCoeffs*>(host_verdict + 1);
    check_cuda(cudaMemcpyAsync(host_verdict, verdict, sizeof *verdict, cudaMemcpyDeviceToHost, s),
               "downloading the step's verdict");
    check_cuda(
        cudaMemcpyAsync(host_coeffs,
                        static_cast<const kernels::GroupCoeffs*>(coeffs_->data()) + coeffs_first_,
                        static_cast<std::size_t>(coeffs_count_) * sizeof *host_coeffs,
                        cudaMemcpyDeviceToHost, s),
        "downloading the step's coefficients");
    mirror_.begin(s);
    int last = -1;
    for (const Bucket& bucket : plan.buckets) {
      const auto param_bytes = static_cast<std::size_t>(kernels::elem_bytes(bucket.variant.param));
      const auto grad_bytes = static_cast<std::size_t>(kernels::elem_bytes(bucket.variant.grad));
      const bool scaled = bucket.variant.scaling != kernels::ParamScaling::none;
      const kernels::Variant variant =
          scaled ? kernels::fp8_master_variant(bucket.variant) : bucket.variant;
      for (const MirroredSegment& seg : bucket.mirrored) {
        char* ring = mirror_.ring(seg.ring_slot);
        auto job = std::make_unique<HostJob>(
            HostJob{host_step_.get(), variant, {}, host_coeffs, host_verdict, &host_failed_});
        std::vector<Copy> down, grads_down, up;  // params, then grads: each kind merges
        for (const MirroredPiece& piece : seg.pieces) {
          const kernels::TensorSlot& slot = bucket.slots[static_cast<std::size_t>(piece.slot)];
          if (slot.grad == nullptr) continue;  // not stepped (no grad, or not in the subset)
          char* param = static_cast<char*>(slot.param) + piece.first * param_bytes;
          const char* grad = static_cast<const char*>(slot.grad) + piece.first * grad_bytes;
          const std::size_t p = piece.count * param_bytes, g = piece.count * grad_bytes;
          add_copy(grads_down, ring + piece.grad_offset, grad, g);
          if (!scaled) {
            add_copy(down, ring + piece.param_offset, param, p);
            add_copy(up, param, ring + piece.param_offset, p);
          }
          const kernels::TensorSlot mirrored = mirrored_slot(bucket, piece, ring);
          job->slots.push_back(scaled ? kernels::fp8_master_slot(mirrored) : mirrored);
          job->slots.back().param_index -= static_cast<int32_t>(coeffs_first_);
        }
        if (job->slots.empty()) continue;  // stays put
        down.insert(down.end(), grads_down.begin(), grads_down.end());
        last = seg.ring_slot;
        mirror_.run(
            last, down, cpu_stream_,
            [&] {
              check_cuda(cudaLaunchHostFunc(cpu_stream_, &HostJob::run, job.get()),
                         "enqueuing the host's step");
              job.release();  // the callback owns it now
            },
            up);
      }
    }
    return last;
  }

 private:
  const kernels::CurrentScale* current_table() const {
    return current_ ? static_cast<const kernels::CurrentScale*>(current_->data()) : nullptr;
  }

  int device_;
  HostStepFactory make_host_step_;
  std::vector<DeviceTables> tables_;
  // Per bucket: its staged segments' launches (state on the host), else none.
  std::vector<std::vector<SegmentLaunch>> segment_launches_;
  StagingPipeline pipeline_;
  // allocate_state's, per StateKind: pinned mapped host blocks, device blocks
  StatePool host_pools_[kNumStateKinds], device_pools_[kNumStateKinds];
  std::shared_ptr<Buffer> current_;  // plan.current, in device memory
  int32_t num_current_ = 0;
  std::shared_ptr<Buffer> partials_;  // per chunk of every bucket: the norm partials
  std::shared_ptr<Buffer> coeffs_;    // per param: what the last fold folded
  StagingRing staging_;
  // State the CPU steps (made on first need): the host's Adam, the mirror ring its params
  // and grads go through, the stream its callbacks run on, and the step's verdict and
  // coefficients of params [coeffs_first_, + coeffs_count_) as they come down (pinned).
  std::unique_ptr<HostStep> host_step_;
  StagingPipeline mirror_;
  cudaStream_t cpu_stream_ = nullptr;
  std::shared_ptr<Buffer> host_coeffs_;
  int64_t coeffs_first_ = 0, coeffs_count_ = 0;
  std::atomic<bool> host_failed_{false};  // a callback's Adam threw
  // Muon buckets: the handle their Newton-Schulz runs on, and its scratch (prepare_matrices).
  cublasHandle_t blas_ = nullptr;
  std::shared_ptr<Buffer> muon_work_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device, HostStepFactory host_step) {
  return std::make_unique<CudaBackend>(device, std::move(host_step));
}

}  // namespace sa
