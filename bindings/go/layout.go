package shardadam

// #include <shardadam/shardadam.h>
import "C"

import "unsafe"

// PlacementKind says how one mesh dim places a tensor (sa_placement_type).
type PlacementKind int

// The placement kinds.
const (
	PlacementReplicate PlacementKind = 0 // every coordinate along the mesh dim holds the same data
	PlacementShard     PlacementKind = 1 // tensor dim Dim is split along the mesh dim (torch.chunk)
	PlacementPartial   PlacementKind = 2 // a pending reduction: never valid for a param
)

// Placement is the placement of a tensor along one mesh dim.
type Placement struct {
	Kind PlacementKind // replicate, shard or partial
	Dim  int           // the tensor dim split by a PlacementShard; negative counts from the end
}

// Shard is the placement Shard(dim): tensor dim `dim` is split along the mesh dim.
func Shard(dim int) Placement { return Placement{Kind: PlacementShard, Dim: dim} }

// Replicate is the placement Replicate(): every coordinate holds the whole tensor.
func Replicate() Placement { return Placement{Kind: PlacementReplicate} }

// Layout says where a local shard sits in its global tensor (sa_layout). Two forms:
//
//   - Mesh form (GlobalOffset == nil): the mesh sizes, this rank's coordinate and one
//     placement per mesh dim. Shard(d) follows torch.chunk: a dim of n split k ways gets
//     chunks of ceil(n/k), trailing coordinates get smaller or empty chunks. An empty
//     MeshShape means "not sharded".
//   - Box form (GlobalOffset != nil): the shard is the box
//     [GlobalOffset, GlobalOffset + local shape) of the global tensor; the mesh fields
//     stay empty.
type Layout struct {
	GlobalShape  []int64     // the global tensor's shape
	MeshShape    []int64     // mesh form: the mesh's dim sizes
	MeshCoord    []int64     // mesh form: this rank's coordinate, one per mesh dim
	Placements   []Placement // mesh form: one per mesh dim
	GlobalOffset []int64     // box form: the shard's offset, one per tensor dim
}

// cLayout builds l as an sa_layout in C memory (it points to its arrays). The library
// checks every count and value; only what it cannot see is checked here: that the mesh
// arrays, which it reads by mesh_ndim, have one entry per mesh dim, and the offsets one
// per tensor dim.
func (l *Layout) cLayout(op string, mem *cArena) (*C.sa_layout, error) {
	meshDims := len(l.MeshShape)
	if len(l.MeshCoord) != meshDims || len(l.Placements) != meshDims {
		return nil, bindingError(StatusInvalidArgument, "%s: layout: MeshCoord (%d) and Placements (%d) need one entry per MeshShape dim (%d)", op, len(l.MeshCoord), len(l.Placements), meshDims)
	}
	if l.GlobalOffset != nil && len(l.GlobalOffset) != len(l.GlobalShape) {
		return nil, bindingError(StatusInvalidArgument, "%s: layout: GlobalOffset (%d) needs one entry per GlobalShape dim (%d)", op, len(l.GlobalOffset), len(l.GlobalShape))
	}
	c := (*C.sa_layout)(mem.alloc(C.sizeof_sa_layout))
	c.struct_size = C.sizeof_sa_layout
	c.ndim = C.int32_t(len(l.GlobalShape))
	c.global_shape = mem.int64s(l.GlobalShape)
	c.mesh_ndim = C.int32_t(meshDims)
	c.mesh_shape = mem.int64s(l.MeshShape)
	c.mesh_coord = mem.int64s(l.MeshCoord)
	if meshDims > 0 {
		placements := unsafe.Slice((*C.sa_placement)(mem.alloc(uintptr(meshDims)*C.sizeof_sa_placement)), meshDims)
		for i, p := range l.Placements {
			placements[i] = C.sa_placement{_type: C.int32_t(p.Kind), dim: C.int32_t(p.Dim)}
		}
		c.placements = &placements[0]
	}
	if l.GlobalOffset != nil {
		// A 0-dim box still needs a non-NULL offset: NULL selects the mesh form.
		c.global_offset = (*C.int64_t)(mem.alloc(uintptr(len(l.GlobalOffset)) * 8))
		copy(unsafe.Slice((*int64)(unsafe.Pointer(c.global_offset)), len(l.GlobalOffset)), l.GlobalOffset)
	}
	return c, nil
}

// LocalBox resolves a mesh-form layout to this rank's box: the local shape (the shape of
// the shard to add) and its offset in the global tensor (sa_layout_local_box).
func LocalBox(l Layout) (localShape, globalOffset []int64, err error) {
	const op = "shardadam.LocalBox"
	if l.GlobalOffset != nil {
		return nil, nil, bindingError(StatusInvalidArgument,
			"%s: the layout is in box form (GlobalOffset set); its box is already known", op)
	}
	var mem cArena
	defer mem.free()
	c, err := l.cLayout(op, &mem)
	if err != nil {
		return nil, nil, err
	}
	ndim := len(l.GlobalShape)
	local := (*C.int64_t)(mem.alloc(uintptr(ndim) * 8))
	offset := (*C.int64_t)(mem.alloc(uintptr(ndim) * 8))
	if err := handleless(func() C.sa_status { return C.sa_layout_local_box(c, local, offset) }); err != nil {
		return nil, nil, err
	}
	localShape = append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(local)), ndim)...)
	globalOffset = append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(offset)), ndim)...)
	return localShape, globalOffset, nil
}
