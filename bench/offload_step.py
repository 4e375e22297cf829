#!/usr/bin/env python3
"""bench/offload_step.py — a step over optimizer state kept in host memory, against the link.

State placed on the host (``placement="host"``, ``FusedAdam(offload="host")``) lives in pinned
host memory that the step's kernels read and write in place: each step moves every state byte
up the host link once and down once. Its yardstick is that link, measured in the same run:

    link bound = max(state bytes up, state bytes down) / pinned copy bandwidth each way,

with the bandwidth of pinned H2D and D2H copies running at the same time (two streams, as
the step's reads and writes do). Printed per configuration: the step time with the state on
the device and on the host, the link bound, ``bound / host step`` (the issue's target:
>= 0.85), the device memory the optimizer took per param for each placement, and, where
they run, torch's fused AdamW on the GPU over the same tensors and torchao's
``CPUOffloadOptimizer`` (state on the host, CPU step; skipped with a message when torchao is
not installed).

State stepped by the CPU (``placement="host_cpu_step"``, ``FusedAdam(offload="cpu")``, ZeRO-Offload's
scheme) stays in host memory; each step the param and grad come down, the host's threads step
master and moments, and the param goes back up. Its yardstick:

    CPU-step bound = max((param + grad bytes down) / D2H bandwidth while H2D runs,
                         the step's host bytes / the host's memory bandwidth),

with the host's bandwidth measured in the same run (torch's in-place ``add_`` and
``addcmul_`` on every thread, 12 and 16 bytes an element: read and written in place, as the
step's states are) and the step's host bytes counted as the
kernels touch them (each state read and written, the grad read, the param written, and read
too where there is no master). Printed beside it: ``bound / cpu step`` (target >= 0.85) and,
where DeepSpeed is installed, ``DeepSpeedCPUAdam``'s step over the same float32 tensors
already in host memory (its copies over the link not counted).

Without a GPU (``--device cpu``, the default there) the CPU-step half runs alone: CPU params,
whose state the CPU backend steps with the same kernels, against the host's bandwidth (no link)
and DeepSpeedCPUAdam, over 1,516 shards of 2^10 to 2^18 elements (a smaller set: a CPU
machine's memory).

Usage: python3 bench/offload_step.py [--quick] [--big-elems 2.1e9] [--steps 5] [--device cpu]
(the shardadam Python package installed; a CUDA device).
"""
import argparse
import statistics
import time

import torch

import shardadam

HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def log_uniform_sizes(count, lo_exp, hi_exp, empties, seed):
    """The "1516 fp32 shards" set of bench/gpu_step.py (same generator, same seed)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(count, generator=gen, dtype=torch.float64)
    return [int(2 ** (lo_exp + (hi_exp - lo_exp) * x)) for x in u.tolist()] + [0] * empties


def shard_sizes(quick):
    return log_uniform_sizes(100 if quick else 1516, 10, 16 if quick else 22, 16, seed=1)


def big_sizes(elems, shards=16):
    """At least `elems` elements in `shards` equal tensors."""
    n = -(-int(elems) // shards)
    return [n] * shards


def timed(fn, reps):
    """Median seconds of fn() between CUDA events on the current stream."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def pinned_bandwidth(nbytes=1 << 30):
    """Pinned copy bandwidth (bytes/s): H2D alone, D2H alone, and each way while both run."""
    h_up = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    h_down = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    d_up = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    d_down = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def both():
        main = torch.cuda.current_stream()
        for s in (up, down):
            s.wait_stream(main)
        with torch.cuda.stream(up):
            d_up.copy_(h_up, non_blocking=True)
        with torch.cuda.stream(down):
            h_down.copy_(d_down, non_blocking=True)
        main.wait_stream(up)
        main.wait_stream(down)

    for _ in range(2):
        both()
    h2d = nbytes / timed(lambda: d_up.copy_(h_up, non_blocking=True), 5)
    d2h = nbytes / timed(lambda: h_down.copy_(d_down, non_blocking=True), 5)
    # Both ways at once varies from run to run (37-48 GB/s each way on one H100 host): the
    # best of 10, so that the bound is what the link gave at its best.
    bidir = max(nbytes / timed(both, 1) for _ in range(10))
    del h_up, h_down, d_up, d_down
    torch.cuda.empty_cache()
    return h2d, d2h, bidir


def host_bandwidth(elems=1 << 28):
    """The host's memory bandwidth (bytes/s) on every thread, read and written in place as the
    step does: the best of 5 runs each of torch's a += s * b (12 bytes an element) and
    a += s * b * c (16 bytes) over float32 arrays of `elems` (1 GiB each), the faster of the two."""
    a, b, c = torch.rand(elems), torch.rand(elems), torch.rand(elems)
    best = 0.0
    for op, nbytes in ((lambda: a.add_(b, alpha=0.5), 12), (lambda: a.addcmul_(b, c, value=0.5), 16)):
        op()
        for _ in range(5):
            t0 = time.perf_counter()
            op()
            best = max(best, nbytes * elems / (time.perf_counter() - t0))
    return best


def cpu_step_bytes(sizes, param_bytes, master, moment):
    """(bytes down the link, bytes up, bytes the host's step reads and writes) per step of
    state stepped by the CPU: param and grad (of the param's dtype) down, the param up; on the
    host each state is read and written, the grad read, the param written (and read, without
    a master)."""
    elems = sum(sizes)
    state = state_bytes(sizes, master, moment)
    down = 2 * param_bytes * elems
    up = param_bytes * elems
    host = 2 * state + param_bytes * elems * (2 if master else 3)
    return down, up, host


def state_bytes(sizes, master, moment):
    """Bytes of state per step each way: master (fp32), two moments, and a block moment's
    float32 absmax per 256 elements."""
    total = 0
    for n in sizes:
        per = 4 if master else 0
        if moment in ("uint8", "float8_e4m3fn"):
            per += 2
            total += 2 * 4 * ((n + 255) // 256)
        else:
            per += 8 if moment is None or moment == "float32" else 4
        total += per * n
    return total


def device_free():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def shardadam_run(params, grads, master, moment, placement, steps):
    """(seconds per step, device bytes the optimizer took) of shardadam.Optimizer."""
    free = device_free()
    opt = shardadam.Optimizer(**HYPER)
    for i, p in enumerate(params):
        opt.add_param(f"p{i}", p, master="fp32" if master else None, moment_dtype=moment, placement=placement)
    opt.set_grads(grads)
    opt.step()
    taken = free - device_free()
    seconds = timed(lambda: [opt.step() for _ in range(steps)], 1) / steps
    opt.close()
    return seconds, taken


def torch_run(params, grads, steps):
    """(seconds per step, device bytes of its state) of torch.optim.AdamW(fused=True)."""
    ps = [torch.nn.Parameter(p) for p in params if p.numel()]
    for p, g in zip(ps, [g for g in grads if g.numel()]):
        p.grad = g
    free = device_free()
    opt = torch.optim.AdamW(ps, **HYPER, fused=True)
    opt.step()
    taken = free - device_free()
    seconds = timed(lambda: [opt.step() for _ in range(steps)], 1) / steps
    del opt
    torch.cuda.empty_cache()
    return seconds, taken


def deepspeed_run(params, grads, steps):
    """Seconds per step of DeepSpeed's DeepSpeedCPUAdam (AdamW) over float32 copies of the
    params and grads in host memory (its JIT-built CPU kernel on every thread), or None."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as err:  # not installed
        print(f"  DeepSpeedCPUAdam: not run ({type(err).__name__}: {err})")
        return None
    ps = [torch.nn.Parameter(p.float().cpu()) for p in params if p.numel()]
    for p, g in zip(ps, [g for g in grads if g.numel()]):
        p.grad = g.float().cpu()
    try:
        opt = DeepSpeedCPUAdam(ps, lr=HYPER["lr"], betas=HYPER["betas"], eps=HYPER["eps"],
                               weight_decay=HYPER["weight_decay"], adamw_mode=True)
        opt.step()
    except Exception as err:  # its kernel failed to build here
        print(f"  DeepSpeedCPUAdam: not run ({type(err).__name__}: {err})")
        return None
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    seconds = (time.perf_counter() - t0) / steps
    del opt, ps
    return seconds


def torchao_run(params, grads, steps):
    """(seconds per step, device bytes) of torchao's CPUOffloadOptimizer over AdamW, or None.
    It moves each grad to the host in a post-accumulate-grad hook, so a step here is a
    backward that accumulates the grads (torch.autograd.backward on the params) and step();
    the same backward without it is timed too and taken off."""
    try:
        from torchao.optim import CPUOffloadOptimizer
    except Exception as err:  # not installed, or built for another torch
        print(f"  torchao CPUOffloadOptimizer: not run ({type(err).__name__}: {err})")
        return None
    pairs = [(p, g) for p, g in zip(params, grads) if p.numel()]
    plain = [torch.nn.Parameter(p.clone()) for p, _ in pairs]
    good = [g for _, g in pairs]

    def backward(ps):
        for p in ps:
            p.grad = None
        torch.autograd.backward(ps, good)

    backward(plain)
    backward_s = timed(lambda: [backward(plain) for _ in range(steps)], 1) / steps
    del plain
    ps = [torch.nn.Parameter(p) for p, _ in pairs]
    free = device_free()
    opt = CPUOffloadOptimizer(ps, torch.optim.AdamW, **HYPER, fused=True)

    def step():
        torch.autograd.backward(ps, good)
        opt.step()
        opt.zero_grad()

    step()
    taken = free - device_free()
    seconds = timed(lambda: [step() for _ in range(steps)], 1) / steps - backward_s
    del opt
    return seconds, taken


def cpu_main(args):
    """The CPU step without a GPU: the CPU backend over CPU params against the host's bandwidth
    and DeepSpeedCPUAdam."""
    print(f"device: cpu ({torch.get_num_threads()} threads)   torch {torch.__version__}")
    print(f"shardadam: {shardadam.build_info()}")
    host_bw = host_bandwidth(1 << 26)
    print(f"host memory: {host_bw / 1e9:.1f} GB/s (in place, {torch.get_num_threads()} threads)\n")
    sizes = log_uniform_sizes(100 if args.quick else 1516, 10, 18, 16, seed=1)
    elems = sum(sizes)
    print(f"{'set':<22} {'variant':<34} {'step ms':>9} {'bound ms':>9} {'bound/step':>10}")
    for label, dtype, master, moment in CONFIGS:
        params = [torch.randn(n).to(dtype) for n in sizes]
        grads = [(torch.randn(n) * 1e-2).to(dtype) for n in sizes]
        opt = shardadam.Optimizer(**HYPER)
        for i, p in enumerate(params):
            opt.add_param(f"p{i}", p, master="fp32" if master else None, moment_dtype=moment)
        opt.set_grads(grads)
        opt.step()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            opt.step()
        step_s = (time.perf_counter() - t0) / args.steps
        opt.close()
        _, _, host_bytes = cpu_step_bytes(sizes, params[0].element_size(), master, moment)
        bound = host_bytes / host_bw
        print(f"{f'{len(sizes)} shards ({elems / 1e6:.0f}M)':<22} {label:<34} {step_s * 1e3:9.2f} "
              f"{bound * 1e3:9.2f} {bound / step_s:10.3f}", flush=True)
        if label.startswith("fp32, fp32") and not args.no_deepspeed:
            ds = deepspeed_run(params, grads, args.steps)
            if ds:
                print(f"  DeepSpeedCPUAdam: {ds * 1e3:.1f} ms a step; shardadam is {ds / step_s:.2f}x its speed",
                      flush=True)
        del params, grads
    print("\nbound/step: the step's host bytes at the host's bandwidth over the step (target >= 0.85).")


# (label, param dtype, fp32 master, moment dtype)
CONFIGS = [
    ("fp32, fp32 moments", torch.float32, False, None),
    ("fp32, 8-bit moments", torch.float32, False, "uint8"),
    ("bf16 + fp32 master, fp32 moments", torch.bfloat16, True, None),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="100 small shards, no big set")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--big-elems", type=float, default=2.1e9, help="elements of the big set (0: skip it)")
    ap.add_argument("--no-torchao", action="store_true")
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.device == "cpu":
        return cpu_main(args)
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}   torch {torch.__version__}")
    print(f"shardadam: {shardadam.build_info()}")
    h2d, d2h, bidir = pinned_bandwidth()
    print(f"pinned copies: H2D {h2d / 1e9:.1f} GB/s, D2H {d2h / 1e9:.1f} GB/s alone; "
          f"{bidir / 1e9:.1f} GB/s each way at once")
    host_bw = host_bandwidth()
    print(f"host memory: {host_bw / 1e9:.1f} GB/s (in place, {torch.get_num_threads()} threads)")

    sets = [("1516 shards", shard_sizes(args.quick))]
    if args.big_elems > 0 and not args.quick:
        sets.append((f"{args.big_elems:.2g} elements", big_sizes(args.big_elems)))
    configs = CONFIGS
    print()
    header = (f"{'set':<16} {'variant':<34} {'device ms':>9} {'host ms':>9} {'bound ms':>9} "
              f"{'bound/host':>10} {'one-way':>8} {'dev B/param':>11} {'host B/param':>12} {'torch ms':>9} "
              f"{'torch B/param':>13}")
    print(header)
    for set_name, sizes in sets:
        elems = sum(sizes)
        for label, dtype, master, moment in configs:
            if set_name != "1516 shards" and dtype != torch.float32:
                continue  # the big set: fp32 with fp32 and 8-bit moments
            params = [torch.randn(n, device="cuda").to(dtype) for n in sizes]
            grads = [torch.randn(n, device="cuda").to(dtype) * 1e-2 for n in sizes]
            moved = state_bytes(sizes, master, moment)
            bound = moved / bidir
            one_way = moved / min(h2d, d2h)
            steps = max(2, args.steps if elems < 1e9 else 2)
            dev_s, dev_taken = shardadam_run(params, grads, master, moment, None, steps)
            host_s, host_taken = shardadam_run(params, grads, master, moment, "host", steps)
            cpu_s, cpu_taken = shardadam_run(params, grads, master, moment, "host_cpu_step", steps)
            down, up, host_bytes = cpu_step_bytes(sizes, params[0].element_size(), master, moment)
            cpu_bound = max(down / bidir, host_bytes / host_bw)
            # The copies go through host memory too: the mirror is written by the copies down
            # and read by the copies up, beside the step's own bytes.
            dram_bound = max(down / bidir, (host_bytes + down + up) / host_bw)
            # torch's fused AdamW on the same tensors, state on the GPU (fp32 params and moments only)
            torch_s, torch_taken = torch_run(params, grads, steps) if moment is None and not master else (
                float("nan"), float("nan"))
            print(f"{set_name:<16} {label:<34} {dev_s * 1e3:9.2f} {host_s * 1e3:9.2f} {bound * 1e3:9.2f} "
                  f"{bound / host_s:10.3f} {one_way / host_s:8.3f} {dev_taken / elems:11.2f} "
                  f"{host_taken / elems:12.3f} {torch_s * 1e3:9.2f} {torch_taken / elems:13.2f}", flush=True)
            print(f"{'':<16} {'  stepped by the CPU':<34} {'':>9} {cpu_s * 1e3:9.2f} {cpu_bound * 1e3:9.2f} "
                  f"{cpu_bound / cpu_s:10.3f} {'':>8} {'':>11} {cpu_taken / elems:12.3f}   "
                  f"(link {down / bidir * 1e3:.1f} ms, host {host_bytes / host_bw * 1e3:.1f} ms; with the copies' "
                  f"bytes in host memory {(host_bytes + down + up) / host_bw * 1e3:.1f} ms: "
                  f"{dram_bound / cpu_s:.3f})", flush=True)
            if label.startswith("fp32, fp32") and not args.no_deepspeed:
                ds = deepspeed_run(params, grads, 2)
                if ds:
                    print(f"  DeepSpeedCPUAdam (host tensors, no copies): {ds * 1e3:.1f} ms a step; "
                          f"shardadam's CPU step with its copies is {ds / cpu_s:.2f}x its speed", flush=True)
            if set_name == "1516 shards" and label.startswith("fp32, fp32") and not args.no_torchao:
                ao = torchao_run(params, grads, 2)
                if ao:
                    print(f"  torchao CPUOffloadOptimizer(AdamW, fused): {ao[0] * 1e3:.1f} ms a step, "
                          f"{ao[1] / elems:.2f} device B/param; shardadam host placement is "
                          f"{ao[0] / host_s:.1f}x faster")
            del params, grads
            torch.cuda.empty_cache()
    print("\nbound/host: the link bound over the step with state on the host (target >= 0.85); "
          "one-way: the same against the slower one-way copy. dev/host B/param: device memory the "
          "optimizer took (state, plan tables) per element with the state on the device / host. "
          "Stepped by the CPU: its bound (the larger of the link's and the host memory's times) "
          "over its step (target >= 0.85).")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"total {time.time() - t0:.0f} s")
