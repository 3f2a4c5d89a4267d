#!/usr/bin/env python3
"""Renders the CSV of benches/conv_vs_cudnn.rs as markdown: a summary table (one line per
layer set x configuration x N: layers, geomean of cuDNN time / oxidnn time over the layers
that passed the check, summed times), then one table per block with a row per layer and
its TOTAL. Depthwise blocks show GB/s (x + w + y bytes), the others TFLOPS.

usage: scripts/conv-table.py conv_vs_cudnn.csv >> docs/perf.md
"""
import csv
import sys
from collections import OrderedDict


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def fmt(v, d):
    x = num(v)
    return "n/a" if x is None else f"{x:.{d}f}"


rows = list(csv.DictReader(open(sys.argv[1])))
blocks = OrderedDict()
for r in rows:
    blocks.setdefault((r["set"], r["config"], r["n"]), []).append(r)


def layers_of(block):
    return [r for r in block if r["layer"] not in ("TOTAL", "GEOMEAN")]


def special(block, name):
    return next((r for r in block if r["layer"] == name), None)


print("| layer set | config | N | layers | geomean cuDNN/oxidnn | oxidnn total µs | cuDNN total µs | total ratio |")
print("|---|---|---|---|---|---|---|---|")
for (s, config, n), block in blocks.items():
    total, geo = special(block, "TOTAL"), special(block, "GEOMEAN")
    layers = layers_of(block)
    passed = sum(1 for r in layers if r["check"] == "ok")
    cells = [s, config, n, f"{passed} of {len(layers)} ok"]
    cells.append(fmt(geo and geo["ratio_cudnn_over_oxidnn"], 2))
    cells += [fmt(total and total["oxidnn_us"], 0), fmt(total and total["cudnn_us"], 0)]
    cells.append(fmt(total and total["ratio_cudnn_over_oxidnn"], 2))
    print("| " + " | ".join(cells) + " |")
print()

for (s, config, n), block in blocks.items():
    depthwise = all(" g" in r["problem"] for r in layers_of(block))
    unit, key = ("GB/s", "gbps") if depthwise else ("TFLOPS", "tflops")
    digits = 0 if depthwise else 1
    print(f"#### {s} {config} N={n}")
    print()
    head = ["layer", "problem", "oxidnn algo", "oxidnn µs", unit, "cuDNN algo", "cuDNN µs", unit,
            "cuDNN/oxidnn", "check"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in block:
        if r["layer"] == "GEOMEAN":
            continue
        total = r["layer"] == "TOTAL"
        check = r["check"]
        if r["rel_err"]:
            check += f" ({float(r['rel_err']):.1e})"
        cells = [r["layer"], r["problem"], r["oxidnn_algo"] or ("" if total else "error"),
                 fmt(r["oxidnn_us"], 1), fmt(r[f"oxidnn_{key}"], digits),
                 r["cudnn_algo"] or ("" if total else "n/a"), fmt(r["cudnn_us"], 1),
                 fmt(r[f"cudnn_{key}"], digits), fmt(r["ratio_cudnn_over_oxidnn"], 2),
                 "" if total else check]
        if total:
            cells = [f"**{c}**" if c else c for c in cells]
        print("| " + " | ".join(cells) + " |")
    geo = special(block, "GEOMEAN")
    if geo:
        print()
        print(f"- geomean cuDNN/oxidnn: {fmt(geo['ratio_cudnn_over_oxidnn'], 3)} ({geo['problem']})")
    print()
