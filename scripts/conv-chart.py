#!/usr/bin/env python3
"""Draws the CSV of benches/conv_vs_cudnn.rs as a per-layer grouped bar chart (SVG, written
by hand: no plotting library needed): one panel per layer set, one group of bars per layer
(and a last group for the geomean), one bar per configuration (config and N) with height
cuDNN time / oxidnn time on a log2 axis; bars above the 1.0 line are layers where oxidnn is
faster. Rows that failed the check are drawn faded; a layer oxidnn (or cuDNN) did not run
gets an 'x' at the 1.0 line.

usage: scripts/conv-chart.py conv_vs_cudnn.csv [docs/conv-chart.svg] [--title TEXT]
"""
import csv
import math
import sys
from collections import OrderedDict
from html import escape

args = [a for a in sys.argv[1:]]
title = "oxidnn convolution forward vs cuDNN: cuDNN time / oxidnn time per layer (> 1: oxidnn faster)"
if "--title" in args:
    i = args.index("--title")
    title = args[i + 1]
    del args[i:i + 2]
src = args[0]
out = args[1] if len(args) > 1 else "docs/conv-chart.svg"

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]


def num(v):
    try:
        x = float(v)
        return x if x > 0 and math.isfinite(x) else None
    except (TypeError, ValueError):
        return None


rows = list(csv.DictReader(open(src)))
# sets -> ordered layers, ordered series, values[(layer, series)] = (ratio, ok)
sets = OrderedDict()
for r in rows:
    s = sets.setdefault(r["set"], {"layers": [], "series": [], "values": {}})
    series = f"{r['config']} N={r['n']}"
    if series not in s["series"]:
        s["series"].append(series)
    layer = r["layer"]
    if layer == "TOTAL":
        continue
    if layer == "GEOMEAN":
        layer = "geomean"
    if layer not in s["layers"]:
        s["layers"].append(layer)
    ok = r["check"] in ("ok", "geomean", "unchecked")
    s["values"][(layer, series)] = (num(r["ratio_cudnn_over_oxidnn"]), ok)
for s in sets.values():  # the geomean group last
    if "geomean" in s["layers"]:
        s["layers"].remove("geomean")
        s["layers"].append("geomean")

all_series = []
for s in sets.values():
    for name in s["series"]:
        if name not in all_series:
            all_series.append(name)
color = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(all_series)}

ratios = [v[0] for s in sets.values() for v in s["values"].values() if v[0]]
lo = min([1.0] + ratios)
hi = max([1.0] + ratios)
lo_exp = math.floor(math.log2(lo))
hi_exp = math.ceil(math.log2(hi))
if hi_exp == lo_exp:
    hi_exp += 1

BAR, GAP, LEFT, RIGHT, PANEL_H, LABEL_H, TOP = 7, 10, 70, 30, 260, 150, 50
LEGEND_H = 30
widths = [len(s["layers"]) * (len(s["series"]) * BAR + GAP) for s in sets.values()]
width = LEFT + max(widths + [400]) + RIGHT
height = TOP + LEGEND_H + len(sets) * (PANEL_H + LABEL_H + 40)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
       f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
       f'<rect width="{width}" height="{height}" fill="white"/>',
       f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>']

# Legend.
x = LEFT
y = TOP
for name in all_series:
    svg.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{color[name]}"/>')
    svg.append(f'<text x="{x + 14}" y="{y}">{escape(name)}</text>')
    x += 14 + 7 * len(name) + 18
svg.append(f'<text x="{x}" y="{y}" fill="#666">faded: MISMATCH or error; x: not run</text>')

y0 = TOP + LEGEND_H
for set_name, s in sets.items():
    top, bottom = y0 + 20, y0 + 20 + PANEL_H

    def ypos(v):
        t = (math.log2(v) - lo_exp) / (hi_exp - lo_exp)
        return bottom - t * (bottom - top)

    svg.append(f'<text x="{LEFT}" y="{y0 + 12}" font-size="13" font-weight="bold">{escape(set_name)}</text>')
    panel_w = len(s["layers"]) * (len(s["series"]) * BAR + GAP)
    # Grid and axis labels: powers of two, plus the halves between them when the range is small.
    steps = [e / 2 for e in range(2 * lo_exp, 2 * hi_exp + 1)] if hi_exp - lo_exp <= 3 else list(range(lo_exp, hi_exp + 1))
    for e in steps:
        v = 2.0 ** e
        yy = ypos(v)
        major = e == int(e)
        svg.append(f'<line x1="{LEFT}" y1="{yy:.1f}" x2="{LEFT + panel_w}" y2="{yy:.1f}" '
                   f'stroke="{"#ddd" if major else "#eee"}"/>')
        label = f"{v:g}" if v >= 1 else (f"1/{1 / v:g}" if major else f"{v:.2f}")
        svg.append(f'<text x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">{label}</text>')
    svg.append(f'<line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{bottom}" stroke="#444"/>')
    svg.append(f'<text transform="translate({LEFT - 45},{(top + bottom) / 2}) rotate(-90)" '
               f'text-anchor="middle">cuDNN / oxidnn (log scale)</text>')
    one = ypos(1.0)
    for i, layer in enumerate(s["layers"]):
        gx = LEFT + i * (len(s["series"]) * BAR + GAP) + GAP / 2
        if layer == "geomean":
            svg.append(f'<rect x="{gx - GAP / 2}" y="{top}" width="{len(s["series"]) * BAR + GAP}" '
                       f'height="{bottom - top}" fill="#f4f4f4"/>')
        for j, series in enumerate(s["series"]):
            bx = gx + j * BAR
            ratio, ok = s["values"].get((layer, series), (None, False))
            if (layer, series) not in s["values"]:
                continue
            if ratio is None:
                svg.append(f'<text x="{bx + BAR / 2:.1f}" y="{one + 4:.1f}" text-anchor="middle" '
                           f'fill="{color[series]}" font-size="10">x</text>')
                continue
            yy = ypos(ratio)
            y_top, h = min(yy, one), abs(one - yy)
            opacity = "1" if ok else "0.3"
            tip = f"{layer} {series}: {ratio:.2f}" + ("" if ok else " (check failed)")
            svg.append(f'<rect x="{bx:.1f}" y="{y_top:.1f}" width="{BAR - 1}" height="{max(h, 0.5):.1f}" '
                       f'fill="{color[series]}" fill-opacity="{opacity}"><title>{escape(tip)}</title></rect>')
        lx = gx + len(s["series"]) * BAR / 2
        weight = ' font-weight="bold"' if layer == "geomean" else ""
        svg.append(f'<text transform="translate({lx:.1f},{bottom + 8}) rotate(-60)" text-anchor="end"'
                   f'{weight}>{escape(layer)}</text>')
    svg.append(f'<line x1="{LEFT}" y1="{one:.1f}" x2="{LEFT + panel_w}" y2="{one:.1f}" '
               f'stroke="black" stroke-width="1.5"/>')
    svg.append(f'<text x="{LEFT + panel_w + 3}" y="{one + 4:.1f}">1.0</text>')
    y0 = bottom + LABEL_H + 20
svg.append("</svg>")
open(out, "w").write("\n".join(svg) + "\n")
print(f"wrote {out}: {len(sets)} layer sets, {len(all_series)} configurations")
