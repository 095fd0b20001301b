"""CPU timing (not a test): latentkv.torch.kv_proj (cpu-blocked) against eager torch's unfused
projection in float32, bf16 and fp16 on the same tensors, back to back, median of repeated calls
after a warm-up, with torch's own thread count. Written 2026-12-05 (session 27) for cpu-blocked's
half types; results in docs/perf.md (cpu-blocked).
    .venv/bin/python dev/cpu_kv_proj_half_timing.py
With --few-tokens LABEL DTYPE (session 29, cpu-blocked's streamed few-token products): the decode
shapes, weights rotated over enough sets that each call reads them from memory (as a decode step
meets each layer's weights), medians of three rounds, each line led by LABEL; compare two builds
by running it with each on PYTHONPATH in alternating order:
    PYTHONPATH=/tmp/base .venv/bin/python dev/cpu_kv_proj_half_timing.py --few-tokens base bfloat16
"""
import statistics
import sys
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


FEW_TOKEN_SHAPES = {  # (T, D, R, H, Dh, weight sets: > 32 MB of weights in all, this VM's L3)
    "founding T=1": (1, 256, 48, 4, 32, 1),
    "v2-lite T=1": (1, 2048, 512, 16, 128, 12),
    "v2-lite T=2": (2, 2048, 512, 16, 128, 12),
    "v2-lite T=6": (6, 2048, 512, 16, 128, 12),
    "v3 T=1": (1, 7168, 512, 128, 128, 2),
    "v3 T=2": (2, 7168, 512, 128, 128, 2),
    "v3 T=4": (4, 7168, 512, 128, 128, 2),
}


def few_tokens(label, dtype):
    torch.manual_seed(0)
    for name, (t, d, r, h, dh, sets) in FEW_TOKEN_SHAPES.items():
        inputs = [(torch.randn(1, t, d).to(dtype), (torch.randn(d, r) / d ** 0.5).to(dtype),
                   (torch.randn(r, h * dh) / r ** 0.5).to(dtype),
                   (torch.randn(r, h * dh) / r ** 0.5).to(dtype)) for _ in range(sets)]
        calls = [0]

        def call(fn):
            x, wd, wk, wv = inputs[calls[0] % sets]
            calls[0] += 1
            return fn(x, wd, wk, wv, h)

        ours, eager = [], []
        for _ in range(3):
            ours.append(median_us(lambda: call(lt.kv_proj)))
            eager.append(median_us(lambda: call(lt.reference_kv_proj)))
        print(f"{label} {str(dtype)[6:]} {name:13s} latentkv {statistics.median(ours):7.0f} us  "
              f"eager {statistics.median(eager):7.0f} us", flush=True)


def all_dtypes():
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


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--few-tokens":
        few_tokens(sys.argv[2], getattr(torch, sys.argv[3]))
    else:
        all_dtypes()
