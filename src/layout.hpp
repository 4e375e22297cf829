// src/layout.hpp — where a local shard sits in its global tensor.
#ifndef SHARDADAM_SRC_LAYOUT_HPP_
#define SHARDADAM_SRC_LAYOUT_HPP_

#include <cstdint>
#include <string>
#include <vector>

#include "shardadam/shardadam.h"

namespace sa {

using Dims = std::vector<int64_t>;

// The piece [offset, offset + size) that coordinate `index` of `parts` gets when a dim of
// `dim_size` is split with torch.chunk semantics: chunks of ceil(dim_size / parts),
// trailing coordinates get a smaller or empty chunk; an empty chunk starts at dim_size.
// This is the only place shardadam spells the split rule.
struct Chunk {
  int64_t offset;
  int64_t size;
};
Chunk chunk_of(int64_t dim_size, int64_t parts, int64_t index);

// A resolved layout: the box [global_offset, global_offset + local_shape) of a tensor of
// global_shape, plus the mesh it came from (empty for the box form), kept for
// replica-aware work (export, norms).
struct Layout {
  Dims global_shape;
  Dims global_offset;
  Dims local_shape;
  Dims mesh_shape;
  Dims mesh_coord;
  std::vector<sa_placement> placements;  // normalized: Shard dims are >= 0
};

// Whether this rank is the replica that stands for the shard: coordinate 0 along every mesh
// dim where the param is Replicate (always true for the box form). Export writes, and the
// gradient norm counts, only such shards, so every element is counted once.
bool primary_replica(const Layout& layout);

// Whether the layout splits the tensor across ranks: a Shard placement along a mesh dim of
// more than one rank (mesh form; true on every rank, the one holding all of a tiny tensor
// too), or a box that is not the whole tensor (box form). Ranks that hold the same tensor
// by the same layout answer alike.
bool is_sharded(const Layout& layout);

// Resolves `layout` for a shard of shape `shard_shape`. NULL means "not sharded". For
// the mesh form the local shape is computed and must equal shard_shape; for the box form
// shard_shape is the local shape and the box must fit the global shape. `context` starts
// every error message (e.g. "sa_optimizer_add_param: param 'w'").
Layout resolve_layout(const sa_layout* layout, const Dims& shard_shape, const std::string& context);

// The box a mesh-form layout gives this rank (no shard to compare with).
Layout resolve_mesh_layout(const sa_layout& layout, const std::string& context);

}  // namespace sa

#endif  // SHARDADAM_SRC_LAYOUT_HPP_
