// kernels/cuda/muon_cuda.cu — see muon_cuda.cuh.
#include "../muon_slot.h"
#include "grid.cuh"
#include "muon_cuda.cuh"
#include "ns_round.cuh"

namespace sa {
namespace kernels {
namespace {

constexpr int kThreads = 256;

// The verdict's, or 1 with none.
__device__ float grad_scale_of(const StepVerdict* verdict) {
  return verdict != nullptr ? verdict->grad_multiplier : 1.0f;
}

__device__ bool skipped(const StepVerdict* verdict) {
  return verdict != nullptr && verdict->skip != 0;
}

// Muon's momentum as Newton-Schulz's first pass reads its input (ns_round.cuh): the
// momentum_buffer advanced, the direction u returned. A skipped step leaves the buffer as it
// was and gives zeros, whose orthogonalization apply_kernel does not read either. `vec`: the
// grad and the buffer take vector accesses.
template <class S>
struct MomentumSource {
  MuonCoeffs c;
  const StepVerdict* verdict;
  MuonSlot<S> slot;
  bool vec;
  bool skip = false;
  __device__ void begin() {
    skip = skipped(verdict);
    c.grad_scale = grad_scale_of(verdict);
  }
  __device__ float operator()(int64_t i) { return skip ? 0.0f : slot.momentum(c, i); }
  __device__ void group(int64_t i, float (&u)[kNsGroup]) {
    if (skip) {
#pragma unroll
      for (int k = 0; k < kNsGroup; ++k) u[k] = 0.0f;
      return;
    }
    float g[kNsGroup], b[kNsGroup];
    load_group<S::kGrad>(slot.grad, i, vec, g);
    load_group<S::kMoment>(slot.buf, i, vec, b);
#pragma unroll
    for (int k = 0; k < kNsGroup; ++k) u[k] = muon_momentum<S::kMoment>(c, g[k], b[k]);
    store_group<S::kMoment>(slot.buf, i, vec, b);
  }
};

// The orthogonalized direction o (bfloat16, the matrix's row-major layout, 256-byte aligned:
// the work's) applied to the slot; `vec`: the param and its master take vector accesses.
template <class S>
__global__ void apply_kernel(MuonCoeffs c, const StepVerdict* verdict, MuonSlot<S> slot,
                             const __nv_bfloat16* o, int64_t n, bool vec) {
  if (skipped(verdict)) return;
  const uint16_t* bits = bf16_bits(o);
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x) * kNsGroup; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads * kNsGroup) {
    if (n - i >= kNsGroup) {
      constexpr bool kMaster = S::kMaster == MasterKind::fp32;  // the update goes to it
      float p[kNsGroup], d[kNsGroup];
      BF16::load_vec<kNsGroup>(bits, i, d);
      if constexpr (kMaster) {
        load_group<ElemType::f32>(slot.master, i, vec, p);
      } else {
        load_group<S::kParam>(slot.param, i, vec, p);
      }
#pragma unroll
      for (int k = 0; k < kNsGroup; ++k) p[k] = muon_apply(c, p[k], d[k]);
      if constexpr (kMaster) store_group<ElemType::f32>(slot.master, i, vec, p);
      store_group<S::kParam>(slot.param, i, vec, p);  // a 16-bit param: the master rounded
    } else {
      for (int64_t j = i; j < n; ++j) slot.apply(c, j, BF16::load(bits, j));
    }
  }
}

// A grid-stride walk over the row-major elements of a box `cols` wide: element i and its
// offset in a layout of row stride ld, advanced without a division per element.
struct BoxWalk {
  int64_t i, n, stride;  // element, count, the grid's stride
  int64_t col, at;       // i's column, and i's offset at row stride ld
  int64_t cols, ld, stride_rows, stride_cols;
  __device__ BoxWalk(int64_t n_, int64_t cols_, int64_t ld_)
      : i(blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x),
        n(n_),
        stride(static_cast<int64_t>(gridDim.x) * kThreads),
        col(i % cols_),
        at(i / cols_ * ld_ + col),
        cols(cols_),
        ld(ld_),
        stride_rows(stride / cols_),
        stride_cols(stride % cols_) {}
  __device__ bool more() const { return i < n; }
  __device__ void next() {
    i += stride;
    col += stride_cols;
    at += stride_rows * ld + stride_cols;
    if (col >= cols) {
      col -= cols;
      at += ld - cols;
    }
  }
};

// A box's momentum: its momentum_buffer advanced and, with `dir`, the direction written
// there (row r of the box at dir + r * ld).
template <class S>
__global__ void box_momentum_kernel(MuonCoeffs c, MatrixBox box, const StepVerdict* verdict,
                                    MuonSlot<S> slot, float* dir, int64_t ld) {
  if (skipped(verdict)) return;
  c.grad_scale = grad_scale_of(verdict);
  for (BoxWalk w(box.box_rows * box.box_cols, box.box_cols, ld); w.more(); w.next()) {
    const float u = slot.momentum(c, w.i);
    if (dir != nullptr) dir[w.at] = u;
  }
}

// A box's orthogonalized direction (row r at dir + r * ld) applied to the box's slot.
template <class S>
__global__ void box_apply_kernel(MuonCoeffs c, MatrixBox box, const StepVerdict* verdict,
                                 MuonSlot<S> slot, const float* dir, int64_t ld) {
  if (skipped(verdict)) return;
  for (BoxWalk w(box.box_rows * box.box_cols, box.box_cols, ld); w.more(); w.next())
    slot.apply(c, w.i, dir[w.at]);
}

// launch(MuonSlot<S>(slot), grid) for the Signature S of v, with the grid of a box's
// elements: cudaErrorInvalidValue, nothing enqueued, when v is not a Muon Variant; nothing
// enqueued for an empty box.
template <class Launch>
cudaError_t launch_box(const Variant& v, const MatrixBox& box, const TensorSlot& slot,
                       Launch&& launch) {
  const int64_t n = box.box_rows * box.box_cols;
  cudaError_t e = cudaErrorInvalidValue;  // not a Muon Variant
  visit_muon_variant(v, [&](auto sig) {
    e = cudaSuccess;
    if (n == 0) return;
    launch(MuonSlot<decltype(sig)>(slot), grid_for(n, kThreads));
    e = cudaGetLastError();
  });
  return e;
}

}  // namespace

cudaError_t muon_box_momentum_cuda(const Variant& v, const MuonHyper& h, const MatrixBox& box,
                                   const StepVerdict* verdict, const TensorSlot& slot, float* dir,
                                   int64_t ld, cudaStream_t stream) {
  return launch_box(v, box, slot, [&](auto typed, auto grid) {
    box_momentum_kernel<<<grid, kThreads, 0, stream>>>(muon_coeffs(h, box.rows, box.cols), box,
                                                       verdict, typed, dir, ld);
  });
}

cudaError_t muon_box_apply_cuda(const Variant& v, const MuonHyper& h, const MatrixBox& box,
                                const StepVerdict* verdict, const float* dir, int64_t ld,
                                const TensorSlot& slot, cudaStream_t stream) {
  return launch_box(v, box, slot, [&](auto typed, auto grid) {
    box_apply_kernel<<<grid, kThreads, 0, stream>>>(muon_coeffs(h, box.rows, box.cols), box,
                                                    verdict, typed, dir, ld);
  });
}

size_t muon_cuda_work_bytes(int64_t rows, int64_t cols) {
  return newton_schulz_cuda_work_bytes(rows, cols);
}

NsStatus muon_matrix_cuda(const Variant& v, const CublasCalls& calls, cublasHandle_t blas,
                          const TensorSlot& slot, int64_t rows, int64_t cols, const MuonHyper& h,
                          const StepVerdict* verdict, void* work, cudaStream_t stream) {
  NsStatus st;
  if (!ns_dims_ok(rows, cols)) {  // before anything changes
    st.blas = CUBLAS_STATUS_INVALID_VALUE;
    return st;
  }
  st.cuda = cudaErrorInvalidValue;  // unless v is a Muon Variant
  visit_muon_variant(v, [&](auto sig) {
    using S = decltype(sig);
    const MuonSlot<S> m(slot);
    const MuonCoeffs c = muon_coeffs(h, rows, cols);
    const int64_t n = rows * cols;
    const NsInput in = ns_input(work, rows, cols);
    // Momentum fused into the first pass: u is rounded to bfloat16 where it is made.
    ns_round_and_square_kernel<<<kNsNormBlocks, kNsThreads, 0, stream>>>(
        MomentumSource<S>{c, verdict, m, group_ok<S::kGrad>(m.grad) && group_ok<S::kMoment>(m.buf)},
        n, in.x, in.partials);
    if ((st.cuda = cudaGetLastError()) != cudaSuccess) return;
    const __nv_bfloat16* o = nullptr;
    st = newton_schulz_cuda_rounded(calls, blas, rows, cols, h.ns, work, stream, &o);
    if (!st.ok()) return;
    const bool vec = group_ok<S::kParam>(m.param) &&
                     (S::kMaster != MasterKind::fp32 || group_ok<ElemType::f32>(m.master));
    apply_kernel<S>
        <<<grid_for(n, kThreads * kNsGroup), kThreads, 0, stream>>>(c, verdict, m, o, n, vec);
    st.cuda = cudaGetLastError();
  });
  return st;
}

}  // namespace kernels
}  // namespace sa
