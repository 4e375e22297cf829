"""Global gradient norm, clipping and found-inf consensus across ranks through a host
communicator: 4 ranks as Python threads whose all_reduce meets at a threading.Barrier.

Together the ranks must give what one float64 Adam gives on the whole tensors after
torch.nn.utils.clip_grad_norm_'s rule (written here from its definition): the norm over
every element once (a replicated shard counts once), coef = min(1, max / (norm + 1e-6)).
"""
import gc
import math
import threading
import weakref

import numpy as np
import pytest

import shardadam
from shardadam import Mesh, Replicate, Shard
from adam_reference import AdamReference
from test_layouts import expected_box

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05)
MESH_SHAPE = (2, 2)
# Uneven shards, an empty shard, a shard replicated along one mesh dim, a fully replicated param.
PARAMS = {
    "layers.0.w": ((10, 7), [Shard(0), Shard(1)]),      # rows 5/5, cols 4/3
    "layers.0.b": ((5,), [Shard(0), Replicate()]),       # 3/2, each held by two ranks
    "embed": ((3, 5), [Shard(0), Shard(0)]),             # rows (1, 1) and (1, 0): an empty shard
    "head": ((3, 4), [Replicate(), Replicate()]),        # held whole by all four ranks
}
COORDS = list(np.ndindex(*MESH_SHAPE))


class ThreadGroup:
    """n ranks in one process: all_reduce_for(rank) is rank's host all_reduce. Every rank
    reduces all ranks' values in rank order, so all get bitwise the same result."""

    def __init__(self, n):
        self.barrier = threading.Barrier(n, timeout=60)
        self.slots = [None] * n
        self.calls = [0] * n

    def all_reduce_for(self, rank):
        def all_reduce(values, op):
            assert values.dtype == np.float64 and values.flags.writeable
            self.calls[rank] += 1
            self.slots[rank] = values.copy()
            self.barrier.wait()
            stacked = np.stack(self.slots)
            result = stacked.sum(axis=0) if op == "sum" else stacked.max(axis=0)
            self.barrier.wait()  # nobody overwrites a slot before everyone has read them all
            values[:] = result
        return all_reduce


    def all_to_all_for(self, rank):
        def all_to_all(send, send_counts, recv, recv_counts):
            assert send.dtype == recv.dtype == np.uint8 and recv.flags.writeable
            self.calls[rank] += 1
            self.slots[rank] = (send.copy(), list(send_counts), list(recv_counts))
            self.barrier.wait()
            blocks = []
            for sender, (data, counts, _) in enumerate(self.slots):
                assert counts[rank] == recv_counts[sender]
                start = sum(counts[:rank])
                blocks.append(data[start:start + counts[rank]])
            self.barrier.wait()
            recv[:] = np.concatenate(blocks)
        return all_to_all


def run_ranks(n, body):
    """body(rank) on n threads; returns their results, or raises the first failure."""
    results, errors = [None] * n, [None] * n

    def run(rank):
        try:
            results[rank] = body(rank)
        except BaseException as error:  # noqa: B036 (handed to the main thread)
            errors[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for error in errors:
        if error is not None:
            raise error
    return results


class Rank:
    """One rank's optimizer over its boxes of PARAMS, with grads bound to buffers."""

    def __init__(self, rank, full, group, comm=True):
        self.coord = COORDS[rank]
        self.opt = shardadam.Optimizer(**HYPER, num_threads=1)
        self.boxes, self.shards, self.grads = {}, {}, {}
        for name, (shape, placements) in PARAMS.items():
            local_shape, offset = expected_box(shape, MESH_SHAPE, self.coord, placements)
            box = tuple(slice(o, o + s) for o, s in zip(offset, local_shape))
            self.boxes[name] = box
            self.shards[name] = full[name][box].copy()  # a replica of its own, as on separate hosts
            self.grads[name] = np.zeros_like(self.shards[name])
            self.opt.add_param(name, self.shards[name], layout=Mesh(MESH_SHAPE, self.coord, placements,
                                                                    global_shape=shape))
            self.opt.set_grad(name, self.grads[name])
        if comm:
            self.comm = shardadam.Comm(group.all_reduce_for(rank))
            self.opt.set_comm(self.comm)

    def load_grads(self, full_grads):
        for name, grad in self.grads.items():
            np.copyto(grad, full_grads[name][self.boxes[name]])


def make_ranks(full):
    """Every rank of the mesh over the full params `full`, joined by one ThreadGroup."""
    group = ThreadGroup(len(COORDS))
    return group, [Rank(rank, full, group) for rank in range(len(COORDS))]


def global_norm(grads, norm_type):
    if norm_type == 2:
        return math.sqrt(sum(float(np.sum(np.asarray(g, np.float64) ** 2)) for g in grads.values()))
    return max(float(np.max(np.abs(g))) if g.size else 0.0 for g in grads.values())


def random_params(rng):
    return {name: rng.standard_normal(shape).astype(np.float32) for name, (shape, _) in PARAMS.items()}


def random_grads(rng, scale):
    return {name: (scale * rng.standard_normal(shape)).astype(np.float32) for name, (shape, _) in PARAMS.items()}


@pytest.mark.parametrize("norm_type", [2, math.inf])
def test_four_ranks_clip_by_the_global_norm_of_the_whole_tensors(norm_type, rng):
    full = random_params(rng)
    refs = {name: AdamReference(value, **HYPER) for name, value in full.items()}
    group, ranks = make_ranks(full)
    max_norm, loss_scale = 1.5, 64.0
    # Grad scales around max_norm: some steps are clipped, some not.
    for step, scale in enumerate([0.05, 1.0, 0.2, 3.0, 0.02, 0.5, 2.0, 0.1]):
        full_grads = random_grads(rng, scale * loss_scale)
        norm = global_norm(full_grads, norm_type) / loss_scale
        coef = min(1.0, max_norm / (norm + 1e-6))
        for name, ref in refs.items():
            ref.step(full_grads[name], inv_grad_scale=coef / loss_scale)
        for r in ranks:
            r.load_grads(full_grads)
        norms = run_ranks(len(ranks), lambda i: ranks[i].opt.step(
            inv_grad_scale=1.0 / loss_scale, max_grad_norm=max_norm, norm_type=norm_type, return_norm=True))
        for rank_norm in norms:
            assert rank_norm == pytest.approx(norm, rel=1e-5), f"step {step}"
        assert norms.count(norms[0]) == len(norms), "every rank reports the same norm"
    for r in ranks:
        assert r.opt.param_groups[0].step == 8
        for name, shard in r.shards.items():
            np.testing.assert_allclose(shard, refs[name].p[r.boxes[name]], rtol=1e-5, atol=2e-6,
                                       err_msg=f"{name} on rank {r.coord}")
    assert group.calls[0] >= 8  # the ranks did talk
    for r in ranks:
        r.opt.close()


def test_the_norm_is_written_into_a_grad_norm_array_without_return_norm(rng):
    full = random_params(rng)
    group, ranks = make_ranks(full)
    full_grads = random_grads(rng, 1.0)
    for r in ranks:
        r.load_grads(full_grads)
    outs = [np.full(1, -1.0, np.float32) for _ in ranks]
    results = run_ranks(len(ranks), lambda i: ranks[i].opt.step(max_grad_norm=math.inf, grad_norm=outs[i]))
    assert results == [None] * len(ranks)
    for out in outs:
        assert float(out[0]) == pytest.approx(global_norm(full_grads, 2), rel=1e-5)


def test_a_nan_grad_on_one_rank_skips_the_step_on_every_rank(rng):
    full = random_params(rng)
    group, ranks = make_ranks(full)
    full_grads = random_grads(rng, 1.0)
    for r in ranks:
        r.load_grads(full_grads)
    ranks[3].grads["layers.0.w"].flat[2] = np.nan  # only rank (1, 1) sees it
    before = [{name: shard.copy() for name, shard in r.shards.items()} for r in ranks]
    outcomes = run_ranks(len(ranks), lambda i: ranks[i].opt.step(max_grad_norm=1.0, return_norm=True,
                                                                   return_skipped=True))
    assert all(math.isnan(norm) and skipped for norm, skipped in outcomes)
    for r, saved in zip(ranks, before):
        assert r.opt.param_groups[0].step == 0
        for name, shard in r.shards.items():
            np.testing.assert_array_equal(shard, saved[name], err_msg=f"{name} on rank {r.coord}")
            assert not np.any(np.from_dlpack(r.opt.state(name, "exp_avg")))
    # The next, finite step goes ahead everywhere.
    for r in ranks:
        r.load_grads(full_grads)
    run_ranks(len(ranks), lambda i: ranks[i].opt.step(max_grad_norm=1.0))
    assert [r.opt.param_groups[0].step for r in ranks] == [1] * len(ranks)


def test_found_inf_on_one_rank_skips_the_step_on_every_rank(rng):
    full = random_params(rng)
    group, ranks = make_ranks(full)
    full_grads = random_grads(rng, 1.0)
    for r in ranks:
        r.load_grads(full_grads)
    before = [{name: shard.copy() for name, shard in r.shards.items()} for r in ranks]
    skipped = run_ranks(len(ranks), lambda i: ranks[i].opt.step(found_inf=1.0 if i == 1 else 0.0,
                                                                  return_skipped=True))
    assert skipped == [True] * len(ranks)
    for r, saved in zip(ranks, before):
        assert r.opt.param_groups[0].step == 0
        for name, shard in r.shards.items():
            np.testing.assert_array_equal(shard, saved[name])
    skipped = run_ranks(len(ranks), lambda i: ranks[i].opt.step(found_inf=0.0, return_skipped=True))
    assert skipped == [False] * len(ranks)
    assert [r.opt.param_groups[0].step for r in ranks] == [1] * len(ranks)


def test_an_all_reduce_that_raises_fails_the_step_with_its_error_and_changes_nothing(rng):
    full = random_params(rng)
    group, ranks = make_ranks(full)

    def broken_all_reduce(values, op):
        group.barrier.abort()  # the other ranks' waits fail too, as a real transport would
        raise ConnectionError("rank 2 lost its transport")

    ranks[2].opt.set_comm(shardadam.Comm(broken_all_reduce))
    full_grads = random_grads(rng, 1.0)
    for r in ranks:
        r.load_grads(full_grads)
    before = [{name: shard.copy() for name, shard in r.shards.items()} for r in ranks]
    errors = [None] * len(ranks)

    def step(i):
        try:
            ranks[i].opt.step(max_grad_norm=1.0)
        except shardadam.CommError as error:
            errors[i] = error

    run_ranks(len(ranks), step)
    assert all(isinstance(e, shardadam.CommError) for e in errors), errors
    assert "rank 2 lost its transport" in str(errors[2]) and "ConnectionError" in str(errors[2])
    assert isinstance(errors[2].__cause__, ConnectionError)
    assert isinstance(errors[0].__cause__, threading.BrokenBarrierError)
    for r, saved in zip(ranks, before):
        assert r.opt.param_groups[0].step == 0
        for name, shard in r.shards.items():
            np.testing.assert_array_equal(shard, saved[name])


def test_a_callable_returning_something_else_than_none_is_an_error(rng):
    with shardadam.Optimizer(**HYPER) as opt:
        opt.add_param("w", np.ones(4, np.float32))
        opt.set_grad("w", np.ones(4, np.float32))
        opt.set_comm(shardadam.Comm(lambda values, op: 0.0))
        with pytest.raises(shardadam.CommError, match="in place"):
            opt.step(max_grad_norm=1.0)
        assert opt.param_groups[0].step == 0


def test_without_a_comm_the_norm_is_this_ranks(rng):
    w, g = rng.standard_normal((7, 3)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
    ref = AdamReference(w, **HYPER)
    with shardadam.Optimizer(**HYPER) as opt:
        opt.add_param("w", w)
        opt.set_grad("w", g)
        norm = float(np.linalg.norm(g.astype(np.float64)))
        assert opt.step(max_grad_norm=0.5, return_norm=True) == pytest.approx(norm, rel=1e-6)
        ref.step(g, inv_grad_scale=min(1.0, 0.5 / (norm + 1e-6)))
        np.testing.assert_allclose(w, ref.p, rtol=1e-5, atol=2e-6)
        assert opt.step(norm_type="inf", return_norm=True) == pytest.approx(float(np.abs(g).max()))


def test_clip_arguments_are_checked():
    with shardadam.Optimizer() as opt:
        opt.add_param("w", np.ones(4, np.float32))
        opt.set_grad("w", np.ones(4, np.float32))
        for bad in (0.0, -1.0, math.nan):
            with pytest.raises(shardadam.InvalidArgument, match="max_grad_norm"):
                opt.step(max_grad_norm=bad)
        with pytest.raises(shardadam.InvalidArgument, match="norm_type"):
            opt.step(max_grad_norm=1.0, norm_type=1)
        with pytest.raises(TypeError, match="grad_norm"):
            opt.step(grad_norm=1.0)
        read_only = np.zeros(1, np.float32)
        read_only.flags.writeable = False
        with pytest.raises(shardadam.InvalidArgument, match="grad_norm"):
            opt.step(grad_norm=read_only)
        with pytest.raises(shardadam.InvalidArgument, match="grad_norm"):
            opt.step(grad_norm=np.zeros(1, np.float64))
        with pytest.raises(TypeError, match="Comm"):
            opt.set_comm(lambda values, op: None)
        assert opt.param_groups[0].step == 0


def test_a_host_comm_keeps_its_callable_alive_while_the_library_holds_it():
    class AllReduce:
        def __call__(self, values, op):
            pass  # one rank: the values are already the reduction

    all_reduce = AllReduce()
    alive = weakref.ref(all_reduce)
    opt = shardadam.Optimizer()
    opt.add_param("w", np.ones(4, np.float32))
    opt.set_grad("w", np.ones(4, np.float32))
    comm = shardadam.Comm(all_reduce)
    assert (comm.rank, comm.nranks, comm.kind) == (None, None, "host")
    opt.set_comm(comm)
    del all_reduce
    comm.close()
    opt._comm = None  # only the library's reference is left
    del comm
    gc.collect()
    assert alive() is not None
    assert opt.step(max_grad_norm=1.0, return_norm=True) == pytest.approx(2.0)
    opt.close()
    gc.collect()
    assert alive() is None


def test_a_closed_comm_is_refused():
    comm = shardadam.Comm(lambda values, op: None)
    comm.close()
    comm.close()
    with shardadam.Optimizer() as opt, pytest.raises(shardadam.StateError, match="closed"):
        opt.set_comm(comm)


def test_nccl_unique_id_is_128_bytes_or_unsupported():
    try:
        uid = shardadam.nccl_unique_id()
    except shardadam.Unsupported as error:
        assert "NCCL" in str(error) or "nccl" in str(error)
        return
    assert isinstance(uid, bytes) and len(uid) == 128
    with pytest.raises(ValueError, match="128 bytes"):
        shardadam.Comm.nccl(uid[:100], 1, 0, 0)


def test_a_host_comm_may_say_its_rank_and_the_library_checks_it():
    def noop(values, op):
        return None

    assert shardadam.Comm(noop).rank is None
    ranked = shardadam.Comm(noop, rank=1, nranks=3)
    assert (ranked.rank, ranked.nranks) == (1, 3)
    for rank, nranks in ((3, 3), (-1, 2), (1, 0)):
        with pytest.raises(shardadam.InvalidArgument, match="0 <= rank < nranks"):
            shardadam.Comm(noop, rank=rank, nranks=nranks)
    with pytest.raises(TypeError, match="together"):
        shardadam.Comm(noop, rank=0)


# Muon matrices split over the (2, 2) mesh: a TP x FSDP grid, HSDP rows (replicated along the
# first mesh dim), and rows of which one rank holds none.
MUON_PARAMS = {
    "attn.w": ((9, 7), [Shard(1), Shard(0)]),
    "mlp.w": ((6, 5), [Replicate(), Shard(0)]),
    "embed.w": ((3, 4), [Shard(0), Shard(0)]),
}
MUON_HYPER = dict(update_rule="muon", lr=0.02, momentum=0.95, weight_decay=0.01)


@pytest.mark.parametrize("all_to_all", [True, False], ids=["all_to_all", "through_all_reduce"])
def test_split_muon_matrices_step_through_a_ranked_comm_as_one_rank_does(all_to_all, rng):
    """Each split matrix goes to one owner rank and back, through the Comm's all_to_all
    (or, without one, its all_reduce): every rank's boxes end as one rank stepping the whole
    matrices does, bit for bit."""
    full = {name: rng.standard_normal(shape).astype(np.float32) for name, (shape, _) in MUON_PARAMS.items()}
    grads = [{name: (0.1 * rng.standard_normal(shape)).astype(np.float32)
              for name, (shape, _) in MUON_PARAMS.items()} for _ in range(3)]
    one = shardadam.Optimizer(**MUON_HYPER, num_threads=1)
    whole = {name: value.copy() for name, value in full.items()}
    whole_grads = {name: np.zeros_like(value) for name, value in full.items()}
    for name in MUON_PARAMS:
        one.add_param(name, whole[name])
        one.set_grad(name, whole_grads[name])
    for step_grads in grads:
        for name, grad in step_grads.items():
            np.copyto(whole_grads[name], grad)
        one.step()

    group = ThreadGroup(len(COORDS))

    def body(rank):
        coord = COORDS[rank]
        opt = shardadam.Optimizer(**MUON_HYPER, num_threads=1)
        shards, shard_grads, boxes = {}, {}, {}
        for name, (shape, placements) in MUON_PARAMS.items():
            local_shape, offset = expected_box(shape, MESH_SHAPE, coord, placements)
            boxes[name] = tuple(slice(o, o + s) for o, s in zip(offset, local_shape))
            shards[name] = full[name][boxes[name]].copy()
            shard_grads[name] = np.zeros_like(shards[name])
        opt.set_comm(shardadam.Comm(group.all_reduce_for(rank), rank=rank, nranks=len(COORDS),
                                    all_to_all=group.all_to_all_for(rank) if all_to_all else None))
        for name, (shape, placements) in MUON_PARAMS.items():
            opt.add_param(name, shards[name], layout=Mesh(MESH_SHAPE, coord, placements, global_shape=shape))
            opt.set_grad(name, shard_grads[name])
        for step_grads in grads:
            for name, grad in step_grads.items():
                np.copyto(shard_grads[name], grad[boxes[name]])
            opt.step()
        return {name: (boxes[name], shards[name]) for name in MUON_PARAMS}

    for rank, result in enumerate(run_ranks(len(COORDS), body)):
        for name, (box, shard) in result.items():
            np.testing.assert_array_equal(shard, whole[name][box], err_msg=f"rank {rank}, {name}")
    assert all(calls > 0 for calls in group.calls)


def test_a_comm_all_to_all_that_raises_fails_the_step_with_its_error():
    def all_to_all(send, send_counts, recv, recv_counts):
        raise ConnectionError("peer 1 went away")

    def all_reduce(values, op):
        # Rank 0 of 2, alone: the first step's table of the ranks' boxes of the 4 x 4 matrix
        # gets rank 1's row (a 1, then rows, cols, row0, col0, box rows, box cols) as if it
        # had come; the other reductions are this rank's own.
        if op == "sum" and len(values) == 14:
            values[7:] = [1, 4, 4, 2, 0, 2, 4]

    with pytest.raises(TypeError, match="with rank and nranks"):
        shardadam.Comm(all_reduce, all_to_all=all_to_all)
    opt = shardadam.Optimizer(**MUON_HYPER, num_threads=1)
    opt.set_comm(shardadam.Comm(all_reduce, rank=0, nranks=2, all_to_all=all_to_all))
    shard, grad = np.ones((2, 4), np.float32), np.full((2, 4), 0.1, np.float32)
    opt.add_param("w", shard, layout=Mesh((2,), (0,), [Shard(0)], global_shape=(4, 4)))
    opt.set_grad("w", grad)
    with pytest.raises(shardadam.CommError, match="all_to_all.*peer 1 went away") as caught:
        opt.step()
    assert isinstance(caught.value.__cause__, ConnectionError)
