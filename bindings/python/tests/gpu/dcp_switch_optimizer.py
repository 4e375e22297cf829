#!/usr/bin/env python3
"""Switch between torch.optim.AdamW and shardadam's FusedAdam through a
torch.distributed.checkpoint (DCP) checkpoint, under FSDP2, saved on N ranks, loaded on M.

    python3 bindings/python/tests/gpu/dcp_switch_optimizer.py                     # 2 GPUs -> 1 GPU
    python3 bindings/python/tests/gpu/dcp_switch_optimizer.py --device cpu --save-ranks 1 --load-ranks 2

It launches one process per rank itself (as reshard_fsdp2.py, whose launcher it uses; on
the CPU gloo with one thread per process). The user's code is DCP's documented one:

    model_sd, optim_sd = get_state_dict(model, opt);  dcp.save({...}, checkpoint_id=path)
    model_sd, optim_sd = get_state_dict(model, opt);  dcp.load({...}, checkpoint_id=path, planner=...)
    set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)

(set_state_dict loads the optimizer before the model). With --async-save the reference run
saves with dcp.async_save and trains on while it writes, waiting for its future at the end. The reference run on N ranks trains
--steps steps with one optimizer and an LR warmup, saves after --save-at and trains on:
those are the uninterrupted losses. Each case resumes on M ranks from another init with the
other optimizer and trains the remaining steps; its losses must be the reference's within
the case's rtol. Cases, per --precision:

- fp32 (float32 params): AdamW -> FusedAdam and FusedAdam -> AdamW with DCP's default
  (strict) planner; rtol 1e-5 (float32 rounding: the two optimizers order their float32
  operations differently).
- bf16-master (bfloat16 params; FusedAdam keeps fp32 masters, AdamW does not): FusedAdam ->
  AdamW with the default planner; AdamW -> FusedAdam (the checkpoint has no masters) with
  shardadam.torch.FusedAdamLoadPlanner, and with DefaultLoadPlanner(allow_partial_load=True).
  The masters must follow the loaded params (a master left at its construction-time value
  restarts training from the initial weights: measured 6e-2 off). rtol 5e-3 (measured 8e-4
  on the CPU): AdamW on bf16 params and FusedAdam with fp32 masters are different
  optimizers (AdamW's update is rounded to bf16 every step, FusedAdam's accumulates in the
  master).
- fp32-8bit (float32 params; FusedAdam keeps 8-bit moments): FusedAdam -> AdamW and AdamW
  -> FusedAdam with the default planner. The state dict holds the 8-bit moments as float32
  values (DTensors of the param's shape), so DCP reshards them and AdamW reads them; a
  load quantizes them by the local blocks. rtol 1e-3 (measured 6e-5 and 1.1e-4 on the CPU,
  2 -> 1 and 1 -> 2 ranks): the runs differ by the moments' quantization (each step's, and
  the load's).
- fp32-fp8 (float32 params; FusedAdam keeps float8 e4m3fn moments): the same cases and
  rtol as fp32-8bit (measured 8.6e-5 / 1.3e-4 on the CPU 2 -> 1 ranks, 2.2e-5 / 4.3e-5
  1 -> 2).

Prints a PASS/FAIL line per case and exits nonzero on any failure.
"""
import argparse
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy

from shardadam.torch import FusedAdam, FusedAdamLoadPlanner

from fsdp2_common import ModelConfig, Transformer, shard_model
from reshard_fsdp2 import init_rank, launch, train as train_on

CONFIG = ModelConfig(vocab=11, dim=8, heads=2, layers=1, seq=9, empty_shard=True)
GLOBAL_BATCH = 4
LR, WEIGHT_DECAY, BETAS = 1e-2, 0.05, (0.9, 0.95)
# param dtype, reduce dtype: the reduction is exact whatever the rank count (see reshard_fsdp2.py).
PRECISIONS = {"fp32": (torch.float32, torch.float64), "bf16-master": (torch.bfloat16, torch.float32),
              "fp32-8bit": (torch.float32, torch.float64), "fp32-fp8": (torch.float32, torch.float64)}
# FusedAdam's moment dtype per precision (the default: float32).
MOMENTS = {"fp32-8bit": torch.uint8, "fp32-fp8": torch.float8_e4m3fn}
OPTIMIZERS = ("AdamW", "FusedAdam")


def planners(precision, loader):
    """The planners a case loads with: (name, planner or None for DCP's default)."""
    if precision == "bf16-master" and loader == "FusedAdam":
        return [("FusedAdamLoadPlanner", FusedAdamLoadPlanner()),
                ("allow_partial_load", DefaultLoadPlanner(allow_partial_load=True))]
    return [("default planner", None)]


def cases(precisions):
    """(precision, saver, loader, planner name) of every case."""
    return [(precision, saver, loader, name) for precision in precisions for saver in OPTIMIZERS
            for loader in OPTIMIZERS if loader != saver for name, _ in planners(precision, loader)]


def warmup(step):
    return min(1.0, (step + 1) / 4)


def build(precision, which, mesh, device, seed):
    param_dtype, reduce_dtype = PRECISIONS[precision]
    torch.manual_seed(seed)
    model = Transformer(CONFIG).to(device=device, dtype=param_dtype)
    shard_model(model, mesh, MixedPrecisionPolicy(reduce_dtype=reduce_dtype))
    kind = torch.optim.AdamW if which == "AdamW" else FusedAdam
    # min_8bit_size=0: the model's params are all small, and every one is to take block moments.
    extra = ({"moment_dtype": MOMENTS[precision], "min_8bit_size": 0}
             if precision in MOMENTS and which == "FusedAdam" else {})
    opt = kind(model.named_parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, **extra)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup)


def train(model, opt, schedule, steps, device):
    """Every rank computes the loss on the same full batch (see reshard_fsdp2.py)."""
    return train_on(model, opt, schedule, steps, device, config=CONFIG, global_batch=GLOBAL_BATCH)


def save_rank(rank, world, args, run_dir, port):
    device, mesh = init_rank(rank, world, args.device, port)
    # async_save's collectives run on its own thread: a group of their own, as DCP's
    # documentation asks, so they never interleave with the training's.
    checkpoint_group = dist.new_group(backend="gloo") if args.async_save else None
    for precision in args.precision:
        for saver in OPTIMIZERS:
            model, opt, schedule = build(precision, saver, mesh, device, seed=0)
            losses = train(model, opt, schedule, range(args.save_at), device)
            model_sd, optim_sd = get_state_dict(model, opt)
            checkpoint_id = os.path.join(run_dir, precision, saver)
            schedule_state = schedule.state_dict()
            if args.async_save:
                # Training goes on while DCP writes: the steps change the optimizer's state
                # (FusedAdam's state dict views the library's buffers), which must not reach
                # the checkpoint.
                future = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=checkpoint_id,
                                        process_group=checkpoint_group)
                losses += train(model, opt, schedule, range(args.save_at, args.steps), device)
                future.result()
            else:
                dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=checkpoint_id)
                losses += train(model, opt, schedule, range(args.save_at, args.steps), device)
            if rank == 0:
                torch.save({"losses": losses, "schedule": schedule_state},
                           os.path.join(run_dir, precision, f"{saver}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def resume_rank(rank, world, args, run_dir, port):
    device, mesh = init_rank(rank, world, args.device, port)
    results = {}
    for precision, saver, loader, planner_name in cases(args.precision):
        model, opt, schedule = build(precision, loader, mesh, device, seed=123)  # all must come from the checkpoint
        planner = dict(planners(precision, loader))[planner_name]
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd}
        try:
            dcp.load(state, checkpoint_id=os.path.join(run_dir, precision, saver), planner=planner)
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        except (Exception, CheckpointException) as err:  # a case that fails to load is a FAIL row, not a dead run
            results[(precision, saver, loader, planner_name)] = f"load failed: {str(err).strip().splitlines()[-1]}"
            continue
        reference = torch.load(os.path.join(run_dir, precision, f"{saver}.pt"))
        schedule.load_state_dict(reference["schedule"])
        results[(precision, saver, loader, planner_name)] = train(model, opt, schedule,
                                                                 range(args.save_at, args.steps), device)
    if rank == 0:
        torch.save(results, os.path.join(run_dir, "resumed.pt"))
    dist.barrier()
    dist.destroy_process_group()


RTOL = {"fp32": 1e-5, "bf16-master": 5e-3, "fp32-8bit": 1e-3, "fp32-fp8": 1e-3}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda: NCCL, rank r on cuda:r; "
                        "cpu: gloo")
    parser.add_argument("--save-ranks", type=int, default=2)
    parser.add_argument("--load-ranks", type=int, default=1)
    parser.add_argument("--precision", nargs="+", choices=tuple(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--save-at", type=int, default=4, help="save after this many steps")
    parser.add_argument("--async-save", action="store_true", help="save with dcp.async_save and train on while "
                        "it writes (the losses after the save are those of the steps taken meanwhile)")
    args = parser.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < max(args.save_ranks, args.load_ranks):
        parser.error(f"--device cuda needs {max(args.save_ranks, args.load_ranks)} GPUs, this machine has "
                     f"{torch.cuda.device_count()}")
    if not 0 < args.save_at < args.steps:
        parser.error("--save-at must be in (0, --steps)")
    run_dir = tempfile.mkdtemp(prefix="shardadam_dcp_switch_")
    try:
        for precision in args.precision:
            os.makedirs(os.path.join(run_dir, precision))
        error = launch(save_rank, args.save_ranks, args, run_dir)
        if error:
            print(f"FAIL: the reference run on {args.save_ranks} ranks\n{error}")
            return 1
        error = launch(resume_rank, args.load_ranks, args, run_dir)
        if error:
            print(f"FAIL: the resume run on {args.load_ranks} ranks\n{error}")
            return 1
        resumed = torch.load(os.path.join(run_dir, "resumed.pt"))
        print(f"save on {args.save_ranks} ranks, load on {args.load_ranks} ({args.device}); torch {torch.__version__}; "
              f"{args.steps} steps, saved after {args.save_at}{' with dcp.async_save' if args.async_save else ''}")
        failed = False
        for case in cases(args.precision):
            precision, saver, loader, planner_name = case
            expected = torch.load(os.path.join(run_dir, precision, f"{saver}.pt"))["losses"][args.save_at:]
            got = resumed[case]
            if isinstance(got, str):
                ok, detail = False, got
            else:
                worst = max(abs(a - b) / abs(b) for a, b in zip(got, expected))
                ok = worst <= RTOL[precision]
                detail = (f"max rel diff of the losses {worst:.1e} (rtol {RTOL[precision]:.0e}); resumed "
                          f"{' '.join(f'{x:.5f}' for x in got)}; uninterrupted {' '.join(f'{x:.5f}' for x in expected)}")
            failed |= not ok
            print(f"{'PASS' if ok else 'FAIL'} {precision:<11} {saver:>9} -> {loader:<9} {planner_name:<20} {detail}")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"\n{'FAIL' if failed else 'PASS'}: all cases")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
