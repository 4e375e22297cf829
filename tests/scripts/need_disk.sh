#!/usr/bin/env bash
# tests/scripts/need_disk.sh — scripts/common.sh's sa_need_disk, which scripts/test runs
# before anything else, against df and du stubs that report a chosen disk: it stops, naming
# what it needs and what there is, when the disk is short, counts a dir the run replaces as
# free, and passes when there is room.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$root/scripts/common.sh"
stubs=$(mktemp -d)
trap 'rm -rf "$stubs"' EXIT
# df -Pk: a header, then the disk's line (its 4th column: KB available; 6th: mounted on).
cat > "$stubs/df" <<'STUB'
#!/bin/sh
echo "Filesystem 1024-blocks Used Available Capacity Mounted on"
echo "/dev/stub 268435456 0 $STUB_FREE_KB 1% /stub"
STUB
# du -sk DIR: the dir's size in KB, then its name.
cat > "$stubs/du" <<'STUB'
#!/bin/sh
printf '%s\t%s\n' "$STUB_DIR_KB" "$3"
STUB
chmod +x "$stubs/df" "$stubs/du"
PATH="$stubs:$PATH"
gb=$((1024 * 1024))
failures=0
expect() {  # expect <pass|fail> <free KB> <dir KB> <message pattern or -> -- <sa_need_disk args>
  local want=$1 free=$2 dir=$3 pattern=$4 status=0 err
  shift 5
  err=$(STUB_FREE_KB=$free STUB_DIR_KB=$dir sa_need_disk "$@" 2>&1) || status=$?
  if { [ "$want" = pass ] && [ "$status" -ne 0 ]; } || { [ "$want" = fail ] && [ "$status" -eq 0 ]; }; then
    echo "FAILED: sa_need_disk $* with ${free} KB free: exit $status, wanted $want ($err)"
    failures=$((failures + 1))
  elif [ "$pattern" != - ] && ! grep -q -- "$pattern" <<<"$err"; then
    echo "FAILED: sa_need_disk $*: its message '$err' lacks '$pattern'"
    failures=$((failures + 1))
  else
    echo "ok: $want with $((free / gb)) GB free and a replaced dir of $((dir / gb)) GB: ${err:-no message}"
  fi
}
# 2.6 GB free, as on the disk that failed a CI run: stops, saying what it needs and has.
expect fail $((26 * gb / 10)) 0 "8 GB of free disk needed for the tests; the disk of $root (/stub) has 2 GB" \
  -- 8 "the tests"
expect pass $((9 * gb)) 0 - -- 8 "the tests"
expect pass $((8 * gb)) 0 - -- 8 "the tests"
expect fail $((8 * gb - 1)) 0 "has 7 GB" -- 8 "the tests"
# A dir the run replaces counts as free, when it exists (the repository's root does).
expect pass $((3 * gb)) $((5 * gb)) - -- 8 "the tests" .
expect fail $((3 * gb)) $((5 * gb)) "has 3 GB" -- 8 "the tests" no-such-dir
[ "$failures" -eq 0 ] || { echo "$failures failed"; exit 1; }
echo "sa_need_disk: all passed"
