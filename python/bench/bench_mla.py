"""latentkv's MLA KV path from PyTorch against transformers' code for the same KV side (issue 15).

The baseline is what DeepseekV3Attention.forward runs for keys and values, with its own modules
and functions: kv_a_proj_with_mqa, the split, kv_a_layernorm, apply_rotary_pos_emb_interleave
and expand_kv (kv_b_proj, the split per head, K = [k_nope | k_pe] by copies); eager, and under
torch.compile. latentkv is latentkv.torch.mla_kv (torch.ops.latentkv.mla_kv) on the same weights.

Weights come from HBM, as in a model: every layer there has its own weights, so a decode step
never finds them in L2, while one weight set called again and again (V3: 8.3 MB kv_a + 33.5 MB
kv_b; V2-Lite 2.4 + 4.2 MB, bf16) stays in the H200's 50 MB L2. So each row builds N weight sets
(--rotate; auto: the fewest, at least 2, whose weights pass 3x the device's L2, at most 2 GB of
weights), each its own DeepseekV3Attention (same config, fresh random weights) with its own
hidden, cos and sin (and latent cache with --cache); call i of every variant uses set i % N.
Every variant rotates the same way in the same run; torch.compile compiles one function that
takes the attention module as an argument (its parameters are graph inputs), and a row whose
compiled variant would recompile for another set fails (torch.compiler.set_stance
"fail_on_recompile" while it runs; one graph expected per row, torch.compiler.reset() before each).

For each row (V2-Lite and V3 at T = 1, 64, 1024, 4096; B = 1, S = T) per variant:
  gpu:  per call inside a CUDA graph whose captured calls cycle through the N sets, replayed
        (GPU time alone; the headline, used for pass/fail);
  res:  the same graph over set 0 alone (weights L2-resident where they fit: --rotate 1's number);
  wall: per call, back to back from Python over the N sets, synchronized once at the end (what a
        caller pays).
floor = max(bytes / 4.2 TB/s, FLOPs / 670 TFLOP/s) (each input read once, each output written
once). A row passes when latentkv's rotated GPU time beats the compiled baseline's and meets the
issue's target; the verdict says which failed ("FAIL: slower than compile", or "over target":
faster than compile, above the target, which is the H200's: on another card, read it as a
reference). Before timing, each row checks latentkv against the eager baseline on the first
and the last set (relative difference; both are bf16).

JSON (--json): {"device", "rows": [...]}; per row case, tokens, dtype, device, sets (N),
weight_bytes (one set's), check (the larger of check_first and check_last), floor_us, target_us,
compile_error (set when the compiled variant recompiled for another set; the row fails; one graph
per row is what fullgraph=True compiles, raising on a graph break), and per variant {gpu_us,
gpu_rotated_us, gpu_resident_us, wall_us}. The older keys keep their names: gpu_us is now the
rotated time (equal to gpu_rotated_us; with --rotate 1 all three GPU fields are the one-set time,
which is what gpu_us meant before rotation), wall_us the rotated wall time. GPU fields are null on
the CPU.

    python python/bench/bench_mla.py [--rows v2-lite:1,v3:4096] [--dtype bf16] [--cache]
                                     [--rotate N|auto] [--no-compile] [--json results.json]
                                     [--device cpu]

Without a GPU (--device cpu, float32) it runs the CPU backend as a smoke test, wall time only.
"""

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_torch import graph_us, wall_us  # noqa: E402

import latentkv.torch as lt  # noqa: E402

# name: (D, H, R, dr, dn, dv); no q_a part (the rows time the KV side alone).
MODELS = {"v2-lite": (2048, 16, 512, 64, 128, 128), "v3": (7168, 128, 512, 64, 128, 128)}
TOKENS = (1, 64, 1024, 4096)
# The targets for latentkv's GPU time per call (us), bf16, on an H200.
TARGET_US = {("v2-lite", 1): 6, ("v2-lite", 64): 7, ("v2-lite", 1024): 18, ("v2-lite", 4096): 52,
             ("v3", 1): 17, ("v3", 64): 22, ("v3", 1024): 85, ("v3", 4096): 310}
COPY_BYTES_PER_S = 4.2e12
TENSOR_FLOPS = 670e12
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# --rotate auto: the weight sets' bytes pass this many times the L2 (the H200's 50 MB where the
# device does not say, as on the CPU), so that no set is still cached when its turn comes again.
L2_DEFAULT_BYTES = 50 * 1000 * 1000
ROTATE_L2_MULTIPLE = 3
ROTATE_MAX_BYTES = 2 * 1000 ** 3
GRAPH_CALLS = 20  # at least this many calls per graph, a whole number of rotations
VARIANTS = ("hf eager", "hf compile", "latentkv")


def weight_elems(d, h, r, dr, dn, dv):
    return (r + dr) * d + r + h * (dn + dv) * r


def floor_us(tokens, d, h, r, dr, dn, dv, elem):
    moved = tokens * d + weight_elems(d, h, r, dr, dn, dv) + tokens * 2 * dr + \
        tokens * h * (dn + dr + dv)
    flops = 2 * tokens * d * (r + dr) + 2 * tokens * r * h * (dn + dv)
    return max(moved * elem / COPY_BYTES_PER_S, flops / TENSOR_FLOPS) * 1e6


def rotate_sets(rotate, set_bytes, device):
    """--rotate: an explicit count, or auto: at least 2 sets whose bytes pass 3x the L2, capped
    at 2 GB of weights (the cap never goes under 2 sets)."""
    if rotate != "auto":
        return int(rotate)
    l2 = L2_DEFAULT_BYTES
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or l2
    wanted = max(2, math.ceil(ROTATE_L2_MULTIPLE * l2 / set_bytes))
    return min(wanted, max(2, ROTATE_MAX_BYTES // set_bytes))


def make_attention(d, h, r, dr, dn, dv, dtype, device):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mod
    cfg = DeepseekV3Config(hidden_size=d, num_attention_heads=h, num_key_value_heads=h,
                           kv_lora_rank=r, q_lora_rank=64, qk_rope_head_dim=dr,
                           qk_nope_head_dim=dn, v_head_dim=dv, num_hidden_layers=1,
                           rope_interleave=True)
    # Built on the meta device (no init of the large o_proj), then materialised where it runs.
    with torch.device("meta"):
        attn = mod.DeepseekV3Attention(cfg, layer_idx=0)
    # Only the KV side is timed: drop the query and output projections.
    attn.q_a_proj = attn.q_b_proj = attn.o_proj = None
    attn = attn.to_empty(device=device).to(dtype)
    for p in attn.parameters():
        torch.nn.init.normal_(p, 1.0 if p.dim() == 1 else 0.0, 0.02 if p.dim() > 1 else 0.1)
    return attn.eval(), mod


def make_set(name, tokens, args, device):
    """One weight set: its own attention module, inputs and (with --cache) latent cache."""
    d, h, r, dr, dn, dv = MODELS[name]
    dtype = DTYPES[args.dtype]
    attn, mod = make_attention(d, h, r, dr, dn, dv, dtype, device)
    hidden = torch.randn(1, tokens, d, device=device, dtype=dtype)  # (B, S, D)
    angles = torch.arange(tokens, device=device, dtype=torch.float32)[:, None] * \
        (10000.0 ** (-torch.arange(0, dr, 2, device=device) / dr))
    angles = torch.cat([angles, angles], dim=-1)[None]  # (1, S, dr)
    cache = torch.empty(tokens, r + dr, device=device, dtype=dtype) if args.cache else None
    return {"attn": attn, "mod": mod, "hidden": hidden, "cos": angles.cos().to(dtype),
            "sin": angles.sin().to(dtype), "cache": cache,
            "weights": (attn.kv_a_proj_with_mqa.weight, attn.kv_a_layernorm.weight,
                        attn.kv_b_proj.weight)}


def hf_kv_side(mod):
    """transformers' KV side of DeepseekV3Attention.forward (its modules and functions), as one
    function of the attention module, so that one compiled graph serves every weight set."""

    def expand(attn, kv_nope, k_rot):
        if hasattr(attn, "expand_kv"):
            return attn.expand_kv(kv_nope, k_rot)
        # Releases without expand_kv: the same computation inline, as their forward has it.
        b, _, s, _ = kv_nope.shape
        kv = attn.kv_b_proj(kv_nope).view(b, s, -1, attn.qk_nope_head_dim + attn.v_head_dim)
        kv = kv.transpose(1, 2)
        k_pass, v = torch.split(kv, [attn.qk_nope_head_dim, attn.v_head_dim], dim=-1)
        return torch.cat((k_pass, k_rot.expand(*k_pass.shape[:-1], -1)), dim=-1), v

    def kv_side(attn, hidden, cos, sin):
        r, dr = attn.kv_lora_rank, attn.qk_rope_head_dim
        b, s = hidden.shape[:-1]
        compressed = attn.kv_a_proj_with_mqa(hidden)
        kv_nope, k_rot = torch.split(compressed, [r, dr], dim=-1)
        kv_nope = attn.kv_a_layernorm(kv_nope).view(b, 1, s, r)
        k_rot = k_rot.view(b, 1, s, dr)
        # The query's RoPE is not part of the KV side; the function rotates both arguments, so
        # k_rot goes in as the query too (a (T, dr) tensor: small next to the GEMMs).
        _, k_rot = mod.apply_rotary_pos_emb_interleave(k_rot, k_rot, cos, sin)
        return expand(attn, kv_nope, k_rot)

    return kv_side


def rel_diff(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def recompile_message(error):
    """The first lines of a fail_on_recompile error (what recompiled and which guard failed);
    any other error goes on up."""
    if "recompile" not in str(error):
        raise error
    return " ".join(line.strip() for line in str(error).splitlines()[:3])


def variant_calls(name, sets, args):
    """{variant: call(set)}; the compiled one is compiled here on set 0 and then called on every
    other set with recompiles raising (torch.compiler.set_stance), so a per-set recompile is
    reported, not timed. Returns (calls, compile_error)."""
    _, h, _, _, dn, dv = MODELS[name]
    kv_side = hf_kv_side(sets[0]["mod"])

    def ours(s):
        return lt.mla_kv(s["hidden"], *s["weights"], h, qk_nope_head_dim=dn, v_head_dim=dv,
                         cos=s["cos"], sin=s["sin"], kv_cache=s["cache"])

    calls = {"hf eager": lambda s: kv_side(s["attn"], s["hidden"], s["cos"], s["sin"])}
    error = None
    if not args.no_compile:
        compiled = torch.compile(kv_side, fullgraph=True)

        def compiled_call(s):
            return compiled(s["attn"], s["hidden"], s["cos"], s["sin"])

        compiled_call(sets[0])
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                for s in sets[1:]:
                    compiled_call(s)
            calls["hf compile"] = compiled_call
        except RuntimeError as e:
            error = recompile_message(e)
    calls["latentkv"] = ours
    return calls, error


def check_sets(calls, sets):
    """latentkv against the eager baseline on the first and the last set."""
    diffs = []
    for s in (sets[0], sets[-1]):
        ref_k, ref_v = calls["hf eager"](s)
        k, v = calls["latentkv"](s)
        diffs.append(max(rel_diff(k.transpose(1, 2), ref_k), rel_diff(v.transpose(1, 2), ref_v)))
    return diffs


def time_variant(call, sets, tokens, cuda, sync):
    """Rotated GPU and wall times and the one-set GPU time of call over sets (us per call)."""
    fns = [lambda s=s: call(s) for s in sets]
    rotation = itertools.cycle(fns)
    iters = 200 if tokens <= 64 else 50
    out = {"wall_us": wall_us(lambda: next(rotation)(), iters, 5, sync),
           "gpu_rotated_us": None, "gpu_resident_us": None}
    if cuda:
        graph_calls = len(fns) * math.ceil(GRAPH_CALLS / len(fns))
        out["gpu_rotated_us"] = graph_us(fns, graph_calls, 20)
        out["gpu_resident_us"] = out["gpu_rotated_us"] if len(fns) == 1 else \
            graph_us(fns[0], graph_calls, 20)
    out["gpu_us"] = out["gpu_rotated_us"]
    return out


def run_row(name, tokens, args, device):
    d, h, r, dr, dn, dv = MODELS[name]
    elem = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    set_bytes = weight_elems(d, h, r, dr, dn, dv) * elem
    n = rotate_sets(args.rotate, set_bytes, device)
    torch.compiler.reset()  # each row compiles afresh: static shapes, one graph expected
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.no_grad():
        sets = [make_set(name, tokens, args, device) for _ in range(n)]
        calls, error = variant_calls(name, sets, args)
        first, last = check_sets(calls, sets)
        row = {"case": name, "tokens": tokens, "dtype": args.dtype, "device": str(device),
               "sets": n, "weight_bytes": set_bytes, "check": max(first, last),
               "check_first": first, "check_last": last,
               "floor_us": floor_us(tokens, d, h, r, dr, dn, dv, elem),
               "target_us": TARGET_US.get((name, tokens)), "compile_error": error}
        for key, call in calls.items():
            if key != "hf compile":
                row[key] = time_variant(call, sets, tokens, cuda, sync)
                continue
            try:  # a recompile while timing (a set, a stream, a capture) fails the row too
                with torch.compiler.set_stance("fail_on_recompile"):
                    row[key] = time_variant(call, sets, tokens, cuda, sync)
            except RuntimeError as e:
                row["compile_error"] = recompile_message(e)
    if row["compile_error"]:
        print(f"FAIL {name} T={tokens}: torch.compile recompiled across the {n} weight sets: "
              f"{row['compile_error']}", file=sys.stderr)
    del sets, calls
    if cuda:
        torch.cuda.empty_cache()
    return row


def verdict(row):
    """pass, or what failed: the compiled baseline beats latentkv (a failure on any card), or
    latentkv is above the issue's target (set on an H200)."""
    if row["compile_error"]:
        return "FAIL (recompiles)"
    ours = row["latentkv"]["gpu_us"]
    if ours is None:
        return "-"
    base = row.get("hf compile", {}).get("gpu_us")
    if base is not None and ours >= base:
        return "FAIL: slower than compile"
    target = row["target_us"]
    if target is not None and ours > target:
        return "over target"
    return "pass"


def cell(value, width):
    return f"{value:{width}.1f}" if value is not None else f"{'-':>{width}}"


def print_table(rows):
    keys = [k for k in VARIANTS if any(k in row for row in rows)]
    print("gpu: CUDA-graph replay, call i on weight set i % sets (weights from HBM; the headline); "
          "res: one set (L2-resident); wall: back to back from Python, rotated; us per call; "
          "target: the issue's, set on an H200")
    header = f"{'case':>8} {'T':>5} {'sets':>4} " + " ".join(
        f"{k + ' gpu':>15} {'res':>7} {'wall':>8}" for k in keys)
    print(header + f" {'floor':>7} {'target':>6} {'x compile':>9} {'check':>8}  verdict")
    for row in rows:
        cells = []
        for k in keys:
            times = row.get(k, {})
            cells.append(f"{cell(times.get('gpu_us'), 15)} {cell(times.get('gpu_resident_us'), 7)}"
                         f" {cell(times.get('wall_us'), 8)}")
        ours = row["latentkv"]["gpu_us"]
        base = row.get("hf compile", {}).get("gpu_us")
        speedup = f"{base / ours:9.2f}" if ours and base else f"{'-':>9}"
        target = row["target_us"]
        print(f"{row['case']:>8} {row['tokens']:>5} {row['sets']:>4} " + " ".join(cells) +
              f" {row['floor_us']:7.1f} {target if target else '-':>6} {speedup}"
              f" {row['check']:8.1e}  {verdict(row)}")


def rotate_arg(text):
    if text == "auto" or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is neither 'auto' nor a count >= 1")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(f"{m}:{t}" for m in MODELS for t in TOKENS),
                        help="comma-separated model:tokens (models: %s)" % ", ".join(MODELS))
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                        help="default bf16 on CUDA, fp32 on the CPU")
    parser.add_argument("--cache", action="store_true",
                        help="latentkv also writes the dense latent cache rows")
    parser.add_argument("--rotate", default="auto", type=rotate_arg,
                        help="weight sets to cycle through: a count (1: one set, L2-resident), or "
                        "auto (default): at least 2, past 3x the L2 in bytes, at most 2 GB")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    device = torch.device(args.device)
    args.dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    rows = []
    for item in args.rows.split(","):
        name, tokens = item.split(":")
        if name not in MODELS:
            parser.error(f"--rows: unknown model {name!r} (expected one of {', '.join(MODELS)})")
        rows.append(run_row(name, int(tokens), args, device))
        print(f"[{len(rows)}] {name} T={tokens} done ({rows[-1]['sets']} weight sets)",
              file=sys.stderr)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; torch {torch.__version__}; {args.dtype}")
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "rows": rows}, indent=1))
    if any(row["compile_error"] for row in rows):
        sys.exit("torch.compile recompiled across weight sets in some rows (see compile_error)")


if __name__ == "__main__":
    main()
