# scripts/common.sh — sourced by scripts/demo, scripts/test and scripts/lint: installs what a fresh
# Debian 12 machine lacks, then configures the build. Not meant to be run on its own.
#
# Dependencies come from packages only: Debian for the toolchain and libraries, PyPI's
# apache-tvm-ffi wheel for <dlpack/dlpack.h> >= 1.0 (Debian's libdlpack-dev is 0.6).

SA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SA_APT_PACKAGES=(cmake make g++ binutils catch2 libhwy-dev nlohmann-json3-dev python3-pip ca-certificates)
# pkg-config: the find_package_consumer test builds against the installed shardadam.pc, and
# the Rust -sys crate finds the library with it (bindings/rust/shardadam-sys/build.rs).
SA_APT_PACKAGES+=(pkgconf)
# Binding tests (bindings/CMakeLists.txt): Go (cgo, the library found through pkg-config above),
# and Rust through whatever cargo is on PATH (this machine kind has a current toolchain;
# Debian's cargo is the fallback). SWIG is for the Python binding (below).
SA_APT_PACKAGES+=(golang-go swig)
# Debian's cargo also brings its rustc 1.63, the crates' rust-version, which the
# rust_binding_msrv test builds them with.
SA_APT_PACKAGES+=(cargo)
# Muon's Newton-Schulz iteration on the CPU runs on OpenBLAS (kernels/cpu/newton_schulz.h).
SA_APT_PACKAGES+=(libopenblas-dev)
# Python binding tests (bindings/python/run_tests.sh): SWIG (above), a venv and Python's headers.
SA_APT_PACKAGES+=(python3-venv python3-dev)
# Shard files: clang's libFuzzer for the header-parser fuzz test (tests/fuzz).
SA_APT_PACKAGES+=(clang libclang-rt-14-dev)
# scripts/lint: clang-format and clang-tidy (Debian 12: version 14, as the fuzzer's clang).
SA_APT_PACKAGES+=(clang-format clang-tidy)
# The shard-file Python tests (tests/python) read our files with the real safetensors package.
SA_PIP_TEST_PACKAGES=(safetensors numpy ml-dtypes pytest)
SA_PIP_TARGET="$SA_ROOT/.deps/python"  # where the DLPack wheel goes if Python has none
SA_CMAKE_ARGS=()                        # extra configure args found by sa_install_deps

sa_log() { printf '\n== [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }  # with the time: CI logs show where it goes

# Runs a command as root (directly when root already, else through sudo).
sa_as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "error: '$*' needs root and sudo is not installed" >&2
    return 1
  fi
}

# Installs the missing Debian packages, then finds (or pip-installs) a DLPack >= 1.0
# header and records where in SA_CMAKE_ARGS.
sa_install_deps() {
  local missing=() pkg
  for pkg in "${SA_APT_PACKAGES[@]}"; do
    if [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]; then
      missing+=("$pkg")
    fi
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    sa_log "installing Debian packages: ${missing[*]}"
    sa_as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    sa_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  else
    sa_log "Debian packages present: ${SA_APT_PACKAGES[*]}"
  fi

  # DLPack >= 1.0: a tvm_ffi already importable by python3 is found by cmake/FindDLPack;
  # otherwise the wheel is unpacked into .deps/ (pip --target leaves the system Python alone).
  local site
  site="$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
  if [ -f "$site/tvm_ffi/include/dlpack/dlpack.h" ]; then
    sa_log "DLPack header: $site/tvm_ffi/include (python3's apache-tvm-ffi)"
  else
    if [ ! -f "$SA_PIP_TARGET/tvm_ffi/include/dlpack/dlpack.h" ]; then
      sa_log "installing apache-tvm-ffi (for dlpack/dlpack.h >= 1.0) into $SA_PIP_TARGET"
      python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
        --target "$SA_PIP_TARGET" apache-tvm-ffi
    fi
    sa_log "DLPack header: $SA_PIP_TARGET/tvm_ffi/include"
    SA_CMAKE_ARGS+=("-DDLPack_INCLUDE_DIR=$SA_PIP_TARGET/tvm_ffi/include")
  fi

  # The Python test packages: python3's own if it has them, else pip-installed into
  # .deps/ like the wheel above, and handed to the tests through SHARDADAM_PYTHONPATH.
  if ! PYTHONPATH="$SA_PIP_TARGET${PYTHONPATH:+:$PYTHONPATH}" \
      python3 -c "import safetensors, numpy, ml_dtypes, pytest" >/dev/null 2>&1; then
    sa_log "installing ${SA_PIP_TEST_PACKAGES[*]} into $SA_PIP_TARGET"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      --target "$SA_PIP_TARGET" "${SA_PIP_TEST_PACKAGES[@]}"
  fi
  SA_CMAKE_ARGS+=("-DSHARDADAM_PYTHONPATH=$SA_PIP_TARGET")
}

# sa_configure <build dir> [cmake args...]: configures with warnings as errors. The CUDA
# module is built as the environment's SHARDADAM_CUDA says (ON, OFF; default AUTO: when a
# toolkit is found and a GPU is visible), passed every time so that a build tree configured
# once with ON does not keep it; an explicit -DSHARDADAM_CUDA among the args wins.
sa_configure() {
  local dir="$1"
  shift
  sa_log "configuring $dir (SHARDADAM_CUDA=${SHARDADAM_CUDA:-AUTO})"
  cmake -S "$SA_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DSHARDADAM_WERROR=ON \
    "-DSHARDADAM_CUDA=${SHARDADAM_CUDA:-AUTO}" "${SA_CMAKE_ARGS[@]}" "$@"
}

# sa_need_disk <GB> <for what> [dir...]: fails, saying so, unless the disk of $SA_ROOT has
# <GB> free, counting the dirs named (a run replaces them) as free.
sa_need_disk() {
  local need_gb="$1" what="$2" dir free_kb mount
  shift 2
  # df -Pk: a header, then the disk's line (4th column: KB available; 6th: mounted on).
  read -r free_kb mount < <(df -Pk "$SA_ROOT" | awk 'NR == 2 { print $4, $6 }')
  for dir in "$@"; do
    if [ -d "$SA_ROOT/$dir" ]; then
      free_kb=$((free_kb + $(du -sk "$SA_ROOT/$dir" | cut -f1)))
    fi
  done
  if [ "$free_kb" -lt $((need_gb * 1024 * 1024)) ]; then
    echo "error: $need_gb GB of free disk needed for $what; the disk of $SA_ROOT" \
      "($mount) has $((free_kb / 1024 / 1024)) GB" >&2
    return 1
  fi
}

sa_jobs() { nproc 2>/dev/null || echo 2; }
