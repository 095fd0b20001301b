"""Shared pieces of the MLA tests: random layer weights and inputs (fresh per seed), small
transformers DeepSeek configs, relative errors against float64."""

import torch

FLOAT32_TOLERANCE = 1e-5


def rel_error(got, ref):
    """max |got - ref| / max |ref| over finite reference entries; NaN/Inf positions must match."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    assert got.shape == ref.shape, (got.shape, ref.shape)
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(got)), "NaN/Inf positions differ"
    if not finite.any():
        return 0.0
    scale = ref[finite].abs().max().clamp_min(1e-30)
    return ((got[finite] - ref[finite]).abs().max() / scale).item()


def layer(b, s, d, r, dr, h, dn, dv, rq=0, seed=0, dtype=torch.float32, device="cpu"):
    """Weights and inputs of one MLA call, as mla_kv's keyword arguments (cos/sin HF form)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)

    args = {"hidden": rand(b, s, d), "kv_a_weight": rand(r + dr, d, scale=d ** -0.5),
            "kv_a_norm_weight": 1 + rand(r, scale=0.1),
            "kv_b_weight": rand(h * (dn + dv), r, scale=r ** -0.5), "num_heads": h,
            "qk_nope_head_dim": dn, "v_head_dim": dv}
    angles = torch.rand(b, s, dr // 2, generator=g, dtype=torch.float64) * 6.3
    angles = torch.cat([angles, angles], dim=-1)
    args["cos"], args["sin"] = angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device)
    if rq:
        args["q_a_weight"] = rand(rq, d, scale=d ** -0.5)
        args["q_a_norm_weight"] = 1 + rand(rq, scale=0.1)
    return args


def as_double(args):
    return {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
            for k, v in args.items()}


def split_call(args):
    """(positional, keyword) arguments of mla_kv from layer()'s dict."""
    names = ("hidden", "kv_a_weight", "kv_a_norm_weight", "kv_b_weight", "num_heads")
    return [args[n] for n in names], {k: v for k, v in args.items() if k not in names}


def tiny_config(version, *, q_lora_rank=24, heads=3, kv_lora_rank=None, rope_interleave=True,
                layers=2):
    """A small randomly initialisable DeepseekV2/V3 config (odd H, dn != dv; odd R on V3, even on
    V2, whose complex RoPE needs the k_pe columns at an even stride)."""
    if kv_lora_rank is None:
        kv_lora_rank = 21 if version == 3 else 22
    import transformers
    common = dict(vocab_size=97, hidden_size=48, intermediate_size=64, moe_intermediate_size=16,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                  kv_lora_rank=kv_lora_rank, q_lora_rank=q_lora_rank, qk_rope_head_dim=8,
                  qk_nope_head_dim=10, v_head_dim=6, n_routed_experts=4, num_experts_per_tok=2,
                  n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=128,
                  attn_implementation="eager")
    if version == 3:
        return transformers.DeepseekV3Config(rope_interleave=rope_interleave, n_group=1,
                                             topk_group=1, **common)
    return transformers.DeepseekV2Config(**common)


def count_calls(monkeypatch, module, names):
    """Wraps module.<name> for each name so that each call appends its name to the returned list
    (the wrapped function still runs)."""
    calls = []
    for name in names:
        def counting(*args, _name=name, _run=getattr(module, name), **kwargs):
            calls.append(_name)
            return _run(*args, **kwargs)
        monkeypatch.setattr(module, name, counting)
    return calls
