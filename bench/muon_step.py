#!/usr/bin/env python3
"""bench/muon_step.py — shardadam's Muon step against torch.optim.Muon on one GPU, in one run.

    python3 bench/muon_step.py --lib build/libshardadam.so [--layers N] [--steps N] [--dtensor]
                               [--models 1.3B,3B] [--device cpu]

Over the matrices of one transformer layer of a 1.3B and a 3B model (attention d x d four
times, the SwiGLU MLP's two ffn x d and one d x ffn), times N layers, as plain float32
tensors on one device:

- the step of each optimizer: wall time per step (steps back to back, synchronized once),
  host time of the call alone, and their ratio;
- where the time goes in ours, from the torch profiler's kernel times: cuBLAS's GEMMs, and
  our own kernels (momentum fused with the iteration's rounding, normalize, B := b A + a I,
  apply; the step's fold) with the bytes they move against the device-to-device copy
  bandwidth measured in the same run.

bench/newton_schulz measures the iteration against the same cuBLAS GEMMs alone. shardadam is
reached through ctypes on the C ABI (gpu_step.py's helpers), the params handed over as DLPack
capsules, so both optimizers update tensors of the same shapes with the same grads.

With --dtensor, the same matrices as DTensors (Shard(0) on a 1-rank mesh: NCCL on CUDA,
gloo on the CPU) stepped by the Python faces, shardadam.torch.Muon against torch.optim.Muon
(whose DTensor path runs the iteration on each matrix's DTensor): step and host time.
--device cpu runs only those rows (the CPU Muon on the CBLAS), e.g. with --models tiny as a
smoke run of the bench itself.
"""
import argparse
import ctypes as C
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_step as G  # noqa: E402

SHAPES = {"1.3B": (2048, 5504), "3B": (3072, 8192), "tiny": (64, 176)}  # (d, ffn)


def layer_shapes(d, ffn):
    return [(d, d)] * 4 + [(ffn, d), (ffn, d), (d, ffn)]


class MuonShardadam(G.Shardadam):
    """shardadam with one Muon group (torch.optim.Muon's hyperparameters) over `params`."""

    def __init__(self, lib, params, lr=0.02):
        self.lib = lib
        self.args = G.SaStepArgs(C.sizeof(G.SaStepArgs), None, None, None, 0.0, 0, None, None)
        self.opt = C.c_void_p()
        cfg = G.SaOptimizerConfig(C.sizeof(G.SaOptimizerConfig), 0, 1)
        self._ok(lib.sa_optimizer_create(C.byref(cfg), C.byref(self.opt)), None)
        names = [b"update_rule", b"lr", b"weight_decay", b"eps", b"momentum"]
        values = [1.0, lr, 0.1, 1e-7, 0.95]  # SA_RULE_MUON; torch.optim.Muon's defaults
        self._ok(lib.sa_optimizer_add_group_fields(self.opt, len(names), (C.c_char_p * len(names))(*names),
                                                   (C.c_double * len(values))(*values), None))
        for i, p in enumerate(params):
            self._ok(lib.sa_optimizer_add_param(self.opt, f"w{i}".encode(), 0, C.c_void_p(self._hand_over(p)),
                                                None, None, None))
        self.n = len(params)


def kernel_split(step, steps):
    """(total, GEMM, elementwise) kernel ms per step, and each of our kernels' ms per step."""
    prof = G.profiled(step, steps)
    total = gemm = 0.0
    ours = {}
    for evt in prof.key_averages():
        us = getattr(evt, "device_time_total", 0.0) or getattr(evt, "cuda_time_total", 0.0)
        if us <= 0 or evt.key.startswith("cudaMemcpy") or evt.key.startswith("Memcpy"):
            continue
        total += us
        if "sa::kernels" in evt.key:  # ours: elementwise; everything else here is cuBLAS's
            found = re.search(r"(\w+_kernel)", evt.key)
            name = found.group(1) if found else evt.key[:40]
            ours[name] = ours.get(name, 0.0) + us / 1e3 / steps
        else:
            gemm += us
    return total / 1e3 / steps, gemm / 1e3 / steps, (total - gemm) / 1e3 / steps, ours


def kernel_bytes(shapes, ns_steps=5):
    """The bytes each of our kernels must move per step over these matrices: momentum fused
    with Newton-Schulz's rounding reads g and buf and writes buf and the bf16 direction (14 an
    element), normalize reads and writes it (4), apply reads p and the bf16 result and writes p
    (10); per Newton-Schulz step, B := b A + a I reads and writes an m x m bf16 matrix (m = the
    smaller dim): 4 m^2. The step's fold moves a few bytes (none counted)."""
    elems = sum(r * c for r, c in shapes)
    return {"ns_round_and_square_kernel": 14 * elems, "normalize_kernel": 4 * elems,
            "apply_kernel": 10 * elems,
            "poly_init_kernel": sum(ns_steps * 4 * min(r, c) ** 2 for r, c in shapes)}


def dtensor_rows(device, models, layers, steps):
    """shardadam.torch.Muon against torch.optim.Muon over DTensor matrices on a 1-rank mesh."""
    import socket
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from shardadam.torch import Muon
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1, device_id=device if device.type == "cuda" else None)
    mesh = init_device_mesh(device.type, (1,))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"\nDTensor matrices (Shard(0), 1-rank mesh, {device}): shardadam.torch.Muon against torch.optim.Muon")
    print(f"{'model':6} {'matrices':>8} {'elements':>12} | {'ours ms':>8} {'torch ms':>8} {'torch/ours':>10} | "
          f"{'ours host':>9} {'torch host':>10}")
    for model in models:
        shapes = layer_shapes(*SHAPES[model]) * layers
        gen = torch.Generator(device=device).manual_seed(0)
        values = [torch.randn(s, device=device, generator=gen) for s in shapes]
        grads = [0.01 * torch.randn(s, device=device, generator=gen) for s in shapes]

        def params():
            out = [torch.nn.Parameter(distribute_tensor(v.clone(), mesh, [Shard(0)])) for v in values]
            for p, g in zip(out, grads):
                p.grad = distribute_tensor(g, mesh, [Shard(0)])
            return out

        opt, ref = Muon(params(), lr=0.02), torch.optim.Muon(params(), lr=0.02)
        for _ in range(2):  # warm up: plans, cuBLAS handles and workspaces, torch's lazy state
            opt.step()
            ref.step()
        ours_ms, torch_ms = G.wall_ms(opt.step, steps, sync), G.wall_ms(ref.step, steps, sync)
        ours_host, torch_host = G.host_ms(opt.step, steps, sync), G.host_ms(ref.step, steps, sync)
        elems = sum(r * c for r, c in shapes)
        print(f"{model:6} {len(shapes):>8} {elems:>12,} | {ours_ms:8.3f} {torch_ms:8.3f} {torch_ms / ours_ms:10.2f} | "
              f"{ours_host:9.3f} {torch_host:10.3f}")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", help="libshardadam.so for the plain-tensor rows (CUDA)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default="1.3B,3B", help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--dtensor", action="store_true", help="also the DTensor rows (the shardadam package)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (the DTensor rows only)")
    args = ap.parse_args()
    models = args.models.split(",")
    device = torch.device(args.device)
    if device.type == "cpu":
        return dtensor_rows(device, models, args.layers, args.steps)
    if args.lib is None:
        ap.error("--lib is required on CUDA")
    lib = G.load_lib(args.lib)
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
          f"{lib.sa_build_info().decode()}")
    copy = G.copy_gbps()
    print(f"device-to-device copy: {copy:,.0f} GB/s")
    print(f"{'model':6} {'matrices':>8} {'elements':>12} | {'ours ms':>8} {'torch ms':>8} {'torch/ours':>10} | "
          f"{'ours host':>9} {'torch host':>10} | {'GEMM ms':>7} {'elementwise ms':>14} {'% of copy':>9}")
    for model in models:
        shapes = layer_shapes(*SHAPES[model]) * args.layers
        gen = torch.Generator(device="cuda").manual_seed(0)
        ours = [torch.randn(s, device="cuda", generator=gen) for s in shapes]
        theirs = [torch.nn.Parameter(p.clone()) for p in ours]
        grads = [0.01 * torch.randn(s, device="cuda", generator=gen) for s in shapes]
        for q, g in zip(theirs, grads):
            q.grad = g
        opt = MuonShardadam(lib, ours)
        opt.bind(grads)
        ref = torch.optim.Muon(theirs, lr=0.02)
        for _ in range(2):  # warm up: plans, cuBLAS handles and workspaces, torch's lazy state
            opt.step()
            ref.step()
        ours_ms, torch_ms = G.wall_ms(opt.step, args.steps), G.wall_ms(ref.step, args.steps)
        ours_host, torch_host = G.host_ms(opt.step, args.steps), G.host_ms(ref.step, args.steps)
        total, gemm, elementwise, kernels = kernel_split(opt.step, 3)
        elems = sum(r * c for r, c in shapes)
        need = kernel_bytes(shapes)
        floor = sum(need.values()) / (copy * 1e9) * 1e3
        print(f"{model:6} {len(shapes):>8} {elems:>12,} | {ours_ms:8.3f} {torch_ms:8.3f} {torch_ms / ours_ms:10.2f} | "
              f"{ours_host:9.3f} {torch_host:10.3f} | {gemm:7.3f} {elementwise:14.3f} {100 * floor / elementwise:8.1f}%")
        for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1]):
            moved = need.get(name)
            share = f"{moved / 1e9:6.3f} GB {100 * moved / (copy * 1e9) * 1e3 / ms:5.1f}% of copy" if moved else "(no bytes counted)"
            print(f"       {name:30} {ms:7.3f} ms  {share}")
        opt.close()
    if args.dtensor:
        dtensor_rows(torch.device("cuda", torch.cuda.current_device()), models, args.layers, args.steps)


if __name__ == "__main__":
    main()
