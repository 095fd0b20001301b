"""transformers integration: patch_model(model) routes the KV side of every DeepseekV2Attention /
DeepseekV3Attention of a transformers model through latentkv's MLA ops; unpatch_model(model)
undoes it.

A patched attention's forward computes kv_a_proj_with_mqa, the split, kv_a_layernorm, RoPE, the
latent cache rows, kv_b_proj and K = [k_nope | k_pe], V (and q_a = q_a_layernorm(q_a_proj(x)),
which feeds q_b_proj) with latentkv, and everything else with transformers' own functions from the
attention's module (the query's RoPE, the attention interface, o_proj). The RoPE layout follows
the model: DeepseekV3 interleaves (config.rope_interleave) or rotates halves ("neox"); DeepseekV2
multiplies pairs by complex numbers, which is GPT-J's layout, its freqs_cis turned into cos/sin.

transformers' cache is kept: where the attention has expand_kv (its cache stores the latents, c
and k_pe), stage A writes the new rows, the cache appends them, and stage B expands all of them;
where it stores expanded K/V (older releases), both stages run and the cache gets K and V.

The original forward runs instead whenever latentkv cannot compute the same thing: autograd
recording (a parameter or the input requires grad and grad mode is on), attention biases, the two
RMSNorms with different eps, a dtype other than float32/bfloat16/float16, a device other than cpu
or cuda, and on the CPU a step of more tokens than latentkv's CPU backend is faster at (bf16 on
AVX512-BF16 past 32, float32 past 128: torch's own GEMMs win there; latentkv.torch's
_CPU_MLA_OP_ROWS). Stage B over a long latent cache on the CPU likewise runs torch's math.
Only public transformers names are used (the modeling modules' classes and functions).
"""

import sys
import types

import torch
import torch.nn.functional as F

from .torch import (_cpu_mla_prefers_torch, cos_sin_from_freqs_cis, mla_kv, mla_kv_first_stage,
                    mla_kv_second_stage, reference_mla_kv_second_stage)

__all__ = ["patch_model", "unpatch_model", "attention_classes"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def attention_classes():
    """The transformers attention classes patch_model routes (those this transformers has)."""
    classes = []
    try:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
        classes.append(DeepseekV3Attention)
    except ImportError:
        pass
    try:
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention
        classes.append(DeepseekV2Attention)
    except ImportError:
        pass
    return tuple(classes)


def _is_v2(attn):
    return type(attn).__name__.startswith("DeepseekV2")


def _parameters(attn):
    yield from attn.kv_a_proj_with_mqa.parameters()
    yield from attn.kv_a_layernorm.parameters()
    yield from attn.kv_b_proj.parameters()
    if attn.q_lora_rank is not None:
        yield from attn.q_a_proj.parameters()
        yield from attn.q_a_layernorm.parameters()


def _latentkv_can_run(attn, hidden_states):
    if torch.is_grad_enabled() and (hidden_states.requires_grad
                                    or any(p.requires_grad for p in _parameters(attn))):
        return False
    if attn.kv_a_proj_with_mqa.bias is not None:
        return False
    if attn.q_lora_rank is not None and (
            attn.q_a_proj.bias is not None
            or attn.q_a_layernorm.variance_epsilon != attn.kv_a_layernorm.variance_epsilon):
        return False
    if _cpu_mla_prefers_torch(hidden_states, hidden_states.shape[0] * hidden_states.shape[1]):
        return False
    return hidden_states.dtype in _DTYPES and hidden_states.device.type in ("cpu", "cuda")


def _rope_query(attn, mod, q_rot, position_embeddings, cos, sin):
    # transformers' own RoPE for the query; the key argument is a one-head slice, discarded.
    k = q_rot[:, :1].contiguous()
    if _is_v2(attn):
        return mod.apply_rotary_emb(q_rot, k, position_embeddings.to(q_rot.device))[0]
    if attn.config.rope_interleave:
        return mod.apply_rotary_pos_emb_interleave(q_rot, k, cos, sin)[0]
    return mod.apply_rotary_pos_emb(q_rot, k, cos, sin)[0]


def _attention_function(mod, implementation):
    functions = mod.ALL_ATTENTION_FUNCTIONS
    if hasattr(functions, "get_interface"):
        return functions.get_interface(implementation, mod.eager_attention_forward)
    if implementation in (None, "eager"):
        return mod.eager_attention_forward
    return functions[implementation]


def _mla_attention(attn, hidden_states, position_embeddings, attention_mask, cache, kwargs):
    mod = sys.modules[type(attn).__module__]
    batch, seq = hidden_states.shape[:-1]
    rank, rope_dim = attn.kv_lora_rank, attn.qk_rope_head_dim
    if _is_v2(attn):
        cos, sin = cos_sin_from_freqs_cis(position_embeddings)
        style = "gptj"
    else:
        cos, sin = position_embeddings
        style = "interleave" if attn.config.rope_interleave else "neox"
    q_a_weight = q_a_norm_weight = None
    if attn.q_lora_rank is not None:
        q_a_weight, q_a_norm_weight = attn.q_a_proj.weight, attn.q_a_layernorm.weight
    kv_a = (attn.kv_a_proj_with_mqa.weight, attn.kv_a_layernorm.weight)
    dims = {"qk_nope_head_dim": attn.qk_nope_head_dim, "v_head_dim": attn.v_head_dim}
    rope = {"cos": cos, "sin": sin, "rope_style": style,
            "eps": attn.kv_a_layernorm.variance_epsilon}
    latent_cache = cache is not None and hasattr(attn, "expand_kv")
    if latent_cache:
        # Stage A into this step's rows [c | k_pe] (T, R + dr); the cache appends them and hands
        # back every row so far; stage B expands those.
        rows = hidden_states.new_empty(batch * seq, rank + rope_dim)
        q_a = mla_kv_first_stage(hidden_states, *kv_a, rows, q_a_weight=q_a_weight,
                                 q_a_norm_weight=q_a_norm_weight, **rope)
        c = rows[:, :rank].view(batch, 1, seq, rank)
        k_pe = rows[:, rank:].view(batch, 1, seq, rope_dim)
        c, k_pe = cache.update(c, k_pe, attn.layer_idx, kwargs=kwargs)
        long_cache = _cpu_mla_prefers_torch(c, c.shape[0] * c.shape[2])
        expand = reference_mla_kv_second_stage if long_cache else mla_kv_second_stage
        k, v = expand(attn.kv_b_proj.weight, attn.num_heads, latent=c[:, 0], k_pe=k_pe[:, 0],
                      **dims)
    else:
        out = mla_kv(hidden_states, *kv_a, attn.kv_b_proj.weight, attn.num_heads,
                     q_a_weight=q_a_weight, q_a_norm_weight=q_a_norm_weight, **dims, **rope)
        k, v = out[0], out[1]
        q_a = out[2] if q_a_weight is not None else None
    key_states, value_states = k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, dn + dr), (.., dv)
    if cache is not None and not latent_cache:
        cache_kwargs = {"cache_position": kwargs.get("cache_position")}
        key_states, value_states = cache.update(key_states, value_states, attn.layer_idx,
                                                cache_kwargs)

    q = attn.q_proj(hidden_states) if q_a is None else attn.q_b_proj(q_a)
    q = q.view(batch, seq, -1, attn.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [attn.qk_nope_head_dim, rope_dim], dim=-1)
    q_rot = _rope_query(attn, mod, q_rot, position_embeddings, cos, sin)
    query_states = torch.cat((q_pass, q_rot), dim=-1)

    implementation = attn.config._attn_implementation
    pad = (not latent_cache and "flash" in (implementation or "")
           and attn.qk_head_dim != attn.v_head_dim)
    if pad:  # what the releases with an expanded cache do for flash attention
        value_states = F.pad(value_states, [0, attn.qk_head_dim - attn.v_head_dim])
    attn_output, attn_weights = _attention_function(mod, implementation)(
        attn, query_states, key_states, value_states, attention_mask,
        dropout=0.0 if not attn.training else attn.attention_dropout, scaling=attn.scaling,
        **kwargs)
    if pad:
        attn_output = attn_output[..., :attn.v_head_dim]
    attn_output = attn_output.reshape(batch, seq, -1).contiguous()
    return attn.o_proj(attn_output), attn_weights


def _forward_v3(self, hidden_states, position_embeddings, attention_mask, cache=None, **kwargs):
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    if not _latentkv_can_run(self, hidden_states):
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask,
                                  cache, **kwargs)
    return _mla_attention(self, hidden_states, position_embeddings, attention_mask, cache, kwargs)


def _forward_v2(self, hidden_states, attention_mask=None, cache=None, position_embeddings=None,
                **kwargs):
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    if not _latentkv_can_run(self, hidden_states):
        return type(self).forward(self, hidden_states, attention_mask, cache,
                                  position_embeddings, **kwargs)
    return _mla_attention(self, hidden_states, position_embeddings, attention_mask, cache, kwargs)


def patch_model(model):
    """Routes the KV side of every DeepseekV2Attention / DeepseekV3Attention in model (an
    nn.Module) through latentkv, by giving each its own forward; returns how many were patched.
    Patching twice is a no-op; unpatch_model restores transformers' forward."""
    classes = attention_classes()
    patched = 0
    for module in model.modules():
        if not classes or not isinstance(module, classes):
            continue
        if "forward" not in module.__dict__:
            forward = _forward_v2 if _is_v2(module) else _forward_v3
            module.forward = types.MethodType(forward, module)
        patched += 1
    return patched


def unpatch_model(model):
    """Undoes patch_model(model); returns how many attentions were restored."""
    restored = 0
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, types.MethodType) and forward.__func__ in (_forward_v2,
                                                                          _forward_v3):
            del module.forward
            restored += 1
    return restored
