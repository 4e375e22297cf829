"""FusedAdam.state_dict() / load_state_dict() on the CPU, one process: atomic loading, params a
state dict lacks, per-param step counts, and torch.save checkpoints between torch.optim.AdamW
and FusedAdam (fp32 params; bf16 params with fp32 masters, whichever of the model and the
optimizer is loaded first). References: torch.optim.AdamW itself, or AdamW run in float64.

Skipped when torch is not importable (the multi-process DCP checks are test_torch_dcp.py).
"""
import copy
import io

import pytest

torch = pytest.importorskip("torch", reason="the FusedAdam state-dict tests need torch")
from shardadam.torch import FusedAdam  # noqa: E402

HYPER = dict(lr=2e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05)
# FusedAdam and torch's AdamW order their float32 operations differently: a few ulps.
ATOL, RTOL = 2e-6, 1e-5


def make_model(dtype=torch.float32, seed=0, device="cpu"):
    """Three params of odd sizes: (7, 5), (7,), (3, 7)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3, bias=False))
    return model.to(device=device, dtype=dtype)


def batches(steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 5, generator=gen), torch.randint(0, 3, (6,), generator=gen)) for _ in range(steps)]


def loss_of(model, x, y):
    first = next(model.parameters())
    return torch.nn.functional.cross_entropy(model(x.to(first.device, first.dtype)).float(), y.to(first.device))


def train(model, opt, data, without_grad=()):
    """One step per batch; ``without_grad``: (step, param index) pairs whose grad is None."""
    losses = []
    params = list(model.parameters())
    for step, (x, y) in enumerate(data):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, x, y)
        loss.backward()
        for index in [i for s, i in without_grad if s == step]:
            params[index].grad = None
        opt.step()
        losses.append(loss.item())
    return losses


def round_trip(state_dict):
    """A state dict through torch.save / torch.load, as a checkpoint on disk."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)

def checkpoint_after(make_opt, dtype, saved, total, without_grad=()):
    """A model and optimizer trained on the first `saved` of `total` batches, and their state
    dicts through torch.save: (model, opt, batches, model state, optimizer state)."""
    model = make_model(dtype) if dtype is not None else make_model()
    opt = make_opt(model)
    data = batches(total)
    train(model, opt, data[:saved], without_grad=without_grad)
    return model, opt, data, round_trip(model.state_dict()), round_trip(opt.state_dict())



def two_groups(model):
    layers = list(model)
    return [{"params": layers[0].parameters()}, {"params": layers[2].parameters(), "lr": 1e-2}]


def snapshot(model, opt):
    """Everything a load may change: param values, every state, every step count, the groups."""
    state = {index: {key: value.detach().clone() for key, value in s.items()}
             for index, s in opt.state_dict()["state"].items()}
    groups = [{k: v for k, v in g.items() if k not in ("params", "param_names")} for g in opt.param_groups]
    return {"params": [p.detach().clone() for p in model.parameters()], "state": state, "groups": groups,
            "native_steps": [g.step for g in opt.native.param_groups]}


def assert_same(before, after):
    assert before["groups"] == after["groups"]
    assert before["native_steps"] == after["native_steps"]
    for a, b in zip(before["params"], after["params"]):
        assert torch.equal(a, b)
    assert before["state"].keys() == after["state"].keys()
    for index, state in before["state"].items():
        assert state.keys() == after["state"][index].keys()
        for key, value in state.items():
            assert torch.equal(value, after["state"][index][key]), f"param {index} state {key} changed"


# ---- A: atomic loading -------------------------------------------------------------------------------
BAD_STATE_DICTS = {
    # Each breaks only the last param or group: a load that copies as it checks has by then
    # written the others.
    "a group with a param too few": lambda sd: sd["param_groups"][1]["params"].pop(),
    "an unknown state key": lambda sd: sd["state"][2].__setitem__("exp_avg_sqrt", torch.zeros(3, 7)),
    "a state of the wrong shape": lambda sd: sd["state"][2].__setitem__("exp_avg", torch.zeros(7, 3)),
    "an integer moment": lambda sd: sd["state"][2].__setitem__("exp_avg_sq", torch.ones(3, 7, dtype=torch.int32)),
    "a moment that is not a tensor": lambda sd: sd["state"][2].__setitem__("exp_avg", [[0.0] * 7] * 3),
    "a state without exp_avg_sq": lambda sd: sd["state"][2].pop("exp_avg_sq"),
    "a state without step": lambda sd: sd["state"][2].pop("step"),
    "a negative step": lambda sd: sd["state"][2].__setitem__("step", torch.tensor(-1.0)),
    "a fractional step": lambda sd: sd["state"][2].__setitem__("step", torch.tensor(2.5)),
    "beta2 out of range": lambda sd: sd["param_groups"][1].__setitem__("betas", (0.9, 1.5)),
    "a negative lr": lambda sd: sd["param_groups"][1].__setitem__("lr", -1.0),
    "an lr that is not a number": lambda sd: sd["param_groups"][1].__setitem__("lr", "fast"),
    "amsgrad switched on": lambda sd: (sd["param_groups"][1].__setitem__("amsgrad", True),
                                       sd["state"][2].__setitem__("max_exp_avg_sq", torch.zeros(3, 7))),
}


@pytest.mark.parametrize("case", list(BAD_STATE_DICTS))
def test_a_rejected_state_dict_changes_nothing(case):
    """load_state_dict checks every group and every state before it copies anything: on error
    the params, states, step counts and hyperparameters are as they were, and training goes
    on as if the load had not been tried."""
    model, twin = make_model(), make_model()
    opt, twin_opt = FusedAdam(two_groups(model), **HYPER), FusedAdam(two_groups(twin), **HYPER)
    data = batches(6)
    train(model, opt, data[:3])
    train(twin, twin_opt, data[:3])
    other_model = make_model(seed=7)
    other = torch.optim.AdamW(two_groups(other_model), **HYPER)
    train(other_model, other, batches(4, seed=9))
    bad = copy.deepcopy(other.state_dict())
    BAD_STATE_DICTS[case](bad)
    before = snapshot(model, opt)
    with pytest.raises((ValueError, KeyError, TypeError)):
        opt.load_state_dict(bad)
    assert_same(before, snapshot(model, opt))
    train(model, opt, data[3:])
    train(twin, twin_opt, data[3:])
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16 + fp32 master"])
def test_a_param_without_state_in_the_state_dict_is_reset(dtype):
    """A state dict without a param's state (torch's AdamW never stepped it: no grad) resets
    that param's state, as torch does: moments zero, step 0, the master the param's value;
    the other params take the saved states."""
    model = make_model(dtype)
    opt = FusedAdam(model.parameters(), **HYPER)
    train(model, opt, batches(3, seed=4))  # the state to be replaced is not zero
    source_model = make_model(dtype, seed=3)
    source = torch.optim.AdamW(source_model.parameters(), **HYPER)
    train(source_model, source, batches(4), without_grad=[(s, 1) for s in range(4)])
    saved = round_trip(source.state_dict())
    assert set(saved["state"]) == {0, 2}
    opt.load_state_dict(saved)
    state = opt.state_dict()["state"]
    assert set(state) == {0, 2}  # as torch's: the reset param holds no state until it steps
    params = list(model.parameters())
    reset = opt.state[params[1]]  # read by key: its (reset) buffers
    assert torch.count_nonzero(reset["exp_avg"]) == 0 and torch.count_nonzero(reset["exp_avg_sq"]) == 0
    assert float(reset["step"]) == 0
    for index in (0, 2):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(state[index][key], saved["state"][index][key].float(), atol=0, rtol=0)
    if dtype == torch.bfloat16:
        for index, param in enumerate(params):
            master = opt.state[param]["master"]
            assert torch.equal(master, param.float()), f"param {index}: master is not the param"


def test_a_dtensor_state_of_another_global_shape_is_refused(one_rank_mesh):
    """A DTensor state is accepted in any layout of the param's global shape (here Replicate
    into a Shard(0) param) and refused, with nothing changed, when its global shape differs."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(2)
    params = [torch.nn.Parameter(distribute_tensor(torch.randn(shape, generator=gen), one_rank_mesh, [Shard(0)]))
              for shape in ((5, 3), (4,))]
    opt = FusedAdam(params, **HYPER)
    good = [{"exp_avg": distribute_tensor(torch.randn(p.shape, generator=gen), one_rank_mesh, [Replicate()]),
             "exp_avg_sq": torch.rand(p.shape, generator=gen), "step": torch.tensor(4.0)} for p in params]
    state_dict = {"state": dict(enumerate(good)), "param_groups": [{**opt.param_groups[0], "params": [0, 1]}]}
    opt.load_state_dict(state_dict)
    for index, saved in enumerate(good):
        assert torch.equal(opt.state[params[index]]["exp_avg"].full_tensor(), saved["exp_avg"].full_tensor())
    before = [{k: v.full_tensor().clone() for k, v in opt.state[p].items() if k != "step"} for p in params]
    bad = copy.deepcopy(state_dict)
    bad["state"][0] = {**good[0], "exp_avg": good[1]["exp_avg"] * 2}  # fine: param 0 would be copied first
    bad["state"][1] = {**good[1], "exp_avg": distribute_tensor(torch.zeros(5), one_rank_mesh, [Shard(0)])}
    with pytest.raises(ValueError, match="global shape"):
        opt.load_state_dict(bad)
    for p, saved in zip(params, before):
        for key, value in saved.items():
            assert torch.equal(opt.state[p][key].full_tensor(), value)


@pytest.fixture
def one_rank_mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs torch.distributed with gloo")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


# ---- B: torch.save checkpoints between AdamW and FusedAdam ------------------------------------------
ORDERS = ["optimizer first", "model first"]


def resume(make_optimizer, model_state, optim_state, order, dtype=torch.float32):
    """A fresh model (another init) and optimizer loaded from the checkpoint in ``order``."""
    model = make_model(dtype, seed=11)
    opt = make_optimizer(model)
    if order == "optimizer first":
        opt.load_state_dict(optim_state)
        model.load_state_dict(model_state)
    else:
        model.load_state_dict(model_state)
        opt.load_state_dict(optim_state)
    return model, opt


def adamw(model):
    return torch.optim.AdamW(model.parameters(), **HYPER)


def fused_adam(model):
    return FusedAdam(model.parameters(), **HYPER)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("saver,loader", [(adamw, fused_adam), (fused_adam, adamw)],
                         ids=["AdamW to FusedAdam", "FusedAdam to AdamW"])
def test_b_torch_save_checkpoint_continues_the_uninterrupted_losses(saver, loader, order):
    """fp32: 4 steps with one optimizer, torch.save of both state dicts, load into the other
    optimizer: the next 4 losses are the uninterrupted run's within float32 rounding."""
    model, opt, data, model_state, optim_state = checkpoint_after(saver, None, 4, 8)
    expected = train(model, opt, data[4:])
    resumed_model, resumed = resume(loader, model_state, optim_state, order)
    got = train(resumed_model, resumed, data[4:])
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=0)
    for p, q in zip(resumed_model.parameters(), model.parameters()):
        torch.testing.assert_close(p, q, atol=ATOL, rtol=RTOL)


def test_b_fused_adam_groups_carry_what_adamw_keeps():
    """The saved groups have every key torch.optim.AdamW's groups have (foreach, fused,
    capturable, differentiable with AdamW's defaults), and no FusedAdam-only key at the
    defaults: AdamW's load takes over nothing it would not have itself."""
    model = make_model()
    saved = FusedAdam(model.parameters(), **HYPER).state_dict()["param_groups"][0]
    reference = torch.optim.AdamW(make_model().parameters(), **HYPER).state_dict()["param_groups"][0]
    assert saved == reference
    off = FusedAdam(make_model().parameters(), **HYPER, bias_correction=False).state_dict()["param_groups"][0]
    assert off["bias_correction"] is False


def float64_adamw_step(params, states, grads):
    """One torch AdamW step in float64 from the given values and states; returns the params."""
    copies = [torch.nn.Parameter(p.detach().double().clone()) for p in params]
    reference = torch.optim.AdamW(copies, **HYPER, foreach=False)
    reference.load_state_dict({"state": {i: {k: v.double() if k != "step" else v for k, v in s.items()}
                                         for i, s in enumerate(states)},
                               "param_groups": [{**reference.param_groups[0], "params": list(range(len(params)))}]})
    for p, g in zip(copies, grads):
        p.grad = g.double()
    reference.step()
    return [p.detach() for p in copies]


@pytest.mark.parametrize("order", ORDERS)
def test_b_masters_follow_params_loaded_from_an_adamw_checkpoint(order):
    """bf16 params: an AdamW checkpoint has no master. Whichever of the model and the
    optimizer is loaded first, the first step starts from the loaded params: the master
    after it is float64 AdamW's step from the loaded bf16 params and moments."""
    model, opt, data, model_state, optim_state = checkpoint_after(adamw, torch.bfloat16, 4, 6)
    resumed_model, resumed = resume(fused_adam, model_state, optim_state, order, torch.bfloat16)
    loaded = [p.detach().clone() for p in resumed_model.parameters()]
    states = [{k: v.clone() for k, v in resumed.state_dict()["state"][i].items() if k != "master"}
              for i in range(len(loaded))]
    x, y = data[4]
    resumed.zero_grad()
    loss_of(resumed_model, x, y).backward()
    grads = [p.grad.clone() for p in resumed_model.parameters()]
    resumed.step()
    expected = float64_adamw_step(loaded, states, grads)
    masters = resumed.state_dict()["state"]
    for index, want in enumerate(expected):
        torch.testing.assert_close(masters[index]["master"].double(), want, atol=1e-6, rtol=1e-5,
                                   msg=lambda m: f"param {index}: {m}")


@pytest.mark.parametrize("order", ORDERS)
def test_b_fused_adam_bf16_checkpoint_resumes_bit_for_bit(order):
    """bf16 params, FusedAdam to FusedAdam through torch.save: the loaded masters (finer than
    the params) are kept, in either load order: the resumed run equals the uninterrupted one
    bit for bit."""
    model, opt, data, model_state, optim_state = checkpoint_after(fused_adam, torch.bfloat16, 4, 8)
    expected = train(model, opt, data[4:])
    resumed_model, resumed = resume(fused_adam, model_state, optim_state, order, torch.bfloat16)
    assert train(resumed_model, resumed, data[4:]) == expected
    for p, q in zip(resumed_model.parameters(), model.parameters()):
        assert torch.equal(p, q)


def test_b_fused_adam_bf16_checkpoint_loads_into_adamw():
    """bf16 params with masters, FusedAdam to AdamW (bf16 states) through torch.save: AdamW
    takes the moments (rounded to bf16) and continues close to the uninterrupted run."""
    model, opt, data, model_state, optim_state = checkpoint_after(fused_adam, torch.bfloat16, 4, 8)
    expected = train(model, opt, data[4:])
    resumed_model, resumed = resume(adamw, model_state, optim_state, "optimizer first", torch.bfloat16)
    for index, state in resumed.state_dict()["state"].items():
        assert torch.equal(state["exp_avg"], optim_state["state"][index]["exp_avg"].to(torch.bfloat16))
    torch.testing.assert_close(train(resumed_model, resumed, data[4:]), expected, rtol=2e-2, atol=0)


# ---- C: per-param step counts ------------------------------------------------------------------------
def test_c_per_param_steps_of_a_torch_state_dict_are_kept():
    """AdamW's per-param steps [6, 6, 3] (param 2 had no grad in 3 of 6 steps) load as such,
    state_dict() reports them, and training on matches AdamW's (each param's own bias
    correction)."""
    model = make_model()
    opt = adamw(model)
    data = batches(10)
    train(model, opt, data[:6], without_grad=[(1, 2), (3, 2), (4, 2)])
    assert [float(s["step"]) for s in opt.state_dict()["state"].values()] == [6, 6, 3]
    model_state, optim_state = round_trip(model.state_dict()), round_trip(opt.state_dict())
    resumed_model, resumed = resume(fused_adam, model_state, optim_state, "optimizer first")
    assert [float(s["step"]) for s in resumed.state_dict()["state"].values()] == [6, 6, 3]
    assert resumed.native.param_steps() == [6, 6, 3]
    expected = train(model, opt, data[6:])
    torch.testing.assert_close(train(resumed_model, resumed, data[6:]), expected, rtol=RTOL, atol=0)
    for p, q in zip(resumed_model.parameters(), model.parameters()):
        torch.testing.assert_close(p, q, atol=ATOL, rtol=RTOL)
    assert [float(s["step"]) for s in resumed.state_dict()["state"].values()] == [10, 10, 7]


def test_c_a_param_missing_from_the_state_dict_restarts_at_step_0():
    """A param AdamW never stepped has no state: it loads with step 0 and its first step
    after the load is bias-corrected as a first step, as AdamW's."""
    model = make_model()
    opt = adamw(model)
    data = batches(8)
    train(model, opt, data[:4], without_grad=[(s, 1) for s in range(4)])
    model_state, optim_state = round_trip(model.state_dict()), round_trip(opt.state_dict())
    resumed_model, resumed = resume(fused_adam, model_state, optim_state, "model first")
    assert resumed.native.param_steps() == [4, 0, 4]
    expected = train(model, opt, data[4:])
    torch.testing.assert_close(train(resumed_model, resumed, data[4:]), expected, rtol=RTOL, atol=0)
    for p, q in zip(resumed_model.parameters(), model.parameters()):
        torch.testing.assert_close(p, q, atol=ATOL, rtol=RTOL)


def test_c_fused_adam_state_dict_reports_per_param_steps():
    """FusedAdam skips a param whose grad is None (its step does not advance) and reports
    each param's count in state_dict(); AdamW loads them and continues alike."""
    model, reference_model = make_model(), make_model()
    opt, reference = fused_adam(model), adamw(reference_model)
    data = batches(10)
    skips = [(1, 2), (3, 2), (4, 2)]
    train(model, opt, data[:6], without_grad=skips)
    train(reference_model, reference, data[:6], without_grad=skips)
    saved = round_trip(opt.state_dict())
    assert [float(s["step"]) for s in saved["state"].values()] == [6, 6, 3]
    resumed_model, resumed = resume(adamw, round_trip(model.state_dict()), saved, "optimizer first")
    expected = train(reference_model, reference, data[6:])
    torch.testing.assert_close(train(resumed_model, resumed, data[6:]), expected, rtol=RTOL, atol=0)
