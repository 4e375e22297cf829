#!/usr/bin/env python3
"""Save FusedAdam + model under FSDP2 on N ranks, load on M ranks: bitwise checks.

    python3 bindings/python/tests/gpu/reshard_fsdp2.py                       # 4 GPUs -> 2 GPUs
    python3 bindings/python/tests/gpu/reshard_fsdp2.py --save-ranks 2 --load-ranks 1
    python3 bindings/python/tests/gpu/reshard_fsdp2.py --device cpu          # 4 -> 2 gloo processes

It launches one process per rank itself (torch.multiprocessing, a free local port; on CUDA
rank r uses cuda:r; on the CPU gloo with one thread per process). For each --precision
(fp32: float32 params; bf16-master: bfloat16 params with FusedAdam's fp32 master weights):

1. Reference run on N ranks: a small transformer under fully_shard trains --steps steps with
   shardadam.torch.FusedAdam and an LR warmup. One param has a dim 0 that N does not divide
   and a shard that is empty on some rank; the script checks that on the actual FSDP2
   shards and fails otherwise. After step --save-at it saves
   - dcp: model and optimizer with torch.distributed.checkpoint (get_model_state_dict,
     get_optimizer_state_dict, dcp.save);
   - shardfiles: the optimizer with FusedAdam.save_shard_file (one shardadam shard file per
     rank); the model weights still go through torch.distributed.checkpoint (a shard file
     holds optimizer state only);
   and records every optimizer state gathered to full tensors (exp_avg, exp_avg_sq, master,
   step), the groups' hyperparameters and the model's output on a fixed input.
2. For each --format, a resume run on M ranks from a different init: load, then check
   (a) every gathered optimizer state equals the reference's bit for bit, (b) the output on
   the fixed input is bitwise equal, (c) training the remaining steps gives the reference's
   losses within --rtol.

Data: every rank computes the loss on the same full batch, so the gradient every rank
holds before the reduce-scatter is the same whatever the rank count, and FSDP2's average of
N copies is that gradient again. The reduction runs in a dtype that makes this exact in
any summation order (float64 for fp32 params, float32 for bf16 params: there a sum of up
to 2**16 copies of one value is exact, and dividing by N gives the value back), so with
deterministic kernels the resumed losses equal the uninterrupted ones bit for bit; --rtol
covers nondeterministic GPU kernels (see its help). The reference run is the uninterrupted
one: it saves at step --save-at and trains on.

Prints a PASS/FAIL table per (precision, format) and exits nonzero on any failure. Needs
torch >= 2.6 and the shardadam package (pip install ./bindings/python).
"""
import argparse
import glob
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from shardadam.torch import FusedAdam

from fsdp2_common import ModelConfig, Transformer, batch, free_port, shard_model

# A few thousand params: the point is the layout and the bitwise checks, not the model.
# pos has seq = 9 rows: torch.chunk over 4 ranks gives 3, 3, 3, 0 rows; logit_scale has one
# element: empty on every rank but the first, whatever the rank count.
CONFIG = ModelConfig(vocab=11, dim=8, heads=2, layers=2, seq=9, empty_shard=True)
GLOBAL_BATCH = 4
FIXED_INPUT_STEP = 10_000  # batch() of this step is the fixed input of the output check
LR, WEIGHT_DECAY, BETAS = 1e-2, 0.05, (0.9, 0.95)
# param dtype, reduce dtype: exact for sums of equal values (see the docstring). A float32
# sum of 4 equal float32 grads can round in a ring's order (g + g + g), not in a tree's.
PRECISIONS = {
    "fp32": (torch.float32, torch.float64),
    "bf16-master": (torch.bfloat16, torch.float32),
}
FORMATS = ("dcp", "shardfiles")
# Default --rtol per precision. With deterministic kernels (the CPU) the losses are equal
# bit for bit (measured on the CPU). Estimates for a nondeterministic GPU kernel (e.g.
# atomics in an attention backward): it changes a float32 grad by about an ulp (6e-8
# relative) per step, which six Adam steps carry into the loss at ~1e-6 at most; with bf16
# params the same ulp can flip a param's bf16 rounding (2**-8 relative on that element),
# ~1e-4 of the loss at most.
DEFAULT_RTOL = {"fp32": 1e-5, "bf16-master": 1e-3}


def warmup(step):
    return min(1.0, (step + 1) / 4)


# ---- one rank ------------------------------------------------------------------------------------
def init_rank(rank, world, device_type, port):
    if device_type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=device)
    else:
        device = torch.device("cpu")
        # One thread per process: the ranks share few cores, and a CPU kernel's result must
        # not depend on how many threads split it (the output check is bitwise).
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return device, init_device_mesh(device_type, (world,))


def build(precision, mesh, device, seed):
    """The model (init from `seed`) under fully_shard, FusedAdam over its named params
    (the names are what shard files match on) and the LR warmup."""
    param_dtype, reduce_dtype = PRECISIONS[precision]
    torch.manual_seed(seed)
    model = Transformer(CONFIG).to(device=device, dtype=param_dtype)
    shard_model(model, mesh, MixedPrecisionPolicy(reduce_dtype=reduce_dtype))
    opt = FusedAdam(model.named_parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    if param_dtype != torch.float32:
        assert all("master" in opt.state[p] for p in model.parameters()), "bf16 params without fp32 master weights"
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup)


def shard_rows(model, world):
    """Per param, its dim-0 size and the dim-0 size of every rank's local shard (collective)."""
    local = {name: p.to_local().shape[0] for name, p in model.named_parameters()}
    every = [None] * world
    dist.all_gather_object(every, local)
    return {name: (p.shape[0], [rows[name] for rows in every]) for name, p in model.named_parameters()}


def check_uneven_sharding(shards, world):
    """The FSDP2 shards follow torch.chunk, and (on more than one rank) some param whose
    dim 0 `world` does not divide has an empty shard, the case this script exists for.
    Returns those params, with their per-rank dim-0 sizes."""
    for name, (rows, local) in shards.items():
        expected = [len(c) for c in torch.arange(rows).chunk(world)]
        expected += [0] * (world - len(expected))
        assert local == expected, f"{name}: FSDP2 shards of {rows} rows on {world} ranks are {local}, torch.chunk " \
                                  f"gives {expected}"
    empty = {name: local for name, (rows, local) in shards.items() if rows % world and 0 in local}
    assert world == 1 or empty, f"no param with an empty shard on {world} ranks: {shards}"
    return empty


def train(model, opt, schedule, steps, device, config=CONFIG, global_batch=GLOBAL_BATCH):
    """Every rank computes the loss on the same full batch (see the module docstring);
    returns the losses (rank 0's)."""
    losses = []
    for step in steps:
        tokens, targets = batch(config, step, global_batch)
        loss = F.cross_entropy(model(tokens.to(device)).float().flatten(0, 1), targets.to(device).flatten())
        loss.backward()
        opt.step()
        schedule.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def snapshot(model, opt, device):
    """Every optimizer state gathered to a full tensor, keyed "<param>/<state>" (step as
    FusedAdam's state_dict reports it), the groups' hyperparameters, and the model's output
    on the fixed input (collective: every rank calls it; the tensors are on the CPU)."""
    opt.state_dict()  # refreshes each param's "step" from the library
    states = {}
    for name, param in model.named_parameters():
        for key, value in sorted(opt.state[param].items()):
            full = value.full_tensor() if isinstance(value, DTensor) else value
            states[f"{name}/{key}"] = full.detach().cpu().clone()
    # Tuples as lists: a checkpoint may turn betas into a list.
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in group.items()
               if k not in ("params", "param_names")} for group in opt.param_groups]
    with torch.no_grad():
        tokens, _ = batch(CONFIG, FIXED_INPUT_STEP, GLOBAL_BATCH)
        output = model(tokens.to(device)).detach().cpu()
    return {"states": states, "groups": groups, "output": output}


def bits(tensor):
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def same_bits(a, b):
    """Equal dtype, shape and bytes (NaNs and signed zeros included)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def save_rank(rank, world, args, precision, run_dir, port):
    device, mesh = init_rank(rank, world, args.device, port)
    model, opt, schedule = build(precision, mesh, device, seed=0)
    shards = shard_rows(model, world)
    empty = check_uneven_sharding(shards, world)
    losses = train(model, opt, schedule, range(args.save_at), device)
    if "dcp" in args.format:
        dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
                 checkpoint_id=os.path.join(run_dir, "dcp"))
    if "shardfiles" in args.format:
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=os.path.join(run_dir, "model"))
        os.makedirs(os.path.join(run_dir, "shardfiles"), exist_ok=True)
        opt.save_shard_file(os.path.join(run_dir, "shardfiles", f"rank{rank:05d}-of-{world:05d}.safetensors"))
    saved = snapshot(model, opt, device)
    losses += train(model, opt, schedule, range(args.save_at, args.steps), device)
    if rank == 0:
        torch.save(schedule.state_dict(), os.path.join(run_dir, "schedule.pt"))
        torch.save({**saved, "losses": losses, "shards": shards, "empty": empty},
                   os.path.join(run_dir, "reference.pt"))
    dist.barrier()
    dist.destroy_process_group()


def resume_rank(rank, world, args, precision, checkpoint_format, run_dir, port):
    device, mesh = init_rank(rank, world, args.device, port)
    model, opt, schedule = build(precision, mesh, device, seed=123)  # everything must come from the checkpoint
    shards = shard_rows(model, world)
    empty = check_uneven_sharding(shards, world)
    if checkpoint_format == "dcp":
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        dcp.load(state, checkpoint_id=os.path.join(run_dir, "dcp"))
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])
    else:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=os.path.join(run_dir, "model"))
        set_model_state_dict(model, state["model"])
        opt.load_shard_files(sorted(glob.glob(os.path.join(run_dir, "shardfiles", "*.safetensors"))))
    schedule.load_state_dict(torch.load(os.path.join(run_dir, "schedule.pt")))
    loaded = snapshot(model, opt, device)
    losses = train(model, opt, schedule, range(args.save_at, args.steps), device)
    if rank == 0:
        torch.save({**loaded, "losses": losses, "shards": shards, "empty": empty},
                   os.path.join(run_dir, f"resumed_{checkpoint_format}.pt"))
    dist.barrier()
    dist.destroy_process_group()


# ---- the launcher --------------------------------------------------------------------------------
def launch(function, world, *args):
    """Runs function(rank, world, *args, port) in `world` fresh processes; returns None or
    the error text of the first one that failed."""
    try:
        mp.start_processes(function, args=(world, *args, free_port()), nprocs=world, start_method="spawn")
    except Exception:  # a rank raised (its traceback is in the message) or died
        return traceback.format_exc(limit=0).strip()
    return None


def compare(reference, resumed, save_at, rtol):
    """The three checks of one resume: (ok, detail) each."""
    count = len(reference["states"])
    differ = [key for key, value in reference["states"].items()
              if key not in resumed["states"] or not same_bits(value, resumed["states"][key])]
    equal = count - len(differ)
    differ += sorted(set(resumed["states"]) - set(reference["states"]))  # states the reference lacks
    if reference["groups"] != resumed["groups"]:
        differ.append("param_groups hyperparameters")
    states = (not differ, f"{equal}/{count} equal" + (f"; differ: {', '.join(differ[:4])}" if differ else ""))
    output = (same_bits(reference["output"], resumed["output"]), f"{tuple(reference['output'].shape)} "
              f"{str(reference['output'].dtype).replace('torch.', '')}")
    expected = reference["losses"][save_at:]
    got = resumed["losses"]
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, expected))
    equal = sum(a == b for a, b in zip(got, expected))
    ok = len(got) == len(expected) and worst <= rtol and all(math.isfinite(x) for x in got)
    losses = (ok, f"max rel diff {worst:.1e} (rtol {rtol:.0e}), {equal}/{len(expected)} equal"
                  + (f"; {len(got)} losses for {len(expected)} steps" if len(got) != len(expected) else ""))
    return {"states bitwise": states, "output bitwise": output, "losses": losses}


def print_empty_shards(what, run, world):
    for name, local in run["empty"].items():
        print(f"{what}: {name} (dim 0 of size {run['shards'][name][0]}) has an empty shard on {world} ranks: "
              f"dim 0 per rank {local}")


def run_precision(args, precision, root):
    """The reference run and one resume per format; returns the table rows."""
    run_dir = os.path.join(root, precision)
    os.makedirs(run_dir, exist_ok=True)
    rtol = args.rtol if args.rtol is not None else DEFAULT_RTOL[precision]
    start = time.perf_counter()
    error = launch(save_rank, args.save_ranks, args, precision, run_dir)
    print(f"[{precision}] reference run on {args.save_ranks} ranks: {time.perf_counter() - start:.0f} s"
          + (f", FAILED\n{error}" if error else ""), flush=True)
    if error:
        return [(precision, f, {"reference run": (False, error.splitlines()[-1][:100])}) for f in args.format]
    reference = torch.load(os.path.join(run_dir, "reference.pt"))
    print_empty_shards(f"[{precision}] reference", reference, args.save_ranks)
    print(f"[{precision}] losses of the reference: {' '.join(f'{x:.6f}' for x in reference['losses'])}")
    rows = []
    for checkpoint_format in args.format:
        start = time.perf_counter()
        error = launch(resume_rank, args.load_ranks, args, precision, checkpoint_format, run_dir)
        print(f"[{precision}/{checkpoint_format}] resume on {args.load_ranks} ranks: "
              f"{time.perf_counter() - start:.0f} s" + (f", FAILED\n{error}" if error else ""), flush=True)
        if error:
            rows.append((precision, checkpoint_format, {"resume run": (False, error.splitlines()[-1][:100])}))
            continue
        resumed = torch.load(os.path.join(run_dir, f"resumed_{checkpoint_format}.pt"))
        print_empty_shards(f"[{precision}/{checkpoint_format}] resume", resumed, args.load_ranks)
        print(f"[{precision}/{checkpoint_format}] resumed losses: {' '.join(f'{x:.6f}' for x in resumed['losses'])}")
        rows.append((precision, checkpoint_format, compare(reference, resumed, args.save_at, rtol)))
    return rows


def print_table(rows, args):
    print(f"\nsave on {args.save_ranks} ranks, load on {args.load_ranks} ({args.device}); torch {torch.__version__}; "
          f"{args.steps} steps, saved after {args.save_at}")
    print(f"{'precision':<12} {'format':<11} {'check':<15} {'result':<6} detail")
    failed = False
    for precision, checkpoint_format, checks in rows:
        for check, (ok, detail) in checks.items():
            failed |= not ok
            print(f"{precision:<12} {checkpoint_format:<11} {check:<15} {'PASS' if ok else 'FAIL':<6} {detail}")
    print(f"\n{'FAIL' if failed else 'PASS'}: all checks")
    return failed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda: NCCL, rank r on cuda:r; "
                        "cpu: gloo")
    parser.add_argument("--save-ranks", type=int, default=4)
    parser.add_argument("--load-ranks", type=int, default=2)
    parser.add_argument("--precision", nargs="+", choices=tuple(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--format", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-at", type=int, default=6, help="save after this many steps")
    parser.add_argument("--rtol", type=float, default=None,
                        help="relative tolerance on the resumed losses (default: "
                             + ", ".join(f"{k} {v:.0e}" for k, v in DEFAULT_RTOL.items())
                             + "; bitwise equal is expected with deterministic kernels)")
    parser.add_argument("--dir", default=None, help="run directory, kept (default: a temporary one, removed)")
    args = parser.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < max(args.save_ranks, args.load_ranks):
        parser.error(f"--device cuda needs {max(args.save_ranks, args.load_ranks)} GPUs, this machine has "
                     f"{torch.cuda.device_count()}")
    if not 0 < args.save_at < args.steps:
        parser.error("--save-at must be in (0, --steps)")
    root = args.dir or tempfile.mkdtemp(prefix="shardadam_reshard_")
    start = time.perf_counter()
    rows = []
    try:
        for precision in args.precision:
            rows += run_precision(args, precision, root)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    failed = print_table(rows, args)
    print(f"wall time {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
