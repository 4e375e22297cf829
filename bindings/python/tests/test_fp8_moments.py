"""float8 e4m3fn moments (FusedAdam(moment_dtype=torch.float8_e4m3fn)): torchao's AdamWFp8
scheme, checked against independent references on the same input: torch's own float8 cast
and ml_dtypes' for the codes of a first step (scale = max(absmax, 1e-12) / 448 per block of
256, code = float8(x / scale)); shard files holding the codes and absmax (read by the
safetensors package) and the state dict (float32 values) loading back bit for bit, crossing
to float32 moments, and resharding onto other blocks within one float8 step."""
import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from shardadam.torch import FusedAdam  # noqa: E402

BLOCK = 256
F8 = torch.float8_e4m3fn


def first_step(n, seed=0, **kwargs):
    g = torch.Generator().manual_seed(seed)
    param = torch.nn.Parameter(torch.randn(n, generator=g))
    grad = torch.randn(n, generator=g) * 0.1
    opt = FusedAdam([param], lr=1e-2, moment_dtype=F8, min_8bit_size=0, num_threads=1, **kwargs)
    param.grad = grad
    opt.step()
    return opt, param, grad


def reference_codes(x):
    """torchao's quantize_fp8 on x (float32), by blocks from the first: (codes, absmax)."""
    codes, absmax = [], []
    for start in range(0, x.numel(), BLOCK):
        block = x[start:start + BLOCK]
        a = block.abs().max()
        scale = a.clamp(min=1e-12) / 448.0
        codes.append((block / scale).to(F8))
        absmax.append(a)
    return torch.cat(codes), torch.stack(absmax)


@pytest.mark.parametrize("n", [1, 300, 4096 + 17])
def test_a_first_step_codes_exp_avg_and_exp_avg_sq_as_torchs_float8_cast(n):
    opt, param, grad = first_step(n)
    beta1, beta2 = opt.param_groups[0]["betas"]
    # From zero moments: exp_avg = (1 - beta1) g, exp_avg_sq = ((1 - beta2) g) g, in float32.
    m = torch.tensor(1 - beta1, dtype=torch.float32) * grad
    v = (torch.tensor(1 - beta2, dtype=torch.float32) * grad) * grad
    state = opt.state[param]
    for key, x in (("exp_avg", m), ("exp_avg_sq", v)):
        codes, absmax = reference_codes(x)
        assert state[key].dtype == F8
        assert torch.equal(state[key].view(torch.uint8), codes.view(torch.uint8)), key
        assert torch.equal(state[key + "_absmax"], absmax), key


def test_torchs_float8_cast_is_ml_dtypes_on_these_values():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(100000, generator=g) * 100
    x = torch.cat([x, torch.tensor([448.0, -448.0, 463.9, 0.0, -0.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10])])
    ours = x.to(F8).view(torch.uint8).numpy()
    theirs = x.numpy().astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(ours, theirs)


def test_the_state_dict_loads_back_bit_for_bit_and_into_float32_moments():
    opt, param, _ = first_step(1000, seed=2)
    saved = opt.state_dict()
    assert saved["state"][0]["exp_avg"].dtype == torch.float32  # values, not codes
    assert "exp_avg_absmax" not in saved["state"][0]
    twin = torch.nn.Parameter(param.detach().clone())
    again = FusedAdam([twin], lr=1e-2, moment_dtype=F8, min_8bit_size=0, num_threads=1)
    again.load_state_dict(saved)
    for key, value in opt.state[param].items():
        got = again.state[twin][key]
        if value.dtype == F8:
            value, got = value.view(torch.uint8), got.view(torch.uint8)
        assert torch.equal(got, value), key
    wide = torch.nn.Parameter(param.detach().clone())
    f32 = FusedAdam([wide], lr=1e-2, num_threads=1)
    f32.load_state_dict(saved)
    for key in ("exp_avg", "exp_avg_sq"):
        decoded = saved["state"][0][key]
        assert torch.equal(f32.state[wide][key], decoded), key
        # What the codes stand for: float8 value * scale, the absmax's element aside.
        codes = opt.state[param][key].to(torch.float32)
        scale = (opt.state[param][key + "_absmax"].clamp(min=1e-12) / 448.0).repeat_interleave(BLOCK)[:1000]
        close = (codes * scale - decoded).abs() <= scale * 2.0 ** -20 + decoded.abs() * 2.0 ** -23
        assert close.float().mean() > 0.99, key


def file_values(codes, absmax):
    """What docs/precision.md says float8 codes and their absmax stand for: float8 value * scale,
    scale = max(absmax, 1e-12) / 448 (float32), except that the elements of a block's
    largest code magnitude hold +-absmax, the value they were quantized from."""
    n = codes.numel()
    scale = (absmax.clamp(min=1e-12) / 448.0).repeat_interleave(BLOCK)[:n]
    values = codes.to(torch.float32) * scale
    magnitude = codes.view(torch.uint8).to(torch.int32) & 0x7F
    for b, start in enumerate(range(0, n, BLOCK)):
        block = magnitude[start:start + BLOCK]
        top = block == block.max()
        sign = torch.where(codes[start:start + BLOCK].to(torch.float32) < 0, -1.0, 1.0)
        values[start:start + BLOCK][top] = (sign * absmax[b])[top]
    return values


def test_shard_files_hold_float8_codes_and_absmax_that_load_as_their_values(tmp_path):
    """The real safetensors package (its torch face) reads a float8 moment from a shard file
    as float8_e4m3fn codes and a float32 absmax per block, the optimizer's own; a load into
    float32 moments gives file_values of them, one into float8 moments the same bits."""
    st = pytest.importorskip("safetensors.torch")
    opt, param, _ = first_step(1000, seed=4)
    path = tmp_path / "rank0.safetensors"
    opt.save_shard_file(path)
    saved = st.load_file(str(path))
    for key in ("exp_avg", "exp_avg_sq"):
        codes, absmax = saved[f"params.0/{key}"], saved[f"params.0/{key}_absmax"]
        assert codes.dtype == F8 and codes.shape == (1000,)
        assert absmax.dtype == torch.float32 and absmax.shape == (4,)
        assert torch.equal(codes.view(torch.uint8), opt.state[param][key].view(torch.uint8)), key
        assert torch.equal(absmax, opt.state[param][key + "_absmax"]), key
    wide = torch.nn.Parameter(param.detach().clone())
    f32 = FusedAdam([wide], lr=1e-2, num_threads=1)
    f32.load_shard_files([path])
    for key in ("exp_avg", "exp_avg_sq"):
        want = file_values(saved[f"params.0/{key}"], saved[f"params.0/{key}_absmax"])
        assert torch.equal(f32.state[wide][key], want), key
    twin = torch.nn.Parameter(param.detach().clone())
    again = FusedAdam([twin], lr=1e-2, moment_dtype=F8, min_8bit_size=0, num_threads=1)
    again.load_shard_files([path])
    for key in ("exp_avg", "exp_avg_absmax", "exp_avg_sq", "exp_avg_sq_absmax"):
        got, value = again.state[twin][key], opt.state[param][key]
        if value.dtype == F8:
            value, got = value.view(torch.uint8), got.view(torch.uint8)
        assert torch.equal(got, value), key


def test_values_requantized_by_other_blocks_are_within_one_float8_step():
    opt, param, _ = first_step(1000, seed=3)
    values = opt.state_dict()["state"][0]["exp_avg"]
    # Another layout's blocks: the same values from element 100 on.
    shifted = torch.nn.Parameter(param.detach()[100:].clone())
    other = FusedAdam([shifted], lr=1e-2, moment_dtype=F8, min_8bit_size=0, num_threads=1)
    shifted.grad = torch.zeros_like(shifted)
    other.step()  # allocates the states (zero grads: moments stay zero)
    saved = other.state_dict()
    saved["state"][0]["exp_avg"] = values[100:].clone()
    saved["state"][0]["exp_avg_sq"] = opt.state_dict()["state"][0]["exp_avg_sq"][100:].clone()
    other.load_state_dict(saved)
    got = other.state_dict()["state"][0]["exp_avg"]
    absmax = other.state[shifted]["exp_avg_absmax"].repeat_interleave(BLOCK)[:900]
    scale = absmax.clamp(min=1e-12) / 448.0
    # Half a float8 step: 1/16 of the value (normal) or 2^-10 of the scale (subnormal).
    bound = torch.maximum(values[100:].abs() / 16, scale * 2.0 ** -10) * 1.0001
    assert bool(((got - values[100:]).abs() <= bound).all())
