"""Layouts: where a local shard sits in its global tensor.

Two forms, as in the C ABI (``sa_layout``):

- :class:`Mesh`: a device mesh (its shape and this rank's coordinate) and one placement per
  mesh dim, :class:`Shard` ``(d)`` or :class:`Replicate` (:class:`Partial` is refused for
  params). ``Shard(d)`` follows ``torch.chunk``: along a mesh dim of size k a tensor dim of
  size n is cut into chunks of ``ceil(n / k)``; trailing coordinates get smaller or empty
  chunks. Several mesh dims sharding one tensor dim nest left to right, as PyTorch DTensor.
- :class:`Box`: an explicit box ``[global_offset, global_offset + local_shape)``, for engines
  with their own uneven sharding.

No layout (None) means the param is not sharded.
"""
from . import _shardadam as _C
from ._errors import check


class Shard:
    """Tensor dim ``dim`` is split along this mesh dim (negative counts from the end)."""

    __slots__ = ("dim",)

    def __init__(self, dim):
        self.dim = int(dim)

    def __repr__(self):
        return f"Shard({self.dim})"

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self):
        return hash(("Shard", self.dim))

    def _as_c(self):
        return (_C.SA_PLACEMENT_SHARD, self.dim)


class Replicate:
    """Every coordinate along this mesh dim holds the same data."""

    __slots__ = ()

    def __repr__(self):
        return "Replicate()"

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")

    def _as_c(self):
        return (_C.SA_PLACEMENT_REPLICATE, 0)


class Partial:
    """A pending reduction along this mesh dim. Never valid for a param (the library
    refuses it); it exists so that such layouts fail with the library's message."""

    __slots__ = ()

    def __repr__(self):
        return "Partial()"

    def __eq__(self, other):
        return isinstance(other, Partial)

    def __hash__(self):
        return hash("Partial")

    def _as_c(self):
        return (_C.SA_PLACEMENT_PARTIAL, 0)


def _ints(values, what):
    try:
        return tuple(int(v) for v in values)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, got {values!r}") from None


class Mesh:
    """Mesh form: ``Mesh(shape, coord, placements, global_shape=None)``.

    Args:
        shape: sizes of the mesh dims, e.g. ``(4,)`` or ``(2, 4)``.
        coord: this rank's coordinate in the mesh, one entry per mesh dim.
        placements: one :class:`Shard` / :class:`Replicate` per mesh dim.
        global_shape: shape of the whole (global) tensor. Needed when any placement is
            :class:`Shard` (the local shape alone does not tell it: 3 rows of ``Shard(0)``
            over 4 ranks may come from 9 to 12 global rows); without shards the global
            shape is the local one.
    """

    __slots__ = ("shape", "coord", "placements", "global_shape")

    def __init__(self, shape, coord, placements, global_shape=None):
        self.shape = _ints(shape, "mesh shape")
        self.coord = _ints(coord, "mesh coord")
        self.placements = tuple(placements)
        self.global_shape = None if global_shape is None else _ints(global_shape, "global_shape")
        if not len(self.shape) == len(self.coord) == len(self.placements):
            raise ValueError(f"Mesh: shape {self.shape}, coord {self.coord} and placements {self.placements} "
                             "must have one entry per mesh dim")
        for p in self.placements:
            if not isinstance(p, (Shard, Replicate, Partial)):
                raise TypeError(f"Mesh: a placement must be Shard(d), Replicate() or Partial(), got {p!r}")

    def __repr__(self):
        return (f"Mesh(shape={self.shape}, coord={self.coord}, placements={list(self.placements)}, "
                f"global_shape={self.global_shape})")

    def _as_c(self, local_shape):
        global_shape = self.global_shape
        if global_shape is None:
            if any(isinstance(p, Shard) for p in self.placements):
                raise ValueError(f"{self!r} shards the tensor, so it needs global_shape= (the local shape "
                                 "does not determine it)")
            global_shape = tuple(local_shape)
        return (global_shape, self.shape, self.coord, [p._as_c() for p in self.placements], None)

    def local_box(self, global_shape=None):
        """This rank's ``(local_shape, global_offset)`` of a tensor of ``global_shape``
        (default: the mesh's own global_shape), computed by the library
        (``sa_layout_local_box``)."""
        shape = self.global_shape if global_shape is None else _ints(global_shape, "global_shape")
        if shape is None:
            raise ValueError("local_box needs a global_shape")
        layout = (shape, self.shape, self.coord, [p._as_c() for p in self.placements], None)
        status, local_shape, global_offset = _C.sa_layout_local_box(layout)
        check(status)
        return local_shape, global_offset


class Box:
    """Box form: ``Box(global_shape, global_offset)``; the shard's own shape is the local
    shape, so it covers ``[global_offset, global_offset + local_shape)``."""

    __slots__ = ("global_shape", "global_offset")

    def __init__(self, global_shape, global_offset):
        self.global_shape = _ints(global_shape, "global_shape")
        self.global_offset = _ints(global_offset, "global_offset")
        if len(self.global_shape) != len(self.global_offset):
            raise ValueError(f"Box: global_shape {self.global_shape} and global_offset {self.global_offset} "
                             "must have the same rank")

    def __repr__(self):
        return f"Box(global_shape={self.global_shape}, global_offset={self.global_offset})"

    def _as_c(self, local_shape):
        return (self.global_shape, (), (), [], self.global_offset)
