"""Every update variant, driven through real DLPack from numpy, against a float64 reference.

Each test runs 25 steps over params of awkward shapes (an empty one among them) in two
groups, with grads that shrink over time (so that amsgrad's running max matters), and
checks that its tolerance is tight: the reference with the variant's distinguishing
switch flipped (bias correction, amsgrad, maximize, decoupled decay) must fall outside it.
"""
import numpy as np
import pytest

import shardadam
from adam_reference import AdamReference, round_to_bfloat16

ml_dtypes = pytest.importorskip("ml_dtypes")

SHAPES = [(7, 13), (1,), (0, 5), (33,), (3, 1, 4)]
STEPS = 25
HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
GROUP1_LR = 4e-3  # params at odd positions go to group 1
SWITCH_DEFAULTS = {"bias_correction": True, "decoupled_weight_decay": True, "amsgrad": False, "maximize": False}

NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}

# name -> (param dtype, add_param options, hyperparameters, switch flipped for the sensitivity check,
#          tolerance (rtol, atol) of the full-precision value, moments stored in bfloat16)
VARIANTS = {
    "fp32 AdamW": ("float32", {}, {}, "bias_correction", (1e-5, 2e-6), False),
    "fp32 Adam (L2)": ("float32", {}, {"decoupled_weight_decay": False}, "decoupled_weight_decay", (1e-5, 2e-6),
                       False),
    # amsgrad with beta2 = 0.9: v follows the shrinking grads quickly, far below its running max.
    "fp32 amsgrad": ("float32", {}, {"amsgrad": True, "betas": (0.9, 0.9)}, "amsgrad", (1e-5, 2e-6), False),
    "fp32 maximize": ("float32", {}, {"maximize": True}, "maximize", (1e-5, 2e-6), False),
    "fp32 no bias correction": ("float32", {}, {"bias_correction": False}, "bias_correction", (1e-5, 2e-6), False),
    "bf16 + fp32 master": ("bfloat16", {"master": "fp32"}, {}, "bias_correction", (1e-5, 2e-6), False),
    "bf16 + int16 remainder": ("bfloat16", {"master": "remainder"}, {}, "bias_correction", (1e-5, 2e-6), False),
    "bf16 + fp32 master, fp32 grads": ("bfloat16", {"grad_dtype": "float32"}, {}, "bias_correction",
                                       (1e-5, 2e-6), False),
    "fp16 + fp32 master": ("float16", {"master": "fp32"}, {}, "bias_correction", (1e-5, 2e-6), False),
    # bf16 moments: the reference rounds its moments to bf16 too, but in float64 instead of
    # the kernel's float32, so an occasional moment differs by one bf16 ulp (2^-8); the
    # largest param difference seen was 1.0e-4 (lr 1e-2, 25 steps).
    "fp32 + bf16 moments": ("float32", {"moment_dtype": "bfloat16"}, {}, "bias_correction", (0.0, 3e-4), True),
    "bf16 + fp32 master + bf16 moments + amsgrad": ("bfloat16", {"moment_dtype": "bfloat16"},
                                                    {"amsgrad": True, "betas": (0.9, 0.9)}, "amsgrad", (0.0, 3e-4),
                                                    True),
}


def random_array(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(NUMPY_DTYPES[dtype])


def full_precision_value(opt, name, param, master):
    """The param's value as the optimizer keeps it (master, remainder or the param itself)."""
    if master == "fp32":
        return opt.state(name, "master").numpy().astype(np.float64)
    if master == "remainder":
        high = param.view(np.uint16).astype(np.uint32) << 16
        low = opt.state(name, "remainder").numpy().astype(np.int32).astype(np.uint32)
        return ((high + low) & 0xFFFFFFFF).astype(np.uint32).view(np.float32).astype(np.float64)
    return param.astype(np.float64)


def run(rng, param_dtype, options, hyper, moment_rounding):
    """25 steps of shardadam and of the reference (and of the flipped reference)."""
    grad_dtype = options.get("grad_dtype", param_dtype)
    master = options.get("master", "none" if param_dtype == "float32" else "fp32")
    params, grads, references = [], [], []
    opt = shardadam.Optimizer(**{**HYPER, **hyper})
    opt.add_group(lr=GROUP1_LR)
    for i, shape in enumerate(SHAPES):
        name = f"layers.{i}.w"
        param = random_array(rng, shape, param_dtype)
        grad = np.zeros(shape, NUMPY_DTYPES[grad_dtype])
        opt.add_param(name, param, group=i % 2, **options)
        opt.set_grad(name, grad)  # bound once; refilled in place every step
        params.append(param)
        grads.append(grad)
        lr = GROUP1_LR if i % 2 else HYPER["lr"]
        references.append(AdamReference(param, **{**HYPER, **hyper, "lr": lr},
                                        moment_rounding=round_to_bfloat16 if moment_rounding else None))
    return opt, params, grads, references, master


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_matches_float64_reference(variant, rng):
    param_dtype, options, hyper, switch, (rtol, atol), bf16_moments = VARIANTS[variant]
    opt, params, grads, references, master = run(rng, param_dtype, options, hyper, bf16_moments)
    flipped_hyper = {**hyper, switch: not {**SWITCH_DEFAULTS, **hyper}[switch]}
    flipped = [AdamReference(ref.p, **{**HYPER, **flipped_hyper, "lr": ref.lr}, moment_rounding=ref.moment_rounding)
               for ref in references]
    with opt:
        for step in range(STEPS):
            scale = 2.0 ** (-step / 3)  # shrinking grads: v falls below its running max
            for grad, ref, alt in zip(grads, references, flipped):
                np.copyto(grad, random_array(rng, grad.shape, str(grad.dtype), scale))
                ref.step(grad)
                alt.step(grad)
            opt.step()
        assert opt.param_groups[0].step == STEPS and opt.param_groups[1].step == STEPS
        for i, (param, ref, alt) in enumerate(zip(params, references, flipped)):
            name = f"layers.{i}.w"
            value = full_precision_value(opt, name, param, master)
            np.testing.assert_allclose(value, ref.p, rtol=rtol, atol=atol, err_msg=f"{variant}: {name}")
            if param.size:
                # The tolerance is tight enough to see the distinguishing switch.
                tolerance = atol + rtol * np.abs(ref.p)
                assert np.max(np.abs(alt.p - ref.p) / tolerance) > 10, f"{variant}: tolerance too loose"
            if master == "fp32":  # the param is the rounding of the master weights
                np.testing.assert_array_equal(param, value.astype(np.float32).astype(param.dtype))
            if master == "remainder":  # ... and reads as the nearest bfloat16 of the fp32 value
                assert np.all(np.abs(param.astype(np.float64) - value) <= np.abs(value) * 2.0 ** -8)
            # Moments, through zero-copy state views.
            m_rtol = 2.0 ** -7 if bf16_moments else 1e-5
            np.testing.assert_allclose(opt.state(name, "exp_avg").numpy().astype(np.float64), ref.m,
                                       rtol=m_rtol, atol=1e-7)
            np.testing.assert_allclose(opt.state(name, "exp_avg_sq").numpy().astype(np.float64), ref.v,
                                       rtol=m_rtol, atol=1e-9)
            if hyper.get("amsgrad"):
                np.testing.assert_allclose(opt.state(name, "max_exp_avg_sq").numpy().astype(np.float64),
                                           ref.vmax, rtol=m_rtol, atol=1e-9)
            expected_moment_dtype = "bfloat16" if bf16_moments else "float32"
            assert opt.state(name, "exp_avg").dtype == expected_moment_dtype


def test_loss_scale_and_found_inf_skip_match_reference(rng):
    """inv_grad_scale scales every grad; found_inf != 0 skips the whole step (also the
    step count). Given as Python numbers and as one-element float32 arrays."""
    param = rng.standard_normal((5, 6)).astype(np.float32)
    grad = np.zeros_like(param)
    ref = AdamReference(param, **HYPER)
    inv_scale_array = np.zeros(1, np.float32)
    found_inf_array = np.zeros(1, np.float32)
    with shardadam.Optimizer(**HYPER) as opt:
        opt.add_param("w", param)
        opt.set_grad("w", grad)
        for step in range(12):
            loss_scale = 2.0 ** (step % 4 + 8)
            true_grad = rng.standard_normal(param.shape).astype(np.float32)
            np.copyto(grad, true_grad * np.float32(loss_scale))
            skip = step in (3, 7)
            if step % 2:
                inv_scale_array[0] = 1.0 / loss_scale
                found_inf_array[0] = 1.0 if skip else 0.0
                opt.step(inv_grad_scale=inv_scale_array, found_inf=found_inf_array)
            else:
                opt.step(inv_grad_scale=1.0 / loss_scale, found_inf=float(skip))
            if not skip:
                ref.step(grad, inv_grad_scale=1.0 / loss_scale)
        assert opt.param_groups[0].step == 10
    np.testing.assert_allclose(param, ref.p, rtol=1e-5, atol=2e-6)


def test_hyperparameter_changes_between_steps_are_honoured(rng):
    """An LR schedule (attribute and item access) and other hyperparameter changes take
    effect from the next step."""
    param = rng.standard_normal(17).astype(np.float32)
    grad = np.zeros_like(param)
    ref = AdamReference(param, **HYPER)
    with shardadam.Optimizer(**HYPER) as opt:
        opt.add_param("w", param)
        opt.set_grads([grad])  # bound once, refilled in place below
        group = opt.param_groups[0]
        for step in range(10):
            lr = HYPER["lr"] * (1 + step) / 10
            if step % 2:
                group.lr = lr
            else:
                group["lr"] = lr
            ref.lr = lr
            if step == 5:
                group.update(betas=(0.8, 0.95), weight_decay=0.2, eps=1e-6)
                ref.beta1, ref.beta2, ref.weight_decay, ref.eps = 0.8, 0.95, 0.2, 1e-6
            np.copyto(grad, rng.standard_normal(param.shape).astype(np.float32))
            ref.step(grad)
            opt.step()
        assert group.config() == {"lr": pytest.approx(HYPER["lr"]), "betas": (0.8, 0.95), "eps": 1e-6,
                                  "weight_decay": 0.2, "decoupled_weight_decay": True,
                                  "bias_correction": True, "maximize": False, "amsgrad": False,
                                  **{k: v for k, v in shardadam.group_defaults().items()
                                     if k not in ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay",
                                                  "bias_correction", "maximize", "amsgrad")}}
        assert group.config()["update_rule"] == "adamw"
    np.testing.assert_allclose(param, ref.p, rtol=1e-5, atol=2e-6)


def test_set_step_resumes_bias_correction(rng):
    """A group's step count can be set (resuming): bias correction continues from it."""
    param = rng.standard_normal(9).astype(np.float32)
    grad = rng.standard_normal(9).astype(np.float32)
    ref = AdamReference(param, **HYPER)
    ref.t = 100
    with shardadam.Optimizer(**HYPER) as opt:
        opt.add_param("w", param)
        opt.set_grad("w", grad)
        opt.param_groups[0]["step"] = 100
        opt.step()
        ref.step(grad)
        assert opt.param_groups[0].step == 101
    np.testing.assert_allclose(param, ref.p, rtol=1e-5, atol=2e-6)


def test_bfloat16_numpy_arrays_travel_as_relabelled_uint16_capsules(rng):
    """numpy has no DLPack export for ml_dtypes.bfloat16 (it raises BufferError); the
    package exports the uint16 view and relabels the capsule, and State.numpy() does the
    reverse. Both directions keep sharing memory."""
    param = rng.standard_normal(8).astype(np.float32).astype(ml_dtypes.bfloat16)
    with pytest.raises(BufferError):
        param.__dlpack__()  # numpy's own export (if numpy ever gains it, the relabel path stays correct)
    with shardadam.Optimizer() as opt:
        opt.add_param("w", param, moment_dtype="bfloat16")
        info = opt.param_info("w")
        assert (info.param_dtype, info.moment_dtype, info.master) == ("bfloat16", "bfloat16", "fp32")
        master = opt.state("w", "master").numpy()
        np.testing.assert_array_equal(master, param.astype(np.float32))
        moment = opt.state("w", "exp_avg").numpy()
        assert moment.dtype == ml_dtypes.bfloat16
        moment[:] = 1.5  # writes reach the optimizer's buffer
        assert np.all(opt.state("w", "exp_avg").numpy() == 1.5)


def test_placement_host_on_cpu_params_is_host_memory_already_and_unknown_ones_are_refused():
    """A CPU param's state is host memory whatever placement it asks for: "host" and
    "host_cpu_step" are taken, read back as "device", and step the same values; an unknown name
    adds nothing."""
    opt = shardadam.Optimizer(**HYPER)
    rng = np.random.default_rng(7)
    start = rng.standard_normal(33).astype(np.float32)
    a, b, c = start.copy(), start.copy(), start.copy()
    with pytest.raises(ValueError, match="placement must be None or one of 'device', 'host', 'host_cpu_step', "
                                         "got 'gpu'"):
        opt.add_param("a", a, placement="gpu")
    assert opt.num_params == 0
    opt.add_param("a", a, placement="host")
    opt.add_param("b", b)
    opt.add_param("c", c, placement="host_cpu_step")
    assert [opt.param_info(i).placement for i in range(3)] == ["device"] * 3
    grad = rng.standard_normal(33).astype(np.float32)
    for _ in range(3):
        opt.set_grads([grad, grad, grad])
        opt.step()
    assert not np.array_equal(a, start)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(c, b)
