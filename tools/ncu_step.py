#!/usr/bin/env python3
"""tools/ncu_step.py: one decode step's kernels from an ncu CSV, summed per kernel.

Reads what `ncu --csv --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size`
wrote for a run of `deltaserve bench-offline ... --disable-cuda-graph` (tools/gpu-run.sh stage
`kernels`). A decode step is the span between two consecutive launches of the step's last kernel
(MARKER, by default the argmax that picks the step's tokens); the summary takes the span before
the last marker but one, so warm-up and the final step's tail are left out.

  python3 tools/ncu_step.py ncu.csv [--marker argmax_final_kernel] [--step -2]
  python3 tools/ncu_step.py ncu.csv --all     (every kernel in the file: e.g. one prefill)

Prints: kernels in the step, their summed time, then per kernel name: calls, total us, us per
call, grid and block of its first launch. ncu replays each kernel alone with cold caches
(--cache-control all by default), so small kernels read high next to a CUDA graph's timeline.
"""
import argparse
import collections
import csv
import sys


def load(path):
    """Kernels in launch order: [{'name', 'grid', 'block', metric: value}]."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        sys.exit(f"{path}: {e.strerror}")
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        sys.exit(f"{path}: no ncu CSV header (a row starting with \"ID\")")
    col = {h: j for j, h in enumerate(rows[start])}
    for need in ("ID", "Kernel Name", "Metric Name", "Metric Value"):
        if need not in col:
            sys.exit(f"{path}: the CSV has no \"{need}\" column")
    kernels = collections.OrderedDict()
    for r in rows[start + 1:]:
        if len(r) < len(col):
            continue
        k = kernels.setdefault(int(r[col["ID"]]), {
            "name": r[col["Kernel Name"]],
            "grid": r[col["Grid Size"]] if "Grid Size" in col else "",
            "block": r[col["Block Size"]] if "Block Size" in col else "",
        })
        k[r[col["Metric Name"]]] = r[col["Metric Value"]]
    return [kernels[i] for i in sorted(kernels)]


def short(name):
    """The kernel's name without its argument list and namespaces (templates kept)."""
    base = name.split("(")[0]
    for prefix in ("void ", "deltaserve::", "<unnamed>::", "(anonymous namespace)::"):
        base = base.replace(prefix, "")
    return base


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--marker", default="argmax_final_kernel",
                    help="substring of the name of the kernel that ends a step")
    ap.add_argument("--step", type=int, default=-2,
                    help="which step: the span ending at this marker launch (negative: from the end)")
    ap.add_argument("--all", action="store_true", help="sum every kernel in the file, no step markers")
    a = ap.parse_args()
    ks = load(a.csv)
    if a.all:
        summarize(ks)
        return
    marks = [i for i, k in enumerate(ks) if a.marker in k["name"]]
    if len(marks) < 2:
        sys.exit(f"{a.csv}: fewer than two launches of a kernel named like '{a.marker}' ({len(ks)} kernels)")
    try:
        end = marks[a.step]
        begin = marks[marks.index(end) - 1] if marks.index(end) > 0 else None
    except IndexError:
        sys.exit(f"--step {a.step}: there are {len(marks)} steps")
    if begin is None:
        sys.exit(f"--step {a.step}: no marker before it")
    summarize(ks[begin + 1:end + 1])


def summarize(ks):
    """Prints the kernels' summed time, then calls, total and per-call time per kernel name."""
    per = collections.OrderedDict()
    total = 0.0
    for k in ks:
        t = float(k.get("gpu__time_duration.sum", "0").replace(",", "")) / 1000.0  # ns -> us
        total += t
        e = per.setdefault(short(k["name"]), [0, 0.0, k["grid"], k["block"]])
        e[0] += 1
        e[1] += t
    print(f"{len(ks)} kernels, {total:.1f} us (ncu, each kernel alone)")
    print(f"{'calls':>5} {'total us':>10} {'us/call':>8}  {'grid':>14} {'block':>12}  kernel")
    for name, (n, t, grid, block) in sorted(per.items(), key=lambda x: -x[1][1]):
        print(f"{n:>5} {t:>10.1f} {t / n:>8.2f}  {grid:>14} {block:>12}  {name}")


if __name__ == "__main__":
    main()
