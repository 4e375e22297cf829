"""Communicators (``sa_comm``): what a step uses for the global gradient norm and the
found-inf consensus across ranks."""
import operator

from . import _shardadam as _C
from ._errors import CommError, StateError, check
from ._handle import OwnsHandle

_OP_NAMES = {_C.SA_REDUCE_SUM: "sum", _C.SA_REDUCE_MAX: "max"}


def comm_available():
    """True: every libshardadam provides communicators (``sa_comm_*``). Kept for code
    written against 0.2, whose Python module also loaded a library built without them."""
    return True


def nccl_unique_id():
    """A new NCCL unique id (128 bytes, ``ncclGetUniqueId``): rank 0 makes it and sends it
    to the other ranks (e.g. ``torch.distributed.broadcast_object_list``), then every rank
    calls :meth:`Comm.nccl` with it. :class:`Unsupported` without NCCL in the build."""
    status, uid = _C.sa_nccl_unique_id_create()
    check(status)
    return uid


def _array(buffer, dtype, code):
    """A bytearray as a numpy array of `dtype` over it (a memoryview of `code` where numpy
    is missing: numpy is optional for the package)."""
    try:
        import numpy
    except ImportError:
        return memoryview(buffer).cast(code)
    return numpy.frombuffer(buffer, dtype=dtype)


class _Reducer:
    """What the library's all_reduce and all_to_all call (through the module's C
    trampolines): hands the doubles to the user's callables as float64 arrays and keeps the
    exception one raised (``exception``) for :meth:`Optimizer.step` to raise."""

    def __init__(self, all_reduce, all_to_all=None, nranks=0):
        self.all_reduce = all_reduce
        self.all_to_all = all_to_all
        self.nranks = nranks
        self.exception = None

    def __call__(self, buffer, op):
        values = _array(buffer, "float64", "d")
        # The trampoline records any exception as self.exception; None from here is success.
        result = self.all_reduce(values, _OP_NAMES[op])
        if result is not None and result is not values:
            raise TypeError(f"all_reduce must reduce the values in place and return None, it returned {result!r}")

    def exchange(self, send, send_bytes, recv, recv_bytes):
        result = self.all_to_all(_array(send, "uint8", "B"), send_bytes, _array(recv, "uint8", "B"), recv_bytes)
        if result is not None:
            raise TypeError(f"all_to_all must fill recv in place and return None, it returned {result!r}")


class Comm(OwnsHandle):
    """A communicator for :meth:`Optimizer.set_comm`: it reduces a few numbers per step
    (partial gradient norms, found-inf flags) across every rank holding part of the params.

    ``Comm(all_reduce)`` makes a host communicator from a Python callable
    ``all_reduce(values, op)``: ``values`` is a float64 numpy array (a memoryview of
    doubles where numpy is missing) to be replaced in place by its element-wise ``op``
    (``"sum"`` or ``"max"``) over all ranks. Every rank calls it with the same length and
    op; it is called on the thread running :meth:`Optimizer.step`, holding the GIL (so a
    blocking callable must release it, as ``threading`` primitives and
    ``torch.distributed`` do). An exception it raises fails the step on this rank with
    :class:`CommError` before anything changed, carrying the exception as ``__cause__``
    (but while split Muon matrices are carried, after the update: the other params stepped).
    The communicator keeps the callable alive as long as the library holds it.

    ``rank`` and ``nranks`` (optional, together): this rank's number among the ranks of the
    transport, 0 to ``nranks - 1``. Given, each Muon matrix split across ranks is
    orthogonalized on one rank, its owner, instead of on every rank; the first step checks
    that the ranks say each number once and that their parts of each matrix cover it once.

    ``all_to_all`` (optional, with ``rank``): a callable ``all_to_all(send, send_bytes,
    recv, recv_bytes)`` that sends ``send_bytes[r]`` bytes to each rank ``r`` and fills
    ``recv`` (uint8, in place) with ``recv_bytes[r]`` bytes from each, the blocks in rank
    order, as ``torch.distributed.all_to_all_single`` does with uint8 tensors. It carries the split Muon matrices'
    parts to their owners and back; without it ``all_reduce`` carries every rank's parts to
    every rank (the same results, with memory and traffic that grow with the rank count).

    :meth:`nccl` creates an NCCL communicator from a unique id (:func:`nccl_unique_id`);
    :meth:`wrap_nccl` borrows an existing ``ncclComm_t``. An NCCL communicator reduces on
    the device, on the step's stream, without waiting on the host.

    An optimizer given the communicator keeps it alive; :meth:`close` releases only this
    object's reference. Usable as a context manager.
    """

    def __init__(self, all_reduce, rank=None, nranks=None, all_to_all=None):
        if not callable(all_reduce):
            raise TypeError(f"Comm: all_reduce must be callable, got {type(all_reduce).__name__}")
        if (rank is None) != (nranks is None):
            raise TypeError("Comm: give rank and nranks together, or neither")
        if all_to_all is not None and (not callable(all_to_all) or rank is None):
            raise TypeError("Comm: all_to_all must be a callable, given with rank and nranks")
        self._handle = None
        said = (0, 0) if rank is None else (operator.index(rank), operator.index(nranks))
        self._reducer = _Reducer(all_reduce, all_to_all, said[1])
        self._init(*_C.host_comm_create(self._reducer, *said, all_to_all is not None), kind="host")

    @classmethod
    def nccl(cls, unique_id, nranks, rank, device):
        """Creates an NCCL communicator of ``nranks`` ranks on CUDA device ``device``
        (an index) as ``rank``. Collective: returns once every rank has called it with
        the same ``unique_id`` (the bytes of :func:`nccl_unique_id`)."""
        if not isinstance(unique_id, (bytes, bytearray)):
            raise TypeError(f"Comm.nccl: unique_id must be the bytes of nccl_unique_id(), got "
                            f"{type(unique_id).__name__}")
        comm = cls.__new__(cls)
        comm._handle, comm._reducer = None, None
        comm._init(*_C.sa_comm_create_nccl(bytes(unique_id), int(nranks), int(rank), int(device)), kind="nccl")
        return comm

    @classmethod
    def wrap_nccl(cls, nccl_comm):
        """Borrows the caller's ``ncclComm_t`` (its address, an int). The caller keeps it
        alive and idle during steps until every optimizer given it is closed or given
        another communicator."""
        if not isinstance(nccl_comm, int) or not nccl_comm:
            raise TypeError(f"Comm.wrap_nccl: nccl_comm must be a nonzero ncclComm_t address (int), got {nccl_comm!r}")
        comm = cls.__new__(cls)
        comm._handle, comm._reducer = None, None
        comm._init(*_C.sa_comm_wrap_nccl(nccl_comm), kind="nccl")
        return comm

    def _init(self, status, handle, kind):
        check(status)
        self._handle = handle
        self.kind = kind

    # ---- properties ------------------------------------------------------------------
    @property
    def rank(self):
        """This rank; None for a host communicator made without one."""
        return self._info()[0]

    @property
    def nranks(self):
        """The number of ranks; None for a host communicator made without them."""
        return self._info()[1]

    def _info(self):
        status, rank, nranks = _C.sa_comm_info(self._handle_or_raise())
        check(status)
        return (None, None) if rank < 0 else (rank, nranks)

    def _take_exception(self):
        """The exception the host callable raised in the last step, cleared (None if none)."""
        if self._reducer is None:
            return None
        exception, self._reducer.exception = self._reducer.exception, None
        return exception

    # ---- lifetime --------------------------------------------------------------------
    def _handle_or_raise(self):
        if self._handle is None:
            raise StateError("the communicator is closed")
        return self._handle

    def close(self):
        """Releases this object's reference (optimizers given it keep theirs). Calling it
        again is a no-op."""
        handle, self._handle = self._handle, None
        if handle is not None:
            _C.sa_comm_destroy(handle)

    def __repr__(self):
        if self._handle is None:
            return "<shardadam.Comm (closed)>"
        if self.kind == "host":
            return f"<shardadam.Comm: host, {self._reducer.all_reduce!r}>"
        return f"<shardadam.Comm: nccl, rank {self.rank} of {self.nranks}>"


def raise_step_error(comm, error):
    """Re-raises a failed step's :class:`CommError` with the exception a host callable
    raised (if any) in its message and as its cause; other errors unchanged."""
    exception = comm._take_exception() if comm is not None else None
    if exception is None or not isinstance(error, CommError):
        raise error
    raise CommError(f"{error.message}; the communicator's callable raised {type(exception).__name__}: "
                    f"{exception}") from exception
