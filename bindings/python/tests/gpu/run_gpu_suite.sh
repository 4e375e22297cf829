#!/usr/bin/env bash
# bindings/python/tests/gpu/run_gpu_suite.sh — the Python GPU checks on a machine with
# CUDA GPUs and torch but no package registry (the lent H200 machines): builds the library
# (build-gpu/, sm_90), installs the wheel made around it (SHARDADAM_PREBUILT: only the
# extensions compile) and the carried bitsandbytes wheel, then runs what is named in $SUITE
# (default: all of them):
#
#   pytest     bindings/python/tests (the torch GPU tests included; $PYTEST_FILES: only these
#              files of it; $PYTEST_K: only those pytest -k selects), on 8 pytest-xdist workers
#   fsdp2      fsdp2_train.py on 2 ranks: FusedAdam vs AdamW(fused) under FSDP2, DCP 2 -> 1
#   reshard    reshard_fsdp2.py: FSDP2 save on N ranks, load on M (N = all GPUs, M = N / 2)
#   dcpswitch  dcp_switch_optimizer.py: DCP checkpoints AdamW <-> FusedAdam, 2 GPUs -> 1 and 1 -> 2
#   clients    tests/clients: HF Trainer, Lightning, FSDP2 + DCP with FusedAdam against AdamW,
#              FSDP2 + DCP again with CPUOffloadPolicy (--cpu-offload)
#              (needs transformers and lightning, which the H200 machines have)
#   clip       clip_nccl.py: clipping over NCCL on 2 ranks vs a float64 reference
#   clipbench  bench/clip_step.py on 2 ranks
#
# Run from the repository root. Carry with the tree (git-ignored): .debs/ with the Debian
# packages of Catch2, Highway, nlohmann-json and SWIG (swig, swig4.0, libpcre2-8-0), the
# wheels of scikit-build-core (packaging, pathspec) and pytest-xdist (execnet) in .debs/wheels,
# .deps/dlpack/dlpack/dlpack.h, and the wheels of bitsandbytes 0.50 and torchao 0.18 in .wheels-gpu/
# (pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_24_x86_64 --no-deps).
# SHARDADAM_PREBUILT=<dir> packages a library staged there by stage_prebuilt.sh (carried with
# the tree) instead of building one here. Logs go to $OUT (default ./gpu_out).
set -uo pipefail
repo=$(pwd)
OUT=${OUT:-$repo/gpu_out}
SUITE=${SUITE:-pytest fsdp2 reshard dcpswitch clip clipbench}
mkdir -p "$OUT"
prefix=/tmp/sa_prefix
mkdir -p $prefix
for f in .debs/*.deb; do dpkg -x "$f" $prefix; done
export PATH=$prefix/usr/bin:$PATH SWIG_LIB=$prefix/usr/share/swig4.0
export CMAKE_PREFIX_PATH=$prefix/usr LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
echo "python $(python3 -c 'import sys; print(sys.version.split()[0])'), torch $(python3 -c 'import torch; print(torch.__version__)'), $gpus GPUs"

python3 -m pip install --quiet --no-index --find-links .debs/wheels scikit-build-core pytest-xdist > "$OUT/pip_tools.log" 2>&1
python3 -m pip install --quiet --no-index --no-deps .wheels-gpu/bitsandbytes-*.whl > "$OUT/pip_bnb.log" 2>&1 ||
  echo "bitsandbytes not installed ($(tail -1 "$OUT/pip_bnb.log")): its comparisons skip"
python3 -m pip install --quiet --no-index --no-deps .wheels-gpu/torchao-*.whl > "$OUT/pip_torchao.log" 2>&1 ||
  echo "torchao not installed ($(tail -1 "$OUT/pip_torchao.log")): its comparisons skip"
start=$(date +%s)
if [ -n "${SHARDADAM_PREBUILT:-}" ]; then
  # A library built elsewhere and staged with stage_prebuilt.sh: only the extensions compile.
  prebuilt=$(cd "$SHARDADAM_PREBUILT" && pwd)
  echo "the prebuilt library of $prebuilt"
else
  # The library once, on all cores (a pip build would compile it on one); the wheel around it.
  prebuilt=$repo/build-gpu
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDADAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DDLPack_INCLUDE_DIR="$repo/.deps/dlpack" -DSHARDADAM_WERROR=ON \
    -DSHARDADAM_BUILD_TESTS=OFF -DSHARDADAM_BUILD_BENCH=OFF -DSHARDADAM_BUILD_EXAMPLES=OFF > "$OUT/configure.log" 2>&1 &&
    cmake --build build-gpu -j "$(nproc)" --target shardadam shardadam_cuda > "$OUT/build.log" 2>&1 ||
    { grep -B2 -A10 error "$OUT/configure.log" "$OUT/build.log" | head -60; exit 1; }
fi
rm -rf /tmp/sa_wheel
python3 -m pip wheel --quiet --no-build-isolation --no-deps -w /tmp/sa_wheel ./bindings/python -C build-dir=/tmp/skb \
  -C cmake.define.SHARDADAM_PREBUILT="$prebuilt" -C cmake.define.DLPack_INCLUDE_DIR="$repo/.deps/dlpack" \
  -C cmake.define.CMAKE_POLICY_VERSION_MINIMUM=3.5 -C cmake.define.SHARDADAM_WERROR=ON \
  > "$OUT/pip.log" 2>&1 || { tail -60 "$OUT/pip.log"; exit 1; }
python3 -m pip install --quiet --no-index --no-deps --force-reinstall /tmp/sa_wheel/shardadam-*.whl >> "$OUT/pip.log" 2>&1 ||
  { tail -20 "$OUT/pip.log"; exit 1; }
echo "build and install took $(( $(date +%s) - start )) s: $(cd /tmp && python3 -c 'import shardadam; print(shardadam.build_info())')"

status=0
run() {  # run <name> <timeout s> <command...>: logs to $OUT/<name>.log, keeps the worst status
  local name=$1 limit=$2
  shift 2
  echo; echo "== $name: $*"
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -E "PASS|FAIL|passed|failed|error|Error|ratio|ms/step|norm" "$OUT/$name.log" | tail -40
  echo "-- $name: exit $rc after $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || status=1
}
gpu=bindings/python/tests/gpu
pytest_paths=$repo/bindings/python/tests
[ -z "${PYTEST_FILES:-}" ] || pytest_paths=$(for f in $PYTEST_FILES; do printf '%s ' "$repo/bindings/python/tests/$f"; done)
for what in $SUITE; do
  case $what in
    pytest) run pytest 420 bash -c "cd /tmp && python3 -m pytest -q -p no:cacheprovider -ra -n 8 --durations=20 $pytest_paths ${PYTEST_K:+-k '$PYTEST_K'}" ;;
    fsdp2) run fsdp2 240 torchrun --nproc-per-node 2 $gpu/fsdp2_train.py ;;
    reshard) run reshard 300 python3 $gpu/reshard_fsdp2.py --device cuda --save-ranks "$gpus" --load-ranks $(( gpus / 2 )) ;;
    clients) run clients 420 bash -c "rc=0; for s in hf_trainer lightning_trainer fsdp2_dcp; do python3 bindings/python/tests/clients/\$s.py --device cuda || rc=1; done; python3 bindings/python/tests/clients/fsdp2_dcp.py --device cuda --cpu-offload || rc=1; exit \$rc" ;;
    dcpswitch) if [ "$gpus" -ge 2 ]; then
        run dcpswitch 300 bash -c "python3 $gpu/dcp_switch_optimizer.py --device cuda --save-ranks 2 --load-ranks 1 && python3 $gpu/dcp_switch_optimizer.py --device cuda --save-ranks 1 --load-ranks 2"
      else
        run dcpswitch 300 python3 $gpu/dcp_switch_optimizer.py --device cuda --save-ranks 1 --load-ranks 1
      fi ;;
    clip) run clip 240 python3 $gpu/clip_nccl.py ;;
    clipbench) run clipbench 300 python3 bench/clip_step.py ;;
    *) echo "unknown suite part '$what'"; status=1 ;;
  esac
done
exit $status
