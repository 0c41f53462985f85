#!/usr/bin/env python3
"""Per-kernel time table of one profiled forward, from Nsight Compute's CSV.

Reads `ncu --csv --metrics gpu__time_duration.sum` output (one row per kernel launch) and writes a
markdown table: kernels grouped by name (template and parameter lists cut) and grid, each with its
launches, total and per-launch time and share of the sum, largest total first; then the sum over
every launch. --layers N adds a column "us per layer" (total / N), for kernels that run once per
layer.

  scripts/kernel_profile.py ncu.csv [--layers N] [--title TEXT] > table.md
"""
import argparse
import csv
import re
import sys
from collections import defaultdict


def short_name(name):
    """The kernel's name without its template arguments, parameter list or namespaces."""
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    text = "".join(out).strip()
    text = re.sub(r"^(void|static)\s+", "", text)
    return text.split("::")[-1].strip() or name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--title", default="Kernels of one forward")
    args = ap.parse_args()
    rows = []
    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not CSV
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                 "msecond": 1e3}.get(unit)
        if scale is None:
            sys.exit(f"kernel_profile.py: unknown unit {unit!r}")
        rows.append((short_name(row["Kernel Name"]), row.get("Grid Size", ""), value * scale))
    if not rows:
        sys.exit("kernel_profile.py: no gpu__time_duration.sum rows in " + args.csv)
    groups = defaultdict(list)
    for name, grid, us in rows:
        groups[(name, grid)].append(us)
    total = sum(us for _, _, us in rows)
    print(f"### {args.title}\n")
    head = "| kernel | grid | launches | total us | us per launch | share |"
    rule = "|---|---|---:|---:|---:|---:|"
    if args.layers:
        head += " us per layer |"
        rule += "---:|"
    print(head)
    print(rule)
    for (name, grid), times in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        t = sum(times)
        line = (f"| {name} | {grid} | {len(times)} | {t:.1f} | {t / len(times):.2f} | "
                f"{100 * t / total:.1f}% |")
        if args.layers:
            line += f" {t / args.layers:.2f} |"
        print(line)
    print(f"\n{len(rows)} launches, {total / 1e3:.3f} ms in all (each kernel timed alone by ncu).")


if __name__ == "__main__":
    main()
