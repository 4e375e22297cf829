// kernels/muon_slot.h — Muon's per-element steps (kernels/muon_math.h) on a slot's storage,
// for each Muon Variant (kernels/variants.h's Muon tables): the grad and momentum_buffer
// decoded to float32 and the buffer kept in its dtype; the update applied to a float32 param,
// or to a 16-bit param's float32 master with the param rounded from it. The CPU kernels and
// the CUDA kernels' element-at-a-time paths both step through these; the CUDA kernels' vector
// paths do the same arithmetic on the same values.
#ifndef SHARDADAM_KERNELS_MUON_SLOT_H_
#define SHARDADAM_KERNELS_MUON_SLOT_H_

#include <stdint.h>

#include "muon_math.h"
#include "variants.h"

namespace sa {
namespace kernels {

// A Muon slot's typed pointers (Signature S of visit_muon_variant): the param, its master
// (S::kMaster fp32; else unused), the grad and the momentum_buffer.
template <class S>
struct MuonSlot {
  StorageOf<S::kParam>* param;
  float* master;
  const StorageOf<S::kGrad>* grad;
  StorageOf<S::kMoment>* buf;

  SA_HD explicit MuonSlot(const TensorSlot& s)
      : param(static_cast<StorageOf<S::kParam>*>(s.param)),
        master(static_cast<float*>(s.state[static_cast<size_t>(StateKind::master)])),
        grad(static_cast<const StorageOf<S::kGrad>*>(s.grad)),
        buf(static_cast<StorageOf<S::kMoment>*>(
            s.state[static_cast<size_t>(StateKind::momentum_buffer)])) {}

  // Element i's momentum: its buffer advanced and kept, its direction returned.
  SA_HD float momentum(const MuonCoeffs& c, int64_t i) const {
    float b = Codec<S::kMoment>::decode(buf[i]);
    const float u = muon_momentum<S::kMoment>(c, Codec<S::kGrad>::decode(grad[i]), b);
    buf[i] = Codec<S::kMoment>::encode(b);
    return u;
  }

  // Element i's update from its orthogonalized direction o.
  SA_HD void apply(const MuonCoeffs& c, int64_t i, float o) const {
    if constexpr (S::kMaster == MasterKind::fp32) {
      const float m = muon_apply(c, master[i], o);
      master[i] = m;
      param[i] = Codec<S::kParam>::encode(m);
    } else {
      param[i] = Codec<S::kParam>::encode(muon_apply(c, Codec<S::kParam>::decode(param[i]), o));
    }
  }
};

}  // namespace kernels
}  // namespace sa

#endif  // SHARDADAM_KERNELS_MUON_SLOT_H_
