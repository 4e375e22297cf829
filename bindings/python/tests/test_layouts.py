"""Sharded params: every rank's optimizer updates its box, and together they give exactly
what one optimizer gives on the whole tensor (the update is elementwise). The expected
boxes come from an independent torch.chunk rule written here."""
import math

import numpy as np
import pytest

import shardadam
from shardadam import Box, Mesh, Replicate, Shard
from adam_reference import AdamReference

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05)


def expected_box(global_shape, mesh_shape, coord, placements):
    """(local_shape, global_offset) by torch.chunk along each mesh dim, left to right."""
    offset = [0] * len(global_shape)
    size = list(global_shape)
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Shard):
            dim = placement.dim % len(global_shape)
            n, k = size[dim], mesh_shape[mesh_dim]
            chunk = math.ceil(n / k)
            start = min(coord[mesh_dim] * chunk, n)
            stop = min(start + chunk, n)
            offset[dim] += start
            size[dim] = stop - start
    return tuple(size), tuple(offset)


def all_coords(mesh_shape):
    return list(np.ndindex(*mesh_shape))


LAYOUTS = {
    "10 rows over 4 ranks (3, 3, 3, 1)": ((10, 6), (4,), [Shard(0)]),
    "5 rows over 4 ranks (2, 2, 1, 0: an empty shard)": ((5, 3), (4,), [Shard(0)]),
    "2x3 mesh, both dims sharded": ((7, 8), (2, 3), [Shard(0), Shard(1)]),
    "2x2 mesh nesting one dim left to right": ((9, 4), (2, 2), [Shard(0), Shard(0)]),
    "2x2 mesh, sharded and replicated": ((6, 5), (2, 2), [Shard(-1), Replicate()]),
    "3-D tensor, last dim over 3": ((2, 3, 7), (3,), [Shard(2)]),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_mesh_shards_together_equal_the_unsharded_update(name, rng):
    global_shape, mesh_shape, placements = LAYOUTS[name]
    full = rng.standard_normal(global_shape).astype(np.float32)
    ref = AdamReference(full, **HYPER)
    ranks = []
    for coord in all_coords(mesh_shape):
        mesh = Mesh(mesh_shape, coord, placements, global_shape=global_shape)
        local_shape, offset = expected_box(global_shape, mesh_shape, coord, placements)
        assert mesh.local_box() == (local_shape, offset)
        box = tuple(slice(o, o + s) for o, s in zip(offset, local_shape))
        shard = np.ascontiguousarray(full[box])
        grad = np.zeros_like(shard)
        opt = shardadam.Optimizer(**HYPER)
        opt.add_param("layers.0.w", shard, layout=mesh)
        opt.set_grad("layers.0.w", grad)
        info = opt.param_info("layers.0.w")
        assert (info.local_shape, info.global_offset, info.global_shape) == (local_shape, offset, global_shape)
        ranks.append((opt, box, shard, grad))
    for _ in range(20):
        full_grad = rng.standard_normal(global_shape).astype(np.float32)
        ref.step(full_grad)
        for opt, box, shard, grad in ranks:
            np.copyto(grad, full_grad[box])
            opt.step()
    for opt, box, shard, grad in ranks:
        np.testing.assert_allclose(shard, ref.p[box], rtol=1e-5, atol=2e-6)
        opt.close()


def test_box_layout_for_an_engine_with_its_own_uneven_split(rng):
    """Box form: rows [0, 4) and [4, 10) of a (10, 3) tensor (not torch.chunk's split)."""
    full = rng.standard_normal((10, 3)).astype(np.float32)
    ref = AdamReference(full, **HYPER)
    ranks = []
    for start, stop in [(0, 4), (4, 10)]:
        shard = full[start:stop].copy()
        grad = np.zeros_like(shard)
        opt = shardadam.Optimizer(**HYPER)
        opt.add_param("w", shard, layout=Box((10, 3), (start, 0)))
        opt.set_grad("w", grad)
        assert opt.param_info("w").global_offset == (start, 0)
        ranks.append((opt, slice(start, stop), shard, grad))
    for _ in range(20):
        full_grad = rng.standard_normal(full.shape).astype(np.float32)
        ref.step(full_grad)
        for opt, rows, shard, grad in ranks:
            np.copyto(grad, full_grad[rows])
            opt.step()
    for opt, rows, shard, grad in ranks:
        np.testing.assert_allclose(shard, ref.p[rows], rtol=1e-5, atol=2e-6)
        opt.close()


def test_replicated_mesh_needs_no_global_shape():
    """Without Shard placements the global shape is the local one."""
    with shardadam.Optimizer() as opt:
        opt.add_param("b", np.zeros(4, np.float32), layout=Mesh((2,), (1,), [Replicate()]))
        assert opt.param_info("b").global_shape == (4,)


def test_sharded_mesh_without_global_shape_is_refused():
    with shardadam.Optimizer() as opt, pytest.raises(ValueError, match="global_shape"):
        opt.add_param("w", np.zeros(4, np.float32), layout=Mesh((2,), (0,), [Shard(0)]))
