"""shardadam.Optimizer's grads: every grad is checked when bound, set_grads binds all of them
in one call (all or nothing), None means "no grad" and the step skips the param; no path
takes raw addresses. References: the float64 AdamW of adam_reference.py."""
import numpy as np
import pytest

import shardadam
from adam_reference import AdamReference


def test_set_grads_refuses_raw_addresses():
    w = np.zeros((4, 8), np.float32)
    g = np.ones((1, 8), np.float32)  # 8 floats where the param needs 32
    with shardadam.Optimizer() as opt:
        opt.add_param("w", w)
        with pytest.raises(TypeError, match="address"):
            opt.set_grads([g.ctypes.data])


def test_set_grads_checks_every_grad_and_binds_all_or_nothing():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((4, 8)).astype(np.float32)
    v = rng.standard_normal(5).astype(np.float32)
    ref_w, ref_v = AdamReference(w, lr=1e-2), AdamReference(v, lr=1e-2)
    gw, gv = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    with shardadam.Optimizer(lr=1e-2) as opt:
        opt.add_param("w", w)
        opt.add_param("v", v)
        with pytest.raises(shardadam.StateError):
            opt.step()  # never bound: an error, not a skip
        opt.set_grads([gw, gv])
        other_w, other_v = np.ones((4, 8), np.float32), np.ones(5, np.float32)
        bad_w = [rng.standard_normal((8, 4)).astype(np.float32).T,                 # transposed
                 np.broadcast_to(rng.standard_normal(8).astype(np.float32), (4, 8)),  # expanded
                 rng.standard_normal((4, 8)),                                     # float64
                 np.ones((2, 8), np.float32)]                                     # too small
        bad_v = [np.ones(10, np.float32)[::2],                                    # strided
                 np.ones(6, np.float32)]                                          # too large
        for bad in bad_w:  # the second entry is fine: it must not be bound either
            with pytest.raises(shardadam.Error, match="'w'"):
                opt.set_grads([bad, other_v])
        for bad in bad_v:  # the first entry is fine: it must not be bound either
            with pytest.raises(shardadam.Error, match="'v'"):
                opt.set_grads([other_w, bad])
        opt.step()  # with the grads of the last successful call
        ref_w.step(gw)
        ref_v.step(gv)
        np.testing.assert_allclose(w, ref_w.p, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(v, ref_v.p, rtol=1e-5, atol=1e-6)


def test_a_none_grad_skips_the_param_and_clear_grad_too():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((4, 8)).astype(np.float32)
    v = rng.standard_normal(5).astype(np.float32)
    ref_w, ref_v = AdamReference(w), AdamReference(v)
    with shardadam.Optimizer() as opt:
        opt.add_param("w", w)
        opt.add_param("v", v)
        for step in range(6):
            gw = rng.standard_normal((4, 8)).astype(np.float32)
            gv = rng.standard_normal(5).astype(np.float32) if step % 2 == 0 else None
            opt.set_grads([gw, gv])
            opt.step()
            ref_w.step(gw)
            if gv is not None:
                ref_v.step(gv)
        np.testing.assert_allclose(w, ref_w.p, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(v, ref_v.p, rtol=1e-5, atol=1e-6)
        # clear_grad: "no grad" for one param; set_grad(None) is the same.
        opt.set_grads([rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal(5).astype(np.float32)])
        opt.clear_grad("v")
        before = v.copy()
        opt.step()
        assert np.array_equal(v, before)
        opt.set_grad("v", rng.standard_normal(5).astype(np.float32))
        opt.set_grad("v", None)
        opt.step()
        assert np.array_equal(v, before)
