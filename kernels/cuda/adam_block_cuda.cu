// kernels/cuda/adam_block_cuda.cu — launch_adam_bucket_blocks: sends a block-moment launch to
// the part of the build that instantiates its Variant (adam_block_parts.cuh). The kernel is
// adam_block_kernel.cuh.
#include <cuda_runtime.h>

#include <array>
#include <utility>

#include "adam_block_parts.cuh"
#include "adam_cuda.cuh"

namespace sa {
namespace kernels {
namespace {

// Every supported Variant with block moments has a rank of its own in 0..n-1 and no other
// Variant has one, so the parts' instantiations and this dispatch agree on one numbering.
constexpr bool block_ranks_number_the_block_variants() {
  int count = 0;
  bool seen[256] = {};
  for (const ParamForm& form : kParamForms)
    for (const ElemType grad : kGradTypes)
      for (const ElemType moment : kMomentTypes)
        for (const bool amsgrad : {false, true}) {
          const Variant v{form.param, grad, moment, form.master, amsgrad, form.scaling};
          const int rank = block_variant_rank(v);
          const bool block = is_block_storage(moment) && form.scaling == ParamScaling::none;
          if ((rank >= 0) != block || rank >= 256 || (rank >= 0 && seen[rank])) return false;
          if (rank >= 0) {
            seen[rank] = true;
            ++count;
          }
        }
  for (int r = 0; r < count; ++r)
    if (!seen[r]) return false;
  return count > 0;
}
static_assert(block_ranks_number_the_block_variants(), "block_variant_rank is not a numbering");

using PartLaunch = cudaError_t (*)(const Variant&, const DeviceBucket&, const DeviceStep&,
                                   cudaStream_t);

template <int... kPart>
constexpr auto part_launches(std::integer_sequence<int, kPart...>) {
  return std::array<PartLaunch, sizeof...(kPart)>{&launch_adam_bucket_blocks_part<kPart>...};
}

constexpr auto kPartLaunches = part_launches(std::make_integer_sequence<int, kBlockKernelParts>{});

}  // namespace

cudaError_t launch_adam_bucket_blocks(const Variant& v, const DeviceBucket& b, const DeviceStep& s,
                                      cudaStream_t st) {
  const int part = block_kernel_part(v);
  if (part < 0) return cudaErrorInvalidValue;  // the core never builds a Variant not in the table
  return kPartLaunches[static_cast<size_t>(part)](v, b, s, st);
}

}  // namespace kernels
}  // namespace sa
