#!/usr/bin/env python3
"""bench/gpu_step_compare.py — two builds of shardadam on the same GPU, in one run.

    python3 bench/gpu_step_compare.py --base OLD/libshardadam.so --new NEW/libshardadam.so \
        [--rounds 2] [--only abdefghijkl] [--log-dir DIR]

Runs bench/gpu_step.py --only-shardadam with each library in turn (base, new, base, new, ...:
interleaved, so that a drift of the machine's clocks or temperature falls on both), each run
measuring the device-to-device copy bandwidth itself, and prints per configuration each
library's kernel time and ratio to copy (the median over rounds, and the range), and the
difference in points of copy. A change to the kernels or to how they are built is judged by
that difference: bench/gpu_step's own numbers move by more than a point between machines.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# A row of gpu_step.py's table: "(a) 1 x 256M fp32: shardadam   268,435,456  0.587 ...  97.1% ..."
ROW = re.compile(r"^(\([a-z]\)[^:]*): shardadam\s+[\d,]+\s+([\d.]+)\s.*?\s([\d.]+)%\s")


def run_once(lib, only, log):
    cmd = [sys.executable, os.path.join(HERE, "gpu_step.py"), "--lib", lib, "--only-shardadam",
           "--only", only]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if log:
        with open(log, "w") as f:
            f.write(out.stdout + out.stderr)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    rows = {}
    for line in out.stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    if not rows:
        raise SystemExit(f"no result rows in the output of {' '.join(cmd)}:\n{out.stdout}")
    copy = re.search(r"device-to-device copy: ([\d,]+) GB/s", out.stdout)
    return rows, copy.group(1) if copy else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="libshardadam.so of the build to compare against")
    ap.add_argument("--new", required=True, help="libshardadam.so of the build under test")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="abdefghijkl", help="gpu_step.py's configurations")
    ap.add_argument("--log-dir", default="", help="keep each run's output here")
    args = ap.parse_args()

    results = {"base": [], "new": []}
    for r in range(args.rounds):
        for name in ("base", "new"):
            lib = os.path.abspath(getattr(args, name))
            log = os.path.join(args.log_dir, f"{name}_{r}.log") if args.log_dir else ""
            rows, copy = run_once(lib, args.only, log)
            results[name].append(rows)
            print(f"round {r} {name}: {lib} (copy {copy} GB/s)", flush=True)

    configs = [c for c in results["base"][0] if all(c in rows for v in results.values() for rows in v)]
    print()
    print(f"{'config':44s} {'base ms':>8s} {'base /copy':>17s} {'new ms':>8s} {'new /copy':>17s} {'points':>7s}")
    worst = None
    for c in configs:
        cols = []
        for name in ("base", "new"):
            ms = statistics.median(rows[c][0] for rows in results[name])
            ratios = [rows[c][1] for rows in results[name]]
            cols.append((ms, statistics.median(ratios), min(ratios), max(ratios)))
        delta = cols[1][1] - cols[0][1]
        worst = delta if worst is None else min(worst, delta)
        cells = [f"{ms:8.3f} {med:5.1f}% ({lo:4.1f}-{hi:4.1f})" for ms, med, lo, hi in cols]
        print(f"{c:44s} {cells[0]} {cells[1]} {delta:+7.1f}")
    print(f"\nmedians over {args.rounds} rounds, interleaved; points = new - base, in % of copy. "
          f"Largest loss: {-min(worst, 0.0):.1f} points.")


if __name__ == "__main__":
    main()
