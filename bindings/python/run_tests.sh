#!/usr/bin/env bash
# bindings/python/run_tests.sh — the Python bindings' tests, as CI runs them (scripts/test
# calls it): pip-installs the package from this checkout into a throwaway virtual
# environment (build/python/venv, made anew each run) and runs bindings/python/tests with
# pytest against the installed package. The CMake build is kept in build/python/cmake so
# that a second run rebuilds only what changed.
#
# Needs python3 (with venv), the build tools of pyproject.toml (a C/C++ compiler, CMake,
# SWIG, libhwy-dev) and PyPI (scikit-build-core, apache-tvm-ffi, numpy, pytest, ml-dtypes,
# safetensors; torch, transformers, accelerate, lightning unless SHARDADAM_TEST_TORCH=0).
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$root/build/python"
venv="$work/venv"
pip_quiet=(--quiet --disable-pip-version-check)

rm -rf "$venv"
mkdir -p "$work"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install "${pip_quiet[@]}" numpy pytest ml-dtypes safetensors
# The torch face (FusedAdam, DCP over gloo) and the real clients (HF Trainer, Lightning) run on
# the CPU too. PyPI's torch wheel brings its CUDA libraries (~4 GB, about a minute here);
# SHARDADAM_TEST_TORCH=0 skips them (those tests then say they are skipped). torch is pinned
# to the GPU machine's 2.11: a newer torch needs a newer NCCL than the CUDA toolkit's, and
# libshardadam, built against the toolkit's libnccl.so.2 and imported first, makes torch
# bind to that one ("undefined symbol: ncclCommResume" with torch 2.15).
if [ "${SHARDADAM_TEST_TORCH:-1}" = 1 ]; then
  "$venv/bin/python" -m pip install "${pip_quiet[@]}" "torch==2.11.*" transformers accelerate lightning "bitsandbytes==0.50.*"
fi
# -Werror for the SWIG wrapper as for the library. The CUDA parts only where a GPU can run
# them (AUTO: when a toolkit is found): without one, scripts/test's build/ has compiled them
# already, and compiling them again is minutes of CI for no test.
cuda=OFF
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=AUTO; fi
"$venv/bin/python" -m pip install "${pip_quiet[@]}" "$root/bindings/python" \
  -C build-dir="$work/cmake" -C cmake.define.SHARDADAM_WERROR=ON -C cmake.define.SHARDADAM_CUDA="$cuda"

# Run from outside the source tree so that `import shardadam` is the installed package.
cd "$work"
"$venv/bin/python" -c "import shardadam; print('shardadam', shardadam.__version__, 'from', shardadam.__file__)"
exec "$venv/bin/python" -m pytest -p no:cacheprovider -ra "$root/bindings/python/tests" "$@"
