"""Probe (not shipped): which kernels make up each variant of bench_mla.py's rows, and how long each
runs on the GPU when calls go back to back (torch.profiler's CUDA activity: no serialization, no
replay; programmatic dependent launches overlap as they do in a model).

For each row it builds bench_mla.py's rotated weight sets, calls every variant 100 times over the
sets (after a warm-up), and prints per variant and kernel: launches per call, mean duration, and
the variant's per-call span (first kernel start to last kernel end of one call, median). Run on the
GPU machine from the repository root with the package installed:

    python dev/mla_kernel_profile.py [--rows v2-lite:64,v2-lite:1,v3:64]
"""

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "bench"))
import bench_mla as bm  # noqa: E402

CALLS = 100


def kernel_events(prof):
    """(name, start us, duration us) of every CUDA kernel the profiler saw, in start order."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            name = e.name
            if "memcpy" in name.lower() or "memset" in name.lower():
                continue
            out.append((name, e.time_range.start, e.time_range.end - e.time_range.start))
    return sorted(out, key=lambda x: x[1])


def profile_variant(call, sets):
    rotation = [lambda s=s: call(s) for s in sets]
    for i in range(20):
        rotation[i % len(rotation)]()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            rotation[i % len(rotation)]()
        torch.cuda.synchronize()
    events = kernel_events(prof)
    per_call = len(events) // CALLS
    if per_call == 0 or len(events) % CALLS:
        return None, events
    spans = []
    for c in range(CALLS):
        group = events[c * per_call:(c + 1) * per_call]
        spans.append(max(s + d for _, s, d in group) - group[0][1])
    by_name = defaultdict(list)
    for name, _, d in events:
        by_name[name].append(d)
    return {"span": statistics.median(spans), "kernels": {
        n: (len(v) / CALLS, statistics.median(v)) for n, v in by_name.items()}}, events


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="v2-lite:64,v2-lite:1,v3:64")
    cli = parser.parse_args()
    args = argparse.Namespace(dtype="bf16", cache=False, rotate="auto", no_compile=False)
    device = torch.device("cuda")
    for spec in cli.rows.split(","):
        name, tokens = spec.split(":")
        tokens = int(tokens)
        d, h, r, dr, dn, dv = bm.MODELS[name]
        set_bytes = bm.weight_elems(d, h, r, dr, dn, dv) * 2
        n = bm.rotate_sets("auto", set_bytes, device)
        torch.compiler.reset()
        with torch.no_grad():
            sets = [bm.make_set(name, tokens, args, device) for _ in range(n)]
            calls, error = bm.variant_calls(name, sets, args)
            print(f"== {name} T={tokens} ({n} sets){' compile error: ' + error if error else ''}")
            for key in ("hf compile", "latentkv"):
                if key not in calls:
                    continue
                result, events = profile_variant(calls[key], sets)
                if result is None:
                    print(f"  {key}: {len(events)} kernels over {CALLS} calls (not a multiple)")
                    continue
                print(f"  {key}: span per call {result['span']:.2f} us (median, back to back)")
                for kname, (count, dur) in result["kernels"].items():
                    print(f"    {count:4.1f} x {dur:7.2f} us  {kname[:110]}")
        del sets, calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
