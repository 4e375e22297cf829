#!/usr/bin/env python3
"""bench/clip_step.py — a clipped optimizer step on 2 GPUs: shardadam against torch, in one run.

The 1516-shard fp32 set of bench/gpu_step.py (shard_sizes()), each a 1-D global tensor,
is split over 2 ranks as FSDP2-style DTensors (Shard(0) on a 2-rank mesh). Per step:

    torch:      torch.nn.utils.clip_grad_norm_(params, max_norm) + torch.optim.AdamW(fused=True)
    shardadam:  shardadam.torch.FusedAdam(max_grad_norm=max_norm) (the global norm through
                its NCCL communicator, the clip applied inside the update)

both over the same DTensors' local shards (separate copies of params, grads and states).
After warm-up it times --steps steps back to back, with CUDA events and with the wall
clock (one synchronize at the end), and prints per-step ms for both, the ratio, and the
bandwidth limit of a clipped step: 28 B/param for the Adam step plus 4 B/param for one
read of the grads (the norm), at the device-to-device copy bandwidth measured in the
same run (bench/gpu_step.py's copy_gbps), and shardadam's fraction of it. Times are the
slower rank's.

Usage (2 GPUs; starts its 2 processes itself, or runs under torchrun):

    python3 bench/clip_step.py [--quick] [--steps 50]
    torchrun --nproc-per-node 2 bench/clip_step.py [--quick]

Needs torch (with torch.distributed and NCCL) and the shardadam package built with CUDA.
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_step import copy_gbps, shard_sizes  # noqa: E402 (the same shard set and copy bandwidth)

# NVLink multicast stays off (it can take shared GPUs out of service); see the device notes.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
BYTES_PER_PARAM = 28 + 4  # the fp32 Adam step (r p,g,m,v  w p,m,v) + one read of the grads for the norm


def sharded_set(sizes, mesh, rank, seed):
    """(params, grads): one Shard(0) DTensor per size, the same global values on every rank."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    gen = torch.Generator(device="cuda").manual_seed(seed)
    params, grads = [], []
    for n in sizes:
        full_param = torch.randn(n, device="cuda", generator=gen)
        full_grad = torch.randn(n, device="cuda", generator=gen)
        pair = []
        for full in (full_param, full_grad):
            # Every rank already holds the global values: no scatter, just this rank's chunk.
            local = distribute_tensor(full, mesh, [Shard(0)], src_data_rank=None).to_local().clone()
            pair.append(DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=full.shape,
                                           stride=full.stride()))
        params.append(torch.nn.Parameter(pair[0]))
        grads.append(pair[1])
    return params, grads


def time_steps(step, steps, warmup):
    """(CUDA-event ms per step, wall ms per step) of `steps` steps back to back."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    return start.elapsed_time(end) / steps, wall


def slowest(values):
    """Element-wise max over the ranks."""
    tensor = torch.tensor(values, dtype=torch.float64, device="cuda")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def run(args):
    from torch.distributed.device_mesh import init_device_mesh

    import shardadam
    from shardadam.torch import FusedAdam

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,))
    copy = -slowest([-copy_gbps()])[0]  # the slower GPU's copy bandwidth
    sizes = shard_sizes(args.quick)
    steps = 5 if args.quick else args.steps
    warmup = 2 if args.quick else 5

    torch_params, torch_grads = sharded_set(sizes, mesh, rank, seed=7)
    ours_params, ours_grads = sharded_set(sizes, mesh, rank, seed=7)
    local_elems = sum(p.to_local().numel() for p in ours_params)
    global_elems = sum(sizes)
    for p, g in zip(torch_params, torch_grads):
        p.grad = g
    for p, g in zip(ours_params, ours_grads):
        p.grad = g
    # A max_norm of half the initial global norm: the first steps clip for real.
    with torch.no_grad():
        local_sq = sum(float(g.to_local().double().square().sum()) for g in ours_grads)
    initial_norm = _global_sum(local_sq) ** 0.5
    max_norm = 0.5 * initial_norm

    torch_opt = torch.optim.AdamW(torch_params, **HYPER, fused=True)

    def torch_step():
        torch.nn.utils.clip_grad_norm_(torch_params, max_norm)
        torch_opt.step()

    ours_opt = FusedAdam(ours_params, **HYPER, max_grad_norm=max_norm)

    results = {}
    for label, step in (("torch clip_grad_norm_ + AdamW(fused=True)", torch_step),
                        ("shardadam FusedAdam(max_grad_norm)", ours_opt.step)):
        events_ms, wall_ms = slowest(list(time_steps(step, steps, warmup)))
        results[label] = (events_ms, wall_ms)
    ours_norm = float(ours_opt.grad_norm)  # its grads are never rewritten: still the initial norm

    if rank == 0:
        limit_ms = BYTES_PER_PARAM * max(local_elems, 0) / (copy * 1e9) * 1e3
        print(f"devices: {world} x {torch.cuda.get_device_name()}   torch {torch.__version__}")
        print(f"shardadam: {shardadam.build_info()}")
        print(f"shards: {len(sizes)} fp32 tensors ({sum(1 for n in sizes if n == 0)} empty), {global_elems:,} "
              f"elements, Shard(0) over {world} ranks: {local_elems:,} on rank 0"
              f"{'   (--quick)' if args.quick else ''}")
        print(f"device-to-device copy: {copy:,.0f} GB/s (read + write, slower GPU)")
        print(f"steps timed: {steps} after {warmup} warm-up; max_grad_norm {max_norm:.4g}; times: slower rank\n")
        print(f"{'optimizer step':44s} {'events ms':>10s} {'wall ms':>9s} {'/limit':>7s}")
        for label, (events_ms, wall_ms) in results.items():
            print(f"{label:44s} {events_ms:10.3f} {wall_ms:9.3f} {limit_ms / wall_ms:7.1%}")
        (t_events, t_wall), (o_events, o_wall) = results.values()
        print(f"\nbandwidth limit of a clipped step: {BYTES_PER_PARAM} B/param x {local_elems:,} params at "
              f"{copy:,.0f} GB/s = {limit_ms:.3f} ms")
        print(f"shardadam: {limit_ms / o_wall:.1%} of the limit (wall), {limit_ms / o_events:.1%} (events)")
        print(f"torch / shardadam: {t_wall / o_wall:.2f}x (wall), {t_events / o_events:.2f}x (events)")
        agree = abs(ours_norm - initial_norm) <= 1e-4 * initial_norm
        print(f"sanity: shardadam's last global norm {ours_norm:.7g}, float64 norm of the grads {initial_norm:.7g}: "
              f"{'agree' if agree else 'DIFFER'}")
    dist.barrier()


def _global_sum(value):
    tensor = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(tensor)
    return float(tensor)


def worker(local_rank, world, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank))
    main_rank(args)


def main_rank(args):
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    try:
        run(args)
    finally:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small shard set, few steps")
    parser.add_argument("--steps", type=int, default=50, help="steps timed (after warm-up)")
    parser.add_argument("--nprocs", type=int, default=2, help="ranks to start when not under torchrun")
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:  # under torchrun
        main_rank(args)
        return 0
    if torch.cuda.device_count() < args.nprocs:
        print(f"needs {args.nprocs} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 1
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.nprocs, port, args), nprocs=args.nprocs, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
