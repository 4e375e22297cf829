#!/usr/bin/env python3
"""Global gradient norm, clipping and found-inf consensus over NCCL, on 2 GPUs (not CI).

    python3 bindings/python/tests/gpu/clip_nccl.py          (starts its 2 processes)
    torchrun --nproc-per-node 2 bindings/python/tests/gpu/clip_nccl.py

One process per GPU. Rank 0 prints a PASS or FAIL line per check and a final line; the
exit status is nonzero on any failure. The checks:

1. shardadam.Optimizer with an NCCL Comm (shardadam.nccl_unique_id(), broadcast by
   torch.distributed, Comm.nccl on each rank): params split unevenly over a 2-rank mesh
   (Shard(0) with 501/500 rows, Shard(1), a 1-element param empty on rank 1, a Replicate
   param), loss-scaled grads. For norm_type 2 and inf, over 8 steps: the norm written to
   a device tensor (and once returned to the host) and the updated params match one
   float64 process on the whole tensors: torch.nn.utils.clip_grad_norm_ then
   torch.optim.AdamW (foreach=False).
2. A NaN in one grad element on rank 1 skips the step on both ranks (params, state and
   step count unchanged); found_inf set on rank 0 only does the same.
3. shardadam.torch.FusedAdam(max_grad_norm=...) over FSDP2 (fully_shard) params plus a
   Replicate DTensor: its own NCCL communicator, self.grad_norm and the params against the
   same float64 reference; found_inf on one rank skips the step on both.

Needs torch (with NCCL and FSDP2) and the shardadam package built with CUDA and NCCL.
"""
import math
import os
import socket
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (shared GPUs)
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
LOSS_SCALE = 1024.0
RTOL_NORM, RTOL, ATOL = 1e-5, 1e-5, 2e-6
# name: (global shape, placement on the 1-D mesh of 2 ranks)
PARAMS = {
    "embed.weight": ((1001, 33), ("shard", 0)),   # rows 501 / 500
    "proj.weight": ((16, 9), ("shard", 1)),       # cols 5 / 4
    "proj.bias": ((7,), ("shard", 0)),            # 4 / 3
    "logit_scale": ((1,), ("shard", 0)),          # 1 / 0: empty on rank 1
    "norm.weight": ((64,), ("replicate", None)),  # whole on both ranks, counted once
}


class Report:
    def __init__(self, rank):
        self.rank, self.failed = rank, 0

    def check(self, ok, name, detail=""):
        ok = _all_ranks(ok)
        if not ok:
            self.failed += 1
        if self.rank == 0:
            print(f"{'PASS' if ok else 'FAIL'}: {name}{'  (' + detail + ')' if detail else ''}", flush=True)
        return ok


def _all_ranks(ok):
    flag = torch.tensor([0.0 if ok else 1.0], device="cuda")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0.0


def local_box(shape, placement, rank, world):
    """This rank's slices of the global tensor, by torch.chunk (the DTensor rule)."""
    kind, dim = placement
    box = [slice(0, n) for n in shape]
    if kind == "shard":
        index = torch.arange(shape[dim])
        chunks = torch.chunk(index, world)
        if rank < len(chunks) and len(chunks[rank]):
            box[dim] = slice(int(chunks[rank][0]), int(chunks[rank][-1]) + 1)
        else:
            box[dim] = slice(0, 0)
    return tuple(box)


class Reference:
    """One float64 process on the whole tensors: clip_grad_norm_ then AdamW."""

    def __init__(self, full_params):
        self.params = {name: torch.nn.Parameter(value.double().clone()) for name, value in full_params.items()}
        self.opt = torch.optim.AdamW(self.params.values(), **HYPER, foreach=False)

    def step(self, full_grads, max_norm, norm_type):
        for name, grad in full_grads.items():
            self.params[name].grad = grad.double().clone()
        norm = torch.nn.utils.clip_grad_norm_(self.params.values(), max_norm, norm_type=norm_type)
        self.opt.step()
        return float(norm)


def random_set(gen, scale=1.0):
    return {name: scale * torch.randn(shape, generator=gen, dtype=torch.float64) for name, (shape, _) in PARAMS.items()}


def max_abs_difference(a, b):
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


# ---- 1 and 2: shardadam.Optimizer + Comm.nccl ----------------------------------------------


def native_rank(report, rank, world, comm, norm_type):
    import shardadam
    from shardadam import Mesh, Replicate, Shard

    gen = torch.Generator().manual_seed(11)
    full = {name: value.float() for name, value in random_set(gen).items()}
    reference = Reference(full)
    boxes = {name: local_box(shape, placement, rank, world) for name, (shape, placement) in PARAMS.items()}
    shards = {name: full[name][boxes[name]].contiguous().cuda() for name in PARAMS}
    grads = {name: torch.zeros_like(shard) for name, shard in shards.items()}
    stream = torch.cuda.current_stream().cuda_stream
    opt = shardadam.Optimizer(**HYPER, stream=stream)
    for name, (shape, (kind, dim)) in PARAMS.items():
        layout = Mesh((world,), (rank,), [Shard(dim) if kind == "shard" else Replicate()], global_shape=shape)
        opt.add_param(name, shards[name], layout=layout)
        opt.set_grad(name, grads[name])
    opt.set_comm(comm)
    inv_scale = torch.tensor([1.0 / LOSS_SCALE], device="cuda")
    norm_out = torch.zeros(1, device="cuda")
    label = "L2" if norm_type == 2 else "inf"
    norms_ok, worst_norm = True, 0.0
    for step, scale in enumerate([0.02, 1.0, 0.1, 3.0, 0.05, 0.5, 2.0, 0.2]):
        full_grads = {name: value.float() for name, value in random_set(gen, scale).items()}
        max_norm = 0.5 if norm_type == 2 else 0.1
        expected = reference.step(full_grads, max_norm, norm_type)
        for name in PARAMS:
            grads[name].copy_(full_grads[name][boxes[name]] * LOSS_SCALE)  # exact: a power of 2
        host = opt.step(inv_grad_scale=inv_scale, max_grad_norm=max_norm, norm_type=norm_type, grad_norm=norm_out,
                        return_norm=step == 7)
        got = float(norm_out)
        worst_norm = max(worst_norm, abs(got - expected) / expected)
        norms_ok &= math.isclose(got, expected, rel_tol=RTOL_NORM)
        if host is not None:
            norms_ok &= math.isclose(host, expected, rel_tol=RTOL_NORM)
    report.check(norms_ok, f"Comm.nccl, {label} norm: 8 steps' global norms match clip_grad_norm_ in float64",
                 f"worst relative difference {worst_norm:.1e}")
    worst, ok = 0.0, True
    for name in PARAMS:
        expected = reference.params[name].detach()[boxes[name]]
        worst = max(worst, max_abs_difference(shards[name].cpu(), expected))
        ok &= torch.allclose(shards[name].cpu().double(), expected, rtol=RTOL, atol=ATOL)
    report.check(ok and opt.param_groups[0].step == 8,
                 f"Comm.nccl, {label} norm: params (uneven, empty, replicated) match clip_grad_norm_ + AdamW (float64)",
                 f"largest absolute difference {worst:.1e}")

    # A NaN on rank 1 only: both ranks skip.
    saved = {name: shard.clone() for name, shard in shards.items()}
    saved_m = {name: torch.from_dlpack(opt.state(name, "exp_avg")).clone() for name in PARAMS}
    if rank == 1:
        grads["embed.weight"][3, 4] = float("nan")
    opt.step(inv_grad_scale=inv_scale, max_grad_norm=1.0, norm_type=norm_type, grad_norm=norm_out)
    unchanged = all(torch.equal(shards[n], saved[n]) and torch.equal(torch.from_dlpack(opt.state(n, "exp_avg")),
                                                                      saved_m[n]) for n in PARAMS)
    report.check(unchanged and opt.param_groups[0].step == 8 and not math.isfinite(float(norm_out)),
                 f"Comm.nccl, {label} norm: a NaN grad on rank 1 skips the step on both ranks")
    if rank == 1:
        grads["embed.weight"][3, 4] = 0.0
    found_inf = torch.tensor([1.0 if rank == 0 else 0.0], device="cuda")
    opt.step(inv_grad_scale=inv_scale, found_inf=found_inf)
    unchanged = all(torch.equal(shards[n], saved[n]) for n in PARAMS)
    report.check(unchanged and opt.param_groups[0].step == 8,
                 f"Comm.nccl, {label} norm: found_inf on rank 0 only skips the step on both ranks")
    opt.close()


# ---- 3: FusedAdam under FSDP2 ----------------------------------------------------------------


def fused_adam_rank(report, rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, distribute_tensor

    from shardadam.torch import FusedAdam

    mesh = init_device_mesh("cuda", (world,))
    gen = torch.Generator().manual_seed(12)
    model = torch.nn.Sequential(torch.nn.Linear(33, 1001), torch.nn.Linear(1001, 5), torch.nn.Linear(5, 1, bias=False))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    full = {name: p.detach().clone() for name, p in model.named_parameters()}
    full["extra.replicated"] = torch.randn(37, generator=gen)
    model.cuda()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    params = dict(model.named_parameters())
    params["extra.replicated"] = torch.nn.Parameter(distribute_tensor(full["extra.replicated"].cuda(), mesh,
                                                                      [Replicate()]))
    reference = Reference(full)
    max_norm = 2.0
    opt = FusedAdam(list(params.items()), **HYPER, max_grad_norm=max_norm)
    worst_norm, norms_ok = 0.0, True
    for step, scale in enumerate([0.01, 1.0, 0.1, 3.0, 0.3]):
        full_grads = {name: scale * torch.randn(value.shape, generator=gen) for name, value in full.items()}
        expected = reference.step(full_grads, max_norm, 2.0)
        for name, p in params.items():
            p.grad = distribute_tensor(full_grads[name].cuda(), p.device_mesh, p.placements)
        opt.step()
        got = float(opt.grad_norm)
        worst_norm = max(worst_norm, abs(got - expected) / expected)
        norms_ok &= math.isclose(got, expected, rel_tol=RTOL_NORM) and opt.grad_norm.is_cuda
    report.check(norms_ok and opt._comm is not None and opt._comm.kind == "nccl",
                 "FusedAdam(max_grad_norm) under FSDP2: grad_norm matches clip_grad_norm_ in float64",
                 f"worst relative difference {worst_norm:.1e}")
    worst, ok = 0.0, True
    for name, p in params.items():
        got = p.detach().full_tensor().cpu()
        expected = reference.params[name].detach()
        worst = max(worst, max_abs_difference(got, expected))
        ok &= torch.allclose(got.double(), expected, rtol=RTOL, atol=ATOL)
    report.check(ok, "FusedAdam(max_grad_norm) under FSDP2: params match clip_grad_norm_ + AdamW in float64",
                 f"largest absolute difference {worst:.1e}")
    saved = {name: p.to_local().clone() for name, p in params.items()}
    opt.step(found_inf=torch.tensor(1.0 if rank == 1 else 0.0, device="cuda"))
    unchanged = all(torch.equal(p.to_local(), saved[name]) for name, p in params.items())
    report.check(unchanged and opt.native.param_groups[0].step == 5,
                 "FusedAdam under FSDP2: found_inf on rank 1 only skips the step on both ranks")


# ---- driver ------------------------------------------------------------------------------------


def run():
    import shardadam

    rank, world = dist.get_rank(), dist.get_world_size()
    report = Report(rank)
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}, torch {torch.__version__}, {shardadam.build_info()}",
              flush=True)
    uid = [shardadam.nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    comm = shardadam.Comm.nccl(uid[0], world, rank, torch.cuda.current_device())
    report.check((comm.rank, comm.nranks, comm.kind) == (rank, world, "nccl"), "Comm.nccl: rank and size")
    for norm_type in (2, math.inf):
        native_rank(report, rank, world, comm, norm_type)
    comm.close()
    fused_adam_rank(report, rank, world)
    if rank == 0:
        print(f"{'PASS' if report.failed == 0 else 'FAIL'}: all checks ({report.failed} failed)", flush=True)
    return report.failed


def main_rank():
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    try:
        failed = run()
    finally:
        dist.destroy_process_group()
    return 1 if failed else 0


def worker(local_rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(local_rank))
    if main_rank() != 0:
        sys.exit(1)


def main():
    if "LOCAL_RANK" in os.environ:  # under torchrun
        return main_rank()
    if torch.cuda.device_count() < 2:
        print(f"FAIL: needs 2 GPUs, found {torch.cuda.device_count()}")
        return 1
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(worker, args=(2, port), nprocs=2, join=True)
    except mp.ProcessRaisedException as error:
        print(f"FAIL: a rank raised:\n{error}")
        return 1
    except mp.ProcessExitedException:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
