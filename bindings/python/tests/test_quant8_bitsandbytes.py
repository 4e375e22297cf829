"""8-bit blockwise moments (moment_dtype uint8) against bitsandbytes, the independent
reference: the same code books, the codes and absmax of quantize_blockwise on the same
first moments, and a few AdamW8bit steps on the same params and grads (CPU)."""
import math

import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")
F = pytest.importorskip("bitsandbytes.functional")

import shardadam  # noqa: E402
from shardadam.torch import FusedAdam  # noqa: E402

BLOCK = 256


def checkpoint_values(codes, absmax, signed):
    """What checkpoints hold for an 8-bit moment (docs/precision.md): bitsandbytes'
    dequantize_blockwise of its codes and absmax, except that in a signed block with no code
    255 the first element of code 0 holds -absmax."""
    n = codes.numel()
    values = F.dequantize_blockwise(codes, absmax=absmax, code=F.create_dynamic_map(signed=signed),
                                    blocksize=BLOCK).reshape(-1).clone()
    if signed:
        for b in range(math.ceil(n / BLOCK)):
            block = codes[b * BLOCK:(b + 1) * BLOCK]
            if float(absmax[b]) > 0 and not bool((block == 255).any()) and bool((block == 0).any()):
                values[b * BLOCK + int((block == 0).nonzero()[0])] = -absmax[b]
    return values


def fused(params, **kw):
    return FusedAdam(params, moment_dtype=torch.uint8, min_8bit_size=0, num_threads=1, **kw)


def test_the_code_books_are_bitsandbytes_dynamic_maps():
    # The library's tables, read back through a step: a block whose single element is the
    # absmax decodes its code as map[code] * absmax, and all of its codes index that map.
    for signed in (True, False):
        ref = F.create_dynamic_map(signed=signed)
        assert ref.numel() == 256 and bool((ref[1:] >= ref[:-1]).all())
    p = torch.zeros(4096)
    opt = fused([p], lr=1e-3)
    p.grad = torch.linspace(-1, 1, 4096)
    opt.step()
    codes = opt.state[p]["exp_avg"].reshape(-1).long()
    absmax = opt.state[p]["exp_avg_absmax"]
    decoded = F.create_dynamic_map(signed=True)[codes].reshape(-1, BLOCK) * absmax.view(-1, 1)
    m = (p.grad * (1 - 0.9)).reshape(-1, BLOCK)
    # One quantization step at most (the map's widest gap is below 0.08 of the absmax).
    assert float((decoded - m).abs().max()) <= 0.08 * float(absmax.max())


@pytest.mark.parametrize("n", [4096, 3 * BLOCK + 77])
def test_first_step_codes_and_absmax_equal_quantize_blockwise(n):
    torch.manual_seed(0)
    p = torch.randn(n)
    g = torch.randn(n) * 0.01
    opt = fused([p], lr=1e-3, betas=(0.9, 0.999))
    p.grad = g.clone()
    opt.step()
    # From zero moments, step 1 sets exp_avg = (1 - beta1) g and exp_avg_sq = (1 - beta2) g g
    # (in float32, in that order).
    m = g * (1 - 0.9)
    v = (g * (1 - 0.999)) * g
    for key, value, signed in (("exp_avg", m, True), ("exp_avg_sq", v, False)):
        ref_codes, ref_state = F.quantize_blockwise(value, code=F.create_dynamic_map(signed=signed),
                                                    blocksize=BLOCK)
        codes = opt.state[p][key].reshape(-1).to(torch.int32)
        absmax = opt.state[p][key + "_absmax"]
        assert absmax.shape == ref_state.absmax.shape == (math.ceil(n / BLOCK),)
        torch.testing.assert_close(absmax, ref_state.absmax, rtol=0, atol=0)
        ref_codes = ref_codes.reshape(-1).long()
        # shardadam takes the nearest map entry (ties: the lower). bitsandbytes' CPU
        # quantizer searches the map approximately: now and then it takes another entry,
        # nearly always a neighbour, for the smallest values of the unsigned map up to a few
        # entries away (measured at this seed: 9 of 4096 exp_avg codes, 133 of 4096
        # exp_avg_sq codes, 3.8x the nearest error at worst). So: codes mean the same value
        # but where bitsandbytes' is not a nearest one, and ours always is one, in float64.
        book = F.create_dynamic_map(signed=signed).double()
        scaled = value.double().reshape(-1) / absmax.double().repeat_interleave(BLOCK)[:n]
        ours_err = (book[codes.long()] - scaled).abs()
        ref_err = (book[ref_codes] - scaled).abs()
        assert bool((ours_err <= ref_err + 1e-7).all()), key
        assert float((book[codes.long()] != book[ref_codes]).float().mean()) <= 0.05, key


def test_steps_track_bitsandbytes_adamw8bit():
    torch.manual_seed(1)
    shapes = [(64, 128), (4096,), (3, 4096)]  # all >= bitsandbytes' min_8bit_size (4096)
    ours = [torch.randn(s) for s in shapes]
    theirs = [t.clone() for t in ours]
    f32 = [t.clone() for t in ours]  # float32 moments: how far the quantization alone moves
    lr, steps = 1e-3, 10
    kw = dict(lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    opt = fused(ours, **kw)
    ref = bnb.optim.AdamW8bit(theirs, **kw)
    opt32 = FusedAdam(f32, num_threads=1, **kw)
    for _ in range(steps):
        grads = [torch.randn(s) * 0.1 for s in shapes]
        for a, b, c, g in zip(ours, theirs, f32, grads):
            a.grad, b.grad, c.grad = g.clone(), g.clone(), g.clone()
        opt.step()
        ref.step()
        opt32.step()
    book = F.create_dynamic_map(signed=True)
    for a, b, c in zip(ours, theirs, f32):
        # The two round a few intermediate values differently (bitsandbytes divides by
        # sqrt(1 - beta2^t), shardadam multiplies by its inverse; their quantizers differ
        # as the test above shows), so some codes land on a neighbour and the trajectories
        # drift apart slowly, far less than float32 moments drift from 8-bit ones.
        # Measured: 0.02-0.03 of float32's mean difference, 0.01-0.02 lr*steps worst.
        mean, mean32 = float((a - b).abs().mean()), float((c - b).abs().mean())
        assert mean <= 0.1 * mean32, (mean, mean32)
        assert float((a - b).abs().max()) <= 0.05 * lr * steps
        absmax = opt.state[a]["exp_avg_absmax"].view(-1, 1)
        ref_absmax = ref.state[b]["absmax1"].view(-1, 1)
        m = book[opt.state[a]["exp_avg"].reshape(-1).long()].reshape(-1, BLOCK) * absmax
        ref_m = book[ref.state[b]["state1"].reshape(-1).long()].reshape(-1, BLOCK) * ref_absmax
        assert float(((m - ref_m).abs() / ref_absmax).max()) <= 0.1  # measured <= 0.03


@pytest.mark.parametrize("moment_dtype", [torch.uint8, torch.float8_e4m3fn])
def test_params_under_min_8bit_size_keep_float32_moments_as_bitsandbytes_does(moment_dtype):
    shapes = [(100,), (4095,), (4096,), (64, 64), (63, 65), (3, 4096)]
    for kw in ({}, {"min_8bit_size": 0}, {"min_8bit_size": 5000}):
        ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
        theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
        opt = FusedAdam(ours, lr=1e-3, moment_dtype=moment_dtype, num_threads=1, **kw)
        ref = bnb.optim.AdamW8bit(theirs, lr=1e-3, **kw)  # its default min_8bit_size: 4096
        for a, b in zip(ours, theirs):
            a.grad = b.grad = torch.randn(a.shape)
        opt.step()
        ref.step()
        block_name = "uint8" if moment_dtype == torch.uint8 else "float8_e4m3fn"
        for index, (a, b) in enumerate(zip(ours, theirs)):
            blockwise = ref.state[b]["state1"].dtype == torch.uint8  # bitsandbytes' choice
            assert ("exp_avg_absmax" in opt.state[a]) == blockwise, (a.shape, kw)
            expected = block_name if blockwise else "float32"
            assert opt.native.param_info(index).moment_dtype == expected, (a.shape, kw)
    with pytest.raises(ValueError, match="min_8bit_size"):
        FusedAdam([torch.nn.Parameter(torch.zeros(3))], moment_dtype=torch.uint8, min_8bit_size=-1)


def test_8bit_moments_are_a_quarter_of_float32_moments():
    p8, p32 = torch.zeros(1 << 16), torch.zeros(1 << 16)
    o8, o32 = fused([p8]), FusedAdam([p32], num_threads=1)
    for o, p in ((o8, p8), (o32, p32)):
        p.grad = torch.ones_like(p)
        o.step()
    bytes8 = sum(t.numel() * t.element_size() for k, t in o8.state[p8].items() if torch.is_tensor(t)
                 and k != "step")
    bytes32 = sum(t.numel() * t.element_size() for k, t in o32.state[p32].items() if torch.is_tensor(t)
                  and k != "step")
    # 1 byte per element per moment plus a float32 absmax per 256 elements.
    assert bytes8 == 2 * (p8.numel() + 4 * p8.numel() // BLOCK)
    assert bytes8 / p8.numel() <= 2.05
    assert bytes32 == 8 * p32.numel()


def test_shard_files_hold_the_codes_and_absmax_that_load_as_bitsandbytes_decodes_them(tmp_path):
    """A shard file read by the real safetensors package holds each 8-bit moment's uint8
    codes and float32 absmax as the optimizer keeps them; loaded into float32 moments they
    are bitsandbytes' dequantize_blockwise of those (but for the one element per signed block
    that docs/precision.md says holds -absmax), and a load into 8-bit moments restores both."""
    st = pytest.importorskip("safetensors.torch")
    torch.manual_seed(2)
    n = 3 * BLOCK + 40
    p = torch.randn(n)
    opt = fused([p], lr=1e-3)
    for _ in range(3):
        p.grad = torch.randn(n) * 0.01
        opt.step()
    path = tmp_path / "rank0.safetensors"
    opt.save_shard_file(path)
    saved = st.load_file(str(path))
    for key in ("exp_avg", "exp_avg_sq"):
        codes, absmax = saved[f"params.0/{key}"], saved[f"params.0/{key}_absmax"]
        assert codes.dtype == torch.uint8 and codes.shape == (n,)
        assert absmax.dtype == torch.float32 and absmax.shape == (math.ceil(n / BLOCK),)
        assert torch.equal(codes, opt.state[p][key].reshape(-1)), key
        assert torch.equal(absmax, opt.state[p][key + "_absmax"]), key

    wide = torch.randn(n)
    f32 = FusedAdam([wide], lr=1e-3, num_threads=1)  # float32 moments
    f32.load_shard_files([path])
    for key, signed in (("exp_avg", True), ("exp_avg_sq", False)):
        want = checkpoint_values(saved[f"params.0/{key}"], saved[f"params.0/{key}_absmax"], signed)
        torch.testing.assert_close(f32.state[wide][key], want, rtol=0, atol=0)

    q = p.clone()
    again = fused([q], lr=1e-3)
    again.load_shard_files([path])
    for key in ("exp_avg", "exp_avg_absmax", "exp_avg_sq", "exp_avg_sq_absmax"):
        assert torch.equal(again.state[q][key], opt.state[p][key]), key


def test_state_dicts_hold_float32_moments_that_adamw_reads_and_8bit_loads_back():
    """state_dict() holds an 8-bit moment as the float32 values its codes stand for (what
    bitsandbytes decodes, with the shard files' rule for a negative absmax), no absmax; a
    FusedAdam(uint8) loads it back bit for bit, torch's AdamW takes it as its moments, and
    an AdamW state dict loads into 8-bit moments quantized by the local blocks."""
    torch.manual_seed(3)
    n = 3 * BLOCK + 40
    p = torch.nn.Parameter(torch.randn(n))
    opt = fused([p], lr=1e-3)
    for _ in range(3):
        p.grad = torch.randn(n) * 0.01
        opt.step()
    sd = opt.state_dict()
    state = sd["state"][0]
    assert sorted(state) == ["exp_avg", "exp_avg_sq", "step"]
    for key, signed in (("exp_avg", True), ("exp_avg_sq", False)):
        codes, absmax = opt.state[p][key].reshape(-1), opt.state[p][key + "_absmax"]
        want = checkpoint_values(codes, absmax, signed)
        assert state[key].dtype == torch.float32
        torch.testing.assert_close(state[key], want, rtol=0, atol=0)
    assert opt.state[p]["exp_avg"].dtype == torch.uint8  # the optimizer's own state is untouched

    q = torch.nn.Parameter(p.detach().clone())
    again = fused([q], lr=1e-3)
    again.load_state_dict(sd)
    for key in ("exp_avg", "exp_avg_absmax", "exp_avg_sq", "exp_avg_sq_absmax"):
        assert torch.equal(again.state[q][key], opt.state[p][key]), key

    adamw = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone())], lr=1e-3)
    adamw.load_state_dict(sd)
    assert torch.equal(adamw.state_dict()["state"][0]["exp_avg"], state["exp_avg"])

    # AdamW's float32 moments into 8-bit ones: each block's absmax is its largest |m|, each
    # code a nearest entry to m / absmax (in float64).
    ref = torch.nn.Parameter(torch.randn(n))
    torch_opt = torch.optim.AdamW([ref], lr=1e-3)
    ref.grad = torch.randn(n)
    torch_opt.step()
    r = torch.nn.Parameter(ref.detach().clone())
    eight = fused([r], lr=1e-3)
    eight.load_state_dict(torch_opt.state_dict())
    m = torch_opt.state[ref]["exp_avg"].double()
    absmax = eight.state[r]["exp_avg_absmax"].double()
    blocks = m.reshape(-1)
    largest = torch.stack([blocks[b * BLOCK:(b + 1) * BLOCK].abs().max() for b in range(math.ceil(n / BLOCK))])
    assert torch.equal(absmax, largest)
    book = F.create_dynamic_map(signed=True).double()
    scaled = blocks / absmax.repeat_interleave(BLOCK)[:n]
    err = (book[eight.state[r]["exp_avg"].reshape(-1).long()] - scaled).abs()
    nearest = (book.view(1, -1) - scaled.view(-1, 1)).abs().min(dim=1).values
    assert bool((err <= nearest + 1e-6).all())
