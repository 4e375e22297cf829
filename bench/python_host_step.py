#!/usr/bin/env python3
"""bench/python_host_step.py — host cost of shardadam.torch.FusedAdam against torch.optim.AdamW,
measured in the same run, with every grad checked at every step.

Four measurements, each printed with torch's number and the ratio:

1. step() host time at 1,516 DTensor params (a 1-rank mesh: gloo on the CPU, NCCL on CUDA)
   with fresh grads every step (new DTensor grads on the param's spec, as FSDP2's backward
   makes them), and its parts:
   the grad intake alone (bind_param_grads: read .grad, the local tensor, a DLPack
   description, the library's checks), the native step alone, and the rest (Python:
   torch's step wrappers, hyperparameters, scalars), also timed directly: step() against the
   intake, the native step and the unbinding called one after another.
2. step() host time at 1,516 plain params with stable grads (the same tensors at every step,
   as DDP's bucket views give them), against the C step over them with the grads bound once
   (sa_optimizer_step alone, timed in a block of its own).
3. construction of the optimizer over 100,000 params.
4. steady step() at 100,000 tiny params, grads in stable tensors (refilled in place), and
   the native step with the grads left bound (on the CPU, the arithmetic).

The intakes of 1. and 4. are also timed without the library (every grad read and described
through torch's DLPack exchange API, and every extent and stride of the descriptions read,
nothing checked or bound: FusedAdam._bind_grads(bind=False)): what is left over the floor there
is torch's code and the reads of the grads' metadata, which any check of every grad pays. In 4.,
that plus the native step with the grads left bound is the least a checked step can cost,
printed beside the target.

Each has a floor line beside it: what reading the grads alone costs in Python (torch's
attribute access, no shardadam), the least any per-step reader of `.grad` pays.

On CUDA the host time is the call alone (no synchronization inside the timed region; the
device is synchronized before each call). On the CPU the step's arithmetic runs inside the
call, so the params are tiny (16 elements) to keep the host's share visible; the intake
line is host work only on both. Medians over --repeat rounds, each timing every measurement
in turn (torch's step in a block of its own), so that drift of a shared host reaches all alike.

With --profile, a cProfile breakdown of each step by function follows the table's inputs
(before the table).

Usage: python3 bench/python_host_step.py [--device cpu|cuda] [--quick] [--profile]
"""
import argparse
import os
import platform
import socket
import statistics
import time

import torch

from shardadam.torch import FusedAdam


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_ms(calls, device, repeat):
    """{name: median wall time in ms} of each call of ``calls`` ({name: (call, before)},
    before() untimed ahead of each call, or None), timed in turn in each of ``repeat``
    rounds: the drift of a shared host (another tenant, a frequency change) reaches every
    measurement alike, so their differences and ratios hold where separate blocks of calls
    (a floor now, the step a second later) can even come out negative."""
    times = {name: [] for name in calls}
    for _ in range(repeat):
        for name, (call, before) in calls.items():
            if before is not None:
                before()
            sync(device)
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    sync(device)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def median_call_ms(call, device, repeat, before=None):
    """Median wall time of call() in ms; before() runs untimed ahead of each call."""
    return interleaved_ms({"call": (call, before)}, device, repeat)["call"]


def print_profile(label, call, device, repeat, before=None, top=14):
    """cProfile of `repeat` calls of call() (before() untimed ahead of each): where the host
    time goes, by function, ordered by own time."""
    import cProfile
    import pstats
    profile = cProfile.Profile()
    for _ in range(repeat):
        if before is not None:
            before()
        sync(device)
        profile.enable()
        call()
        profile.disable()
    sync(device)
    print(f"\n# cProfile of {label}, {repeat} calls (own time per call in us; cProfile adds its own overhead)")
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]
    for (filename, line, function), (_, calls, own, cumulative, _) in rows:
        where = f"{os.path.basename(filename)}:{line}({function})" if line else function
        print(f"#   {own / repeat * 1e6:9.1f} us own {cumulative / repeat * 1e6:9.1f} us cumulative "
              f"{calls // repeat:7d} calls  {where}")


def init_mesh(device):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=device if device.type == "cuda" else None)
    return init_device_mesh(device.type, (1,))


def fsdp2_grad(local, param):
    """A fresh DTensor grad as FSDP2 makes it: torch's own _from_local_no_grad on the param's
    spec where this torch has it, else DTensor.from_local with the param's placements."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_common import _from_local_no_grad
    except ImportError:
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False)
    return _from_local_no_grad(local, param._spec)


def dtensor_step(device, n, numel, repeat, profile=False):
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    mesh = init_mesh(device)
    torch.manual_seed(0)

    def make_params():
        return [torch.nn.Parameter(distribute_tensor(torch.randn(numel, device=device), mesh, [Shard(0)]))
                for _ in range(n)]

    ours_params, torch_params = make_params(), make_params()
    ours = FusedAdam(ours_params)
    reference = torch.optim.AdamW(torch_params, fused=device.type == "cuda")
    locals_ = [torch.randn(numel, device=device) for _ in range(n)]

    def fresh_grads(params):
        def give():  # new DTensor grads around the same local buffers: what the timed call reads is new
            # As FSDP2 makes them after its reduce-scatter (FSDPParam.to_sharded_dtensor): a
            # new DTensor on the param's own spec object.
            for p, g in zip(params, locals_):
                p.grad = fsdp2_grad(g, p)
        return give

    for opt, params in ((ours, ours_params), (reference, torch_params)):  # warm-up: plans, lazy state
        fresh_grads(params)()
        opt.step()
    def read_fresh_grads():  # what any consumer of fresh DTensor grads pays first, torch's own code
        with torch._C.DisableTorchFunctionSubclass():
            for p in ours_params:
                p.grad._local_tensor

    native = native_step_call(ours, device)  # its stream looked up here, not in the timed calls

    def unbind_and_give():  # unbound again before the next call's grads
        ours._unbind_grads()
        fresh_grads(ours_params)()

    results = interleaved_ms({
        "floor": (read_fresh_grads, fresh_grads(ours_params)),
        "ours": (ours.step, fresh_grads(ours_params)),
        # FusedAdam's intake as step() runs it (bind_param_grads with subclass torch-function
        # dispatch off for the `.grad` reads).
        "intake": (ours._bind_grads, unbind_and_give),
        # The same reads and descriptions, stopped before the library (its checks, the binding).
        "described": (lambda: ours._bind_grads(bind=False), unbind_and_give),
        # The library's step alone (grads bound): on the CPU this includes the arithmetic.
        "native": (native, lambda: (unbind_and_give(), ours._bind_grads())),
        # The intake, the native step and the unbinding called one after another: step() less
        # this is the Python around them (timed whole, not a difference of separate parts).
        "calls": (lambda: (ours._bind_grads(), native(), ours._unbind_grads()), fresh_grads(ours_params)),
    }, device, repeat)
    ours._unbind_grads()
    results["torch"] = median_call_ms(reference.step, device, repeat, fresh_grads(torch_params))
    if profile:
        print_profile(f"step() at {n} DTensor params, fresh grads", ours.step, device, repeat,
                      fresh_grads(ours_params))
    import torch.distributed as dist
    dist.destroy_process_group()
    return results


def native_step_call(opt, device):
    """The library's step alone, with whatever grads are bound (no Python intake)."""
    stream = torch.cuda.current_stream().cuda_stream if device.type == "cuda" else None
    return lambda: opt.native._step_addresses(None, None, stream)


def stable_step(device, n, numel, repeat):
    """step() with the same grad tensors at every step (DDP's bucket views give them so),
    against the C step over the same params with those grads bound once (what an engine
    calling sa_optimizer_step with stable grads pays), and the floor: reading every grad."""
    torch.manual_seed(2)
    params = [torch.nn.Parameter(torch.randn(numel, device=device)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn_like(p)
    torch_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(params, torch_params):
        q.grad = p.grad.clone()
    ours = FusedAdam(params)
    reference = torch.optim.AdamW(torch_params, fused=device.type == "cuda")
    ours.step()
    reference.step()

    def read_grads():
        for p in params:
            p.grad

    results = interleaved_ms({"ours": (ours.step, None), "floor": (read_grads, None)}, device, repeat)
    ours._bind_grads()  # bound once: the C step's steady state, timed in a block of its own
    results["c_step"] = median_call_ms(native_step_call(ours, device), device, repeat)
    ours._unbind_grads()
    results["torch"] = median_call_ms(reference.step, device, repeat)
    return results


def construction(device, n, repeat):
    params = [torch.nn.Parameter(torch.randn(16, device=device)) for _ in range(n)]
    ours, theirs = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        opt = FusedAdam(params)
        ours.append(time.perf_counter() - t0)
        opt.native.close()
        del opt
        t0 = time.perf_counter()
        opt = torch.optim.AdamW(params)
        theirs.append(time.perf_counter() - t0)
        del opt
    return min(ours), min(theirs)


def steady_step(device, n, repeat, profile=False):
    torch.manual_seed(1)
    ours_params = [torch.nn.Parameter(torch.randn(16, device=device)) for _ in range(n)]
    torch_params = [torch.nn.Parameter(p.detach().clone()) for p in ours_params]
    for p, q in zip(ours_params, torch_params):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    ours = FusedAdam(ours_params)
    reference = torch.optim.AdamW(torch_params, fused=device.type == "cuda")
    ours.step()
    reference.step()

    def read_grads():  # the floor: reading every .grad once, in a Python loop
        for p in ours_params:
            p.grad

    native_step = native_step_call(ours, device)
    results = interleaved_ms({
        "ours": (ours.step, None),
        "floor": (read_grads, None),
        "intake": (lambda: (ours._bind_grads(), ours._unbind_grads()), None),
        "described": (lambda: ours._bind_grads(bind=False), None),
        "native": (native_step, lambda: (ours._unbind_grads(), ours._bind_grads())),
    }, device, repeat)
    # The native step with the grads left bound (no rebind): on the CPU, the arithmetic.
    # Floor + this is the least a step that reads every grad can cost.
    results["native_bound"] = median_call_ms(native_step, device, repeat)
    ours._unbind_grads()
    results["torch"] = median_call_ms(reference.step, device, repeat)
    if profile:
        print_profile(f"step() at {n} params, stable grads", ours.step, device, repeat)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--dtensor-params", type=int, default=1516)
    parser.add_argument("--many-params", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true",
                        help="also print a cProfile breakdown of both steps (by function, own time)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", device.index if device.index is not None else 0)
        torch.cuda.set_device(device)
    repeat = 5 if args.quick else 30
    print(f"# {platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
          f"{torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print("# host-time numbers from a shared or loaded machine are indicative only")
    rows = []

    d = dtensor_step(device, args.dtensor_params, 64, repeat, args.profile)
    n = args.dtensor_params
    rows.append((f"step, {n} DTensor params, fresh grads", d["ours"], d["torch"],
                 f"step - floor = {d['ours'] - d['floor']:.3f} ms (target <= 0.25)"))
    rows.append(("  of which: grad intake (read + check all grads)", d["intake"], None, ""))
    rows.append(("    of which: read, described, extents read (no library)", d["described"], None,
                 f"{d['described'] - d['floor']:.3f} ms over the floor"))
    rows.append(("  of which: the native step (C, grads bound)", d["native"], None, ""))
    rows.append(("  of which: the rest (Python: step wrappers, hyperparameters)", d["ours"] - d["intake"] - d["native"],
                 None, f"step() less its native calls made directly: {d['ours'] - d['calls']:.3f} ms"))
    rows.append(("  floor: torch reading the fresh grads (p.grad._local_tensor)", d["floor"], None, ""))

    sb = stable_step(device, n, 64, repeat)
    rows.append((f"step, {n} params, stable grads (the same tensors each step)", sb["ours"], sb["torch"],
                 f"{sb['ours'] / sb['c_step']:.1f}x the C step (target <= 2x); reading the grads alone is "
                 f"{sb['floor'] / sb['c_step']:.1f}x it"))
    rows.append(("  the C step, grads bound once (sa_optimizer_step)", sb["c_step"], None, ""))
    rows.append(("  floor: reading every p.grad once in Python", sb["floor"], None, ""))
    dtensor_rows = len(rows)

    m = args.many_params
    ours_s, torch_s = construction(device, m, 1 if args.quick else 3)
    rows.append((f"construction, {m} params", ours_s * 1e3, torch_s * 1e3,
                 f"{ours_s:.3f} s (target <= 0.5 s and <= 10x torch: {ours_s / torch_s:.1f}x)"))
    st = steady_step(device, m, max(3, repeat // 3), args.profile)
    rows.append((f"steady step, {m} params of 16 elements", st["ours"], st["torch"],
                 f"{st['ours'] / st['floor']:.2f}x the floor (target <= 1.5x)"))
    rows.append(("  of which: grad intake (bind + unbind all grads)", st["intake"], None, ""))
    rows.append(("    of which: read, described, extents read (no library)", st["described"], None,
                 f"{st['described'] / st['floor']:.2f}x the floor"))
    rows.append(("  of which: the native step (C, grads bound)", st["native"], None, ""))
    rows.append(("  the native step, grads left bound (CPU: the arithmetic)", st["native_bound"], None,
                 f"described + this = {(st['described'] + st['native_bound']) / st['floor']:.2f}x the floor: "
                 "the least a step that reads every grad and what its checks read costs"))
    rows.append(("  floor: reading every p.grad once in Python", st["floor"], None, ""))

    print(f"{'measurement':62s} {'FusedAdam ms':>13s} {'torch ms':>10s} {'ours/torch':>10s} {'per param us':>12s}  target")
    for i, (label, ours_v, torch_v, target) in enumerate(rows):
        count = n if i < dtensor_rows else m
        ratio = f"{ours_v / torch_v:10.3f}" if torch_v else f"{'':10s}"
        torch_text = f"{torch_v:10.3f}" if torch_v is not None else f"{'':10s}"
        print(f"{label:62s} {ours_v:13.3f} {torch_text} {ratio} {ours_v * 1e3 / count:12.3f}  {target}")


if __name__ == "__main__":
    main()
