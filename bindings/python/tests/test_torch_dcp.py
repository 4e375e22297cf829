"""Switching between torch.optim.AdamW and FusedAdam through torch.distributed.checkpoint,
under FSDP2 on gloo CPU processes, saved on 2 ranks and loaded on 1, and 1 -> 2: runs
gpu/dcp_switch_optimizer.py --device cpu (its docstring lists the cases: fp32 both ways with
DCP's default planner, losses of the uninterrupted run within float32 rounding; bf16 params
with fp32 masters both ways, the masters following the loaded params; 8-bit and float8
moments both ways). The GPU variant (NCCL) is the same script with --device cuda
(run_gpu_suite.sh: dcpswitch).

Skipped when torch, torch.distributed or gloo is missing.
"""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the DCP checks need torch")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu", "dcp_switch_optimizer.py")


@pytest.mark.parametrize("save_ranks,load_ranks", [(2, 1), (1, 2)], ids=["2 to 1 ranks", "1 to 2 ranks"])
def test_dcp_checkpoints_switch_between_adamw_and_fused_adam(save_ranks, load_ranks):
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs torch.distributed with gloo")
    result = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--save-ranks", str(save_ranks),
                             "--load-ranks", str(load_ranks)], capture_output=True, text=True, timeout=600)
    table = "\n".join(line for line in result.stdout.splitlines() if line.startswith(("PASS", "FAIL")))
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-4000:]}"
    assert "FAIL" not in table and table.count("PASS") == 10, table


def test_dcp_async_save_of_fused_adam_restores_the_losses():
    """dcp.async_save of FusedAdam's (and AdamW's) get_state_dict on 2 gloo ranks, training on
    while it writes; loaded on 1 rank by the other optimizer, the losses are the uninterrupted
    run's (the two fp32 cases, and the summary line: the async path is the same for every precision)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs torch.distributed with gloo")
    result = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--save-ranks", "2", "--load-ranks", "1",
                             "--precision", "fp32", "--async-save"], capture_output=True, text=True, timeout=600)
    table = "\n".join(line for line in result.stdout.splitlines() if line.startswith(("PASS", "FAIL")))
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-4000:]}"
    assert "with dcp.async_save" in result.stdout
    assert "FAIL" not in table and table.count("PASS") == 3, table
