"""CPU timing (not a test): latentkv.torch.kv_proj (cpu-blocked) against eager torch's unfused
projection in float32, bf16 and fp16 on the same tensors, back to back, median of repeated calls
after a warm-up, with torch's own thread count. Written 2026-12-05 (session 27) for cpu-blocked's
half types; results in docs/perf.md (cpu-blocked).
    .venv/bin/python dev/cpu_kv_proj_half_timing.py
"""
import statistics
import time

import torch

import latentkv.torch as lt

SHAPES = {  # (B, S, D, R, H, Dh)
    "founding": (4, 96, 256, 48, 4, 32),
    "founding T=1": (1, 1, 256, 48, 4, 32),
    "v2-lite T=1": (1, 1, 2048, 512, 16, 128),
    "v2-lite T=64": (1, 64, 2048, 512, 16, 128),
    "v2-lite T=256": (1, 256, 2048, 512, 16, 128),
    "v3 T=1": (1, 1, 7168, 512, 128, 128),
}


def median_us(fn, seconds=0.5, warmup=3):
    for _ in range(warmup):
        fn()
    times, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; us per call (median)")
print(f"{'case':16s} {'dtype':9s} {'latentkv':>10s} {'eager':>10s} {'x eager':>8s}")
for name, (b, s, d, r, h, dh) in SHAPES.items():
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(b, s, d, generator=g), torch.randn(d, r, generator=g) / d ** 0.5,
            torch.randn(r, h * dh, generator=g) / r ** 0.5,
            torch.randn(r, h * dh, generator=g) / r ** 0.5]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x, wd, wk, wv = (t.to(dtype) for t in base)
        ours = median_us(lambda: lt.kv_proj(x, wd, wk, wv, h))
        eager = median_us(lambda: lt.reference_kv_proj(x, wd, wk, wv, h))
        print(f"{name:16s} {str(dtype)[6:]:9s} {ours:10.1f} {eager:10.1f} {eager / ours:7.2f}x")
