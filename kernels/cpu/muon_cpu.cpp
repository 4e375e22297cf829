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

}  // namespace kernels
}  // namespace sa
