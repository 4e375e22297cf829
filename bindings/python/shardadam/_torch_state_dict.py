"""FusedAdam's state dict: a ``state_dict()`` that torch.optim.AdamW and DCP's strict planner
accept, an atomic ``load_state_dict()``, and fp32 master weights kept in step with params
that were loaded after the optimizer (imported by _torch_fused_adam; needs torch).

The functions take the FusedAdam as their first argument; FusedAdam's methods call them.
"""
import math
import numbers
import weakref
from collections import defaultdict
from collections.abc import ItemsView, Mapping, ValuesView

import torch

from . import _torch_fused_adam as _fused
from ._dlpack import BLOCK_MOMENT_DTYPES
from ._errors import Error
from ._optimizer import Optimizer

try:
    from torch.distributed.tensor import DTensor
    from torch.distributed.checkpoint import DefaultLoadPlanner
except ImportError:  # torch built without distributed
    DTensor = None
    DefaultLoadPlanner = object

# States a checkpoint of another optimizer lacks and that are derived from the param when
# absent: the fp32 master is the param's value, the int16 remainder (the low half of that
# fp32 value) is zero.
_DERIVED_STATES = ("master", "remainder")


# ---- per-param steps ---------------------------------------------------------------------------
def param_steps(optimizer):
    """Each param's step count, by native index (on CUDA this may synchronize)."""
    return optimizer.native.param_steps()


def set_param_steps(optimizer, steps):
    """Sets each param's step count (a sequence by native index); group counts stay."""
    optimizer.native.set_param_steps(list(steps))


def _step_tensor(count):
    """A step count as ``state[p]["step"]`` reads: a new 0-dim float32 tensor, as torch's
    Adam keeps it, made in inference mode so that an in-place write to it (``fill_``,
    ``+= 1``) raises instead of changing a copy that the library never reads."""
    with torch.inference_mode():
        return torch.tensor(float(count), dtype=torch.float32)


_LIVE_STEP = object()  # what a _ParamState holds under "step": the count lives in the library


class _ParamState(dict):
    """``state[p]`` of one FusedAdam param: its states (``exp_avg``, ...) as tensors sharing
    memory with the library's buffers, and ``"step"``, the param's own step count, which
    lives in the library: every read returns its current count (a new tensor; the steps
    never write into a Python object, so a step costs nothing per param here), and an
    assignment ``state[p]["step"] = n`` sets it (bias correction then uses ``n``). An
    in-place write to a read step tensor raises (see :func:`_step_tensor`).

    Other keys behave as in a dict. Pickled or copied, it is a plain dict of its current
    values."""

    __slots__ = ("_optimizer", "_index")

    def __init__(self, optimizer, index, views):
        super().__init__(views)
        dict.__setitem__(self, "step", _LIVE_STEP)
        self._optimizer, self._index = weakref.ref(optimizer), index

    def _native(self):
        optimizer = self._optimizer()
        if optimizer is None:
            raise ReferenceError("FusedAdam.state: the optimizer this step count belongs to was freed")
        return optimizer.native

    def tensors(self):
        """(key, tensor) of the states the library holds, without the step count."""
        return [(key, value) for key, value in dict.items(self) if value is not _LIVE_STEP]

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        return _step_tensor(self._native().param_steps(self._index, 1)[0]) if value is _LIVE_STEP else value

    def __setitem__(self, key, value):
        if key == "step":
            native = self._native()
            count = _step_count(self._optimizer()._entries[self._index], value, "FusedAdam.state")
            native.set_param_steps([count], self._index)
            return
        dict.__setitem__(self, key, value)

    def __delitem__(self, key):
        if key == "step":
            raise KeyError("FusedAdam.state: a param's 'step' cannot be removed (it lives in the library); assign "
                           "0 to restart its bias correction")
        dict.__delitem__(self, key)

    def pop(self, key, *default):
        if key == "step" and key in self:
            del self[key]  # raises
        return dict.pop(self, key, *default)

    def popitem(self):
        raise KeyError("FusedAdam.state: popitem() would remove the step count, which lives in the library")

    def get(self, key, default=None):
        return self[key] if key in self else default

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __iter__(self):  # defined, so that dict(state) and {**state} read through __getitem__
        return dict.__iter__(self)

    def items(self):
        return ItemsView(self)

    def values(self):
        return ValuesView(self)

    def copy(self):
        return {key: self[key] for key in self}

    def __eq__(self, other):
        return isinstance(other, Mapping) and self.copy() == dict(other.items())

    __hash__ = None

    def __repr__(self):
        return repr(self.copy())

    def __reduce__(self):
        return (dict, (self.copy(),))


def state_views(optimizer, entry):
    """The ``state[p]`` of a registered param: its states as tensors sharing memory with the
    library's buffers (DTensors with the param's mesh and placements) and its live step
    count (a :class:`_ParamState`)."""
    native = optimizer.native
    views = {}
    for key in native.state_keys(entry.index):
        local = torch.from_dlpack(native.state(entry.index, key))
        # A state of another shape than the param's (the per-block absmax of an 8-bit
        # moment) is this rank's own: no DTensor describes it.
        if entry.mesh is not None and tuple(local.shape) == tuple(entry.local_shape):
            param = entry.param
            views[key] = DTensor.from_local(local, entry.mesh, entry.placements, run_check=False,
                                            shape=param.shape, stride=param.stride())
        else:
            views[key] = local
    return _ParamState(optimizer, entry.index, views)


class LazyStates(defaultdict):
    """``FusedAdam.state``: torch's ``defaultdict(dict)`` of per-param states.

    Which params it holds is torch's rule: a param is a key once it has state in torch's
    sense, i.e. once a step updated it (its step count is above 0), a load gave it a state,
    or it was read by key (a ``defaultdict`` makes an entry on a read). So ``len(state)`` is
    0 before the first step, as with ``torch.optim.AdamW``, and helpers that test
    ``if optim.state`` (DCP's and torchtitan's state initialization) see what they expect.
    The library allocates every param's state when the param is added; a param that is
    not a key yet is only not shown.

    An entry (a :class:`_ParamState`) is made when first needed, not at registration: it
    is a few DLPack views of the library's buffers (DTensors for DTensor params), ~20 us per
    param, most of the cost of building a FusedAdam over many params, while a training loop
    reads none. Once made it is kept (writes into it stay).

    It holds its FusedAdam weakly: a strong reference would be a cycle, and the optimizer
    (its native buffers, its communicator, a process group through that) would outlive its
    last reference until a garbage collection, or the interpreter's exit."""

    def __init__(self, optimizer, existing=()):
        super().__init__(dict, existing)
        self._optimizer = weakref.ref(optimizer)
        self._hidden = {}  # param -> its _Entry: registered params that are not keys (yet)
        self._views = {}   # param -> its _ParamState, once made (a key or not)

    def _owner(self):
        optimizer = self._optimizer()
        if optimizer is None:
            raise ReferenceError("FusedAdam.state: the optimizer it belongs to was freed before this entry was "
                                 "first read; read it (or state_dict()) while the optimizer lives")
        return optimizer

    def register(self, entries):
        """Registers each param of ``entries`` (an iterable of (param, entry) pairs; not a key
        until it has state; clear() before registering again)."""
        self._hidden.update(entries)

    def views(self, param):
        """The entry of a registered param, made if needed, without making it a key (the
        optimizer's own reads)."""
        views = self._views.get(param)
        if views is None:
            views = self._views[param] = state_views(self._owner(), self._owner()._entry_of[param])
        return views

    def _show(self, param):
        del self._hidden[param]
        views = self.views(param)
        dict.__setitem__(self, param, views)
        return views

    def show_only(self, params):
        """Makes exactly ``params`` (registered ones) the keys, in their order: what a load
        leaves (torch's load rebuilds its state from the saved entries)."""
        entry_of = self._owner()._entry_of
        for param in [p for p in dict.keys(self) if p in entry_of]:
            dict.__delitem__(self, param)
            self._hidden[param] = entry_of[param]
        for param in params:
            self._show(param)

    def _show_stepped(self):
        """Makes every hidden param that has taken a step a key (one read of the counts)."""
        if not self._hidden:
            return
        steps = self._owner().native.param_steps()
        for param in [p for p, entry in self._hidden.items() if steps[entry.index] > 0]:
            self._show(param)

    def _has_stepped(self, param):
        entry = self._hidden[param]
        return self._owner().native.param_steps(entry.index, 1)[0] > 0

    def __missing__(self, key):
        if key in self._hidden:
            return self._show(key)  # a read by key makes the entry, as a defaultdict does
        return super().__missing__(key)

    def __contains__(self, key):
        if dict.__contains__(self, key):
            return True
        if key in self._hidden and self._has_stepped(key):
            self._show(key)
            return True
        return False

    def __len__(self):
        self._show_stepped()
        return dict.__len__(self)

    def __bool__(self):
        return len(self) > 0

    def __setitem__(self, key, value):
        self._hidden.pop(key, None)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key):
        if self._hidden.pop(key, None) is None:
            dict.__delitem__(self, key)

    def get(self, key, default=None):
        return self[key] if key in self else default

    def setdefault(self, key, default=None):
        return self[key] if key in self._hidden else dict.setdefault(self, key, default)

    def pop(self, key, *default):
        if key in self:
            self[key]  # noqa: B018 (shows it, so that it is popped below)
        return dict.pop(self, key, *default)

    def clear(self):
        self._hidden.clear()
        self._views.clear()
        dict.clear(self)

    def __iter__(self):
        self._show_stepped()
        return dict.__iter__(self)

    def keys(self):
        self._show_stepped()
        return dict.keys(self)

    def values(self):
        self._show_stepped()
        return dict.values(self)

    def items(self):
        self._show_stepped()
        return dict.items(self)

    def copy(self):
        self._show_stepped()
        return defaultdict(dict, dict.items(self))

    def __eq__(self, other):
        self._show_stepped()
        return dict.__eq__(self, other)

    __hash__ = None

    def __repr__(self):
        self._show_stepped()
        return dict.__repr__(self)

    def __reduce__(self):  # pickles (and deep-copies) as the defaultdict(dict) torch keeps
        self._show_stepped()
        return (defaultdict, (dict,), None, None, iter(dict.items(self)))


# ---- state_dict ----------------------------------------------------------------------------------
def state_dict(optimizer):
    """``torch.optim.Optimizer.state_dict()`` whose states share memory with the library's
    buffers, each param's own ``step`` (a float32 tensor, as torch's AdamW keeps it) and
    block moments as float32 values. Its groups are the live ``param_groups``, which hold
    the keys torch's AdamW's groups hold (FusedAdam's own, ``bias_correction``, only where
    set), so every path that matches saved group keys to live ones round-trips."""
    saved = torch.optim.Optimizer.state_dict(optimizer)
    packed = saved["state"]
    if packed:
        steps = param_steps(optimizer)
        index = 0
        for group in optimizer.param_groups:
            for param in group["params"]:
                state = packed.get(index)
                if state is not None:
                    entry = optimizer._entry_of[param]
                    packed[index] = _saved_state(optimizer, entry, state, steps[entry.index])
                index += 1
    return saved


def _saved_state(optimizer, entry, state, step):
    """One param's state as a state dict holds it: a plain dict (``state`` is the live
    entry), ``step`` a tensor, block moments as values without their absmax."""
    codes, kept = _quantized(optimizer, entry)
    out = {"step": torch.tensor(float(step), dtype=torch.float32)}
    for key, value in (state.tensors() if isinstance(state, _ParamState) else state.items()):
        if kept is not None and key not in kept:
            continue  # a block moment's absmax
        out[key] = _moment_values(optimizer, entry, key) if key in codes else value
    return out


# ---- block moments (8-bit, float8) ----------------------------------------------------------------
# A state dict holds block moments (codes and a per-block absmax: uint8, float8_e4m3fn) as
# the float32 values their codes stand for, of the param's shape (DTensors for DTensor
# params), and not their per-block absmax: so torch.optim.AdamW reads it, DCP reshards it
# like any float32 moment, and a load quantizes it by the local shard's blocks (as a shard
# file's import does with the blocks whose grid is not its own; docs/precision.md).
_BLOCK_MOMENT_DTYPES = frozenset(getattr(torch, name) for name in BLOCK_MOMENT_DTYPES
                                 if isinstance(getattr(torch, name, None), torch.dtype))


def _quantized(optimizer, entry):
    """(the keys of the entry's block moments, the keys checkpoints hold), or (empty, None)
    for an entry with none."""
    codes = {key for key, value in optimizer.state.views(entry.param).tensors()
             if _fused._local_tensor(value).dtype in _BLOCK_MOMENT_DTYPES}
    if not codes:
        return codes, None
    return codes, set(optimizer.native.checkpoint_keys(entry.index))


def _moment_values(optimizer, entry, key):
    """A block moment as float32 values on the device of its state (the param's, or the CPU
    for state offloaded to the host), as the state dict holds it."""
    values = torch.empty(tuple(entry.local_shape), dtype=torch.float32)
    optimizer.native.moment_values(entry.index, key, values)
    values = values.to(_fused._local_tensor(optimizer.state.views(entry.param)[key]).device)
    if entry.mesh is None:
        return values
    param = entry.param
    return DTensor.from_local(values, entry.mesh, entry.placements, run_check=False, shape=param.shape,
                              stride=param.stride())


_FLOAT32_MOMENT = torch.empty((), dtype=torch.float32)  # what a block moment takes in a load


def _loadable_states(optimizer, entry):
    """The states a state dict gives an entry, each with the tensor it is checked against
    (``step``: None): every state but a block moment's absmax, a block moment as float32."""
    codes, kept = _quantized(optimizer, entry)
    current = {key: (_FLOAT32_MOMENT if key in codes else value)
               for key, value in optimizer.state.views(entry.param).tensors() if kept is None or key in kept}
    current["step"] = None
    return current, codes


# ---- load_state_dict: validation -----------------------------------------------------------------
def _where(entry, key):
    return f"param {entry.name!r}" + (f" state {key!r}" if key else "")


def _step_count(entry, value, caller="FusedAdam.load_state_dict"):
    """A saved or assigned step (a number or a one-element tensor) as an int; ValueError
    otherwise."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{caller}: {_where(entry, 'step')} has {value.numel()} elements; expected one")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{caller}: {_where(entry, 'step')} is {value!r}; expected a count")
    if not (math.isfinite(value) and value >= 0 and float(value) == int(value)):
        raise ValueError(f"{caller}: {_where(entry, 'step')} is {value!r}; expected an integer >= 0")
    return int(value)


def _check_state_value(entry, key, target, value):
    """Raises unless ``value`` can be copied into the state ``target`` of ``entry``: a
    tensor whose dtype converts (floating for floating states, int16 for the remainder,
    whose bits are copied) and whose shape is the local one, the global one, or a DTensor
    of the global shape (any mesh and placements)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"FusedAdam.load_state_dict: {_where(entry, key)} is a {type(value).__name__}; expected "
                        "a tensor")
    target_dtype = target.dtype
    convertible = value.dtype == target_dtype if not target_dtype.is_floating_point else \
        value.dtype.is_floating_point
    if not convertible:
        expected = "a floating-point dtype" if target_dtype.is_floating_point else str(target_dtype)
        raise TypeError(f"FusedAdam.load_state_dict: {_where(entry, key)} has dtype {value.dtype}; expected "
                        f"{expected} (the state is {target_dtype})")
    global_shape = tuple(entry.param.shape)
    shape = tuple(value.shape)
    if DTensor is not None and isinstance(value, DTensor):
        if shape != global_shape:
            raise ValueError(f"FusedAdam.load_state_dict: {_where(entry, key)} is a DTensor of global shape "
                             f"{shape}; the param's global shape is {global_shape}")
    elif shape not in (tuple(entry.local_shape), global_shape):
        raise ValueError(f"FusedAdam.load_state_dict: {_where(entry, key)} has shape {shape}; expected the local "
                         f"shape {tuple(entry.local_shape)} or the global shape {global_shape}")


def _required_states(state):
    return [key for key in state if key != "step" and key not in _DERIVED_STATES]


class _Load:
    """A validated load: what each param and group gets. Building it changes nothing."""

    def __init__(self, optimizer, state_dict):
        if not isinstance(state_dict, Mapping) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("FusedAdam.load_state_dict: expected a dict with 'state' and 'param_groups'")
        saved_groups = list(state_dict["param_groups"])
        groups = optimizer.param_groups
        if len(saved_groups) != len(groups):
            raise ValueError(f"FusedAdam.load_state_dict: the state dict has {len(saved_groups)} param groups, the "
                             f"optimizer {len(groups)}")
        for index, (saved, group) in enumerate(zip(saved_groups, groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"FusedAdam.load_state_dict: param group {index} has {len(saved['params'])} params "
                                 f"in the state dict, {len(group['params'])} in the optimizer")
        self.groups = self._check_groups(optimizer, saved_groups)
        saved_states = state_dict["state"]
        self.states = []  # (entry, {key: value} of the saved states to copy, or None: reset; step)
        for saved, group in zip(saved_groups, groups):
            for saved_id, param in zip(saved["params"], group["params"]):
                entry = optimizer._entry_of[param]
                self.states.append((entry,) + self._check_state(optimizer, entry, saved_states.get(saved_id)))

    @staticmethod
    def _check_groups(optimizer, saved_groups):
        """The new hyperparameters of each group (the saved keys over the current ones; a key
        the state dict lacks, e.g. FusedAdam's bias_correction in a torch checkpoint, keeps
        its current value), checked by the library on a scratch optimizer."""
        ignored = {"params", "param_names", *_fused.IMPLEMENTATION_DEFAULTS}
        merged = []
        for index, (saved, group) in enumerate(zip(saved_groups, optimizer.param_groups)):
            new = {key: value for key, value in saved.items() if key not in ignored}
            candidate = {**group, **new}
            try:
                hyperparameters = optimizer._library_hyperparameters(candidate)
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"FusedAdam.load_state_dict: param group {index}: {err!r}") from err
            # Fields the group's params' state was allocated by (amsgrad) cannot change.
            fixed = optimizer._fixed_keys() if group["params"] else ()
            current = optimizer.native.param_groups[index].config() if fixed else {}
            for key in fixed:
                if hyperparameters[key] != current[key]:
                    raise ValueError(f"FusedAdam.load_state_dict: param group {index} has {key}="
                                     f"{hyperparameters[key]} in the state dict, {current[key]} in the "
                                     "optimizer (fixed once a group holds params: its states differ)")
            merged.append((new, hyperparameters))
        scratch = None
        try:  # the library's own range checks, on an optimizer of its own: this one does not change
            for index, (_, hyperparameters) in enumerate(merged):
                try:
                    if scratch is None:
                        scratch = Optimizer(**hyperparameters, num_threads=1)
                    else:
                        scratch.add_group(**hyperparameters)
                except Error as err:
                    raise ValueError(f"FusedAdam.load_state_dict: param group {index}: {err}") from err
        finally:
            if scratch is not None:
                scratch.close()
        return [new for new, _ in merged]

    @staticmethod
    def _check_state(optimizer, entry, saved):
        """(states to copy, step) of one param; (None, 0) when the state dict has none for it."""
        if not saved:
            return None, 0
        if not isinstance(saved, Mapping):
            raise TypeError(f"FusedAdam.load_state_dict: the state of {_where(entry, None)} is a "
                            f"{type(saved).__name__}; expected a dict")
        current, _ = _loadable_states(optimizer, entry)
        unknown = [key for key in saved if key != "step" and key not in current]
        if unknown:
            raise KeyError(f"FusedAdam.load_state_dict: {_where(entry, None)} has no state {unknown[0]!r} (it has "
                           f"{sorted(k for k in current if k != 'step')})")
        # torch.optim.Muon keeps no step (its update uses none): a Muon face's loads take 0.
        needs_step = optimizer._STATE_HAS_STEP
        missing = [key for key in _required_states(current) + (["step"] if needs_step else []) if key not in saved]
        if missing:
            raise KeyError(f"FusedAdam.load_state_dict: the state of {_where(entry, None)} lacks {missing} (it has "
                           f"{sorted(saved)})")
        for key, value in saved.items():
            if key != "step":
                _check_state_value(entry, key, _fused._local_tensor(current[key]), value)
        step = _step_count(entry, saved["step"]) if "step" in saved else 0
        return {key: value for key, value in saved.items() if key != "step"}, step


# ---- load_state_dict: applying -------------------------------------------------------------------
def load_state_dict(optimizer, state_dict):
    """Loads a state dict (FusedAdam's, torch Adam/AdamW's, or one restored by
    ``torch.distributed.checkpoint``) by copying into the existing state buffers; see
    FusedAdam.load_state_dict."""
    for hook in getattr(optimizer, "_optimizer_load_state_dict_pre_hooks", {}).values():
        result = hook(optimizer, state_dict)
        if result is not None:
            state_dict = result
    plan = _Load(optimizer, state_dict)  # everything checked: from here on nothing fails
    steps = [0] * len(optimizer._entries)
    with torch.no_grad():
        for entry, saved, step in plan.states:
            # An fp8 param's loaded master is the truth and the param its cast; without one
            # the param is the truth (as for 16-bit params).
            loaded_master = entry.fp8 and saved is not None and "master" in saved
            current, codes = _loadable_states(optimizer, entry)
            for key, target in current.items():
                if key == "step":
                    continue
                if key in codes:  # quantized by the local blocks, with its absmax
                    values = torch.zeros(tuple(entry.local_shape), dtype=torch.float32)
                    if saved is not None and key in saved:
                        values = _local_source(entry, values, saved[key]).to("cpu", torch.float32).contiguous()
                    optimizer.native.set_moment_values(entry.index, key, values)
                elif saved is not None and key in saved:
                    _copy_state(entry, target, saved[key])
                elif key == "master":  # the param is the truth
                    if entry.fp8:
                        optimizer.native.reset_masters(entry.index, 1)
                    else:
                        _fused._local_tensor(target).copy_(_fused._local_tensor(entry.param))
                else:  # a reset moment, or the remainder of an fp32 value equal to the param
                    _fused._local_tensor(target).zero_()
            if loaded_master:
                optimizer.native.recast_params(entry.index, 1)
            steps[entry.index] = step
    for index, native_group in enumerate(optimizer.native.param_groups):
        # The group's count (steps taken) is the most any of its params took.
        native_group.step = max((step for entry, _, step in plan.states if entry.group == index), default=0)
    set_param_steps(optimizer, steps)  # after the group counts: setting those sets the params' too
    # As after torch's load: the params the dict gave a state are the keys of optimizer.state.
    optimizer.state.show_only([entry.param for entry, saved, _ in plan.states if saved is not None])
    for new, group in zip(plan.groups, optimizer.param_groups):
        group.update(new)
    check_masters_at_next_step(optimizer)
    for hook in getattr(optimizer, "_optimizer_load_state_dict_post_hooks", {}).values():
        hook(optimizer)


def _local_source(entry, target_local, value):
    """This rank's part of a saved state: the DTensor's local shard on the same layout, else
    the local box of the whole tensor (gathered, collectively, from a DTensor)."""
    if DTensor is not None and isinstance(value, DTensor):
        if entry.mesh is not None and value.device_mesh == entry.mesh and tuple(value.placements) == entry.placements:
            return value.to_local()
        return _box_of(entry, value.full_tensor())  # another layout
    if tuple(value.shape) == tuple(target_local.shape):
        return value
    return _box_of(entry, value)


def _copy_state(entry, target, value):
    target_local = _fused._local_tensor(target)
    source = _local_source(entry, target_local, value)
    if source.data_ptr() != target_local.data_ptr() or source.numel() == 0:
        target_local.copy_(source)


def _box_of(entry, full):
    return full[tuple(slice(o, o + n) for o, n in zip(entry.global_offset, entry.local_shape))]


# ---- masters that follow the params --------------------------------------------------------------
def check_masters_at_next_step(optimizer):
    """Has the next step first refresh every fp32 master that its param no longer matches
    (see :func:`refresh_stale_masters`). Called by every load: whichever of the optimizer
    and the model is loaded first, both are loaded by the next step."""
    if getattr(optimizer, "_master_check", None) is None:
        optimizer._master_check = optimizer.register_step_pre_hook(_master_check_hook)


def _master_check_hook(optimizer, args, kwargs):
    optimizer._master_check.remove()
    optimizer._master_check = None
    refresh_stale_masters(optimizer)


@torch.no_grad()
def refresh_stale_masters(optimizer):
    """Copies the param into its fp32 master where the param is not the master's rounding
    (the param's dtype) in every element of this rank's shard.

    Invariant: after every step a 16-bit param is its master rounded, so a param that is
    not was written by someone else since (model weights loaded after the optimizer, or a
    checkpoint without masters, e.g. torch's AdamW's, whose template master DCP left as it
    was): the param is then the truth. Where the param is the rounding, the master keeps
    the precision it was loaded with. One compare per shard, on the device, no host sync;
    it runs once after a load, not every step."""
    for entry in optimizer._entries:
        if entry.fp8:
            continue  # cast from its master at every load (its master is the truth)
        state = optimizer.state.views(entry.param)
        if "master" not in state or entry.numel == 0:
            continue
        param = _fused._local_tensor(entry.param)
        master = _fused._local_tensor(state["master"])
        # A master offloaded to the host is compared on the param's device (a copy of it).
        here = master.to(param.device)
        stale = (param != here.to(param.dtype)).any()
        master.copy_(torch.where(stale, param.to(master.dtype), here))


# ---- shard files ---------------------------------------------------------------------------------
def after_shard_files_loaded(optimizer):
    """What load_shard_files does after the library restored states, groups and steps:
    param_groups and the step tensors take the loaded values, masters are checked at the
    next step."""
    for index, group in enumerate(optimizer.param_groups):
        optimizer._show_hyperparameters(group, optimizer.native.param_groups[index].config())
        optimizer._record_pushed(index, group, optimizer._library_hyperparameters(group))
    check_masters_at_next_step(optimizer)


# ---- torch.distributed.checkpoint ----------------------------------------------------------------
class FusedAdamLoadPlanner(DefaultLoadPlanner):
    """DCP's ``DefaultLoadPlanner``, as strict, except that it accepts a checkpoint that
    lacks the fp32 masters (or int16 remainders) of a FusedAdam's state: one saved by
    ``torch.optim.AdamW`` (or another optimizer) over bf16/fp16 params. Use it to load such a
    checkpoint into a FusedAdam with 16-bit params::

        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path,
                 planner=FusedAdamLoadPlanner())
        set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)

    The masters the checkpoint lacks are left as they are in the template, and the first
    step after the load copies the loaded params into them (FusedAdam.load_state_dict
    arranges that; see ``refresh_stale_masters``), whatever order the model and the
    optimizer are loaded in. Any other missing key is an error, as with the default planner.
    """

    def create_local_plan(self):
        saved = self.metadata.state_dict_metadata
        for key in [k for k in self.state_dict if k not in saved and _is_derived_state(self.mappings.get(k))]:
            del self.state_dict[key]
        return super().create_local_plan()


def _is_derived_state(path):
    """Whether a flattened DCP key's path (..., "state", <param>, <key>) names a master or
    remainder of an optimizer state."""
    return path is not None and len(path) >= 3 and path[-1] in _DERIVED_STATES and path[-3] == "state"
