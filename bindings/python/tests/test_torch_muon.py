"""shardadam.torch.Muon against torch.optim.Muon, and Muon groups beside AdamW groups in one
FusedAdam: whole matrices on the CPU.

References: torch.optim.Muon on copies of the same params and grads (its Newton-Schulz runs
in bfloat16, ours in float32 on the CPU: the tolerance is bfloat16's), and a float64 Muon
written here from torch's documented update (momentum by lerp, Nesterov, the quintic
Newton-Schulz, decoupled decay, the lr adjustments), which ours must match to float32's.
Skipped visibly without torch or without torch.optim.Muon (torch < 2.9).
"""
import copy
import math

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.optim, "Muon"):
    pytest.skip("torch.optim.Muon needs torch >= 2.9", allow_module_level=True)
import shardadam  # noqa: E402
from shardadam.torch import FusedAdam, Muon  # noqa: E402

SHAPES = [(8, 24), (24, 8), (17, 17)]


def matrices(seed=0, shapes=SHAPES):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=gen)) for shape in shapes]


def grads_for(params, step):
    gen = torch.Generator().manual_seed(1000 + step)
    return [0.01 * torch.randn(p.shape, generator=gen) for p in params]


def ns64(g, a, b, c, steps, eps):
    """torch's _zeropower_via_newtonschulz in float64."""
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / max(x.norm().item(), eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def muon64(params, bufs, grads, h):
    """One float64 Muon step of every matrix (params and bufs float64, updated)."""
    a, b, c = h["ns_coefficients"]
    for p, buf, g in zip(params, bufs, grads):
        g = g.double()
        buf += (1 - h["momentum"]) * (g - buf)
        u = g + h["momentum"] * (buf - g) if h["nesterov"] else buf
        o = ns64(u, a, b, c, h["ns_steps"], h["eps"])
        rows, cols = p.shape
        ratio = 0.2 * math.sqrt(max(rows, cols)) if h["adjust_lr_fn"] == "match_rms_adamw" else \
            math.sqrt(max(1.0, rows / cols))
        p.mul_(1 - h["lr"] * h["weight_decay"]).sub_(h["lr"] * ratio * o)


def against_torch_and_float64(device, h, shapes, float64_bound):
    """Four steps of ours and torch.optim.Muon over the same matrices and grads on `device`,
    each checked against the other and against muon64: ours within float64_bound(torch's
    bound) of float64 and within bfloat16's tolerance of torch's (its Newton-Schulz is
    bfloat16's: ~1e-2 of an order-1 direction, times lr x adjustment, per step); the momentum
    within float32's of both; and the matrices moved."""
    ours = [torch.nn.Parameter(p.detach().to(device)) for p in matrices(shapes=shapes)]
    theirs = [torch.nn.Parameter(p.detach().to(device)) for p in matrices(shapes=shapes)]
    opt, ref = Muon(ours, **h), torch.optim.Muon(theirs, **h)
    p64 = [p.detach().double().cpu() for p in ours]
    b64 = [torch.zeros_like(p) for p in p64]
    for step in range(4):
        grads = grads_for(p64, step)
        for p, q, g in zip(ours, theirs, grads):
            p.grad, q.grad = g.to(device), g.to(device)
        opt.step()
        ref.step()
        muon64(p64, b64, grads, h)
        for i, (p, q, r) in enumerate(zip(ours, theirs, p64)):
            ratio = 0.2 * math.sqrt(max(p.shape)) if h["adjust_lr_fn"] else math.sqrt(max(1.0, p.shape[0] / p.shape[1]))
            bound = (step + 1) * 0.02 * ratio * 0.06
            assert (p - q).abs().max().item() < bound, f"matrix {i} step {step} vs torch on {device}"
            assert (p.detach().double().cpu() - r).abs().max().item() < float64_bound(bound), \
                f"matrix {i} step {step} vs float64"
    for p, q, buf in zip(ours, theirs, b64):
        assert torch.allclose(opt.state[p]["momentum_buffer"].double().cpu(), buf, atol=1e-7)
        assert torch.allclose(opt.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"], atol=1e-7)
    # They moved: four steps at lr 0.02 of orthogonalized directions.
    assert max((p.detach().cpu() - q0).abs().max() for p, q0 in zip(ours, matrices(shapes=shapes))) > 0.01


def muon_hyper(nesterov, adjust_lr_fn, ns_steps):
    return dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, ns_coefficients=(3.4445, -4.775, 2.0315),
                eps=1e-7, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw"])
@pytest.mark.parametrize("ns_steps", [1, 5, 8])
def test_muon_matches_torch_and_a_float64_reference(nesterov, adjust_lr_fn, ns_steps):
    # On the CPU ours runs Newton-Schulz in float32: a few ulps of float64's per step.
    against_torch_and_float64("cpu", muon_hyper(nesterov, adjust_lr_fn, ns_steps), SHAPES, lambda bound: 2e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw"])
def test_muon_on_cuda_matches_torchs_muon_on_cuda(nesterov, adjust_lr_fn):
    """On CUDA both run Newton-Schulz in bfloat16 (cuBLAS, float32 accumulation): ours
    within bfloat16's tolerance of torch's and of the float64 reference."""
    against_torch_and_float64("cuda", muon_hyper(nesterov, adjust_lr_fn, 5), SHAPES + [(64, 160), (160, 64)],
                              lambda bound: bound)


def test_groups_and_defaults_are_torch_muons():
    ours = Muon(matrices())
    theirs = torch.optim.Muon(matrices())
    assert ours.defaults == theirs.defaults
    assert {k: v for k, v in ours.param_groups[0].items() if k != "params"} == \
        {k: v for k, v in theirs.param_groups[0].items() if k != "params"}
    # lr schedules work: a changed group lr is pushed to the library.
    ours.param_groups[0]["lr"] = 0.5
    ours.param_groups[0]["adjust_lr_fn"] = "match_rms_adamw"
    ours._push_hyperparameters()
    assert ours.native.param_groups[0].lr == 0.5
    assert ours.native.param_groups[0].adjust_lr == "match_rms_adamw"
    assert ours.native.param_groups[0].update_rule == "muon"


def test_state_dicts_load_both_ways():
    h = dict(lr=0.02, momentum=0.9)
    ours, theirs = matrices(), matrices()
    opt, ref = Muon(ours, **h), torch.optim.Muon(theirs, **h)
    for step in range(2):
        for p, q, g in zip(ours, theirs, grads_for(ours, step)):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    # Ours into a fresh torch.optim.Muon, torch's into a fresh Muon: each continues as the
    # original does (the same params, so the same steps).
    ours2, theirs2 = [p.detach().clone().requires_grad_() for p in ours], \
        [q.detach().clone().requires_grad_() for q in theirs]
    ref2, opt2 = torch.optim.Muon(ours2, **h), Muon(theirs2, **h)
    ref2.load_state_dict(copy.deepcopy(opt.state_dict()))
    opt2.load_state_dict(copy.deepcopy(ref.state_dict()))
    for p, q in zip(ours, ours2):
        assert torch.equal(ref2.state[q]["momentum_buffer"], opt.state[p]["momentum_buffer"])
    for p, q in zip(theirs, theirs2):
        assert torch.equal(opt2.state[q]["momentum_buffer"], ref.state[p]["momentum_buffer"])
    grads = grads_for(ours, 9)
    for params, opt_ in ((ours, opt), (ours2, ref2), (theirs, ref), (theirs2, opt2)):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt_.step()
    tolerance = 3 * 0.02 * 1.8 * 0.06
    for a, b in zip(ours, ours2):
        assert (a - b).abs().max() < tolerance
    for a, b in zip(theirs, theirs2):
        assert (a - b).abs().max() < tolerance


def bfloat16_against_float32(device, moment_dtype=None):
    """Four steps of ours over bfloat16 matrices and grads on `device`, and of torch.optim.Muon
    over float32 copies of the same values: ours keeps a float32 master that follows torch's
    float32 matrices within bfloat16's Newton-Schulz tolerance (as against_torch_and_float64
    bounds it), its params are the master rounded (torch's rounding), and the momentum is
    torch's (float32: to float32's); a bfloat16 one is the float64 lerp kept in bfloat16 at
    every step (to one bfloat16 rounding)."""
    h = muon_hyper(True, None, 5)
    start = [p.detach().bfloat16() for p in matrices()]
    ours = [torch.nn.Parameter(p.clone().to(device)) for p in start]
    theirs = [torch.nn.Parameter(p.float().to(device)) for p in start]
    opt, ref = Muon(ours, moment_dtype=moment_dtype, **h), torch.optim.Muon(theirs, **h)
    kept = [torch.zeros(p.shape, dtype=torch.float64) for p in start]  # the bfloat16 buffer's reference
    for step in range(4):
        for p, q, g, b in zip(ours, theirs, grads_for(ours, step), kept):
            p.grad, q.grad = g.bfloat16().to(device), g.bfloat16().float().to(device)
            b.add_((1 - h["momentum"]) * (g.bfloat16().double() - b)).copy_(b.bfloat16().double())
        opt.step()
        ref.step()
    for i, (p, q, b) in enumerate(zip(ours, theirs, kept)):
        state = opt.state[p]
        master, buf = state["master"], state["momentum_buffer"]
        assert master.dtype == torch.float32 and buf.dtype == (moment_dtype or torch.float32)
        assert torch.equal(p.detach(), master.bfloat16()), f"matrix {i}: the param is its master rounded"
        ratio = math.sqrt(max(1.0, p.shape[0] / p.shape[1]))
        assert (master - q).abs().max().item() < 4 * 0.02 * ratio * 0.06, f"matrix {i} vs torch's float32"
        want = ref.state[q]["momentum_buffer"]
        if moment_dtype is None:
            assert torch.allclose(buf, want, atol=1e-7)
        else:
            assert torch.allclose(buf.double().cpu(), b, rtol=2 ** -8, atol=0)
    assert max((p.detach().float().cpu() - q0.float()).abs().max() for p, q0 in zip(ours, start)) > 0.01
    return ours, opt


@pytest.mark.parametrize("moment_dtype", [None, torch.bfloat16])
def test_bfloat16_matrices_step_a_float32_master_as_torchs_float32_muon(moment_dtype):
    bfloat16_against_float32("cpu", moment_dtype)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("moment_dtype", [None, torch.bfloat16])
def test_bfloat16_matrices_on_cuda_step_a_float32_master_as_torchs_float32_muon(moment_dtype):
    bfloat16_against_float32("cuda", moment_dtype)


def test_bfloat16_state_dicts_load_into_torchs_bfloat16_muon_and_back():
    """Ours (a float32 master and buffer) into torch.optim.Muon over bfloat16 params: torch
    casts the buffer to its params' dtype and steps on (carrying our master along, stale);
    torch's dict into ours: the buffer widened exactly, and the stale master is not taken: at
    the next step the master is the params' values (a step at lr 0 keeps them)."""
    ours, opt = bfloat16_against_float32("cpu")
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    ref = torch.optim.Muon(theirs, lr=0.02)
    ref.load_state_dict(copy.deepcopy(opt.state_dict()))
    for p, q in zip(ours, theirs):
        assert ref.state[q]["momentum_buffer"].dtype == torch.bfloat16
        assert torch.equal(ref.state[q]["momentum_buffer"], opt.state[p]["momentum_buffer"].bfloat16())
    for q, g in zip(theirs, grads_for(theirs, 5)):
        q.grad = g.bfloat16()
    ref.step()
    back = [torch.nn.Parameter(q.detach().clone()) for q in theirs]
    opt2 = Muon(back, lr=0.02)
    opt2.load_state_dict(copy.deepcopy(ref.state_dict()))
    for p, q in zip(back, theirs):
        assert torch.equal(opt2.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"].float())
    opt2.param_groups[0]["lr"] = 0.0
    for p, g in zip(back, grads_for(back, 6)):
        p.grad = g.bfloat16()
    opt2.step()
    for p, q in zip(back, theirs):
        assert torch.equal(p.detach(), q.detach())
        assert torch.equal(opt2.state[p]["master"], p.detach().float())


@pytest.mark.parametrize("moment_dtype", [None, torch.bfloat16])
def test_bfloat16_matrices_checkpoint_through_dcp_and_resume_bit_for_bit(tmp_path, moment_dtype):
    """DCP (one process, no_dist) saves Muon.state_dict() of bfloat16 matrices (a float32
    master, a float32 or bfloat16 buffer) and loads it into a fresh Muon that stepped once
    (its own states and params moved), the params restored as a model checkpoint would: master
    and buffer bit for bit, and the next step lands where the original's does (the master
    kept, its params being its rounding)."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    ours = [torch.nn.Parameter(p.detach().bfloat16()) for p in matrices()]
    opt = Muon(ours, lr=0.02, moment_dtype=moment_dtype)
    for step in range(2):
        for p, g in zip(ours, grads_for(ours, step)):
            p.grad = g.bfloat16()
        opt.step()
    dcp.save({"optim": opt.state_dict()}, checkpoint_id=str(tmp_path), no_dist=True)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    other = Muon(copies, lr=0.5, moment_dtype=moment_dtype)
    for q in copies:
        q.grad = torch.zeros_like(q)
    other.step()  # its states exist, and its master is its params' (not ours)
    target = {"optim": other.state_dict()}
    dcp.load(target, checkpoint_id=str(tmp_path), no_dist=True)
    other.load_state_dict(target["optim"])
    with torch.no_grad():  # the model's own checkpoint: other.step() moved the copies (decay)
        for p, q in zip(ours, copies):
            q.copy_(p)
    assert other.param_groups[0]["lr"] == 0.02
    for p, q in zip(ours, copies):
        for key in ("master", "momentum_buffer"):
            assert torch.equal(other.state[q][key], opt.state[p][key]), key
    grads = grads_for(ours, 7)
    for params, o in ((ours, opt), (copies, other)):
        for p, g in zip(params, grads):
            p.grad = g.bfloat16()
        o.step()
    for p, q in zip(ours, copies):
        assert torch.equal(p.detach(), q.detach())
        assert torch.equal(opt.state[p]["master"], other.state[q]["master"])


def test_shard_files_round_trip(tmp_path):
    ours = matrices()
    opt = Muon(ours, lr=0.02)
    for p, g in zip(ours, grads_for(ours, 0)):
        p.grad = g
    opt.step()
    opt.save_shard_file(tmp_path / "muon.safetensors")
    copies = [p.detach().clone().requires_grad_() for p in ours]
    other = Muon(copies, lr=0.5)
    other.load_shard_files([tmp_path / "muon.safetensors"])
    assert other.param_groups[0]["lr"] == 0.02  # the groups are restored
    for p, q in zip(ours, copies):
        assert torch.equal(other.state[q]["momentum_buffer"], opt.state[p]["momentum_buffer"])


def test_muon_and_adamw_groups_in_one_fused_adam_match_torchs_pair():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    twin = copy.deepcopy(model)
    muon_h = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, eps=1e-7)
    adamw_h = dict(lr=3e-3, weight_decay=0.01)

    def split(m):
        return [p for p in m.parameters() if p.ndim == 2], [p for p in m.parameters() if p.ndim != 2]

    mats, rest = split(model)
    opt = FusedAdam([{"params": mats, "update_rule": "muon", **muon_h}, {"params": rest, **adamw_h}])
    assert opt.param_groups[0]["update_rule"] == "muon"
    assert "update_rule" not in opt.param_groups[1]  # an AdamW group keeps AdamW's keys
    twin_mats, twin_rest = split(twin)
    pair = [torch.optim.Muon(twin_mats, **muon_h), torch.optim.AdamW(twin_rest, **adamw_h)]
    gen = torch.Generator().manual_seed(3)
    data = [(torch.randn(8, 16, generator=gen), torch.randn(8, 8, generator=gen)) for _ in range(20)]
    losses, twin_losses = [], []
    for x, y in data:
        for m, step, out in ((model, [opt], losses), (twin, pair, twin_losses)):
            loss = torch.nn.functional.mse_loss(m(x), y)
            out.append(loss.item())
            loss.backward()
            for o in step:
                o.step()
                o.zero_grad()
    # The losses fall, and follow torch's pair within a few percent (its Newton-Schulz is
    # bfloat16's, ours float32's).
    assert losses[-1] < 0.9 * losses[0]
    for ours, theirs in zip(losses, twin_losses):
        assert abs(ours - theirs) <= 0.03 * abs(theirs) + 1e-4
    assert set(opt.state[mats[0]]) == {"momentum_buffer", "step"}
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(opt.state[rest[0]])


class TinyTransformer(torch.nn.Module):
    """A 2-layer causal transformer language model: embedding, attention and MLP blocks with
    pre-norms, a final norm and an untied head."""

    def __init__(self, vocab=48, d=32, heads=4, layers=2, length=12):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.position = torch.nn.Parameter(0.02 * torch.randn(length, d))
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.0, batch_first=True,
                                             norm_first=True) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(length))

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, src_mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
        return self.head(self.norm(x))


def test_muon_and_adamw_train_a_small_transformer_as_torchs_pair():
    """The recipe Muon is used with (Moonlight, Kimi K2): Muon for the hidden 2-D matrices
    (attention's in/out projections, the MLP's), AdamW for the embedding, the positions,
    the norms, the biases and the head; in one FusedAdam against torch.optim.Muon +
    torch.optim.AdamW on a copy, over the same batches of a next-token task."""
    torch.manual_seed(0)
    model = TinyTransformer()
    twin = copy.deepcopy(model)
    muon_h = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, eps=1e-7)
    adamw_h = dict(lr=3e-3, weight_decay=0.01)

    def split(m):
        hidden = [p for name, p in m.named_parameters() if p.ndim == 2 and name.startswith("blocks.")]
        others = [p for name, p in m.named_parameters() if not (p.ndim == 2 and name.startswith("blocks."))]
        return hidden, others

    hidden, others = split(model)
    assert len(hidden) == 8 and len(others) > 8  # 4 matrices a block
    opt = FusedAdam([{"params": hidden, "update_rule": "muon", **muon_h}, {"params": others, **adamw_h}])
    twin_hidden, twin_others = split(twin)
    pair = [torch.optim.Muon(twin_hidden, **muon_h), torch.optim.AdamW(twin_others, **adamw_h)]
    gen = torch.Generator().manual_seed(4)
    # A learnable task: each sequence counts up from a random start (mod the vocabulary).
    starts = torch.randint(0, 48, (30, 16, 1), generator=gen)
    batches = [(s + torch.arange(13)) % 48 for s in starts]
    losses, twin_losses = [], []
    for batch in batches:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        for m, step, out in ((model, [opt], losses), (twin, pair, twin_losses)):
            loss = torch.nn.functional.cross_entropy(m(inputs).reshape(-1, 48), targets.reshape(-1))
            out.append(loss.item())
            loss.backward()
            for o in step:
                o.step()
                o.zero_grad()
    # The model learns the task, and the losses follow torch's pair within 0.5% (measured:
    # 0.03% at most; its Newton-Schulz runs in bfloat16, ours on the CPU in float32). The
    # bound is the "a few percent" made tight enough to see a wrong Muon: Nesterov
    # off moves the losses by 3.6%, momentum 0.9 for 0.95 by 7.4%, 3 Newton-Schulz steps for
    # 5 by 0.7%.
    assert losses[-1] < 0.5 * losses[0], losses
    for step, (ours, theirs) in enumerate(zip(losses, twin_losses)):
        assert abs(ours - theirs) <= 0.005 * abs(theirs), (step, ours, theirs)
    assert set(opt.state[hidden[0]]) == {"momentum_buffer", "step"}


def test_what_muon_refuses_says_why():
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        Muon(matrices(), adjust_lr_fn="cosine")
    with pytest.raises(ValueError, match="ns_coefficients"):
        Muon(matrices(), ns_coefficients=(1.0, 2.0))
    bias = torch.nn.Parameter(torch.zeros(8))
    with pytest.raises(shardadam.InvalidArgument, match=r"2-D.*\[8\]"):
        Muon([bias])
    half = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float16))
    with pytest.raises(shardadam.Unsupported, match="Muon steps float32 or bfloat16.*this param is float16"):
        Muon([half])
    with pytest.raises(ValueError, match="update_rule"):
        FusedAdam([{"params": matrices(), "update_rule": "sgd"}])
