#!/usr/bin/env python3
"""bench/gpu_step.py — the CUDA step of shardadam against torch's fused AdamW, in one run.

Prints, for each configuration: kernel time per step (sum of the step's kernels, read by
the torch profiler), host time per step (the call alone), wall time per step (many steps
back to back, synchronized once), bytes moved / kernel time, and the ratios to the
device-to-device copy bandwidth measured in the same run and to torch.

shardadam is reached through ctypes on the C ABI (no bindings needed): torch tensors are
handed over as real DLPack capsules (``__dlpack__(max_version=(1, 0))``), so both
optimizers update the same parameter memory.

Usage: python3 bench/gpu_step.py --lib build/libshardadam.so [--quick]
"""
import argparse
import ctypes as C
import math
import os
import statistics
import time

import torch

# ---- the C ABI through ctypes --------------------------------------------------------------


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
                ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class SaParamOptions(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("grad_dtype", DLDataType),
                ("moment_dtype", DLDataType), ("master", C.c_int32),
                ("scale", C.c_void_p), ("amax", C.c_void_p), ("scaling", C.c_int32)]


class SaLayout(C.Structure):  # the box form only (global_offset set)
    _fields_ = [("struct_size", C.c_size_t), ("ndim", C.c_int32), ("global_shape", C.POINTER(C.c_int64)),
                ("mesh_ndim", C.c_int32), ("mesh_shape", C.c_void_p), ("mesh_coord", C.c_void_p),
                ("placements", C.c_void_p), ("global_offset", C.POINTER(C.c_int64))]


class SaOptimizerConfig(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("num_threads", C.c_int32), ("cpu_simd", C.c_int32)]


SA_MASTER_FP32 = 2
BF16 = DLDataType(4, 16, 1)
UINT8 = DLDataType(1, 8, 1)  # moment_dtype: 8-bit blockwise moments
FLOAT8 = DLDataType(10, 8, 1)  # moment_dtype: float8 e4m3fn moments with a scale per block
# sa_param_scaling values of fp8 params, and the elements per scale of each (0: per tensor)
SCALINGS = {"delayed": (1, 0), "mxfp8": (2, 32), "block128": (3, 128), "current": (4, 0)}

_capsule_ptr = C.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = C.c_void_p
_capsule_ptr.argtypes = [C.py_object, C.c_char_p]
_capsule_rename = C.pythonapi.PyCapsule_SetName
_capsule_rename.argtypes = [C.py_object, C.c_char_p]


class SaStepArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("inv_grad_scale", C.c_void_p), ("found_inf", C.c_void_p),
                ("skipped", C.c_void_p), ("max_grad_norm", C.c_double), ("norm_type", C.c_int32),
                ("grad_norm", C.c_void_p), ("host_grad_norm", C.c_void_p)]


class Shardadam:
    """One shardadam optimizer over a list of CUDA tensors (all in group 0)."""

    def __init__(self, lib, params, master=False, max_grad_norm=0.0, moment=None, fp8=None, comm=None):
        """fp8: (scaling name, the params' scale tensors) for float8 params (fp32 masters).
        comm: an sa_comm for the steps; each param is then the first numel elements of a
        global tensor 128 elements longer (a box layout: sharded)."""
        self.lib = lib
        # max_grad_norm > 0: clip the L2 norm of all grads inside the step (no communicator).
        self.args = SaStepArgs(C.sizeof(SaStepArgs), None, None, None, max_grad_norm, 0, None, None)
        self.opt = C.c_void_p()
        cfg = SaOptimizerConfig(C.sizeof(SaOptimizerConfig), 0, 1)
        self._ok(lib.sa_optimizer_create(C.byref(cfg), C.byref(self.opt)), None)
        # The library's defaults, which are torch.optim.AdamW's (the baseline's).
        self._ok(lib.sa_optimizer_add_group_fields(self.opt, 0, None, None, None))
        if comm:
            self._ok(lib.sa_optimizer_set_comm(self.opt, comm))
        opts = SaParamOptions(C.sizeof(SaParamOptions), BF16 if master else DLDataType(0, 0, 0),
                              moment or DLDataType(0, 0, 0), SA_MASTER_FP32 if master else 0)
        if fp8:
            opts.scaling = SCALINGS[fp8[0]][0]
        for i, p in enumerate(params):
            if fp8:
                opts.scale = self._hand_over(fp8[1][i])
            layout = None
            if comm:
                shape, offset = (C.c_int64 * 1)(p.numel() + 128), (C.c_int64 * 1)(0)
                layout = C.byref(SaLayout(C.sizeof(SaLayout), 1, shape, 0, None, None, None, offset))
            self._ok(lib.sa_optimizer_add_param(self.opt, f"p{i}".encode(), 0,
                                                C.c_void_p(self._hand_over(p)), layout,
                                                C.byref(opts), None))
        self.n = len(params)

    @staticmethod
    def _hand_over(tensor):
        """A managed tensor of `tensor` that the optimizer will own (it calls the deleter)."""
        capsule = tensor.__dlpack__(max_version=(1, 0))
        ptr = _capsule_ptr(capsule, b"dltensor_versioned")
        _capsule_rename(capsule, b"used_dltensor_versioned")
        return ptr

    def _ok(self, status, opt=0):
        if status != 0:
            msg = self.lib.sa_optimizer_last_error(self.opt if opt is not None else None)
            raise RuntimeError(f"shardadam status {status}: {msg.decode()}")

    def bind(self, grads):
        ptrs = (C.c_void_p * self.n)(*[g.data_ptr() if g.numel() else None for g in grads])
        self._ok(self.lib.sa_optimizer_set_grad_ptrs(self.opt, self.n, ptrs))

    def step(self):
        stream = C.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._ok(self.lib.sa_optimizer_step(self.opt, C.byref(self.args), stream))

    def close(self):
        self.lib.sa_optimizer_destroy(self.opt)


def load_lib(path):
    lib = C.CDLL(path)
    lib.sa_optimizer_last_error.restype = C.c_char_p
    lib.sa_build_info.restype = C.c_char_p
    for name in ["sa_optimizer_create", "sa_optimizer_add_group_fields", "sa_optimizer_add_param",
                 "sa_optimizer_set_grad_ptrs", "sa_optimizer_step", "sa_optimizer_set_comm",
                 "sa_nccl_unique_id_create", "sa_comm_create_nccl"]:
        getattr(lib, name).restype = C.c_int
    return lib


# ---- measurement --------------------------------------------------------------------------


def profiled(step, steps):
    """The torch profiler (CUPTI) over `steps` calls of step(), synchronized at both ends."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return prof


def kernel_ms(step, steps):
    """Sum of CUDA kernel time per step, from the torch profiler (CUPTI)."""
    prof = profiled(step, steps)
    total_us = 0.0
    events = prof.events()
    for evt in events:  # kernels appear as device-side events...
        if getattr(evt, "device_type", None) == torch.autograd.DeviceType.CUDA:
            total_us += getattr(evt, "device_time", 0.0) or getattr(evt, "cuda_time", 0.0)
    if total_us == 0.0:  # ...or only attached to the CPU op that launched them
        total_us = sum(k.duration for evt in events for k in getattr(evt, "kernels", []))
    return total_us / 1000.0 / steps


def host_ms(step, steps, sync=torch.cuda.synchronize):
    """Median time of the call alone (no synchronization inside the timed region). `sync`
    waits for the device (a no-op for CPU work)."""
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    sync()
    return statistics.median(times) * 1e3


def wall_ms(step, steps, sync=torch.cuda.synchronize):
    """Time per call of `steps` calls back to back, the device waited for at both ends."""
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) * 1e3 / steps


def copy_gbps():
    n = 1 << 30  # 4 GiB of fp32
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 4 / (statistics.median(times) * 1e-3) / 1e9


def log_uniform_sizes(count, lo_exp, hi_exp, empties, seed):
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(count, generator=gen, dtype=torch.float64)
    sizes = [int(2 ** (lo_exp + (hi_exp - lo_exp) * x)) for x in u.tolist()]
    return sizes + [0] * empties


def shard_sizes(quick=False):
    """Element counts of the "1516 fp32 shards" set (b, c, d): 1516 log-uniform sizes from
    2^10 to 2^22 elements plus 16 empty shards (--quick: 100 up to 2^16). bench/clip_step.py
    splits the same set over 2 ranks."""
    return log_uniform_sizes(100 if quick else 1516, 10, 16 if quick else 22, 16, seed=1)


def measure(label, step, bytes_per_step, steps, warmup=3):
    for _ in range(warmup):
        step()
    k = kernel_ms(step, steps)
    h = host_ms(step, steps)
    w = wall_ms(step, steps)
    return dict(label=label, kernel_ms=k, host_ms=h, wall_ms=w,
                gbps=bytes_per_step / (k * 1e-3) / 1e9)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libshardadam.so")
    ap.add_argument("--quick", action="store_true", help="small sizes, few steps")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only-shardadam", action="store_true", help="skip torch (kernel tuning)")
    ap.add_argument("--only", default="abcdefghijkl", help="the configurations to run, e.g. 'bf'")
    args = ap.parse_args()
    lib = load_lib(os.path.abspath(args.lib))
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}   torch {torch.__version__}")
    print(f"shardadam: {lib.sa_build_info().decode()}")
    copy = copy_gbps()
    print(f"device-to-device copy: {copy:,.0f} GB/s (read + write)")
    steps = 5 if args.quick else args.steps
    rows = []

    def run_pair(name, sizes, dtype, master, dtensor=False, torch_baseline=True, clip=False,
                 moment8=None):
        if name[1] not in args.only:
            return
        params = [torch.randn(n, device=dev).to(dtype) for n in sizes]
        grads = [torch.randn(n, device=dev).to(dtype) for n in sizes]
        elems = sum(sizes)
        bytes_per_step = 28 * elems  # fp32: r p,g,m,v w p,m,v; bf16+master: r g2,M4,m,v w p2,M4,m,v
        if moment8:  # r p4,g4,m1,v1 w p4,m1,v1, and a float32 absmax per 256 elements read and written
            bytes_per_step = 16 * elems + sum(8 * ((n + 255) // 256) for n in sizes)
        if clip:
            bytes_per_step += 4 * elems  # one more read of the fp32 grads, for the norm
        free_before = torch.cuda.mem_get_info()[0]
        sa = Shardadam(lib, params, master=master, max_grad_norm=1.0 if clip else 0.0,
                       moment=moment8)
        if moment8:  # everything the optimizer allocated (state, tables), seen by the driver
            taken = free_before - torch.cuda.mem_get_info()[0]
            print(f"{name}: shardadam device memory {taken / elems:.3f} bytes per param "
                  f"(moments and their absmax: {(2 * elems + sum(8 * ((n + 255) // 256) for n in sizes)) / elems:.3f})")
        sa.bind(grads)
        r = measure(f"{name}: shardadam", sa.step, bytes_per_step, steps)
        # Fresh pointer list every step (two grad sets alternating).
        grads_b = [g.clone() for g in grads]
        flip = [False]

        def rebind_and_step():
            flip[0] = not flip[0]
            sa.bind(grads_b if flip[0] else grads)
            sa.step()
        r["host_fresh_ms"] = host_ms(rebind_and_step, steps)
        r["elems"], r["shards"] = elems, len(sizes)
        rows.append(r)
        sa.close()
        if moment8 is UINT8 and not args.only_shardadam:
            bnb_baseline(name, params, grads, bytes_per_step, r)
        if torch_baseline and not args.only_shardadam:
            tparams = params
            if dtensor:
                from torch.distributed.tensor import Shard, distribute_tensor
                from torch.distributed.device_mesh import init_device_mesh
                mesh = init_device_mesh("cuda", (1,))
                tparams = [distribute_tensor(p, mesh, [Shard(0)]) for p in params]
            tparams = [torch.nn.Parameter(p) for p in tparams]
            for p, g in zip(tparams, grads):
                p.grad = g if not dtensor else distribute_like(g, p)
            opt = torch.optim.AdamW(tparams, lr=1e-3, weight_decay=1e-2, fused=True)
            torch_step = opt.step
            if clip:
                def torch_step():
                    # Scales the grads in place (after one step they sit at the bound); same work each step.
                    torch.nn.utils.clip_grad_norm_(tparams, 1.0, foreach=True)
                    opt.step()
            t = measure(f"{name}: torch {'clip_grad_norm_ + ' if clip else ''}fused AdamW"
                        f"{' (DTensor)' if dtensor else ''}", torch_step, bytes_per_step, steps)
            t["elems"], t["shards"] = elems, len(sizes)
            t["vs"] = r
            rows.append(t)
            del opt, tparams
        del params, grads, grads_b
        torch.cuda.empty_cache()

    def nccl_comm():
        """An sa_comm over NCCL of one rank on this device (a sharded current-scaled param
        needs one: its step all-reduces the amax between the two passes)."""
        uid, comm = (C.c_char * 128)(), C.c_void_p()
        for status in (lib.sa_nccl_unique_id_create(uid), lib.sa_comm_create_nccl(uid, 1, 0, dev.index or 0,
                                                                                   C.byref(comm))):
            if status != 0:
                raise RuntimeError(f"NCCL communicator: status {status}: {lib.sa_optimizer_last_error(None).decode()}")
        return comm

    def run_fp8(name, sizes, scaling, fmt=torch.float8_e4m3fn, sharded=False):
        """float8 params with fp32 masters (fp32 grads and moments), cast by `scaling`. Counted
        bytes: the update's 28 (r master, g, m, v; w master, m, v) plus the fp8 write (1) and
        the scales; current scaling's cast waits for the tensor's amax, so it reads the
        masters once more (33: the two passes the issue counts). sharded: each param a shard
        of a larger tensor, the step all-reducing the amaxes over a one-rank NCCL communicator
        (the collective and its place between the passes; no second GPU's latency)."""
        if name[1] not in args.only:
            return
        value, block = SCALINGS[scaling]
        elems = sum(sizes)
        masters = [torch.randn(n, device=dev) for n in sizes]
        params = [m.to(fmt) for m in masters]
        grads = [torch.randn(n, device=dev) for n in sizes]
        if scaling == "mxfp8":  # e8m0 code 127: 2^0
            scales = [torch.full((n // 32,), 127, dtype=torch.uint8, device=dev).view(torch.float8_e8m0fnu)
                      for n in sizes]
        else:
            scales = [torch.ones(n // block if block else (2 if scaling == "current" else 1), device=dev)
                      for n in sizes]
        scale_bytes = sum(s.numel() * s.element_size() for s in scales) if block else 0
        bytes_per_step = (33 if scaling == "current" else 29) * elems + scale_bytes
        comm = nccl_comm() if sharded else None
        sa = Shardadam(lib, params, fp8=(scaling, scales), comm=comm)
        sa.bind(grads)
        r = measure(f"{name}: shardadam", sa.step, bytes_per_step, steps)
        r["elems"], r["shards"] = elems, len(sizes)
        rows.append(r)
        if not torch.isfinite(params[0].float()).all() or torch.equal(params[0].float(), masters[0].to(fmt).float()):
            raise RuntimeError(f"{name}: the fp8 param did not move, or is not finite")
        sa.close()
        if comm:
            lib.sa_comm_destroy(comm)
        if scaling == "delayed" and not args.only_shardadam:
            # The peer: torch's fused AdamW on the fp32 masters, then each param cast from its
            # master times its scale (one foreach multiply, a copy_ per tensor).
            tmasters = [torch.nn.Parameter(m) for m in masters]
            for p, g in zip(tmasters, grads):
                p.grad = g
            opt = torch.optim.AdamW(tmasters, lr=1e-3, weight_decay=1e-2, fused=True)
            one = torch.ones((), device=dev)

            def torch_step():
                opt.step()
                with torch.no_grad():
                    for p, scaled in zip(params, torch._foreach_mul(tmasters, one)):
                        p.copy_(scaled)
            t = measure(f"{name}: torch fused AdamW + cast", torch_step, bytes_per_step, steps)
            t["elems"], t["shards"] = elems, len(sizes)
            t["vs"] = r
            rows.append(t)
            del opt, tmasters
        del masters, params, grads, scales
        torch.cuda.empty_cache()

    def bnb_baseline(name, params, grads, bytes_per_step, ours):
        # bitsandbytes' AdamW8bit on the same tensors: 8-bit blockwise moments for every
        # tensor (min_8bit_size=1), the non-empty ones only (it aborts the process on an
        # empty tensor).
        try:
            import bitsandbytes as bnb
        except ImportError as e:
            print(f"{name}: bitsandbytes baseline not run ({e})")
            return
        tparams = [torch.nn.Parameter(p.clone()) for p in params if p.numel()]
        for p, g in zip(tparams, [g for g in grads if g.numel()]):
            p.grad = g
        opt = bnb.optim.AdamW8bit(tparams, lr=1e-3, weight_decay=1e-2, min_8bit_size=1)
        t = measure(f"{name}: bitsandbytes AdamW8bit", opt.step, bytes_per_step, steps)
        t["elems"], t["shards"] = sum(p.numel() for p in tparams), len(tparams)
        t["vs"] = ours
        rows.append(t)
        state = sum(v.numel() * v.element_size() for s in opt.state.values() for k, v in s.items()
                    if torch.is_tensor(v) and k in ("state1", "state2", "absmax1", "absmax2"))
        print(f"{name}: bitsandbytes moment state {state / t['elems']:.3f} bytes per param")
        del opt, tparams

    def distribute_like(g, p):
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(g, p.device_mesh, p.placements, run_check=False)

    big = (1 << 20) if args.quick else (256 << 20)
    run_pair("(a) 1 x 256M fp32", [big], torch.float32, False)
    sizes = shard_sizes(args.quick)
    run_pair("(b) 1516 fp32 shards", sizes, torch.float32, False)
    if not args.quick and not args.only_shardadam and "c" in args.only:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29513")
        dist.init_process_group("nccl", rank=0, world_size=1)
        run_pair("(c) same shards, DTensors", sizes, torch.float32, False, dtensor=True)
        dist.destroy_process_group()
    run_pair("(d) bf16 + fp32 master", sizes, torch.bfloat16, True, torch_baseline=False)
    run_pair("(e) 1516 fp32 shards, L2 clip", sizes, torch.float32, False, clip=True)
    run_pair("(f) 1516 fp32 shards, 8-bit moments", sizes, torch.float32, False, torch_baseline=False,
             moment8=UINT8)
    run_pair("(g) 1516 fp32 shards, float8 moments", sizes, torch.float32, False, torch_baseline=False,
             moment8=FLOAT8)

    # fp8 params: the same shards, each rounded up to a whole number of 128-element blocks
    sizes128 = [-(-n // 128) * 128 for n in sizes]
    run_fp8("(h) float8 params, delayed scaling", sizes128, "delayed")
    run_fp8("(i) float8 params, current scaling", sizes128, "current")
    run_fp8("(j) float8 params, mxfp8", sizes128, "mxfp8")
    run_fp8("(k) float8 params, block128", sizes128, "block128")
    run_fp8("(l) float8 params, current, sharded (NCCL)", sizes128, "current", sharded=True)

    print()
    hdr = (f"{'config':48s} {'elements':>11s} {'kernel ms':>9s} {'host ms':>8s} {'host ms':>8s}"
           f" {'wall ms':>8s} {'GB/s':>7s} {'/copy':>6s} {'wall/krnl':>9s} {'vs torch':>8s}")
    print(hdr)
    print(f"{'':48s} {'':>11s} {'':>9s} {'(stable)':>8s} {'(fresh)':>8s}")
    for r in rows:
        vs = ""
        if "vs" in r:  # torch row: how much faster shardadam's wall time is
            vs = f"{r['wall_ms'] / r['vs']['wall_ms']:.2f}x"
        fresh = f"{r['host_fresh_ms']:8.3f}" if "host_fresh_ms" in r else f"{'':8s}"
        print(f"{r['label']:48s} {r['elems']:11,d} {r['kernel_ms']:9.3f} {r['host_ms']:8.3f} {fresh}"
              f" {r['wall_ms']:8.3f} {r['gbps']:7.0f} {r['gbps'] / copy:6.1%} "
              f"{r['wall_ms'] / r['kernel_ms']:9.3f} {vs:>8s}")
    print("\nvs torch = the baseline's (torch's or bitsandbytes') wall time / shardadam's on the same tensors.")


if __name__ == "__main__":
    main()
