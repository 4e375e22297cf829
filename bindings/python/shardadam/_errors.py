"""Statuses of the C ABI as an enum, and one exception class per failing status."""
import enum

from . import _shardadam as _C


class Status(enum.IntEnum):
    """``sa_status`` of the C ABI."""

    OK = _C.SA_OK
    INVALID_ARGUMENT = _C.SA_ERR_INVALID_ARGUMENT
    UNSUPPORTED = _C.SA_ERR_UNSUPPORTED
    OUT_OF_MEMORY = _C.SA_ERR_OUT_OF_MEMORY
    DEVICE = _C.SA_ERR_DEVICE
    COMM = _C.SA_ERR_COMM
    IO = _C.SA_ERR_IO
    FORMAT = _C.SA_ERR_FORMAT
    MISMATCH = _C.SA_ERR_MISMATCH
    STATE = _C.SA_ERR_STATE
    INTERNAL = _C.SA_ERR_INTERNAL


class Error(Exception):
    """A shardadam call failed.

    Attributes:
        status: the :class:`Status` the C call returned.
        message: the library's explanation (which function, which param, what was
            expected and what arrived), as ``sa_optimizer_last_error`` gave it.
    """

    status = Status.INTERNAL

    def __init__(self, message, status=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = Status(status)

    def __str__(self):
        return f"{self.message} [{_C.sa_status_string(int(self.status))}]"


class InvalidArgument(Error, ValueError):
    """A NULL, out-of-range or inconsistent argument (``SA_ERR_INVALID_ARGUMENT``)."""

    status = Status.INVALID_ARGUMENT


class Unsupported(Error):
    """A valid request this build or backend cannot serve (``SA_ERR_UNSUPPORTED``)."""

    status = Status.UNSUPPORTED


class OutOfMemory(Error, MemoryError):
    """An allocation failed; nothing was changed (``SA_ERR_OUT_OF_MEMORY``)."""

    status = Status.OUT_OF_MEMORY


class DeviceError(Error):
    """The device backend reported an error (``SA_ERR_DEVICE``)."""

    status = Status.DEVICE


class CommError(Error):
    """A communicator operation failed (``SA_ERR_COMM``)."""

    status = Status.COMM


class IoError(Error):
    """Reading or writing a blob failed (``SA_ERR_IO``)."""

    status = Status.IO


class FormatError(Error):
    """A blob is not a valid shard file (``SA_ERR_FORMAT``)."""

    status = Status.FORMAT


class Mismatch(Error):
    """Data disagrees with what is registered: dtype, shape, device (``SA_ERR_MISMATCH``)."""

    status = Status.MISMATCH


class StateError(Error):
    """The call is not allowed in the optimizer's current state (``SA_ERR_STATE``)."""

    status = Status.STATE


class InternalError(Error):
    """A bug in shardadam; please report the message (``SA_ERR_INTERNAL``)."""

    status = Status.INTERNAL


_CLASS_OF_STATUS = {cls.status: cls for cls in (
    InvalidArgument, Unsupported, OutOfMemory, DeviceError, CommError, IoError, FormatError,
    Mismatch, StateError, InternalError)}


def error_for(status, message):
    """The exception for a failing ``status`` carrying ``message``."""
    try:
        cls = _CLASS_OF_STATUS[Status(status)]
    except ValueError:  # a status newer than this package
        return Error(message, status=Status.INTERNAL)
    return cls(message)


def check(status, handle=None):
    """Raises the :class:`Error` subclass of ``status`` unless it is SA_OK.

    The message is read from ``handle`` (``sa_optimizer_last_error``), or from the
    thread-local ``sa_last_error`` for handle-less calls. Call it right after the failing
    call: the next call on the same handle replaces the message.
    """
    if status != _C.SA_OK:
        message = _C.sa_optimizer_last_error(handle) if handle is not None else _C.sa_last_error()
        raise error_for(status, message)
