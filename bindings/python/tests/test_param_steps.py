"""Per-param step counts through the Python face: param_steps() reports what each param has
taken, set_param_steps() sets them (as a torch state dict with steps [6, 6, 3] does), and
each param's bias correction follows its own count (float64 reference)."""
import numpy as np
import pytest

import shardadam
from adam_reference import AdamReference

HYPER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)


def test_each_param_steps_at_its_own_count():
    rng = np.random.default_rng(11)
    params = [rng.standard_normal(s).astype(np.float32) for s in [(4, 3), (5,), (2, 2)]]
    grads = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
    initial = [p.copy() for p in params]
    with shardadam.Optimizer(**HYPER) as opt:
        for i, p in enumerate(params):
            opt.add_param(f"p{i}", p)
            opt.set_grad(i, grads[i])
        assert opt.param_steps() == [0, 0, 0]
        opt.set_param_steps([6, 6, 3])
        refs = []
        for p, g, t in zip(params, grads, [6, 6, 3]):
            ref = AdamReference(p, **HYPER)
            ref.t = t  # fresh moments at a late count: bias correction dominates
            ref.step(g)
            refs.append(ref)
        opt.step()
        assert opt.param_steps() == [7, 7, 4]
        assert opt.param_groups[0].step == 1
        for p, ref in zip(params, refs):
            np.testing.assert_allclose(p, ref.p, rtol=1e-6, atol=1e-7)
        # The tolerance tells counts apart: param 2 stepped at count 6 (its group-mates')
        # instead of its own 3 lands far outside it.
        wrong = AdamReference(initial[2], **HYPER)
        wrong.t = 6
        wrong.step(grads[2])
        assert not np.allclose(params[2], wrong.p, rtol=1e-6, atol=1e-7)

def test_set_param_steps_checks_everything_first():
    with shardadam.Optimizer() as opt:
        for i in range(3):
            opt.add_param(f"p{i}", np.zeros(2, np.float32))
        opt.set_param_steps([1, 2, 3])
        with pytest.raises(shardadam.InvalidArgument, match=r"steps\[1\] \(param 'p2'\) is -1"):
            opt.set_param_steps([5, -1], first=1)
        with pytest.raises(shardadam.InvalidArgument, match="not a range of params"):
            opt.set_param_steps([1, 1, 1, 1])
        assert opt.param_steps() == [1, 2, 3]
        opt.param_groups[0].step = 9
        assert opt.param_steps() == [9, 9, 9]


def test_step_params_steps_only_its_params_each_at_its_own_count():
    """A partial step (by name or index) updates its params as the float64 reference does and
    leaves the others bit for bit; counts advance per param, the group's stays; bad input
    changes nothing."""
    rng = np.random.default_rng(12)
    params = [rng.standard_normal(s).astype(np.float32) for s in [(4, 3), (5,), (2, 2)]]
    refs = [AdamReference(p, **HYPER) for p in params]
    with shardadam.Optimizer(**HYPER) as opt:
        for i, p in enumerate(params):
            opt.add_param(f"p{i}", p)
        for parts in ([["p0", 2], [1]], [[1, 0], [2]], [[0, 1, 2]]):
            grads = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
            opt.set_grads(grads)
            for part in parts:
                stepped = {opt.param_index(p) for p in part}
                before = [p.copy() for p in params]
                opt.step_params(part)
                for i, p in enumerate(params):
                    if i in stepped:
                        refs[i].step(grads[i])
                        np.testing.assert_allclose(p, refs[i].p, rtol=1e-5, atol=1e-6)
                    else:
                        np.testing.assert_array_equal(p, before[i])
        assert opt.param_steps() == [3, 3, 3]
        assert opt.param_groups[0].step == 0  # partial steps leave the group's count
        before = [p.copy() for p in params]
        with pytest.raises(shardadam.InvalidArgument, match=r"params\[1\] is 0 again"):
            opt.step_params([0, 0])
        with pytest.raises(shardadam.InvalidArgument, match="no param is named 'nope'"):
            opt.step_params(["nope"])
        with pytest.raises(TypeError, match="sequence of param names or indices"):
            opt.step_params("p0")
        assert opt.step_params([0], found_inf=1.0, return_skipped=True) is True
        for p, b in zip(params, before):
            np.testing.assert_array_equal(p, b)
        assert opt.param_steps() == [3, 3, 3]
