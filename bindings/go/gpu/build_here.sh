#!/usr/bin/env bash
# bindings/go/gpu/build_here.sh — on a machine with Go (the CI/dev machine): builds the Go
# GPU test binary and example/gpu as programs for a GPU machine that has no Go, into
# build-go-gpu/ at the repository root (git-ignored, as build-*/; carry it there), against
# the library of build/ (its build-tree shardadam.pc: sa_configure build, then
# cmake --build build --target shardadam). The binaries load libshardadam.so.0 at run
# time from LD_LIBRARY_PATH, so on the GPU machine they use the CUDA build there
# (bindings/go/gpu/run_on_gpu.sh). A binary built on Debian 12 (glibc 2.36) runs on any
# newer glibc.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
out=$root/${1:-build-go-gpu}
[ -f "$root/build/pkgconfig/shardadam.pc" ] || { echo "no build/pkgconfig/shardadam.pc: configure and build build/ first" >&2; exit 1; }
mkdir -p "$out"
export PKG_CONFIG_PATH=$root/build/pkgconfig GOPROXY=off GOENV=off GOFLAGS=
unset CGO_CFLAGS CGO_CPPFLAGS CGO_LDFLAGS
cd "$root/bindings/go"
go vet ./...
go test -c -o "$out/shardadam_go.test" .
go build -o "$out/example_gpu" ./example/gpu
echo "built with $(go version) at $(git -C "$root" rev-parse --short HEAD):"
ls -l "$out"
