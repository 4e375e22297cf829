#include "box.hpp"

#include <algorithm>
#include <numeric>
#include <set>

#include "../errors.hpp"

namespace sa {
namespace {

bool overlaps(const Box& a, const Box& b) {
  for (std::size_t d = 0; d < a.offset.size(); ++d)
    if (std::max(a.offset[d], b.offset[d]) >=
        std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]))
      return false;
  return true;
}

bool contains(const Box& box, const Dims& point) {
  for (std::size_t d = 0; d < point.size(); ++d)
    if (point[d] < box.offset[d] || point[d] >= box.offset[d] + box.shape[d]) return false;
  return true;
}

// An element of `target` in no part, searched on the grid of all box boundaries (every
// grid cell is either inside a part or outside all of them). Empty when the grid times the
// parts is too large to search, or when there is no gap.
Dims find_gap(const Box& target, const std::vector<const Box*>& parts) {
  const std::size_t ndim = target.offset.size();
  std::vector<std::vector<int64_t>> cuts(ndim);
  double cells = 1;
  for (std::size_t d = 0; d < ndim; ++d) {
    std::set<int64_t> c = {target.offset[d], target.offset[d] + target.shape[d]};
    for (const Box* p : parts) {
      c.insert(p->offset[d]);
      c.insert(p->offset[d] + p->shape[d]);
    }
    cuts[d].assign(c.begin(), c.end());
    cells *= static_cast<double>(cuts[d].size());
  }
  if (cells * static_cast<double>(parts.size() + 1) > 2e7) return {};
  std::vector<std::size_t> index(ndim, 0);
  Dims point(ndim);
  while (true) {
    bool inside_target = true;
    for (std::size_t d = 0; d < ndim; ++d) {
      point[d] = cuts[d][index[d]];
      inside_target = inside_target && point[d] < target.offset[d] + target.shape[d] &&
                      point[d] >= target.offset[d];
    }
    if (inside_target &&
        std::none_of(parts.begin(), parts.end(), [&](const Box* p) { return contains(*p, point); }))
      return point;
    std::size_t d = ndim;
    while (d > 0) {
      --d;
      if (++index[d] + 1 < cuts[d].size()) break;
      index[d] = 0;
      if (d == 0) return {};
    }
    if (ndim == 0) return {};
  }
}

}  // namespace

bool box_volume(const Box& box, int64_t& volume) {
  int64_t v = 1;
  for (int64_t d : box.shape)
    if (d < 0 || __builtin_mul_overflow(v, d, &v)) return false;
  volume = v;
  return true;
}

bool intersect(const Box& a, const Box& b, Box& out) {
  const std::size_t ndim = a.offset.size();
  out.offset.resize(ndim);
  out.shape.resize(ndim);
  for (std::size_t d = 0; d < ndim; ++d) {
    const int64_t begin = std::max(a.offset[d], b.offset[d]);
    const int64_t end = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (end <= begin) return false;
    out.offset[d] = begin;
    out.shape[d] = end - begin;
  }
  return true;
}

std::string describe_box(const Box& box) {
  return concat("offset ", format_dims(box.offset), " shape ", format_dims(box.shape));
}

Coverage check_coverage(const Box& target, const std::vector<Box>& parts) {
  Coverage c;
  const std::size_t ndim = target.offset.size();
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    int64_t v = 0;
    if (box_volume(parts[i], v) && v > 0) order.push_back(i);
  }

  // The sweep dim: the one along which the parts start at the most distinct offsets.
  std::size_t sweep = 0;
  std::size_t most = 0;
  for (std::size_t d = 0; d < ndim; ++d) {
    std::set<int64_t> starts;
    for (std::size_t i : order) starts.insert(parts[i].offset[d]);
    if (starts.size() > most) {
      most = starts.size();
      sweep = d;
    }
  }
  auto begin_of = [&](std::size_t i) { return ndim == 0 ? 0 : parts[i].offset[sweep]; };
  auto end_of = [&](std::size_t i) {
    return ndim == 0 ? 1 : parts[i].offset[sweep] + parts[i].shape[sweep];
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return begin_of(a) < begin_of(b); });
  std::vector<std::size_t> active;
  for (std::size_t i : order) {
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](std::size_t j) { return end_of(j) <= begin_of(i); }),
                 active.end());
    for (std::size_t j : active) {
      if (overlaps(parts[j], parts[i])) {
        c.overlap = true;
        c.first = std::min(i, j);
        c.second = std::max(i, j);
        return c;
      }
    }
    active.push_back(i);
  }

  // Disjoint parts inside the target: their volumes add up to the target's exactly when
  // they cover it. (Each volume is at most the target's, and so is their sum.)
  int64_t target_volume = 0;
  const bool finite = box_volume(target, target_volume);
  for (std::size_t i : order) {
    int64_t v = 0;
    box_volume(parts[i], v);
    c.covered += v;
  }
  c.exact = finite && c.covered == target_volume;
  if (!c.exact) {
    std::vector<const Box*> nonempty;
    nonempty.reserve(order.size());
    for (std::size_t i : order) nonempty.push_back(&parts[i]);
    c.gap = find_gap(target, nonempty);
  }
  return c;
}

std::string describe_coverage_problem(const Coverage& c, const std::vector<Box>& parts,
                                      const Box& target,
                                      const std::function<std::string(std::size_t)>& name,
                                      const char* part) {
  if (c.exact) return "covered exactly once";
  if (c.overlap) {
    Box both;
    intersect(parts[c.first], parts[c.second], both);
    return concat(name(c.first), " (", describe_box(parts[c.first]), ") and ", name(c.second), " (",
                  describe_box(parts[c.second]), ") both hold the elements at ",
                  describe_box(both));
  }
  int64_t volume = 0;
  const bool finite = box_volume(target, volume);
  std::string text = concat(c.covered, " of ", finite ? std::to_string(volume) : "more than 2^63",
                            " elements are covered");
  if (!c.gap.empty() || target.offset.empty())
    text += concat("; element ", format_dims(c.gap), " is in no ", part);
  return text;
}

Tiling check_tiling(const std::vector<Box>& boxes, const std::vector<Dims>& global_shapes,
                    const std::function<std::string(std::size_t)>& holder) {
  Tiling t;
  if (boxes.empty()) {
    t.kind = Tiling::Kind::gap;
    t.detail = "no file holds a box of it";
    return t;
  }
  const auto differs = std::find_if(global_shapes.begin(), global_shapes.end(),
                                    [&](const Dims& s) { return s != global_shapes[0]; });
  if (differs != global_shapes.end()) {
    const std::size_t i = static_cast<std::size_t>(differs - global_shapes.begin());
    t.kind = Tiling::Kind::shape_mismatch;
    t.detail = concat(holder(0), " says global shape ", format_dims(global_shapes[0]), ", ",
                      holder(i), " says ", format_dims(global_shapes[i]));
    return t;
  }
  const Box global{Dims(global_shapes[0].size(), 0), global_shapes[0]};
  const Coverage c = check_coverage(global, boxes);
  t.kind = c.exact ? Tiling::Kind::exact : c.overlap ? Tiling::Kind::overlap : Tiling::Kind::gap;
  t.detail = describe_coverage_problem(c, boxes, global,
                                       [&](std::size_t i) { return concat(holder(i), "'s box"); });
  return t;
}

const char* tiling_kind_name(Tiling::Kind kind) {
  switch (kind) {
    case Tiling::Kind::exact:
      return "exact";
    case Tiling::Kind::gap:
      return "gap";
    case Tiling::Kind::overlap:
      return "overlap";
    case Tiling::Kind::shape_mismatch:
      return "shape mismatch";
  }
  return "?";
}

}  // namespace sa
