#include "layout.hpp"

#include <algorithm>

#include "errors.hpp"
#include "options.hpp"

namespace sa {

Chunk chunk_of(int64_t dim_size, int64_t parts, int64_t index) {
  const int64_t chunk = (dim_size + parts - 1) / parts;  // ceil; parts >= 1
  const int64_t begin = std::min(index * chunk, dim_size);
  const int64_t end = std::min(begin + chunk, dim_size);
  return {begin, end - begin};
}

namespace {

sa_layout read_layout(const sa_layout& in, const std::string& context) {
  const sa_layout defaults = SA_LAYOUT_INIT;
  sa_layout layout = read_options(&in, defaults, (context + ": layout").c_str());
  if (layout.ndim < 0 || layout.ndim > SA_MAX_NDIM)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": layout.ndim ", layout.ndim, " is outside [0, ",
         SA_MAX_NDIM, "]");
  if (layout.ndim > 0 && layout.global_shape == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": layout.global_shape is NULL");
  for (int32_t d = 0; d < layout.ndim; ++d)
    if (layout.global_shape[d] < 0)
      fail(SA_ERR_INVALID_ARGUMENT, context, ": layout.global_shape[", d, "] is ",
           layout.global_shape[d], "; sizes must be >= 0");
  return layout;
}

Dims global_shape_of(const sa_layout& layout) {
  return Dims(layout.global_shape, layout.global_shape + layout.ndim);
}

Layout resolve_box(const sa_layout& layout, const Dims& shard_shape, const std::string& context) {
  if (layout.mesh_ndim != 0 || layout.mesh_shape || layout.mesh_coord || layout.placements)
    fail(SA_ERR_INVALID_ARGUMENT, context,
         ": layout sets both global_offset (box form) and mesh fields (mesh form); use one");
  Layout out;
  out.global_shape = global_shape_of(layout);
  out.global_offset.assign(layout.global_offset, layout.global_offset + layout.ndim);
  out.local_shape = shard_shape;
  for (int32_t d = 0; d < layout.ndim; ++d) {
    const int64_t offset = out.global_offset[d];
    if (offset < 0 || offset > out.global_shape[d] || shard_shape[d] > out.global_shape[d] - offset)
      fail(SA_ERR_INVALID_ARGUMENT, context, ": the box of offset ", format_dims(out.global_offset),
           " and local shape ", format_dims(shard_shape), " does not fit the global shape ",
           format_dims(out.global_shape), " (dim ", d, ")");
  }
  return out;
}

}  // namespace

Layout resolve_mesh_layout(const sa_layout& in, const std::string& context) {
  const sa_layout layout = read_layout(in, context);
  if (layout.global_offset != nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": expected a mesh-form layout (global_offset NULL)");
  if (layout.mesh_ndim < 0 || layout.mesh_ndim > SA_MAX_NDIM)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": layout.mesh_ndim ", layout.mesh_ndim,
         " is outside [0, ", SA_MAX_NDIM, "]");
  if (layout.mesh_ndim > 0 && (!layout.mesh_shape || !layout.mesh_coord || !layout.placements))
    fail(SA_ERR_INVALID_ARGUMENT, context, ": layout.mesh_ndim is ", layout.mesh_ndim,
         " but mesh_shape, mesh_coord or placements is NULL");

  Layout out;
  out.global_shape = global_shape_of(layout);
  out.global_offset.assign(layout.ndim, 0);
  out.local_shape = out.global_shape;
  for (int32_t m = 0; m < layout.mesh_ndim; ++m) {
    const int64_t size = layout.mesh_shape[m];
    const int64_t coord = layout.mesh_coord[m];
    if (size < 1)
      fail(SA_ERR_INVALID_ARGUMENT, context, ": layout.mesh_shape[", m, "] is ", size,
           "; mesh dims must be >= 1");
    if (coord < 0 || coord >= size)
      fail(SA_ERR_INVALID_ARGUMENT, context, ": layout.mesh_coord[", m, "] is ", coord,
           ", outside the mesh dim of size ", size);
    sa_placement placement = layout.placements[m];
    switch (placement.type) {
      case SA_PLACEMENT_REPLICATE:
        placement.dim = 0;
        break;
      case SA_PLACEMENT_SHARD: {
        const int32_t dim = placement.dim < 0 ? placement.dim + layout.ndim : placement.dim;
        if (dim < 0 || dim >= layout.ndim)
          fail(SA_ERR_INVALID_ARGUMENT, context, ": placements[", m, "] is Shard(", placement.dim,
               ") but the tensor has ", layout.ndim, " dims");
        placement.dim = dim;
        // Nesting left to right: this mesh dim splits what the earlier ones left.
        const Chunk piece = chunk_of(out.local_shape[dim], size, coord);
        out.global_offset[dim] += piece.offset;
        out.local_shape[dim] = piece.size;
        break;
      }
      case SA_PLACEMENT_PARTIAL:
        fail(SA_ERR_INVALID_ARGUMENT, context, ": placements[", m,
             "] is Partial; a parameter cannot be a pending reduction (reduce it first)");
      default:
        fail(SA_ERR_INVALID_ARGUMENT, context, ": placements[", m, "] has unknown type ",
             placement.type);
    }
    out.mesh_shape.push_back(size);
    out.mesh_coord.push_back(coord);
    out.placements.push_back(placement);
  }
  return out;
}

Layout resolve_layout(const sa_layout* in, const Dims& shard_shape, const std::string& context) {
  if (in == nullptr) {
    Layout out;
    out.global_shape = shard_shape;
    out.global_offset.assign(shard_shape.size(), 0);
    out.local_shape = shard_shape;
    return out;
  }
  const sa_layout layout = read_layout(*in, context);
  if (static_cast<std::size_t>(layout.ndim) != shard_shape.size())
    fail(SA_ERR_MISMATCH, context, ": layout.ndim is ", layout.ndim, " but the local shard has ",
         shard_shape.size(), " dims (shape ", format_dims(shard_shape), ")");
  if (layout.global_offset != nullptr) return resolve_box(layout, shard_shape, context);
  Layout out = resolve_mesh_layout(layout, context);
  if (out.local_shape != shard_shape)
    fail(SA_ERR_MISMATCH, context, ": the local shard has shape ", format_dims(shard_shape),
         " but the layout gives this rank (coordinate ", format_dims(out.mesh_coord),
         ") the local shape ", format_dims(out.local_shape), " at offset ",
         format_dims(out.global_offset), " of global shape ", format_dims(out.global_shape));
  return out;
}

bool is_sharded(const Layout& layout) {
  if (layout.mesh_shape.empty()) return layout.local_shape != layout.global_shape;
  for (std::size_t m = 0; m < layout.placements.size(); ++m)
    if (layout.placements[m].type == SA_PLACEMENT_SHARD && layout.mesh_shape[m] > 1) return true;
  return false;
}

bool primary_replica(const Layout& layout) {
  for (std::size_t m = 0; m < layout.placements.size(); ++m)
    if (layout.placements[m].type == SA_PLACEMENT_REPLICATE && layout.mesh_coord[m] != 0)
      return false;
  return true;
}

}  // namespace sa
