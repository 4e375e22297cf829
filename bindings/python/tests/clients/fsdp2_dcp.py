#!/usr/bin/env python3
"""FSDP2 (fully_shard) + torch.distributed.checkpoint with shardadam's FusedAdam in place
of torch.optim.AdamW, saved on N ranks and resumed on fewer.

    python3 bindings/python/tests/clients/fsdp2_dcp.py --device cpu            # 2 gloo processes -> 1
    python3 bindings/python/tests/clients/fsdp2_dcp.py --device cuda [--ranks 2] [--resume-ranks 1]

The training loop is the one the PyTorch FSDP2 and DCP tutorials teach: fully_shard per
block and at the root, data parallel batches (each rank its rows of the global batch),
``get_model_state_dict`` / ``get_optimizer_state_dict`` + ``dcp.save``, and on resume
``dcp.load`` into the new run's state dicts + ``set_model_state_dict`` /
``set_optimizer_state_dict``. The model, its data, the FSDP2 wrapping and the launcher are
those of bindings/python/tests/gpu (fsdp2_common, reshard_fsdp2.launch/init_rank, the
hyperparameters and warmup of fsdp2_train.py); the model is smaller (--dim, --vocab) so
that two CPU processes run it in seconds. Its vocab (101 by default) is split unevenly and
its 1-element ``logit_scale`` has an empty shard on every rank but the first.

Checks (rank 0's view of the global losses, side by side):

1. FusedAdam vs AdamW on --ranks ranks.
2. FusedAdam: saved at --save-at on --ranks ranks, resumed on --resume-ranks ranks (other
   init: everything comes from the checkpoint) vs the uninterrupted run. AdamW likewise, as
   the baseline.
3. Switching optimizers through DCP, as a user moving to or from FusedAdam does: an AdamW
   checkpoint resumed with FusedAdam (losses vs the uninterrupted AdamW run), and a
   FusedAdam checkpoint resumed with AdamW.

With --container torchtitan the optimizers live inside torchtitan's OptimizersContainer
(FusedAdam as its factory, as a torchtitan user plugs it in) and the checkpoint holds the
container's flat FQN-keyed state dict (``param_groups.<fqn>.<key>``: every live group key
must be in the saved groups), loaded back with the container's load_state_dict.

Tolerance: the resume changes the rank count, so the grads are averaged in another order
(half-batch means averaged vs one full-batch mean): ~1e-7 relative on the grads, a few
1e-7 on the losses after a few steps (fsdp2_train.py measured 2e-7 on H200s, this script
1e-7 on the CPU). --rtol (clients_common.FP32_RTOL, 1e-5) covers that and the optimizers'
different operation order (check 1). With --resume-ranks equal to --ranks a resume is
bitwise on the CPU.
The runs of each phase (the saving runs, the resumes) share one launch of the processes;
the time column charges it to the phase's first check.
Exit status 1 on any FAIL.
"""
import argparse
import dataclasses
import glob
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

import clients_common as common
from fsdp2_common import Transformer, batch, shard_model
from fsdp2_train import BETAS, CONFIG as FSDP2_TRAIN_CONFIG, GLOBAL_BATCH, LR, WEIGHT_DECAY, warmup
from reshard_fsdp2 import init_rank, launch
from shardadam.torch import FusedAdam

OPTIMIZERS = {"FusedAdam": FusedAdam, "AdamW": torch.optim.AdamW}
# (optimizer, the optimizer whose checkpoint it resumes from): checks 2 and 3.
RESUMES = (("FusedAdam", "FusedAdam"), ("AdamW", "AdamW"), ("FusedAdam", "AdamW"), ("AdamW", "FusedAdam"))

def config(args):
    return dataclasses.replace(FSDP2_TRAIN_CONFIG, vocab=args.vocab, dim=args.dim, layers=args.layers, seq=args.seq,
                               empty_shard=True)


def titan_container(optimizer, model, hyperparameters):
    """torchtitan's OptimizersContainer over the model, its one param group built by
    ``optimizer`` (FusedAdam as the factory, or AdamW), torchtitan's default "fused"
    implementation (its groups carry fused=True, foreach=False)."""
    from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig

    class Container(OptimizersContainer):
        @staticmethod
        def _resolve_optimizer_factory(name):
            return OPTIMIZERS[name]

    config = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name=optimizer, optimizer_kwargs=hyperparameters)])
    return Container(config, model_parts=[model])


def build(optimizer, args, mesh, device, seed):
    """(model, optimizer, LR schedule): the optimizer itself, or torchtitan's container of
    it (--container torchtitan; the schedule then drives the one optimizer inside)."""
    torch.manual_seed(seed)
    model = shard_model(Transformer(config(args)).to(device), mesh)
    hyperparameters = dict(lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    if args.container == "torchtitan":
        opt = titan_container(optimizer, model, hyperparameters)
        return model, opt, torch.optim.lr_scheduler.LambdaLR(opt.optimizers[0], warmup)
    opt = OPTIMIZERS[optimizer](model.parameters(), **hyperparameters)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup)


def optimizer_state(model, opt, args):
    """What DCP saves of the optimizer: torch's get_optimizer_state_dict, or torchtitan's
    flat FQN-keyed dict (its OptimizersContainer.state_dict, which first makes the state with
    a zero-lr step where there is none yet)."""
    return opt.state_dict() if args.container == "torchtitan" else get_optimizer_state_dict(model, opt)


def load_optimizer_state(model, opt, state, args):
    if args.container == "torchtitan":
        opt.load_state_dict(state)
    else:
        set_optimizer_state_dict(model, opt, state)


def train(model, opt, schedule, steps, args, device, rank, world):
    """Data parallel: each rank its rows of the global batch; returns the global losses."""
    losses = []
    for step in steps:
        tokens, targets = batch(config(args), step, GLOBAL_BATCH, rank, world)
        loss = F.cross_entropy(model(tokens.to(device)).flatten(0, 1), targets.to(device).flatten())
        loss.backward()
        opt.step()
        schedule.step()
        opt.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        dist.all_reduce(total)  # a sum: gloo has no AVG
        losses.append(total.item() / world)
    return losses


def recording_errors(rank, world, run_dir, name, function, *args):
    """function(*args); the error of a rank where it fails is left in run_dir as
    <name>.error, since the launcher only learns that a process exited. Returns whether it
    succeeded."""
    try:
        function(*args)
        return True
    except BaseException as exc:  # dcp's CheckpointException is a BaseException
        with open(os.path.join(run_dir, f"{name}.error.rank{rank}"), "w") as out:
            out.write(common.short_error(exc))
        return False


def run_error(run_dir, name):
    """The error a run left (the lowest failing rank's), or None."""
    for path in sorted(glob.glob(os.path.join(run_dir, f"{name}.error.rank*"))):
        with open(path) as f:
            return f.read()
    return None


def save_run(rank, world, run_dir, args, optimizer, mesh, device):
    model, opt, schedule = build(optimizer, args, mesh, device, seed=0)
    losses = train(model, opt, schedule, range(args.save_at), args, device, rank, world)
    checkpoint = os.path.join(run_dir, optimizer)
    dcp.save({"model": get_model_state_dict(model), "optim": optimizer_state(model, opt, args)},
             checkpoint_id=checkpoint)
    if rank == 0:
        torch.save(schedule.state_dict(), os.path.join(checkpoint, "schedule.pt"))
    losses += train(model, opt, schedule, range(args.save_at, args.steps), args, device, rank, world)
    if rank == 0:
        torch.save(losses, os.path.join(run_dir, f"{optimizer}.losses.pt"))


def resume_run(rank, world, run_dir, args, optimizer, saved_by, mesh, device):
    model, opt, schedule = build(optimizer, args, mesh, device, seed=123)  # everything must come from the checkpoint
    checkpoint = os.path.join(run_dir, saved_by)
    state = {"model": get_model_state_dict(model), "optim": optimizer_state(model, opt, args)}
    dcp.load(state, checkpoint_id=checkpoint)
    set_model_state_dict(model, state["model"])
    load_optimizer_state(model, opt, state["optim"], args)
    schedule.load_state_dict(torch.load(os.path.join(checkpoint, "schedule.pt")))
    losses = train(model, opt, schedule, range(args.save_at, args.steps), args, device, rank, world)
    if rank == 0:
        torch.save(losses, os.path.join(run_dir, f"{optimizer}-from-{saved_by}.losses.pt"))


def all_runs_rank(rank, world, run_dir, args, phase, port):
    """One rank of one launch: phase "save" runs every optimizer from the same init and
    saves it; phase "resume" resumes every (optimizer, checkpoint) pair. One launch per
    phase: starting the processes is most of the time of a small run. A run that fails
    leaves its error and the next one starts (a dcp failure raises on every rank alike)."""
    device, mesh = init_rank(rank, world, args.device, port)
    if phase == "save":
        runs = [(optimizer, save_run, (optimizer,)) for optimizer in OPTIMIZERS]
    else:
        runs = [(f"{optimizer}-from-{saved_by}", resume_run, (optimizer, saved_by)) for optimizer, saved_by in RESUMES]
    for name, function, what in runs:
        recording_errors(rank, world, run_dir, name, function, rank, world, run_dir, args, *what, mesh, device)
        dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_device_argument(parser)
    parser.add_argument("--ranks", type=int, default=None, help="ranks of the saving runs (default: 2, or the "
                        "GPU count when it is smaller)")
    parser.add_argument("--resume-ranks", type=int, default=None, help="default: --ranks / 2, at least 1")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--save-at", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=101)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--container", choices=("none", "torchtitan"), default="none",
                        help="torchtitan: the optimizers inside torchtitan's OptimizersContainer, saved and loaded "
                        "through its flat FQN-keyed state dict (what its checkpointer does)")
    parser.add_argument("--rtol", type=float, default=common.FP32_RTOL, help="FusedAdam vs AdamW, and resumes on "
                        "another rank count (clients_common.FP32_RTOL, RESUME_RTOL)")
    args = parser.parse_args()
    if args.ranks is None:
        args.ranks = 2 if args.device == "cpu" else max(1, min(2, torch.cuda.device_count()))
    if args.resume_ranks is None:
        args.resume_ranks = max(1, args.ranks // 2)
    common.check_device(parser, args.device, max(args.ranks, args.resume_ranks))
    if not 0 < args.save_at < args.steps:
        parser.error("--save-at must be in (0, --steps)")
    run_dir = tempfile.mkdtemp(prefix="shardadam_fsdp2_dcp_")
    via = ", torchtitan's OptimizersContainer" if args.container == "torchtitan" else ""
    report = common.Report(f"FSDP2 + DCP{via}, {args.device}, {args.ranks} ranks -> {args.resume_ranks}, "
                           f"{args.steps} steps, saved after {args.save_at}")

    launched = set()

    def losses(name, phase, world):
        """The losses of run `name`, launching its phase's runs at the first need."""
        if phase not in launched:
            launched.add(phase)
            error = launch(all_runs_rank, world, run_dir, args, phase)
            if error:
                print(f"the {phase} launch on {world} ranks failed: {error}")
        error = run_error(run_dir, name)
        if error:
            raise RuntimeError(f"{name} on {world} ranks: {error}")
        return torch.load(os.path.join(run_dir, f"{name}.losses.pt"))

    def uninterrupted(optimizer):
        return losses(optimizer, "save", args.ranks)

    def versus():
        return common.compare_losses(uninterrupted("FusedAdam"), uninterrupted("AdamW"), args.rtol)

    def resumed(optimizer, saved_by):
        reference = uninterrupted(saved_by)[args.save_at:]
        return common.compare_losses(losses(f"{optimizer}-from-{saved_by}", "resume", args.resume_ranks), reference,
                                     args.rtol, ours_title="resumed", reference_title="uninterrupted",
                                     first_step=args.save_at + 1)

    resume = f"{args.ranks} -> {args.resume_ranks} ranks"
    try:
        report.run(f"FusedAdam vs AdamW on {args.ranks} ranks", versus)
        report.run(f"FusedAdam resumed ({resume}) vs uninterrupted", resumed, "FusedAdam", "FusedAdam")
        report.run(f"AdamW resumed ({resume}) vs uninterrupted (baseline)", resumed, "AdamW", "AdamW")
        report.run(f"AdamW checkpoint resumed with FusedAdam ({resume}) vs AdamW uninterrupted", resumed,
                   "FusedAdam", "AdamW")
        report.run(f"FusedAdam checkpoint resumed with AdamW ({resume}) vs FusedAdam uninterrupted", resumed,
                   "AdamW", "FusedAdam")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
