"""What the client scripts of this folder share: the --device argument, the learnable token
data, the loss-curve comparison and the result table with its PASS / FAIL / EXPECTED FAIL
lines. Each script runs a training framework that no one here wrote (Hugging Face
Trainer, Lightning, FSDP2 + torch.distributed.checkpoint) with shardadam's FusedAdam in
place of torch.optim.AdamW and compares against AdamW in the same run.

A check is a function returning (ok, detail); `Report.run` times it and turns an
exception into a FAIL that keeps the exception's text (a client breaking FusedAdam is a
finding, never something to hide). A check may be declared an expected failure only
with the reason, which is printed next to it."""
import math
import os
import sys
import time
import traceback

# The FSDP2 pieces (model, data, wrapping, launcher) live beside the GPU scripts; the
# client scripts reuse them rather than keeping copies. sys.path also reaches the
# torch.multiprocessing children, which import the script (and so this module) again.
GPU_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "gpu")
if GPU_TESTS not in sys.path:
    sys.path.insert(0, os.path.abspath(GPU_TESTS))

from fsdp2_common import ModelConfig, batch  # noqa: E402

# Tolerances on the loss curves (relative), the same in every script.
# FusedAdam vs AdamW, float32: the same update in another operation order, a few float32
# ulps (1e-7 relative) per param and step; ~20 steps of a 2-layer model keep the losses
# within a few 1e-6 (measured on the CPU: bitwise equal under Trainer and Lightning, 1e-7
# under FSDP2, whose grads are averaged across ranks). 1e-5 leaves room for GPU kernels.
FP32_RTOL = 1e-5
# A resume on the same ranks replays the same computation from the saved state: bitwise
# equal on the CPU (measured); 1e-6 allows for nondeterministic GPU kernels (an ulp of a
# grad per step). A resume on fewer ranks averages the grads in another order: FP32_RTOL.
RESUME_RTOL = 1e-6
# bf16 params with FusedAdam's fp32 master against AdamW over fp32 params under bf16
# autocast. That reference has the same optimizer math (AdamW's fp32 params are the fp32
# master, autocast's matmuls use their bf16 rounding, which is the bf16 param FusedAdam
# writes); what differs is the rest of the forward and backward, in bf16 in the bf16
# model (activations, residual stream, grads): bf16's 2**-8 relative precision per op.
# Measured on the CPU over 20 steps: 1e-4 (Trainer) and 6e-4 (Lightning); 5e-3 leaves
# room for GPU kernels. (AdamW over the bf16 params themselves, with bf16 states and
# updates below a bf16 ulp lost, is a worse reference: the scripts show it for scale.)
BF16_RTOL = 5e-3


def add_device_argument(parser):
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the params live (cuda: the current GPU, or one GPU per rank)")


def check_device(parser, device, gpus_needed=1):
    import torch
    if device == "cuda" and torch.cuda.device_count() < gpus_needed:
        parser.error(f"--device cuda needs {gpus_needed} GPU(s), this machine has {torch.cuda.device_count()}")


def token_sequences(count, vocab, seq, seed):
    """`count` token sequences of length seq + 1 (input and shifted target) drawn from
    fsdp2_common.batch: next = (5 * token + a per-sequence offset) % vocab, so the loss
    falls as the model learns, and the data depend on `seed` only."""
    tokens, targets = batch(ModelConfig(vocab=vocab, dim=1, heads=1, layers=0, seq=seq), seed, count)
    return tokens, targets


def curve_table(columns, first_step=1):
    """Lines of a loss table: one column per (title, losses); the step numbers start at
    first_step."""
    titles = list(columns)
    lines = [f"{'step':>5} " + " ".join(f"{t:>16}" for t in titles)]
    for i in range(max(len(v) for v in columns.values())):
        cells = [f"{columns[t][i]:16.9f}" if i < len(columns[t]) else f"{'-':>16}" for t in titles]
        lines.append(f"{i + first_step:5d} " + " ".join(cells))
    return lines


def compare_losses(ours, reference, rtol, ours_title="FusedAdam", reference_title="AdamW", first_step=1):
    """Prints the two curves side by side; returns (ok, detail): the max abs and relative
    differences against rtol. A length mismatch or a non-finite loss fails."""
    for line in curve_table({ours_title: ours, reference_title: reference, "abs diff":
                             [abs(a - b) for a, b in zip(ours, reference)]}, first_step):
        print("    " + line)
    if len(ours) != len(reference) or not ours:
        return False, f"{len(ours)} losses against {len(reference)}"
    worst_abs = max(abs(a - b) for a, b in zip(ours, reference))
    worst_rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, reference))
    finite = all(math.isfinite(x) for x in ours + reference)
    equal = sum(a == b for a, b in zip(ours, reference))
    ok = finite and worst_rel <= rtol
    return ok, (f"{len(ours)} losses, max abs diff {worst_abs:.2e}, max rel diff {worst_rel:.2e} "
                f"(rtol {rtol:.0e}), {equal} bitwise equal" + ("" if finite else ", NON-FINITE losses"))


def compare_params(ours, reference, rtol, ours_title="FusedAdam", reference_title="AdamW"):
    """Two runs' final params ({name: tensor}, the full tensors): returns (ok, detail). Each
    tensor's max abs difference is measured against the reference tensor's max abs value
    (an element near zero would make its own relative difference meaningless); the worst
    tensor must be within rtol. A missing or extra name, a shape mismatch or a non-finite
    value fails."""
    import torch
    if not reference:
        return False, "no params"
    if set(ours) != set(reference):
        return False, (f"{ours_title} has params {sorted(set(ours) - set(reference))} that {reference_title} "
                       f"lacks, and lacks {sorted(set(reference) - set(ours))}")
    worst, worst_name, equal, finite = 0.0, None, 0, True
    for name, ref in reference.items():
        mine = ours[name]
        if mine.shape != ref.shape:
            return False, f"{name}: shape {tuple(mine.shape)} against {tuple(ref.shape)}"
        mine, ref = mine.double(), ref.double()
        finite = finite and bool(mine.isfinite().all() and ref.isfinite().all())
        equal += torch.equal(mine, ref)
        scale = max(ref.abs().max().item(), 1e-12) if ref.numel() else 1.0
        diff = (mine - ref).abs().max().item() / scale if ref.numel() else 0.0
        if diff > worst or worst_name is None:
            worst, worst_name = diff, name
    ok = finite and worst <= rtol
    return ok, (f"{len(reference)} params, max diff / max |{reference_title}| {worst:.2e} ({worst_name}; rtol "
                f"{rtol:.0e}), {equal} bitwise equal" + ("" if finite else ", NON-FINITE values"))


def short_error(exc):
    """The exception's type, where it was raised and the last line of its message (a
    CheckpointException ends with the rank's own error): what a reader needs."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__} at {where}: {lines[-1] if lines else ''}"


class Report:
    """The results of one script: run checks, then print the table and the verdict."""

    def __init__(self, title):
        self.title = title
        self.rows = []  # (name, verdict, seconds, detail)
        self.start = time.perf_counter()

    def run(self, name, check, *args, expected_failure=None, informational=False, **kwargs):
        """Runs check(*args, **kwargs) -> (ok, detail). `expected_failure`: (reason, text):
        a known FusedAdam issue makes this check fail with `text` in its detail. Such a
        failure is an EXPECTED FAIL, printed with the reason; a failure without the text is
        a FAIL, and a pass an XPASS (the issue is fixed: drop the mark). `informational`:
        a comparison shown for scale; INFO unless it raises."""
        print(f"\n== {name}", flush=True)
        start = time.perf_counter()
        raised = False
        try:
            ok, detail = check(*args, **kwargs)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # the client broke (dcp raises BaseExceptions): keep its error, go on
            traceback.print_exc()
            ok, detail, raised = False, short_error(exc), True
        seconds = time.perf_counter() - start
        verdict = "PASS" if ok else "FAIL"
        if informational and not raised:
            verdict = "INFO"
        if expected_failure is not None:
            reason, text = expected_failure
            if ok:
                verdict = "XPASS"
                detail += f" [marked as a known issue, now passing: {reason}]"
            elif text in detail:
                verdict = "EXPECTED FAIL"
                detail += f" [known issue: {reason}]"
        print(f"{verdict}: {name} ({seconds:.1f} s): {detail}", flush=True)
        self.rows.append((name, verdict, seconds, detail))
        return ok

    def finish(self):
        """Prints the table and the overall verdict; returns the exit status (1 on a FAIL)."""
        import torch
        print(f"\n{self.title}; torch {torch.__version__}")
        width = max(len(r[0]) for r in self.rows) if self.rows else 10
        print(f"{'check':<{width}}  {'result':<13} {'time':>6}  detail")
        for name, verdict, seconds, detail in self.rows:
            print(f"{name:<{width}}  {verdict:<13} {seconds:5.1f}s  {detail}")
        failed = any(r[1] == "FAIL" for r in self.rows)
        print(f"\n{'FAIL' if failed else 'PASS'}: all checks ({time.perf_counter() - self.start:.0f} s)")
        return 1 if failed else 0
