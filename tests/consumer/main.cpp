// The consumer's C++ program: the installed shardadam.hpp compiles under strict warnings,
// steps a param, and reports a bad call as shardadam::Error.
#include <cstdio>
#include <shardadam/shardadam.hpp>
#include <vector>

int main() {
  try {
    if (shardadam::version() != SA_VERSION_NUMBER) {
      std::fprintf(stderr, "consumer_cpp: library version %d != header version %d\n",
                   shardadam::version(), SA_VERSION_NUMBER);
      return 1;
    }
    std::vector<float> param = {1.0f, -1.0f, 0.5f};
    const std::vector<float> before = param;
    const std::vector<float> grad = {0.5f, -0.5f, 0.5f};
    int64_t shape[1] = {3};
    DLManagedTensorVersioned shard{};
    shard.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    shard.dl_tensor = {param.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};

    shardadam::Optimizer opt;
    const int32_t group = opt.add_group(shardadam::default_group_config());
    const int64_t w = opt.add_param("w", group, &shard);
    const DLTensor grad_tensor = {const_cast<float*>(grad.data()), {kDLCPU, 0}, 1, {kDLFloat, 32, 1},
                                  shape, nullptr, 0};
    opt.set_grads(std::vector<const DLTensor*>{&grad_tensor});
    opt.step();
    for (std::size_t i = 0; i < param.size(); ++i) {
      if ((param[i] - before[i]) * grad[i] >= 0.0f) {
        std::fprintf(stderr, "consumer_cpp: param[%zu] went from %g to %g with grad %g\n", i,
                     before[i], param[i], grad[i]);
        return 1;
      }
    }
    try {
      opt.state_view(w, "no_such_state");
      std::fprintf(stderr, "consumer_cpp: a bad state key did not throw\n");
      return 1;
    } catch (const shardadam::Error& e) {
      if (e.status() != SA_ERR_INVALID_ARGUMENT) {
        std::fprintf(stderr, "consumer_cpp: unexpected error %s\n", e.what());
        return 1;
      }
    }
    std::printf("consumer_cpp: one step OK, step count %lld\n",
                static_cast<long long>(opt.step_count(group)));
    return 0;
  } catch (const shardadam::Error& e) {
    std::fprintf(stderr, "consumer_cpp: %s\n", e.what());
    return 1;
  }
}
