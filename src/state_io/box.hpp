// src/state_io/box.hpp — boxes [offset, offset + shape) of a global tensor, and whether a
// set of them covers a target box exactly once: the geometry of resharding.
#ifndef SHARDADAM_SRC_STATE_IO_BOX_HPP_
#define SHARDADAM_SRC_STATE_IO_BOX_HPP_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "../layout.hpp"

namespace sa {

struct Box {
  Dims offset;
  Dims shape;
};

// Elements in the box; false if that overflows int64.
bool box_volume(const Box& box, int64_t& volume);

// The intersection of two boxes of the same rank; false when it holds no element.
bool intersect(const Box& a, const Box& b, Box& out);

// "offset [a, b] shape [c, d]"
std::string describe_box(const Box& box);

// How `parts` (boxes inside `target`) cover it.
struct Coverage {
  bool exact = false;
  // Set when two parts overlap: their indices.
  bool overlap = false;
  std::size_t first = 0, second = 0;
  // When neither exact nor overlapping: the elements covered, and one element no part
  // covers (empty when finding one would cost too much).
  int64_t covered = 0;
  Dims gap;
};

// Parts holding no element are ignored. Pairwise disjointness is checked with a sweep
// along the dim where the parts' offsets are most spread, so the usual layouts (slabs
// along one dim, grids) cost about n log n, not n^2.
Coverage check_coverage(const Box& target, const std::vector<Box>& parts);

// What is wrong with a coverage that is not exact, for a message: which parts overlap
// (`name(i)` describes part i) or which element no part covers ("is in no <part>").
std::string describe_coverage_problem(const Coverage& c, const std::vector<Box>& parts,
                                      const Box& target,
                                      const std::function<std::string(std::size_t)>& name,
                                      const char* part = "saved box");

// How the saved boxes of one global tensor (a param and state key, over a whole set of
// files) tile it: each element in exactly one box, and every box of the same global shape.
struct Tiling {
  enum class Kind { exact, gap, overlap, shape_mismatch };
  Kind kind = Kind::exact;
  // "covered exactly once", or what is wrong: the two overlapping boxes and who holds
  // them, an element in no box, or the two global shapes that differ.
  std::string detail;
};

// `boxes[i]` is a box of a global tensor of shape `global_shapes[i]`, held by `holder(i)`
// (e.g. "blob 2 ('rank2.safetensors')"). The one tiling check: sa_inspect reports it,
// sa_optimizer_import refuses what is not exact.
Tiling check_tiling(const std::vector<Box>& boxes, const std::vector<Dims>& global_shapes,
                    const std::function<std::string(std::size_t)>& holder);

// "exact", "gap", "overlap", "shape mismatch": the report's spelling.
const char* tiling_kind_name(Tiling::Kind kind);

}  // namespace sa

#endif  // SHARDADAM_SRC_STATE_IO_BOX_HPP_
