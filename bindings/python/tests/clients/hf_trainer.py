#!/usr/bin/env python3
"""Hugging Face transformers.Trainer with shardadam's FusedAdam in place of AdamW.

    python3 bindings/python/tests/clients/hf_trainer.py [--device cpu|cuda] [--steps 20]

A tiny Llama-style model (LlamaConfig, random init, nothing downloaded: RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU) trains on learnable random token sequences
with the stock Trainer: its param groups (no weight decay on norms and biases), its
linear LR decay, its gradient clipping (max_grad_norm=1), its checkpoints. Only the
optimizer changes, through Trainer's ``optimizer_cls_and_kwargs`` argument:

    Trainer(..., optimizer_cls_and_kwargs=(FusedAdam, dict(lr=..., betas=..., eps=...)))

That is the route a user takes: Trainer still builds its own param groups and hands them
to the class, so nothing else changes (``optimizers=(opt, sched)`` makes the user rebuild
the decay/no-decay split and is refused with FSDP; a ``create_optimizer`` override is a
subclass to maintain; ``optim=`` only names optimizers transformers knows). The reference
is the Trainer's own ``optim="adamw_torch"`` (torch.optim.AdamW) with the same arguments.

Checks (each prints both loss curves, the max abs and relative difference):

1. fp32: FusedAdam vs AdamW, --steps steps.
2. fp32 resume: the FusedAdam run saved a checkpoint at step --save-at; a fresh Trainer
   (other init: everything must come from the checkpoint) with
   ``train(resume_from_checkpoint=...)`` continues, and its losses equal the
   uninterrupted run's. The same for AdamW, the Trainer's own baseline. And a user
   switching optimizers: AdamW's checkpoint resumed with FusedAdam (its load_state_dict
   takes torch AdamW state dicts), FusedAdam's resumed with AdamW, each against the
   uninterrupted run of the optimizer that saved it (--rtol).
3. bf16 params with FusedAdam's fp32 master weights against AdamW over fp32 params, both
   with ``bf16=True`` (autocast): the like-for-like reference (clients_common.BF16_RTOL
   says why, and why the tolerance). AdamW over the bf16 params themselves is shown for
   scale, not checked.
4. bf16 resume: as 2, with the master weights coming back from the checkpoint.
5. Gradient accumulation (gradient_accumulation_steps=2): FusedAdam vs AdamW.

Losses are the model's own (output.loss of every training forward, read by a forward
hook: exact, whatever the Trainer's logging does). Exit status 1 on any FAIL.
"""
import argparse
import os
import shutil
import sys
import tempfile

import torch

import clients_common as common
from shardadam.torch import FusedAdam

MODEL = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
SEQ, BATCH = 32, 4
LR, BETAS, EPS, WEIGHT_DECAY = 3e-3, (0.9, 0.95), 1e-8, 0.1


class TokenDataset(torch.utils.data.Dataset):
    """Causal LM examples: input_ids = labels (the model shifts them), seeded."""

    def __init__(self, count, seed=0):
        tokens, targets = common.token_sequences(count, MODEL["vocab_size"], SEQ, seed)
        self.ids = torch.cat([tokens, targets[:, -1:]], dim=1)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_model(dtype, seed):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**MODEL)).to(dtype)


def training_args(out_dir, run, device, steps, save_at, accumulation=1, bf16=False):
    from transformers import TrainingArguments
    return TrainingArguments(
        output_dir=os.path.join(out_dir, run), max_steps=steps, per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=accumulation, learning_rate=LR, adam_beta1=BETAS[0], adam_beta2=BETAS[1],
        adam_epsilon=EPS, weight_decay=WEIGHT_DECAY, warmup_steps=3, optim="adamw_torch", bf16=bf16,
        use_cpu=device == "cpu", save_strategy="steps", save_steps=save_at, logging_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_pin_memory=False, seed=0)


# FusedAdam's offload= (--offload): None keeps the state on the device.
OFFLOAD = {"offload": None}


def fused_adam_route(args):
    """What a user passes to Trainer for FusedAdam: the class and the hyperparameters
    TrainingArguments holds (the param groups and their weight decay come from Trainer)."""
    kwargs = dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
    if OFFLOAD["offload"] is not None:
        kwargs["offload"] = OFFLOAD["offload"]
    return (FusedAdam, kwargs)


class Run:
    """One Trainer run; `losses` are the training forwards' losses in order."""

    def __init__(self, optimizer, out_dir, run, device, steps, save_at, dtype=torch.float32, seed=0, **options):
        from transformers import Trainer
        self.model = make_model(dtype, seed)
        self.losses = []
        self.model.register_forward_hook(lambda module, inputs, output: self.losses.append(output.loss.item()))
        args = training_args(out_dir, run, device, steps, save_at, **options)
        extra = {"optimizer_cls_and_kwargs": fused_adam_route(args)} if optimizer == "FusedAdam" else {}
        dataset = TokenDataset(steps * BATCH * args.gradient_accumulation_steps)
        self.trainer = Trainer(model=self.model, args=args, train_dataset=dataset, **extra)
        self.checkpoint = os.path.join(args.output_dir, f"checkpoint-{save_at}")
        self.optimizer_name = optimizer

    def train(self, resume_from_checkpoint=None):
        self.trainer.train(resume_from_checkpoint=resume_from_checkpoint)
        expected = FusedAdam if self.optimizer_name == "FusedAdam" else torch.optim.AdamW
        # The checks are vacuous unless Trainer stepped the optimizer they name.
        assert type(self.optimizer()) is expected, f"Trainer used {type(self.optimizer())}, not {expected}"
        return self

    def optimizer(self):
        opt = self.trainer.optimizer
        return getattr(opt, "optimizer", opt)  # accelerate wraps it


def check_masters(run):
    """FusedAdam keeps fp32 master weights for every bf16 param."""
    opt = run.optimizer()
    missing = [i for i, p in enumerate(run.model.parameters()) if opt.state[p].get("master") is None]
    dtypes = {str(opt.state[p]["master"].dtype) for p in run.model.parameters() if "master" in opt.state[p]}
    return not missing and dtypes == {"torch.float32"}, f"{len(missing)} params without a master; masters {dtypes}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_device_argument(parser)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-at", type=int, default=10)
    parser.add_argument("--rtol", type=float, default=common.FP32_RTOL, help="fp32 FusedAdam vs AdamW")
    parser.add_argument("--resume-rtol", type=float, default=common.RESUME_RTOL)
    parser.add_argument("--bf16-rtol", type=float, default=common.BF16_RTOL)
    parser.add_argument("--dir", default=None, help="output directory, kept (default: a temporary one, removed)")
    parser.add_argument("--offload", choices=["none", "host", "cpu"], default="none",
                        help="FusedAdam(offload=...): where its state lives (docs/offload.md)")
    args = parser.parse_args()
    common.check_device(parser, args.device)
    if not 0 < args.save_at < args.steps:
        parser.error("--save-at must be in (0, --steps)")
    import transformers
    OFFLOAD["offload"] = None if args.offload == "none" else args.offload
    root = args.dir or tempfile.mkdtemp(prefix="shardadam_hf_")
    report = common.Report(f"transformers {transformers.__version__} Trainer, tiny Llama, {args.device}, "
                           f"{args.steps} steps, checkpoint at {args.save_at}, FusedAdam offload={args.offload}")
    setup = dict(out_dir=root, device=args.device, steps=args.steps, save_at=args.save_at)
    runs = {}

    def trained(key, optimizer, **options):
        """Each run once: later checks reuse it (and its checkpoint)."""
        if key not in runs:
            runs[key] = Run(optimizer, run=key, **setup, **options).train()
        return runs[key]

    def versus(ours, reference, rtol, reference_title="AdamW"):
        return common.compare_losses(ours.losses, reference.losses, rtol, reference_title=reference_title)

    def resumed(key, optimizer, rtol, saved_by=None, **options):
        """`optimizer` resumed from the checkpoint of run `key` (made by `saved_by`, default
        the same optimizer) against that run's remaining losses."""
        uninterrupted = trained(key, saved_by or optimizer, **options)
        run = Run(optimizer, run=f"{key}-resumed-{optimizer}", seed=123, **setup, **options)
        run.train(uninterrupted.checkpoint)
        return common.compare_losses(run.losses, uninterrupted.losses[args.save_at:], rtol, ours_title="resumed",
                                     reference_title="uninterrupted", first_step=args.save_at + 1)

    try:
        report.run("fp32: FusedAdam vs AdamW", lambda: versus(trained("fused", "FusedAdam"),
                                                              trained("adamw", "AdamW"), args.rtol))
        report.run("fp32: FusedAdam resumed vs uninterrupted", resumed, "fused", "FusedAdam", args.resume_rtol)
        report.run("fp32: AdamW resumed vs uninterrupted (baseline)", resumed, "adamw", "AdamW", args.resume_rtol)
        # A user switching optimizers mid-run: Trainer's optimizer.pt of one, loaded by the other.
        report.run("fp32: AdamW checkpoint resumed with FusedAdam vs AdamW uninterrupted", resumed, "adamw",
                   "FusedAdam", args.rtol, saved_by="AdamW")
        report.run("fp32: FusedAdam checkpoint resumed with AdamW vs FusedAdam uninterrupted", resumed, "fused",
                   "AdamW", args.rtol, saved_by="FusedAdam")
        bf16 = dict(dtype=torch.bfloat16, bf16=True)
        report.run("bf16 params: FusedAdam keeps fp32 masters",
                   lambda: check_masters(trained("fused-bf16", "FusedAdam", **bf16)))
        report.run("bf16 params + fp32 master: FusedAdam vs AdamW(fp32 params, bf16 autocast)",
                   lambda: versus(trained("fused-bf16", "FusedAdam", **bf16), trained("adamw-autocast", "AdamW",
                                                                                     bf16=True), args.bf16_rtol,
                                  reference_title="AdamW autocast"))
        report.run("bf16 params, for scale: FusedAdam vs AdamW over bf16 params",
                   lambda: versus(trained("fused-bf16", "FusedAdam", **bf16), trained("adamw-bf16", "AdamW", **bf16),
                                  float("inf"), reference_title="AdamW bf16"), informational=True)
        report.run("bf16 params + fp32 master: FusedAdam resumed vs uninterrupted", resumed, "fused-bf16",
                   "FusedAdam", args.resume_rtol, **bf16)
        accumulate = dict(accumulation=2)
        report.run("gradient accumulation 2: FusedAdam vs AdamW",
                   lambda: versus(trained("fused-ga2", "FusedAdam", **accumulate),
                                  trained("adamw-ga2", "AdamW", **accumulate), args.rtol))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
