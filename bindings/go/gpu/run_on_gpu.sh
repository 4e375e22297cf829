#!/usr/bin/env bash
# bindings/go/gpu/run_on_gpu.sh — on a GPU machine without Go: runs the Go binding's GPU
# test and example/gpu, prebuilt by bindings/go/gpu/build_here.sh into build-go-gpu/,
# against the CUDA build of the library in build-gpu/ (bench/gpu_step builds it), then
# the whole Go test suite against that build. Run from the repository root:
#
#   bench/gpu_step                       # if build-gpu/ is not there yet (SKIP_SANITIZER=1 is quicker)
#   bindings/go/gpu/run_on_gpu.sh
#
# The test binary runs in bindings/go, as go test would (a test reads docs/go.md).
# A skipped GPU test is a failure here: this machine has the GPU. The CUDA runtime the
# test opens (dlopen) is $SHARDADAM_CUDART if set, else the first libcudart.so.13 found
# in /usr/local/cuda and in torch's wheels. Logs go to $OUT (default ./gpu_out).
set -uo pipefail
repo=$(pwd)
[ -f "$repo/bindings/go/go.mod" ] || { echo "run it from the repository root"; exit 1; }
bin=$repo/${BIN:-build-go-gpu}
lib=$repo/${LIB:-build-gpu}
OUT=${OUT:-$repo/gpu_out}
mkdir -p "$OUT"
for f in "$bin/shardadam_go.test" "$bin/example_gpu" "$lib/libshardadam.so.0"; do
  [ -e "$f" ] || { echo "missing $f (build-go-gpu/ comes from build_here.sh; build-gpu/ from bench/gpu_step)"; exit 1; }
done
[ -e "$lib/libshardadam-cuda.so" ] || echo "warning: $lib has no libshardadam-cuda.so: the GPU test will skip"
if [ -z "${SHARDADAM_CUDART:-}" ]; then
  SHARDADAM_CUDART=$(ls /usr/local/cuda/lib64/libcudart.so.13* 2>/dev/null | head -1)
  [ -n "$SHARDADAM_CUDART" ] || SHARDADAM_CUDART=$(find /opt/torch/.venv /usr/local/lib /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)
fi
export SHARDADAM_CUDART LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-}
echo "library: $lib/libshardadam.so.0; CUDA runtime for the test: ${SHARDADAM_CUDART:-none found}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

status=0
echo; echo "== Go GPU test"
(cd "$repo/bindings/go" && "$bin/shardadam_go.test" -test.count=1 -test.v -test.run '^TestGPU') 2>&1 | tee "$OUT/go_gpu_test.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if grep -q -- "--- SKIP" "$OUT/go_gpu_test.log"; then echo "FAIL: a GPU test skipped on a GPU machine"; status=1; fi

echo; echo "== Go example/gpu"
"$bin/example_gpu" 2>&1 | tee "$OUT/go_gpu_example.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if grep -q "SKIPPED" "$OUT/go_gpu_example.log"; then echo "FAIL: example/gpu skipped on a GPU machine"; status=1; fi

echo; echo "== the whole Go test suite against this build"
(cd "$repo/bindings/go" && "$bin/shardadam_go.test" -test.count=1) 2>&1 | tee "$OUT/go_tests.log" | tail -5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo; [ $status -eq 0 ] && echo "Go GPU run: OK" || echo "Go GPU run: FAILED (logs in $OUT)"
exit $status
