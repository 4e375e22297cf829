// tests/test_trio.hpp — three float32 params ("emb" [5, 4], "w" [7], "b" [3]) of one AdamW
// group with a grad buffer each, and one step checked against the float64 reference: the
// data of the grad-binding and step-count tests of the C ABI (test_grad_presence.cpp) and
// of the C++ wrapper (test_cpp_wrapper_grads.cpp). The optimizer is the test's; it holds
// the three as params 0, 1, 2 (the tensors must outlive it: declare a Trio first).
#ifndef SHARDADAM_TESTS_TEST_TRIO_HPP_
#define SHARDADAM_TESTS_TEST_TRIO_HPP_

#include <vector>

#include "test_support.hpp"

namespace sa_test {

struct TrioTensors {
  static constexpr const char* kNames[3] = {"emb", "w", "b"};
  sa_group_config config = group_config(1e-2, 1e-2, 1);
  HostTensor emb{{5, 4}, kFloat32}, w{{7}, kFloat32}, b{{3}, kFloat32};
  HostTensor g_emb{{5, 4}, kFloat32}, g_w{{7}, kFloat32}, g_b{{3}, kFloat32};
  Rng rng;

  explicit TrioTensors(uint64_t seed) : rng(seed) {
    for (int i = 0; i < 3; ++i) fill_normal(param(i), rng, 1.0);
  }
  HostTensor& param(int i) { return i == 0 ? emb : i == 1 ? w : b; }
  HostTensor& grad(int i) { return i == 0 ? g_emb : i == 1 ? g_w : g_b; }
  void fresh_grads() {
    for (int i = 0; i < 3; ++i) fill_normal(grad(i), rng, 0.1);
  }

  // Param i's reference state, from the library's current param and moments.
  RefState state_of(sa_optimizer* opt, int i) {
    RefState s(values_of(param(i)), Storage::f32);
    const StateView m = state_view(opt, i, "exp_avg");
    const StateView v = state_view(opt, i, "exp_avg_sq");
    for (int64_t k = 0; k < param(i).numel(); ++k) {
      s.m[k] = m.get(k);
      s.v[k] = v.get(k);
    }
    return s;
  }

  // Param i and its moments as bytes: an untouched param is so bit for bit.
  std::vector<unsigned char> bytes_of(sa_optimizer* opt, int i) {
    std::vector<unsigned char> out = param(i).raw_bytes();
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      const std::vector<unsigned char> s = state_view(opt, i, key).raw_bytes();
      out.insert(out.end(), s.begin(), s.end());
    }
    return out;
  }

  // One step by `step()`, checked against the float64 reference: params with present[i]
  // step at count steps[i] + 1 from the grads now in their buffers, the others stay bit
  // for bit.
  template <class Step>
  void step_and_check(sa_optimizer* opt, const bool present[3], const std::vector<int64_t>& steps, Step&& step) {
    std::vector<RefState> refs;
    std::vector<RefScales> scales(3);
    std::vector<std::vector<unsigned char>> before;
    for (int i = 0; i < 3; ++i) {
      refs.push_back(state_of(opt, i));
      before.push_back(bytes_of(opt, i));
      if (present[i])
        reference_step(refs[i], config, steps[i] + 1, values_of(grad(i)), 1.0, RefBug::none, &scales[i]);
    }
    step();
    for (int i = 0; i < 3; ++i) {
      INFO("param " << i);
      if (!present[i]) {
        CHECK(bytes_of(opt, i) == before[i]);
        continue;
      }
      Worst worst("param");
      for (int64_t k = 0; k < param(i).numel(); ++k)
        worst.add(k, param(i).get(k), refs[i].value[k], step_value_tolerance(refs[i].value[k], scales[i].step_size));
      CHECK_WITHIN(worst);
    }
  }
};

}  // namespace sa_test

#endif  // SHARDADAM_TESTS_TEST_TRIO_HPP_
