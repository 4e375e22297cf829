#!/usr/bin/env bash
# bindings/rust/gpu/stage.sh — where cargo is (not the GPU machine): builds the Rust GPU test
# binaries and the gpu_step example against the library in $BUILD (default: build/ of this
# checkout, found through its pkgconfig/shardadam.pc) and copies them into
# bindings/rust/gpu/bin/ (git-ignored), the folder to carry to the GPU machine, where
# bindings/rust/gpu/run_on_gpu.sh runs them. Nothing here needs CUDA: the binaries load
# libcudart at run time.
#
#   training      tests/training.rs: a regression in host memory, then in CUDA device memory,
#                 and a step with its loss scale, found-inf flag and norm in that memory
#   bound_grads   tests/bound_grads.rs: bindings checked by the library (CPU params)
#   gpu_step      examples/gpu_step.rs: the "first step on the GPU" of docs/rust.md
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(cd ../.. && pwd)
build=${BUILD:-$root/build}
[ -f "$build/pkgconfig/shardadam.pc" ] || {
  echo "no $build/pkgconfig/shardadam.pc: build the library first (scripts/common.sh: sa_configure build; cmake --build build)" >&2
  exit 1
}
unset SHARDADAM_LIB_DIR
export PKG_CONFIG_PATH=$build/pkgconfig CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$build/bindings/rust/target}
bin=gpu/bin
rm -rf "$bin"
mkdir -p "$bin"
log=$(mktemp)
nice -n 15 cargo test --offline -p shardadam --test training --test bound_grads --no-run 2>&1 | tee "$log"
# cargo prints "  Executable tests/training.rs (<target>/debug/deps/training-<hash>)".
sed -n 's/.*Executable tests\/\([a-z_]*\)\.rs (\(.*\))$/\1 \2/p' "$log" | while read -r name path; do
  cp "$path" "$bin/$name"
done
rm -f "$log"
nice -n 15 cargo build --offline -p shardadam --example gpu_step
cp "$CARGO_TARGET_DIR/debug/examples/gpu_step" "$bin/gpu_step"
for f in training bound_grads gpu_step; do
  [ -x "$bin/$f" ] || { echo "stage.sh: $bin/$f was not built" >&2; exit 1; }
done
echo
echo "staged in $PWD/$bin (carry bindings/rust/gpu/bin, .debs and .deps/dlpack):"
ls -l "$bin"
