// tests/test_ranks.hpp — simulated ranks for the sharding and resharding tests: boxes of a
// row-major global array, copies between a global array and a box of it, and scenarios
// that say where each rank of a mesh (or of explicit boxes) holds a param.
#ifndef SHARDADAM_TESTS_TEST_RANKS_HPP_
#define SHARDADAM_TESTS_TEST_RANKS_HPP_

#include <functional>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace sa_test {

using Dims = std::vector<int64_t>;

// A global param of a sharding scenario: its full shape and storage choices.
struct GlobalParam {
  std::string name;
  Dims shape;
  DLDataType dtype;
  DLDataType grad_dtype;
  DLDataType moment_dtype;
  int32_t master;
  int32_t group;
};

struct Box {
  Dims offset;
  Dims shape;
};

inline int64_t numel_of(const Dims& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Copies box `box` of a row-major global array of `global_shape` into a contiguous local
// array (to_local), or back (!to_local). Any rank; one memcpy per row of the last dim.
inline void copy_box(const void* from, void* to, const Dims& global_shape, const Box& box,
                     std::size_t elem, bool to_local) {
  const std::size_t ndim = global_shape.size();
  if (numel_of(box.shape) == 0) return;
  const auto* src = static_cast<const unsigned char*>(from);
  auto* dst = static_cast<unsigned char*>(to);
  const int64_t row = ndim == 0 ? 1 : box.shape[ndim - 1];
  const int64_t rows = numel_of(box.shape) / row;
  Dims index(ndim, 0);  // over all dims but the last
  for (int64_t r = 0; r < rows; ++r) {
    int64_t global_at = 0, local_at = 0;
    for (std::size_t d = 0; d < ndim; ++d) {
      global_at = global_at * global_shape[d] + box.offset[d] + index[d];
      local_at = local_at * box.shape[d] + index[d];
    }
    const std::size_t bytes = static_cast<std::size_t>(row) * elem;
    if (to_local) {
      std::memcpy(dst + local_at * elem, src + global_at * elem, bytes);
    } else {
      std::memcpy(dst + global_at * elem, src + local_at * elem, bytes);
    }
    for (std::size_t d = ndim < 2 ? 0 : ndim - 1; d-- > 0;) {  // odometer over dims [0, ndim - 1)
      if (++index[d] < box.shape[d]) break;
      index[d] = 0;
    }
  }
}

inline std::vector<unsigned char> bytes_of_box(const std::vector<unsigned char>& global,
                                               const Dims& global_shape, const Box& box,
                                               std::size_t elem) {
  std::vector<unsigned char> out(static_cast<std::size_t>(numel_of(box.shape)) * elem);
  copy_box(global.data(), out.data(), global_shape, box, elem, true);
  return out;
}

// How one rank holds a param: the layout handed to add_param and the box it means.
struct RankPlacement {
  Box box;
  bool box_form = false;
  Dims global_shape, mesh_shape, mesh_coord;
  std::vector<sa_placement> placements;

  sa_layout layout() const {
    sa_layout l = SA_LAYOUT_INIT;
    l.ndim = static_cast<int32_t>(global_shape.size());
    l.global_shape = global_shape.data();
    if (box_form) {
      l.global_offset = box.offset.data();
    } else {
      l.mesh_ndim = static_cast<int32_t>(mesh_shape.size());
      l.mesh_shape = mesh_shape.data();
      l.mesh_coord = mesh_coord.data();
      l.placements = placements.data();
    }
    return l;
  }
};

struct Scenario {
  std::string label;
  int64_t ranks;
  std::function<RankPlacement(const Dims& global_shape, int64_t rank)> place;
};

// Rank r of a mesh, coordinates in row-major order; its box from sa_layout_local_box.
inline Scenario mesh_scenario(std::string label, Dims mesh_shape,
                              std::vector<sa_placement> placements) {
  const int64_t ranks = numel_of(mesh_shape);
  return {std::move(label), ranks, [=](const Dims& global_shape, int64_t rank) {
            RankPlacement p;
            p.global_shape = global_shape;
            p.mesh_shape = mesh_shape;
            p.placements = placements;
            p.mesh_coord.assign(mesh_shape.size(), 0);
            for (int64_t d = static_cast<int64_t>(mesh_shape.size()) - 1, r = rank; d >= 0; --d) {
              p.mesh_coord[d] = r % mesh_shape[d];
              r /= mesh_shape[d];
            }
            const sa_layout l = p.layout();
            p.box.shape.assign(global_shape.size(), -1);
            p.box.offset.assign(global_shape.size(), -1);
            REQUIRE_SA_OK(nullptr,
                          sa_layout_local_box(&l, p.box.shape.data(), p.box.offset.data()));
            return p;
          }};
}

// Explicit boxes over 5 ranks (params of 2 or more dims): the rows cut at fractions of
// dim 0 (uneven, one rank empty), and the last rows split again along dim 1; further
// dims are whole.
inline Scenario box_scenario() {
  return {"explicit boxes", 5, [](const Dims& global_shape, int64_t rank) {
            const int64_t rows = global_shape[0], cols = global_shape[1];
            const int64_t cut1 = rows / 5, cut2 = rows * 3 / 5, col_cut = cols / 3;
            std::vector<Box> boxes = {
                {{0, 0}, {cut1, cols}},
                {{cut1, 0}, {0, cols}},  // an empty box in the middle
                {{cut1, 0}, {cut2 - cut1, cols}},
                {{cut2, 0}, {rows - cut2, col_cut}},
                {{cut2, col_cut}, {rows - cut2, cols - col_cut}},
            };
            RankPlacement p;
            p.box_form = true;
            p.global_shape = global_shape;
            p.box = boxes[static_cast<std::size_t>(rank)];
            for (std::size_t d = 2; d < global_shape.size(); ++d) {
              p.box.offset.push_back(0);
              p.box.shape.push_back(global_shape[d]);
            }
            return p;
          }};
}

inline std::size_t state_elem_size(const std::string& key, const GlobalParam& p) {
  if (key == "master") return 4;
  if (key == "remainder") return 2;
  return dtype_bytes(p.moment_dtype);
}

// Initial values and the grads of every step of a scenario, global and seeded.
struct Problem {
  std::vector<GlobalParam> params;
  std::vector<HostTensor> initial;
  std::vector<std::vector<HostTensor>> grads;  // [step][param]

  explicit Problem(std::vector<GlobalParam> ps, int steps = 6, uint64_t seed = 777) : params(std::move(ps)) {
    Rng rng(seed);
    for (const auto& p : params) {
      initial.emplace_back(p.shape, p.dtype);
      fill_normal(initial.back(), rng, 1.0);
    }
    for (int s = 0; s < steps; ++s) {
      grads.emplace_back();
      for (const auto& p : params) {
        grads[static_cast<std::size_t>(s)].emplace_back(p.shape, p.grad_dtype);
        fill_log_uniform(grads[static_cast<std::size_t>(s)].back(), rng, 1e-4, 1.0);
      }
    }
  }

  std::vector<std::vector<unsigned char>> initial_values() const {
    std::vector<std::vector<unsigned char>> out;
    for (const HostTensor& t : initial) out.push_back(t.raw_bytes());
    return out;
  }
};

// One simulated rank: an optimizer over its boxes of a Problem's params (param k placed by
// place(k)), with grad buffers bound once; load_grads copies a step's boxes into them.
// Params start at the problem's initial values, or at `values` (global arrays, one per
// param, in the param dtype) when given.
class RankShards {
 public:
  RankShards(const Problem& prob, const std::vector<sa_group_config>& groups,
             const std::function<RankPlacement(std::size_t k)>& place, int32_t threads, int32_t simd,
             const std::vector<std::vector<unsigned char>>* values = nullptr)
      : prob_(prob) {
    opt_ = make_optimizer(threads, simd);
    for (const sa_group_config& c : groups)
      REQUIRE_SA_OK(opt_.get(), sa_optimizer_add_group(opt_.get(), &c, nullptr));
    for (std::size_t k = 0; k < prob.params.size(); ++k) {
      const GlobalParam& g = prob.params[k];
      placements_.push_back(place(k));
      const Box& box = placements_.back().box;
      params_.emplace_back(box.shape, g.dtype);
      grads_.emplace_back(box.shape, g.grad_dtype);
      const void* initial = values != nullptr ? (*values)[k].data() : prob.initial[k].data();
      copy_box(initial, params_.back().data(), g.shape, box, dtype_bytes(g.dtype), true);
      const sa_layout layout = placements_.back().layout();
      const sa_param_options options = param_options(g.grad_dtype, g.moment_dtype, g.master);
      REQUIRE_SA_OK(opt_.get(), sa_optimizer_add_param(opt_.get(), g.name.c_str(), g.group,
                                                       params_.back().versioned(), &layout, &options,
                                                       nullptr));
    }
    std::vector<const void*> ptrs;
    for (const HostTensor& grad : grads_) ptrs.push_back(grad.numel() ? grad.data() : nullptr);
    REQUIRE_SA_OK(opt_.get(),
                  sa_optimizer_set_grad_ptrs(opt_.get(), static_cast<int64_t>(ptrs.size()), ptrs.data()));
  }

  void load_grads(int step) {
    for (std::size_t k = 0; k < prob_.params.size(); ++k)
      copy_box(prob_.grads[static_cast<std::size_t>(step)][k].data(), grads_[k].data(), prob_.params[k].shape,
               placements_[k].box, dtype_bytes(prob_.params[k].grad_dtype), true);
  }

  const Box& box(std::size_t k) const { return placements_[k].box; }
  const HostTensor& param(std::size_t k) const { return params_[k]; }
  HostTensor& grad(std::size_t k) { return grads_[k]; }
  sa_optimizer* opt() const { return opt_.get(); }

 private:
  const Problem& prob_;
  std::vector<RankPlacement> placements_;
  std::vector<HostTensor> params_;
  std::vector<HostTensor> grads_;
  OptimizerPtr opt_;  // last: destroyed before the shards it updates
};

}  // namespace sa_test

#endif  // SHARDADAM_TESTS_TEST_RANKS_HPP_
