"""Current scaling across ranks through FusedAdam: 3 gloo CPU processes, float8_e4m3fn
DTensor params sharded Shard(0) over a 1-D mesh (``w``: 5 rows, 2 + 2 + 1; ``e``: 2 rows,
1 + 1 + 0, so rank 2's shard is empty), FusedAdam(fp8={p: Fp8(scaling, scale, amax)}).

Every rank also steps a float32 FusedAdam over the whole tensors (no sharding, the same
grads): the twin. After each step every rank checks, against torch arithmetic on the twin:
its master is its rows of the twin's param bit for bit; its scale is [fp8_max / amax,
1 / that] of the whole tensor (pow2: rounded down to a power of two by torch.frexp), on the
empty shard too; its amax tensor holds the whole tensor's amax; its codes are torch's cast
of master * scale (clamped first: torch's casts do not saturate).

    python fp8_current_ranks.py [--scaling current|current_pow2]

Prints one PASS line per rank, and exits 0 when every rank passed (mp.spawn raises
otherwise). Run by test_torch_fp8_params.py.
"""
import argparse
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from shardadam.torch import Fp8, FusedAdam

WORLD = 3
SHAPES = {"w": (5, 64), "e": (2, 32)}
HYPER = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05, num_threads=1)
LARGEST = 448.0  # float8_e4m3fn


def fp8(x):
    return x.to(torch.float32).clamp(-LARGEST, LARGEST).to(torch.float8_e4m3fn)


def rows_of(tensor, rank):
    chunks = tensor.chunk(WORLD)
    return chunks[rank] if rank < len(chunks) else tensor[:0]


def as_dtensor(local, mesh, shape):
    return DTensor.from_local(local.contiguous(), mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                              stride=(shape[1], 1))


def worker(rank, port, scaling):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    gen = torch.Generator().manual_seed(7)  # the same whole tensors and grads on every rank
    codes = {name: fp8(torch.randn(shape, generator=gen) * 30) for name, shape in SHAPES.items()}
    params, twins, fp8_specs = {}, {}, {}
    for name, shape in SHAPES.items():
        param = torch.nn.Parameter(as_dtensor(rows_of(codes[name], rank), mesh, shape), requires_grad=True)
        spec = Fp8(scaling, torch.tensor([4.0, 0.25]), torch.zeros(1))  # the codes stand for value * 0.25
        params[name], fp8_specs[param] = param, spec
        twins[name] = torch.nn.Parameter(codes[name].to(torch.float32) * 0.25)
    opt = FusedAdam(list(params.values()), fp8=fp8_specs, **HYPER)
    ref = FusedAdam(list(twins.values()), **HYPER)
    for step in range(3):
        for name, shape in SHAPES.items():
            grad = torch.randn(shape, generator=gen) * (1e3 if step == 1 else 1.0)
            params[name].grad = as_dtensor(rows_of(grad, rank), mesh, shape)
            twins[name].grad = grad.clone()
        opt.step()
        ref.step()
        for name, param in params.items():
            whole = twins[name].detach()
            master = opt.state[param]["master"]
            master = master.to_local() if isinstance(master, DTensor) else master
            assert torch.equal(master.view(torch.int32), rows_of(whole, rank).view(torch.int32)), (name, step)
            amax = whole.abs().max()
            want = torch.tensor(LARGEST, dtype=torch.float32) / amax
            if scaling == "current_pow2":
                want = torch.ldexp(torch.ones(()), torch.frexp(want).exponent - 1)
            spec = fp8_specs[param]
            assert spec.amax.item() == amax.item(), (name, step, spec.amax.item(), amax.item())
            assert spec.scale[0].item() == want.item(), (name, step, spec.scale[0].item(), want.item())
            assert spec.scale[1].item() == (1 / want).item(), (name, step)
            local = param.to_local().detach()
            assert torch.equal(local.view(torch.uint8), fp8(master * want).view(torch.uint8)), (name, step)
    print(f"PASS rank {rank}: {scaling}, 3 steps, shards {[tuple(p.to_local().shape) for p in params.values()]}",
          flush=True)
    dist.barrier()  # no rank tears its group down while another is still in a collective
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scaling", choices=("current", "current_pow2"), default="current")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, args.scaling), nprocs=WORLD)


if __name__ == "__main__":
    main()
