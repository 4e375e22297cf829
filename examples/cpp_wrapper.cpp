// cpp_wrapper.cpp — shardadam from C++ through the RAII wrapper (shardadam.hpp).
//
// Fits a bfloat16 param to a target with AdamW. The optimizer keeps an fp32 master copy
// (SA_MASTER_AUTO picks it for bfloat16 params): the bfloat16 param is the master's
// rounding, so the master can get closer to the target than bfloat16 can represent.
// Shows a state view (the master) and how a bad call surfaces: a shardadam::Error with
// the status and the library's message, after which the optimizer is unchanged.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "shardadam/shardadam.hpp"

namespace {

// bfloat16 is the top half of a float32; round to nearest even (no NaNs occur here).
uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

DLManagedTensorVersioned wrap(void* data, int64_t* shape, DLDataType dtype) {
  DLManagedTensorVersioned t{};
  t.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  t.dl_tensor.data = data;
  t.dl_tensor.device = {kDLCPU, 0};
  t.dl_tensor.ndim = 1;
  t.dl_tensor.dtype = dtype;
  t.dl_tensor.shape = shape;
  return t;
}

// 0.5 * mean squared distance to the target.
template <class Get>
double loss_of(const std::vector<float>& target, Get value) {
  double sum = 0.0;
  for (std::size_t i = 0; i < target.size(); ++i) {
    const double d = static_cast<double>(value(i)) - target[i];
    sum += 0.5 * d * d;
  }
  return sum / static_cast<double>(target.size());
}

}  // namespace

int main() {
  constexpr int64_t kSize = 1000;
  constexpr int kSteps = 300;
  const DLDataType bf16{kDLBfloat, 16, 1};
  const DLDataType f32{kDLFloat, 32, 1};

  std::vector<float> target(kSize);
  std::vector<uint16_t> param(kSize);  // the bfloat16 param; the optimizer updates it in place
  std::vector<uint16_t> grad(kSize);   // bfloat16 grads (the default grad dtype is the param's)
  for (int64_t i = 0; i < kSize; ++i) {
    target[i] = std::sin(0.37f * static_cast<float>(i)) * 0.75f;
    param[i] = to_bf16(0.0f);
  }
  int64_t shape[1] = {kSize};
  DLManagedTensorVersioned shard = wrap(param.data(), shape, bf16);

  try {
    std::printf("%s\n", shardadam::build_info());
    shardadam::Optimizer opt;
    sa_group_config config = shardadam::default_group_config();
    config.lr = 0.02;
    config.weight_decay = 0.0;
    const int32_t group = opt.add_group(config);
    const int64_t w = opt.add_param("fit.w", group, &shard);
    const sa_param_info info = opt.param_info(w);
    std::printf("param '%s': %lld elements, master %s\n", info.name,
                static_cast<long long>(info.numel),
                info.master == SA_MASTER_FP32 ? "fp32" : "other");

    // A deliberate mistake: a float32 grad for a param registered with bfloat16 grads.
    std::vector<float> wrong(kSize, 0.0f);
    DLManagedTensorVersioned wrong_grad = wrap(wrong.data(), shape, f32);
    try {
      opt.set_grad(w, wrong_grad.dl_tensor);
      std::fprintf(stderr, "cpp_wrapper: a float32 grad for a bfloat16 param was accepted\n");
      return 1;
    } catch (const shardadam::Error& e) {
      std::printf("caught as expected: %s\n", e.what());
    }

    // The grad buffer is stable: bind it once, refill it every step.
    DLManagedTensorVersioned grad_tensor = wrap(grad.data(), shape, bf16);
    opt.set_grad(w, grad_tensor.dl_tensor);

    const double first_loss = loss_of(target, [&](std::size_t i) { return from_bf16(param[i]); });
    double loss = first_loss;
    for (int step = 1; step <= kSteps; ++step) {
      for (int64_t i = 0; i < kSize; ++i) grad[i] = to_bf16(from_bf16(param[i]) - target[i]);
      opt.set_lr(group, step <= kSteps / 2 ? 0.02 : 0.002);
      opt.step();
      if (step % 50 == 0) {
        loss = loss_of(target, [&](std::size_t i) { return from_bf16(param[i]); });
        std::printf("step %3d  loss(bf16 param) %.3e\n", step, loss);
      }
    }

    // The fp32 master, zero-copy: closer to the target than its bfloat16 rounding.
    const shardadam::StateView master = opt.state_view(w, "master");
    const float* m = master.data<float>();
    const double master_loss = loss_of(target, [&](std::size_t i) { return m[i]; });
    std::printf("after %lld steps: loss(bf16 param) %.3e, loss(fp32 master) %.3e\n",
                static_cast<long long>(opt.step_count(group)), loss, master_loss);
    if (!(loss < 0.01 * first_loss)) {
      std::fprintf(stderr, "cpp_wrapper: the loss did not fall below 1%% of %.3e\n", first_loss);
      return 1;
    }
    return 0;
  } catch (const shardadam::Error& e) {
    std::fprintf(stderr, "cpp_wrapper: %s\n", e.what());
    return 1;
  }
}
