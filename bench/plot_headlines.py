#!/usr/bin/env python3
"""Draws the headline ratios of benchmark logs as one chart (docs/performance.png).

    python3 bench/plot_headlines.py [-o docs/performance.png] LOG...

Each LOG is the printed output of one benchmark run, saved as it was printed, or a Markdown
page whose text blocks are such outputs (docs/performance.md: `python3 bench/plot_headlines.py
docs/performance.md` draws the page's own tables); the script recognizes what each of these
prints:

  bench/gpu_step.py       its table: "vs torch" (the baseline's wall time over shardadam's,
                          on the same tensors) and "/copy" (the step's bandwidth over the
                          device-to-device copy of the same run)
  bench/clip_step.py      "torch / shardadam: N.NNx (wall), ..."
  bench/cpu_step          its table's "ratio" (the step's bandwidth over memcpy's)
  bench/cpu_moments8.py   bitsandbytes' ms/step over shardadam's 8-bit step
  bench/python_host_step.py  torch's ms over FusedAdam's, per measurement

It prints every ratio it found (with the log and the line), then draws two panels: speed-ups
over a baseline measured in the same run, and shares of the same run's copy bandwidth.
Nothing is drawn from a number that is not in a log. Needs matplotlib for the drawing only.
Exits 1 when a log holds no ratio it recognizes (a wrong file, or a changed print format).
"""
import argparse
import pathlib
import re
import sys

NUM = r"[0-9][0-9,]*\.?[0-9]*"
# bench/gpu_step.py's row: label, elements, kernel ms, host ms, [host ms (fresh)], wall ms,
# GB/s, /copy, wall/krnl, [vs torch].
GPU_ROW = re.compile(
    rf"^(?P<label>\S.*?) +(?P<elems>{NUM}) +(?P<kernel>{NUM}) +(?P<host>{NUM})(?: +(?P<fresh>{NUM}))?"
    rf" +(?P<wall>{NUM}) +(?P<gbps>{NUM}) +(?P<copy>{NUM})% +(?P<wall_krnl>{NUM})(?: +(?P<vs>{NUM})x)?$")
GPU_HEADER = re.compile(r"^config +elements +kernel ms +host ms +host ms +wall ms +GB/s +/copy +wall/krnl +vs torch$")
CLIP = re.compile(rf"^torch / shardadam: (?P<wall>{NUM})x \(wall\)")
CLIP_SHARDS = re.compile(r"^shards: .*Shard\(0\) over (?P<ranks>\d+) ranks")
CPU_HEADER = re.compile(r"^config +elements +shards +ms/step +GB/s +memcpy GB/s +ratio$")
CPU_ROW = re.compile(rf"^(?P<label>\S.*?) +(?P<elems>\d+) +(?P<shards>\d+) +(?P<ms>{NUM}) +(?P<gbps>{NUM})"
                     rf" +(?P<copy>{NUM}) +(?P<ratio>{NUM})$")
MOMENTS8_HEADER = re.compile(r"^ +ms/step +GB/s +/ shardadam 8-bit$")
MOMENTS8_ROW = re.compile(rf"^(?P<label>\S.*?) +(?P<ms>{NUM}) +(?P<gbps>{NUM}) +(?P<ratio>{NUM})x$")
HOST_HEADER = re.compile(r"^measurement +FusedAdam ms +torch ms +ours/torch +per param us +target$")
HOST_ROW = re.compile(rf"^(?P<label>\S.*?) +(?P<ours>{NUM}) +(?P<torch>{NUM}) +(?P<ratio>{NUM}) +(?P<per>{NUM})  ")

SPEEDUP = "speed-up over a baseline of the same run (x)"
BANDWIDTH = "step bandwidth / copy bandwidth of the same run (GPU: device copy; CPU: memcpy)"


def number(text):
    return float(text.replace(",", ""))


def parse_log(name, text):
    """The headlines of one log: (panel, label, value, where) tuples, in the log's order."""
    headlines = []
    lines = text.splitlines()
    table = None  # the table whose rows follow
    previous = None  # gpu_step: the row before, whose baseline a "vs torch" row is
    clip_ranks = None
    for n, line in enumerate(lines, 1):
        where = f"{name}:{n}"
        line = line.rstrip()
        if GPU_HEADER.match(line):
            table, previous = "gpu", None
            continue
        if CPU_HEADER.match(line):
            table = "cpu"
            continue
        if MOMENTS8_HEADER.match(line):
            table = "moments8"
            continue
        if HOST_HEADER.match(line):
            table = "host"
            continue
        if m := CLIP_SHARDS.match(line):
            clip_ranks = m["ranks"]
        if m := CLIP.match(line):
            gpus = f" over {clip_ranks} GPUs" if clip_ranks else ""
            headlines.append((SPEEDUP, f"clipped step{gpus} vs clip_grad_norm_ + fused AdamW",
                              number(m["wall"]), where))
            continue
        if table == "gpu" and (m := GPU_ROW.match(line)):
            label = m["label"]
            if m["vs"] is not None and previous is not None:
                config = previous.split(": shardadam")[0]
                baseline = re.sub(r"^\([a-z]\) ", "", label)
                baseline = baseline.split(": ", 1)[1] if ": " in baseline else re.sub(r"^same, ", "", baseline)
                headlines.append((SPEEDUP, f"{config} vs {baseline}", number(m["vs"]), where))
            if label.endswith(": shardadam"):
                headlines.append((BANDWIDTH, label[: -len(": shardadam")] + " (GPU)",
                                  number(m["copy"]) / 100, where))
                previous = label
            continue
        if table == "cpu" and (m := CPU_ROW.match(line)):
            headlines.append((BANDWIDTH, f"CPU {m['label']}", number(m["ratio"]), where))
            continue
        if table == "moments8" and (m := MOMENTS8_ROW.match(line)):
            if "bitsandbytes" in m["label"]:
                headlines.append((SPEEDUP, f"CPU 8-bit moments vs {m['label']}", number(m["ratio"]), where))
            continue
        if table == "host" and (m := HOST_ROW.match(line)):
            if number(m["ours"]) > 0:
                headlines.append((SPEEDUP, f"host time: {m['label']} vs torch",
                                  number(m["torch"]) / number(m["ours"]), where))
            continue
        if not line:
            table = None if table in ("cpu", "moments8", "host") else table
    return headlines


def page_outputs(text):
    """The benchmark outputs a Markdown page records: its ```text (or bare ```) blocks, which
    docs/performance.md holds as the benchmarks printed them."""
    return "\n\n".join(re.findall(r"^```(?:text)?\n(.*?)^```$", text, flags=re.M | re.S))


def draw(headlines, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in (SPEEDUP, BANDWIDTH) if any(h[0] == p for h in headlines)]
    rows = [[h for h in headlines if h[0] == p] for p in panels]
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(9, 1.2 + 0.38 * sum(len(r) for r in rows) + 0.6 * len(panels)),
                             gridspec_kw={"height_ratios": [max(1, len(r)) for r in rows]})
    for ax, panel, panel_rows in zip(axes[:, 0], panels, rows):
        labels = [label for _, label, _, _ in panel_rows][::-1]
        values = [value for _, _, value, _ in panel_rows][::-1]
        bars = ax.barh(labels, values, color="#3b6ea8" if panel == SPEEDUP else "#5a9e6f")
        for bar, value in zip(bars, values):
            text = f"{value:.2f}x" if panel == SPEEDUP else f"{value:.2f}"
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + text, va="center", fontsize=8)
        ax.set_title(panel, fontsize=10, loc="left")
        if panel == SPEEDUP:
            ax.set_xscale("log")
            ax.axvline(1.0, color="grey", linewidth=0.8)
        else:
            ax.axvline(1.0, color="grey", linewidth=0.8)  # as fast as the copy
        ax.tick_params(axis="y", labelsize=8)
        ax.margins(x=0.15)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=pathlib.Path, help="printed output of a benchmark run")
    parser.add_argument("-o", "--out", type=pathlib.Path, default=pathlib.Path("docs/performance.png"))
    parser.add_argument("--no-plot", action="store_true", help="print the ratios only")
    args = parser.parse_args(argv)
    headlines = []
    for log in args.logs:
        text = log.read_text()
        found = parse_log(str(log), page_outputs(text) if log.suffix == ".md" else text)
        if not found:
            print(f"plot_headlines: {log}: no headline ratio in a format this script knows", file=sys.stderr)
            return 1
        headlines += found
    # A label measured again (the same config in a later log or table) keeps the later value.
    latest = {(panel, label): (panel, label, value, where) for panel, label, value, where in headlines}
    headlines = list(latest.values())
    for panel, label, value, where in headlines:
        print(f"{where}: {label}: {value:.4g} ({panel})")
    if not args.no_plot:
        draw(headlines, args.out)
        print(f"plot_headlines: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
