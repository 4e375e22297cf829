"""save / load / inspect over the library's shard files (sa_optimizer_export / import).

Skipped, with the reason, when the library lacks state export/import or reports it
unimplemented."""
import json

import numpy as np
import pytest

import shardadam
from shardadam import Mesh, Shard

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05)


def make(rng_values, **options):
    """An optimizer over copies of the given arrays, grads bound to fresh buffers."""
    opt = shardadam.Optimizer(**HYPER)
    params, grads = {}, {}
    for name, value in rng_values.items():
        params[name] = value.copy()
        grads[name] = np.zeros_like(value)
        opt.add_param(name, params[name], **options)
        opt.set_grad(name, grads[name])
    return opt, params, grads


def train(opt, grads, rng, steps):
    for _ in range(steps):
        for grad in grads.values():
            np.copyto(grad, rng.standard_normal(grad.shape).astype(grad.dtype))
        opt.step()


def test_save_load_resumes_bit_for_bit(tmp_path, rng):
    """Saving after 5 steps, loading into a fresh optimizer (same param values) and
    continuing gives exactly the params of an uninterrupted run."""
    values = {"layers.0.w": rng.standard_normal((5, 7)).astype(np.float32),
              "layers.0.b": rng.standard_normal(7).astype(np.float32)}
    first, params, grads = make(values)
    grad_rng = np.random.default_rng(1)
    train(first, grads, grad_rng, 5)
    path = tmp_path / "rank0.safetensors"
    first.save(path)
    resumed, resumed_params, resumed_grads = make({k: v.copy() for k, v in params.items()})
    resumed.param_groups[0].lr = 0.5  # restored from the file
    resumed.load(path)
    assert resumed.param_groups[0].step == 5 and resumed.param_groups[0].lr == HYPER["lr"]
    for name in values:
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(resumed.state(name, key).numpy(), first.state(name, key).numpy())
    continue_rng = np.random.default_rng(2)
    train(first, grads, continue_rng, 5)
    train(resumed, resumed_grads, np.random.default_rng(2), 5)
    for name in values:
        np.testing.assert_array_equal(resumed_params[name], params[name])
    first.close()
    resumed.close()


def test_two_ranks_saved_load_into_one(tmp_path, rng):
    """Resharding: rows split 3/2 over two ranks (torch.chunk of 5), loaded unsharded."""
    full = rng.standard_normal((5, 4)).astype(np.float32)
    paths, saved = [], []
    for rank, rows in enumerate([slice(0, 3), slice(3, 5)]):
        with shardadam.Optimizer(**HYPER) as opt:
            shard = full[rows].copy()
            opt.add_param("w", shard, layout=Mesh((2,), (rank,), [Shard(0)], global_shape=full.shape))
            opt.set_grad("w", np.full(shard.shape, 0.5 + rank, np.float32))
            opt.step()
            saved.append(opt.state("w", "exp_avg").numpy().copy())
            paths.append(tmp_path / f"rank{rank}.safetensors")
            opt.save(paths[-1])
    with shardadam.Optimizer(**HYPER) as whole:
        whole.add_param("w", full.copy())
        whole.load(paths)
        np.testing.assert_array_equal(whole.state("w", "exp_avg").numpy(), np.concatenate(saved))
        assert whole.param_groups[0].step == 1
    report = shardadam.inspect(paths)
    assert isinstance(report, dict) and "w/exp_avg" in json.dumps(report)


def test_shard_files_are_safetensors(tmp_path, rng):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    with shardadam.Optimizer(**HYPER) as opt:
        opt.add_param("w", rng.standard_normal((3, 2)).astype(np.float32))
        opt.set_grad("w", np.ones((3, 2), np.float32))
        opt.step()
        opt.save(tmp_path / "rank0.safetensors")
        tensors = safetensors_numpy.load_file(str(tmp_path / "rank0.safetensors"))
        np.testing.assert_array_equal(tensors["w/exp_avg"], opt.state("w", "exp_avg").numpy())


def test_load_errors_raise_their_class(tmp_path, rng):
    with shardadam.Optimizer(**HYPER) as opt:
        opt.add_param("w", np.zeros(3, np.float32))
        with pytest.raises(shardadam.IoError):
            opt.load(tmp_path / "missing.safetensors")
        garbage = tmp_path / "garbage.safetensors"
        garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
        with pytest.raises(shardadam.FormatError):
            opt.load(garbage)
        other = tmp_path / "other.safetensors"
        with shardadam.Optimizer(**HYPER) as writer:
            writer.add_param("v", np.zeros(3, np.float32))
            writer.save(other)
        with pytest.raises(shardadam.Error, match="'w'"):
            opt.load(other)  # w is missing from the file
        opt.load(other, allow_missing=True, allow_unexpected=True)


def test_load_takes_more_import_options_by_field_name(tmp_path, rng):
    """load(fields=...) reaches sa_import_options by the library's names: allow_missing by
    name lets a param absent from the file keep its state, restore_groups 0 by name keeps
    the groups (over the keyword's True), the library refuses a flag of 2, and an unknown
    name is a KeyError before anything is read."""
    path = tmp_path / "rank0.safetensors"
    with shardadam.Optimizer(**HYPER) as writer:
        writer.add_param("w", rng.standard_normal(6).astype(np.float32))
        writer.set_grad("w", np.ones(6, np.float32))
        writer.step()
        writer.save(path)
        saved = writer.state("w", "exp_avg").numpy().copy()
    with shardadam.Optimizer(**HYPER) as opt:
        opt.add_param("w", np.zeros(6, np.float32))
        opt.add_param("extra", np.zeros(3, np.float32))
        opt.param_groups[0].lr = 0.5
        with pytest.raises(shardadam.Error, match="'extra'"):
            opt.load(path)
        with pytest.raises(shardadam.InvalidArgument, match="allow_missing is 2"):
            opt.load(path, fields={"allow_missing": 2})
        with pytest.raises(KeyError, match="allow_missed"):
            opt.load(path, fields={"allow_missed": 1})
        assert not opt.state("w", "exp_avg").numpy().any()  # nothing changed so far
        opt.load(path, fields={"allow_missing": 1, "restore_groups": 0})
        np.testing.assert_array_equal(opt.state("w", "exp_avg").numpy(), saved)
        assert opt.param_groups[0].lr == 0.5 and opt.param_groups[0].step == 0


def test_moments_as_float32_values_through_numpy():
    """moment_values / set_moment_values on numpy arrays (real DLPack), for float32 and 8-bit
    moments: float32 ones are the state itself; an 8-bit one written back from its values is
    unchanged, and checkpoint_keys leaves out its block absmax."""
    import numpy as np

    rng = np.random.default_rng(4)
    opt = shardadam.Optimizer(lr=1e-2, num_threads=1)
    w32 = rng.standard_normal(700).astype(np.float32)
    w8 = w32.copy()
    opt.add_param("f32", w32)
    opt.add_param("q8", w8, moment_dtype="uint8")
    for _ in range(2):
        g = rng.standard_normal(700).astype(np.float32)
        opt.set_grads([g, g.copy()])
        opt.step()
    assert opt.checkpoint_keys("q8") == ("exp_avg", "exp_avg_sq")
    assert opt.moment_keys("q8") == opt.moment_keys("f32") == ("exp_avg", "exp_avg_sq")
    assert "exp_avg_absmax" in opt.state_keys("q8")
    out = np.empty(700, dtype=np.float32)
    opt.moment_values("f32", "exp_avg", out)
    assert np.array_equal(out, np.from_dlpack(opt.state("f32", "exp_avg")))
    codes = np.from_dlpack(opt.state("q8", "exp_avg")).copy()
    absmax = np.from_dlpack(opt.state("q8", "exp_avg_absmax")).copy()
    values = opt.moment_values("q8", "exp_avg", np.empty(700, dtype=np.float32))
    # Within one code step of the float32 optimizer's moment (the two trained alike).
    assert np.max(np.abs(values - out)) <= 0.1 * float(absmax.max())
    opt.set_moment_values("q8", "exp_avg", values)
    assert np.array_equal(np.from_dlpack(opt.state("q8", "exp_avg")), codes)
    assert np.array_equal(np.from_dlpack(opt.state("q8", "exp_avg_absmax")), absmax)
    with pytest.raises(shardadam.InvalidArgument, match="local shape"):
        opt.set_moment_values("q8", "exp_avg", np.zeros(699, dtype=np.float32))
    with pytest.raises(shardadam.InvalidArgument, match="no moment 'master'"):
        opt.moment_values("q8", "master", out)
    opt.close()


def test_save_without_waiting_writes_the_state_of_the_call(tmp_path, rng):
    """save(wait=False) returns a SaveJob; steps taken before its wait() do not reach the
    file, which is byte for byte the synchronous save of the same moment and loads back
    that moment's state."""
    values = {"w": rng.standard_normal((64, 33)).astype(np.float32), "b": rng.standard_normal(33).astype(np.float32)}
    opt, params, grads = make(values)
    train(opt, grads, np.random.default_rng(3), 2)
    reference = tmp_path / "sync.safetensors"
    opt.save(reference)
    moments = {name: opt.state(name, "exp_avg").numpy().copy() for name in values}
    path = tmp_path / "async.safetensors"
    job = opt.save(path, wait=False)
    assert isinstance(job, shardadam.SaveJob) and job.path == str(path)
    train(opt, grads, np.random.default_rng(4), 3)  # the state moves on while the job writes
    job.wait()
    job.wait()  # again: nothing more to wait for
    assert job.done() and "done" in repr(job)
    assert path.read_bytes() == reference.read_bytes()
    with shardadam.Optimizer(**HYPER) as loaded:
        for name, value in values.items():
            loaded.add_param(name, value.copy())
        loaded.load(path)
        assert loaded.param_groups[0].step == 2
        for name in values:
            np.testing.assert_array_equal(loaded.state(name, "exp_avg").numpy(), moments[name])
            assert not np.array_equal(opt.state(name, "exp_avg").numpy(), moments[name])
    opt.close()


def test_a_save_that_fails_in_the_background_raises_from_wait_and_leaves_no_file(tmp_path, rng):
    """A file size limit (RLIMIT_FSIZE, as a full disk would) makes the job's writes fail
    after save(wait=False) returned: wait() and done() raise IoError with the library's
    message, and neither the file nor its temporary file is left."""
    resource = pytest.importorskip("resource")
    import signal

    opt, _, grads = make({"w": rng.standard_normal((256, 1024)).astype(np.float32)})
    train(opt, grads, rng, 1)
    path = tmp_path / "rank0.safetensors"
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        job = opt.save(path, wait=False)
        with pytest.raises(shardadam.IoError, match="sa_optimizer_export_async"):
            job.wait()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    with pytest.raises(shardadam.IoError):
        job.done()
    assert "failed" in repr(job)
    assert list(tmp_path.iterdir()) == []
    opt.save(path)  # the optimizer is unharmed
    assert path.stat().st_size > 256 * 1024 * 8
    opt.close()


def test_closing_with_a_save_in_flight_finishes_the_save(tmp_path, rng):
    opt, _, grads = make({"w": rng.standard_normal((512, 1024)).astype(np.float32)})
    train(opt, grads, rng, 1)
    reference = tmp_path / "sync.safetensors"
    opt.save(reference)
    job = opt.save(tmp_path / "async.safetensors", wait=False)
    opt.close()
    job.wait()
    assert (tmp_path / "async.safetensors").read_bytes() == reference.read_bytes()


def test_load_read_once(tmp_path, rng):
    """read_once with data larger than the staging buffer loads the same state; a damaged
    last block is a FormatError found while copying, which leaves the optimizer refusing to
    step until a load succeeds (the default, verify first, leaves it unchanged)."""
    values = {"w": rng.standard_normal((512, 1024)).astype(np.float32)}  # 2 MiB per state
    opt, _, grads = make(values)
    train(opt, grads, rng, 2)
    path = tmp_path / "rank0.safetensors"
    opt.save(path)
    saved = opt.state("w", "exp_avg_sq").numpy().copy()
    loaded, _, _ = make(values)
    loaded.load(path, staging_bytes=2 << 20, read_once=True)
    np.testing.assert_array_equal(loaded.state("w", "exp_avg_sq").numpy(), saved)
    damaged = tmp_path / "damaged.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x08
    damaged.write_bytes(bytes(data))
    fresh, _, fresh_grads = make(values)
    with pytest.raises(shardadam.FormatError, match="corrupt"):
        fresh.load(damaged, staging_bytes=2 << 20)  # verify first: nothing changed
    fresh.step()
    with pytest.raises(shardadam.FormatError, match="partly overwritten"):
        fresh.load(damaged, staging_bytes=2 << 20, read_once=True)
    with pytest.raises(shardadam.StateError, match="unusable"):
        fresh.step()
    fresh.load(path, staging_bytes=2 << 20, read_once=True)
    fresh.step()
    for o in (opt, loaded, fresh):
        o.close()
