"""Summarizes the per-block records of dev/mla_timeline.patch (latentkv-bench with LATENTKV_TIMELINE
set prints them after each path's graph replays: the last call of the last replay). Per kernel:
blocks, SMs used, and the entry / after-wait / exit times (us from the call's first entry: min,
median, max), then the chain's links. Reads the bench's stdout on stdin; one table per "graph"
record set, labelled by the JSON line that follows it (the case)."""
import json
import statistics
import sys

ORDER = ["K1", "K2s", "K2r", "KA", "K3"]


def summarize(label, rows):
    print(f"== {label}")
    by = {}
    for r in rows:
        by.setdefault(r["k"], []).append(r)
    times = [r["start"] for r in rows] + [r["end"] for r in rows]
    gaps = sorted({b - a for a, b in zip(sorted(set(times)), sorted(set(times))[1:]) if b > a})
    print(f"   globaltimer: smallest step between distinct stamps {gaps[0] if gaps else '-'} ns")
    f = lambda xs: "%6.2f %6.2f %6.2f" % (min(xs) / 1e3, statistics.median(xs) / 1e3, max(xs) / 1e3) if xs else "     -      -      -"
    print(f"   {'kernel':6s} {'blocks':>6s} {'SMs':>4s}   {'entry min/med/max us':20s}   {'waited min/med/max':20s}   {'exit min/med/max':20s}   {'block med':>9s}   {'staged min/med/max':20s}   {'landed min/med/max':20s}   {'mma min/med/max':20s}   {'first exit min/med/max':20s}")
    for k in ORDER:
        if k not in by:
            continue
        rs = by[k]
        waited = [r["waited"] for r in rs if r["waited"] >= 0]
        dur = [r["end"] - r["start"] for r in rs]
        staged = [r["staged"] for r in rs if r["staged"] >= 0]
        mma = [r["mma"] for r in rs if r["mma"] >= 0]
        landed = [r["landed"] for r in rs if r["landed"] >= 0]
        endmin = [r["endmin"] for r in rs if r["endmin"] >= 0]
        print(f"   {k:6s} {len(rs):6d} {len({r['sm'] for r in rs}):4d}   {f([r['start'] for r in rs])}   {f(waited)}   {f([r['end'] for r in rs])}   {statistics.median(dur) / 1e3:9.2f}   {f(staged) if staged else '':20s}   {f(landed) if landed else '':20s}   {f(mma) if mma else '':20s}   {f(endmin) if endmin else ''}")
    # Which kernels' blocks shared SMs with K1's or KA's while those ran.
    for first in ("K1", "KA"):
        if first in by and "K3" in by:
            sms = {r["sm"] for r in by[first]}
            last = max(r["end"] for r in by[first])
            early = [r for r in by["K3"] if r["start"] < last]
            print(f"   K3 blocks entered before {first}'s last exit: {len(early)} of {len(by['K3'])}, "
                  f"{sum(r['sm'] in sms for r in early)} of them on an SM that ran {first}")
    end = max(r["end"] for r in rows)
    print(f"   call span (first entry to last exit): {end / 1e3:.2f} us")


def main():
    graph, rows = None, None
    for line in sys.stdin:
        if line.startswith("TIMELINE"):
            rows = []
            if line.split()[1] == "graph":
                graph = rows
        elif line.startswith("TL ") and rows is not None:
            p = line.split()
            rows.append({"k": p[1], "b": int(p[2]), "sm": int(p[4]), "start": int(p[6]),
                         "waited": int(p[8]), "end": int(p[10]),
                         "staged": int(p[16]) if len(p) > 16 else -1,
                         "mma": int(p[18]) if len(p) > 18 else -1,
                         "endmin": int(p[20]) if len(p) > 20 else -1,
                         "landed": int(p[22]) if len(p) > 22 else -1})
        elif line.startswith("{"):
            x = json.loads(line)
            shape = x.get("shape") or {}
            case = f"{x.get('case')} {shape.get('stage', '')} [{x.get('strategy')}] " \
                   f"{((x.get('fused') or {}).get('time_us') or {}).get('median')} us"
            if graph:
                summarize(case, graph)
            graph, rows = None, None


main()
