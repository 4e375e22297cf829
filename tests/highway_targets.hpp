// tests/highway_targets.hpp — running the CPU kernel on each of Highway's targets in turn,
// for the tests that compare its SIMD paths with its scalar one.
#ifndef SHARDADAM_TESTS_HIGHWAY_TARGETS_HPP_
#define SHARDADAM_TESTS_HIGHWAY_TARGETS_HPP_

#include <hwy/targets.h>
#include <stdint.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../kernels/cpu/adam_cpu.h"

namespace sa_test {

// Restricts Highway's dispatch to one target for the lifetime of the guard.
struct OnlyTarget {
  explicit OnlyTarget(int64_t target) { hwy::SetSupportedTargetsForTest(target); }
  ~OnlyTarget() { hwy::SetSupportedTargetsForTest(0); }
  OnlyTarget(const OnlyTarget&) = delete;
  OnlyTarget& operator=(const OnlyTarget&) = delete;
};

// One Highway target per distinct path of the kernel on this CPU: every target it supports
// with a fused multiply-add, and one without (they all run the scalar path).
inline std::vector<int64_t> kernel_targets() {
  std::vector<int64_t> targets;
  std::vector<std::string> names;
  for (int64_t rest = hwy::SupportedTargets(); rest != 0; rest &= rest - 1) {
    const int64_t target = rest & -rest;
    const OnlyTarget only(target);
    const std::string name = sa::kernels::adam_cpu_simd_target();
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(name);
      targets.push_back(target);
    }
  }
  return targets;
}

}  // namespace sa_test

#endif  // SHARDADAM_TESTS_HIGHWAY_TARGETS_HPP_
