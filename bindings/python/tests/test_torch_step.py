"""shardadam.torch.FusedAdam's step: every grad is checked at every step, params without a
grad are skipped as torch skips them, torch.compile sees an opaque step, non-contiguous
params are refused with advice that keeps them in the model.

CPU only (float32); skipped visibly without torch. References: torch.optim.AdamW
(foreach=False, fused=False) on a copy of the model. test_grads.py has the same checks for
shardadam.Optimizer (no torch needed).
"""
import copy
import os
import socket
import weakref

import pytest

torch = pytest.importorskip("torch")
numpy = pytest.importorskip("numpy")
import shardadam  # noqa: E402
from shardadam.torch import FusedAdam  # noqa: E402

HYPER = dict(lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
ATOL, RTOL = 2e-6, 1e-5


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


def backward(model, seed):
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(5, 16, generator=gen), torch.randn(5, 8, generator=gen)
    torch.nn.functional.mse_loss(model(x), y).backward()


def snapshot(model, opt):
    """Copies of every param and every state tensor."""
    params = [p.detach().clone() for p in model.parameters()]
    states = [{k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()]
    return params, states


def assert_unchanged(model, opt, before):
    params, states = before
    for (name, p), old, old_state in zip(model.named_parameters(), params, states):
        assert torch.equal(p.detach(), old), f"param {name} changed"
        for key, value in opt.state[p].items():
            assert torch.equal(value, old_state[key]), f"state {key} of {name} changed"


# ---- 1. every grad is checked at every step ---------------------------------------------------


def _expanded(p):  # 1 row of memory read as p.shape[0] rows
    return torch.randn(1, p.shape[1]).expand(*p.shape)


def _transposed(p):  # the right shape, column-major
    return torch.randn(p.shape[1], p.shape[0]).t()


def _overlapping(p):  # every row starts one element after the previous one
    return torch.randn(p.shape[0] + p.shape[1]).as_strided(tuple(p.shape), (1, 1))


def _every_other(p):  # a strided slice
    return torch.randn(p.shape[0], 2 * p.shape[1])[:, ::2]


def _smaller(p):  # fewer elements than the param (torch allows it through .data)
    p.grad = torch.randn(*p.shape)
    p.grad.data = torch.randn(p.shape[1])
    return p.grad


def _float64(p):  # another dtype (torch allows it once grad_dtype is None)
    p.grad_dtype = None
    return torch.randn(*p.shape, dtype=torch.float64)


BAD_GRADS = {"expanded": _expanded, "transposed": _transposed, "overlapping": _overlapping,
             "strided": _every_other, "smaller": _smaller, "float64": _float64}


@pytest.mark.parametrize("bad", sorted(BAD_GRADS))
def test_a_grad_the_kernel_cannot_read_as_is_is_refused_at_a_later_step_and_nothing_changes(bad):
    model = make_model()
    opt = FusedAdam(model.named_parameters(), **HYPER)
    for step in range(2):
        opt.zero_grad()
        backward(model, step)
        opt.step()
    opt.zero_grad()
    backward(model, 2)
    weight = model[2].weight
    grad = BAD_GRADS[bad](weight)
    if grad is not weight.grad:
        weight.grad = grad
    before = snapshot(model, opt)
    with pytest.raises(shardadam.Error, match=r"2\.weight"):
        opt.step()
    assert_unchanged(model, opt, before)
    # A good grad afterwards steps as usual.
    weight.grad = None
    weight.grad_dtype = weight.dtype
    weight.grad = torch.randn_like(weight)
    opt.step()
    assert not torch.equal(weight.detach(), before[0][2])


def test_an_expanded_grad_at_the_third_step_never_reaches_the_kernel():
    """The issue's reproduction: before, the kernel read 512 floats from a 16-float buffer."""
    param = torch.nn.Parameter(torch.randn(32, 16))
    opt = FusedAdam([param])
    for _ in range(2):
        param.grad = torch.randn(32, 16)
        opt.step()
    param.grad = torch.randn(1, 16).expand(32, 16)
    before = param.detach().clone()
    with pytest.raises(shardadam.Error, match="params.0"):
        opt.step()
    assert torch.equal(param.detach(), before) and torch.isfinite(param).all()


def test_a_transposed_grad_at_the_first_step_is_refused():
    param = torch.nn.Parameter(torch.randn(32, 16))
    opt = FusedAdam([param])
    param.grad = torch.randn(16, 32).t()
    with pytest.raises(shardadam.Error, match="params.0"):
        opt.step()


def test_no_binding_outlives_the_step_so_zero_grad_frees_the_grads():
    """After step() the library holds no pointer into the grads: zero_grad() frees them (no
    reference kept), and a native step before the next FusedAdam.step() reads nothing."""
    import gc
    import weakref
    model = make_model()
    opt = FusedAdam(model.parameters())
    backward(model, 0)
    opt.step()
    grad = weakref.ref(model[0].weight.grad)
    opt.zero_grad(set_to_none=True)
    gc.collect()
    assert grad() is None
    before = snapshot(model, opt)
    opt.native.step()
    assert_unchanged(model, opt, before)


# ---- 2. torch semantics --------------------------------------------------------------------------


def test_params_without_a_grad_are_skipped_as_torch_adamw_skips_them():
    """Some params have no grad at some steps (frozen for a while, unused); torch skips
    them and their own step counts (bias correction) lag: so must FusedAdam."""
    ours_model = make_model()
    torch_model = copy.deepcopy(ours_model)
    ours = FusedAdam(ours_model.parameters(), **HYPER)
    reference = torch.optim.AdamW(torch_model.parameters(), **HYPER, foreach=False, fused=False)
    for step in range(8):
        for model, opt in ((ours_model, ours), (torch_model, reference)):
            opt.zero_grad(set_to_none=True)
            backward(model, step)
            if step in (0, 1, 5):
                model[0].weight.grad = None  # not trained at these steps
            if step % 2 == 1:
                model[2].bias.grad = None
            opt.step()
    for (name, p), q in zip(ours_model.named_parameters(), torch_model.parameters()):
        torch.testing.assert_close(p, q, atol=ATOL, rtol=RTOL, msg=lambda m: f"{name}: {m}")


_FRESH_GRAD_MEMORY = []  # the memory of every grad _ShiftedGradParameter made (never freed)


class _ShiftedGradParameter(torch.nn.Parameter):
    """A Parameter whose `grad` is a Python property over torch's: each read makes a fresh
    tensor, what backward accumulated plus 0.25. Its memory is a numpy view of an array
    kept here: when the last tensor on that memory dies, torch drops the view and the array
    is filled with NaN (it stays allocated). So a step reading the grad after torch has
    released its memory reads NaN, every time, where freed memory might still hold the
    values. torch's optimizers read p.grad through the property and hold the result through
    their step: so must FusedAdam."""

    @property
    def grad(self):
        grad = torch.nn.Parameter.grad.__get__(self)
        if grad is None:
            return None
        memory = numpy.empty(grad.numel(), dtype=numpy.float32)
        _FRESH_GRAD_MEMORY.append(memory)
        view = memory[:]
        weakref.finalize(view, memory.fill, numpy.nan)
        fresh = torch.from_numpy(view).view(grad.shape)
        fresh.copy_(grad + 0.25)
        return fresh

    @grad.setter
    def grad(self, value):
        torch.nn.Parameter.grad.__set__(self, value)


@pytest.mark.parametrize("step_in_backward", [False, True])
def test_a_param_type_that_overrides_grad_is_read_through_its_property_and_held_through_the_step(
        step_in_backward):
    """Plain Parameters and a subclass whose `grad` property makes a fresh tensor at each
    read, in one optimizer: FusedAdam reads each param through its own type's attribute
    (its intake calls the type's descriptor directly) and keeps what it read alive until
    the step is done, as torch's AdamW does; also when it steps in the backward."""
    models = []
    for _ in range(2):
        model = make_model()
        model[2].weight = _ShiftedGradParameter(model[2].weight.detach().clone())
        models.append(model)
    ours_model, torch_model = models
    ours = FusedAdam(ours_model.parameters(), **HYPER, step_in_backward=step_in_backward)
    reference = torch.optim.AdamW(torch_model.parameters(), **HYPER, foreach=False, fused=False)
    for step in range(4):
        for model, opt in ((ours_model, ours), (torch_model, reference)):
            opt.zero_grad(set_to_none=True)
            backward(model, step)
            opt.step()
    for (name, p), q in zip(ours_model.named_parameters(), torch_model.parameters()):
        torch.testing.assert_close(p, q, atol=ATOL, rtol=RTOL, msg=lambda m: f"{name}: {m}")
    _FRESH_GRAD_MEMORY.clear()


def test_stepping_in_the_backward_keeps_no_grad_alive_after_the_first_step():
    """With step_in_backward, each grad is freed once stepped (p.grad becomes None), the
    first step's too: nothing FusedAdam bound at its first step may still hold a grad's
    memory after it."""
    model = make_model()
    opt = FusedAdam(model.parameters(), **HYPER, step_in_backward=True)
    grads = []
    for p in model.parameters():  # after FusedAdam's own hook: the grad as it arrived
        p.register_post_accumulate_grad_hook(lambda param: grads.append(weakref.ref(param.grad)))
    backward(model, 0)
    opt.step()
    assert all(p.grad is None for p in model.parameters())
    assert len(grads) == 4 and all(ref() is None for ref in grads), "a stepped grad is still alive"


def test_a_step_where_no_param_has_a_grad_changes_nothing():
    model = make_model()
    opt = FusedAdam(model.parameters())
    backward(model, 0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    before = snapshot(model, opt)
    opt.step()
    assert_unchanged(model, opt, before)


def test_a_compiled_training_step_calls_the_optimizer():
    """torch.compile of a function that runs forward, backward and opt.step(): the step is
    opaque to Dynamo (a graph break) and matches the uncompiled run."""
    compiled_model, eager_model = make_model(), make_model()
    compiled_opt = FusedAdam(compiled_model.parameters(), **HYPER)
    eager_opt = FusedAdam(eager_model.parameters(), **HYPER)

    def train_step(model, opt, x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    torch._dynamo.reset()
    compiled = torch.compile(train_step, backend=os.environ.get("SHARDADAM_TEST_COMPILE_BACKEND", "inductor"))
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        x, y = torch.randn(5, 16, generator=gen), torch.randn(5, 8, generator=gen)
        compiled(compiled_model, compiled_opt, x, y)
        train_step(eager_model, eager_opt, x, y)
    for p, q in zip(compiled_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, atol=ATOL, rtol=RTOL)
    assert compiled_opt.native.param_groups[0].step == 3


# ---- hyperparameters changed between steps, step hooks ---------------------------------------------


def _set_lr(group, step):
    group["lr"] = 3e-3 / (1 + step)


def _mutate_betas_list(group, step):  # a list, then the same list object changed in place
    if step == 1:
        group["betas"] = [0.85, 0.99]
    else:
        group["betas"][0] = 0.9 - 0.1 * step


def _fill_tensor_lr(group, step):  # the same tensor object, changed in place
    group["lr"].fill_(3e-3 / (1 + step))


def _set_weight_decay(group, step):
    group["weight_decay"] = 0.05 * step


CHANGES = {"lr": (_set_lr, {}), "betas list in place": (_mutate_betas_list, {}),
           "tensor lr in place": (_fill_tensor_lr, {"lr": torch.tensor(3e-3)}),
           "weight_decay": (_set_weight_decay, {})}


@pytest.mark.parametrize("change", CHANGES)
def test_hyperparameters_changed_between_steps_reach_each_step(change):
    """A group's values changed between steps (by assignment, or in place where the value
    is mutable) reach the next step, as torch.optim.AdamW reads them: the step compares
    a group's raw values with those last pushed, and must not take an in-place change for
    no change."""
    mutate, given = CHANGES[change]
    model, ref_model = make_model(), make_model()
    hyper = dict(HYPER, **given)
    ref_hyper = dict(HYPER, **{k: (v.clone() if isinstance(v, torch.Tensor) else list(v)) for k, v in given.items()})
    ours = FusedAdam(model.parameters(), **hyper)
    reference = torch.optim.AdamW(ref_model.parameters(), **ref_hyper, foreach=False, fused=False)
    for step in range(4):
        for m in (model, ref_model):
            m.zero_grad(set_to_none=True)
            backward(m, step)
        if step:
            mutate(ours.param_groups[0], step)
            mutate(reference.param_groups[0], step)
        ours.step()
        reference.step()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, atol=ATOL, rtol=RTOL)


def test_step_hooks_run_around_each_step_as_torchs_optimizers_run_them():
    """The global and the optimizer's own pre- and post-hooks run once per step, in torch's
    order, with the step's arguments; a pre-hook's (args, kwargs) replace them; a profiler
    records the step under torch's name for it."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    model = make_model()
    opt = FusedAdam(model.parameters(), **HYPER)
    calls = []
    handles = [
        register_optimizer_step_pre_hook(lambda o, args, kwargs: calls.append(("global pre", o is opt))),
        opt.register_step_pre_hook(lambda o, args, kwargs: calls.append(("pre", len(args), dict(kwargs)))),
        opt.register_step_post_hook(lambda o, args, kwargs: calls.append(("post", len(args), dict(kwargs)))),
        register_optimizer_step_post_hook(lambda o, args, kwargs: calls.append(("global post", o is opt))),
    ]
    try:
        backward(model, 0)
        opt.step()
        assert calls == [("global pre", True), ("pre", 1, {}), ("post", 1, {}), ("global post", True)]
        calls.clear()
        # A pre-hook that replaces the arguments: the step runs the closure it gives.
        closure_ran = []

        def closure():
            closure_ran.append(True)
            return torch.tensor(1.5)

        replace = opt.register_step_pre_hook(lambda o, args, kwargs: (args, {"closure": closure}))
        assert opt.step() == 1.5 and closure_ran == [True]
        assert calls[-2:] == [("post", 1, {"closure": closure}), ("global post", True)]
        replace.remove()
    finally:
        for handle in handles:
            handle.remove()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        opt.step()
    assert "Optimizer.step#FusedAdam.step" in {event.name for event in profiler.events()}


def test_a_channels_last_param_is_refused_with_advice_that_keeps_it_in_the_model():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 4, 1))
    model = model.to(memory_format=torch.channels_last)
    assert not model[0].weight.is_contiguous()
    with pytest.raises(ValueError) as info:
        FusedAdam(model.named_parameters())
    message = str(info.value)
    assert "0.weight" in message and "contiguous copy" not in message
    assert "model.to(memory_format=torch.contiguous_format)" in message
    # The advice works and the model's own Parameter objects are the ones updated.
    weight = model[0].weight
    model = model.to(memory_format=torch.contiguous_format)
    assert model[0].weight is weight and weight.is_contiguous()
    opt = FusedAdam(model.parameters())
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    before = weight.detach().clone()
    opt.step()
    assert not torch.equal(weight.detach(), before)


class _GradModeProbe(torch.nn.Parameter):
    """A Parameter whose ``grad`` reads note autograd's grad mode at the time."""
    modes = []

    @property
    def grad(self):
        _GradModeProbe.modes.append(torch.is_grad_enabled())
        return torch.Tensor.grad.__get__(self)

    @grad.setter
    def grad(self, value):
        torch.Tensor.grad.__set__(self, value)


def test_the_step_runs_with_grad_mode_off_and_gives_the_callers_mode_back_also_when_it_fails():
    param = _GradModeProbe(torch.randn(3))
    opt = FusedAdam([param])
    param.grad = torch.ones(3)
    for _ in range(2):  # the first step prepares, the second binds as every later one
        _GradModeProbe.modes.clear()
        with torch.enable_grad():
            opt.step()
            assert torch.is_grad_enabled()
        assert _GradModeProbe.modes and not any(_GradModeProbe.modes)
    param.grad = torch.ones(6)[::2]  # refused by the library: strided
    with torch.enable_grad():
        with pytest.raises(shardadam.Error, match="grad"):
            opt.step()
        assert torch.is_grad_enabled()
    with torch.no_grad():
        param.grad = torch.ones(3)
        opt.step()
        assert not torch.is_grad_enabled()


def test_plain_params_after_a_refused_one_are_not_registered_and_those_before_it_stay_named():
    # FusedAdam registers runs of plain params at the library's defaults in one native loop
    # (_grad_intake.add_params); a refusal inside the run names the param, and the optimizer
    # keeps exactly the params taken before it, under their names, steppable.
    first = torch.nn.Parameter(torch.randn(3))
    opt = FusedAdam([first])
    group = [torch.nn.Parameter(torch.randn(2)), torch.nn.Parameter(torch.randn(4, 2)),
             torch.nn.Parameter(torch.randn(5, dtype=torch.float64)), torch.nn.Parameter(torch.randn(6))]
    with pytest.raises(shardadam.Unsupported, match="'params.3': param dtype float64"):
        opt.add_param_group({"params": group})
    infos = opt.native.param_infos()
    assert [info.name for info in infos] == ["params.0", "params.1", "params.2"]
    assert [info.local_shape for info in infos] == [(3,), (2,), (4, 2)]
    assert [entry.param for entry in opt._entries] == [first] + group[:2]
    for p in (first, *group[:2]):
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in (first, *group[:2])]
    opt.step()
    assert all(not torch.equal(p.detach(), b) for p, b in zip((first, *group[:2]), before))
    assert group[2] not in opt._entry_of and group[3] not in opt._entry_of


# ---- DTensor params on a 1-rank gloo mesh ---------------------------------------------------------


@pytest.fixture(scope="module")
def mesh():
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs torch.distributed with gloo")
    from torch.distributed.device_mesh import init_device_mesh
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_a_dtensor_grad_whose_local_tensor_is_transposed_is_refused(mesh):
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    param = torch.nn.Parameter(distribute_tensor(torch.randn(32, 16), mesh, [Shard(0)]))
    opt = FusedAdam([("w", param)])
    param.grad = distribute_tensor(torch.randn(32, 16), mesh, [Shard(0)])
    opt.step()
    param.grad = DTensor.from_local(torch.randn(16, 32).t(), mesh, [Shard(0)], run_check=False)
    before = param.to_local().clone()
    with pytest.raises(shardadam.Error, match="'w'"):
        opt.step()
    assert torch.equal(param.to_local(), before)


def test_dtensor_params_without_grads_are_skipped(mesh):
    from torch.distributed.tensor import Shard, distribute_tensor
    torch.manual_seed(5)
    values = [torch.randn(6, 4), torch.randn(7)]
    params = [torch.nn.Parameter(distribute_tensor(v.clone(), mesh, [Shard(0)])) for v in values]
    refs = [torch.nn.Parameter(v.clone()) for v in values]
    ours = FusedAdam(params, **HYPER)
    reference = torch.optim.AdamW(refs, **HYPER, foreach=False, fused=False)
    for step in range(5):
        grads = [torch.randn_like(v) for v in values]
        for i, (p, r) in enumerate(zip(params, refs)):
            has_grad = not (i == 1 and step in (1, 2))
            p.grad = distribute_tensor(grads[i], mesh, [Shard(0)]) if has_grad else None
            r.grad = grads[i].clone() if has_grad else None
        ours.step()
        reference.step()
    for p, r in zip(params, refs):
        torch.testing.assert_close(p.full_tensor(), r.detach(), atol=ATOL, rtol=RTOL)
