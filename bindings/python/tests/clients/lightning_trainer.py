#!/usr/bin/env python3
"""PyTorch Lightning's Trainer with configure_optimizers returning shardadam's FusedAdam.

    python3 bindings/python/tests/clients/lightning_trainer.py [--device cpu|cuda] [--steps-per-epoch 10]

The LightningModule is what a Lightning user writes: a model (fsdp2_common's small
transformer), a training_step returning the loss, and configure_optimizers returning the
optimizer and a per-step LR warmup:

    def configure_optimizers(self):
        opt = FusedAdam(self.parameters(), lr=..., betas=..., weight_decay=...)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": LambdaLR(opt, warmup), "interval": "step"}}

Lightning then drives it: ``optimizer.step(closure)`` (the closure runs training_step,
zero_grad and backward; FusedAdam runs it before reading the grads), gradient clipping
(gradient_clip_val=1), its checkpoints (``optimizer.state_dict()`` inside the .ckpt) and
``trainer.fit(ckpt_path=...)``, which restores model, optimizer, scheduler and loop state.

Checks (losses of every training_step, side by side):

1. fp32 ("32-true"): FusedAdam vs torch.optim.AdamW, 2 epochs.
2. Resume: ModelCheckpoint saved after epoch 1; a fresh module (other init) and a fresh
   Trainer fit(ckpt_path=...) for epoch 2; its losses equal the uninterrupted run's. The
   same for AdamW (Lightning's own baseline). The checkpoint is taken at an epoch end:
   Lightning restarts a plain DataLoader from its first batch on a mid-epoch resume, which
   would compare different batches, whatever the optimizer.
3. "bf16-true" (Lightning casts the module to bf16 before configure_optimizers): FusedAdam
   keeps fp32 masters; against AdamW with "bf16-mixed" (fp32 params, bf16 autocast), the
   like-for-like reference (clients_common.BF16_RTOL says why, and why the tolerance).
4. bf16-true resume: as 2.
5. Gradient accumulation (accumulate_grad_batches=2; the step count halves, every
   training_step's loss is still recorded): FusedAdam vs AdamW.
6. Fine-tuning with a frozen embedding (requires_grad_(False)) while configure_optimizers
   still passes self.parameters(), as Lightning's examples write it: AdamW skips the param
   without a grad; FusedAdam vs AdamW.
7. "bf16-mixed" with clipping: Lightning refuses gradient_clip_val for an optimizer that
   unscales its grads itself (``_step_supports_amp_scaling``: torch's fused AdamW and
   FusedAdam alike), so FusedAdam clips in its step (``max_grad_norm=CLIP``, no
   gradient_clip_val), as docs/python.md says; against AdamW with gradient_clip_val=CLIP
   (a CLIP below the grad norms: the check fails unless some step was clipped).

Exit status 1 on any FAIL.
"""
import argparse
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F

import clients_common as common
from fsdp2_common import ModelConfig, Transformer
from shardadam.torch import FusedAdam

CONFIG = ModelConfig(vocab=97, dim=32, heads=4, layers=2, seq=32)
BATCH = 4
LR, BETAS, WEIGHT_DECAY = 3e-3, (0.9, 0.95), 0.1
OPTIMIZERS = {"FusedAdam": FusedAdam, "AdamW": torch.optim.AdamW}
CLIP = 0.1  # check 7's max grad norm: below this model's grad norms, so clipping acts

def warmup(step):
    return min(1.0, (step + 1) / 5)


def lightning():
    import lightning
    return lightning


def make_module(optimizer, seed, frozen_embedding=False, max_grad_norm=None):
    L = lightning()

    class LanguageModel(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.model = Transformer(CONFIG)
            if frozen_embedding:  # fine-tuning: frozen, yet still in self.parameters()
                self.model.embed.requires_grad_(False)
            self.losses = []
            self.grad_norms = []

        def training_step(self, batch, batch_index):
            tokens, targets = batch
            loss = F.cross_entropy(self.model(tokens).float().flatten(0, 1), targets.flatten())
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            clip = {} if max_grad_norm is None else {"max_grad_norm": max_grad_norm}
            opt = OPTIMIZERS[optimizer](self.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, **clip)
            if clip:  # the global grad norm of every step, to show that clipping acted
                opt.register_step_post_hook(lambda o, args, kwargs: self.grad_norms.append(float(o.grad_norm)))
            schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    return LanguageModel()


def make_trainer(device, precision, epochs, checkpoint_dir=None, accumulate=1, clip_val=1.0):
    L = lightning()
    callbacks = []
    if checkpoint_dir is not None:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(dirpath=checkpoint_dir, save_top_k=-1, every_n_epochs=1,
                                                             save_on_train_epoch_end=True))
    return L.Trainer(accelerator=device, devices=1, precision=precision, max_epochs=epochs, gradient_clip_val=clip_val,
                     accumulate_grad_batches=accumulate,
                     logger=False, enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=checkpoint_dir is not None, callbacks=callbacks,
                     # Deterministic kernels where torch has them (resumes compare to 1e-6);
                     # "warn": an op without one (on CUDA) warns rather than stopping the run.
                     deterministic="warn")


def loader(steps_per_epoch):
    tokens, targets = common.token_sequences(steps_per_epoch * BATCH, CONFIG.vocab, CONFIG.seq, seed=0)
    # shuffle=False: the same batches in every epoch, also after a resume (see check 2).
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens, targets), batch_size=BATCH)


class Run:
    """A 2-epoch fit with a checkpoint after every epoch; `losses` per training step."""

    def __init__(self, optimizer, precision, root, device, steps_per_epoch, accumulate=1, frozen_embedding=False,
                 clip=1.0, clip_in_step=False):
        """clip: the max grad norm; clip_in_step: the optimizer clips (max_grad_norm), not the Trainer."""
        self.checkpoint_dir = os.path.join(root, f"{optimizer}-{precision}-{accumulate}-{frozen_embedding}-{clip}-"
                                                 f"{clip_in_step}")
        self.module = make_module(optimizer, 0, frozen_embedding, max_grad_norm=clip if clip_in_step else None)
        make_trainer(device, precision, 2, self.checkpoint_dir, accumulate,
                     clip_val=None if clip_in_step else clip).fit(self.module, loader(steps_per_epoch))
        self.losses = self.module.losses
        used = type(self.module.optimizers().optimizer)
        # The checks are vacuous unless Lightning stepped the optimizer they name.
        assert used is OPTIMIZERS[optimizer], f"Lightning used {used}, not {OPTIMIZERS[optimizer]}"
        self.optimizer, self.precision, self.device, self.steps_per_epoch = optimizer, precision, device, steps_per_epoch

    def first_epoch_checkpoint(self):
        names = sorted(n for n in os.listdir(self.checkpoint_dir) if n.startswith("epoch=0"))
        assert len(names) == 1, f"expected one epoch-0 checkpoint in {self.checkpoint_dir}, found {names}"
        return os.path.join(self.checkpoint_dir, names[0])

    def resumed(self):
        """A fresh module and Trainer resuming from the epoch-1 checkpoint; epoch 2's losses."""
        module = make_module(self.optimizer, seed=123)
        make_trainer(self.device, self.precision, 2).fit(module, loader(self.steps_per_epoch),
                                                         ckpt_path=self.first_epoch_checkpoint())
        return module.losses


def check_masters(run):
    """FusedAdam kept fp32 master weights for the bf16 params Lightning gave it."""
    opt = run.module.optimizers().optimizer
    params = list(run.module.parameters())
    dtypes = {p.dtype for p in params}
    masters = {str(opt.state[p]["master"].dtype) if "master" in opt.state[p] else "none" for p in params}
    return dtypes == {torch.bfloat16} and masters == {"torch.float32"}, f"params {dtypes}, masters {masters}"


def clipped_in_step(ours, reference, rtol):
    """The losses agree, and the check is not vacuous: some steps' grad norm was above
    CLIP, so clipping changed those steps."""
    ok, detail = common.compare_losses(ours.losses, reference.losses, rtol)
    norms = ours.module.grad_norms
    clipped = sum(norm > CLIP for norm in norms)
    return ok and clipped > 0, f"{detail}; {clipped} of {len(norms)} steps clipped (grad norm > {CLIP})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_device_argument(parser)
    parser.add_argument("--steps-per-epoch", type=int, default=10)
    parser.add_argument("--rtol", type=float, default=common.FP32_RTOL)
    parser.add_argument("--resume-rtol", type=float, default=common.RESUME_RTOL)
    parser.add_argument("--bf16-rtol", type=float, default=common.BF16_RTOL)
    args = parser.parse_args()
    common.check_device(parser, args.device)
    L = lightning()
    L.seed_everything(0, verbose=False)
    root = tempfile.mkdtemp(prefix="shardadam_lightning_")
    report = common.Report(f"lightning {L.__version__} Trainer, {args.device}, 2 epochs of {args.steps_per_epoch} "
                           f"steps, checkpoint after epoch 1")
    runs = {}

    def trained(optimizer, precision, accumulate=1, frozen_embedding=False, clip=1.0, clip_in_step=False):
        key = optimizer, precision, accumulate, frozen_embedding, clip, clip_in_step
        if key not in runs:
            runs[key] = Run(optimizer, precision, root, args.device, args.steps_per_epoch, accumulate, frozen_embedding,
                            clip, clip_in_step)
        return runs[key]

    def versus(ours, reference, rtol, reference_title="AdamW"):
        return common.compare_losses(ours.losses, reference.losses, rtol, reference_title=reference_title)

    def resumed(optimizer, precision):
        run = trained(optimizer, precision)
        return common.compare_losses(run.resumed(), run.losses[args.steps_per_epoch:], args.resume_rtol,
                                     ours_title="resumed", reference_title="uninterrupted",
                                     first_step=args.steps_per_epoch + 1)

    try:
        report.run("32-true: FusedAdam vs AdamW",
                   lambda: versus(trained("FusedAdam", "32-true"), trained("AdamW", "32-true"), args.rtol))
        report.run("32-true: FusedAdam resumed (fit ckpt_path) vs uninterrupted", resumed, "FusedAdam", "32-true")
        report.run("32-true: AdamW resumed vs uninterrupted (baseline)", resumed, "AdamW", "32-true")
        report.run("bf16-true: FusedAdam keeps fp32 masters", lambda: check_masters(trained("FusedAdam", "bf16-true")))
        report.run("bf16-true FusedAdam vs bf16-mixed AdamW (fp32 params, autocast)",
                   lambda: versus(trained("FusedAdam", "bf16-true"), trained("AdamW", "bf16-mixed"), args.bf16_rtol,
                                  reference_title="AdamW autocast"))
        report.run("bf16-true: FusedAdam resumed vs uninterrupted", resumed, "FusedAdam", "bf16-true")
        report.run("accumulate_grad_batches=2: FusedAdam vs AdamW",
                   lambda: versus(trained("FusedAdam", "32-true", 2), trained("AdamW", "32-true", 2), args.rtol))
        report.run("frozen embedding still in self.parameters(): FusedAdam vs AdamW",
                   lambda: versus(trained("FusedAdam", "32-true", frozen_embedding=True),
                                  trained("AdamW", "32-true", frozen_embedding=True), args.rtol))
        report.run(f"bf16-mixed: FusedAdam(max_grad_norm={CLIP}) vs AdamW with gradient_clip_val={CLIP}",
                   clipped_in_step, trained("FusedAdam", "bf16-mixed", clip=CLIP, clip_in_step=True),
                   trained("AdamW", "bf16-mixed", clip=CLIP), args.bf16_rtol)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
