"""FusedAdam over torch float8 params (``fp8={param: Fp8(scaling, scale)}``), against
references outside the library: torch's own float8 casts (clamped first: torch's casts do
not saturate) and scale rules written here from shardadam.h's sa_param_scaling, and a
FusedAdam over a float32 param stepped on the same grads for the master; then
state_dict() / load_state_dict() into a fresh optimizer (the param cast again from the
loaded master) and weights loaded after the optimizer was built (the master follows them).
"""
import pytest

torch = pytest.importorskip("torch")

import shardadam  # noqa: E402
from shardadam.torch import Fp8, FusedAdam  # noqa: E402

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05, num_threads=1)
FORMATS = {torch.float8_e4m3fn: (448.0, 8), torch.float8_e5m2: (57344.0, 15)}
BLOCKS = {"delayed": 0, "mxfp8": 32, "block128": 128}
CASES = [(dtype, scaling) for dtype in FORMATS for scaling in BLOCKS]
F32_MAX = torch.finfo(torch.float32).max


def fp8(x, dtype):
    largest, _ = FORMATS[dtype]
    return x.to(torch.float32).clamp(-largest, largest).to(dtype)


def new_scale(scaling, shape, generator):
    if scaling == "delayed":
        return torch.tensor([0.75])
    n = shape[:-1] + (shape[-1] // BLOCKS[scaling],)
    if scaling == "mxfp8":
        return torch.randint(120, 134, n, generator=generator, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return torch.rand(n, generator=generator) * 2 + 0.01


def start_of(param, scaling, scale):
    """The master add_param starts from: the value times the scale's inverse."""
    v = param.to(torch.float32)
    if scaling == "delayed":
        return v / scale[0]
    block = BLOCKS[scaling]
    factor = (torch.exp2(scale.view(torch.uint8).to(torch.float32) - 127) if scaling == "mxfp8" else scale)
    return (v.reshape(-1, block) * factor.reshape(-1, 1)).reshape(v.shape)


def cast_of(master, dtype, scaling, delayed_scale=None):
    """(param, scale) the rule gives for the master (scale: e8m0 codes, float32 scale_inv)."""
    largest, emax = FORMATS[dtype]
    if scaling == "delayed":
        return fp8(master * delayed_scale, dtype), None
    block = BLOCKS[scaling]
    rows = master.reshape(-1, block)
    amax = rows.abs().amax(dim=1)
    if scaling == "mxfp8":
        e = torch.frexp(amax).exponent.to(torch.int64) - 1 - emax  # floor(log2 amax) - emax
        e = torch.where(amax == 0, torch.full_like(e, -127), e.clamp(-127, 127))
        param = fp8(rows * torch.ldexp(torch.ones_like(amax), -e).reshape(-1, 1), dtype).reshape(master.shape)
        return param, (e + 127).to(torch.uint8).reshape(master.shape[:-1] + (-1,))
    s = torch.tensor(largest, dtype=torch.float32) / torch.where(amax == 0, torch.ones_like(amax), amax)
    s = torch.where(amax == 0, torch.ones_like(s), torch.where(torch.isinf(s), torch.full_like(s, F32_MAX), s))
    param = fp8(rows * s.reshape(-1, 1), dtype).reshape(master.shape)
    return param, (1 / s).reshape(master.shape[:-1] + (-1,))


def bits(t):
    return t.contiguous().view(torch.uint8)


def fp8_model(dtype, scaling, generator, shape=(4, 256)):
    param = torch.nn.Parameter(fp8(torch.randn(shape, generator=generator) * 30, dtype), requires_grad=True)
    return param, new_scale(scaling, shape, generator)


def check_cast(param, scale, master, dtype, scaling, delayed_scale):
    want, want_scale = cast_of(master, dtype, scaling, delayed_scale)
    assert torch.equal(bits(param.detach()), bits(want))
    if scaling == "mxfp8":
        assert torch.equal(scale.view(torch.uint8), want_scale)
    elif scaling == "block128":
        assert torch.equal(scale.view(torch.int32), want_scale.contiguous().view(torch.int32))


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device: the GPU runs were not made"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,scaling", CASES)
def test_fused_adam_steps_the_master_as_a_float32_param_and_casts_the_float8_param(dtype, scaling, device):
    g = torch.Generator().manual_seed(3)
    param, scale = fp8_model(dtype, scaling, g)
    param, scale = torch.nn.Parameter(param.detach().to(device)), scale.to(device)
    amax = torch.zeros(1, device=device) if scaling == "delayed" else None
    twin = torch.nn.Parameter(start_of(param.detach(), scaling, scale).clone())
    opt = FusedAdam([param], fp8={param: Fp8(scaling, scale, amax)}, **HYPER)
    ref = FusedAdam([twin], **HYPER)
    assert param.grad_dtype == torch.float32  # so that torch takes float32 grads
    for _ in range(3):
        grad = (torch.randn(param.shape, generator=g) * 3).to(device)
        param.grad, twin.grad = grad.clone(), grad.clone()
        opt.step()
        ref.step()
        master = opt.state[param]["master"]
        assert master.dtype == torch.float32
        assert torch.equal(master.view(torch.int32), twin.detach().view(torch.int32))
        check_cast(param, scale, master, dtype, scaling, 0.75)
        if amax is not None:
            assert amax.item() == master.abs().max().item()
    info = opt.native.param_info(0)
    assert (info.scaling, info.grad_dtype) == (scaling, "float32")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(FORMATS))
def test_mxfp8_params_and_scales_are_torchaos_to_mx_of_the_master(dtype, device):
    """torchao's MX cast (``to_mx``, its default FLOOR scale rule: 2^(floor(log2 amax) -
    emax), a clamped cast) of each stepped master gives the param's codes and e8m0 scales
    bit for bit. Six params of magnitudes 2^-90 to 2^60, each in a group whose lr is
    scaled alike, so that the scales range widely at every step. Blocks with an amax below
    2^-118 are left out: their e8m0 code is 0 (2^-127) in both, but torchao then divides by
    2^-126, the smallest normal float (its comment: triton's subnormals)."""
    to_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor",
                                reason="needs torchao (pip install torchao)").to_mx
    g = torch.Generator().manual_seed(17)
    exponents = (-90, -20, -1, 0, 7, 60)
    shape, magnitudes = (2, 128), [2.0 ** e for e in exponents]
    params, scales = [], []
    for e in exponents:  # codes of about 2^5, an e8m0 scale of 2^(e - 5): masters of about 2^e
        params.append(torch.nn.Parameter(fp8(torch.randn(shape, generator=g) * 32, dtype).to(device)))
        scales.append(torch.full((2, 4), 127 + e - 5, dtype=torch.uint8, device=device).view(torch.float8_e8m0fnu))
    hyper = {k: v for k, v in HYPER.items() if k != "lr"}
    groups = [{"params": [p], "lr": 1e-2 * m} for p, m in zip(params, magnitudes)]
    opt = FusedAdam(groups, fp8={p: Fp8("mxfp8", s) for p, s in zip(params, scales)}, **hyper)
    for _ in range(3):
        for p, m in zip(params, magnitudes):
            p.grad = (torch.randn(shape, generator=g) * m).to(device)
        opt.step()
        codes = set()
        for p, scale in zip(params, scales):
            master = opt.state[p]["master"]
            assert master.abs().reshape(-1, 32).amax(dim=1).min().item() > 2.0 ** -118
            want_scale, want = to_mx(master.contiguous(), dtype, 32)
            assert torch.equal(scale.view(torch.uint8), want_scale.view(torch.uint8))
            assert torch.equal(bits(p.detach()), bits(want))
            codes |= set(scale.view(torch.uint8).flatten().tolist())
        assert min(codes) < 127 - 80 and max(codes) > 127 + 40  # the scales do range


@pytest.mark.parametrize("dtype,scaling", [(torch.float8_e4m3fn, "mxfp8"), (torch.float8_e5m2, "block128"),
                                           (torch.float8_e4m3fn, "delayed")])
def test_a_state_dict_loads_into_a_fresh_optimizer_and_the_param_is_cast_from_its_master(dtype, scaling):
    g = torch.Generator().manual_seed(5)
    param, scale = fp8_model(dtype, scaling, g)
    opt = FusedAdam([param], fp8={param: Fp8(scaling, scale)}, **HYPER)
    for _ in range(2):
        param.grad = torch.randn(param.shape, generator=g)
        opt.step()
    saved = opt.state_dict()
    master = saved["state"][0]["master"].clone()
    # A fresh model: zero weights and other scales, loaded from the optimizer's state alone.
    fresh = torch.nn.Parameter(torch.zeros(param.shape, dtype=dtype))
    fresh_scale = new_scale(scaling, tuple(param.shape), g) if scaling != "delayed" else torch.tensor([0.75])
    other = FusedAdam([fresh], fp8={fresh: Fp8(scaling, fresh_scale)}, **HYPER)
    other.load_state_dict(saved)
    assert torch.equal(other.state[fresh]["master"].view(torch.int32), master.view(torch.int32))
    assert torch.equal(bits(fresh.detach()), bits(param.detach()))  # the same cast of the same master
    check_cast(fresh, fresh_scale, master, dtype, scaling, 0.75)
    assert other.native.param_steps() == [2]


def test_weights_loaded_after_the_optimizer_was_built_are_what_the_first_step_starts_from():
    g = torch.Generator().manual_seed(9)
    dtype, scaling = torch.float8_e4m3fn, "mxfp8"
    param, scale = fp8_model(dtype, scaling, g)
    opt = FusedAdam([param], fp8={param: Fp8(scaling, scale)}, **HYPER)
    with torch.no_grad():  # a model checkpoint loaded now
        param.copy_(fp8(torch.randn(param.shape, generator=g) * 5, dtype))
    twin = torch.nn.Parameter(start_of(param.detach(), scaling, scale).clone())
    ref = FusedAdam([twin], **HYPER)
    grad = torch.randn(param.shape, generator=g)
    param.grad, twin.grad = grad.clone(), grad.clone()
    opt.step()
    ref.step()
    assert torch.equal(opt.state[param]["master"].view(torch.int32), twin.detach().view(torch.int32))


def test_an_fp8_param_without_its_scaling_is_refused_saying_how_to_give_it():
    param = torch.nn.Parameter(torch.zeros(4, 64, dtype=torch.float8_e4m3fn))
    with pytest.raises(ValueError, match=r"fp8=\{param: shardadam.torch.Fp8\(scaling, scale\)\}"):
        FusedAdam([param])
    with pytest.raises(shardadam.InvalidArgument, match="options.scale is float32; it must be float8_e8m0fnu"):
        FusedAdam([param], fp8={param: Fp8("mxfp8", torch.zeros(4, 2))})
    plain = torch.nn.Parameter(torch.zeros(4, 64))
    with pytest.raises(ValueError, match="fp8 params are torch.float8_e4m3fn or torch.float8_e5m2"):
        FusedAdam([plain], fp8={plain: Fp8("delayed", torch.ones(1))})


def test_torch_distributed_checkpoint_saves_and_loads_an_fp8_optimizer_state(tmp_path):
    """DCP (one process, no_dist) saves FusedAdam.state_dict() of an fp8 param and loads it
    into a fresh FusedAdam's state dict: the master bit for bit, the param cast from it."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    g = torch.Generator().manual_seed(13)
    dtype, scaling = torch.float8_e5m2, "mxfp8"
    param, scale = fp8_model(dtype, scaling, g)
    opt = FusedAdam([param], fp8={param: Fp8(scaling, scale)}, **HYPER)
    for _ in range(2):
        param.grad = torch.randn(param.shape, generator=g)
        opt.step()
    dcp.save({"optim": opt.state_dict()}, checkpoint_id=str(tmp_path), no_dist=True)
    fresh = torch.nn.Parameter(torch.zeros(param.shape, dtype=dtype))
    fresh_scale = new_scale(scaling, tuple(param.shape), g)
    other = FusedAdam([fresh], fp8={fresh: Fp8(scaling, fresh_scale)}, **HYPER)
    fresh.grad = torch.zeros(param.shape)
    other.step()  # states exist and differ from the saved ones
    target = {"optim": other.state_dict()}
    dcp.load(target, checkpoint_id=str(tmp_path), no_dist=True)
    other.load_state_dict(target["optim"])
    master = opt.state[param]["master"]
    assert torch.equal(other.state[fresh]["master"].view(torch.int32), master.view(torch.int32))
    assert torch.equal(bits(fresh.detach()), bits(param.detach()))
    assert torch.equal(fresh_scale.view(torch.uint8), scale.view(torch.uint8))
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(other.state[fresh][key], opt.state[param][key])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(FORMATS))
@pytest.mark.parametrize("scaling,margin", [("current", 0), ("current_pow2", 0), ("current", 2),
                                            ("current_pow2", 5)])
def test_fused_adam_current_scaling_writes_scale_and_inverse_from_the_tensors_amax(dtype, scaling, margin,
                                                                                   device):
    g = torch.Generator().manual_seed(11)
    largest, _ = FORMATS[dtype]
    param = torch.nn.Parameter(fp8(torch.randn((4, 96), generator=g) * 30, dtype).to(device), requires_grad=True)
    # the codes above stand for value * 0.25
    scale, amax = torch.tensor([4.0, 0.25], device=device), torch.zeros(1, device=device)
    twin = torch.nn.Parameter(param.detach().to(torch.float32) * 0.25)
    opt = FusedAdam([param], fp8={param: Fp8(scaling, scale, amax, margin=margin)}, **HYPER)
    ref = FusedAdam([twin], **HYPER)
    assert opt.native.param_info(0).margin == margin
    for k in range(3):
        grad = (torch.randn(param.shape, generator=g) * (1e3 if k == 1 else 1)).to(device)
        param.grad, twin.grad = grad.clone(), grad.clone()
        opt.step()
        ref.step()
        master = opt.state[param]["master"]
        assert torch.equal(master.view(torch.int32), twin.detach().view(torch.int32))
        # scale = fp8_max / amax / 2^margin in float32; pow2: 2^floor(log2 scale), by torch's frexp
        want = torch.ldexp(torch.tensor(largest, dtype=torch.float32, device=device) / master.abs().max(),
                           torch.tensor(-margin, device=device))
        if scaling == "current_pow2":
            want = torch.ldexp(torch.ones((), device=device), torch.frexp(want).exponent - 1)
        assert amax.item() == master.abs().max().item()
        assert scale[0].item() == want.item() and scale[1].item() == (1 / want).item()
        assert torch.equal(bits(param.detach()), bits(fp8(master * want, dtype)))


@pytest.mark.parametrize("scaling", ["current", "current_pow2"])
def test_sharded_current_scaling_gives_every_rank_the_whole_tensors_scale(scaling):
    """fp8_current_ranks.py: 3 gloo processes, float8 DTensor params Shard(0) (an empty shard
    on one rank), FusedAdam attaching its communicator for them; every rank's scale, amax and
    codes against torch arithmetic on a float32 twin of the whole tensors."""
    import os
    import subprocess
    import sys

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs torch.distributed with gloo")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fp8_current_ranks.py")
    result = subprocess.run([sys.executable, script, "--scaling", scaling], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert result.stdout.count("PASS rank") == 3, result.stdout
