"""FusedAdam(offload="host" | "cpu"): state in pinned host memory, stepped by the GPU through
a device ring ("host") or by the host's threads on the param and grad brought down ("cpu").

Either way every param and state is bit for bit what FusedAdam without offload computes (the
kernels are bitwise the same on both sides, and the coefficients are the device's); the
offloaded state takes no device memory. Needs torch and a CUDA device (skipped otherwise). Run from the repository root after
`pip install ./bindings/python`:

    python -m pytest -q bindings/python/tests/gpu/test_torch_offload.py
"""
import pytest

torch = pytest.importorskip("torch")
from shardadam.torch import FusedAdam  # noqa: E402

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

# The placement (ParamInfo.placement) each offload= gives a CUDA param.
PLACEMENT = {"host": "host", "cpu": "host_cpu_step"}

HYPER = dict(lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)

# (param dtype, FusedAdam options): float32; bf16 with an fp32 master; bf16 with a remainder
# and bfloat16 moments; 8-bit and float8 block moments (min_8bit_size=0: every param).
VARIANTS = [
    (torch.float32, {}),
    (torch.bfloat16, {}),
    (torch.bfloat16, dict(master="remainder", moment_dtype=torch.bfloat16)),
    (torch.float32, dict(moment_dtype=torch.uint8, min_8bit_size=0)),
    (torch.bfloat16, dict(moment_dtype=torch.float8_e4m3fn, min_8bit_size=0, amsgrad=True)),
]


def make_model(dtype, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.GELU(), torch.nn.Linear(300, 10))
    return model.to(device="cuda", dtype=dtype)


def train(model, opt, steps, seed=1, max_grad_norm=None):
    gen = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 64, generator=gen).to("cuda", dtype)
        y = torch.randint(0, 10, (32,), generator=gen).to("cuda")
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def bits(t):
    return t.detach().contiguous().cpu().view(torch.uint8)


@pytest.mark.parametrize("dtype,options", VARIANTS, ids=["fp32", "bf16-master", "bf16-remainder",
                                                          "8bit", "float8-amsgrad"])
@pytest.mark.parametrize("max_grad_norm", [None, 0.5])
@pytest.mark.parametrize("offload", ["host", "cpu"])
def test_offload_steps_the_bits_of_device_state(dtype, options, max_grad_norm, offload):
    on_device, on_host = make_model(dtype), make_model(dtype)
    a = FusedAdam(on_device.parameters(), **HYPER, **options, max_grad_norm=max_grad_norm)
    b = FusedAdam(on_host.parameters(), **HYPER, **options, max_grad_norm=max_grad_norm, offload=offload)
    assert train(on_device, a, 8) == train(on_host, b, 8)
    for (name, p), q in zip(on_device.named_parameters(), on_host.parameters()):
        assert torch.equal(bits(p), bits(q)), name
        info = b.native.param_info(b._entry_of[q].index)
        assert info.placement == PLACEMENT[offload]
        assert a.native.param_info(a._entry_of[p].index).placement == "device"
        for key in a.native.state_keys(a._entry_of[p].index):
            x = a.state[p][key]
            y = b.state[q][key]
            assert x.device.type == "cuda" and y.device.type == "cpu", key
            assert torch.equal(bits(x), bits(y)), f"{name} {key}"
    if max_grad_norm is not None:
        assert torch.equal(a.grad_norm, b.grad_norm)


@pytest.mark.parametrize("offload", ["host", "cpu"])
def test_offloaded_state_is_pinned_host_memory_and_state_dicts_cross_placements(offload):
    model = make_model(torch.bfloat16)
    opt = FusedAdam(model.parameters(), **HYPER, offload=offload)
    train(model, opt, 3)
    # Every state in pinned host memory (cudaHostAlloc'd: torch sees it pinned), none on the device.
    for p in model.parameters():
        for key in opt.native.state_keys(opt._entry_of[p].index):
            assert opt.state[p][key].device.type == "cpu" and opt.state[p][key].is_pinned(), key
    saved = opt.state_dict()
    assert all(t.device.type == "cpu" for s in saved["state"].values() for k, t in s.items() if k != "step")

    # Into device state and back: the same bits, and the runs go on alike.
    twin = make_model(torch.bfloat16, seed=5)
    twin.load_state_dict(model.state_dict())
    on_device = FusedAdam(twin.parameters(), **HYPER)
    on_device.load_state_dict(saved)
    again = make_model(torch.bfloat16, seed=6)
    again.load_state_dict(model.state_dict())
    on_host = FusedAdam(again.parameters(), **HYPER, offload=offload)
    on_host.load_state_dict(on_device.state_dict())
    assert train(twin, on_device, 3, seed=9) == train(again, on_host, 3, seed=9)
    for p, q in zip(twin.parameters(), again.parameters()):
        assert torch.equal(bits(p), bits(q))


@pytest.mark.parametrize("offload", ["host", "cpu"])
def test_offload_shard_files_load_into_device_state(tmp_path, offload):
    model = make_model(torch.float32)
    opt = FusedAdam(model.parameters(), **HYPER, offload=offload, moment_dtype=torch.uint8, min_8bit_size=0)
    train(model, opt, 4)
    path = tmp_path / "rank0.safetensors"
    opt.save_shard_file(str(path))
    twin = make_model(torch.float32, seed=3)
    twin.load_state_dict(model.state_dict())
    on_device = FusedAdam(twin.parameters(), **HYPER, moment_dtype=torch.uint8, min_8bit_size=0)
    on_device.load_shard_files([str(path)])
    assert train(model, opt, 3, seed=4) == train(twin, on_device, 3, seed=4)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(bits(p), bits(q))


@pytest.mark.parametrize("offload", ["host", "cpu"])
def test_offload_with_step_in_backward_gives_the_same_bits(offload):
    """Partial steps during the backward over state on the host (only the ring segments of
    the params that got their grads move): the bits of a plain step over device state."""
    plain, ours = make_model(torch.bfloat16), make_model(torch.bfloat16)
    a = FusedAdam(plain.parameters(), **HYPER)
    b = FusedAdam(ours.parameters(), **HYPER, offload=offload, step_in_backward=True)
    b._ARRIVED_BYTES = 1  # a partial step per param
    assert train(plain, a, 6) == train(ours, b, 6)
    for p, q in zip(plain.parameters(), ours.parameters()):
        assert torch.equal(bits(p), bits(q))
        assert q.grad is None


def fp8_scale(scaling, shape, gen):
    """A scale tensor of `scaling` for a param of `shape` (shardadam.h's sa_param_scaling)."""
    if scaling == "delayed":
        return torch.tensor([0.75])
    if scaling == "current":
        return torch.ones(2)  # [scale, scale_inv]: the step writes both
    blocks = shape[:-1] + (shape[-1] // {"mxfp8": 32, "block128": 128}[scaling],)
    if scaling == "mxfp8":
        return torch.randint(120, 134, blocks, generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return torch.rand(blocks, generator=gen) * 2 + 0.01


@pytest.mark.parametrize("scaling", ["delayed", "mxfp8", "block128", "current"])
@pytest.mark.parametrize("moment_dtype", [torch.float32, torch.uint8])
@pytest.mark.parametrize("offload", ["host", "cpu"])
def test_offloaded_fp8_params_step_the_bits_of_device_state(scaling, moment_dtype, offload):
    """fp8 params (float8_e4m3fn codes, a scale tensor on the device): the host's update of the
    master ("cpu") or the ring's ("host"), then the cast on the device, give the codes, scales,
    amax and states of FusedAdam without offload, over steps with and without grads."""
    from shardadam.torch import Fp8
    gen = torch.Generator().manual_seed(11)
    shapes = [(4, 256), (3, 384), (70, 512)]  # the last over several CPU work items
    runs = []
    for placement in (None, offload):
        params, fp8 = [], {}
        for shape in shapes:
            codes = (torch.randn(shape, generator=torch.Generator().manual_seed(shape[0])) * 30).clamp(-448, 448)
            p = torch.nn.Parameter(codes.to(torch.float8_e4m3fn).cuda())
            scale = fp8_scale(scaling, shape, torch.Generator().manual_seed(shape[1])).cuda()
            amax = torch.full((1,), -1.0, device="cuda") if scaling in ("delayed", "current") else None
            fp8[p] = Fp8(scaling, scale, amax)
            params.append(p)
        runs.append((params, fp8, FusedAdam(params, **HYPER, fp8=fp8, offload=placement, moment_dtype=moment_dtype,
                                            min_8bit_size=0)))
    for step in range(5):
        grads = [torch.randn(s, generator=gen) * (1e3 if step == 2 else 1.0) for s in shapes]
        for params, _, opt in runs:
            for i, (p, g) in enumerate(zip(params, grads)):
                p.grad = None if (step == 3 and i == 1) else g.cuda()  # a step without one grad
            opt.step()
    (a_params, a_fp8, a), (b_params, b_fp8, b) = runs
    for i, (p, q) in enumerate(zip(a_params, b_params)):
        assert b.native.param_info(b._entry_of[q].index).placement == PLACEMENT[offload]
        assert torch.equal(bits(p), bits(q)), i
        assert torch.equal(bits(a_fp8[p].scale), bits(b_fp8[q].scale)), i
        if a_fp8[p].amax is not None:
            assert a_fp8[p].amax.item() != -1.0 and torch.equal(a_fp8[p].amax, b_fp8[q].amax), i
        for key in a.native.state_keys(a._entry_of[p].index):
            assert b.state[q][key].device.type == "cpu", key
            assert torch.equal(bits(a.state[p][key]), bits(b.state[q][key])), f"{i} {key}"
