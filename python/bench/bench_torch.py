"""latentkv from PyTorch against the reference module (issue 4's benchmark).

For the founding case and the latentkv-bench presets (fp32, and bf16 where latentkv's kernels take
it) this times, in one run: the reference module in eager mode, the reference under torch.compile,
and latentkv.torch.LatentKVProjection. Two numbers per variant:
  wall: per call, back to back from Python (what a Python caller pays: CPU overhead or GPU time,
        whichever is larger), synchronized once at the end of the loop;
  gpu:  per call inside a CUDA graph of many calls, replayed (GPU time alone, no launch overhead).
  kb:   one call between two CUDA events with L2 flushed before it (KernelBench's way: a 256 MB
        buffer is zeroed first, so weights and inputs come from HBM), median of many trials.
It also prints the layers of latentkv's own per-call cost, each back to back: the binding's no-op
call, the binding call that runs (on a preallocated output and workspace: the baseline), the op
(torch.ops.latentkv.kv_proj.default), latentkv.torch.kv_proj and the module; and closes with a
compact table and the module-against-binding ratio (at most 1.5 for the founding case).
Without a GPU it runs on the CPU backend (wall time only), as a smoke test.

    python python/bench/bench_torch.py [--cases founding,deepseek-v3] [--dtypes fp32,bf16]
                                       [--json results.json] [--no-compile] [--device cpu]
                                       [--clock wall|thread]
"""

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference import CASES as _TEST_CASES, rel_error  # noqa: E402
from reference_torch import ReferenceKVProjection  # noqa: E402

import latentkv  # noqa: E402
import latentkv.torch as lt  # noqa: E402
from latentkv import _C  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# The tests' cases, and "host": a call whose GPU work is a launch's worth (~2 us), so its per-call
# wall times are the host's cost of each layer (B, S, D, R, H, Dh).
CASES = {**_TEST_CASES, "host": (1, 1, 64, 16, 1, 16)}
# Issue 4's targets for the founding case, fp32, per call from Python.
TARGET_CALL_US = 10.0
TARGET_BINDING_US = 5.0
# Issue 14: the module call, back to back, against the bare binding's call on a preallocated output.
TARGET_MODULE_OVER_BINDING = 1.5
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def wall_us(fn, iters, repeats, sync):
    """Median over repeats of the mean per-call time of iters back-to-back calls. Python's cyclic
    garbage collector is off while timing, as timeit does: its passes depend on how many objects
    earlier variants left (torch.compile leaves many) and would land in whichever loop runs next."""
    for _ in range(max(iters // 10, 3)):
        fn()
    sync()
    samples = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            sync()
            samples.append((time.perf_counter() - start) / iters * 1e6)
    finally:
        gc.enable()
    return statistics.median(samples)


def interleaved_wall_us(fns, iters, repeats, sync, clock=time.perf_counter):
    """wall_us for several variants, their samples taken in rounds (one block of iters calls of
    each per round), so that no variant inherits the state another left behind (measured: the
    module timed right after the eager reference's CUDA-graph capture read up to 5 us slower than
    the same call timed later in the run). Returns {key: (median, min, max)} over the rounds.
    clock: time.perf_counter (wall), or time.thread_time (this thread's CPU time, steadier for
    CPU-only calls on a loaded machine)."""
    for fn in fns.values():
        for _ in range(max(iters // 10, 3)):
            fn()
    sync()
    samples = {key: [] for key in fns}
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            for key, fn in fns.items():
                start = clock()
                for _ in range(iters):
                    fn()
                sync()
                samples[key].append((clock() - start) / iters * 1e6)
    finally:
        gc.enable()
    return {key: (statistics.median(v), min(v), max(v)) for key, v in samples.items()}


def graph_us(fn, calls_per_graph, replays):
    """GPU time per call: calls_per_graph calls captured in one CUDA graph, replayed. fn is one
    callable, or a list of them: captured call i is fn[i % len(fn)] (rotating over input sets, so
    that what they read comes from memory rather than from the cache; each is warmed up first)."""
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(max(3, len(fns))):
            fns[i % len(fns)]()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls_per_graph):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    del graph
    return start.elapsed_time(end) * 1e3 / (replays * calls_per_graph)


_L2_FLUSH_BYTES = 256 << 20  # over 4x the H100/H200 L2 (50/60 MiB), as triton.testing.do_bench uses


def kernelbench_us(fn, trials):
    """One call timed between CUDA events, L2 flushed before each trial; median over trials. This
    is what a single call from Python costs when nothing it reads is cached: launch overhead plus
    GPU time, as KernelBench times a module's forward."""
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(trials):
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    del flush
    return statistics.median(samples)


def supported(fn):
    """None when latentkv runs fn, else the refusal (a dtype or size its kernels do not take)."""
    try:
        fn()
        return None
    except ValueError as e:
        return str(e)


def bench_case(name, dtype_name, args, device):
    b, s, d, r, h, dh = CASES[name]
    dtype = DTYPES[dtype_name]
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    ref = ReferenceKVProjection(d, r, h, dh).to(device, dtype)
    ours = lt.LatentKVProjection(d, r, h, dh).to(device, dtype)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(b, s, d, device=device, dtype=dtype)
    row = {"case": name, "dtype": dtype_name, "shape": dict(zip("B S D R H Dh".split(), CASES[name]))}

    refusal = supported(lambda: ours(x))
    if refusal is not None:
        row["unsupported"] = refusal
        print(f"{name} {dtype_name}: latentkv refuses it: {refusal}")
        return row
    want = ReferenceKVProjection(d, r, h, dh).to(device, torch.float64)
    want.load_state_dict(ref.state_dict())
    exact = want(x.double()).cpu().numpy()
    row["rel_error_latentkv"] = rel_error(ours(x).float().cpu().numpy(), exact)
    row["rel_error_eager"] = rel_error(ref(x).float().cpu().numpy(), exact)

    variants = {"eager": ref, "latentkv": ours}
    if not args.no_compile:
        compiled = torch.compile(ref)
        compiled(x)
        variants["compiled"] = compiled
    big = b * s * d * r > 2**26  # fewer iterations for the large presets
    iters = max(args.iters // (10 if big else 1), 20)
    walls = interleaved_wall_us({key: (lambda fn=fn: fn(x)) for key, fn in variants.items()},
                                iters, args.repeats, sync, CLOCKS[args.clock])
    for key, fn in variants.items():
        row[f"wall_{key}_us"], row[f"wall_{key}_min_us"], row[f"wall_{key}_max_us"] = walls[key]
        if cuda:
            try:
                row[f"gpu_{key}_us"] = graph_us(lambda: fn(x), args.graph_calls, args.replays)
            except RuntimeError as e:  # a variant that cannot be captured is reported, not fatal
                row[f"gpu_{key}_us"] = None
                print(f"{name} {dtype_name} {key}: CUDA graph capture failed: {e}")
            row[f"kb_{key}_us"] = kernelbench_us(lambda: fn(x), args.kb_trials)

    # latentkv's own layers, each timed back to back.
    w_down, w_up_k, w_up_v = (p.detach() for p in ours.parameters())
    out = torch.empty(2, b, s, h, dh, device=device, dtype=dtype)
    # The workspace the strategy latentkv prefers wants (the decode kernels', cuBLAS's latent), as
    # the op allocates it: the binding gets the same, preallocated.
    wanted = _C.workspace_size(x, w_down, w_up_k, w_up_v, out)
    workspace = torch.empty(wanted, device=device, dtype=torch.uint8) if wanted else None
    op = torch.ops.latentkv.kv_proj.default
    layers = {
        "noop_binding": lambda: _C._noop(x, w_down, w_up_k, w_up_v, out, workspace=workspace),
        "binding_run": lambda: _C.kv_proj(x, w_down, w_up_k, w_up_v, out, workspace=workspace),
        "op": lambda: op(x, w_down, w_up_k, w_up_v, h),
        "torch_op": lambda: lt.kv_proj(x, w_down, w_up_k, w_up_v, h),
        "module": lambda: ours(x),
    }
    walls = interleaved_wall_us(layers, iters, args.repeats, sync, CLOCKS[args.clock])
    for key in layers:
        row[f"layer_{key}_us"] = walls[key][0]
    return row


def fmt(value, width=9):
    return f"{value:{width}.2f}" if isinstance(value, (int, float)) else f"{'-':>{width}}"


def ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def print_table(rows, device):
    print()
    print(f"latentkv vs the reference module on {device}, per call in us "
          "(wall: back to back from Python; gpu: CUDA-graph replay); x = speedup of latentkv")
    header = (f"{'case':<17}{'dtype':<6}{'eager':>9}{'compiled':>9}{'latentkv':>9}{'x eager':>9}"
              f"{'x comp':>9} |{'gpu eag':>9}{'gpu comp':>9}{'gpu lkv':>9}{'x eager':>9}{'x comp':>9}"
              f" |{'rel err':>9}")
    print(header)
    print("-" * len(header))
    for r in rows:
        if "unsupported" in r:
            print(f"{r['case']:<17}{r['dtype']:<6}  not supported by latentkv: {r['unsupported'][:60]}")
            continue
        print(
            f"{r['case']:<17}{r['dtype']:<6}"
            f"{fmt(r.get('wall_eager_us'))}{fmt(r.get('wall_compiled_us'))}{fmt(r.get('wall_latentkv_us'))}"
            f"{fmt(ratio(r.get('wall_eager_us'), r.get('wall_latentkv_us')))}"
            f"{fmt(ratio(r.get('wall_compiled_us'), r.get('wall_latentkv_us')))} |"
            f"{fmt(r.get('gpu_eager_us'))}{fmt(r.get('gpu_compiled_us'))}{fmt(r.get('gpu_latentkv_us'))}"
            f"{fmt(ratio(r.get('gpu_eager_us'), r.get('gpu_latentkv_us')))}"
            f"{fmt(ratio(r.get('gpu_compiled_us'), r.get('gpu_latentkv_us')))} |"
            f"{r['rel_error_latentkv']:9.1e}"
        )
    if device == "cuda":
        print()
        print("one call between CUDA events, L2 flushed before it (KernelBench's way), median us:")
        print(f"{'case':<17}{'dtype':<6}{'eager':>9}{'compiled':>9}{'latentkv':>9}{'x eager':>9}"
              f"{'x comp':>9}")
        for r in rows:
            if "unsupported" in r:
                continue
            print(f"{r['case']:<17}{r['dtype']:<6}{fmt(r.get('kb_eager_us'))}"
                  f"{fmt(r.get('kb_compiled_us'))}{fmt(r.get('kb_latentkv_us'))}"
                  f"{fmt(ratio(r.get('kb_eager_us'), r.get('kb_latentkv_us')))}"
                  f"{fmt(ratio(r.get('kb_compiled_us'), r.get('kb_latentkv_us')))}")
    print()
    print("latentkv per-call layers, back to back from Python, us, sampled in rounds (noop: the "
          "binding parsing and checking, no run; binding: _C.kv_proj on a preallocated output and "
          "workspace; op: torch.ops.latentkv.kv_proj.default; kv_proj: latentkv.torch.kv_proj; "
          "module: LatentKVProjection under no_grad; +op / +module: what each adds over the "
          "binding; module/binding: the ratio):")
    print(f"{'case':<17}{'dtype':<6}{'noop':>9}{'binding':>9}{'op':>9}{'kv_proj':>9}{'module':>9}"
          f"{'+op':>9}{'+module':>9}{'mod/bind':>9}")
    for r in rows:
        if "unsupported" in r:
            continue
        binding = r["layer_binding_run_us"]
        print(f"{r['case']:<17}{r['dtype']:<6}{fmt(r['layer_noop_binding_us'])}{fmt(binding)}"
              f"{fmt(r['layer_op_us'])}{fmt(r['layer_torch_op_us'])}{fmt(r['layer_module_us'])}"
              f"{fmt(r['layer_op_us'] - binding)}{fmt(r['layer_module_us'] - binding)}"
              f"{fmt(ratio(r['layer_module_us'], binding))}")
    founding = next((r for r in rows if r["case"] == "founding" and r["dtype"] == "fp32"
                     and "unsupported" not in r), None)
    if founding is not None and device == "cuda":
        call, noop = founding["wall_latentkv_us"], founding["layer_noop_binding_us"]
        spread = (founding["wall_latentkv_min_us"], founding["wall_latentkv_max_us"])
        print(f"\nissue 4 targets (founding, fp32): module call {call:.2f} us "
              f"(rounds {spread[0]:.2f}-{spread[1]:.2f}) "
              f"({'meets' if call <= TARGET_CALL_US else 'MISSES'} <= {TARGET_CALL_US:g}); "
              f"binding overhead {noop:.2f} us "
              f"({'meets' if noop < TARGET_BINDING_US else 'MISSES'} < {TARGET_BINDING_US:g})")
        over = ratio(founding["layer_module_us"], founding["layer_binding_run_us"])
        print(f"issue 14 target (founding, fp32): module {founding['layer_module_us']:.2f} us against "
              f"the binding's {founding['layer_binding_run_us']:.2f} us = {over:.2f}x "
              f"({'meets' if over <= TARGET_MODULE_OVER_BINDING else 'MISSES'} <= "
              f"{TARGET_MODULE_OVER_BINDING:g}x)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma-separated, from: " + ", ".join(DTYPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=2000, help="back-to-back calls per wall sample")
    parser.add_argument("--repeats", type=int, default=5, help="wall samples (median)")
    parser.add_argument("--graph-calls", type=int, default=20, help="calls captured per CUDA graph")
    parser.add_argument("--replays", type=int, default=50, help="CUDA graph replays")
    parser.add_argument("--kb-trials", type=int, default=200,
                        help="single-call trials with L2 flushed (KernelBench's way), GPU only")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    parser.add_argument("--clock", choices=CLOCKS, default="wall",
                        help="wall: elapsed time; thread: this thread's CPU time, for --device cpu "
                        "on a loaded machine (time spent preempted is not counted)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not latentkv.cuda_available():
        sys.exit("latentkv sees no CUDA device (was it built with CUDA, is the driver new enough?)")
    print(f"torch {torch.__version__}, latentkv {latentkv.__version__}, device "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    rows = []
    with torch.no_grad():
        for name in args.cases.split(","):
            for dtype_name in args.dtypes.split(","):
                if device.type == "cpu" and dtype_name != "fp32":
                    continue  # the CPU backend is float32 only
                row = bench_case(name, dtype_name, args, device)
                rows.append(row)
                print(json.dumps(row))
    print_table(rows, device.type)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "torch": torch.__version__,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
