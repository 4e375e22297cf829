// The CUDA block-moment kernel's schedule (kernels/guided.h): the stretches that its thread
// blocks take, in the order they ask, tile a launch's chunks once each, long ones first.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>

#include "kernels/guided.h"

using sa::kernels::guided_stretch;
using sa::kernels::Stretch;

TEST_CASE("guided stretches tile the n chunks in order, then come empty", "[guided]") {
  for (const uint32_t g : {1u, 2u, 7u, 264u, 528u}) {
    for (const uint32_t n : {1u, 2u, 3u, 100u, 263u, 264u, 529u, 1056u, 48750u, 3000017u}) {
      INFO("n " << n << ", g " << g);
      uint32_t u = 0, next = 0, longest_late = 0;
      for (;; ++u) {
        const Stretch s = guided_stretch(u, n, g);
        if (s.first == s.last) break;
        REQUIRE(s.first == next);  // no chunk skipped or taken twice
        REQUIRE(s.last > s.first);
        if (u >= g) longest_late = std::max(longest_late, s.last - s.first);
        next = s.last;
      }
      REQUIRE(next == n);
      // Each round hands out half of what is left, so the first round's g stretches cover
      // about half the chunks, every later stretch is at most a quarter as long as a
      // first-round one, and there are at most g * (log2(n / 2g) + 6) stretches in all.
      const uint32_t first_size = guided_stretch(0, n, g).last;
      if (n >= 4 * g) {
        CHECK(guided_stretch(g - 1, n, g).last * 2 <= n);
        CHECK(guided_stretch(g - 1, n, g).last * 2 + 2 * g >= n);
        CHECK(longest_late * 2 <= first_size + 1);
      }
      CHECK(u <= g * (std::log2(std::max(1.0, n / (2.0 * g))) + 6));
      for (const uint32_t past : {u, u + 1, u + g, u + 1000u}) {
        const Stretch s = guided_stretch(past, n, g);
        CHECK(s.first == n);
        CHECK(s.last == n);
      }
    }
  }
}
