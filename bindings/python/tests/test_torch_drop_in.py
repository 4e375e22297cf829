"""FusedAdam as torch.optim.AdamW to the letter, where real clients tripped (CPU, one process):
group keys that round-trip through every state-dict path (torch's flattened one,
torchtitan's flat helpers), copies, torch's implementation keywords, sparse grads, which
params ``state`` holds, and a live ``state[p]["step"]``. The reference is torch.optim.AdamW
itself, run side by side on the same model and data (the multi-rank client runs are
clients/; DCP is test_torch_dcp.py)."""
import copy
import io
import pickle

import pytest

torch = pytest.importorskip("torch", reason="the FusedAdam drop-in tests need torch")
from shardadam.torch import FusedAdam  # noqa: E402
# The model, batches and loop of the state-dict tests (a model of odd sizes, a loss over it).
from test_torch_state_dict import HYPER, RTOL, batches, make_model, train  # noqa: E402

# The cases whose counts and copies live on the device on CUDA run there too (a visible skip
# without a GPU).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="needs a CUDA GPU"))]


def named(model):
    return list(model.named_parameters())


def pair(device="cpu", **options):
    """(model, FusedAdam) and (model, AdamW) from the same init."""
    ours, theirs = make_model(device=device), make_model(device=device)
    return (ours, FusedAdam(named(ours), **HYPER, **options)), (theirs, torch.optim.AdamW(named(theirs), **HYPER))


# ---- group keys ----------------------------------------------------------------------------------
def test_saved_groups_hold_exactly_the_live_groups_keys_and_adamws():
    (_, opt), (_, reference) = pair()
    live = opt.param_groups[0]
    saved = opt.state_dict()["param_groups"][0]
    assert set(saved) == set(live) == set(reference.param_groups[0])
    off = FusedAdam(make_model().parameters(), bias_correction=False)
    assert off.param_groups[0]["bias_correction"] is False
    assert set(off.state_dict()["param_groups"][0]) == set(off.param_groups[0])


def test_torchtitan_flat_state_dict_round_trips():
    """The issue's minimal case: torchtitan's get/load_flat_optim_state_dict (they match
    every live group key to a saved one), then training continues as AdamW's does."""
    utils = pytest.importorskip("torchtitan.components.optimizer.utils",
                                reason="torchtitan is not installed: pip install torchtitan")
    data = batches(6)
    (model, opt), (ref_model, reference) = pair()
    for o, m in ((opt, model), (reference, ref_model)):
        train(m, o, data[:3])
        utils.load_flat_optim_state_dict(o, utils.get_flat_optim_state_dict(o))
    torch.testing.assert_close(train(model, opt, data[3:]), train(ref_model, reference, data[3:]), rtol=RTOL, atol=0)


def test_torch_flattened_optimizer_state_dict_round_trips_into_a_new_optimizer():
    """get_optimizer_state_dict(..., flatten_optimizer_state_dict=True) then
    set_optimizer_state_dict with the same options, into a fresh FusedAdam over a model with
    the saved weights: the next losses are those of the uninterrupted AdamW run."""
    state_dict = pytest.importorskip("torch.distributed.checkpoint.state_dict")
    options = state_dict.StateDictOptions(flatten_optimizer_state_dict=True)
    data = batches(6)
    (model, opt), (ref_model, reference) = pair()
    train(model, opt, data[:3])
    saved_model = copy.deepcopy(model.state_dict())
    saved = state_dict.get_optimizer_state_dict(model, opt, options=options)
    resumed_model = make_model(seed=7)
    resumed_model.load_state_dict(saved_model)
    resumed = FusedAdam(named(resumed_model), **HYPER)
    state_dict.set_optimizer_state_dict(resumed_model, resumed, saved, options=options)
    train(ref_model, reference, data[:3])
    torch.testing.assert_close(train(resumed_model, resumed, data[3:]), train(ref_model, reference, data[3:]),
                               rtol=RTOL, atol=0)


# ---- torch's implementation keywords --------------------------------------------------------------
@pytest.mark.parametrize("options", [dict(foreach=False), dict(foreach=True), dict(foreach=None), dict(fused=True),
                                     dict(fused=None), dict(capturable=False), dict(differentiable=False),
                                     dict(fused=True, foreach=False)])
def test_implementation_keywords_that_mean_what_fused_adam_does_are_taken(options):
    """As keywords and inside param-group dicts; the groups hold them as AdamW's do, and the
    math is AdamW's."""
    data = batches(3)
    (model, opt), (ref_model, reference) = pair(**options)
    for key, value in options.items():
        assert opt.param_groups[0][key] is value
    torch.testing.assert_close(train(model, opt, data), train(ref_model, reference, data), rtol=RTOL, atol=0)
    grouped = FusedAdam([{"params": list(make_model().parameters()), **options}], **HYPER)
    for key, value in options.items():
        assert grouped.param_groups[0][key] is value


@pytest.mark.parametrize("key,value,reason", [("fused", False, "always fused"), ("capturable", True, "CUDA graph"),
                                              ("differentiable", True, "autograd"), ("foreach", 1, "foreach may be")])
def test_implementation_keywords_that_fused_adam_cannot_honour_are_refused_by_name(key, value, reason):
    with pytest.raises(ValueError, match=rf"{key}={value!r}.*{reason}"):
        FusedAdam(make_model().parameters(), **{key: value})
    opt = FusedAdam(make_model().parameters())
    with pytest.raises(ValueError, match=rf"add_param_group: {key}={value!r}"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))], key: value})
    assert len(opt.param_groups) == 1


def test_an_unknown_keyword_is_still_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword arguments.*'fusedd'"):
        FusedAdam(make_model().parameters(), fusedd=True)


# ---- copies ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [{}, dict(moment_dtype=torch.uint8, min_8bit_size=0)], ids=["fp32", "8-bit"])
def test_a_deep_copy_has_its_own_exact_state(options, device):
    """copy.deepcopy((model, opt)) mid-training: the copy's states equal the original's bit
    for bit (8-bit codes and absmax too), live in buffers of their own, and the copy then
    trains as the original does on the same batches (the copy first: shared state would
    show in the original's losses); fp32: as AdamW's own deep copy does."""
    data = batches(8)
    (model, opt), (ref_model, reference) = pair(device, **options)
    train(model, opt, data[:3], without_grad=[(1, 2)])
    train(ref_model, reference, data[:3], without_grad=[(1, 2)])
    model_copy, opt_copy = copy.deepcopy((model, opt))
    ref_model_copy, reference_copy = copy.deepcopy((ref_model, reference))
    assert opt_copy is not opt and opt_copy.native is not opt.native
    assert [p for g in opt_copy.param_groups for p in g["params"]] == list(model_copy.parameters())
    for p, q in zip(model.parameters(), model_copy.parameters()):
        ours, theirs = opt.state[p], opt_copy.state[q]
        assert set(ours) == set(theirs)
        for key in ours:
            torch.testing.assert_close(theirs[key], ours[key], rtol=0, atol=0)
            if key != "step":
                assert theirs[key].data_ptr() != ours[key].data_ptr()
    copy_losses = train(model_copy, opt_copy, data[3:])
    assert train(model, opt, data[3:]) == copy_losses
    if not options:  # AdamW has no 8-bit moments
        torch.testing.assert_close(copy_losses, train(ref_model_copy, reference_copy, data[3:]), rtol=RTOL, atol=0)


def test_a_deep_copy_of_bf16_params_keeps_their_fp32_masters():
    model = make_model(dtype=torch.bfloat16)
    opt = FusedAdam(named(model), **HYPER)
    train(model, opt, batches(2))
    model_copy, opt_copy = copy.deepcopy((model, opt))
    for p, q in zip(model.parameters(), model_copy.parameters()):
        torch.testing.assert_close(opt_copy.state[q]["master"], opt.state[p]["master"], rtol=0, atol=0)
    data = batches(3, seed=5)
    torch.testing.assert_close(train(model_copy, opt_copy, data), train(model, opt, data), rtol=0, atol=0)


@pytest.mark.parametrize("how", ["pickle", "torch.save", "copy.copy"])
def test_pickling_a_fused_adam_raises_at_once_and_says_what_to_do(how):
    opt = FusedAdam(make_model().parameters())
    act = {"pickle": lambda: pickle.dumps(opt), "torch.save": lambda: torch.save(opt, io.BytesIO()),
           "copy.copy": lambda: copy.copy(opt)}[how]
    with pytest.raises(TypeError, match=r"cannot be pickled.*state_dict\(\).*deepcopy"):
        act()


# ---- sparse grads ---------------------------------------------------------------------------------
def test_a_sparse_grad_is_refused_with_the_word_sparse_and_the_param():
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    opt = FusedAdam([("embed.weight", embedding.weight)])
    embedding(torch.tensor([1, 3])).sum().backward()
    assert embedding.weight.grad.is_sparse
    before = embedding.weight.detach().clone()
    with pytest.raises(TypeError, match=r"'embed.weight' has a sparse grad.*sparse=False.*SparseAdam") as error:
        opt.step()
    assert error.value.__cause__ is None and error.value.__suppress_context__  # no DLPack frames
    assert torch.equal(embedding.weight.detach(), before)
    with pytest.raises(TypeError, match="sparse grad"):  # and again: nothing was half-done
        opt.step()
    assert torch.equal(embedding.weight.detach(), before)
    reference = torch.optim.AdamW([embedding.weight])  # torch's AdamW refuses them too
    with pytest.raises(RuntimeError, match="sparse"):
        reference.step()


# ---- which params opt.state holds ------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_state_holds_the_params_adamw_holds(device):
    """len, membership and iteration: nothing before a step, then the params that had a
    grad, as torch's AdamW (which makes a param's state at its first grad)."""
    data = batches(3)
    (model, opt), (ref_model, reference) = pair(device)
    assert len(opt.state) == len(reference.state) == 0 and not opt.state
    for step in range(3):
        train(model, opt, data[step:step + 1], without_grad=[(0, 2)] if step < 2 else [])
        train(ref_model, reference, data[step:step + 1], without_grad=[(0, 2)] if step < 2 else [])
        ours = [p in opt.state for p in model.parameters()]
        assert ours == [p in reference.state for p in ref_model.parameters()]
        assert len(opt.state) == len(reference.state) == sum(ours)
        assert list(opt.state) == [p for p, held in zip(model.parameters(), ours) if held]


def test_a_param_read_by_key_before_its_first_step_is_held_as_defaultdict_makes_it():
    model = make_model()
    opt = FusedAdam(model.parameters())
    first = next(model.parameters())
    assert opt.state.get(first) is None
    entry = opt.state[first]
    assert set(entry) == {"exp_avg", "exp_avg_sq", "step"} and len(opt.state) == 1


def test_a_load_holds_the_params_the_state_dict_gave_a_state():
    """Param 1 never had a grad: neither optimizer saved a state for it, and after a load
    into a fresh optimizer (where it had been read by key) neither holds it."""
    data = batches(2)
    (model, opt), (ref_model, reference) = pair()
    train(model, opt, data, without_grad=[(0, 1), (1, 1)])
    train(ref_model, reference, data, without_grad=[(0, 1), (1, 1)])
    held = []
    for saved, fresh in ((opt.state_dict(), FusedAdam(named(make_model()), **HYPER)),
                         (reference.state_dict(), torch.optim.AdamW(named(make_model()), **HYPER))):
        params = fresh.param_groups[0]["params"]
        fresh.state[params[1]]  # noqa: B018 (read by key: made, then dropped by the load)
        fresh.load_state_dict(saved)
        held.append([p in fresh.state for p in params])
    assert held[0] == held[1] == [True, False, True]


# ---- a live step count -----------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_step_reads_each_params_own_count_after_every_step(device):
    data = batches(4)
    (model, opt), (ref_model, reference) = pair(device)
    skipped = [(1, 1), (2, 1)]
    for step in range(4):
        train(model, opt, data[step:step + 1], without_grad=[(0, i) for s, i in skipped if s == step])
        train(ref_model, reference, data[step:step + 1], without_grad=[(0, i) for s, i in skipped if s == step])
        for p, q in zip(model.parameters(), ref_model.parameters()):
            if q in reference.state:
                assert opt.state[p]["step"].dtype == torch.float32
                assert float(opt.state[p]["step"]) == float(reference.state[q]["step"])


@pytest.mark.parametrize("device", DEVICES)
def test_assigning_step_sets_the_count_that_bias_correction_uses(device):
    """state[p]["step"] = n, in both optimizers: the next update is AdamW's from count n."""
    data = batches(4)
    (model, opt), (ref_model, reference) = pair(device)
    train(model, opt, data[:2])
    train(ref_model, reference, data[:2])
    for o, m in ((opt, model), (reference, ref_model)):
        for p in m.parameters():
            o.state[p]["step"] = torch.zeros_like(o.state[p]["step"]) if o is reference else 0
    assert all(float(opt.state[p]["step"]) == 0 for p in model.parameters())
    assert opt.native.param_steps() == [0, 0, 0]
    torch.testing.assert_close(train(model, opt, data[2:]), train(ref_model, reference, data[2:]), rtol=RTOL, atol=0)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize("value,error", [(-1, ValueError), (1.5, ValueError), ("3", ValueError),
                                         (torch.ones(2), ValueError)])
def test_a_bad_step_assignment_raises_and_changes_nothing(value, error):
    model = make_model()
    opt = FusedAdam(named(model))
    train(model, opt, batches(1))
    first = next(model.parameters())
    with pytest.raises(error, match="'0.weight' state 'step'"):
        opt.state[first]["step"] = value
    assert opt.native.param_steps() == [1, 1, 1]


def test_an_in_place_write_to_a_read_step_raises_instead_of_being_lost():
    model = make_model()
    opt = FusedAdam(model.parameters())
    train(model, opt, batches(1))
    first = next(model.parameters())
    step = opt.state[first]["step"]
    assert float(step + 1) == 2.0  # reading it is plain
    with pytest.raises(RuntimeError, match="[Ii]nplace update to inference tensor"):
        step.fill_(5.0)
    with pytest.raises(RuntimeError, match="[Ii]nplace update to inference tensor"):
        opt.state[first]["step"].add_(1)
    assert float(opt.state[first]["step"]) == 1.0 and opt.native.param_steps() == [1, 1, 1]


def test_offload_is_checked_and_kept_by_copies():
    """offload= takes None, "host" or "cpu" (CPU params: their state is host memory already,
    so the run is AdamW's as without it); anything else is refused by name; a deepcopy keeps
    it."""
    with pytest.raises(ValueError, match="offload must be one of None, 'host', 'cpu', got 'gpu'"):
        FusedAdam(make_model().parameters(), offload="gpu")
    for offload in ("host", "cpu"):
        ours, reference = make_model(), make_model()
        opt = FusedAdam(ours.parameters(), **HYPER, offload=offload)
        torch_opt = torch.optim.AdamW(reference.parameters(), **HYPER)
        train(ours, opt, batches(8))
        train(reference, torch_opt, batches(8))
        for p, q in zip(ours.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q, rtol=RTOL, atol=1e-6)
            assert opt.native.param_info(opt._entry_of[p].index).placement == "device"
        assert copy.deepcopy(opt)._options["offload"] == offload


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arrived_bytes", [1, 64 << 20])
def test_step_in_backward_gives_a_full_steps_bits_and_frees_the_grads(device, dtype, arrived_bytes):
    """step_in_backward=True steps each param in partial steps as its grad arrives (one param
    at a time with a 1-byte threshold; all at the backward's end with the default): the same
    params and states as FusedAdam's step() after backward, grads freed, step() a no-op."""
    ours, reference = make_model(dtype, device=device), make_model(dtype, device=device)
    opt = FusedAdam(ours.parameters(), **HYPER, step_in_backward=True)
    opt._ARRIVED_BYTES = arrived_bytes
    ref = FusedAdam(reference.parameters(), **HYPER)
    for x, y in batches(5):
        for model, o in ((ours, opt), (reference, ref)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(device, dtype)).float(), y.to(device)).backward()
            if o is opt:
                assert all(p.grad is None for p in model.parameters())  # stepped and freed in backward
            o.step()
    for p, q in zip(ours.parameters(), reference.parameters()):
        assert torch.equal(p, q)
        for key, value in ref.state[q].items():
            assert torch.equal(torch.as_tensor(opt.state[p][key]), torch.as_tensor(value)), key


def test_step_in_backward_refuses_clipping_and_a_loss_scale():
    with pytest.raises(ValueError, match="step_in_backward steps each param as its grad arrives"):
        FusedAdam(make_model().parameters(), step_in_backward=True, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="step_in_backward must be a bool"):
        FusedAdam(make_model().parameters(), step_in_backward="yes")
    model = make_model()
    opt = FusedAdam(model.parameters(), **HYPER, step_in_backward=True)
    x, y = batches(1)[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="before a loss scale or found_inf could be applied"):
        opt.step(grad_scale=torch.tensor(2.0))
    assert copy.deepcopy(opt)._options["step_in_backward"] is True


def test_step_in_backward_resumes_with_its_loaded_masters(tmp_path):
    """Partial steps leave the group counts at 0, so a step_in_backward optimizer resumed from
    a shard file (which keeps those counts) must not take its first step for a fresh start:
    the loaded masters stay (bf16 params are only their roundings), and the run goes on as
    the uninterrupted one."""
    def train_steps(model, opt, data):
        for x, y in data:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
            opt.step()

    data = batches(6)
    model = make_model(torch.bfloat16)
    opt = FusedAdam(model.parameters(), **HYPER, step_in_backward=True)
    train_steps(model, opt, data[:3])
    path = str(tmp_path / "rank0.safetensors")
    opt.save_shard_file(path)
    resumed_model = make_model(torch.bfloat16, seed=9)
    resumed_model.load_state_dict(model.state_dict())
    resumed = FusedAdam(resumed_model.parameters(), **HYPER, step_in_backward=True)
    resumed.load_shard_files([path])
    assert resumed.native.param_groups[0].step == 0 and max(resumed.native.param_steps()) == 3
    train_steps(model, opt, data[3:])
    train_steps(resumed_model, resumed, data[3:])
    for p, q in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["master"], resumed.state[q]["master"])
