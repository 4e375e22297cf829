"""The package as a whole: it is an installed copy carrying its own native libraries, the
low-level module covers the C ABI, versions agree, and the torch integration does not need
torch to import."""
import importlib.util
import os
import pathlib
import re
import sysconfig

import pytest

import shardadam
from shardadam import _shardadam

HEADER = pathlib.Path(__file__).resolve().parents[3] / "include" / "shardadam" / "shardadam.h"
# Called by the low-level module's own typemaps and destructors instead of from Python;
# sa_comm_create_host takes C callbacks: the module's host_comm_create makes them from a callable.
# sa_optimizer_set_grad_ptrs trusts its caller with raw memory: Python reaches only the checked
# sa_optimizer_set_grads. The param step counts travel as lists (param_steps_get/_set).
NOT_WRAPPED = {"sa_free", "sa_writer_release", "sa_reader_release", "sa_comm_create_host",
               "sa_optimizer_set_grad_ptrs", "sa_optimizer_get_param_steps", "sa_optimizer_set_param_steps",
               "sa_optimizer_state_keys", "sa_optimizer_checkpoint_keys",  # all three wrapped as state_keys_get
               "sa_optimizer_moment_keys",
               "sa_optimizer_step_params",  # an int64_t array: wrapped as step_params
               "sa_struct_default"}  # a void* struct: the typemaps start from it, the classes from SA_*_INIT


PACKAGE = pathlib.Path(shardadam.__file__).resolve().parent


def test_the_package_is_the_installed_copy_in_site_packages():
    site_packages = {pathlib.Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    assert PACKAGE.parent in site_packages, f"shardadam imported from {PACKAGE}, not from {sorted(site_packages)}"


def test_the_library_loaded_is_the_one_inside_the_package():
    loaded = {os.path.realpath(line.split()[-1]) for line in pathlib.Path("/proc/self/maps").read_text().splitlines()
              if "libshardadam.so" in line}
    assert loaded == {str(PACKAGE / "libshardadam.so.0")}


def test_the_cuda_module_is_found_beside_the_library_in_the_package():
    # A wheel of a CUDA build carries the module (a CPU-only one does not); either way the
    # library says so, and it must find a carried module without LD_LIBRARY_PATH.
    info = shardadam.build_info()
    module = PACKAGE / "libshardadam-cuda.so"
    if not module.exists():
        assert "; cuda: not built;" in info
    else:
        loaded = re.search(r"; cuda: module (\S+) \(", info)
        assert loaded, f"the package carries {module}, but the library says: {info}"
        assert os.path.realpath(loaded.group(1)) == str(module)


def test_low_level_module_wraps_every_function_of_the_header():
    declared = set(re.findall(r"^SA_API\s[^;]*?\b(sa_\w+)\s*\(", HEADER.read_text(), flags=re.M | re.S))
    assert len(declared) > 30
    missing = sorted(name for name in declared - NOT_WRAPPED if not hasattr(_shardadam, name))
    assert missing == []


def test_versions_agree():
    assert _shardadam.sa_version() == _shardadam.SA_VERSION_NUMBER
    assert shardadam.__version__ == "{}.{}.{}".format(
        _shardadam.SA_VERSION_MAJOR, _shardadam.SA_VERSION_MINOR, _shardadam.SA_VERSION_PATCH)
    assert shardadam.build_info().startswith(f"shardadam {shardadam.__version__}")


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_torch_module_imports_without_torch():
    import shardadam.torch

    with pytest.raises(ImportError, match="needs PyTorch"):
        shardadam.torch.FusedAdam
