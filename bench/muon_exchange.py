#!/usr/bin/env python3
"""bench/muon_exchange.py — what moving split Muon matrices to their owners and back costs,
over ranks that are threads of one process (a host communicator), in one run.

    python3 bench/muon_exchange.py [--ranks 4] [--model 1.3B] [--layers 1] [--steps 5]
                                   [--split rows|columns] [--device cpu|cuda]

The matrices of one transformer layer (bench/muon_step.py's shapes) split across --ranks
ranks by rows (FSDP's Shard(0)) or by columns (Shard(1), whose boxes go through staging),
each rank an optimizer of its own on a thread, stepped with ns_steps 0 (the iteration is
the normalization alone, so the step is the momentum, the movement and the update). Rows:

- all_to_all: ranks that say their numbers, the boxes sent to each matrix's owner and back
  through the communicator's all_to_all (the library's point-to-point exchange);
- all_reduce: the same ranks without all_to_all, the boxes carried by all_reduce (every
  rank's to every rank: the fallback);
- summed: ranks that do not say their numbers: every rank sums every whole matrix with
  all_reduce and normalizes it.

Each row gives rank 0's step (median), the time it spent in its communicator's callables
(the other ranks' work it waited for included), the bytes they moved in a step (out and
in, as the callables saw them), and the same bytes copied once by numpy in the same run
(memcpy), the floor of any host transport. The callables here copy through numpy arrays
and threading.Barrier, as a real transport would copy into its buffers.
"""
import argparse
import os
import statistics
import sys
import threading
import time

import numpy as np

import shardadam
from shardadam import Mesh, Shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from muon_step import SHAPES, layer_shapes  # noqa: E402  (the same layers as muon_step's)


class Transport:
    """all_reduce and all_to_all among `n` threads, counting each rank's bytes moved and the
    seconds it spent in them (waits for the other ranks included)."""

    def __init__(self, n):
        self.n = n
        self.barrier = threading.Barrier(n, timeout=600)
        self.slots = [None] * n
        self.moved = [0] * n
        self.seconds = [0.0] * n

    def timed(self, rank, call):
        def timed_call(*args):
            start = time.perf_counter()
            try:
                return call(*args)
            finally:
                self.seconds[rank] += time.perf_counter() - start
        return timed_call

    def all_reduce_for(self, rank):
        def all_reduce(values, op):
            self.moved[rank] += 2 * values.nbytes
            self.slots[rank] = values.copy()
            self.barrier.wait()
            stacked = np.stack(self.slots)
            result = stacked.sum(axis=0) if op == "sum" else stacked.max(axis=0)
            self.barrier.wait()
            values[:] = result
        return self.timed(rank, all_reduce)

    def all_to_all_for(self, rank):
        def all_to_all(send, send_bytes, recv, recv_bytes):
            self.moved[rank] += send.nbytes + recv.nbytes
            self.slots[rank] = (send, list(send_bytes))
            self.barrier.wait()
            at = 0
            for sender in range(self.n):
                data, sizes = self.slots[sender]
                start = sum(sizes[:rank])
                recv[at:at + recv_bytes[sender]] = data[start:start + sizes[rank]]
                at += recv_bytes[sender]
            self.barrier.wait()
        return self.timed(rank, all_to_all)


def run_mode(mode, shapes, ranks, split, steps, device):
    """Rank 0's step times (ms), and the bytes its communicator moved and the ms it spent
    in it, a step."""
    transport = Transport(ranks)
    times, errors = [], []
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(s).astype(np.float32) * 0.01 for s in shapes]

    def rank_body(rank):
        try:
            import torch
            said = mode != "summed"
            comm = shardadam.Comm(transport.all_reduce_for(rank),
                                  rank=rank if said else None, nranks=ranks if said else None,
                                  all_to_all=transport.all_to_all_for(rank) if mode == "all_to_all" else None)
            opt = shardadam.Optimizer(update_rule="muon", lr=0.02, ns_steps=0, num_threads=1)
            opt.set_comm(comm)
            keep = []
            for i, shape in enumerate(shapes):
                dim = 0 if split == "rows" else 1
                n = shape[dim]
                per = -(-n // ranks)
                lo, hi = min(rank * per, n), min((rank + 1) * per, n)
                box = (slice(lo, hi), slice(None)) if dim == 0 else (slice(None), slice(lo, hi))
                w = torch.from_numpy(np.ascontiguousarray(grads[i][box])).to(device)
                g = w.clone()
                keep += [w, g]
                opt.add_param(f"w{i}", w, layout=Mesh((ranks,), (rank,), [Shard(dim)], global_shape=shape))
                opt.set_grad(f"w{i}", g)
            opt.step()  # the first: the ranks' agreement on the layout
            if device == "cuda":
                torch.cuda.synchronize()
            transport.moved[rank], transport.seconds[rank] = 0, 0.0
            for _ in range(steps):
                start = time.perf_counter()
                opt.step()
                if device == "cuda":
                    torch.cuda.synchronize()
                if rank == 0:
                    times.append(1e3 * (time.perf_counter() - start))
        except BaseException as error:  # noqa: B036 (reported by the main thread)
            errors.append(error)
            transport.barrier.abort()

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return times, transport.moved[0] // steps, 1e3 * transport.seconds[0] / steps


def memcpy_ms(nbytes, repeats=5):
    src, dst = np.ones(max(nbytes, 1), np.uint8), np.empty(max(nbytes, 1), np.uint8)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 1e3 * best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--model", default="1.3B", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--split", default="rows", choices=["rows", "columns"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    shapes = layer_shapes(*SHAPES[a.model]) * a.layers
    elements = sum(r * c for r, c in shapes)
    print(f"{a.model} x {a.layers} layer(s): {len(shapes)} matrices, {elements:,} elements, split by "
          f"{a.split} over {a.ranks} thread ranks, params on {a.device}; {os.cpu_count()} CPUs")
    print(f"{'mode':<11} {'step ms':>9} {'comm ms':>9} {'MB moved':>10} {'memcpy ms':>10} {'comm/memcpy':>12}")
    for mode in ("all_to_all", "all_reduce", "summed"):
        times, moved, comm = run_mode(mode, shapes, a.ranks, a.split, a.steps, a.device)
        step, copy = statistics.median(times), memcpy_ms(moved)
        print(f"{mode:<11} {step:>9.1f} {comm:>9.1f} {moved / 1e6:>10.1f} {copy:>10.1f} {comm / copy:>12.1f}")


if __name__ == "__main__":
    main()
