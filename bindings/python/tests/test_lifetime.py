"""Who keeps what alive: params stay alive while the optimizer uses them, grads while they
are bound, state views after the optimizer is gone; and nothing leaks over 10,000 steps."""
import gc
import os
import sys
import tracemalloc
import weakref

import numpy as np
import pytest

import shardadam
from adam_reference import AdamReference

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05)


def test_a_deleted_param_array_lives_on_and_is_updated(rng):
    """`del` on the Python side does not free a param: the optimizer holds its DLPack
    tensor (which holds the array) until it is closed."""
    w = rng.standard_normal((6, 5)).astype(np.float32)
    ref = AdamReference(w, **HYPER)
    grad = np.zeros_like(w)
    alive = weakref.ref(w)
    baseline = sys.getrefcount(w)
    opt = shardadam.Optimizer(**HYPER)
    opt.add_param("w", w)
    assert sys.getrefcount(w) == baseline + 1  # exactly one reference, the optimizer's
    opt.set_grad("w", grad)
    del w
    gc.collect()
    assert alive() is not None
    for _ in range(10):
        np.copyto(grad, rng.standard_normal(grad.shape).astype(np.float32))
        ref.step(grad)
        opt.step()  # writes into the array nobody on the Python side names any more
    np.testing.assert_allclose(alive(), ref.p, rtol=1e-5, atol=2e-6)
    opt.close()
    gc.collect()
    assert alive() is None


def test_the_optimizer_releases_its_params_when_collected():
    w = np.zeros(3, np.float32)
    baseline = sys.getrefcount(w)
    opt = shardadam.Optimizer()
    opt.add_param("w", w)
    del opt
    gc.collect()
    assert sys.getrefcount(w) == baseline


def test_a_bound_grad_lives_until_rebound(rng):
    """set_grad keeps the grad alive: the library reads its memory at every step."""
    with shardadam.Optimizer() as opt:
        opt.add_param("w", np.zeros(4, np.float32))
        first = np.ones(4, np.float32)
        alive = weakref.ref(first)
        opt.set_grad("w", first)
        del first
        gc.collect()
        assert alive() is not None
        opt.step()
        opt.set_grad("w", np.ones(4, np.float32))
        gc.collect()
        assert alive() is None


def test_state_views_outlive_the_optimizer(rng):
    w = rng.standard_normal(7).astype(np.float32)
    opt = shardadam.Optimizer()
    opt.add_param("w", w)
    opt.set_grad("w", rng.standard_normal(7).astype(np.float32))
    opt.step()
    exp_avg = np.from_dlpack(opt.state("w", "exp_avg"))
    expected = exp_avg.copy()
    state = opt.state("w", "exp_avg_sq")  # made, not yet consumed
    opt.close()
    gc.collect()
    np.testing.assert_array_equal(exp_avg, expected)
    assert np.all(np.from_dlpack(state) > 0)  # its first capsule was taken while open
    with pytest.raises(shardadam.StateError, match="closed"):
        np.from_dlpack(state)  # a second one needs the optimizer


def test_state_views_share_memory_with_the_optimizer(rng):
    with shardadam.Optimizer() as opt:
        opt.add_param("w", np.zeros(5, np.float32))
        view = opt.state("w", "exp_avg")
        array = np.from_dlpack(view)
        assert array.ctypes.data == view.data_ptr
        array[:] = 3.0
        assert np.all(opt.state("w", "exp_avg").numpy() == 3.0)
        assert np.shares_memory(np.asarray(opt.state("w", "exp_avg")), array)


class LegacyProducer:
    """A producer of the pre-1.0 protocol: __dlpack__ knows no max_version."""

    def __init__(self, array):
        self.array = array
        self.calls = []

    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class LegacyConsumer:
    """Asks for a capsule the pre-1.0 way (no max_version)."""

    def __init__(self, producer):
        self.capsule = producer.__dlpack__()

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def test_legacy_producers_and_consumers(rng):
    w = rng.standard_normal(6).astype(np.float32)
    producer = LegacyProducer(w)
    alive = weakref.ref(w)
    del w
    with shardadam.Optimizer() as opt:
        opt.add_param("w", producer)  # through sa_optimizer_add_param_legacy
        assert producer.calls == [None]
        del producer
        gc.collect()
        assert alive() is not None
        opt.set_grad("w", LegacyProducer(np.ones(6, np.float32)))
        opt.step()
        consumer = LegacyConsumer(opt.state("w", "exp_avg"))
        assert '"dltensor"' in repr(consumer.capsule)
        np.testing.assert_allclose(np.from_dlpack(consumer), 0.1)  # (1 - beta1) * grad
    gc.collect()
    assert alive() is None


class FakeCudaProducer:
    """Claims a CUDA device to observe the stream handshake (returns a host capsule)."""

    def __init__(self, array):
        self.array = array
        self.kwargs = []

    def __dlpack__(self, **kwargs):
        self.kwargs.append(kwargs)
        return self.array.__dlpack__(max_version=kwargs.get("max_version"))

    def __dlpack_device__(self):
        return (2, 0)


def test_cuda_producers_get_the_optimizers_stream():
    """The DLPack handshake: __dlpack_device__ first, then stream= for CUDA producers only
    (1, the legacy default stream, unless a stream is given), max_version=(1, 0)."""
    with shardadam.Optimizer(stream=0xABC) as opt:
        default_stream = FakeCudaProducer(np.zeros(2, np.float32))
        opt.add_param("a", default_stream, stream=0)
        assert default_stream.kwargs == [{"max_version": (1, 0), "stream": 1}]
        own_stream = FakeCudaProducer(np.zeros(2, np.float32))
        opt.add_param("b", own_stream)
        assert own_stream.kwargs == [{"max_version": (1, 0), "stream": 0xABC}]


def _rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the RSS from /proc")
def test_no_leak_over_10k_steps(rng, capsys):
    """10,000 iterations of every per-step path (bind all grads in one checked call, one
    of them as "no grad"; bind one by one through DLPack; step with array scalars; make and
    consume a state view): Python allocations (tracemalloc) and the process RSS must not
    grow."""
    w = rng.standard_normal((64, 33)).astype(np.float32)
    b = rng.standard_normal(17).astype(np.float32)
    grads = [np.full(w.shape, 1e-3, np.float32), np.full(b.shape, 1e-3, np.float32)]
    inv_scale = np.ones(1, np.float32)
    found_inf = np.zeros(1, np.float32)
    opt = shardadam.Optimizer(num_threads=1)
    opt.add_param("w", w)
    opt.add_param("b", b)

    def iteration(i):
        if i % 2:
            opt.set_grads(grads if i % 4 == 1 else [grads[0], None])
        else:
            opt.set_grad("w", grads[0])
            opt.set_grad("b", grads[1])
        opt.step(inv_grad_scale=inv_scale, found_inf=found_inf)
        np.from_dlpack(opt.state("w", "exp_avg")).sum()

    for i in range(500):  # warm-up: allocator pools, caches
        iteration(i)
    gc.collect()
    tracemalloc.start()
    traced_before = tracemalloc.get_traced_memory()[0]
    rss_before = _rss_bytes()
    for i in range(10_000):
        iteration(i)
    gc.collect()
    traced_growth = tracemalloc.get_traced_memory()[0] - traced_before
    rss_growth = _rss_bytes() - rss_before
    tracemalloc.stop()
    opt.close()
    with capsys.disabled():
        print(f"\n[leak check] 10,000 steps: tracemalloc growth {traced_growth} B, "
              f"RSS growth {rss_growth / 1024:.0f} KiB (before {rss_before / 2**20:.1f} MiB)")
    assert traced_growth < 16 * 1024  # a leaked Python object per step would be >= 10,000 x 16 B
    assert rss_growth < 512 * 1024    # a leaked capsule or view per step would be >= 10,000 x 64 B
