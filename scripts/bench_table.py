#!/usr/bin/env python3
"""Turns specdec_bench_ops' JSON into a markdown table: median GPU time, bandwidth, and the
fraction of the measured device-to-device copy bandwidth (BM_copy_floor, same run)."""
import json
import sys

data = json.load(open(sys.argv[1]))
rows = [b for b in data["benchmarks"] if b.get("aggregate_name") == "median"]
floor = max((b["bytes_per_second"] for b in rows if b["run_name"].startswith("BM_copy_floor")),
            default=None)
print(f"device: {data['context'].get('host_name', '?')}, copy floor "
      f"{floor / 1e9:.0f} GB/s" if floor else "copy floor not measured")
print()
print("| benchmark | median GPU time (us) | GB/s | % of copy floor |")
print("|---|---:|---:|---:|")
for b in rows:
    t = b["real_time"] if b.get("time_unit") == "us" else b["real_time"] / 1e3
    bw = b.get("bytes_per_second", 0.0)
    frac = f"{100.0 * bw / floor:.0f}%" if floor and bw else "-"
    print(f"| {b['run_name']} | {t:.2f} | {bw / 1e9:.1f} | {frac} |")
