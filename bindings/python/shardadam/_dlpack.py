"""DLPack in both directions: taking tensors from any producer, handing state views out.

Taking (consumer side, the DLPack Python specification's handshake): ``__dlpack_device__()``
first; for CUDA/ROCm producers ``stream=`` names the stream the optimizer will use, so the
producer makes its pending writes visible there; ``max_version=(1, 0)`` asks for a
versioned ``DLManagedTensorVersioned`` capsule, and a producer that does not know the
keyword (``TypeError``) is asked again for a legacy ``DLManagedTensor`` capsule.

numpy cannot export arrays of ml_dtypes' dtypes (``bfloat16``, ``float8_e4m3fn``,
``float8_e5m2``, ``float8_e8m0fnu``: its DLPack export knows only numpy's own dtypes), so
such arrays are exported as their unsigned-integer view of the same width and the capsule
is relabelled; :meth:`State.numpy` does the reverse.
"""
import math

from . import _shardadam as _C
from ._errors import check

# DLDeviceType values (dlpack.h).
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_ROCM = 10
KDL_CUDA_MANAGED = 13
_HOST_DEVICES = (KDL_CPU, KDL_CUDA_HOST, KDL_CUDA_MANAGED)
_STREAM_DEVICES = (KDL_CUDA, KDL_ROCM)

# DLDataTypeCode values (dlpack.h), to name dtypes the library does not store.
_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


def _library_dtypes():
    table = {}
    for index in range(_C.sa_num_dtypes()):
        status, info = _C.sa_dtype(index)
        check(status)
        info["dtype"] = tuple(info["dtype"])
        table[info["name"]] = info
    return table


#: The dtypes the library stores, read from it (``sa_dtype``): name -> dict with ``dtype``
#: (code, bits, lanes), ``roles`` (``SA_DTYPE_*`` bits), ``safetensors_name`` and ``doc``.
DTYPE_INFO = _library_dtypes()
#: Name -> DLPack dtype tuple: the library's dtypes, and uint16, this package's own (the
#: numpy view of bfloat16 bits, see :meth:`State.numpy`).
DTYPES = {name: info["dtype"] for name, info in DTYPE_INFO.items()}
DTYPES["uint16"] = (1, 16, 1)
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
#: The names of the dtypes whose moments are stored in blocks (codes and a float32 absmax
#: per block: ``SA_DTYPE_BLOCK_MOMENT``), e.g. ``uint8``, ``float8_e4m3fn``.
BLOCK_MOMENT_DTYPES = frozenset(name for name, info in DTYPE_INFO.items()
                                if info["roles"] & _C.SA_DTYPE_BLOCK_MOMENT)
#: The names of the param dtypes cast from a float32 master under a scaling (the fp8 param
#: dtypes: ``SA_DTYPE_SCALED_PARAM``), e.g. ``float8_e4m3fn``, ``float8_e5m2``.
SCALED_PARAM_DTYPES = frozenset(name for name, info in DTYPE_INFO.items()
                                if info["roles"] & _C.SA_DTYPE_SCALED_PARAM)


def _library_scalings():
    table = {}
    for index in range(_C.sa_num_param_scalings()):
        status, info = _C.sa_param_scaling_describe(index)
        check(status)
        info["scale_dtype"] = tuple(info["scale_dtype"])
        table[info["name"]] = info
    return table


#: The ways an fp8 param is cast from its master, read from the library
#: (``sa_param_scaling_describe``): name (``"none"``, ``"delayed"``, ``"mxfp8"``,
#: ``"block128"``) -> dict with ``value`` (the ``SA_SCALING_*`` value), ``block`` (elements
#: per block along the last dim; 0: per tensor), ``scale_dtype``, ``step_writes_scale`` and
#: ``doc``.
SCALING_INFO = _library_scalings()
_SCALING_NAMES = {info["value"]: name for name, info in SCALING_INFO.items()}


def param_scalings():
    """The library's table of fp8 param scalings (``sa_param_scaling_describe``): one dict
    per scaling with its ``name``, ``value``, ``block`` (elements per block along the last
    dim, 0 for a per-tensor scale), ``scale_dtype`` (the name of the scale tensor's dtype),
    ``step_writes_scale`` (True: the step writes the scale; False: it reads it) and ``doc``."""
    return [dict(info, scale_dtype=dtype_name(info["scale_dtype"]), step_writes_scale=bool(info["step_writes_scale"]))
            for info in SCALING_INFO.values()]


def scaling_name(value):
    """The name of an ``SA_SCALING_*`` value, e.g. ``"mxfp8"``."""
    return _SCALING_NAMES[value]


def dtypes():
    """The library's table of the dtypes it stores (``sa_dtype``): one dict per dtype with
    its ``name``, ``dtype`` (DLPack code, bits, lanes), ``roles`` (bits of ``SA_DTYPE_PARAM``,
    ``SA_DTYPE_GRAD``, ``SA_DTYPE_MOMENT``, ``SA_DTYPE_STATE``, ``SA_DTYPE_FILE``,
    ``SA_DTYPE_BLOCK_MOMENT``, ``SA_DTYPE_SCALE``, ``SA_DTYPE_SCALED_PARAM``),
    ``safetensors_name`` (None when shard files never hold it) and ``doc``."""
    return [dict(info) for info in DTYPE_INFO.values()]

_DEVICE_NAMES = {KDL_CPU: "cpu", KDL_CUDA: "cuda", KDL_CUDA_HOST: "cuda_host", KDL_ROCM: "rocm",
                 KDL_CUDA_MANAGED: "cuda_managed"}


def dtype_name(dtype):
    """The name of a DLPack dtype tuple ``(code, bits, lanes)``, e.g. ``"bfloat16"``."""
    dtype = tuple(dtype)
    if dtype in _NAMES:
        return _NAMES[dtype]
    code, bits, lanes = dtype
    if code == 6:
        name = "bool"
    else:
        name = f"{_CODE_NAMES.get(code, f'code{code}_')}{bits}"
    return name if lanes == 1 else f"{name}x{lanes}"


def device_name(device):
    """``"cpu"`` or ``"cuda:1"`` for a DLPack device tuple ``(device_type, device_id)``."""
    device_type, device_id = device
    name = _DEVICE_NAMES.get(device_type, f"device_type {device_type}")
    return name if device_type == KDL_CPU else f"{name}:{device_id}"


def to_dtype(dtype):
    """A DLPack dtype tuple from a name (``"bfloat16"``), a numpy/ml_dtypes dtype or scalar
    type, a ``torch.dtype``, or a tuple ``(code, bits, lanes)``; None stays None."""
    if dtype is None or isinstance(dtype, tuple):
        return dtype
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(getattr(dtype, "name", None), str):  # numpy / ml_dtypes dtype objects
        name = dtype.name
    elif isinstance(dtype, type):  # numpy scalar types: np.float32, ml_dtypes.bfloat16
        name = dtype.__name__
    else:  # torch.float32 prints as "torch.float32"
        name = str(dtype)
    name = name.rsplit(".", 1)[-1]
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}") from None


def dlpack_stream(stream):
    """The DLPack handshake's value for a CUDA stream given as a cudaStream_t address:
    0/None (the legacy default stream) is 1 in the DLPack protocol; other handles,
    cudaStreamPerThread (2) among them, are passed as they are."""
    return 1 if not stream else int(stream)


def _numpy_ml_dtype(obj):
    """The library's dtype of a numpy array of an ml_dtypes dtype (bfloat16,
    float8_e4m3fn: numpy's DLPack export refuses them), or None."""
    name = getattr(getattr(obj, "dtype", None), "name", None)
    if type(obj).__module__ != "numpy" or not hasattr(obj, "view") or name not in DTYPE_INFO:
        return None
    dtype = DTYPES[name]
    return dtype if dtype[0] not in (0, 1, 2) else None  # not int, uint or float: numpy's own


def to_capsule(obj, stream=None):
    """A DLPack capsule of ``obj``: any object with ``__dlpack__`` (numpy, torch, cupy,
    jax, ...) or ``__array_interface__``, or a capsule already. A torch tensor that
    requires grad is exported through ``detach()`` (same memory).

    ``stream`` is the CUDA stream (a cudaStream_t address; None = the legacy default
    stream) that will read the tensor; it is passed to CUDA/ROCm producers only.
    """
    if type(obj).__name__ == "PyCapsule":
        return obj
    ml_dtype = _numpy_ml_dtype(obj)
    if ml_dtype is not None:  # exported as unsigned integers of its width, then renamed
        import numpy as np

        capsule = to_capsule(obj.view(np.dtype(f"uint{ml_dtype[1]}")))
        return _C.dlpack_capsule_set_dtype(capsule, *ml_dtype)
    if getattr(obj, "requires_grad", False) and hasattr(obj, "detach"):
        obj = obj.detach()  # torch exports no tensor that requires grad; detach() shares its memory
    if hasattr(obj, "__dlpack__"):
        kwargs = {}
        device_of = getattr(obj, "__dlpack_device__", None)
        if device_of is not None and device_of()[0] in _STREAM_DEVICES:
            kwargs["stream"] = dlpack_stream(stream)
        try:
            return obj.__dlpack__(max_version=(1, 0), **kwargs)
        except TypeError:  # a producer of the pre-1.0 protocol: no max_version keyword
            return obj.__dlpack__(**kwargs)
    if hasattr(obj, "__array_interface__"):
        import numpy as np

        return to_capsule(np.asarray(obj), stream)
    raise TypeError(f"expected a tensor with __dlpack__ or __array_interface__, got {type(obj).__name__}")


class CapsuleInfo:
    """What an unconsumed capsule describes (read without consuming it)."""

    __slots__ = ("data", "device", "dtype", "shape", "strides", "read_only", "versioned")

    def __init__(self, capsule):
        (self.data, self.device, self.dtype, self.shape, self.strides, self.read_only,
         self.versioned) = _C.dlpack_capsule_info(capsule)

    @property
    def numel(self):
        """Number of elements."""
        return math.prod(self.shape)


class _OneCapsule:
    """Hands one capsule to a DLPack consumer (numpy.from_dlpack wants an object)."""

    def __init__(self, capsule, device):
        self._capsule, self._device = capsule, device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        capsule, self._capsule = self._capsule, None
        if max_version is None or max_version[0] < 1:
            capsule = _C.dlpack_versioned_to_legacy(capsule)
        return capsule

    def __dlpack_device__(self):
        return self._device


class State:
    """A zero-copy view of one optimizer state of one param (``opt.state(param, key)``).

    It is consumed through DLPack: ``numpy.from_dlpack(state)``, ``torch.from_dlpack(state)``
    or ``cupy.from_dlpack(state)`` give an array sharing the optimizer's buffer; writes to
    it change the optimizer's state. The buffer stays valid as long as any array made from
    it lives, even after the optimizer is closed. Each ``__dlpack__`` call hands out a new
    capsule (the first was taken when the view was made; later ones need the optimizer
    open).

    CUDA: no stream synchronization is done on export. The buffer holds the result of the
    steps enqueued so far; a consumer on another stream than the one the steps ran on must
    synchronize with it first.

    Attributes: ``param`` (name), ``key``, ``shape``, ``dtype`` (a name such as
    ``"float32"``), ``device`` (a DLPack ``(device_type, device_id)`` tuple).
    """

    def __init__(self, optimizer, index, param, key):
        self._optimizer = optimizer
        self._index = index
        self.param = param
        self.key = key
        self._capsule = optimizer._state_capsule(index, key)
        info = CapsuleInfo(self._capsule)
        self.shape = tuple(info.shape)
        self._dltype = tuple(info.dtype)
        self.dtype = dtype_name(info.dtype)
        self.device = tuple(info.device)
        self.data_ptr = info.data

    def __repr__(self):
        return (f"State(param={self.param!r}, key={self.key!r}, shape={self.shape}, dtype={self.dtype}, "
                f"device={device_name(self.device)})")

    def __dlpack_device__(self):
        """The DLPack device ``(device_type, device_id)`` of the state."""
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of the state (versioned when ``max_version >= (1, 0)``, legacy
        otherwise). Never a copy: ``copy=True`` and other devices raise BufferError."""
        if copy:
            raise BufferError("a shardadam state view is never copied; copy the array you make from it")
        if dl_device is not None and tuple(dl_device) != self.device:
            raise BufferError(f"the state is on {device_name(self.device)}, not {device_name(tuple(dl_device))}")
        capsule, self._capsule = self._capsule, None
        if capsule is None:
            capsule = self._optimizer._state_capsule(self._index, self.key)
        if max_version is None or max_version[0] < 1:
            capsule = _C.dlpack_versioned_to_legacy(capsule)
        return capsule

    def numpy(self):
        """The state as a numpy array sharing its memory (host states only).

        bfloat16 and float8 states come out as arrays of ml_dtypes' dtype of that name
        (``ml_dtypes.bfloat16``, ``ml_dtypes.float8_e4m3fn``, ...; needs ml-dtypes)."""
        import numpy as np

        if self.device[0] not in _HOST_DEVICES:
            raise TypeError(f"the state is on {device_name(self.device)}; use that device's array library "
                            "(torch.from_dlpack, cupy.from_dlpack)")
        capsule = self.__dlpack__(max_version=(1, 0))
        code, bits, _ = self._dltype
        if code not in (0, 1, 2):  # bfloat16, float8_*: numpy's DLPack import refuses them
            import ml_dtypes

            _C.dlpack_capsule_set_dtype(capsule, 1, bits, 1)
            return np.from_dlpack(_OneCapsule(capsule, self.device)).view(getattr(ml_dtypes, self.dtype))
        return np.from_dlpack(_OneCapsule(capsule, self.device))

    def __array__(self, dtype=None, copy=None):
        """``numpy.asarray(state)``: as :meth:`numpy` (no copy unless a dtype asks for one)."""
        array = self.numpy()
        if copy:
            array = array.copy()
        return array if dtype is None else array.astype(dtype, copy=bool(copy))
