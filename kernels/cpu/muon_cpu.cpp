// kernels/cpu/muon_cpu.cpp — see muon_cpu.h.
#include "muon_cpu.h"

#include "../muon_slot.h"
#include "newton_schulz.h"

namespace sa {
namespace kernels {

int64_t muon_work_elems(int64_t rows, int64_t cols) {
  return rows * cols + ns_work_elems(rows, cols);  // the direction, then the iteration's
}

bool muon_matrix_cpu(const Variant& v, CblasSgemm sgemm, const TensorSlot& slot, int64_t rows,
                     int64_t cols, const MuonHyper& h, float grad_scale, float* work) {
  return visit_muon_variant(v, [&](auto sig) {
    const MuonSlot<decltype(sig)> m(slot);
    const MuonCoeffs c = muon_coeffs(h, rows, cols, grad_scale);
    const int64_t n = rows * cols;
    float* u = work;
    for (int64_t i = 0; i < n; ++i) u[i] = m.momentum(c, i);
    newton_schulz_cpu(sgemm, u, rows, cols, h.ns, work + n);
    for (int64_t i = 0; i < n; ++i) m.apply(c, i, u[i]);
  });
}

bool muon_box_momentum_cpu(const Variant& v, const MuonHyper& h, const MatrixBox& box,
                           float grad_scale, const TensorSlot& slot, float* dir, int64_t ld) {
  return visit_muon_variant(v, [&](auto sig) {
    const MuonSlot<decltype(sig)> m(slot);
    const MuonCoeffs c = muon_coeffs(h, box.rows, box.cols, grad_scale);
    for (int64_t r = 0; r < box.box_rows; ++r)
      for (int64_t k = 0; k < box.box_cols; ++k) {
        const float u = m.momentum(c, r * box.box_cols + k);
        if (dir != nullptr) dir[r * ld + k] = u;
      }
  });
}

bool muon_box_apply_cpu(const Variant& v, const MuonHyper& h, const MatrixBox& box,
                        const float* dir, int64_t ld, const TensorSlot& slot) {
  return visit_muon_variant(v, [&](auto sig) {
    const MuonSlot<decltype(sig)> m(slot);
    const MuonCoeffs c = muon_coeffs(h, box.rows, box.cols);
    for (int64_t r = 0; r < box.box_rows; ++r)
      for (int64_t k = 0; k < box.box_cols; ++k) m.apply(c, r * box.box_cols + k, dir[r * ld + k]);
  });
}

}  // namespace kernels
}  // namespace sa
