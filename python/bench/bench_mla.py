"""latentkv's MLA KV path from PyTorch against transformers' code for the same KV side (issue 15).

The baseline is what DeepseekV3Attention.forward runs for keys and values, with its own modules
and functions: kv_a_proj_with_mqa, the split, kv_a_layernorm, apply_rotary_pos_emb_interleave
and expand_kv (kv_b_proj, the split per head, K = [k_nope | k_pe] by copies); eager, and under
torch.compile. latentkv is latentkv.torch.mla_kv (torch.ops.latentkv.mla_kv) on the same weights.
For each row (V2-Lite and V3 at T = 1, 64, 1024, 4096; B = 1, S = T) two numbers per variant:
  gpu:  per call inside a CUDA graph of many calls, replayed (GPU time alone);
  wall: per call, back to back from Python, synchronized once at the end (what a caller pays).
floor = max(bytes / 4.2 TB/s, FLOPs / 670 TFLOP/s) (each input read once, each output written
once). A row passes when latentkv's GPU time beats the compiled baseline's and meets the issue's
target. Before timing, each row checks latentkv against the eager baseline (relative difference;
both are bf16).

    python python/bench/bench_mla.py [--rows v2-lite:1,v3:4096] [--dtype bf16] [--cache]
                                     [--no-compile] [--json results.json] [--device cpu]

Without a GPU (--device cpu, float32) it runs the CPU backend as a smoke test, wall time only.
"""

import argparse
import json
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


def floor_us(tokens, d, h, r, dr, dn, dv, elem):
    weights = (r + dr) * d + r + h * (dn + dv) * r
    moved = tokens * d + weights + tokens * 2 * dr + tokens * h * (dn + dr + dv)
    flops = 2 * tokens * d * (r + dr) + 2 * tokens * r * h * (dn + dv)
    return max(moved * elem / COPY_BYTES_PER_S, flops / TENSOR_FLOPS) * 1e6


def make_attention(d, h, r, dr, dn, dv, dtype, device):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mod
    cfg = DeepseekV3Config(hidden_size=d, num_attention_heads=h, num_key_value_heads=h,
                           kv_lora_rank=r, q_lora_rank=64, qk_rope_head_dim=dr,
                           qk_nope_head_dim=dn, v_head_dim=dv, num_hidden_layers=1,
                           rope_interleave=True)
    attn = mod.DeepseekV3Attention(cfg, layer_idx=0)
    # Only the KV side is timed: drop the query and output projections before moving to the GPU.
    attn.q_a_proj = attn.q_b_proj = attn.o_proj = None
    for p in attn.parameters():
        torch.nn.init.normal_(p, 1.0 if p.dim() == 1 else 0.0, 0.02 if p.dim() > 1 else 0.1)
    return attn.to(device, dtype).eval(), mod


def hf_kv_side(attn, mod):
    """transformers' KV side of DeepseekV3Attention.forward (its modules and functions)."""
    r, dr = attn.kv_lora_rank, attn.qk_rope_head_dim

    def expand(kv_nope, k_rot):
        if hasattr(attn, "expand_kv"):
            return attn.expand_kv(kv_nope, k_rot)
        # Releases without expand_kv: the same computation inline, as their forward has it.
        b, _, s, _ = kv_nope.shape
        kv = attn.kv_b_proj(kv_nope).view(b, s, -1, attn.qk_nope_head_dim + attn.v_head_dim)
        kv = kv.transpose(1, 2)
        k_pass, v = torch.split(kv, [attn.qk_nope_head_dim, attn.v_head_dim], dim=-1)
        return torch.cat((k_pass, k_rot.expand(*k_pass.shape[:-1], -1)), dim=-1), v

    def kv_side(hidden, cos, sin):
        b, s = hidden.shape[:-1]
        compressed = attn.kv_a_proj_with_mqa(hidden)
        kv_nope, k_rot = torch.split(compressed, [r, dr], dim=-1)
        kv_nope = attn.kv_a_layernorm(kv_nope).view(b, 1, s, r)
        k_rot = k_rot.view(b, 1, s, dr)
        # The query's RoPE is not part of the KV side; the function rotates both arguments, so
        # k_rot goes in as the query too (a (T, dr) tensor: small next to the GEMMs).
        _, k_rot = mod.apply_rotary_pos_emb_interleave(k_rot, k_rot, cos, sin)
        return expand(kv_nope, k_rot)

    return kv_side


def rel_diff(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def run_row(name, tokens, args, device):
    d, h, r, dr, dn, dv = MODELS[name]
    dtype = DTYPES[args.dtype]
    attn, mod = make_attention(d, h, r, dr, dn, dv, dtype, device)
    hidden = torch.randn(1, tokens, d, device=device, dtype=dtype)
    angles = torch.arange(tokens, device=device, dtype=torch.float32)[:, None] * \
        (10000.0 ** (-torch.arange(0, dr, 2, device=device) / dr))
    angles = torch.cat([angles, angles], dim=-1)[None]  # (1, S, dr)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    kv_side = hf_kv_side(attn, mod)
    weights = (attn.kv_a_proj_with_mqa.weight, attn.kv_a_layernorm.weight, attn.kv_b_proj.weight)
    cache = torch.empty(tokens, r + dr, device=device, dtype=dtype) if args.cache else None

    def ours():
        return lt.mla_kv(hidden, *weights, h, qk_nope_head_dim=dn, v_head_dim=dv, cos=cos,
                         sin=sin, kv_cache=cache)

    variants = {"hf eager": lambda: kv_side(hidden, cos, sin)}
    if not args.no_compile:
        compiled = torch.compile(kv_side, fullgraph=True)
        variants["hf compile"] = lambda: compiled(hidden, cos, sin)
    variants["latentkv"] = ours
    with torch.no_grad():
        ref_k, ref_v = kv_side(hidden, cos, sin)
        k, v = ours()
        check = max(rel_diff(k.transpose(1, 2), ref_k), rel_diff(v.transpose(1, 2), ref_v))
        cuda = device.type == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        iters = 200 if tokens <= 64 else 50
        row = {"case": name, "tokens": tokens, "dtype": args.dtype, "check": check,
               "floor_us": floor_us(tokens, d, h, r, dr, dn, dv, hidden.element_size()),
               "target_us": TARGET_US.get((name, tokens)), "device": str(device)}
        for key, fn in variants.items():
            row[key] = {"wall_us": wall_us(fn, iters, 5, sync),
                        "gpu_us": graph_us(fn, 20, 20) if cuda else None}
    del attn
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def print_table(rows):
    keys = [k for k in ("hf eager", "hf compile", "latentkv") if k in rows[0]]
    header = f"{'case':>8} {'T':>5} " + " ".join(f"{k + ' gpu':>15} {k + ' wall':>15}"
                                                 for k in keys)
    print(header + f" {'floor':>7} {'target':>6} {'x compile':>9} {'check':>8}  verdict")
    for row in rows:
        cells = []
        for k in keys:
            gpu, wall = row[k]["gpu_us"], row[k]["wall_us"]
            cells.append(f"{gpu:15.1f}" if gpu is not None else f"{'-':>15}")
            cells.append(f"{wall:15.1f}")
        ours = row["latentkv"]["gpu_us"]
        base = row.get("hf compile", {}).get("gpu_us")
        speedup = f"{base / ours:9.2f}" if ours and base else f"{'-':>9}"
        target = row["target_us"]
        verdict = "-"
        if ours is not None:
            meets = target is None or ours <= target
            beats = base is None or ours < base
            verdict = "pass" if meets and beats else "FAIL"
        print(f"{row['case']:>8} {row['tokens']:>5} " + " ".join(cells) +
              f" {row['floor_us']:7.1f} {target if target else '-':>6} {speedup}"
              f" {row['check']:8.1e}  {verdict}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(f"{m}:{t}" for m in MODELS for t in TOKENS),
                        help="comma-separated model:tokens (models: %s)" % ", ".join(MODELS))
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                        help="default bf16 on CUDA, fp32 on the CPU")
    parser.add_argument("--cache", action="store_true",
                        help="latentkv also writes the dense latent cache rows")
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
        print(f"[{len(rows)}] {name} T={tokens} done", file=sys.stderr)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; torch {torch.__version__}; {args.dtype}; us per call")
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
