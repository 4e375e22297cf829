// tests/test_layout.cpp — layouts: golden torch.chunk splits with known answers, mesh
// nesting, Replicate and negative dims, empty shards, the box form, and a property test
// that the boxes of every mesh coordinate tile the global tensor exactly once.
#include <map>
#include <numeric>

#include "test_support.hpp"

namespace {

using namespace sa_test;
using Dims = std::vector<int64_t>;

struct Box {
  Dims local_shape;
  Dims global_offset;
};

// The box sa_layout_local_box gives coordinate `coord` of the mesh.
Box local_box(const Dims& global_shape, const Dims& mesh_shape, const Dims& coord,
              const std::vector<sa_placement>& placements) {
  const MeshLayout layout{global_shape, mesh_shape, coord, placements};
  const sa_layout l = layout.get();
  Box box{Dims(global_shape.size(), -1), Dims(global_shape.size(), -1)};
  REQUIRE_SA_OK(nullptr, sa_layout_local_box(&l, box.local_shape.data(), box.global_offset.data()));
  return box;
}

// Every coordinate of a mesh in row-major order (the last mesh dim fastest).
std::vector<Dims> coordinates(const Dims& mesh_shape) {
  std::vector<Dims> out;
  Dims coord(mesh_shape.size(), 0);
  const int64_t count =
      std::accumulate(mesh_shape.begin(), mesh_shape.end(), int64_t{1}, std::multiplies<int64_t>());
  for (int64_t n = 0; n < count; ++n) {
    out.push_back(coord);
    for (int64_t d = static_cast<int64_t>(coord.size()) - 1; d >= 0; --d) {
      if (++coord[d] < mesh_shape[d]) break;
      coord[d] = 0;
    }
  }
  return out;
}

// Dim 0 of each coordinate's box along a 1-D mesh of `ranks` with Shard(0).
std::vector<Box> row_boxes(int64_t rows, int64_t ranks) {
  std::vector<Box> boxes;
  for (int64_t r = 0; r < ranks; ++r) boxes.push_back(local_box({rows}, {ranks}, {r}, {shard(0)}));
  return boxes;
}

Dims sizes_of(const std::vector<Box>& boxes, std::size_t dim) {
  Dims out;
  for (const auto& b : boxes) out.push_back(b.local_shape[dim]);
  return out;
}
Dims offsets_of(const std::vector<Box>& boxes, std::size_t dim) {
  Dims out;
  for (const auto& b : boxes) out.push_back(b.global_offset[dim]);
  return out;
}

}  // namespace

// ---- golden torch.chunk splits ---------------------------------------------------------------

TEST_CASE("5 rows over 4 ranks split 2,2,1,0 at offsets 0,2,4,5", "[layout]") {
  const auto boxes = row_boxes(5, 4);
  CHECK(sizes_of(boxes, 0) == Dims{2, 2, 1, 0});
  CHECK(offsets_of(boxes, 0) == Dims{0, 2, 4, 5});
}

TEST_CASE("512 rows over 30 ranks: 28 ranks of 18, one of 8, one empty at offset 512", "[layout]") {
  const auto boxes = row_boxes(512, 30);
  Dims expected_sizes(28, 18);
  expected_sizes.push_back(8);
  expected_sizes.push_back(0);
  Dims expected_offsets;
  for (int64_t r = 0; r < 29; ++r) expected_offsets.push_back(18 * r);
  expected_offsets.push_back(512);
  CHECK(sizes_of(boxes, 0) == expected_sizes);
  CHECK(offsets_of(boxes, 0) == expected_offsets);
}

TEST_CASE("6 rows over 4 ranks: torch.chunk makes 3 chunks of 2, the 4th rank is empty",
          "[layout]") {
  const auto boxes = row_boxes(6, 4);
  CHECK(sizes_of(boxes, 0) == Dims{2, 2, 2, 0});
  CHECK(offsets_of(boxes, 0) == Dims{0, 2, 4, 6});
}

TEST_CASE("a dim of size 0 gives every rank an empty shard at offset 0", "[layout]") {
  const auto boxes = row_boxes(0, 3);
  CHECK(sizes_of(boxes, 0) == Dims{0, 0, 0});
  CHECK(offsets_of(boxes, 0) == Dims{0, 0, 0});
}

TEST_CASE("one rank holds the whole dim, a 1-rank mesh is not a split", "[layout]") {
  const auto boxes = row_boxes(7, 1);
  CHECK(sizes_of(boxes, 0) == Dims{7});
  CHECK(offsets_of(boxes, 0) == Dims{0});
}

TEST_CASE("18 rows on a (4,2) mesh with Shard(0),Shard(0) nest left to right: 3,2,3,2,3,2,2,1",
          "[layout]") {
  std::vector<Box> boxes;
  for (const Dims& c : coordinates({4, 2}))
    boxes.push_back(local_box({18}, {4, 2}, c, {shard(0), shard(0)}));
  // Mesh dim 0 cuts 18 into 5,5,5,3; mesh dim 1 cuts each of those in two.
  CHECK(sizes_of(boxes, 0) == Dims{3, 2, 3, 2, 3, 2, 2, 1});
  CHECK(offsets_of(boxes, 0) == Dims{0, 3, 5, 8, 10, 13, 15, 17});
}

TEST_CASE("10 rows on a (3,2) mesh with Shard(0),Shard(0): the short last chunk splits 1,1",
          "[layout]") {
  std::vector<Box> boxes;
  for (const Dims& c : coordinates({3, 2}))
    boxes.push_back(local_box({10}, {3, 2}, c, {shard(0), shard(0)}));
  CHECK(sizes_of(boxes, 0) == Dims{2, 2, 2, 2, 1, 1});
  CHECK(offsets_of(boxes, 0) == Dims{0, 2, 4, 6, 8, 9});
}

TEST_CASE("a 7x5 tensor on a 2x3 mesh with Shard(0),Shard(1) is cut into 2x3 blocks", "[layout]") {
  // Rows: ceil(7/2) = 4 -> [0,4) [4,7). Columns: ceil(5/3) = 2 -> [0,2) [2,4) [4,5).
  const std::map<Dims, Box> expected = {
      {{0, 0}, {{4, 2}, {0, 0}}}, {{0, 1}, {{4, 2}, {0, 2}}}, {{0, 2}, {{4, 1}, {0, 4}}},
      {{1, 0}, {{3, 2}, {4, 0}}}, {{1, 1}, {{3, 2}, {4, 2}}}, {{1, 2}, {{3, 1}, {4, 4}}},
  };
  for (const auto& [coord, want] : expected) {
    INFO("coordinate (" << coord[0] << ", " << coord[1] << ")");
    const Box got = local_box({7, 5}, {2, 3}, coord, {shard(0), shard(1)});
    CHECK(got.local_shape == want.local_shape);
    CHECK(got.global_offset == want.global_offset);
  }
}

TEST_CASE("placements name tensor dims, not mesh dims: Shard(1),Shard(0) on a 2x3 mesh",
          "[layout]") {
  // Mesh dim 0 (size 2) cuts the 5 columns 3,2; mesh dim 1 (size 3) cuts the 7 rows 3,3,1.
  const Box b = local_box({7, 5}, {2, 3}, {1, 2}, {shard(1), shard(0)});
  CHECK(b.local_shape == Dims{1, 2});
  CHECK(b.global_offset == Dims{6, 3});
}

TEST_CASE("Replicate mesh dims leave the tensor whole, only Shard dims cut it", "[layout]") {
  SECTION("HSDP (Replicate, Shard(0)): both replicas of a shard hold the same rows") {
    for (int64_t replica = 0; replica < 2; ++replica) {
      const Dims sizes = {
          local_box({10, 3}, {2, 3}, {replica, 0}, {replicate(), shard(0)}).local_shape[0],
          local_box({10, 3}, {2, 3}, {replica, 1}, {replicate(), shard(0)}).local_shape[0],
          local_box({10, 3}, {2, 3}, {replica, 2}, {replicate(), shard(0)}).local_shape[0]};
      CHECK(sizes == Dims{4, 4, 2});
      const Box last = local_box({10, 3}, {2, 3}, {replica, 2}, {replicate(), shard(0)});
      CHECK(last.global_offset == Dims{8, 0});
      CHECK(last.local_shape == Dims{2, 3});
    }
  }
  SECTION("only Replicate: every coordinate holds the whole tensor") {
    const Box b = local_box({6, 4}, {3, 2}, {2, 1}, {replicate(), replicate()});
    CHECK(b.local_shape == Dims{6, 4});
    CHECK(b.global_offset == Dims{0, 0});
  }
  SECTION("a 0-dim mesh is not sharded") {
    const MeshLayout layout{{6, 4}, {}, {}, {}};
    const sa_layout l = layout.get();
    Dims shape(2), offset(2);
    REQUIRE_SA_OK(nullptr, sa_layout_local_box(&l, shape.data(), offset.data()));
    CHECK(shape == Dims{6, 4});
    CHECK(offset == Dims{0, 0});
  }
}

TEST_CASE("a negative Shard dim counts from the end", "[layout]") {
  // Shard(-1) of a 4x9 tensor over 4 ranks cuts the 9 columns 3,3,3,0.
  std::vector<Box> boxes;
  for (int64_t r = 0; r < 4; ++r) boxes.push_back(local_box({4, 9}, {4}, {r}, {shard(-1)}));
  CHECK(sizes_of(boxes, 1) == Dims{3, 3, 3, 0});
  CHECK(offsets_of(boxes, 1) == Dims{0, 3, 6, 9});
  CHECK(sizes_of(boxes, 0) == Dims{4, 4, 4, 4});
  // Shard(-2) is dim 0.
  CHECK(local_box({4, 9}, {3}, {1}, {shard(-2)}).local_shape == Dims{2, 9});
  CHECK(local_box({4, 9}, {3}, {1}, {shard(-2)}).global_offset == Dims{2, 0});
}

TEST_CASE("an empty shard sits at offset = dim size in the sharded dim and keeps the other dims",
          "[layout]") {
  // 3 rows over 5 ranks: 1,1,1,0,0.
  for (int64_t r = 3; r < 5; ++r) {
    const Box b = local_box({3, 8}, {5}, {r}, {shard(0)});
    CHECK(b.local_shape == Dims{0, 8});
    CHECK(b.global_offset == Dims{3, 0});
  }
  // Nested: the empty first-level chunk stays empty (and at the end) at the second level.
  const Box b = local_box({3}, {5, 2}, {4, 1}, {shard(0), shard(0)});
  CHECK(b.local_shape == Dims{0});
  CHECK(b.global_offset == Dims{3});
}

// ---- through add_param -------------------------------------------------------------------------

TEST_CASE("add_param places a mesh-form shard where the layout says and reports it in param_info",
          "[layout]") {
  // Rank (1, 2) of the 2x3 block layout of a 7x5 tensor: rows [4,7), cols [4,5).
  HostTensor shard_tensor({3, 1}, kFloat32);
  auto opt = make_optimizer();
  const sa_group_config group = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &group, nullptr));
  const MeshLayout mesh{{7, 5}, {2, 3}, {1, 2}, {shard(0), shard(1)}};
  const sa_layout layout = mesh.get();
  int64_t index = -1;
  REQUIRE_SA_OK(opt.get(),
                sa_optimizer_add_param(opt.get(), "blocks.w", 0, shard_tensor.versioned(), &layout,
                                       nullptr, &index));
  sa_param_info info = SA_PARAM_INFO_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_param_info(opt.get(), index, &info));
  REQUIRE(info.ndim == 2);
  CHECK(Dims(info.local_shape, info.local_shape + 2) == Dims{3, 1});
  CHECK(Dims(info.global_offset, info.global_offset + 2) == Dims{4, 4});
  CHECK(Dims(info.global_shape, info.global_shape + 2) == Dims{7, 5});
  CHECK(info.numel == 3);
}

TEST_CASE("add_param accepts the empty shard a layout gives and records its offset", "[layout]") {
  HostTensor empty({0, 6}, kFloat32);
  auto opt = make_optimizer();
  const sa_group_config group = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &group, nullptr));
  const MeshLayout mesh{{5, 6}, {4}, {3}, {shard(0)}};  // 2,2,1,0
  const sa_layout layout = mesh.get();
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "w", 0, empty.versioned(), &layout,
                                                  nullptr, nullptr));
  sa_param_info info = SA_PARAM_INFO_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_param_info(opt.get(), 0, &info));
  CHECK(Dims(info.global_offset, info.global_offset + 2) == Dims{5, 0});
  CHECK(info.numel == 0);
}

TEST_CASE("add_param rejects a shard whose shape is not the one the mesh layout gives",
          "[layout]") {
  auto opt = make_optimizer();
  const sa_group_config group = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &group, nullptr));
  HostTensor wrong({2, 6}, kFloat32);  // rank 2 of 5 rows over 4 ranks has 1 row
  const MeshLayout mesh{{5, 6}, {4}, {2}, {shard(0)}};
  const sa_layout layout = mesh.get();
  CHECK_SA_FAILS(
      opt.get(), SA_ERR_MISMATCH,
      sa_optimizer_add_param(opt.get(), "w", 0, wrong.versioned(), &layout, nullptr, nullptr),
      "param 'w'", "[2, 6]", "[1, 6]", "offset [4, 0]", "[5, 6]");
  CHECK(sa_optimizer_num_params(opt.get()) == 0);
}

TEST_CASE("box-form layouts: a box inside the global tensor is taken as given", "[layout]") {
  HostTensor inner({3, 2}, kFloat32), edge({4, 6}, kFloat32), empty({0, 6}, kFloat32);
  auto opt = make_optimizer();
  const sa_group_config group = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &group, nullptr));
  const Dims global = {10, 6};

  SECTION("an interior box, and one that ends exactly at the far edge") {
    const Dims inner_offset = {5, 1};
    const Dims edge_offset = {6, 0};
    sa_layout layout = SA_LAYOUT_INIT;
    layout.ndim = 2;
    layout.global_shape = global.data();
    layout.global_offset = inner_offset.data();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "inner", 0, inner.versioned(),
                                                    &layout, nullptr, nullptr));
    layout.global_offset = edge_offset.data();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "edge", 0, edge.versioned(), &layout,
                                                    nullptr, nullptr));
    sa_param_info info = SA_PARAM_INFO_INIT;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_param_info(opt.get(), 0, &info));
    CHECK(Dims(info.global_offset, info.global_offset + 2) == inner_offset);
    CHECK(Dims(info.local_shape, info.local_shape + 2) == Dims{3, 2});
    CHECK(Dims(info.global_shape, info.global_shape + 2) == global);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_param_info(opt.get(), 1, &info));
    CHECK(Dims(info.global_offset, info.global_offset + 2) == edge_offset);
  }
  SECTION("an empty box at offset = dim size") {
    const Dims offset = {10, 0};
    sa_layout layout = SA_LAYOUT_INIT;
    layout.ndim = 2;
    layout.global_shape = global.data();
    layout.global_offset = offset.data();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "empty", 0, empty.versioned(),
                                                    &layout, nullptr, nullptr));
  }
}

TEST_CASE("box-form layouts that do not fit the global tensor are rejected", "[layout]") {
  auto opt = make_optimizer();
  const sa_group_config group = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &group, nullptr));
  const Dims global = {10, 6};
  HostTensor shard_tensor({3, 2}, kFloat32);
  sa_layout layout = SA_LAYOUT_INIT;
  layout.ndim = 2;
  layout.global_shape = global.data();

  const std::vector<std::pair<Dims, const char*>> bad_offsets = {
      {{8, 0}, "(dim 0)"},   // rows 8..11 overrun 10
      {{0, 5}, "(dim 1)"},   // cols 5..7 overrun 6
      {{-1, 0}, "(dim 0)"},  // negative offset
      {{11, 0}, "(dim 0)"},  // offset beyond the dim
  };
  for (const auto& [offset, which] : bad_offsets) {
    layout.global_offset = offset.data();
    CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                   sa_optimizer_add_param(opt.get(), "w", 0, shard_tensor.versioned(), &layout,
                                          nullptr, nullptr),
                   "param 'w'", "does not fit the global shape [10, 6]", "[3, 2]", which);
  }
  SECTION("a box may not also carry mesh fields") {
    const Dims offset = {0, 0};
    const Dims mesh_shape = {2};
    layout.global_offset = offset.data();
    layout.mesh_ndim = 1;
    layout.mesh_shape = mesh_shape.data();
    CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                   sa_optimizer_add_param(opt.get(), "w", 0, shard_tensor.versioned(), &layout,
                                          nullptr, nullptr),
                   "param 'w'", "both global_offset", "mesh");
  }
  CHECK(sa_optimizer_num_params(opt.get()) == 0);
  CHECK(shard_tensor.deleter_calls() == 0);
}

TEST_CASE("sa_layout_local_box rejects bad layouts with a thread-local message", "[layout]") {
  const Dims global = {8, 4};
  const Dims mesh_shape = {2, 2};
  Dims coord = {0, 1};
  std::vector<sa_placement> placements = {shard(0), shard(1)};
  sa_layout l = SA_LAYOUT_INIT;
  l.ndim = 2;
  l.global_shape = global.data();
  l.mesh_ndim = 2;
  l.mesh_shape = mesh_shape.data();
  l.mesh_coord = coord.data();
  l.placements = placements.data();
  Dims shape(2), offset(2);
  REQUIRE_SA_OK(nullptr, sa_layout_local_box(&l, shape.data(), offset.data()));

  SECTION("NULL arguments") {
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(nullptr, shape.data(), offset.data()), "sa_layout_local_box",
                   "layout is NULL");
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, nullptr, offset.data()),
                   "local_shape or global_offset is NULL");
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_layout_local_box(&l, shape.data(), nullptr),
                   "local_shape or global_offset is NULL");
    l.placements = nullptr;
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "mesh_ndim is 2", "NULL");
    l.global_shape = nullptr;
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "global_shape is NULL");
  }
  SECTION("a box-form layout has no mesh box to compute") {
    const Dims box_offset = {0, 0};
    l.mesh_ndim = 0;
    l.mesh_shape = nullptr;
    l.mesh_coord = nullptr;
    l.placements = nullptr;
    l.global_offset = box_offset.data();
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "mesh-form");
  }
  SECTION("a coordinate outside the mesh") {
    coord = {2, 0};
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "mesh_coord[0] is 2",
                   "size 2");
    coord = {0, -1};
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "mesh_coord[1] is -1");
  }
  SECTION("a mesh dim of size 0") {
    const Dims zero_mesh = {2, 0};
    l.mesh_shape = zero_mesh.data();
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "mesh_shape[1] is 0");
  }
  SECTION("a Shard dim outside the tensor, either way") {
    placements[1] = shard(2);
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()),
                   "placements[1] is Shard(2)", "2 dims");
    placements[1] = shard(-3);
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()),
                   "placements[1] is Shard(-3)");
  }
  SECTION("Partial and unknown placement types") {
    placements[0] = partial();
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()),
                   "placements[0] is Partial");
    placements[0] = sa_placement{7, 0};
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()),
                   "placements[0] has unknown type 7");
  }
  SECTION("negative sizes and out-of-range ranks") {
    const Dims negative = {8, -4};
    l.global_shape = negative.data();
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "global_shape[1] is -4");
    l.global_shape = global.data();
    l.ndim = SA_MAX_NDIM + 1;
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "ndim 17");
    l.ndim = 2;
    l.mesh_ndim = -1;
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "mesh_ndim -1");
  }
  SECTION("struct_size 0 and a struct_size from a newer header") {
    l.struct_size = 0;
    CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "struct_size 0");
    l.struct_size = sizeof(sa_layout) + 8;
    CHECK_SA_FAILS(nullptr, SA_ERR_UNSUPPORTED,
                   sa_layout_local_box(&l, shape.data(), offset.data()), "newer shardadam.h");
  }
}

// ---- property: the boxes of a mesh tile the tensor ----------------------------------------------

TEST_CASE("every mesh layout's boxes tile the global tensor exactly once per replica",
          "[layout][property]") {
  Rng rng(20240611);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t ndim = static_cast<int32_t>(rng.integer(1, 3));
    Dims global(ndim);
    for (auto& n : global) n = rng.integer(0, 13);
    const int32_t mesh_ndim = static_cast<int32_t>(rng.integer(1, 3));
    Dims mesh(mesh_ndim);
    for (auto& k : mesh) k = rng.integer(1, 5);
    std::vector<sa_placement> placements;
    int64_t replicas = 1;
    for (int32_t m = 0; m < mesh_ndim; ++m) {
      if (rng.chance(0.25)) {
        placements.push_back(replicate());
        replicas *= mesh[m];
      } else {
        const int32_t d = static_cast<int32_t>(rng.integer(0, ndim - 1));
        placements.push_back(shard(rng.chance(0.5) ? d : d - ndim));  // also negative dims
      }
    }
    // Coverage count of every global element, by the boxes of all coordinates.
    const int64_t total =
        std::accumulate(global.begin(), global.end(), int64_t{1}, std::multiplies<int64_t>());
    std::vector<int64_t> covered(static_cast<std::size_t>(total), 0);
    for (const Dims& coord : coordinates(mesh)) {
      const Box b = local_box(global, mesh, coord, placements);
      for (int32_t d = 0; d < ndim; ++d) {
        REQUIRE(b.global_offset[d] >= 0);
        REQUIRE(b.local_shape[d] >= 0);
        REQUIRE(b.global_offset[d] + b.local_shape[d] <= global[d]);
      }
      // Walk the box's elements.
      const int64_t box_elems = std::accumulate(b.local_shape.begin(), b.local_shape.end(),
                                                int64_t{1}, std::multiplies<int64_t>());
      Dims at(ndim, 0);
      for (int64_t e = 0; e < box_elems; ++e) {
        int64_t flat = 0;
        for (int32_t d = 0; d < ndim; ++d) flat = flat * global[d] + b.global_offset[d] + at[d];
        ++covered[static_cast<std::size_t>(flat)];
        for (int32_t d = ndim - 1; d >= 0; --d) {
          if (++at[d] < b.local_shape[d]) break;
          at[d] = 0;
        }
      }
    }
    INFO("trial " << trial << ": global " << Catch::Detail::stringify(global) << ", mesh "
                  << Catch::Detail::stringify(mesh));
    const bool exact =
        std::all_of(covered.begin(), covered.end(), [&](int64_t c) { return c == replicas; });
    REQUIRE(exact);
  }
}
