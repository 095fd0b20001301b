"""CPU timing (not a test): latentkv.torch.kv_proj (cpu-blocked) at few tokens against eager
torch's unfused projection, with the weights rotated over enough sets that each call reads them
from memory (as a decode step meets each layer's weights), not from the last call's cache. Median
of three rounds of repeated calls, torch's own thread count. Written 2026-12-06 (session 29) for
cpu-blocked's streamed few-token products; results in docs/perf.md (cpu-blocked). Compare two
builds by running this with each on PYTHONPATH, in alternating order:
    .venv/bin/python dev/cpu_few_tokens_timing.py new bfloat16
    PYTHONPATH=/tmp/base_pkg .venv/bin/python dev/cpu_few_tokens_timing.py base bfloat16
"""
import statistics
import sys
import time

import torch

import latentkv.torch as lt

SHAPES = {  # (T, D, R, H, Dh, weight sets: > 32 MB of weights in all, this VM's L3)
    "founding T=1": (1, 256, 48, 4, 32, 1),
    "v2-lite T=1": (1, 2048, 512, 16, 128, 12),
    "v2-lite T=2": (2, 2048, 512, 16, 128, 12),
    "v2-lite T=6": (6, 2048, 512, 16, 128, 12),
    "v3 T=1": (1, 7168, 512, 128, 128, 2),
    "v3 T=2": (2, 7168, 512, 128, 128, 2),
    "v3 T=4": (4, 7168, 512, 128, 128, 2),
}


def median_us(fn, seconds=0.4, warmup=2):
    for _ in range(warmup):
        fn()
    times, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(label, dtype_name):
    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    for name, (t, d, r, h, dh, sets) in SHAPES.items():
        weights = [((torch.randn(1, t, d)).to(dtype), (torch.randn(d, r) / d**0.5).to(dtype),
                    (torch.randn(r, h * dh) / r**0.5).to(dtype),
                    (torch.randn(r, h * dh) / r**0.5).to(dtype)) for _ in range(sets)]
        calls = [0]

        def call(fn):
            x, w_down, w_up_k, w_up_v = weights[calls[0] % sets]
            calls[0] += 1
            return fn(x, w_down, w_up_k, w_up_v, h)

        ours, eager = [], []
        for _ in range(3):
            ours.append(median_us(lambda: call(lt.kv_proj)))
            eager.append(median_us(lambda: call(lt.reference_kv_proj)))
        print(f"{label} {dtype_name} {name:13s} latentkv {statistics.median(ours):7.0f} us  "
              f"eager {statistics.median(eager):7.0f} us", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
