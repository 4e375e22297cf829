#!/usr/bin/env python3
"""bench/cpu_moments8.py — 8-bit moments on the CPU: shardadam.torch.FusedAdam with
moment_dtype=torch.uint8 against bitsandbytes' AdamW8bit (its CPU backend), in one run, on
the same params and grads, next to shardadam with float32 moments, torch.optim.AdamW
(foreach) and a memory copy of the bytes an 8-bit step moves.

    python3 bench/cpu_moments8.py [--elems 2e7] [--shards 64] [--steps 10] [--threads 0]

Prints ms per step, GB/s at the counted bytes (8-bit: 16 B/element plus 8 B per 256-element
block; float32 moments: 28 B/element) and each one's ratio to shardadam's 8-bit step. Needs
torch, bitsandbytes and the shardadam package.
"""
import argparse
import math
import time

import torch

import bitsandbytes as bnb
from shardadam.torch import FusedAdam


def sizes_of(total, count, seed=0):
    # Log-uniform over 2^12..2^22 (bitsandbytes keeps float32 moments below 4096 elements),
    # scaled to `total`.
    g = torch.Generator().manual_seed(seed)
    raw = [2 ** (12 + 10 * float(torch.rand(1, generator=g))) for _ in range(count)]
    scale = total / sum(raw)
    return [max(4096, int(r * scale)) for r in raw]


def time_steps(step, steps, warmup=2):
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e3


def copy_ms(nbytes, steps):
    half = nbytes // 2  # a copy reads and writes: nbytes in all
    src, dst = torch.empty(half, dtype=torch.uint8), torch.empty(half, dtype=torch.uint8)
    src.fill_(1)
    return time_steps(lambda: dst.copy_(src), steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elems", type=float, default=2e7)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="shardadam threads (0: all)")
    args = ap.parse_args()
    torch.manual_seed(0)
    sizes = sizes_of(int(args.elems), args.shards)
    elems = sum(sizes)
    blocks = sum(math.ceil(n / 256) for n in sizes)
    bytes8, bytes32 = 16 * elems + 8 * blocks, 28 * elems
    print(f"{len(sizes)} fp32 shards, {elems:,} elements; torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), bitsandbytes {bnb.__version__}")
    grads = [torch.randn(n) * 0.01 for n in sizes]
    base = [torch.randn(n) for n in sizes]

    def make(kind):
        params = [torch.nn.Parameter(b.clone()) for b in base]
        for p, g in zip(params, grads):
            p.grad = g
        kw = dict(lr=1e-3, weight_decay=1e-2)
        if kind == "sa8":
            return FusedAdam(params, moment_dtype=torch.uint8, min_8bit_size=0, num_threads=args.threads, **kw)
        if kind == "sa32":
            return FusedAdam(params, num_threads=args.threads, **kw)
        if kind == "bnb8":
            return bnb.optim.AdamW8bit(params, **kw)
        return torch.optim.AdamW(params, foreach=True, **kw)

    rows = [("memory copy of the 8-bit step's bytes", copy_ms(bytes8, args.steps), bytes8)]
    for kind, label, nbytes in (("sa8", "shardadam FusedAdam, 8-bit moments", bytes8),
                                ("bnb8", "bitsandbytes AdamW8bit (CPU)", bytes8),
                                ("sa32", "shardadam FusedAdam, fp32 moments", bytes32),
                                ("torch", "torch AdamW (foreach), fp32 moments", bytes32)):
        opt = make(kind)
        rows.append((label, time_steps(opt.step, args.steps), nbytes))
        del opt
    ours = rows[1][1]
    print(f"{'':42s} {'ms/step':>9s} {'GB/s':>7s} {'/ shardadam 8-bit':>18s}")
    for label, ms, nbytes in rows:
        print(f"{label:42s} {ms:9.2f} {nbytes / ms / 1e6:7.1f} {ms / ours:17.2f}x")


if __name__ == "__main__":
    main()
