#!/usr/bin/env python3
"""Turns specdec_bench_ops' JSON files into one markdown table: median GPU time, bandwidth, and the
fraction of the measured device-to-device copy bandwidth (BM_copy_floor, same run). A file cut off
mid-write (a family stopped at its time limit) is reported and skipped."""
import json
import sys

rows, context = [], {}
for path in sys.argv[1:]:
    try:
        data = json.load(open(path))
    except (OSError, json.JSONDecodeError) as e:
        print(f"skipped {path}: {e}")
        continue
    context = data.get("context", context)
    rows += [b for b in data["benchmarks"] if b.get("aggregate_name") == "median"]
floor = max((b["bytes_per_second"] for b in rows if b["run_name"].startswith("BM_copy_floor")),
            default=None)
print(f"device: {context.get('host_name', '?')}, copy floor {floor / 1e9:.0f} GB/s"
      if floor else "copy floor not measured")
print()
print("| benchmark | median GPU time (us) | GB/s | % of copy floor |")
print("|---|---:|---:|---:|")
for b in rows:
    t = b["real_time"] if b.get("time_unit") == "us" else b["real_time"] / 1e3
    bw = b.get("bytes_per_second", 0.0)
    frac = f"{100.0 * bw / floor:.0f}%" if floor and bw else "-"
    print(f"| {b['run_name']} | {t:.2f} | {bw / 1e9:.1f} | {frac} |")
