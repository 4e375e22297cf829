package shardadam

import "github.com/shardadam/shardadam/bindings/go/internal/capi"

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
	Kind PlacementKind
	Dim  int // the tensor dim split by a PlacementShard; negative counts from the end
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
	GlobalShape  []int64
	MeshShape    []int64
	MeshCoord    []int64
	Placements   []Placement
	GlobalOffset []int64
}

// placementPairs flattens the placements into (kind, dim) pairs for the C helper.
func (l *Layout) placementPairs() []int64 {
	pairs := make([]int64, 0, 2*len(l.Placements))
	for _, p := range l.Placements {
		pairs = append(pairs, int64(p.Kind), int64(p.Dim))
	}
	return pairs
}

// LocalBox resolves a mesh-form layout to this rank's box: the local shape (the shape of
// the shard to add) and its offset in the global tensor (sa_layout_local_box).
func LocalBox(l Layout) (localShape, globalOffset []int64, err error) {
	if l.GlobalOffset != nil {
		return nil, nil, bindingError(StatusInvalidArgument,
			"shardadam.LocalBox: the layout is in box form (GlobalOffset set); its box is already known")
	}
	ndim := len(l.GlobalShape)
	localShape = make([]int64, ndim)
	globalOffset = make([]int64, ndim)
	errbuf := make([]byte, errorBufferBytes)
	status := capi.Sago_local_box(l.GlobalShape, l.MeshShape, l.MeshCoord, l.placementPairs(),
		localShape, globalOffset, errbuf)
	if err := resultError(status, errbuf); err != nil {
		return nil, nil, err
	}
	return localShape, globalOffset, nil
}
