// kernels/muon_math.h — Muon's update of one whole matrix, as torch.optim.Muon's
// _single_tensor_muon does it (torch >= 2.9):
//
//   g   := grad * grad_scale                              (the inverse loss scale, the clip)
//   buf := buf + (1 - momentum) (g - buf)                 (buf.lerp_(g, 1 - momentum))
//   u   := nesterov ? g + momentum (buf - g) : buf         (g.lerp(buf, momentum))
//   O   := NewtonSchulz(u)                                 (kernels/newton_schulz.h)
//   p   := p (1 - lr weight_decay) - adjusted_lr(lr, rows, cols) O
//
// The per-element parts below are written once for every backend; the orthogonalization
// runs on each backend's GEMM library. `rows` and `cols` are the matrix's global shape:
// the learning rate adjustment is the whole matrix's, wherever its shards live.
#ifndef SHARDADAM_KERNELS_MUON_MATH_H_
#define SHARDADAM_KERNELS_MUON_MATH_H_

#include <math.h>
#include <stdint.h>

#include "elem_type.h"  // SA_HD, Codec
#include "newton_schulz.h"

namespace sa {
namespace kernels {

// torch.optim.Muon's adjust_lr_fn.
enum class MuonLrAdjust : int32_t {
  original = 0,         // lr * sqrt(max(1, rows / cols))
  match_rms_adamw = 1,  // lr * 0.2 * sqrt(max(rows, cols))
};

// A Muon group's hyperparameters (torch.optim.Muon's defaults but lr).
struct MuonHyper {
  double lr = 1e-3;
  double weight_decay = 0.1;
  double momentum = 0.95;
  bool nesterov = true;
  MuonLrAdjust adjust_lr = MuonLrAdjust::original;
  NewtonSchulz ns;
};

// The learning rate a rows x cols matrix is stepped with (in double, as torch's Python
// computes it, then rounded once).
inline double muon_adjusted_lr(const MuonHyper& h, int64_t rows, int64_t cols) {
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  const double ratio = h.adjust_lr == MuonLrAdjust::match_rms_adamw
                           ? 0.2 * sqrt(r > c ? r : c)
                           : sqrt(r / c > 1.0 ? r / c : 1.0);
  return h.lr * ratio;
}

// A rank's box of a rows x cols matrix: rows [row0, row0 + box_rows) and columns
// [col0, col0 + box_cols), which the rank holds as a row-major box_rows x box_cols shard.
// A matrix split across ranks is stepped whole from its boxes: each rank's momentum of its
// box, summed into the whole direction over the ranks, orthogonalized, and each box of the
// result applied where it is held.
struct MatrixBox {
  int64_t rows;
  int64_t cols;
  int64_t row0;
  int64_t col0;
  int64_t box_rows;
  int64_t box_cols;
};

// The step's float constants, folded once per matrix.
struct MuonCoeffs {
  float grad_scale;          // what every grad is multiplied by (1: as it is)
  float one_minus_momentum;  // buf's lerp weight
  float momentum;            // Nesterov's lerp weight
  bool nesterov;
  float decay_factor;  // 1 - lr * weight_decay
  float neg_lr;        // -adjusted_lr
};

inline MuonCoeffs muon_coeffs(const MuonHyper& h, int64_t rows, int64_t cols,
                              float grad_scale = 1.0f) {
  return {grad_scale,
          static_cast<float>(1.0 - h.momentum),
          static_cast<float>(h.momentum),
          h.nesterov,
          static_cast<float>(1.0 - h.lr * h.weight_decay),
          static_cast<float>(-muon_adjusted_lr(h, rows, cols))};
}

// One element's momentum: buf advanced toward the scaled grad and kept as its storage kBuf
// keeps it (rounded to bfloat16, or as it is in float32), and the update direction u
// returned from the kept value, as torch's lerp reads its buffer tensor. (A grad_scale of 1
// leaves every grad as it is: x * 1 is x.)
template <ElemType kBuf = ElemType::f32>
SA_HD float muon_momentum(const MuonCoeffs& c, float grad, float& buf) {
  const float g = grad * c.grad_scale;
  buf = Codec<kBuf>::decode(Codec<kBuf>::encode(fmaf(c.one_minus_momentum, g - buf, buf)));
  return c.nesterov ? fmaf(c.momentum, buf - g, g) : buf;
}

// One element's param update from its orthogonalized direction o.
SA_HD float muon_apply(const MuonCoeffs& c, float p, float o) {
  return fmaf(c.neg_lr, o, p * c.decay_factor);
}

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_MUON_MATH_H_
