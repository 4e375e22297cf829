"""shardadam.torch.Muon over FSDP2 (fully_shard) on 2 gloo ranks: the matrices are DTensors
split by rows (unevenly: 7 rows over 2 ranks), and each step must leave them as the same
Muon leaves the unsharded model, bit for bit (the whole directions are summed from the
ranks' boxes, and each rank runs the same float32 Newton-Schulz), and within bfloat16's
tolerance of torch.optim.Muon on the full tensors. Both ranks see the same batch, so FSDP2's
averaged grads are the unsharded model's exactly. Then torch.distributed.checkpoint: saved
on the 2 ranks, loaded by 1 (a model of another init), whose next steps' losses are the
uninterrupted run's. Skipped visibly without torch, torch.distributed or torch.optim.Muon."""
import copy
import os
import socket

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch was built without torch.distributed", allow_module_level=True)
if not hasattr(torch.optim, "Muon"):
    pytest.skip("torch.optim.Muon needs torch >= 2.9", allow_module_level=True)

HYPER = dict(lr=0.02, momentum=0.9, weight_decay=0.1)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 7, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(7, 9, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(9, 3, bias=False))


def train_step(m, opt, step):
    gen = torch.Generator().manual_seed(step)
    x, y = torch.randn(16, 12, generator=gen), torch.randn(16, 3, generator=gen)
    torch.nn.functional.mse_loss(m(x), y).backward()
    opt.step()
    opt.zero_grad()


def loss_of(m, step):
    gen = torch.Generator().manual_seed(step)
    x, y = torch.randn(16, 12, generator=gen), torch.randn(16, 3, generator=gen)
    return torch.nn.functional.mse_loss(m(x), y)


def shard(m, mesh):
    from torch.distributed.fsdp import fully_shard
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def checkpoint_rank(rank, world, port, directory, phase):
    """phase "save" (2 ranks): 2 steps, a DCP save, 2 more steps whose losses rank 0 writes;
    phase "load" (1 rank): another init, the DCP load, the same 2 steps, losses written."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from shardadam.torch import Muon
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        if phase == "load":
            torch.manual_seed(5)  # another init: everything must come from the checkpoint
        m = shard(model() if phase == "save" else torch.nn.Sequential(*list(model())), init_device_mesh("cpu", (world,)))
        if phase == "load":
            with torch.no_grad():
                for p in m.parameters():
                    p.mul_(0.5)
        opt = Muon(m.parameters(), **HYPER)
        if phase == "save":
            for step in range(2):
                loss_of(m, step).backward()
                opt.step()
                opt.zero_grad()
            dcp.save({"model": get_model_state_dict(m), "optim": get_optimizer_state_dict(m, opt)},
                     checkpoint_id=directory)
        else:
            state = {"model": get_model_state_dict(m), "optim": get_optimizer_state_dict(m, opt)}
            dcp.load(state, checkpoint_id=directory)
            set_model_state_dict(m, state["model"])
            set_optimizer_state_dict(m, opt, state["optim"])
        losses = []
        for step in range(2, 4):
            loss = loss_of(m, step)
            losses.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad()
        if rank == 0:
            with open(os.path.join(directory, f"losses.{phase}"), "w") as f:
                f.write(" ".join(repr(v) for v in losses))
    except BaseException:
        dist.destroy_process_group()
        raise  # start_processes reports it
    dist.barrier()
    dist.destroy_process_group()
    # The results are on disk: leave without the interpreter's exit. A rank of this phase
    # aborted there 4 runs in 44 ("terminate called without an active exception"). The core
    # dump shows why: gloo's worker thread destroys the barrier's work, which holds an
    # all-reduce still in flight when the barrier began; that drops the last reference to a
    # tensor whose Python object had died, so the thread takes the GIL while the interpreter
    # is exiting, and is ended inside a destructor. The optimizer's communicator now keeps its
    # tensors (_ProcessGroupAllReduce), which took it to 3 runs in 100; the rest are the same
    # race with tensors torch makes (FSDP2's collectives, whose last one comes soon before the
    # barrier when the step is fast). torch.optim.Muon in the optimizer's place: 0 in 44.
    os._exit(0)


def rank_main(rank, world, port):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from shardadam.torch import Muon
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        sharded, plain, theirs = model(), model(), model()
        for layer in sharded:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        opt = Muon(sharded.parameters(), **HYPER)
        assert opt._comm is not None, "a split Muon matrix gets a communicator"
        # ... whose ranks are said and whose all_to_all carries the boxes to their owners.
        assert (opt._comm.rank, opt._comm.nranks) == (dist.get_rank(), 2)
        assert opt._comm._reducer.all_to_all is not None
        ref = Muon(plain.parameters(), **HYPER)
        torch_ref = torch.optim.Muon(theirs.parameters(), **HYPER)
        for step in range(3):
            for m, o in ((sharded, opt), (plain, ref), (theirs, torch_ref)):
                train_step(m, o, step)
        for (name, p), q, t in zip(sharded.named_parameters(), plain.parameters(), theirs.parameters()):
            full = p.full_tensor().detach()
            assert torch.equal(full, q.detach()), f"{name}: sharded Muon differs from unsharded Muon"
            assert (full - t.detach()).abs().max() < 3 * 0.02 * 1.2 * 0.06, f"{name}: far from torch.optim.Muon"
            assert not torch.equal(full, copy.deepcopy(model()).state_dict()[name]), f"{name} did not move"
            local = opt.state[p]["momentum_buffer"]
            assert torch.equal(local.full_tensor(), ref.state[q]["momentum_buffer"]), f"{name}: momentum_buffer"
    finally:
        # Every rank past its last collective before any tears the group down: a gloo peer
        # destroyed under a collective still finishing elsewhere aborts that other rank.
        dist.barrier()
        dist.destroy_process_group()
    # Every check passed: leave without the interpreter's exit, which gloo's worker thread can
    # abort (checkpoint_rank's comment says how; this test hit it once in CI, at 8af352d).
    os._exit(0)


def test_fsdp2_sharded_muon_equals_unsharded_muon_on_2_gloo_ranks():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    os.environ.update(env)
    torch.multiprocessing.start_processes(rank_main, args=(2, port), nprocs=2, start_method="spawn")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp2_muon_checkpoint_saved_on_2_ranks_resumes_on_1(tmp_path):
    os.environ["OMP_NUM_THREADS"] = "1"
    directory = str(tmp_path / "ckpt")
    for phase, world in (("save", 2), ("load", 1)):
        torch.multiprocessing.start_processes(checkpoint_rank, args=(world, free_port(), directory, phase),
                                              nprocs=world, start_method="spawn")
    saved = [float(v) for v in (tmp_path / "ckpt" / "losses.save").read_text().split()]
    loaded = [float(v) for v in (tmp_path / "ckpt" / "losses.load").read_text().split()]
    # The same batches on every rank: the 2-rank run's grads are the 1-rank run's.
    assert loaded == pytest.approx(saved, rel=1e-6), (saved, loaded)


def test_the_gloo_communicator_keeps_the_tensors_it_reduces(monkeypatch):
    """The reducer of FusedAdam's gloo communicator hands torch.distributed one tensor per
    length, kept as long as the communicator (see _ProcessGroupAllReduce): gloo's thread may
    drop its last reference to a collective's tensor after all_reduce returned, and had the
    Python object died by then, that drop takes the GIL on gloo's thread, which aborts the
    process at the interpreter's exit."""
    import numpy as np
    import torch.distributed as dist
    from shardadam._torch_fused_adam import _ProcessGroupAllReduce
    seen = []

    def fake_all_reduce(tensor, op=None, group=None):
        seen.append(tensor)
        tensor.mul_(2)  # as a sum over two ranks holding the same values

    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    reducer = _ProcessGroupAllReduce(dist.group.WORLD)
    for n in (3, 5, 3):
        values = np.arange(n, dtype=np.float64)
        reducer(values, "sum")
        assert values.tolist() == [2.0 * i for i in range(n)]
    assert seen[0] is seen[2] and seen[0] is not seen[1]
    del seen
    assert sorted(len(t) for t in reducer._tensors.values()) == [3, 5]


def test_the_gloo_communicators_all_to_all_hands_torch_the_bytes_and_their_sizes(monkeypatch):
    """all_to_all_single's arguments: output then input (uint8), output_split_sizes the bytes
    received, input_split_sizes the bytes sent; the tensors kept, as all_reduce's."""
    import numpy as np
    import torch.distributed as dist
    from shardadam._torch_fused_adam import _ProcessGroupAllReduce
    seen = []

    def fake_all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None):
        seen.append((output, input, output_split_sizes, input_split_sizes))
        output.copy_(input.flip(0)[:len(output)])  # a stand-in exchange: every value moved

    monkeypatch.setattr(dist, "all_to_all_single", fake_all_to_all_single)
    collectives = _ProcessGroupAllReduce(dist.group.WORLD)
    send, recv = np.arange(5, dtype=np.uint8), np.zeros(3, np.uint8)
    collectives.all_to_all(send, [0, 2, 3], recv, [0, 1, 2])
    assert recv.tolist() == [4, 3, 2]
    output, input, received, sent = seen[0]
    assert (len(output), len(input), received, sent) == (3, 5, [0, 1, 2], [0, 2, 3])
    collectives.all_to_all(send, [0, 2, 3], recv, [0, 1, 2])
    assert seen[1][0] is output and seen[1][1] is input
