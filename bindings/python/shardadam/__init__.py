"""shardadam: fused Adam/AdamW over the local shards of globally shaped parameters.

The package wraps the C ABI of libshardadam (``include/shardadam/shardadam.h``), which it
carries inside. The pieces:

- :class:`Optimizer` takes params from any DLPack producer (numpy, torch, cupy, jax) with a
  layout (:class:`Mesh` with :class:`Shard` / :class:`Replicate` placements, or
  :class:`Box`), binds grads, steps, and hands out zero-copy :class:`State` views;
  ``save`` / ``load`` write and read (resharding) shard files.
- :mod:`shardadam.torch` has :class:`shardadam.torch.FusedAdam`, a
  ``torch.optim.Optimizer`` (imported only when used: this package does not need torch).
- :class:`Comm` (host callable, or NCCL from :func:`nccl_unique_id`) given to
  :meth:`Optimizer.set_comm` makes the gradient norm of ``step(max_grad_norm=...)`` and
  the found-inf skip global across ranks.
- Failures raise a subclass of :class:`Error` per status, carrying ``.status`` and the
  library's message.
- :mod:`shardadam._shardadam` is the low-level SWIG module (one function per C function).

Example::

    import numpy as np, shardadam
    w = np.ones((4, 3), np.float32)
    g = np.full((4, 3), 0.5, np.float32)
    with shardadam.Optimizer(lr=1e-2) as opt:
        opt.add_param("w", w)
        opt.set_grad("w", g)
        opt.step()                      # w is updated in place
        m = np.from_dlpack(opt.state("w", "exp_avg"))
"""
from . import _shardadam
from ._comm import Comm, comm_available, nccl_unique_id
from ._dlpack import State, dtypes, param_scalings
from ._errors import (CommError, DeviceError, Error, FormatError, InternalError, InvalidArgument, IoError,
                      Mismatch, OutOfMemory, StateError, Status, Unsupported)
from ._optimizer import (Group, Optimizer, ParamInfo, SaveJob, group_defaults, group_fields, inspect,
                         state_io_available, struct_fields)
from .layout import Box, Mesh, Partial, Replicate, Shard


def _version_string(number):
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}"


if _shardadam.sa_version() // 10000 != _shardadam.SA_VERSION_MAJOR:
    raise ImportError(f"shardadam: the loaded libshardadam is {_version_string(_shardadam.sa_version())}, "
                      f"the bindings were built for {_version_string(_shardadam.SA_VERSION_NUMBER)}")

#: Version of the loaded library.
__version__ = _version_string(_shardadam.sa_version())


def build_info():
    """The library's build line: version and backends compiled in (``sa_build_info``)."""
    return _shardadam.sa_build_info()


__all__ = [
    "Optimizer", "Group", "ParamInfo", "SaveJob", "State", "Comm", "nccl_unique_id", "comm_available", "Mesh", "Box", "Shard", "Replicate", "Partial",
    "Error", "Status", "InvalidArgument", "Unsupported", "OutOfMemory", "DeviceError", "CommError", "IoError",
    "FormatError", "Mismatch", "StateError", "InternalError", "inspect", "state_io_available", "group_defaults", "group_fields", "struct_fields", "dtypes", "param_scalings",
    "build_info",
    "__version__",
]
