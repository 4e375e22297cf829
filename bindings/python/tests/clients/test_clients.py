"""The client scripts of this folder, on the CPU with small sizes: FusedAdam under the Hugging
Face Trainer, Lightning's Trainer, FSDP2 + torch.distributed.checkpoint (also with FSDP2's
CPUOffloadPolicy), and torchtitan's OptimizersContainer (FSDP2 + DCP through its flat state
dict), against torch.optim.AdamW in the same run. Each test runs a script in a fresh
interpreter (as a user would; the frameworks keep global state) and passes when the script
prints its verdict and exits 0; on failure the assertion shows the script's table. A
framework that is not installed skips its test with the reason (see pytest -ra)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# Sizes that keep each script well under a minute on two shared CPU cores; the scripts'
# defaults (about 20 steps) are the full runs.
SMALL = {
    "hf_trainer.py": ["--steps", "6", "--save-at", "3"],
    "lightning_trainer.py": ["--steps-per-epoch", "3"],
    "fsdp2_dcp.py": ["--steps", "4", "--save-at", "2"],
}


def run_script(name, *extra):
    command = [sys.executable, os.path.join(HERE, name), "--device", "cpu", *SMALL[name], *extra]
    # One intra-op thread per process: the scripts spawn ranks, and the machine is shared.
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=HERE)
    output = result.stdout + result.stderr
    table = result.stdout[result.stdout.rfind("\ncheck "):] if "\ncheck " in result.stdout else output[-6000:]
    assert result.returncode == 0 and "PASS: all checks" in result.stdout, \
        f"{' '.join(command)} exited {result.returncode}:\n{table}\n--- output tail ---\n{output[-3000:]}"
    print(table)


def test_hugging_face_trainer_with_fused_adam_matches_adamw_and_resumes():
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed: pip install transformers accelerate")
    pytest.importorskip("accelerate", reason="accelerate (Trainer needs it) is not installed: pip install accelerate")
    run_script("hf_trainer.py")


def test_lightning_trainer_with_fused_adam_matches_adamw_and_resumes():
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("lightning", reason="lightning is not installed: pip install lightning")
    run_script("lightning_trainer.py")


def test_fsdp2_dcp_with_fused_adam_matches_adamw_and_resumes_on_fewer_ranks():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.distributed.is_available():
        pytest.skip("torch was built without torch.distributed")
    run_script("fsdp2_dcp.py")


def test_fsdp2_cpu_offload_with_fused_adam_matches_adamw_and_resumes_on_fewer_ranks():
    """FSDP2 with CPUOffloadPolicy (unpinned: pinning needs a CUDA driver) on 2 gloo ranks:
    the sharded params are CPU DTensors, which FusedAdam steps on the library's CPU backend.
    Losses and final params against AdamW under the same policy, FusedAdam's step counts
    and backend, FSDP2's offload flags, and the DCP save / resume checks, all offloaded."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.distributed.is_available():
        pytest.skip("torch was built without torch.distributed")
    run_script("fsdp2_dcp.py", "--cpu-offload")


def test_torchtitan_optimizers_container_with_fused_adam_matches_adamw_and_resumes():
    """torchtitan's OptimizersContainer with FusedAdam as its factory: its flat FQN-keyed
    state dict through DCP, saved on 2 gloo ranks and resumed on 1, against AdamW in the
    same container (torchtitan's own checkpoint path; its full trainer needs CUDA)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.distributed.is_available():
        pytest.skip("torch was built without torch.distributed")
    pytest.importorskip("torchtitan", reason="torchtitan is not installed: pip install torchtitan")
    run_script("fsdp2_dcp.py", "--container", "torchtitan")
