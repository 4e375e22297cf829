"""FusedAdam.state is made on first read, and holds the params torch's AdamW would hold: none
before a step; an entry, once read, holds tensors sharing memory with the library's buffers
(each made once, then kept), whichever way it is reached (indexing, get, iteration, items,
copy, pickling). References: the library's own state views (shardadam.Optimizer.state); which
params are held: test_torch_drop_in.py, against torch's AdamW."""
import copy
import pickle

import pytest

torch = pytest.importorskip("torch", reason="the FusedAdam state tests need torch")
from shardadam.torch import FusedAdam  # noqa: E402


def make_params(seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape)) for shape in ((7, 5), (1,), (0,), (3, 2, 4))]


def native_view(opt, param, key):
    return torch.from_dlpack(opt.native.state(opt._entry_of[param].index, key))


def test_no_param_is_a_key_and_no_entry_is_made_before_a_step():
    params = make_params()
    opt = FusedAdam(params)
    assert len(opt.state) == 0 and not opt.state and list(opt.state) == []
    assert not any(p in opt.state for p in params)
    assert torch.nn.Parameter(torch.zeros(1)) not in opt.state
    assert opt.state._views == {}


@pytest.mark.parametrize("read", ["index", "get", "setdefault", "iterate", "items", "values", "copy", "pickle"])
def test_an_entry_read_any_way_shares_memory_with_the_library(read):
    params = make_params(1)
    opt = FusedAdam(params, lr=0.1)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    readers = {
        "index": lambda: [opt.state[p] for p in params],
        "get": lambda: [opt.state.get(p) for p in params],
        "setdefault": lambda: [opt.state.setdefault(p, {}) for p in params],
        "iterate": lambda: [opt.state[p] for p in list(opt.state)],
        "items": lambda: [dict(opt.state.items())[p] for p in params],
        "values": lambda: list(opt.state.values()),
        "copy": lambda: [opt.state.copy()[p] for p in params],
        "pickle": lambda: [opt.state[p] for p in params],
    }
    entries = readers[read]()
    assert len(entries) == len(params)
    for p, entry in zip(params, [opt.state[p] for p in params]):
        assert set(entry) == {"exp_avg", "exp_avg_sq", "step"}
        for key in ("exp_avg", "exp_avg_sq"):
            reference = native_view(opt, p, key)
            assert entry[key].data_ptr() == reference.data_ptr() or p.numel() == 0
            torch.testing.assert_close(entry[key], reference, rtol=0, atol=0)
    if read == "pickle":  # a plain defaultdict(dict) of copies, as torch's state pickles
        restored = pickle.loads(pickle.dumps(opt.state))
        assert type(restored) is type(copy.copy(torch.optim.AdamW(params).state))
        assert len(restored) == len(params)


def test_an_entry_is_made_once_and_writes_to_it_stay():
    params = make_params(2)
    opt = FusedAdam(params)
    first = opt.state[params[0]]
    first["note"] = "kept"
    first["exp_avg"].fill_(3.0)
    assert opt.state[params[0]] is first
    assert torch.all(native_view(opt, params[0], "exp_avg") == 3.0)
    assert [p in opt.state._views for p in params] == [True, False, False, False]
    assert list(opt.state) == [params[0]]  # read by key: a key, as a defaultdict makes it


def test_a_fused_adam_goes_with_its_last_reference():
    """No reference cycle through the lazy state: dropping the last reference frees the
    FusedAdam and its native optimizer at once (its buffers, its communicator and through
    it a torch process group), not at a later garbage collection. A gloo process group
    freed only at interpreter exit aborts the process (a gloo worker thread then needs the
    GIL to finish its last work)."""
    import gc
    import weakref

    params = make_params()
    for p in params:
        p.grad = torch.ones_like(p)
    gc.collect()
    gc.disable()
    try:
        opt = FusedAdam(params)
        opt.step()
        opt.load_state_dict(opt.state_dict())
        _ = opt.state[params[0]]
        refs = weakref.ref(opt), weakref.ref(opt.native)
        del opt, _
        assert [ref() is None for ref in refs] == [True, True]
    finally:
        gc.enable()


def test_a_state_read_after_its_optimizer_went_is_an_error():
    params = make_params()
    opt = FusedAdam(params)
    state = opt.state
    del opt
    import gc
    gc.collect()
    with pytest.raises(ReferenceError, match="FusedAdam"):
        state[params[0]]
