#!/usr/bin/env bash
# bindings/rust/gpu/run_on_gpu.sh — on a GPU machine without cargo (the lent H200 machines):
# runs the Rust binaries that bindings/rust/gpu/stage.sh built elsewhere and left in
# bindings/rust/gpu/bin/, against a CUDA build of the library made here:
#
#   training      the regression in host memory, then in CUDA device memory (300 steps,
#                 each checked against the float64 reference; the loss must fall), and a
#                 step reading its loss scale and found-inf flag from device memory
#                 (StepArgs::inv_grad_scale_at, found_inf_at, grad_norm_at)
#   bound_grads   the binding checks, now against a library with its CUDA backend
#   gpu_step      the example of docs/rust.md
#
# The library: $SHARDADAM_GPU_BUILD if set, else build-gpu/ when it holds libshardadam.so.0
# and libshardadam-cuda.so (bench/gpu_step's build), else its own build in build-gpu-rust/
# (sm_90, no tests). Carry with the tree (git-ignored): bindings/rust/gpu/bin/, .debs/
# (libhwy1, libhwy-dev, nlohmann-json3-dev: Highway is needed at run time too) and, for a
# build, .deps/dlpack/dlpack/dlpack.h. The CUDA runtime the binaries dlopen is
# $SHARDADAM_CUDART, else the first libcudart found in /usr/local/cuda/lib64 or the torch
# venv's nvidia packages. SHARDADAM_REQUIRE_GPU=1 turns a missing GPU into a failure.
# The binaries' rpath names the build machine's directory; LD_LIBRARY_PATH (searched
# first: it is a RUNPATH) points them at the library here. Logs go to $OUT (./gpu_out).
set -uo pipefail
cd "$(dirname "$0")/../../.."
repo=$PWD
OUT=${OUT:-$repo/gpu_out}
mkdir -p "$OUT"
bin=bindings/rust/gpu/bin
for f in training bound_grads gpu_step; do
  [ -x "$bin/$f" ] || { echo "missing $bin/$f: run bindings/rust/gpu/stage.sh where cargo is and carry $bin"; exit 1; }
done

prefix=/tmp/sa_prefix
mkdir -p "$prefix"
for f in .debs/*.deb; do [ -e "$f" ] && dpkg -x "$f" "$prefix"; done
export CMAKE_PREFIX_PATH=$prefix/usr

lib=${SHARDADAM_GPU_BUILD:-}
if [ -z "$lib" ]; then
  if [ -f build-gpu/libshardadam.so.0 ] && [ -f build-gpu/libshardadam-cuda.so ]; then
    lib=build-gpu
  else
    lib=build-gpu-rust
    echo "== building the library in $lib (sm_90)"
    cmake -S . -B "$lib" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDADAM_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DDLPack_INCLUDE_DIR="$repo/.deps/dlpack" \
      -DSHARDADAM_BUILD_TESTS=OFF -DSHARDADAM_BUILD_EXAMPLES=OFF -DSHARDADAM_BUILD_BENCH=OFF \
      > "$OUT/rust_configure.log" 2>&1 || { tail -30 "$OUT/rust_configure.log"; exit 1; }
    cmake --build "$lib" -j "$(nproc)" > "$OUT/rust_build.log" 2>&1 || { grep -B2 -A8 error "$OUT/rust_build.log" | head -60; exit 1; }
  fi
fi
[ -f "$lib/libshardadam-cuda.so" ] || { echo "$lib has no libshardadam-cuda.so: not a CUDA build"; exit 1; }

if [ -z "${SHARDADAM_CUDART:-}" ]; then
  for c in /usr/local/cuda/lib64/libcudart.so /usr/local/cuda/lib64/libcudart.so.1[0-9] \
    /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib/libcudart.so*; do
    [ -e "$c" ] && { SHARDADAM_CUDART=$c; break; }
  done
fi
[ -n "${SHARDADAM_CUDART:-}" ] || { echo "no libcudart found: set SHARDADAM_CUDART to its path"; exit 1; }
export SHARDADAM_CUDART SHARDADAM_REQUIRE_GPU=1
export LD_LIBRARY_PATH=$repo/$lib:$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
echo "library: $(ldd "$bin/training" | grep libshardadam); CUDA runtime: $SHARDADAM_CUDART"

status=0
run() {  # run <name> <command...>: logs to $OUT/rust_<name>.log, keeps the worst status
  local name=$1
  shift
  echo; echo "== $name: $*"
  timeout 300 "$@" > "$OUT/rust_$name.log" 2>&1
  local rc=$?
  grep -E "^test |test result|SKIPPED|panicked|loss|shardadam [0-9]|CUDA runtime|skipped" "$OUT/rust_$name.log" | tail -30
  echo "-- $name: exit $rc"
  [ $rc -eq 0 ] || status=1
}
run training "$bin/training" --nocapture --test-threads=1
run bound_grads "$bin/bound_grads" --test-threads=1
run gpu_step "$bin/gpu_step"
# The example skips quietly without a GPU (it is what a newcomer runs); here that is a failure.
if grep -q "skipped" "$OUT/rust_gpu_step.log"; then echo "-- gpu_step skipped: no GPU was used"; status=1; fi
exit $status
