# tests/python/conftest.py — the shard files every test reads, written once per session by
# the C++ helper (SHARDADAM_WRITE_SHARDS, set by CTest), and the paths of the tools.
import os
import subprocess

import pytest

try:
    import ml_dtypes  # (bfloat16 and float8 for numpy: safetensors returns BF16 through it)
    import numpy
    import safetensors  # noqa: F401
except ImportError as e:  # pragma: no cover
    raise ImportError(
        f"{e}: the shard-file tests need numpy, safetensors and ml-dtypes from PyPI "
        "(scripts/common.sh installs them: pip install safetensors numpy ml-dtypes pytest)") from e

# safetensors' numpy face looks F8_E4M3 up as numpy.float8_e4m3fn, which numpy does not
# define (safetensors 0.8); ml_dtypes' type is the one it means. (Its torch face reads
# F8_E4M3 as torch.float8_e4m3fn: bindings/python/tests/test_fp8_moments.py.)
if not hasattr(numpy, "float8_e4m3fn"):
    numpy.float8_e4m3fn = ml_dtypes.float8_e4m3fn


def _tool(variable):
    path = os.environ.get(variable)
    if not path or not os.path.exists(path):
        pytest.fail(f"{variable} is not set to a built program (run these tests through ctest)")
    return path


@pytest.fixture(scope="session")
def inspect_tool():
    return _tool("SHARDADAM_INSPECT")


@pytest.fixture(scope="session")
def shard_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    for mesh in ("fsdp", "hsdp"):
        (out / mesh).mkdir()
    subprocess.run([_tool("SHARDADAM_WRITE_SHARDS"), str(out)], check=True)
    return out
