// kernels/cpu/muon_cpu.cpp — see muon_cpu.h.
#include "muon_cpu.h"

#include "newton_schulz.h"

namespace sa {
namespace kernels {

int64_t muon_work_elems(int64_t rows, int64_t cols) {
  return rows * cols + ns_work_elems(rows, cols);  // the direction, then the iteration's
}

void muon_matrix_cpu(CblasSgemm sgemm, float* param, const float* grad, float* buf, int64_t rows,
                     int64_t cols, const MuonHyper& h, float grad_scale, float* work) {
  const MuonCoeffs c = muon_coeffs(h, rows, cols, grad_scale);
  const int64_t n = rows * cols;
  float* u = work;
  for (int64_t i = 0; i < n; ++i) u[i] = muon_momentum(c, grad[i], buf[i]);
  newton_schulz_cpu(sgemm, u, rows, cols, h.ns, work + n);
  for (int64_t i = 0; i < n; ++i) param[i] = muon_apply(c, param[i], u[i]);
}

void muon_box_momentum_cpu(const MuonHyper& h, const MatrixBox& box, float grad_scale,
                           const float* grad, float* buf, float* dir, int64_t ld) {
  const MuonCoeffs c = muon_coeffs(h, box.rows, box.cols, grad_scale);
  for (int64_t r = 0; r < box.box_rows; ++r)
    for (int64_t k = 0; k < box.box_cols; ++k) {
      const int64_t i = r * box.box_cols + k;
      const float u = muon_momentum(c, grad[i], buf[i]);
      if (dir != nullptr) dir[r * ld + k] = u;
    }
}

void muon_box_apply_cpu(const MuonHyper& h, const MatrixBox& box, const float* dir, int64_t ld,
                        float* param) {
  const MuonCoeffs c = muon_coeffs(h, box.rows, box.cols);
  for (int64_t r = 0; r < box.box_rows; ++r)
    for (int64_t k = 0; k < box.box_cols; ++k) {
      const int64_t i = r * box.box_cols + k;
      const float o = dir[r * ld + k];
      param[i] = muon_apply(c, param[i], o);
    }
}

}  // namespace kernels
}  // namespace sa
