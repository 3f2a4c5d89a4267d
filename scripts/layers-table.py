#!/usr/bin/env python3
"""Renders the CSV of one of issue 4's comparison benches (pooling, batch_norm, norm,
dropout_lrn `_vs_cudnn`) as a markdown table, one row per CSV row, with the geomean of
the reference / oxidnn time ratio per op (the part of the op name before the first '.'
for batch_norm, the whole op otherwise, as the benches' own summaries group them).

usage: scripts/layers-table.py BENCH.csv >> docs/perf.md
"""
import csv
import math
import sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1])))
cols = rows[0].keys()
op_col = next(c for c in ("op", "pass", "direction") if c in cols)
kind_col = next(c for c in ("dtype", "format", "layout") if c in cols)
case_col = "case" if "case" in cols else None


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def fmt(v, d):
    x = num(v)
    return "n/a" if x is None else f"{x:.{d}f}"


refs = [("cudnn", "cuDNN")] + ([("torch", "PyTorch")] if "torch_us" in cols else [])
head = ["op"] + (["case"] if case_col else []) + ["type", "shape", "oxidnn µs", "GB/s", "% copy"]
for key, name in refs:
    head += [f"{name} µs", f"{name}/oxidnn"]
head += ["check"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
groups = defaultdict(list)
for r in rows:
    cells = [r[op_col]] + ([r[case_col]] if case_col else []) + [r[kind_col], r["shape"]]
    cells += [fmt(r["oxidnn_us"], 1), fmt(r["oxidnn_gbps"], 0), fmt(r["pct_copy_bw"], 1)]
    for key, _ in refs:
        ratio_key = f"ratio_{key}_over_oxidnn"
        cells += [fmt(r.get(f"{key}_us"), 1), fmt(r.get(ratio_key), 2)]
        ratio = num(r.get(ratio_key))
        if ratio and r.get("check", "").startswith("ok"):
            groups[(r[op_col], key)].append(ratio)
    cells.append(r.get("check", ""))
    print("| " + " | ".join(cells) + " |")
print()
for (op, key), ratios in sorted(groups.items()):
    g = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"- {op} vs {dict(refs)[key]}: geomean {g:.2f} over {len(ratios)} rows")
print()
