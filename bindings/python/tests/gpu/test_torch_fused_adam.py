"""shardadam.torch.FusedAdam against torch.optim.AdamW (fused=False), on CUDA float32.

Needs torch (skipped without it) and a CUDA device for most tests (the CPU backend is
compared too where torch's CPU path applies). Run from the repository root after
`pip install ./bindings/python`:

    python -m pytest -q bindings/python/tests/gpu/test_torch_fused_adam.py
"""
import copy
import io
import math
import socket

import pytest

torch = pytest.importorskip("torch")
from shardadam.torch import FusedAdam  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

HYPER = dict(lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
# torch's single-tensor AdamW and the fused kernel order their float32 operations
# differently; after 20 steps params agree to a few ulps of the update.
ATOL, RTOL = 2e-6, 1e-5


def make_model(device, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 48), torch.nn.GELU(),
        torch.nn.Linear(48, 10, bias=False))
    return model.to(device=device, dtype=dtype)


def batches(device, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=gen).to(device), torch.randint(0, 10, (16,), generator=gen).to(device))
            for _ in range(steps)]


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x.to(next(model.parameters()).dtype)).float(), y)


def assert_params_close(a, b, atol=ATOL, rtol=RTOL):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.float(), q.float(), atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


def warmup_lambda(step):
    return min(1.0, (step + 1) / 5) * (0.5 if step >= 12 else 1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_twenty_steps_match_torch_adamw_with_an_lr_schedule(device):
    ours_model, torch_model = make_model(device), make_model(device)
    ours = FusedAdam(ours_model.parameters(), **HYPER)
    reference = torch.optim.AdamW(torch_model.parameters(), **HYPER, foreach=False, fused=False)
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, warmup_lambda) for o in (ours, reference)]
    for x, y in batches(device, 20):
        for model, opt, schedule in [(ours_model, ours, schedules[0]), (torch_model, reference, schedules[1])]:
            opt.zero_grad(set_to_none=True)
            loss_of(model, x, y).backward()
            opt.step()
            schedule.step()
        assert ours.param_groups[0]["lr"] == reference.param_groups[0]["lr"]
    assert_params_close(ours_model, torch_model)
    ours_state, torch_state = ours.state_dict()["state"], reference.state_dict()["state"]
    for index, state in torch_state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours_state[index][key], state[key], atol=1e-7, rtol=1e-4)
        assert float(ours_state[index]["step"]) == float(state["step"]) == 20


@needs_cuda
def test_the_step_runs_on_the_current_stream():
    """Under ``torch.cuda.stream(s)`` the step is enqueued on s, after the grads s writes
    late (behind a sleep on s): a step on any other stream would read the grads before
    they were written and update with zeros."""
    ours_model, torch_model = make_model("cuda"), make_model("cuda")
    ours = FusedAdam(ours_model.parameters(), **HYPER)
    reference = torch.optim.AdamW(torch_model.parameters(), **HYPER, foreach=False, fused=False)
    side = torch.cuda.Stream()
    for step, (x, y) in enumerate(batches("cuda", 3)):
        for model in (ours_model, torch_model):
            model.zero_grad(set_to_none=False)
            loss_of(model, x, y).backward()
        grads = [p.grad.clone() for p in ours_model.parameters()]
        torch.cuda.synchronize()
        for p in ours_model.parameters():
            p.grad.zero_()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # ~10 ms of the side stream before the grads land
            for p, g in zip(ours_model.parameters(), grads):
                p.grad.copy_(g)
            ours.step()
        reference.step()
        torch.cuda.synchronize()
        assert_params_close(ours_model, torch_model)


@pytest.mark.parametrize("device", DEVICES)
def test_param_groups_amsgrad_and_adam_l2(device):
    ours_model, torch_model = make_model(device), make_model(device)

    def groups(model):
        layers = list(model)
        return [{"params": layers[0].parameters()},
                {"params": layers[2].parameters(), "lr": 1e-3, "amsgrad": True},
                {"params": layers[4].parameters(), "weight_decay": 0.0}]

    ours = FusedAdam(groups(ours_model), **HYPER, decoupled_weight_decay=False)
    reference = torch.optim.Adam(groups(torch_model), **HYPER, foreach=False)
    for x, y in batches(device, 20):
        for model, opt in [(ours_model, ours), (torch_model, reference)]:
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()
    assert_params_close(ours_model, torch_model)


@needs_cuda
@pytest.mark.parametrize("unscale_first", [False, True], ids=["fused protocol", "unscale_ then clip"])
def test_grad_scaler_with_an_inf_step_skipped(unscale_first):
    ours_model, torch_model = make_model("cuda"), make_model("cuda")
    ours = FusedAdam(ours_model.parameters(), **HYPER)
    reference = torch.optim.AdamW(torch_model.parameters(), **HYPER, foreach=False)
    scalers = [torch.amp.GradScaler("cuda", init_scale=2.0 ** 12, growth_interval=4) for _ in range(2)]
    for step, (x, y) in enumerate(batches("cuda", 20)):
        for model, opt, scaler in [(ours_model, ours, scalers[0]), (torch_model, reference, scalers[1])]:
            opt.zero_grad()
            scaler.scale(loss_of(model, x, y)).backward()
            if step == 7:  # an overflow: the step must be skipped and the scale backed off
                next(model.parameters()).grad[0, 0] = float("inf")
            if unscale_first:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        assert scalers[0].get_scale() == scalers[1].get_scale()
    assert not hasattr(ours, "grad_scale") and not hasattr(ours, "found_inf")  # GradScaler cleaned up
    assert_params_close(ours_model, torch_model)
    assert float(ours.state_dict()["state"][0]["step"]) == 19
    assert float(reference.state_dict()["state"][0]["step"]) == 19


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_shares_memory_and_round_trips(device):
    model = make_model(device)
    opt = FusedAdam(model.parameters(), **HYPER)
    data = batches(device, 10)
    for x, y in data[:5]:
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
    state_dict = opt.state_dict()
    exp_avg = state_dict["state"][0]["exp_avg"]
    assert exp_avg.data_ptr() == opt.native.state(0, "exp_avg").data_ptr  # a view, not a copy
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    resumed_model = copy.deepcopy(model)
    resumed = FusedAdam(resumed_model.parameters(), lr=0.5)  # lr comes from the state dict
    resumed.load_state_dict(saved)
    assert resumed.param_groups[0]["lr"] == HYPER["lr"]
    assert resumed.state_dict()["state"][0]["exp_avg"].data_ptr() == resumed.native.state(0, "exp_avg").data_ptr
    for x, y in data[5:]:
        for m, o in [(model, opt), (resumed_model, resumed)]:
            o.zero_grad()
            loss_of(m, x, y).backward()
            o.step()
    assert_params_close(model, resumed_model, atol=0, rtol=0)  # same kernel, same state: bit for bit


@pytest.mark.parametrize("wait", [True, False], ids=["save", "save(wait=False), training on while it writes"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16 + fp32 master"])
@pytest.mark.parametrize("device", DEVICES)
def test_shard_files_resume_bit_for_bit_with_the_scheduled_lr(device, dtype, wait, tmp_path):
    """save_shard_file after 3 steps of an lr warmup, load_shard_files into a fresh optimizer over
    the same param values: the states (master included) are equal, the groups take the lr
    the scheduler set after the last step, and 7 more steps give the same params bit for bit.
    With wait=False the 7 steps run while the file is written: they must not reach it."""
    shardadam = pytest.importorskip("shardadam")
    model = make_model(device, dtype)
    opt = FusedAdam(model.named_parameters(), **HYPER)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_lambda)
    data = batches(device, 10)

    def train(m, o, s, steps):
        for x, y in steps:
            o.zero_grad()
            loss_of(m, x, y).backward()
            o.step()
            s.step()

    train(model, opt, schedule, data[:3])
    path = tmp_path / "rank0.safetensors"
    resumed_model = copy.deepcopy(model)
    saved = {index: {key: value.clone() for key, value in state.items()}
             for index, state in opt.state_dict()["state"].items()}
    saved_lr = opt.param_groups[0]["lr"]
    schedule_state = schedule.state_dict()
    job = opt.save_shard_file(path, wait=wait)
    if not wait:
        assert isinstance(job, shardadam.SaveJob)
        train(model, opt, schedule, data[3:])
        job.wait()
    resumed = FusedAdam(resumed_model.named_parameters(), lr=0.5, eps=1e-6)  # both come from the file
    resumed_schedule = torch.optim.lr_scheduler.LambdaLR(resumed, warmup_lambda)
    resumed.load_shard_files([path])
    resumed_schedule.load_state_dict(schedule_state)
    assert resumed.param_groups[0]["lr"] == saved_lr == HYPER["lr"] * warmup_lambda(3)
    assert resumed.param_groups[0]["eps"] == HYPER["eps"]
    loaded = resumed.state_dict()["state"]
    assert "master" in loaded[0] if dtype == torch.bfloat16 else "master" not in loaded[0]
    for index, state in saved.items():
        assert state.keys() == loaded[index].keys()
        for key, value in state.items():
            assert torch.equal(loaded[index][key], value), f"param {index} state {key}"
    assert float(loaded[0]["step"]) == 3
    if wait:
        train(model, opt, schedule, data[3:])
    train(resumed_model, resumed, resumed_schedule, data[3:])
    assert_params_close(model, resumed_model, atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_loads_torch_adamw_state(device):
    ours_model, torch_model = make_model(device), make_model(device)
    reference = torch.optim.AdamW(torch_model.parameters(), **HYPER, foreach=False)
    data = batches(device, 10)
    for x, y in data[:5]:
        reference.zero_grad()
        loss_of(torch_model, x, y).backward()
        reference.step()
    ours_model.load_state_dict(torch_model.state_dict())
    ours = FusedAdam(ours_model.parameters(), **HYPER)
    ours.load_state_dict(reference.state_dict())
    for x, y in data[5:]:
        for m, o in [(ours_model, ours), (torch_model, reference)]:
            o.zero_grad()
            loss_of(m, x, y).backward()
            o.step()
    assert_params_close(ours_model, torch_model)


@needs_cuda
def test_bf16_params_with_fp32_master_follow_fp32_adamw():
    """bf16 params, fp32 master weights kept by shardadam: the master follows torch AdamW
    run in float32 on the same (bf16) grads, and the params are its bf16 rounding."""
    ours_model = make_model("cuda", torch.bfloat16)
    fp32_model = make_model("cuda", torch.bfloat16).float()  # the same bf16 values, in fp32
    ours = FusedAdam(ours_model.parameters(), **HYPER)
    reference = torch.optim.AdamW(fp32_model.parameters(), **HYPER, foreach=False)
    for x, y in batches("cuda", 20):
        ours.zero_grad()
        loss_of(ours_model, x, y).backward()
        ours.step()
        reference.zero_grad()
        for p, q in zip(ours_model.parameters(), fp32_model.parameters()):
            q.grad = p.grad.float()
        reference.step()
    state = ours.state_dict()["state"]
    for index, (p, q) in enumerate(zip(ours_model.parameters(), fp32_model.parameters())):
        torch.testing.assert_close(state[index]["master"], q, atol=ATOL, rtol=RTOL)
        assert torch.equal(p, state[index]["master"].to(torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
def test_missing_grads(device):
    model = make_model(device)
    opt = FusedAdam(model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()  # no grads at all: nothing happens, as with torch's optimizers
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    x, y = batches(device, 1)[0]
    loss_of(model, x, y).backward()
    model[0].weight.grad = None
    opt.step()  # a param without a grad is skipped, as torch skips it; the others step
    assert torch.equal(model[0].weight, before[0])
    assert not torch.equal(model[0].bias, before[1])


@pytest.mark.parametrize("device", DEVICES)
def test_closure_and_named_params(device):
    model = make_model(device)
    opt = FusedAdam(model.named_parameters(), **HYPER)
    assert opt.native.param_names[0] == "0.weight"
    x, y = batches(device, 1)[0]

    def closure():
        opt.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        return loss

    first = opt.step(closure).detach()
    second = opt.step(closure).detach()
    assert second.item() < first.item()


# ---- gradient clipping ----------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_type", [2.0, math.inf], ids=["L2", "inf"])
def test_max_grad_norm_matches_clip_grad_norm_then_adamw(device, norm_type):
    ours_model, torch_model = make_model(device), make_model(device)
    max_norm = 0.035 if norm_type == math.inf else 0.3  # about the norms seen: clips some steps, not all
    ours = FusedAdam(ours_model.parameters(), **HYPER, max_grad_norm=max_norm, norm_type=norm_type)
    reference = torch.optim.AdamW(torch_model.parameters(), **HYPER, foreach=False, fused=False)
    for x, y in batches(device, 12):
        for model in (ours_model, torch_model):
            loss_of(model, x, y).backward()
        expected = torch.nn.utils.clip_grad_norm_(torch_model.parameters(), max_norm, norm_type=norm_type)
        reference.step()
        ours.step()
        assert ours.grad_norm.shape == () and ours.grad_norm.device == expected.device
        torch.testing.assert_close(ours.grad_norm, expected, rtol=1e-5, atol=0)
        for opt in (ours, reference):
            opt.zero_grad()
    assert_params_close(ours_model, torch_model)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Uneven Shard(0) splits over 2 ranks, an empty shard, a replicated param.
_GLOO_PARAMS = {"w": ((5, 3), "shard"), "b": ((3,), "shard"), "scale": ((1,), "shard"), "head": ((4, 2), "replicate")}


def _gloo_clip_rank(rank, world, port, norm_type):
    """One rank of test_two_gloo_ranks_clip_by_the_global_norm (run by mp.spawn).

    Everything that holds the process group (the mesh, the DTensors, the optimizer) is
    freed, reference cycles included, before the group is destroyed: a gloo group that
    lives on into the interpreter's exit can abort the process there (its worker thread
    needs the GIL to drop its last work; pytorch/pytorch#179291)."""
    import gc
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    try:
        _gloo_clip_checks(rank, world, norm_type)
    finally:
        gc.collect()
        dist.destroy_process_group()


def _gloo_clip_checks(rank, world, norm_type):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(5)
    full = {name: torch.randn(shape, generator=gen) for name, (shape, _) in _GLOO_PARAMS.items()}
    placement = {name: [Shard(0)] if kind == "shard" else [Replicate()] for name, (_, kind) in _GLOO_PARAMS.items()}
    params = {name: torch.nn.Parameter(distribute_tensor(full[name].clone(), mesh, placement[name]))
              for name in full}
    reference = {name: torch.nn.Parameter(value.double()) for name, value in full.items()}
    max_norm = 0.8
    ours = FusedAdam(list(params.items()), **HYPER, max_grad_norm=max_norm, norm_type=norm_type)
    torch_opt = torch.optim.AdamW(reference.values(), **HYPER, foreach=False)
    for step in range(6):
        scale = [0.05, 2.0, 0.3, 5.0, 0.1, 1.0][step]
        grads = {name: scale * torch.randn(value.shape, generator=gen) for name, value in full.items()}
        for name, grad in grads.items():
            params[name].grad = distribute_tensor(grad, mesh, placement[name])
            reference[name].grad = grad.double()
        expected = torch.nn.utils.clip_grad_norm_(reference.values(), max_norm, norm_type=norm_type)
        torch_opt.step()
        ours.step()
        torch.testing.assert_close(ours.grad_norm.double(), expected, rtol=1e-5, atol=0,
                                   msg=lambda m: f"rank {rank} step {step}: {m}")
    for name, param in params.items():
        torch.testing.assert_close(param.full_tensor().double(), reference[name].detach(), rtol=1e-5, atol=2e-6,
                                   msg=lambda m: f"rank {rank} {name}: {m}")
    # A NaN in one rank's shard skips the step on both ranks.
    before = {name: param.to_local().clone() for name, param in params.items()}
    params["w"].grad.to_local()[0, 0] = float("nan") if rank == 1 else params["w"].grad.to_local()[0, 0]
    ours.step()
    assert not math.isfinite(ours.grad_norm.item())  # NaN (L2), inf (max norm: NaN counts as inf)
    for name, param in params.items():
        assert torch.equal(param.to_local(), before[name]), f"rank {rank}: {name} changed in a skipped step"
    assert ours.native.param_groups[0].step == 6
    assert ours.native.comm is not None and ours.native.comm.kind == "host"


def _gloo_placement_rank(rank, world, port):
    """One rank of test_grads_placed_otherwise_than_their_params_are_redistributed."""
    import gc
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    try:
        _gloo_placement_checks(rank, world)
    finally:
        gc.collect()
        dist.destroy_process_group()


def _gloo_placement_checks(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(11)
    # A replicated param whose grad arrives Partial (tensor parallelism before its
    # reduction: its local tensor is a partial sum of the same shape), and a Shard(0) param
    # whose grad arrives Shard(1).
    full = {"norm": torch.randn(6, generator=gen), "square": torch.randn(4, 4, generator=gen)}
    placement = {"norm": [Replicate()], "square": [Shard(0)]}
    params = {name: torch.nn.Parameter(distribute_tensor(value.clone(), mesh, placement[name]))
              for name, value in full.items()}
    reference = {name: torch.nn.Parameter(value.double()) for name, value in full.items()}
    ours = FusedAdam(list(params.items()), **HYPER)
    torch_opt = torch.optim.AdamW(reference.values(), **HYPER, foreach=False)
    for step in range(3):
        partials = [torch.randn(6, generator=gen) for _ in range(world)]  # every rank draws all
        square = torch.randn(4, 4, generator=gen)
        params["norm"].grad = DTensor.from_local(partials[rank].clone(), mesh, [Partial()], run_check=False)
        params["square"].grad = distribute_tensor(square.clone(), mesh, [Shard(1)])
        reference["norm"].grad = sum(partials).double()
        reference["square"].grad = square.double()
        torch_opt.step()
        ours.step()
        for name, param in params.items():
            torch.testing.assert_close(param.full_tensor().double(), reference[name].detach(), rtol=1e-5,
                                       atol=2e-6, msg=lambda m: f"rank {rank} step {step} {name}: {m}")
        assert params["norm"].grad.placements == (Replicate(),)  # the redistributed grad replaced it


def test_grads_placed_otherwise_than_their_params_are_redistributed():
    """2 CPU processes (gloo): a Partial grad of a replicated param is reduced, and a
    Shard(1) grad of a Shard(0) param resharded, before the step reads them, as torch's
    optimizers do through DTensor arithmetic. Reading the Partial grad's local tensor as it
    is would apply a partial sum, silently (its shape is the param's)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs torch.distributed with gloo")
    mp.spawn(_gloo_placement_rank, args=(2, _free_port()), nprocs=2, join=True)


@pytest.mark.parametrize("norm_type", [2.0, math.inf], ids=["L2", "inf"])
def test_two_gloo_ranks_clip_by_the_global_norm(norm_type):
    """2 CPU processes (gloo), DTensor params: FusedAdam's host communicator over
    torch.distributed gives clip_grad_norm_ + AdamW on the whole float64 tensors, and a
    NaN on one rank skips the step on both."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs torch.distributed with gloo")
    mp.spawn(_gloo_clip_rank, args=(2, _free_port(), norm_type), nprocs=2, join=True)
