#!/usr/bin/env bash
# bindings/python/tests/gpu/stage_prebuilt.sh BUILD DEST — copies what the Python wheel needs
# of a CUDA build tree (the library, its CUDA module, the CMake package files) into DEST,
# with the package's paths rewritten to DEST and to .deps/dlpack, so that DEST can travel to
# a GPU machine (a few MB instead of the build tree) and run_gpu_suite.sh can package it
# there with SHARDADAM_PREBUILT=DEST instead of building the library again (~200 s of
# device time). Run from the repository root; DEST must be where the tree will lie on the
# GPU machine too (the device copies the tree to the same path).
set -euo pipefail
build=$(cd "$1" && pwd)
mkdir -p "$2"
dest=$(cd "$2" && pwd)
repo=$(pwd)
[ -f "$build/shardadam-targets.cmake" ] || { echo "$build: no shardadam-targets.cmake (not a build tree)" >&2; exit 1; }
cp -a "$build"/libshardadam.so* "$build/libshardadam-cuda.so" "$build/FindDLPack.cmake" \
  "$build/shardadam-config-version.cmake" "$dest/"
for f in shardadam-config.cmake shardadam-targets.cmake; do
  sed -e "s|$build/|$dest/|g" \
      -e "s|set(DLPack_INCLUDE_DIR \"[^\"]*\")|set(DLPack_INCLUDE_DIR \"$repo/.deps/dlpack\")|" \
      "$build/$f" > "$dest/$f"
done
echo "staged $build into $dest ($(du -sh "$dest" | cut -f1))"
