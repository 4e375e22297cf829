"""The idiomatic Python face of ``sa_optimizer``."""
import ctypes
import json
import math
import numbers
import os
import weakref

from . import _grad_intake, _schema
from . import _shardadam as _C
from ._comm import Comm, raise_step_error
from ._dlpack import (DTYPES, KDL_CPU, SCALING_INFO, CapsuleInfo, State, device_name, dtype_name, scaling_name,
                      to_capsule, to_dtype)
from ._errors import Error, InvalidArgument, StateError, check, error_for
from ._handle import OwnsHandle
from .layout import Box, Mesh

_MASTER_KINDS = {
    None: _C.SA_MASTER_AUTO,
    "auto": _C.SA_MASTER_AUTO,
    "none": _C.SA_MASTER_NONE,
    "fp32": _C.SA_MASTER_FP32,
    "remainder": _C.SA_MASTER_REMAINDER,
}
_MASTER_NAMES = {_C.SA_MASTER_NONE: "none", _C.SA_MASTER_FP32: "fp32", _C.SA_MASTER_REMAINDER: "remainder"}
# sa_state_placement: where a param's state lives.
STATE_PLACEMENTS = {"device": _C.SA_STATE_ON_DEVICE, "host": _C.SA_STATE_ON_HOST,
                    "host_cpu_step": _C.SA_STATE_ON_HOST_CPU_STEP}
_PLACEMENT_NAMES = {value: name for name, value in STATE_PLACEMENTS.items()}



def state_io_available():
    """True: every libshardadam provides state export/import (``save``/``load``). Kept for
    code written against 0.2, whose Python module also loaded a library built without it."""
    return True


class ParamInfo:
    """What the optimizer knows about a param (``sa_optimizer_param_info``).

    Attributes: ``index``, ``name``, ``group``, ``local_shape``, ``global_shape``,
    ``global_offset``, ``numel`` (local elements), ``param_dtype``, ``grad_dtype``,
    ``moment_dtype`` (names such as ``"bfloat16"``), ``master`` (``"none"``, ``"fp32"`` or
    ``"remainder"``), ``device`` (a DLPack ``(device_type, device_id)`` tuple), ``scaling``
    (how an fp8 param is cast from its master: ``"delayed"``, ``"mxfp8"``, ``"block128"``,
    ``"current"``, ``"current_pow2"``; ``"none"`` for other params), ``margin`` (a current
    scaling's; 0 otherwise), ``placement`` (where its state lives: ``"device"``, ``"host"``
    or ``"host_cpu_step"``; a CPU param's is always ``"device"``).
    """

    __slots__ = ("index", "name", "group", "local_shape", "global_shape", "global_offset", "numel",
                 "param_dtype", "grad_dtype", "moment_dtype", "master", "device", "scaling", "margin",
                 "placement")

    def __init__(self, index, info):
        self.index = index
        for key in ("name", "group", "local_shape", "global_shape", "global_offset", "numel", "device", "margin"):
            setattr(self, key, info[key])
        for key in ("param_dtype", "grad_dtype", "moment_dtype"):
            setattr(self, key, dtype_name(info[key]))
        self.master = _MASTER_NAMES[info["master"]]
        self.scaling = scaling_name(info["scaling"])
        self.placement = _PLACEMENT_NAMES[info["state_placement"]]

    def __repr__(self):
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"ParamInfo({fields})"


class Group:
    """One param group: its hyperparameters, read and written through the library.

    Attribute access (``group.lr = 0.1``) and torch-style item access
    (``group["lr"] = 0.1``) are the same. The keys are the library's fields
    (:func:`group_fields`), ``beta1`` and ``beta2`` as torch's pair ``betas``:
    ``lr``, ``betas``, ``eps``, ``weight_decay``, ``decoupled_weight_decay`` (True: AdamW,
    False: Adam with L2), ``bias_correction``, ``maximize``, ``amsgrad`` (fixed once the
    group holds a param), and ``step`` (the group's step count). :meth:`update` sets
    several at once, atomically.
    """

    def __init__(self, optimizer, index):
        self._optimizer = optimizer
        self._index = index

    @property
    def index(self):
        """Position of the group (groups are positional: the same on every rank)."""
        return self._index

    def _config(self):
        handle = self._optimizer._handle_or_raise()
        config = _C.sa_group_config()
        check(_C.sa_optimizer_get_group(handle, self._index, config), handle)
        return config

    def config(self):
        """All hyperparameters as a dict (without ``step``)."""
        return _schema.to_python(self._config())

    def update(self, **hyperparameters):
        """Sets the given hyperparameters at once; on error none changes."""
        handle = self._optimizer._handle_or_raise()
        step = hyperparameters.pop("step", None)
        config = self._config()
        _schema.fill(config, hyperparameters)
        check(_C.sa_optimizer_set_group(handle, self._index, config), handle)
        if step is not None:
            self.step = step

    @property
    def step(self):
        """The group's step count: steps the optimizer took and did not skip (on CUDA
        reading it may synchronize). Setting it sets the count of every param of the group
        too; bias correction uses each param's own count (:meth:`Optimizer.param_steps`)."""
        handle = self._optimizer._handle_or_raise()
        status, count = _C.sa_optimizer_get_step(handle, self._index)
        check(status, handle)
        return count

    @step.setter
    def step(self, value):
        handle = self._optimizer._handle_or_raise()
        check(_C.sa_optimizer_set_step(handle, self._index, int(value)), handle)

    @property
    def params(self):
        """Names of the params in this group, in order of addition."""
        return [info.name for info in self._optimizer.param_infos() if info.group == self._index]

    def keys(self):
        """The hyperparameter keys item access accepts."""
        return _schema.KEYS + ("step",)

    def __getitem__(self, key):
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key, value):
        if key not in self.keys():
            raise KeyError(key)
        setattr(self, key, value)

    def __repr__(self):
        return f"Group({self._index}, {self.config()})"


def _hyperparameter_property(key):
    def get(self):
        return self.config()[key]

    def set(self, value):
        self.update(**{key: value})

    return property(get, set, doc=_schema.doc(key))


for _key in _schema.KEYS:
    setattr(Group, _key, _hyperparameter_property(_key))
del _key


def _set_lr(self, value):
    handle = self._optimizer._handle_or_raise()
    check(_C.sa_optimizer_set_lr(handle, self._index, float(value)), handle)


# The lr of a group changes every step under a scheduler: sa_optimizer_set_lr sets it alone.
Group.lr = property(lambda self: self._config().lr, _set_lr, doc=_schema.doc("lr"))


def group_fields():
    """The library's table of group hyperparameters (``sa_group_config_field``): one dict
    per C field, in struct order, with its name, type, default, valid values (min, max,
    max_inclusive, rule) and doc."""
    return [dict(f) for f in _schema.FIELDS]


# The option structs struct_fields describes, by the name it takes (sa_struct_kind).
_STRUCT_KINDS = {"group_config": _C.SA_STRUCT_GROUP_CONFIG, "step_args": _C.SA_STRUCT_STEP_ARGS,
                 "optimizer_config": _C.SA_STRUCT_OPTIMIZER_CONFIG, "param_options": _C.SA_STRUCT_PARAM_OPTIONS,
                 "import_options": _C.SA_STRUCT_IMPORT_OPTIONS}


def struct_fields(kind):
    """The library's table of an option struct's fields (``sa_struct_field``): one dict per C
    field, in struct order, with its name, type (``SA_FIELD_*``), default, valid values
    (min, max, max_inclusive, rule; a dtype field's ``dtype_role``) and doc. ``kind``:
    ``"group_config"``, ``"step_args"``, ``"optimizer_config"``, ``"param_options"`` or
    ``"import_options"``."""
    if kind not in _STRUCT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(repr(k) for k in _STRUCT_KINDS)}, got {kind!r}")
    code = _STRUCT_KINDS[kind]
    out = []
    for index in range(_C.sa_struct_num_fields(code)):
        status, info = _C.sa_struct_field(code, index)
        check(status)
        out.append(info)
    return out


def group_defaults():
    """The library's default hyperparameters (torch.optim.AdamW's), Python-keyed."""
    return _schema.defaults()


class SaveJob:
    """A save in flight (:meth:`Optimizer.save` with ``wait=False``).

    The file at :attr:`path` appears (renamed into place) only when the job has written and
    synced it. :meth:`wait` blocks until then and raises the save's error, if any;
    :meth:`done` asks without blocking. Dropping the job waits for it (the library's thread
    still writes through its file writer until then); a failed save leaves no file.
    """

    def __init__(self, job, writer, path):
        self._job = job
        self._writer = writer  # the file writer the job writes through; released after it
        self._error = None
        self.path = path

    def done(self):
        """True once the save has ended (then :meth:`wait` returns at once); raises its
        error if it failed."""
        if self._job is not None:
            status, finished = _C.sa_export_job_poll(self._job)
            if not finished:
                return False
            self._end(status)
        if self._error is not None:
            raise self._error
        return True

    def wait(self):
        """Blocks until the file is written and renamed into place; raises the save's
        :class:`Error` if it failed (every call raises the same)."""
        if self._job is not None:
            self._end(_C.sa_export_job_wait(self._job))  # without the GIL
        if self._error is not None:
            raise self._error

    def _end(self, status):
        """Keeps the outcome, then releases the job and its writer (a failed file writer
        removes its temporary file)."""
        job, self._job = self._job, None
        if status != _C.SA_OK:
            self._error = error_for(status, _C.sa_export_job_last_error(job))
        _C.sa_export_job_release(job)
        self._writer = None

    def _end_quietly(self):
        if self._job is not None:
            self._end(_C.sa_export_job_wait(self._job))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.wait()
        return False

    def __del__(self):
        if getattr(self, "_job", None) is not None:
            try:
                self._end_quietly()
            except Exception:  # interpreter shutdown may have torn the module down already
                pass

    def __repr__(self):
        state = "running" if self._job is not None else ("failed" if self._error is not None else "done")
        return f"SaveJob({self.path!r}, {state})"


class Optimizer(OwnsHandle):
    """A shardadam optimizer: fused Adam/AdamW over the local shards of globally shaped params.

    ``Optimizer(**hyperparameters)`` creates the optimizer and its group 0 with the given
    hyperparameters, the library's defaults (``torch.optim.AdamW``'s, :func:`group_defaults`)
    for the others; they are also the defaults of groups made later with :meth:`add_group`.

    Keyword args:
        hyperparameters: the keys of :class:`Group` (see :func:`group_fields` for each
            one's meaning, default and valid values): ``lr``, ``betas``, ``eps``,
            ``weight_decay`` as in torch.optim.AdamW; ``decoupled_weight_decay``
            (default True: AdamW; False: Adam with an L2 term); ``bias_correction``,
            ``maximize``, ``amsgrad`` as in torch.optim.Adam.
        num_threads: CPU backend worker threads (0: one per hardware thread).
        cpu_simd: CPU backend: use SIMD where the CPU has FMA.
        stream: default CUDA stream of :meth:`step` and of the DLPack handshake, as a
            cudaStream_t address (``torch.cuda.current_stream().cuda_stream``); None is the
            legacy default stream.

    Params are added with :meth:`add_param` from any DLPack producer; the optimizer keeps
    them alive and updates them in place. Use it as a context manager or call
    :meth:`close`. One optimizer must not be used by two threads at once.
    """

    def __init__(self, *, num_threads=0, cpu_simd=True, stream=None, **hyperparameters):
        # An unknown key is a TypeError here, before anything exists; add_group validates values.
        self.defaults = _schema.to_python(_schema.fill(_schema.default_config(), hyperparameters))
        self.stream = stream
        self._handle = None
        self._names = []            # param index -> name
        self._group_count = 0       # groups are made on demand: a list of them here would be a cycle
        self._device = None         # DLPack device of the params, once one is added
        self._grad_refs = {}        # param index -> grad object whose memory is bound
        self._step_refs = ()        # scale tensors the last (asynchronous) step reads
        self._host_scalars = (ctypes.c_float(), ctypes.c_float())  # numbers given to step on the CPU
        self._host_grad_norm = ctypes.c_double()  # receives the norm when step(return_norm=True)
        self._skipped = ctypes.c_int32()          # receives the verdict when step(return_skipped=True)
        self._last_save = None      # weakref to the SaveJob of the last save(wait=False)
        self._comm = None           # the Comm given to set_comm (its host callable's errors are read from it)
        config = _C.sa_optimizer_config()
        config.num_threads = int(num_threads)
        config.cpu_simd = int(bool(cpu_simd))
        status, handle = _C.sa_optimizer_create(config)
        check(status)
        self._handle = handle
        try:
            self.add_group()
        except BaseException:
            self.close()
            raise

    # ---- lifetime --------------------------------------------------------------------
    def close(self):
        """Destroys the native optimizer: frees its state and releases every param it
        took (their DLPack deleters run). State arrays already made stay valid. Calling it
        again is a no-op."""
        handle, self._handle = self._handle, None
        save = self._last_save() if self._last_save is not None else None
        if save is not None:
            save._end_quietly()  # destroy would wait for it too, holding the GIL
        if handle is not None:
            _C.sa_optimizer_destroy(handle)
        self._grad_refs = {}
        self._step_refs = ()
        self._comm = None

    def _handle_or_raise(self):
        if self._handle is None:
            raise StateError("the optimizer is closed")
        return self._handle

    def __repr__(self):
        if self._handle is None:
            return "<shardadam.Optimizer (closed)>"
        device = device_name(self._device) if self._device else "no params"
        return f"<shardadam.Optimizer: {len(self._names)} params, {self._group_count} groups, {device}>"

    # ---- groups ----------------------------------------------------------------------
    def add_group(self, **hyperparameters):
        """Appends a group with the optimizer's defaults overridden by ``hyperparameters``
        and returns it. Create the same groups in the same order on every rank."""
        handle = self._handle_or_raise()
        config = _schema.fill(_C.sa_group_config(), {**self.defaults, **hyperparameters})
        status, index = _C.sa_optimizer_add_group(handle, config)
        check(status, handle)
        self._group_count = index + 1
        return Group(self, index)

    @property
    def param_groups(self):
        """The groups, by index (new views each time: a :class:`Group` keeps no state of
        its own)."""
        return [Group(self, index) for index in range(self._group_count)]

    # ---- params ----------------------------------------------------------------------
    @property
    def device(self):
        """DLPack device ``(device_type, device_id)`` of the params; None before the first."""
        return self._device

    @property
    def param_names(self):
        """Names of the params, by index."""
        return list(self._names)

    @property
    def num_params(self):
        """Number of params."""
        return len(self._names)

    def add_param(self, name, tensor, group=0, layout=None, grad_dtype=None, moment_dtype=None, master=None,
                  *, scaling=None, scale=None, amax=None, margin=0, placement=None, fields=None, stream=None):
        """Registers a local shard as a param and returns its index.

        Args:
            name: unique fully qualified name (what checkpoints match on).
            tensor: the local shard, any DLPack producer (numpy, torch, cupy, jax, ...):
                C-contiguous, writable, float32, bfloat16 or float16, on the CPU or (in CUDA
                builds) a CUDA device, or float8_e4m3fn / float8_e5m2 with a ``scaling``
                (numpy arrays of ml_dtypes' dtypes work; on CUDA, its scale and amax are on its
                device too). It is
                updated in place at every step. The optimizer holds the producer's DLPack
                tensor (and so the array) until it is closed.
            group: index of the group.
            layout: None (not sharded), a :class:`~shardadam.layout.Mesh` or a
                :class:`~shardadam.layout.Box`.
            grad_dtype: dtype of its grads (default: the param's).
            moment_dtype: ``"float32"`` (default), ``"bfloat16"``, or a block storage (see
                ``sa_param_options.moment_dtype``): ``"uint8"`` (8-bit blockwise moments) or
                ``"float8_e4m3fn"`` (float8 with a scale per block); shard files hold those
                as their codes and a float32 absmax per block.
            master: None/``"auto"`` (fp32 master for 16-bit and fp8 params), ``"none"``,
                ``"fp32"`` or ``"remainder"`` (bfloat16 params: keep the int16 low half of
                the fp32 value).
            scaling: fp8 params only (required for them): how each step casts the updated
                fp32 master into the param, a name of :func:`param_scalings` --
                ``"delayed"`` (``param = fp8(master * scale)`` with the engine's ``scale``),
                ``"mxfp8"`` (a power-of-two scale per 32 elements of the last dim, written
                into ``scale`` as float8_e8m0fnu), ``"block128"`` (a float32 scale_inv per
                128 elements of the last dim, written into ``scale``), ``"current"`` /
                ``"current_pow2"`` (per tensor, ``scale = fp8_max / amax`` of the whole
                tensor at each step, reduced across the ranks through :meth:`set_comm`'s
                communicator when the layout shards it: set it first; pow2 rounds the
                scale down to a power of two); casts round to nearest even and saturate. The master starts as the param's value times
                its scale's inverse. ``include/shardadam/shardadam.h`` (sa_param_scaling)
                states each rule.
            scale: the scale tensor ``scaling`` names (same device as the param,
                C-contiguous): ``"delayed"``: one float32 element, read at every step;
                ``"mxfp8"`` / ``"block128"``: the local shape with the last dim divided by
                the block, written at every step; ``"current"`` / ``"current_pow2"``: two
                float32 elements ``[scale, scale_inv]``, written at every step (when added:
                the scale_inv of the codes given). Held like ``tensor``.
            amax: ``"delayed"``, ``"current"`` and ``"current_pow2"`` only, optional: one
                float32 element into which every step writes the amax: delayed: max
                |master| of this shard (reduce it over the ranks that hold the tensor, as
                amax histories are); current: of the whole tensor. Held like ``tensor``.
            margin: ``"current"`` and ``"current_pow2"`` only: the scale is divided by
                ``2**margin`` (Transformer Engine's margin: values up to ``2**margin * amax``
                fit before they saturate), 0 (the default) to 6; every rank holding a
                sharded param gives it the same margin.
            placement: where its state (master, moments, block scales) lives: None or
                ``"device"`` (the param's device memory), or ``"host"``: for a CUDA param,
                pinned host memory that each step streams through a fixed device ring (3 x 32
                MiB) over the host link, each state byte once each way, with the same bits as
                on the device; its state views are CPU tensors. Or ``"host_cpu_step"``:
                pinned host memory that the host's threads (``num_threads``) step, on the param
                and grad brought down each step (the param goes back up): the same bits, no
                state byte over the link, no CUDA graph capture (an fp8 param's master is
                updated on the host and cast on the device). A CPU
                param's state is host memory either way (its ``placement`` reads
                ``"device"``). Raises :class:`OutOfMemory` when the host cannot pin it, adding
                nothing.
            fields: None, or a dict of more ``sa_param_options`` fields by their C names
                (:func:`shardadam.struct_fields` ``("param_options")`` lists them), numbers as the
                library's table types them: options of a library newer than these arguments
                reach it without a new keyword. The library checks them as it checks the others;
                an unknown name raises KeyError. A field given both ways takes this value.
            stream: the CUDA stream of the DLPack handshake (default: the optimizer's).
        """
        self._handle_or_raise()
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        options = self._options_of(grad_dtype, moment_dtype, master, scaling, scale, amax, margin, placement, stream)
        if fields:
            options = dict(options or {}, **fields)
        capsule = to_capsule(tensor, self._stream_of(stream))
        info = CapsuleInfo(capsule)
        if layout is None:
            c_layout = None
        elif isinstance(layout, (Mesh, Box)):
            c_layout = layout._as_c(info.shape)
        else:
            raise TypeError(f"layout must be None, a shardadam.Mesh or a shardadam.Box, got {type(layout).__name__}")
        return self._add_capsule(name, capsule, group, c_layout, options, info.versioned)

    def _options_of(self, grad_dtype=None, moment_dtype=None, master=None, scaling=None, scale=None, amax=None,
                    margin=0, placement=None, stream=None):
        """add_param's options, checked, as the native call takes them (None: the defaults).
        Without scale and amax the result holds no capsule and may be reused for many params."""
        if master not in _MASTER_KINDS:
            raise ValueError(f"master must be one of {', '.join(repr(k) for k in _MASTER_KINDS)}, got {master!r}")
        if scaling is not None and scaling not in SCALING_INFO:
            raise ValueError(f"scaling must be one of {', '.join(repr(k) for k in SCALING_INFO)}, got {scaling!r}")
        if isinstance(margin, bool) or not isinstance(margin, numbers.Integral):
            raise TypeError(f"margin must be an int, got {type(margin).__name__}")
        margin = int(margin)
        if placement is not None and placement not in STATE_PLACEMENTS:
            raise ValueError(f"placement must be None or one of {', '.join(repr(k) for k in STATE_PLACEMENTS)}, "
                             f"got {placement!r}")
        if not margin and all(v is None for v in (grad_dtype, moment_dtype, master, scaling, scale, amax, placement)):
            return None
        # By sa_param_options' field names (the library's table, sa_struct_field), only those
        # given: the others keep the library's defaults (sa_struct_default).
        options = {}
        if grad_dtype is not None:
            options["grad_dtype"] = to_dtype(grad_dtype)
        if moment_dtype is not None:
            options["moment_dtype"] = to_dtype(moment_dtype)
        if master is not None:
            options["master"] = _MASTER_KINDS[master]
        if scaling is not None:
            options["scaling"] = SCALING_INFO[scaling]["value"]
        if margin:
            options["margin"] = margin
        if placement is not None:
            options["state_placement"] = STATE_PLACEMENTS[placement]
        if scale is not None:
            options["scale"] = to_capsule(scale, self._stream_of(stream))
        if amax is not None:
            options["amax"] = to_capsule(amax, self._stream_of(stream))
        return options

    def _add_capsule(self, name, capsule, group, c_layout, options, versioned):
        """The native add of a checked capsule (versioned or legacy) with options from
        _options_of; returns the index. On success the capsule is renamed "used_...": the
        library owns the tensor then."""
        added = []
        self._add_capsules(group, [(name, capsule, options)], added, c_layout, versioned)
        return added[0]

    def _add_capsules(self, group, items, added, c_layout=None, versioned=False):
        """_add_capsule of every (name, capsule, options) of ``items`` (an iterable, read one at
        a time) into group ``group``, in order, appending each new index to ``added`` (the
        caller's list: on a failure it holds the params the library took). One loop with the
        handle and the native function looked up once: at 100k params the per-call lookups cost
        as much as the registration."""
        handle = self._handle_or_raise()
        add = _C.sa_optimizer_add_param if versioned else _C.sa_optimizer_add_param_legacy
        names, group = self._names, int(group)
        try:
            for name, capsule, options in items:
                status, index = add(handle, name, group, capsule, c_layout, options)
                if status:
                    check(status, handle)
                names.append(name)
                added.append(index)
        finally:
            if self._device is None and added:
                self._device = self.param_info(added[0]).device

    def _add_tensors(self, group, tensors, names, added):
        """Registers ``tensors`` (a list of tensors of one type, not sharded) into group
        ``group`` with the library's default options, named by ``names``, in one native loop
        through their type's DLPack C exchange API (_grad_intake.add_params), appending each
        new index to ``added`` (the caller's list: on a failure it holds the params the
        library took). Returns False, registering nothing, where their type has none."""
        handle = self._handle_or_raise()
        first = len(self._names)
        result = _grad_intake.add_params(handle, int(group), tensors, names)
        if result is None:
            return False
        status, taken, error = result
        self._names.extend(names[:taken])
        added.extend(range(first, first + taken))
        if self._device is None and taken:
            self._device = self.param_info(first).device
        if error is not None:
            raise error
        check(status, handle)
        return True

    def param_index(self, param):
        """Index of a param given by name or index."""
        if isinstance(param, str):
            handle = self._handle_or_raise()
            status, index = _C.sa_optimizer_find_param(handle, param)
            check(status, handle)
            return index
        if type(param) is int and 0 <= param < len(self._names):  # the common case, without the ABC check
            return param
        if isinstance(param, numbers.Integral) and 0 <= int(param) < len(self._names):
            return int(param)
        raise InvalidArgument(f"param {param!r} does not exist (the optimizer has {len(self._names)} params)")

    def param_info(self, param):
        """:class:`ParamInfo` of a param given by name or index."""
        handle = self._handle_or_raise()
        index = self.param_index(param)
        status, info = _C.sa_optimizer_param_info(handle, index)
        check(status, handle)
        return ParamInfo(index, info)

    def param_infos(self):
        """:class:`ParamInfo` of every param, by index."""
        return [self.param_info(i) for i in range(len(self._names))]

    # ---- step counts ------------------------------------------------------------------
    def param_steps(self, first=0, n=None):
        """The step counts of params ``first, first + 1, ...`` (``n`` of them; None: to the
        last param), by index: the steps in which each had a grad and the step was not
        skipped (torch's ``state[p]["step"]``); its bias correction uses it. On CUDA
        reading them may synchronize."""
        handle = self._handle_or_raise()
        status, steps = _C.param_steps_get(handle, int(first), -1 if n is None else int(n))
        check(status, handle)
        return steps

    def set_param_steps(self, steps, first=0):
        """Sets the step counts of params ``first, first + 1, ...`` from a sequence of ints
        (all checked first: each >= 0, the range within the params; on error none
        changes). Group step counts stay as they are."""
        handle = self._handle_or_raise()
        check(_C.param_steps_set(handle, int(first), steps), handle)

    # ---- grads -----------------------------------------------------------------------
    def set_grad(self, param, grad, *, stream=None):
        """Binds the grad of one param (by name or index), checked against what was
        registered (dtype, shape, device, C-contiguous strides, alignment). ``grad`` is any
        DLPack producer or ``__array_interface__`` object; its memory is read at every later
        step, and the optimizer keeps ``grad`` alive until it is rebound. None is
        :meth:`clear_grad`. On error the previous binding stays."""
        handle = self._handle_or_raise()
        index = self.param_index(param)
        if grad is None:
            self.clear_grad(index)
            return
        capsule = to_capsule(grad, self._stream_of(stream))
        check(_C.sa_optimizer_set_grad(handle, index, capsule), handle)
        self._grad_refs[index] = grad

    def clear_grad(self, param):
        """Marks a param (by name or index) as having no grad: later steps skip it (its
        values, state and step count stay), as torch skips a param whose ``.grad`` is
        None, until a grad is bound again."""
        handle = self._handle_or_raise()
        index = self.param_index(param)
        check(_C.sa_optimizer_clear_grad(handle, index), handle)
        self._grad_refs.pop(index, None)

    def set_grads(self, grads, *, stream=None):
        """Binds the grads of several params.

        ``grads`` is a sequence with one entry per param (by index): a DLPack producer (as
        :meth:`set_grad` takes) or None ("this param has no grad": steps skip it). All are
        checked as :meth:`set_grad` checks one, in one call, all or nothing: on error no
        binding changes and the message names the first param that failed. Or ``grads``
        is a dict from name (or index) to grad (or None), bound entry by entry; the params
        it does not name keep their bindings. Raw addresses are not accepted: shardadam
        cannot check memory it cannot see.
        """
        handle = self._handle_or_raise()
        if isinstance(grads, dict):
            for param, grad in grads.items():
                self.set_grad(param, grad, stream=stream)
            return
        if not isinstance(grads, (list, tuple)):
            grads = list(grads)
        if len(grads) != len(self._names):
            raise InvalidArgument(f"set_grads: {len(grads)} grads for {len(self._names)} params; pass one per "
                                  "param, in param order (None: no grad)")
        stream = self._stream_of(stream)
        capsules = []
        for index, grad in enumerate(grads):
            if isinstance(grad, numbers.Integral):
                raise TypeError(f"set_grads: grads[{index}] (param {self._names[index]!r}) is an int; raw addresses "
                                "are not accepted (shardadam cannot check memory it cannot see): pass the array")
            capsules.append(None if grad is None else to_capsule(grad, stream))
        check(_C.sa_optimizer_set_grads(handle, capsules), handle)
        self._grad_refs = {index: grad for index, grad in enumerate(grads) if grad is not None}

    # ---- communicator ------------------------------------------------------------------
    def set_comm(self, comm):
        """Gives the steps a :class:`~shardadam.Comm` (None: none, steps are rank-local).

        With a communicator every step that computes a gradient norm or is given
        ``found_inf`` is collective: every rank must call it, with the same
        ``max_grad_norm`` and ``norm_type``. The norm is then over the grads of all ranks
        (a shard replicated along a mesh dim counted once), and ``found_inf`` set on any
        rank skips the step on every rank. The optimizer keeps the communicator alive. An
        NCCL communicator must be on the params' CUDA device."""
        handle = self._handle_or_raise()
        if comm is not None and not isinstance(comm, Comm):
            raise TypeError(f"set_comm: comm must be a shardadam.Comm or None, got {type(comm).__name__}")
        check(_C.sa_optimizer_set_comm(handle, None if comm is None else comm._handle_or_raise()), handle)
        self._comm = comm

    @property
    def comm(self):
        """The :class:`~shardadam.Comm` given to :meth:`set_comm`, or None."""
        return self._comm

    # ---- step ------------------------------------------------------------------------
    def step(self, inv_grad_scale=None, found_inf=None, stream=None, *, max_grad_norm=None, norm_type=2.0,
             grad_norm=None, return_norm=False, return_skipped=False):
        """Runs one optimizer step over every param that has a grad. Params marked as
        having none (:meth:`clear_grad`, a None of :meth:`set_grads`) are skipped; every
        other param needs a grad bound since it was added.

        Args:
            inv_grad_scale: every grad is multiplied by it (the inverse loss scale). A
                number (CPU optimizers), or a one-element float32 tensor on the params'
                device (read when the step runs: no host synchronization).
            found_inf: if nonzero the step is skipped entirely (no param, state or step
                count changes); with a communicator (:meth:`set_comm`), on every rank.
                Same forms as inv_grad_scale.
            stream: CUDA stream to enqueue on (cudaStream_t address; default: the
                optimizer's). On CUDA the call returns once the work is enqueued.
            max_grad_norm: clip the grads to this total norm, as
                ``torch.nn.utils.clip_grad_norm_`` does: the norm of all grads (of all
                ranks with a communicator; after inv_grad_scale) is computed and every
                grad multiplied by ``min(1, max_grad_norm / (norm + 1e-6))`` inside the
                update (the grad memory is not written). ``math.inf`` computes the norm
                without clipping. A non-finite norm skips the step (on every rank), also
                when the norm is only computed to be reported.
                None (default): no norm, unless ``grad_norm`` or ``return_norm`` ask for
                it (then as ``math.inf``).
            norm_type: 2 (default) or ``math.inf`` (the largest absolute element).
            grad_norm: a one-element float32 tensor on the params' device that receives
                the norm (written on the stream: no host synchronization).
            return_norm: return the norm as a float. On CUDA this waits for the step.
            return_skipped: return whether the step was skipped (found_inf on any rank, or
                a non-finite norm). On CUDA, with found_inf or a norm, this waits for the
                step.

        Returns:
            None; or the norm (a float) if ``return_norm``; or whether the step was
            skipped (a bool) if ``return_skipped``; or ``(norm, skipped)`` if both.
        """
        self._handle_or_raise()  # a closed optimizer fails here, before the scalars are read
        refs = []
        inv_address = self._scalar_address(inv_grad_scale, "inv_grad_scale", 0, refs, stream)
        found_address = self._scalar_address(found_inf, "found_inf", 1, refs, stream)
        clip = None
        if max_grad_norm is not None or grad_norm is not None or return_norm:
            norm_address = self._scalar_address(grad_norm, "grad_norm", None, refs, stream, output=True)
            clip = _clip_args(max_grad_norm, norm_type) + (norm_address, bool(return_norm))
        self._step_addresses(inv_address, found_address, stream, clip=clip, skipped=return_skipped)
        self._step_refs = tuple(refs)  # kept until the next step: the stream reads them later
        results = ((self._host_grad_norm.value,) if return_norm else ()) + \
                  ((bool(self._skipped.value),) if return_skipped else ())
        return results[0] if len(results) == 1 else (results or None)

    def step_params(self, params, inv_grad_scale=None, found_inf=None, stream=None, *, return_skipped=False):
        """A partial step (``sa_optimizer_step_params``): :meth:`step` for ``params`` only (names
        or indices, each at most once), every other param left as it is, as if it had no
        grad. Per-param step counts advance as in a step (bias correction stays exact however
        the params are split); group step counts do not (they count full steps). For an
        engine that steps each layer as soon as its grads are ready. No clipping (the norm is
        of every grad: clip in a full :meth:`step`); ``inv_grad_scale``, ``found_inf``,
        ``stream`` and ``return_skipped`` as in :meth:`step`. Everything is checked before
        anything changes."""
        handle = self._handle_or_raise()
        if isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
            raise TypeError(f"params must be a sequence of param names or indices, got {type(params).__name__}")
        indices = [self.param_index(p) if isinstance(p, str) else p for p in params]
        refs = []
        inv_address = self._scalar_address(inv_grad_scale, "inv_grad_scale", 0, refs, stream)
        found_address = self._scalar_address(found_inf, "found_inf", 1, refs, stream)
        self._step_addresses(inv_address, found_address, stream, skipped=return_skipped, params=indices)
        self._step_refs = tuple(refs)  # kept until the next step: the stream reads them later
        return bool(self._skipped.value) if return_skipped else None

    def _step_addresses(self, inv_address, found_address, stream=None, clip=None, skipped=False, params=None):
        """One native step with the scalars given as raw addresses (None for absent).
        ``clip``: None, or (max_grad_norm, norm_type, grad_norm address or None,
        host_norm) with the first two as _clip_args gives them. ``skipped``: have the
        library report into ``self._skipped``. ``params``: the indices of a partial step
        (``sa_optimizer_step_params``), or None for a step of every param."""
        handle = self._handle_or_raise()
        args = {}  # sa_step_args by field name; the fields not named keep their defaults
        if inv_address is not None:
            args["inv_grad_scale"] = inv_address
        if found_address is not None:
            args["found_inf"] = found_address
        if skipped:
            args["skipped"] = ctypes.addressof(self._skipped)
        if clip is not None:
            max_grad_norm, norm_type, norm_address, host_norm = clip
            args.update(max_grad_norm=max_grad_norm, norm_type=norm_type, grad_norm=norm_address)
            if host_norm:
                args["host_grad_norm"] = ctypes.addressof(self._host_grad_norm)
        if self._comm is not None:
            self._comm._take_exception()  # a stale one would be blamed on this step
        try:
            if params is None:
                check(_C.sa_optimizer_step(handle, args or None, self._stream_of(stream)), handle)
            else:
                check(_C.step_params(handle, params, args or None, self._stream_of(stream)), handle)
        except Error as error:
            raise_step_error(self._comm, error)

    def _scalar_address(self, value, what, slot, refs, stream, output=False):
        if value is None:
            return None
        if isinstance(value, numbers.Real) and output:
            raise TypeError(f"{what} must be a one-element float32 tensor to write into, got a number")
        if isinstance(value, numbers.Real):
            if self._device is not None and self._device[0] != KDL_CPU:
                raise TypeError(f"{what}: the params are on {device_name(self._device)}; pass a one-element "
                                "float32 tensor there instead of a number")
            scalar = self._host_scalars[slot]
            scalar.value = float(value)
            return ctypes.addressof(scalar)
        info = CapsuleInfo(to_capsule(value, self._stream_of(stream)))
        if tuple(info.dtype) != DTYPES["float32"] or info.numel != 1:
            raise InvalidArgument(f"{what} must be a one-element float32 tensor, got {dtype_name(info.dtype)} "
                                  f"of shape {tuple(info.shape)}")
        if self._device is not None and tuple(info.device) != self._device:
            raise InvalidArgument(f"{what} is on {device_name(info.device)} but the params are on "
                                  f"{device_name(self._device)}")
        if output and info.read_only:
            raise InvalidArgument(f"{what} is read-only; it must be writable")
        refs.append(value)
        return info.data

    def flush(self, stream=None):
        """Enqueues the upload of what changed on the host since the last step (needed only
        before replaying a step captured in a CUDA graph)."""
        handle = self._handle_or_raise()
        check(_C.sa_optimizer_flush(handle, self._stream_of(stream)), handle)

    def _stream_of(self, stream):
        return self.stream if stream is None else stream

    # ---- state -----------------------------------------------------------------------
    def state(self, param, key):
        """A zero-copy :class:`~shardadam.State` view of one state of a param (by name or
        index). ``key``: ``"exp_avg"``, ``"exp_avg_sq"``, ``"max_exp_avg_sq"`` (amsgrad),
        ``"master"`` (fp32 master) or ``"remainder"`` (int16 remainder); see
        :meth:`state_keys`. ``numpy.from_dlpack(opt.state("w", "exp_avg"))`` shares memory."""
        index = self.param_index(param)
        return State(self, index, self._names[index], key)

    def recast_params(self, first=0, n=None):
        """Casts the fp8 params ``first, first + 1, ...`` (``n`` of them; default: to the
        last) again from their masters, as a step casts them after its update (block
        scales written, a delayed scale read now, an amax tensor written): after masters
        were written through :meth:`state` views (a loaded state dict). Other params are
        left as they are. Synchronizes a device backend; on error nothing changed."""
        handle = self._handle_or_raise()
        n = len(self._names) - first if n is None else n
        check(_C.sa_optimizer_recast_params(handle, int(first), int(n)), handle)

    def reset_masters(self, first=0, n=None):
        """Sets the masters of params ``first, ...`` (``n`` of them; default: to the last)
        from the params' current values, as :meth:`add_param` starts them (fp8: the value
        times its scale's inverse; 16-bit: widened; a remainder: zero): after new weights
        were loaded into the params. Moments and step counts stay. Synchronizes a device
        backend; on error nothing changed."""
        handle = self._handle_or_raise()
        n = len(self._names) - first if n is None else n
        check(_C.sa_optimizer_reset_masters(handle, int(first), int(n)), handle)

    def moment_values(self, param, key, out):
        """Writes a moment of a param (by name or index; ``key``: ``"exp_avg"``,
        ``"exp_avg_sq"``, ``"max_exp_avg_sq"``) as float32 values into ``out``, a C-contiguous
        float32 host array or tensor of the local shape (any DLPack producer): float32
        moments as they are, bfloat16 ones widened, 8-bit ones decoded as shard files hold
        them (``sa_optimizer_get_moment_values``). Returns ``out``."""
        handle = self._handle_or_raise()
        check(_C.sa_optimizer_get_moment_values(handle, self.param_index(param), key, to_capsule(out, None)),
              handle)
        return out

    def set_moment_values(self, param, key, values):
        """Sets a moment from float32 values (host memory, the local shape), stored in the
        moment's dtype: 8-bit moments are quantized by the local shard's blocks, so
        ``set_moment_values(p, k, moment_values(p, k, buf))`` changes nothing
        (``sa_optimizer_set_moment_values``)."""
        handle = self._handle_or_raise()
        check(_C.sa_optimizer_set_moment_values(handle, self.param_index(param), key, to_capsule(values, None)),
              handle)

    def state_keys(self, param):
        """The state keys a param has, e.g. ``("exp_avg", "exp_avg_sq", "master")``, as the
        library lists them (``sa_optimizer_state_keys``)."""
        handle = self._handle_or_raise()
        status, keys = _C.state_keys_get(handle, self.param_index(param), 0)
        check(status, handle)
        return keys

    def checkpoint_keys(self, param):
        """The state keys checkpoints hold for a param (``sa_optimizer_checkpoint_keys``):
        :meth:`state_keys` but for the block absmax states of 8-bit moments, which a load
        derives from the moments' values."""
        handle = self._handle_or_raise()
        status, keys = _C.state_keys_get(handle, self.param_index(param), 1)
        check(status, handle)
        return keys

    def moment_keys(self, param):
        """The keys of a param's moments, those :meth:`moment_values` takes, e.g.
        ``("exp_avg", "exp_avg_sq")`` (``sa_optimizer_moment_keys``)."""
        handle = self._handle_or_raise()
        status, keys = _C.state_keys_get(handle, self.param_index(param), 2)
        check(status, handle)
        return keys

    def _state_capsule(self, index, key):
        handle = self._handle_or_raise()
        if not isinstance(key, str):
            raise TypeError(f"state key must be a str, got {type(key).__name__}")
        status, capsule = _C.sa_optimizer_state_view(handle, index, key)
        check(status, handle)
        return capsule

    # ---- checkpoints -----------------------------------------------------------------
    def save(self, path, *, wait=True):
        """Writes this rank's state (every param and state key, the groups and their step
        counts, the layouts) to ``path`` as a shard file (a safetensors file). The file
        appears complete or not at all (written to a temporary name, synced, then renamed).

        With ``wait=False`` it returns a :class:`SaveJob` as soon as the state is copied
        into a snapshot the library keeps (pinned host memory for CUDA state, allocated by
        the first such save and reused); checksums, writes and the rename happen on a thread
        of the library's, while training goes on. The file holds the state of this call,
        whatever steps follow. Call :meth:`SaveJob.wait` (or use it as a context manager) to
        learn whether it succeeded; a failure is raised there. One save writes at a time per
        optimizer: a save called while another is writing first waits for it.
        """
        handle = self._handle_or_raise()
        writer = _C.sa_writer()
        check(_C.sa_file_writer(os.fspath(path), writer))
        if not wait:
            status, job = _C.sa_optimizer_export_async(handle, writer)
            check(status, handle)  # on failure the writer's destructor removes its temporary file
            save = SaveJob(job, writer, os.fspath(path))
            self._last_save = weakref.ref(save)
            return save
        try:
            check(_C.sa_optimizer_export(handle, writer), handle)
        finally:
            del writer  # releases it (an uncommitted file writer removes its temporary file)
        return None

    def load(self, paths, *, allow_missing=False, allow_unexpected=False, restore_groups=True, staging_bytes=0,
             read_once=False, fields=None):
        """Loads state from shard files written by any number of ranks with any layout,
        resharding onto this optimizer's layout; copies into the existing state buffers.

        Args:
            paths: one path or a sequence of paths (all ranks' files of a checkpoint).
            allow_missing: params absent from the files keep their state (else an error).
            allow_unexpected: params in the files that this optimizer lacks are ignored.
            restore_groups: restore hyperparameters and step counts from the files.
            staging_bytes: size of the staging buffer (0: the library's default, 64 MiB).
            read_once: read each byte once even when the data exceed the staging buffer
                (each block is checked as it is read, before it is copied): a damaged block
                found while copying then leaves the optimizer unusable, raising
                :class:`FormatError`, until a load succeeds. For a resume into a fresh
                optimizer.

            fields: None, or a dict of more ``sa_import_options`` fields by their C names
                (:func:`shardadam.struct_fields` ``("import_options")`` lists them), numbers as
                the library's table types them: options of a library newer than these
                arguments reach it without a new keyword. The library checks them as it
                checks the others; an unknown name raises KeyError. A field given both ways
                takes this value.

        Everything is validated before anything is copied; on error nothing changed (with
        ``read_once``: everything but the data blocks that did not fit the staging buffer).
        """
        handle = self._handle_or_raise()
        options = {"allow_missing": int(bool(allow_missing)), "allow_unexpected": int(bool(allow_unexpected)),
                   "restore_groups": int(bool(restore_groups)), "staging_bytes": int(staging_bytes),
                   "read_once": int(bool(read_once)), **(fields or {})}
        readers = _open_readers(paths)
        check(_C.sa_optimizer_import(handle, readers, options), handle)


def _clip_args(max_grad_norm, norm_type):
    """(max_grad_norm, norm_type) of sa_step_args from step()'s arguments."""
    if max_grad_norm is None:
        max_grad_norm = math.inf  # a norm is wanted (grad_norm or return_norm) but no clipping
    max_grad_norm = float(max_grad_norm)
    if not max_grad_norm > 0.0:  # also NaN
        raise InvalidArgument(f"max_grad_norm must be > 0 (math.inf: compute the norm without clipping), got "
                              f"{max_grad_norm}")
    if isinstance(norm_type, str):
        norm_type = norm_type.strip().lower()
    if norm_type in (2, "2"):
        return max_grad_norm, _C.SA_NORM_L2
    if norm_type == "inf" or (isinstance(norm_type, numbers.Real) and norm_type == math.inf):
        return max_grad_norm, _C.SA_NORM_INF
    raise InvalidArgument(f"norm_type must be 2 or math.inf, got {norm_type!r}")


def _open_readers(paths):
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    readers = []
    for path in paths:
        reader = _C.sa_reader()
        check(_C.sa_file_reader(os.fspath(path), reader))
        readers.append(reader)
    return readers


def inspect(paths, verify_data=True):
    """Describes what a set of shard files holds (``sa_inspect``), as a dict: per global
    tensor its shape, dtype, the boxes saved and by which file, whether they cover it
    exactly once; per file whether its header parses and its checksums match.
    ``verify_data=False`` reads only the headers."""
    readers = _open_readers(paths)
    status, report = _C.sa_inspect(readers, int(bool(verify_data)))
    check(status)
    return json.loads(report)

