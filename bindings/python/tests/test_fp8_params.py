"""fp8 params (float8_e4m3fn, float8_e5m2) with a float32 master, from numpy arrays of
ml_dtypes' dtypes, through ``Optimizer.add_param(..., scaling=, scale=, amax=)``.

The references are independent of the library: ml_dtypes' casts (round to nearest even;
ml_dtypes does not saturate, so values are clipped to the format's largest first, which
is what a saturating cast is), numpy's float32 arithmetic for the scales as
include/shardadam/shardadam.h states them (sa_param_scaling), and a float32-param
optimizer stepped on the same grads for the master: the fp8 param's master must be that
optimizer's param bit for bit, the param the reference cast of the master, the scales the
reference rule's.
"""
import gc
import sys

import numpy as np
import pytest

import shardadam
from shardadam import Mesh, Shard

ml_dtypes = pytest.importorskip("ml_dtypes")

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05)
# name -> (ml_dtypes dtype, largest finite value, emax: the exponent of the largest power of two)
FORMATS = {
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0, 8),
    "float8_e5m2": (ml_dtypes.float8_e5m2, 57344.0, 15),
}
BLOCKS = {"delayed": 0, "mxfp8": 32, "block128": 128}
F32_MAX = np.float32(np.finfo(np.float32).max)


def fp8(x, fmt):
    """The saturating round-to-nearest-even cast of float32 x (NaN stays NaN)."""
    dtype, largest, _ = FORMATS[fmt]
    return np.clip(np.asarray(x, np.float32), -largest, largest).astype(dtype)


def blocks(x, block):
    """x (float32, last dim a multiple of block) as rows of one block each."""
    return x.reshape(-1, block)


def mx_exponent(amax, fmt):
    """MXFP8's scale exponent: floor(log2 amax) - emax, clamped to [-127, 127]; -127 for 0."""
    _, _, emax = FORMATS[fmt]
    e = np.frexp(amax)[1].astype(np.int64) - 1 - emax  # frexp: amax = m * 2^e with m in [0.5, 1)
    return np.where(amax == 0, -127, np.clip(e, -127, 127))


def block128_scale(amax, fmt):
    """fp8_max / amax in float32; 1 for a block of zeros, FLT_MAX where it overflows."""
    largest = np.float32(FORMATS[fmt][1])
    with np.errstate(divide="ignore", over="ignore"):
        s = largest / np.where(amax == 0, np.float32(1), amax)
    return np.where(amax == 0, np.float32(1), np.where(np.isinf(s), F32_MAX, s)).astype(np.float32)


def reference_cast(master, fmt, scaling, delayed_scale=None):
    """(param, scale) that the rule of `scaling` gives for float32 master values: scale is
    the e8m0 codes (mxfp8), the float32 scale_inv per block (block128), or None."""
    if scaling == "delayed":
        return fp8(master * np.float32(delayed_scale), fmt), None
    block = BLOCKS[scaling]
    rows = blocks(master, block)
    amax = np.abs(rows).max(axis=1)
    if scaling == "mxfp8":
        e = mx_exponent(amax, fmt)
        factor = np.ldexp(np.float32(1), -e).astype(np.float32)[:, None]
        codes = (e + 127).astype(np.uint8).reshape(master.shape[:-1] + (-1,))
        return fp8(rows * factor, fmt).reshape(master.shape), codes
    scale = block128_scale(amax, fmt)
    inv = (np.float32(1) / scale).astype(np.float32).reshape(master.shape[:-1] + (-1,))
    return fp8(rows * scale[:, None], fmt).reshape(master.shape), inv


def reference_start(param, fmt, scaling, scale):
    """The master add_param starts from: the fp8 value times its scale's inverse."""
    v = param.astype(np.float32)
    if scaling == "delayed":
        return v / np.float32(scale[0])
    block = BLOCKS[scaling]
    if scaling == "mxfp8":
        factor = np.ldexp(np.float32(1), scale.view(np.uint8).astype(np.int64) - 127).astype(np.float32)
    else:
        factor = scale
    return (blocks(v, block) * factor.reshape(-1, 1)).reshape(v.shape).astype(np.float32)


def scale_array(fmt, scaling, shape, rng):
    """A scale for add_param: a positive float32 for delayed, block scales around 1 otherwise."""
    if scaling == "delayed":
        return np.array([0.75], np.float32)
    n = shape[:-1] + (shape[-1] // BLOCKS[scaling],)
    if scaling == "mxfp8":
        return rng.integers(120, 134, size=n).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
    return rng.uniform(0.01, 2.0, size=n).astype(np.float32)


def as_bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


CASES = [(fmt, scaling) for fmt in FORMATS for scaling in BLOCKS]


def test_the_library_lists_the_scalings_the_header_defines():
    table = {s["name"]: s for s in shardadam.param_scalings()}
    assert set(table) == {"none", "delayed", "mxfp8", "block128", "current", "current_pow2"}
    assert {k: table[k]["block"] for k in BLOCKS} == BLOCKS
    assert table["mxfp8"]["scale_dtype"] == "float8_e8m0fnu"
    assert table["delayed"]["scale_dtype"] == table["block128"]["scale_dtype"] == "float32"
    assert (table["delayed"]["step_writes_scale"], table["mxfp8"]["step_writes_scale"],
            table["block128"]["step_writes_scale"]) == (False, True, True)
    for current in ("current", "current_pow2"):
        assert (table[current]["block"], table[current]["scale_dtype"], table[current]["step_writes_scale"]) == \
            (0, "float32", True)


def current_scale(amax, fmt, pow2, margin=0):
    """fp8_max / amax as block128's rule, / 2^margin by numpy's ldexp; pow2: 2^floor(log2 s),
    by numpy's frexp."""
    s = np.float32(np.ldexp(block128_scale(np.asarray([amax], np.float32), fmt)[0], -margin))
    return np.float32(np.ldexp(np.float32(1), np.frexp(s)[1] - 1)) if pow2 else s


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("scaling,margin", [("current", 0), ("current_pow2", 0), ("current", 4),
                                            ("current_pow2", 1)])
def test_current_scaling_casts_with_the_whole_tensors_amax_and_writes_scale_and_inverse(fmt, scaling, margin,
                                                                                       rng):
    shape = (4, 96)
    start = fp8(rng.standard_normal(shape).astype(np.float32) * 40, fmt)
    scale = np.array([4.0, 0.25], np.float32)  # the codes above are master * 4
    amax = np.zeros(1, np.float32)
    param = start.copy()
    with shardadam.Optimizer(**HYPER) as opt, shardadam.Optimizer(**HYPER) as twin:
        opt.add_param("w", param, scaling=scaling, scale=scale, amax=amax, margin=margin)
        assert (opt.param_info("w").scaling, opt.param_info("w").margin) == (scaling, margin)
        twin_param = start.astype(np.float32) * np.float32(0.25)
        twin.add_param("w", twin_param)
        master = opt.state("w", "master").numpy()
        np.testing.assert_array_equal(as_bits(master), as_bits(twin_param))
        for k in range(3):
            grad = rng.standard_normal(shape).astype(np.float32) * (1e3 if k == 1 else 1)
            opt.set_grad("w", grad)
            twin.set_grad("w", grad)
            opt.step()
            twin.step()
            np.testing.assert_array_equal(as_bits(master), as_bits(twin_param))
            want = current_scale(np.abs(twin_param).max(), fmt, scaling == "current_pow2", margin)
            assert amax[0] == np.abs(twin_param).max()
            assert (scale[0], scale[1]) == (want, np.float32(1) / want)
            np.testing.assert_array_equal(as_bits(param), as_bits(fp8(twin_param * want, fmt)))


def test_a_sharded_current_scaled_param_needs_a_communicator_first():
    param = np.zeros((2, 32), ml_dtypes.float8_e4m3fn)
    with shardadam.Optimizer(**HYPER) as opt:
        with pytest.raises(shardadam.Error, match="set a communicator"):
            opt.add_param("w", param, layout=Mesh((2,), (0,), [Shard(0)], global_shape=(4, 32)),
                          scaling="current", scale=np.array([1.0, 1.0], np.float32))
        assert opt.num_params == 0


@pytest.mark.parametrize("fmt,scaling", CASES)
def test_steps_update_the_master_as_a_float32_param_and_cast_it_by_the_rule(fmt, scaling, rng):
    shape = (6, 256)
    dtype = FORMATS[fmt][0]
    # Codes spread over the format's range, with a zero block and saturating-size values.
    start = fp8(rng.standard_normal(shape).astype(np.float32) * 40, fmt)
    start[1, :128] = 0
    scale = scale_array(fmt, scaling, shape, rng)
    amax = np.full(1, -1.0, np.float32)
    param = start.copy()
    grads = [rng.standard_normal(shape).astype(np.float32) * 3 for _ in range(4)]
    with shardadam.Optimizer(**HYPER) as opt, shardadam.Optimizer(**HYPER) as twin:
        kwargs = dict(amax=amax) if scaling == "delayed" else {}
        opt.add_param("w", param, scaling=scaling, scale=scale, **kwargs)
        info = opt.param_info("w")
        assert (info.param_dtype, info.grad_dtype, info.master, info.scaling) == (fmt, "float32", "fp32", scaling)
        master = opt.state("w", "master").numpy()
        expected_start = reference_start(start, fmt, scaling, scale)
        np.testing.assert_array_equal(as_bits(master), as_bits(expected_start))
        twin_param = expected_start.copy()
        twin.add_param("w", twin_param)
        for grad in grads:
            opt.set_grad("w", grad)
            twin.set_grad("w", grad)
            opt.step()
            twin.step()
            np.testing.assert_array_equal(as_bits(master), as_bits(twin_param))
            expected, expected_scale = reference_cast(twin_param, fmt, scaling, scale[0] if scaling == "delayed" else None)
            assert param.dtype == dtype
            np.testing.assert_array_equal(as_bits(param), as_bits(expected))
            if scaling == "delayed":
                assert scale[0] == np.float32(0.75)  # read, never written
                assert amax[0] == np.abs(twin_param).max()
            elif scaling == "mxfp8":
                np.testing.assert_array_equal(scale.view(np.uint8), expected_scale)
            else:
                np.testing.assert_array_equal(as_bits(scale), as_bits(expected_scale))
        assert not np.isnan(param.astype(np.float32)).any()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_delayed_scaling_saturates_and_the_cast_matches_ml_dtypes_near_every_boundary(fmt):
    """A scale that puts masters beyond the format's largest: the cast saturates (never an
    infinity or NaN); values on and next to rounding midpoints round to even."""
    dtype, largest, _ = FORMATS[fmt]
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    finite = np.unique(codes[np.isfinite(codes)])
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)  # exact in float32
    up, down = np.float32(np.inf), np.float32(-np.inf)
    values = np.concatenate([np.array([largest * 1.01, largest * 4, -largest * 3, np.inf, -np.inf], np.float32),
                             finite, mids, np.nextafter(mids, up), np.nextafter(mids, down)]).astype(np.float32)
    values = np.resize(values, (1, -(-values.size // 32) * 32))  # whole blocks (the tail repeats the start)
    scale = np.array([1.0], np.float32)
    with shardadam.Optimizer(lr=0.0, weight_decay=0.0) as opt:
        param = np.zeros(values.shape, dtype)
        opt.add_param("w", param, scaling="delayed", scale=scale)
        opt.state("w", "master").numpy()[...] = values
        opt.set_grad("w", np.zeros(values.shape, np.float32))
        opt.step()  # lr 0: the master stays, the param is cast from it
        np.testing.assert_array_equal(as_bits(param), as_bits(fp8(values, fmt)))
        assert np.abs(param.astype(np.float32)).max() == largest


def test_bad_fp8_options_raise_the_librarys_message_and_a_retry_works(rng):
    param = fp8(rng.standard_normal((4, 64)).astype(np.float32), "float8_e4m3fn")
    with shardadam.Optimizer() as opt:
        with pytest.raises(shardadam.InvalidArgument, match="a float8_e4m3fn param needs a scaling"):
            opt.add_param("w", param)
        with pytest.raises(ValueError, match="scaling must be one of"):
            opt.add_param("w", param, scaling="tensorwise")
        with pytest.raises(shardadam.InvalidArgument, match=r"options.scale has shape \[4, 1\]; it must be \[4, 2\]"):
            opt.add_param("w", param, scaling="mxfp8", scale=np.zeros((4, 1), ml_dtypes.float8_e8m0fnu))
        with pytest.raises(shardadam.InvalidArgument, match="options.scale is float32; it must be float8_e8m0fnu"):
            opt.add_param("w", param, scaling="mxfp8", scale=np.ones((4, 2), np.float32))
        one = np.ones(1, np.float32)
        refs = sys.getrefcount(one)
        with pytest.raises(shardadam.InvalidArgument, match="options.scale and options.amax share their element"):
            opt.add_param("w", param, scaling="delayed", scale=one, amax=one)
        gc.collect()  # the exception's traceback held the call's frame
        assert sys.getrefcount(one) == refs  # the capsules' tensors were released once, by the capsules
        with pytest.raises(shardadam.InvalidArgument,
                           match=r"this rank holds elements \[192, 384\) of dim 1, which cuts a block of 128"):
            opt.add_param("w", fp8(np.ones((4, 192)), "float8_e4m3fn"), scaling="block128",
                          scale=np.ones((4, 1), np.float32),
                          layout=Mesh((2,), (1,), [Shard(1)], global_shape=(4, 384)))
        with pytest.raises(shardadam.InvalidArgument, match="dim 1 has 64 elements, not a multiple of 128"):
            opt.add_param("w", param, scaling="block128", scale=np.ones((4, 0), np.float32))
        with pytest.raises(shardadam.InvalidArgument, match="options.margin is 7; it must be 0 to 6"):
            opt.add_param("w", param, scaling="current", scale=np.ones(2, np.float32), margin=7)
        with pytest.raises(shardadam.InvalidArgument, match="only SA_SCALING_CURRENT and SA_SCALING_CURRENT_POW2"):
            opt.add_param("w", param, scaling="delayed", scale=one, margin=1)
        with pytest.raises(TypeError, match="margin must be an int"):
            opt.add_param("w", param, scaling="current", scale=np.ones(2, np.float32), margin=1.5)
        assert opt.param_infos() == []
        # On success the optimizer holds the scale and the amax (their DLPack tensors) until closed.
        amax = np.zeros(1, np.float32)
        assert opt.add_param("w", param, scaling="delayed", scale=one, amax=amax) == 0
        assert opt.param_info("w").scaling == "delayed"
        assert sys.getrefcount(one) > refs
    gc.collect()
    assert sys.getrefcount(one) == refs


@pytest.mark.parametrize("fmt,scaling", [("float8_e4m3fn", "mxfp8"), ("float8_e5m2", "block128"),
                                         ("float8_e4m3fn", "delayed")])
def test_two_ranks_saved_load_into_one_and_the_param_is_cast_again_from_the_master(tmp_path, rng, fmt, scaling):
    """Shard(0) over two ranks, loaded unsharded: the master is the ranks' masters side by
    side, and the fp8 param (and its block scales) the rule applied to that master."""
    shape = (6, 256)
    full = fp8(rng.standard_normal(shape).astype(np.float32) * 10, fmt)
    paths, masters = [], []
    for rank, rows in enumerate([slice(0, 3), slice(3, 6)]):
        with shardadam.Optimizer(**HYPER) as opt:
            shard = full[rows].copy()
            opt.add_param("w", shard, scaling=scaling, scale=scale_array(fmt, scaling, shard.shape, rng),
                          layout=Mesh((2,), (rank,), [Shard(0)], global_shape=shape))
            opt.set_grad("w", rng.standard_normal(shard.shape).astype(np.float32))
            opt.step()
            masters.append(opt.state("w", "master").numpy().copy())
            paths.append(tmp_path / f"rank{rank}.safetensors")
            opt.save(paths[-1])
    master = np.concatenate(masters)
    delayed_scale = np.array([0.5], np.float32)
    scale = delayed_scale if scaling == "delayed" else scale_array(fmt, scaling, shape, rng)
    param = np.zeros(shape, FORMATS[fmt][0])
    with shardadam.Optimizer(**HYPER) as whole:
        whole.add_param("w", param, scaling=scaling, scale=scale)
        whole.load(paths)
        np.testing.assert_array_equal(as_bits(whole.state("w", "master").numpy()), as_bits(master))
        expected, expected_scale = reference_cast(master, fmt, scaling, 0.5)
        np.testing.assert_array_equal(as_bits(param), as_bits(expected))
        if scaling == "mxfp8":
            np.testing.assert_array_equal(scale.view(np.uint8), expected_scale)
        elif scaling == "block128":
            np.testing.assert_array_equal(as_bits(scale), as_bits(expected_scale))


@pytest.mark.parametrize("fmt,scaling", CASES)
def test_recast_params_follows_a_written_master_and_reset_masters_follows_new_weights(fmt, scaling, rng):
    shape = (2, 256)
    param = fp8(rng.standard_normal(shape).astype(np.float32), fmt)
    scale = scale_array(fmt, scaling, shape, rng)
    with shardadam.Optimizer(**HYPER) as opt:
        opt.add_param("w", param, scaling=scaling, scale=scale)
        master = opt.state("w", "master").numpy()
        loaded = (rng.standard_normal(shape) * 100).astype(np.float32)  # a state dict's master
        master[...] = loaded
        opt.recast_params()
        expected, expected_scale = reference_cast(loaded, fmt, scaling, scale[0] if scaling == "delayed" else None)
        np.testing.assert_array_equal(as_bits(param), as_bits(expected))
        if expected_scale is not None:
            np.testing.assert_array_equal(as_bits(scale), as_bits(expected_scale))
        param[...] = fp8(rng.standard_normal(shape).astype(np.float32) * 3, fmt)  # new weights
        with pytest.raises(shardadam.InvalidArgument, match=r"params \[0, 0 \+ 2\) is not a range"):
            opt.reset_masters(0, 2)
        np.testing.assert_array_equal(as_bits(master), as_bits(loaded))
        opt.reset_masters()
        np.testing.assert_array_equal(as_bits(master), as_bits(reference_start(param, fmt, scaling, scale)))
