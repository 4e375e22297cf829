"""Failures raise the shardadam.Error subclass of their status, with the library's message
(which names the function and the param), and change nothing."""
import sys

import numpy as np
import pytest

import shardadam
from shardadam import Mesh, Partial, Shard, Status

ml_dtypes = pytest.importorskip("ml_dtypes")


@pytest.fixture
def opt():
    with shardadam.Optimizer() as optimizer:
        yield optimizer


def test_every_error_class_is_an_error_with_its_status():
    for cls, status in [(shardadam.InvalidArgument, Status.INVALID_ARGUMENT),
                        (shardadam.Unsupported, Status.UNSUPPORTED), (shardadam.OutOfMemory, Status.OUT_OF_MEMORY),
                        (shardadam.DeviceError, Status.DEVICE), (shardadam.CommError, Status.COMM),
                        (shardadam.IoError, Status.IO), (shardadam.FormatError, Status.FORMAT),
                        (shardadam.Mismatch, Status.MISMATCH), (shardadam.StateError, Status.STATE),
                        (shardadam.InternalError, Status.INTERNAL)]:
        assert issubclass(cls, shardadam.Error)
        assert cls.status == status
    assert issubclass(shardadam.InvalidArgument, ValueError)
    assert issubclass(shardadam.OutOfMemory, MemoryError)


def test_grad_dtype_mismatch_names_the_param(opt):
    opt.add_param("fit.w", np.zeros((2, 3), np.float32), grad_dtype="bfloat16")
    with pytest.raises(shardadam.Mismatch) as err:
        opt.set_grad("fit.w", np.zeros((2, 3), np.float32))
    assert err.value.status == Status.MISMATCH
    message = err.value.message
    assert message.startswith("sa_optimizer_set_grad: ") and "'fit.w'" in message
    assert "float32" in message and "bfloat16" in message
    assert "SA_ERR_MISMATCH" in str(err.value)
    # The bfloat16 grad it asked for binds.
    opt.set_grad("fit.w", np.zeros((2, 3), ml_dtypes.bfloat16))


def test_grad_shape_mismatch_names_both_shapes(opt):
    opt.add_param("w", np.zeros((2, 3), np.float32))
    with pytest.raises(shardadam.Mismatch, match=r"'w'.*\[3, 2\].*\[2, 3\]|'w'.*\[2, 3\].*\[3, 2\]"):
        opt.set_grad("w", np.zeros((3, 2), np.float32))


def test_duplicate_name_is_an_invalid_argument(opt):
    opt.add_param("w", np.zeros(3, np.float32))
    with pytest.raises(shardadam.InvalidArgument, match="'w'.*already registered"):
        opt.add_param("w", np.zeros(3, np.float32))
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError too
        opt.add_param("w", np.zeros(3, np.float32))
    assert opt.num_params == 1


def test_unknown_group_and_param_and_state_key(opt):
    with pytest.raises(shardadam.InvalidArgument, match="group 3 does not exist"):
        opt.add_param("w", np.zeros(3, np.float32), group=3)
    opt.add_param("w", np.zeros(3, np.float32))
    with pytest.raises(shardadam.InvalidArgument, match="nope"):
        opt.set_grad("nope", np.zeros(3, np.float32))
    with pytest.raises(shardadam.InvalidArgument, match="master"):
        opt.state("w", "master")  # a float32 param has no master copy


def test_step_without_grads_is_a_state_error_and_changes_nothing(opt):
    w = np.ones(3, np.float32)
    opt.add_param("w", w)
    with pytest.raises(shardadam.StateError, match="'w'"):
        opt.step()
    assert np.all(w == 1) and opt.param_groups[0].step == 0


def test_bad_shards_are_refused_with_the_reason(opt):
    read_only = np.zeros(3, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(shardadam.InvalidArgument, match="read-only"):
        opt.add_param("ro", read_only)
    strided = np.zeros((4, 6), np.float32)[:, ::2]
    with pytest.raises(shardadam.InvalidArgument, match="C-contiguous"):
        opt.add_param("strided", strided)
    with pytest.raises(shardadam.Unsupported, match="float64"):
        opt.add_param("f64", np.zeros(3, np.float64))
    with pytest.raises(shardadam.Unsupported, match="SA_MASTER_REMAINDER needs a bfloat16 param"):
        opt.add_param("rem", np.zeros(3, np.float32), master="remainder")
    with pytest.raises(shardadam.InvalidArgument, match="[Pp]artial"):
        opt.add_param("p", np.zeros(4, np.float32), layout=Mesh((2,), (0,), [Partial()]))
    with pytest.raises((shardadam.InvalidArgument, shardadam.Mismatch), match="'wrong'"):
        # rank 1 of 10 rows over 4 holds 3 rows, not 4
        opt.add_param("wrong", np.zeros((4, 2), np.float32), layout=Mesh((4,), (1,), [Shard(0)], global_shape=(10, 2)))
    assert opt.num_params == 0


def test_invalid_hyperparameters():
    with pytest.raises(shardadam.InvalidArgument, match="lr"):
        shardadam.Optimizer(lr=-1.0)
    with pytest.raises(shardadam.InvalidArgument, match="beta"):
        shardadam.Optimizer(betas=(1.0, 0.999))
    with shardadam.Optimizer() as opt:
        with pytest.raises(shardadam.InvalidArgument, match="eps"):
            opt.param_groups[0].eps = -1.0
        with pytest.raises(TypeError, match="unknown hyperparameters"):
            opt.add_group(dampening=0.9)


def test_amsgrad_cannot_change_once_the_group_holds_params(opt):
    opt.add_param("w", np.zeros(3, np.float32))
    with pytest.raises(shardadam.StateError, match="amsgrad"):
        opt.param_groups[0].amsgrad = True
    assert opt.param_groups[0].amsgrad is False


def test_a_closed_optimizer_refuses_calls():
    opt = shardadam.Optimizer()
    opt.close()
    opt.close()  # idempotent
    assert opt.closed
    with pytest.raises(shardadam.StateError, match="closed"):
        opt.add_param("w", np.zeros(3, np.float32))
    with pytest.raises(shardadam.StateError, match="closed"):
        opt.step()


def test_wrong_argument_types_raise_type_errors(opt):
    with pytest.raises(TypeError, match="__dlpack__"):
        opt.add_param("w", [1.0, 2.0])
    with pytest.raises(TypeError, match="layout"):
        opt.add_param("w", np.zeros(2, np.float32), layout=(2,))
    opt.add_param("w", np.zeros(2, np.float32))
    opt.set_grad("w", np.zeros(2, np.float32))
    with pytest.raises(shardadam.InvalidArgument, match="one-element float32"):
        opt.step(inv_grad_scale=np.zeros(1, np.float64))
    with pytest.raises(shardadam.InvalidArgument, match="2 grads for 1 params"):
        opt.set_grads([np.zeros(2, np.float32), np.zeros(2, np.float32)])
    with pytest.raises(TypeError, match="raw addresses are not accepted"):
        opt.set_grads([0])  # a raw address: shardadam cannot check memory it cannot see
    with pytest.raises(TypeError, match="raw addresses are not accepted"):
        shardadam._shardadam.sa_optimizer_set_grads(opt._handle, [0])  # nor can the low-level module


def test_a_failed_add_param_leaves_the_array_to_the_caller(opt):
    """On failure the capsule is not consumed: its deleter runs and the array's reference
    count is what it was."""
    w = np.zeros(3, np.float64)
    before = sys.getrefcount(w)
    for _ in range(3):
        with pytest.raises(shardadam.Unsupported):
            opt.add_param("w", w)
    assert sys.getrefcount(w) == before


def test_low_level_capsule_is_renamed_only_on_success(opt):
    """The SWIG typemap marks a capsule consumed ("used_dltensor_versioned") exactly when
    the library took ownership."""
    low = shardadam._shardadam
    handle = opt._handle
    bad = np.zeros(3, np.float64).__dlpack__(max_version=(1, 0))
    status, _ = low.sa_optimizer_add_param(handle, "bad", 0, bad, None, None)
    assert status == Status.UNSUPPORTED and '"dltensor_versioned"' in repr(bad)
    good = np.zeros(3, np.float32).__dlpack__(max_version=(1, 0))
    status, index = low.sa_optimizer_add_param(handle, "good", 0, good, None, None)
    assert (status, index) == (Status.OK, 0) and '"used_dltensor_versioned"' in repr(good)
    with pytest.raises(TypeError, match="unconsumed"):
        low.sa_optimizer_add_param(handle, "again", 0, good, None, None)
