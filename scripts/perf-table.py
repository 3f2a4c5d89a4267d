#!/usr/bin/env python3
"""Renders a vs_cudnn bench CSV as the markdown of docs/perf.md.

usage: scripts/perf-table.py BENCH.csv DEVICE DATE COMMIT > docs/perf.md
"""
import csv
import math
import sys
from collections import defaultdict

path, device, date, commit = sys.argv[1:5]
rows = list(csv.DictReader(open(path)))


def num(v):
    try:
        return float(v)
    except ValueError:
        return None


print("# Performance: oxidnn vs cuDNN\n")
print(f"Device: {device}. Date: {date}. Commit: `{commit}`. Bench: `benches/vs_cudnn.rs`")
print("(`bash gpu-artifacts/run-all.sh`; method in the bench's header and in")
print("`docs/perf-notes.md`). % copy = achieved GB/s / measured device-to-device copy")
print("bandwidth; ratio = cuDNN time / oxidnn time (> 1: oxidnn faster); n/a = cuDNN has no")
print("such op. Every row's output was checked against cuDNN's before timing.\n")

fam = defaultdict(list)
for r in rows:
    ratio = num(r["ratio_cudnn_over_oxidnn"])
    if ratio:
        fam[r["op"].split(".")[0]].append(ratio)
print("## Summary (geometric mean of ratio per family, all shapes and dtypes)\n")
print("| family | rows | geomean ratio | min | max |")
print("| --- | ---: | ---: | ---: | ---: |")
for f, v in fam.items():
    g = math.exp(sum(map(math.log, v)) / len(v))
    print(f"| {f} | {len(v)} | {g:.2f} | {min(v):.2f} | {max(v):.2f} |")

large = [r for r in rows if r["shape"] in ("256x256x64x64", "64x256x64x64")]
print("\n## Large tensors (2^26 and 2^28 elements): the issue's target rows\n")
print("| op | dtype | shape | oxidnn us | GB/s | % copy | cuDNN us | ratio |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
for r in large:
    cu = r["cudnn_us"] or "n/a"
    ratio = r["ratio_cudnn_over_oxidnn"][:4] or "n/a"
    print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {float(r['oxidnn_us']):.1f} | "
          f"{float(r['oxidnn_gbps']):.0f} | {float(r['pct_copy_bw']):.1f} | {cu[:8]} | {ratio} |")

print("\n## ResNet-50 activation shapes (N = 32)\n")
print("| op | dtype | shape | oxidnn us | % copy | cuDNN us | ratio |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
for r in rows:
    if r["shape"].startswith("32x"):
        cu = r["cudnn_us"] or "n/a"
        ratio = r["ratio_cudnn_over_oxidnn"][:4] or "n/a"
        print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {float(r['oxidnn_us']):.1f} | "
              f"{float(r['pct_copy_bw']):.1f} | {cu[:8]} | {ratio} |")
