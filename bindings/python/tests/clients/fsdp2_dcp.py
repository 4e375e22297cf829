#!/usr/bin/env python3
"""FSDP2 (fully_shard) + torch.distributed.checkpoint with shardadam's FusedAdam in place
of torch.optim.AdamW, saved on N ranks and resumed on fewer.

    python3 bindings/python/tests/clients/fsdp2_dcp.py --device cpu            # 2 gloo processes -> 1
    python3 bindings/python/tests/clients/fsdp2_dcp.py --device cuda [--ranks 2] [--resume-ranks 1]
    python3 bindings/python/tests/clients/fsdp2_dcp.py --device cpu|cuda --cpu-offload   # FSDP2's CPUOffloadPolicy

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

1. FusedAdam vs AdamW on --ranks ranks: the losses, and the final params (full tensors,
   gathered after the last step). What stepped the FusedAdam run: on every rank a
   FusedAdam whose native optimizer holds every FSDP2 param, on the expected backend
   (the CPU one for --device cpu and for --cpu-offload), with each param's and group's
   step count equal to the steps taken.
2. FusedAdam: saved at --save-at on --ranks ranks, resumed on --resume-ranks ranks (other
   init: everything comes from the checkpoint) vs the uninterrupted run. AdamW likewise, as
   the baseline.
3. Switching optimizers through DCP, as a user moving to or from FusedAdam does: an AdamW
   checkpoint resumed with FusedAdam (losses vs the uninterrupted AdamW run), and a
   FusedAdam checkpoint resumed with AdamW.

With --cpu-offload every fully_shard gets ``offload_policy=CPUOffloadPolicy()``: the
sharded params (DTensors), their grads and both optimizers' states live in host memory,
FSDP2 copies the shards to the device for its all-gathers and the reduced grads back, and
FusedAdam registers CPU params, which the library's CPU backend steps. An extra check
reads that it took effect in both runs: FSDP2's params flagged for offload, their local
shards and the optimizer states on the CPU. On --device cpu the policy's copies are
CPU-to-CPU and its memory is not pinned (torch's pin_memory() needs a CUDA driver: the
default CPUOffloadPolicy() raises "Found no NVIDIA driver on your system" in
fully_shard), but FSDP2 takes its offload path (no foreach copy-in, the grads moved with
.to("cpu")); on --device cuda the memory is pinned (torch's default) and the compute runs
on the GPU. The checkpoints and resumes (checks 2 and 3) run offloaded too.

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
from torch.distributed.fsdp import CPUOffloadPolicy

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


def offload_policy(args):
    """FSDP2's CPUOffloadPolicy for --cpu-offload (None otherwise): pinned host memory on
    --device cuda (torch's default), unpinned on --device cpu, where pinning needs a CUDA
    driver and the copies are CPU-to-CPU."""
    return CPUOffloadPolicy(pin_memory=args.device == "cuda") if args.cpu_offload else None


def build(optimizer, args, mesh, device, seed):
    """(model, optimizer, LR schedule): the optimizer itself, or torchtitan's container of
    it (--container torchtitan; the schedule then drives the one optimizer inside)."""
    torch.manual_seed(seed)
    model = shard_model(Transformer(config(args)).to(device), mesh, offload_policy=offload_policy(args))
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


def without_key_biases(params, args):
    """The params ({name: full tensor}) with the key third of every ``qkv.bias`` left out.
    Adding a vector b_k to every key adds q.b_k to all the scores of a query, which softmax
    ignores: b_k's grad is zero up to rounding (~1e-10 here), and Adam, g / (sqrt(v) + eps),
    makes updates of that noise. Two correct optimizers an ulp apart after the first step
    get other noise from then on and drift apart there (~1e-4 of the bias after 4 steps,
    measured on the CPU, with or without offload), while the other params agree to ~1e-7."""
    out = dict(params)
    for layer in range(args.layers):
        name = f"blocks.{layer}.qkv.bias"
        q, _, v = params[name].split(args.dim)
        out[name] = torch.cat([q, v])
    return out


def the_optimizer(opt, args):
    """The torch optimizer itself (inside torchtitan's container with --container torchtitan)."""
    return opt.optimizers[0] if args.container == "torchtitan" else opt


def fsdp_offloads(model):
    """Whether FSDP2 flags every param of every fully_shard module of the model for CPU
    offload (FSDPParam.offload_to_cpu: torch internals, read for this check only); None
    where this torch does not have them."""
    flags = []
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if state else None
        if group is not None:
            flags += [getattr(fsdp_param, "offload_to_cpu", None) for fsdp_param in group.fsdp_params]
    if not flags or None in flags:
        return None
    return all(flags)


def final_state(model, opt, args, world):
    """What the checks read of a finished run (collective): the full params (every rank
    gathers them; rank 0 saves them) and each rank's view of what holds and steps them."""
    params = {name: p.full_tensor().detach().cpu() for name, p in model.named_parameters()}
    inner = the_optimizer(opt, args)
    model_params = list(model.parameters())
    states = [t for p in model_params for key, t in inner.state[p].items() if torch.is_tensor(t) and key != "step"]
    mine = {"optimizer": type(inner).__name__, "params": len(model_params),
            "param devices": sorted({p.to_local().device.type for p in model_params}),
            "state devices": sorted({t.device.type for t in states}), "states": len(states),
            "offloaded": fsdp_offloads(model)}
    if isinstance(inner, FusedAdam):
        native = inner.native
        mine.update({"registered": native.num_params, "backend": tuple(native.device),
                     "group steps": [group.step for group in native.param_groups],
                     "param steps": sorted(set(native.param_steps()))})
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    return {"params": params, "ranks": ranks}


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
    final = final_state(model, opt, args, world)
    if rank == 0:
        torch.save(losses, os.path.join(run_dir, f"{optimizer}.losses.pt"))
        torch.save(final, os.path.join(run_dir, f"{optimizer}.final.pt"))


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
    parser.add_argument("--cpu-offload", action="store_true",
                        help="fully_shard with FSDP2's CPUOffloadPolicy: params, grads and optimizer states in host "
                        "memory, FusedAdam's params on the library's CPU backend")
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
    via += ", CPUOffloadPolicy" if args.cpu_offload else ""
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

    def final(optimizer):
        uninterrupted(optimizer)  # launches the saving runs, raises the run's error
        return torch.load(os.path.join(run_dir, f"{optimizer}.final.pt"))

    def final_params():
        ok, detail = common.compare_params(without_key_biases(final("FusedAdam")["params"], args),
                                           without_key_biases(final("AdamW")["params"], args), args.rtol)
        return ok, detail + "; qkv.bias without its key third (a zero grad up to rounding: without_key_biases)"

    backend = "cpu" if args.device == "cpu" or args.cpu_offload else "cuda"
    # DLPack device types (torch's Tensor.__dlpack_device__): the library reports its params' device so.
    backend_type = {"cpu": 1, "cuda": 2}[backend]

    def fused_adam_stepped():
        """Every rank: a FusedAdam whose native optimizer holds every param of the model,
        on the expected backend, each param and group stepped args.steps times."""
        wrong = []
        for rank, seen in enumerate(final("FusedAdam")["ranks"]):
            expected = {"optimizer": "FusedAdam", "registered": seen["params"], "group steps": [args.steps],
                        "param steps": [args.steps]}
            wrong += [f"rank {rank}: {key} {seen.get(key)!r}, expected {value!r}" for key, value in expected.items()
                      if seen.get(key) != value]
            if seen.get("backend", (None,))[0] != backend_type:
                wrong.append(f"rank {rank}: the library's params are on DLPack device {seen.get('backend')!r}, "
                             f"expected the {backend} backend (type {backend_type})")
        seen = final("FusedAdam")["ranks"][0]
        return not wrong, "; ".join(wrong) or (f"{len(final('FusedAdam')['ranks'])} ranks: FusedAdam over "
                                              f"{seen['registered']} params on the {backend} backend (DLPack "
                                              f"{seen['backend']}), {args.steps} steps per param and group")

    def offloaded():
        """--cpu-offload: in both runs, on every rank, FSDP2 flags its params for offload and
        the local shards and optimizer states are CPU tensors."""
        wrong = []
        for optimizer in OPTIMIZERS:
            for rank, seen in enumerate(final(optimizer)["ranks"]):
                if seen["offloaded"] is None:
                    wrong.append(f"{optimizer} rank {rank}: FSDP2's offload flags (FSDPParam.offload_to_cpu) are "
                                 "not where fsdp_offloads looks in this torch")
                elif not seen["offloaded"]:
                    wrong.append(f"{optimizer} rank {rank}: FSDP2 has params not flagged offload_to_cpu")
                expected = {"param devices": ["cpu"], "state devices": ["cpu"]}
                wrong += [f"{optimizer} rank {rank}: {key} {seen.get(key)!r}, expected {value!r}"
                          for key, value in expected.items() if seen.get(key) != value]
                if seen["states"] == 0:
                    wrong.append(f"{optimizer} rank {rank}: no optimizer state")
        return not wrong, "; ".join(wrong) or (f"FusedAdam and AdamW, {len(final('AdamW')['ranks'])} ranks: every "
                                              "param flagged offload_to_cpu by FSDP2, local shards and optimizer "
                                              "states on the CPU")

    def resumed(optimizer, saved_by):
        reference = uninterrupted(saved_by)[args.save_at:]
        return common.compare_losses(losses(f"{optimizer}-from-{saved_by}", "resume", args.resume_ranks), reference,
                                     args.rtol, ours_title="resumed", reference_title="uninterrupted",
                                     first_step=args.save_at + 1)

    resume = f"{args.ranks} -> {args.resume_ranks} ranks"
    try:
        report.run(f"FusedAdam vs AdamW on {args.ranks} ranks", versus)
        report.run(f"FusedAdam vs AdamW on {args.ranks} ranks: final params", final_params)
        report.run(f"FusedAdam stepped every param on the {backend} backend", fused_adam_stepped)
        if args.cpu_offload:
            report.run("CPUOffloadPolicy in effect: params and optimizer states on the CPU", offloaded)
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
