// tests/gpu/twin.hpp — a CPU optimizer and a CUDA optimizer over the same shards, stepped
// with the same grads, and the variants and shard sizes the GPU tests run them with.
#ifndef SHARDADAM_TESTS_GPU_TWIN_HPP_
#define SHARDADAM_TESTS_GPU_TWIN_HPP_

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda_test_support.hpp"
#include "test_support.hpp"

namespace sa_test {

struct VariantSpec {
  const char* label;
  DLDataType param;
  DLDataType grad;
  DLDataType moment;
  int32_t master;
  bool amsgrad;
};

// A CPU optimizer and a CUDA optimizer over the same shards, stepped with the same
// grads; the shards' params and every state are compared bit for bit.
struct Twin {
  explicit Twin(GpuState state = GpuState::device) : gpu_state(state) {}

  GpuState gpu_state;
  OptimizerPtr cpu = make_optimizer(2, 1);
  OptimizerPtr gpu = make_optimizer();
  std::vector<std::unique_ptr<HostTensor>> host_params, host_grads_a, host_grads_b;
  std::vector<std::unique_ptr<DeviceTensor>> dev_params, dev_grads_a, dev_grads_b;
  std::vector<std::string> names;
  std::vector<std::string> state_keys;
  DeviceFloat dev_scale, dev_found_inf;

  ~Twin() {  // optimizers go first: they hold the tensors
    cpu.reset();
    gpu.reset();
  }

  void add_groups(bool amsgrad) {
    sa_group_config adamw = group_config(2e-3, 1e-2, 1);
    sa_group_config adam_l2 = group_config(1e-3, 1e-1, 0);
    adam_l2.maximize = 1;
    adam_l2.beta1 = 0.8;
    adamw.amsgrad = adam_l2.amsgrad = amsgrad ? 1 : 0;
    for (auto* opt : {cpu.get(), gpu.get()}) {
      REQUIRE_SA_OK(opt, sa_optimizer_add_group(opt, &adamw, nullptr));
      REQUIRE_SA_OK(opt, sa_optimizer_add_group(opt, &adam_l2, nullptr));
    }
  }

  void add(const std::string& name, int32_t group, const VariantSpec& v, std::vector<int64_t> shape,
           int64_t offset_elems, Rng& rng) {
    host_params.push_back(std::make_unique<HostTensor>(shape, v.param));
    fill_normal(*host_params.back(), rng, 1.0);
    dev_params.push_back(std::make_unique<DeviceTensor>(shape, v.param, offset_elems));
    dev_params.back()->upload(*host_params.back());
    for (auto* grads : {&host_grads_a, &host_grads_b})
      grads->push_back(std::make_unique<HostTensor>(shape, v.grad));
    dev_grads_a.push_back(std::make_unique<DeviceTensor>(shape, v.grad, offset_elems));
    dev_grads_b.push_back(std::make_unique<DeviceTensor>(shape, v.grad, (offset_elems + 3) % 8));
    const sa_param_options options = param_options(v.grad, v.moment, v.master);
    sa_param_options gpu_options = options;
    gpu_options.state_placement = placement_of(gpu_state, names.size());
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_param(cpu.get(), name.c_str(), group,
                                                    host_params.back()->versioned(), nullptr,
                                                    &options, nullptr));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_add_param(gpu.get(), name.c_str(), group,
                                                    dev_params.back()->versioned(), nullptr,
                                                    &gpu_options, nullptr));
    names.push_back(name);
  }

  // New random grads into set A or B (alternating sets exercises grad rebinding).
  void bind_new_grads(Rng& rng, bool use_b, bool through_ptrs) {
    auto& hg = use_b ? host_grads_b : host_grads_a;
    auto& dg = use_b ? dev_grads_b : dev_grads_a;
    std::vector<const void*> cpu_ptrs, gpu_ptrs;
    for (std::size_t i = 0; i < hg.size(); ++i) {
      fill_log_uniform(*hg[i], rng, 1e-4, 3.0);
      dg[i]->upload(*hg[i]);
      cpu_ptrs.push_back(hg[i]->numel() ? hg[i]->data() : nullptr);
      gpu_ptrs.push_back(dg[i]->numel() ? dg[i]->data() : nullptr);
      if (!through_ptrs) {
        const DLTensor h = hg[i]->dl(), d = dg[i]->dl();
        REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_grad(cpu.get(), static_cast<int64_t>(i), &h));
        REQUIRE_SA_OK(gpu.get(), sa_optimizer_set_grad(gpu.get(), static_cast<int64_t>(i), &d));
      }
    }
    if (through_ptrs) {
      const auto n = static_cast<int64_t>(hg.size());
      REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_grad_ptrs(cpu.get(), n, cpu_ptrs.data()));
      REQUIRE_SA_OK(gpu.get(), sa_optimizer_set_grad_ptrs(gpu.get(), n, gpu_ptrs.data()));
    }
  }

  void step_both(float inv_scale, float found_inf, cudaStream_t stream) {
    dev_scale.set(inv_scale);
    dev_found_inf.set(found_inf);
    sa_step_args cpu_args = SA_STEP_ARGS_INIT, gpu_args = SA_STEP_ARGS_INIT;
    cpu_args.inv_grad_scale = &inv_scale;
    cpu_args.found_inf = &found_inf;
    gpu_args.inv_grad_scale = dev_scale.get();
    gpu_args.found_inf = dev_found_inf.get();
    int32_t cpu_skipped = -1, gpu_skipped = -1;
    cpu_args.skipped = &cpu_skipped;
    gpu_args.skipped = &gpu_skipped;
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_step(cpu.get(), &cpu_args, nullptr));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_step(gpu.get(), &gpu_args, stream));
    CHECK(cpu_skipped == (found_inf != 0.0f ? 1 : 0));
    CHECK(gpu_skipped == cpu_skipped);
  }

  // One clipped step on both (no found_inf, no loss scale). Returns {cpu norm, gpu norm};
  // checks that the device copy of the norm is the host one rounded to float.
  std::pair<double, double> step_both_clipped(double max_norm, int32_t norm_type,
                                              cudaStream_t stream) {
    DeviceFloat dev_norm;
    dev_norm.set(-1.0f);
    float cpu_norm_f = -1.0f;
    double cpu_norm = -1.0, gpu_norm = -1.0;
    sa_step_args cpu_args = SA_STEP_ARGS_INIT, gpu_args = SA_STEP_ARGS_INIT;
    for (sa_step_args* a : {&cpu_args, &gpu_args}) {
      a->max_grad_norm = max_norm;
      a->norm_type = norm_type;
    }
    cpu_args.grad_norm = &cpu_norm_f;
    cpu_args.host_grad_norm = &cpu_norm;
    gpu_args.grad_norm = const_cast<float*>(dev_norm.get());
    gpu_args.host_grad_norm = &gpu_norm;
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_step(cpu.get(), &cpu_args, nullptr));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_step(gpu.get(), &gpu_args, stream));
    float gpu_norm_f = 0.0f;
    CUDA_OK(cudaMemcpy(&gpu_norm_f, dev_norm.get(), sizeof gpu_norm_f, cudaMemcpyDeviceToHost));
    CHECK(gpu_norm_f == static_cast<float>(gpu_norm));
    CHECK(cpu_norm_f == static_cast<float>(cpu_norm));
    return {cpu_norm, gpu_norm};
  }

  // Every param's values (the fp32 master where there is one) within `ulps` float32 ulps
  // of the CPU's. For steps whose grad multipliers may differ in the last bit (the norm
  // is summed in another order on each backend).
  void require_close(double ulps) {
    CUDA_OK(cudaDeviceSynchronize());
    for (std::size_t i = 0; i < names.size(); ++i) {
      INFO("param '" << names[i] << "'");
      sa_param_info info = SA_PARAM_INFO_INIT;
      REQUIRE_SA_OK(cpu.get(), sa_optimizer_param_info(cpu.get(), static_cast<int64_t>(i), &info));
      const int64_t n = host_params[i]->numel();
      std::vector<double> want(static_cast<std::size_t>(n)), got(static_cast<std::size_t>(n));
      if (info.master == SA_MASTER_FP32) {
        const StateView c = state_view(cpu.get(), static_cast<int64_t>(i), "master");
        const StateView d = state_view(gpu.get(), static_cast<int64_t>(i), "master");
        const auto bytes = download_view(d);
        for (int64_t k = 0; k < n; ++k) {
          float f;
          std::memcpy(&f, bytes.data() + 4 * k, 4);
          want[static_cast<std::size_t>(k)] = c.get(k);
          got[static_cast<std::size_t>(k)] = f;
        }
      } else {
        HostTensor copy(host_params[i]->shape(), host_params[i]->dtype());
        const auto bytes = dev_params[i]->download();
        if (!bytes.empty()) std::memcpy(copy.data(), bytes.data(), bytes.size());
        for (int64_t k = 0; k < n; ++k) {
          want[static_cast<std::size_t>(k)] = host_params[i]->get(k);
          got[static_cast<std::size_t>(k)] = copy.get(k);
        }
      }
      const bool f32_value =
          info.master == SA_MASTER_FP32 || same_dtype(host_params[i]->dtype(), kFloat32);
      Worst worst("cuda vs cpu");
      for (int64_t k = 0; k < n; ++k) {
        const double w = want[static_cast<std::size_t>(k)];
        const double unit =
            f32_value ? f32_ulp(w)
                      : ulp_at(std::fabs(w),
                               same_dtype(host_params[i]->dtype(), kBfloat16) ? 8 : 11, -14);
        worst.add(k, got[static_cast<std::size_t>(k)], w, ulps * unit);
      }
      INFO(worst.describe());
      CHECK(worst.ok());
    }
  }

  void require_identical() {
    CUDA_OK(cudaDeviceSynchronize());
    for (std::size_t i = 0; i < names.size(); ++i) {
      INFO("param '" << names[i] << "' (" << host_params[i]->numel() << " elements)");
      CHECK(dev_params[i]->download() == host_params[i]->raw_bytes());
      sa_param_info info = SA_PARAM_INFO_INIT;
      REQUIRE_SA_OK(cpu.get(), sa_optimizer_param_info(cpu.get(), static_cast<int64_t>(i), &info));
      // Every state the param has, as the library lists them.
      const char* key_list[16] = {};
      int32_t num_keys = 0;
      REQUIRE_SA_OK(cpu.get(), sa_optimizer_state_keys(cpu.get(), static_cast<int64_t>(i), key_list,
                                                       16, &num_keys));
      REQUIRE(num_keys >= 2);
      sa_param_info gpu_info = SA_PARAM_INFO_INIT;
      REQUIRE_SA_OK(gpu.get(),
                    sa_optimizer_param_info(gpu.get(), static_cast<int64_t>(i), &gpu_info));
      CHECK(gpu_info.state_placement == placement_of(gpu_state, i));
      for (const char* key : std::vector<const char*>(key_list, key_list + num_keys)) {
        INFO("state " << key);
        const StateView c = state_view(cpu.get(), static_cast<int64_t>(i), key);
        const StateView d = state_view(gpu.get(), static_cast<int64_t>(i), key);
        CHECK(d.view->dl_tensor.device.device_type ==
              (placement_of(gpu_state, i) != SA_STATE_ON_DEVICE ? kDLCPU : kDLCUDA));
        CHECK(download_view(d) == c.raw_bytes());
      }
    }
    for (int32_t g = 0; g < sa_optimizer_num_groups(cpu.get()); ++g)
      CHECK(step_count(gpu.get(), g) == step_count(cpu.get(), g));
    const auto n = static_cast<int64_t>(names.size());
    std::vector<int64_t> cpu_steps(names.size(), -1), gpu_steps(names.size(), -2);
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_get_param_steps(cpu.get(), 0, n, cpu_steps.data()));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_get_param_steps(gpu.get(), 0, n, gpu_steps.data()));
    CHECK(gpu_steps == cpu_steps);
  }

  // This Twin's CUDA params and every state bit for bit those of `other`'s, which holds the
  // same params (its state perhaps placed elsewhere), and the same step counts.
  void require_gpu_identical(const Twin& other) {
    CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(other.names == names);
    for (std::size_t i = 0; i < names.size(); ++i) {
      INFO("param '" << names[i] << "'");
      CHECK(dev_params[i]->download() == other.dev_params[i]->download());
      const char* key_list[16] = {};
      int32_t num_keys = 0;
      REQUIRE_SA_OK(gpu.get(), sa_optimizer_state_keys(gpu.get(), static_cast<int64_t>(i), key_list,
                                                       16, &num_keys));
      for (const char* key : std::vector<const char*>(key_list, key_list + num_keys)) {
        INFO("state " << key);
        CHECK(download_view(state_view(gpu.get(), static_cast<int64_t>(i), key)) ==
              download_view(state_view(other.gpu.get(), static_cast<int64_t>(i), key)));
      }
    }
    const auto n = static_cast<int64_t>(names.size());
    std::vector<int64_t> mine(names.size(), -1), theirs(names.size(), -2);
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_get_param_steps(gpu.get(), 0, n, mine.data()));
    REQUIRE_SA_OK(other.gpu.get(),
                  sa_optimizer_get_param_steps(other.gpu.get(), 0, n, theirs.data()));
    CHECK(mine == theirs);
  }

  // New random grads into set A or B for the params where present[i], bound with the
  // checked bulk call; the others get "no grad".
  void bind_some_grads(Rng& rng, bool use_b, const std::vector<bool>& present) {
    auto& hg = use_b ? host_grads_b : host_grads_a;
    auto& dg = use_b ? dev_grads_b : dev_grads_a;
    std::vector<DLTensor> h(hg.size()), d(hg.size());
    std::vector<const DLTensor*> cpu_list(hg.size(), nullptr), gpu_list(hg.size(), nullptr);
    for (std::size_t i = 0; i < hg.size(); ++i) {
      if (!present[i]) continue;
      fill_log_uniform(*hg[i], rng, 1e-4, 3.0);
      dg[i]->upload(*hg[i]);
      h[i] = hg[i]->dl();
      d[i] = dg[i]->dl();
      cpu_list[i] = &h[i];
      gpu_list[i] = &d[i];
    }
    const auto n = static_cast<int64_t>(hg.size());
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_grads(cpu.get(), n, cpu_list.data()));
    REQUIRE_SA_OK(gpu.get(), sa_optimizer_set_grads(gpu.get(), n, gpu_list.data()));
  }
};

// Log-uniform shard sizes 2^0..2^17 with empty shards in the middle and at the end.
inline std::vector<int64_t> shard_sizes(Rng& rng, int count) {
  std::vector<int64_t> sizes;
  for (int i = 0; i < count; ++i)
    sizes.push_back(static_cast<int64_t>(std::exp2(rng.uniform(0.0, 17.0))));
  sizes[count / 3] = 0;
  sizes.push_back(0);
  sizes.push_back(0);  // trailing empties
  return sizes;
}

inline const VariantSpec kVariants[] = {
    {"fp32", kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, false},
    {"fp32 amsgrad, bf16 moments", kFloat32, kFloat32, kBfloat16, SA_MASTER_NONE, true},
    {"fp32 params, bf16 grads", kFloat32, kBfloat16, kFloat32, SA_MASTER_NONE, false},
    {"bf16 + fp32 master", kBfloat16, kBfloat16, kFloat32, SA_MASTER_FP32, false},
    {"bf16 + fp32 master, bf16 moments, fp32 grads", kBfloat16, kFloat32, kBfloat16, SA_MASTER_FP32,
     false},
    {"bf16 + int16 remainder", kBfloat16, kBfloat16, kFloat32, SA_MASTER_REMAINDER, false},
    {"bf16 + remainder, amsgrad, f16 grads", kBfloat16, kFloat16, kFloat32, SA_MASTER_REMAINDER,
     true},
    {"f16 + fp32 master, amsgrad", kFloat16, kFloat16, kFloat32, SA_MASTER_FP32, true},
    {"f16 + fp32 master, bf16 moments", kFloat16, kFloat32, kBfloat16, SA_MASTER_FP32, false},
    {"fp32, 8-bit moments", kFloat32, kFloat32, kUint8, SA_MASTER_NONE, false},
    {"bf16 + fp32 master, 8-bit moments, amsgrad", kBfloat16, kBfloat16, kUint8, SA_MASTER_FP32,
     true},
    {"bf16 + remainder, 8-bit moments, f16 grads", kBfloat16, kFloat16, kUint8, SA_MASTER_REMAINDER,
     false},
    {"fp32, float8 moments", kFloat32, kFloat32, kFloat8E4m3fn, SA_MASTER_NONE, false},
    {"bf16 + fp32 master, float8 moments, amsgrad", kBfloat16, kBfloat16, kFloat8E4m3fn,
     SA_MASTER_FP32, true},
};

}  // namespace sa_test

#endif  // SHARDADAM_TESTS_GPU_TWIN_HPP_
