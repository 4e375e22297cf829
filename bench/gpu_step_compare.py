#!/usr/bin/env python3
"""bench/gpu_step_compare.py — two builds of shardadam on the same GPU, in one run.

    python3 bench/gpu_step_compare.py --base OLD/libshardadam.so --new NEW/libshardadam.so \
        [--rounds 2] [--only abdefghijkl] [--log-dir DIR]
    python3 bench/gpu_step_compare.py --from-logs DIR [--rounds N]   # the tables again, from kept logs

Runs bench/gpu_step.py --only-shardadam with each library in turn (base, new, base, new, ...:
interleaved, so that a drift of the machine's clocks or temperature falls on both), each run
measuring the device-to-device copy bandwidth itself, and prints per configuration each
library's kernel time and ratio to copy (the median over rounds, and the range), and the
difference in points of copy. A change to the kernels or to how they are built is judged by
that difference: bench/gpu_step's own numbers move by more than a point between machines.

Each run's ratio is to the copy bandwidth that run measured, and two runs' copy measurements
differ by a few percent (2,932 against 3,016 GB/s in one round on an H100): with few rounds
that difference reads as points gained or lost by every config alike. So the table also
gives the points at one copy bandwidth, the median of every run's: the kernel times alone
decide them.
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


def parse(text, what):
    """The result rows {config: (kernel ms, % of copy)} and the copy GB/s of one gpu_step.py
    output; `what` names it in errors."""
    rows = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    copy = re.search(r"device-to-device copy: ([\d,]+) GB/s", text)
    if not rows or not copy:
        raise SystemExit(f"no result rows or copy bandwidth in {what}:\n{text}")
    return rows, float(copy.group(1).replace(",", ""))


def run_once(lib, only, log):
    cmd = [sys.executable, os.path.join(HERE, "gpu_step.py"), "--lib", lib, "--only-shardadam",
           "--only", only]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if log:
        with open(log, "w") as f:
            f.write(out.stdout + out.stderr)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    return parse(out.stdout, f"the output of {' '.join(cmd)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="libshardadam.so of the build to compare against")
    ap.add_argument("--new", help="libshardadam.so of the build under test")
    ap.add_argument("--from-logs", default="", help="read base_R.log and new_R.log of R < --rounds here "
                    "(a --log-dir of an earlier run) instead of running")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="abdefghijkl", help="gpu_step.py's configurations")
    ap.add_argument("--log-dir", default="", help="keep each run's output here")
    args = ap.parse_args()
    if not args.from_logs and not (args.base and args.new):
        ap.error("--base and --new are required (or --from-logs)")

    results = {"base": [], "new": []}
    copies = []
    for r in range(args.rounds):
        for name in ("base", "new"):
            if args.from_logs:
                path = os.path.join(args.from_logs, f"{name}_{r}.log")
                with open(path) as f:
                    rows, copy = parse(f.read(), path)
                what = path
            else:
                what = os.path.abspath(getattr(args, name))
                log = os.path.join(args.log_dir, f"{name}_{r}.log") if args.log_dir else ""
                rows, copy = run_once(what, args.only, log)
            results[name].append(rows)
            copies.append(copy)
            print(f"round {r} {name}: {what} (copy {copy:,.0f} GB/s)", flush=True)
    one_copy = statistics.median(copies)

    configs = [c for c in results["base"][0] if all(c in rows for v in results.values() for rows in v)]
    print()
    print(f"{'config':44s} {'base ms':>8s} {'base /copy':>17s} {'new ms':>8s} {'new /copy':>17s} {'points':>7s} "
          f"{'one copy':>8s}")
    worst = worst_one = None
    for c in configs:
        cols = []
        for name in ("base", "new"):
            ms = statistics.median(rows[c][0] for rows in results[name])
            ratios = [rows[c][1] for rows in results[name]]
            cols.append((ms, statistics.median(ratios), min(ratios), max(ratios)))
        delta = cols[1][1] - cols[0][1]
        # Both builds move the same bytes per step, so at one copy bandwidth their ratios
        # differ by the kernel times alone: the base's ratio, rescaled from the copies its
        # runs measured to one_copy, times base ms / new ms - 1.
        base_at_one = statistics.median(rows[c][1] * copy for rows, copy in zip(results["base"], copies[::2]))
        delta_one = base_at_one / one_copy * (cols[0][0] / cols[1][0] - 1.0)
        worst = delta if worst is None else min(worst, delta)
        worst_one = delta_one if worst_one is None else min(worst_one, delta_one)
        cells = [f"{ms:8.3f} {med:5.1f}% ({lo:4.1f}-{hi:4.1f})" for ms, med, lo, hi in cols]
        print(f"{c:44s} {cells[0]} {cells[1]} {delta:+7.1f} {delta_one:+8.2f}")
    print(f"\nmedians over {args.rounds} rounds, interleaved; points = new - base, in % of copy: each run's own "
          f"(largest loss {-min(worst, 0.0):.1f}), and at one copy bandwidth, the median of all runs' "
          f"{one_copy:,.0f} GB/s (largest loss {-min(worst_one, 0.0):.2f}).")


if __name__ == "__main__":
    main()
