#!/usr/bin/env python3
"""Plots latentkv-bench --json output: speedup over the unfused baseline of the same run and % of
the measured floor against tokens, one column of panels per preset (cases that share every
dimension but batch and seq), one line per dtype and input file. PNG out.

    latentkv-bench --sweep --json > h200.json
    .venv/bin/python scripts/plot_bench.py h200.json -o docs/bench.png [--title "H200, 2026-12-02"]

Cases that were refused, skipped or not timed are left out (and counted on stderr). On the CPU the
bench measures no floor: the % of floor row then says so instead of plotting.
"""

import argparse
import json
import math
import re
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

# Shape keys that vary along a sweep; every other key of "shape" (and the dtype) names the preset.
_TOKEN_KEYS = {"batch", "seq", "tokens"}


def read_cases(path):
    """The JSON objects of one file: one per line, as latentkv-bench --json prints them."""
    cases = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                cases.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"plot_bench: {path}:{number}: not a JSON object: {e}")
    return cases


def tokens_of(case):
    shape = case.get("shape", {})
    if "tokens" in shape:
        return shape["tokens"]
    return shape.get("batch", 1) * shape.get("seq", 1)


def preset_key(case):
    shape = case.get("shape", {})
    return tuple(sorted((k, v) for k, v in shape.items() if k not in _TOKEN_KEYS))


def preset_title(key, names):
    """The preset's name from its cases' names ("deepseek-v3 T=128" -> "deepseek-v3"); "T=N" cases
    of the founding shape take the name of a case of theirs without T= ("seed"); else the shape."""
    prefixes = [re.sub(r"\s*T=\d+$", "", n) for n in names]
    named = [p for p in prefixes if p]
    if named:
        return min(named, key=len)
    return " ".join(f"{k}={v}" for k, v in key)


def number(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="latentkv-bench --json output (one file per run)")
    parser.add_argument("-o", "--output", default="bench.png", help="PNG to write")
    parser.add_argument("--title", help="figure title (default: the devices of the runs)")
    args = parser.parse_args(argv)

    # preset key -> {"names": [...], "series": {label: [(tokens, speedup, pct_of_floor)]}}
    presets = OrderedDict()
    devices = []
    left_out = 0
    for path in args.json:
        cases = read_cases(path)
        if not cases:
            sys.exit(f"plot_bench: {path} holds no latentkv-bench --json lines")
        for case in cases:
            entry = presets.setdefault(preset_key(case), {"names": [], "series": OrderedDict()})
            entry["names"].append(case.get("case", ""))
            speedup = number(case.get("speedup"))
            if speedup is None:
                left_out += 1
                continue
            device = case.get("device", "?")
            if device not in devices:
                devices.append(device)
            label = case.get("dtype", "?")
            if len(args.json) > 1:
                label = f"{label}, {device} ({path})"
            point = (tokens_of(case), speedup, number(case.get("pct_of_floor")))
            entry["series"].setdefault(label, []).append(point)
    presets = OrderedDict((k, v) for k, v in presets.items() if v["series"])
    if not presets:
        sys.exit("plot_bench: no timed case to plot")
    if left_out:
        print(f"plot_bench: {left_out} case(s) without a speedup (refused, skipped or untimed) "
              "left out", file=sys.stderr)

    columns = len(presets)
    fig, axes = plt.subplots(2, columns, figsize=(4.2 * columns, 7), squeeze=False,
                             sharex="col")
    for column, (key, entry) in enumerate(presets.items()):
        top, bottom = axes[0][column], axes[1][column]
        any_floor = False
        for label, points in entry["series"].items():
            points.sort()
            tokens = [p[0] for p in points]
            top.plot(tokens, [p[1] for p in points], marker="o", label=label)
            floor = [(p[0], p[2]) for p in points if p[2] is not None]
            if floor:
                any_floor = True
                bottom.plot([f[0] for f in floor], [f[1] for f in floor], marker="o", label=label)
        speedups = [p[1] for points in entry["series"].values() for p in points]
        if max(speedups) / min(speedups) > 8:
            top.set_yscale("log", base=2)
        top.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
        top.set_title(preset_title(key, entry["names"]))
        top.set_ylabel("speedup over the unfused baseline")
        top.legend(fontsize="small")
        if any_floor:
            bottom.set_ylim(0, 105)
            bottom.axhline(100.0, color="gray", linestyle="--", linewidth=0.8)
        else:
            bottom.text(0.5, 0.5, "no floor measured\n(CPU run)", ha="center", va="center",
                        transform=bottom.transAxes, color="gray")
        bottom.set_ylabel("% of the measured floor")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        bottom.set_xlabel("tokens (batch * seq)")
    fig.suptitle(args.title or "latentkv-bench on " + ", ".join(devices))
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"plot_bench: wrote {args.output} ({columns} preset(s))", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
