"""PyTorch integration: the ops torch.ops.latentkv.kv_proj / kv_proj_with_latent and the
LatentKVProjection module, a drop-in for the reference module (same parameter names, shapes,
creation order and init, so state_dicts and seeds carry over); the MLA KV path's ops
torch.ops.latentkv.mla_kv / mla_kv_first_stage / mla_kv_second_stage (mla.h: hidden states to K,
V, q_a and the latent cache row, as DeepSeek-V2/V3 compute them), their wrappers mla_kv,
mla_kv_first_stage, mla_kv_second_stage, the float64-capable reference reference_mla_kv, and
MLAKVProjection, whose submodules carry transformers' DeepSeek attention names.

The ops are defined, with their CPU and CUDA kernels, in C++ (latentkv/_torch_ops.so, built
against the torch that was importable when the package was built); importing this module loads
that library once per process and registers the ops' fake kernels below, so
torch.compile(fullgraph=True) traces them, CUDA graphs capture them (the kernels run on torch's
current stream and allocate through torch) and torch.library.opcheck passes. The ops have no
autograd formula: LatentKVProjection calls the fused op when autograd records nothing
(torch.no_grad / inference_mode / frozen weights) and the unfused, differentiable reference math
otherwise, so training still works.
"""

import math
from pathlib import Path

try:
    import torch
except ImportError as e:
    raise ImportError(
        "latentkv.torch needs PyTorch, which is not importable here: install torch, then rebuild "
        "latentkv against it with `pip install --no-build-isolation .` (from the latentkv "
        "repository)") from e
from torch import nn

from . import _C

__all__ = ["kv_proj", "reference_kv_proj", "LatentKVProjection", "mla_kv", "mla_kv_first_stage",
           "mla_kv_second_stage", "reference_mla_kv", "reference_mla_kv_second_stage",
           "cos_sin_from_freqs_cis", "MLARMSNorm", "MLAKVProjection"]

_OPS_LIBRARY = Path(__file__).with_name("_torch_ops.so")


def _load_ops():
    """Registers torch.ops.latentkv.* from latentkv/_torch_ops.so (a no-op when loaded already)."""
    if not _OPS_LIBRARY.exists():
        raise ImportError(
            f"latentkv.torch: {_OPS_LIBRARY} was not built (torch was not importable when latentkv "
            "was built, e.g. in pip's isolated build): rebuild with the Python that has torch, "
            "`pip install --no-build-isolation .`")
    try:
        torch.ops.load_library(str(_OPS_LIBRARY))
    except (OSError, RuntimeError) as e:
        raise ImportError(
            f"latentkv.torch: {_OPS_LIBRARY} does not load with torch {torch.__version__} ({e}); "
            "it was probably built against another torch: rebuild with "
            "`pip install --no-build-isolation .`") from e


_load_ops()


@torch.library.register_fake("latentkv::kv_proj")
def _kv_proj_fake(hidden, w_down, w_up_k, w_up_v, num_heads):
    # The output's shape only; the C++ kernel checks the call when it runs.
    b, s, _ = hidden.shape
    width = w_up_k.shape[1]
    torch._check(num_heads > 0 and width % num_heads == 0, lambda: (
        f"num_heads = {num_heads} must be positive and divide the width of w_up_k, {width} "
        "(= num_heads * head_dim)"))
    return hidden.new_empty((2, b, s, num_heads, width // num_heads))


@torch.library.register_fake("latentkv::kv_proj_with_latent")
def _kv_proj_with_latent_fake(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out):
    return _kv_proj_fake(hidden, w_down, w_up_k, w_up_v, num_heads)


_op = torch.ops.latentkv.kv_proj.default
_op_with_latent = torch.ops.latentkv.kv_proj_with_latent.default
_is_grad_enabled = torch.is_grad_enabled
# Whether the CPU backend's bf16 products run on AVX512-BF16 dot products (read once).
_CPU_BF16_DOTS = _C.cpu_bf16_isa() == "avx512-bf16"
# bf16 on the CPU, cpu-blocked against torch's own bf16 GEMMs (docs/perf.md, cpu-blocked): where
# its products run on AVX512-BF16 dot products it is faster up to the bound of its column split
# (24 tokens: each weight read once across the threads; 1.05-1.7x at DeepSeek sizes, 4-15x at the
# founding dims) and about level past it, so LatentKVProjection takes it only there; with the
# products widened to float32 (no AVX512-BF16), never.
_CPU_BF16_OP_TOKENS = _C.cpu_split_tokens("bfloat16") if _CPU_BF16_DOTS else 0

# The CPU backend's MLA path against torch's own math (transformers' order) on a 2-core
# AVX512-BF16 VM, V2-Lite dims, both stages (docs/perf.md, cpu-mla, 2026-12-06): bf16 on the dot
# products 3.2x at one token, 1.4x at 16, 1.13-1.25x at 24, 1.14-1.18x at 32, 0.86-1.07x at 48,
# 0.89x at 64; float32 1.44x at 64, 1.14x at 128, level at 256, 0.9x at 512. Past these rows
# MLAKVProjection and latentkv.hf hand a CPU call (or its stage B) to torch's math; fp16 (torch's
# CPU fp16 GEMMs are far slower) and bf16 on the widened products (not measured against torch)
# stay with the op at every size.
_CPU_MLA_OP_ROWS = {torch.float32: 128}
if _CPU_BF16_DOTS:
    _CPU_MLA_OP_ROWS[torch.bfloat16] = 32


def _cpu_mla_prefers_torch(tensor, rows):
    """Whether an MLA product over `rows` rows of `tensor`'s dtype runs faster in torch's own math
    than in the CPU backend (the rule above); False on every other device."""
    limit = _CPU_MLA_OP_ROWS.get(tensor.dtype)
    return limit is not None and rows > limit and tensor.device.type == "cpu"


def kv_proj(hidden, w_down, w_up_k, w_up_v, num_heads, *, latent_out=None):
    """latentkv.kv_proj for torch tensors: the registered op (traceable, capturable).

    latent_out, if given, is written in place (the op declares the mutation). No autograd: use
    reference_kv_proj, or LatentKVProjection, where gradients are needed.
    """
    try:
        if latent_out is None:
            return _op(hidden, w_down, w_up_k, w_up_v, num_heads)
        return _op_with_latent(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out)
    except (RuntimeError, NotImplementedError) as e:
        # The dispatcher's schema check (RuntimeError), or no tensor to dispatch on at all
        # (NotImplementedError): say which argument is not a tensor, as a TypeError.
        named = {"hidden": hidden, "w_down": w_down, "w_up_k": w_up_k, "w_up_v": w_up_v,
                 "latent_out": latent_out}
        for name, value in named.items():
            if (value is not None or name == "hidden") and not isinstance(value, torch.Tensor):
                like = "" if name == "hidden" else " like hidden"
                raise TypeError(
                    f"{name}: expected a torch.Tensor{like}, got {type(value).__name__}"
                ) from e
        raise


def reference_kv_proj(hidden, w_down, w_up_k, w_up_v, num_heads):
    """The unfused computation of the reference module (three matmuls and a stack)."""
    b, s, _ = hidden.shape
    head_dim = w_up_k.shape[-1] // num_heads  # not -1 in view: ambiguous for an empty batch
    latent = hidden @ w_down
    k = (latent @ w_up_k).view(b, s, num_heads, head_dim)
    v = (latent @ w_up_v).view(b, s, num_heads, head_dim)
    return torch.stack([k, v], dim=0)


def _check_positive_int(name, value, alternative=""):
    # A dimension is a positive integer; bool is an int subclass but never a size (True is not 1).
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} = {value!r} must be an integer{alternative}")
    if value <= 0:
        raise ValueError(f"{name} = {value} must be positive{alternative}")


class LatentKVProjection(nn.Module):
    """Drop-in for the reference MLA KV projection module.

    Parameters w_down (D, R), w_up_k (R, H*Dh), w_up_v (R, H*Dh), created in that order with
    randn(...) / sqrt(fan_in), as the reference does. forward(x) with x (B, S, D) returns
    (2, B, S, H, Dh): the fused latentkv op when autograd records nothing, else the unfused
    reference math (latentkv has no backward yet); also the reference math for bf16 on the CPU
    past 6 tokens (B * S), and at any count on a CPU without AVX512-BF16, where torch's own bf16
    GEMMs beat cpu-blocked (docs/perf.md, cpu-blocked).
    """

    def __init__(self, model_dim, rank, num_heads, head_dim, *, device=None, dtype=None):
        super().__init__()
        for name, value in (("model_dim", model_dim), ("rank", rank), ("num_heads", num_heads),
                            ("head_dim", head_dim)):
            _check_positive_int(name, value)
        self.model_dim = model_dim
        self.rank = rank
        self.num_heads = num_heads
        self.head_dim = head_dim
        factory = {"device": device, "dtype": dtype}
        width = num_heads * head_dim
        self.w_down = nn.Parameter(torch.randn(model_dim, rank, **factory) / math.sqrt(model_dim))
        self.w_up_k = nn.Parameter(torch.randn(rank, width, **factory) / math.sqrt(rank))
        self.w_up_v = nn.Parameter(torch.randn(rank, width, **factory) / math.sqrt(rank))

    def forward(self, x):
        # The parameters from the dict nn.Module keeps them in: self.<name> would go through
        # nn.Module.__getattr__, a slow lookup on every call.
        params = self._parameters
        w_down, w_up_k, w_up_v = params["w_down"], params["w_up_k"], params["w_up_v"]
        if (_is_grad_enabled() and (x.requires_grad or w_down.requires_grad
                                    or w_up_k.requires_grad or w_up_v.requires_grad)) or (
                x.dtype == torch.bfloat16 and x.device.type == "cpu"
                and x.shape[0] * x.shape[1] > _CPU_BF16_OP_TOKENS):
            return reference_kv_proj(x, w_down, w_up_k, w_up_v, self.num_heads)
        return _op(x, w_down, w_up_k, w_up_v, self.num_heads)

    def extra_repr(self):
        return (f"model_dim={self.model_dim}, rank={self.rank}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim}")


# ---- The MLA KV path (latentkv/mla.h)

ROPE_STYLES = ("interleave", "gptj", "neox")


@torch.library.register_fake("latentkv::mla_kv")
def _mla_kv_fake(hidden, kv_a_weight, kv_a_norm_weight, kv_b_weight, num_heads, qk_nope_head_dim,
                 v_head_dim, cos, sin, positions, cos_sin_cache, rope_style, eps, kv_cache,
                 slot_mapping, q_a_weight, q_a_norm_weight):
    # The outputs' shapes only; the C++ kernel checks the call when it runs.
    b, s, _ = hidden.shape
    rope_dim = kv_a_weight.shape[0] - kv_a_norm_weight.shape[0]
    q_rank = 0 if q_a_weight is None else q_a_weight.shape[0]
    return (hidden.new_empty((b, s, num_heads, qk_nope_head_dim + rope_dim)),
            hidden.new_empty((b, s, num_heads, v_head_dim)), hidden.new_empty((b, s, q_rank)))


@torch.library.register_fake("latentkv::mla_kv_first_stage")
def _mla_kv_first_stage_fake(hidden, kv_a_weight, kv_a_norm_weight, kv_cache, cos, sin, positions,
                             cos_sin_cache, rope_style, eps, slot_mapping, q_a_weight,
                             q_a_norm_weight):
    b, s, _ = hidden.shape
    return hidden.new_empty((b, s, 0 if q_a_weight is None else q_a_weight.shape[0]))


@torch.library.register_fake("latentkv::mla_kv_second_stage")
def _mla_kv_second_stage_fake(kv_b_weight, num_heads, qk_nope_head_dim, v_head_dim, latent, k_pe,
                              kv_cache, slot_mapping):
    if latent is not None:
        torch._check(k_pe is not None, lambda: "latent is given without k_pe")
        b, s, _ = latent.shape
        rope_dim = k_pe.shape[-1]
    else:
        torch._check(kv_cache is not None and slot_mapping is not None, lambda: (
            "the second stage reads c and k_pe from latent + k_pe or from kv_cache + "
            "slot_mapping; got neither pair"))
        b, s = slot_mapping.shape
        rope_dim = kv_cache.shape[1] - kv_b_weight.shape[1]
    return (kv_b_weight.new_empty((b, s, num_heads, qk_nope_head_dim + rope_dim)),
            kv_b_weight.new_empty((b, s, num_heads, v_head_dim)))


_mla_op = torch.ops.latentkv.mla_kv.default
_mla_first_op = torch.ops.latentkv.mla_kv_first_stage.default
_mla_second_op = torch.ops.latentkv.mla_kv_second_stage.default


def _batch_rows(batch, *tables):
    # transformers' rotary embedding returns (1, S, dr) for position ids shared by the batch;
    # latentkv reads such a row for every batch row through a batch stride of 0 (no copy).
    return tuple(t.expand(batch, *t.shape[1:])
                 if t is not None and t.shape[0] == 1 and batch > 1 else t for t in tables)


def mla_kv(hidden, kv_a_weight, kv_a_norm_weight, kv_b_weight, num_heads, *, qk_nope_head_dim,
           v_head_dim, cos=None, sin=None, positions=None, cos_sin_cache=None,
           rope_style="interleave", eps=1e-6, kv_cache=None, slot_mapping=None, q_a_weight=None,
           q_a_norm_weight=None):
    """Both stages of the MLA KV path (torch.ops.latentkv.mla_kv): (k, v), or (k, v, q_a) when
    q_a_weight is given.

    hidden (B, S, D); kv_a_weight (R + dr, D) = kv_a_proj_with_mqa.weight; kv_a_norm_weight (R,);
    kv_b_weight (H * (dn + dv), R) = kv_b_proj.weight with H = num_heads (a tensor-parallel rank
    passes its heads' rows); q_a_weight (Rq, D) and q_a_norm_weight (Rq,) optional. RoPE from cos
    and sin (B, S, dr) as transformers' rotary embedding returns them, or from positions (B, S)
    int64 into cos_sin_cache (max_position, dr: dr/2 cosines then dr/2 sines per row, vLLM's);
    rope_style "interleave" (transformers' DeepSeek), "gptj" or "neox". kv_cache (num_slots,
    R + dr), when given, receives each token's [c | k_pe] row in place: row t = b * S + s, or
    slot_mapping[b, s] (int64; negative = padding, skipped). Returns k (B, S, H, dn + dr) and
    v (B, S, H, dv), packed; q_a (B, S, Rq) normalized. A position outside the table gives that
    token a NaN k_pe. No autograd: MLAKVProjection runs the reference math where gradients are
    needed. cos, sin and positions may have one batch row shared by all (transformers' form for
    shared position ids).
    """
    cos, sin, positions = _batch_rows(hidden.shape[0], cos, sin, positions)
    k, v, q_a = _mla_op(hidden, kv_a_weight, kv_a_norm_weight, kv_b_weight, num_heads,
                        qk_nope_head_dim, v_head_dim, cos, sin, positions, cos_sin_cache,
                        rope_style, eps, kv_cache, slot_mapping, q_a_weight, q_a_norm_weight)
    return (k, v) if q_a_weight is None else (k, v, q_a)


def mla_kv_first_stage(hidden, kv_a_weight, kv_a_norm_weight, kv_cache, *, cos=None, sin=None,
                       positions=None, cos_sin_cache=None, rope_style="interleave", eps=1e-6,
                       slot_mapping=None, q_a_weight=None, q_a_norm_weight=None):
    """Stage A alone (torch.ops.latentkv.mla_kv_first_stage): writes the [c | k_pe] rows into
    kv_cache (num_slots, R + dr) in place, densely or through slot_mapping, and returns q_a
    (B, S, Rq) when q_a_weight is given, else None. Arguments as in mla_kv."""
    cos, sin, positions = _batch_rows(hidden.shape[0], cos, sin, positions)
    q_a = _mla_first_op(hidden, kv_a_weight, kv_a_norm_weight, kv_cache, cos, sin, positions,
                        cos_sin_cache, rope_style, eps, slot_mapping, q_a_weight, q_a_norm_weight)
    return None if q_a_weight is None else q_a


def mla_kv_second_stage(kv_b_weight, num_heads, *, qk_nope_head_dim, v_head_dim, latent=None,
                        k_pe=None, kv_cache=None, slot_mapping=None):
    """Stage B alone (torch.ops.latentkv.mla_kv_second_stage): (k, v) from latent (B, S, R) and
    k_pe (B, S, dr, already rotated), or from kv_cache (num_slots, R + dr) gathered through
    slot_mapping (B, S); a token whose slot is negative or past the cache reads nothing and gets
    zero K and V rows."""
    return _mla_second_op(kv_b_weight, num_heads, qk_nope_head_dim, v_head_dim, latent, k_pe,
                          kv_cache, slot_mapping)


def cos_sin_from_freqs_cis(freqs_cis):
    """(cos, sin) (B, S, dr) float, transformers' cat(freqs, freqs) form, from DeepseekV2's
    complex rotary embedding (B, S, dr/2); pairs rotate as rope_style "gptj"."""
    cos, sin = freqs_cis.real, freqs_cis.imag
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def _rms_norm(x, weight, eps):
    # transformers' DeepSeek RMSNorm: statistics in float32 (or the input's wider type), the
    # normalized value rounded to the input's dtype, then scaled.
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rope(x, cos, sin, style):
    # x (B, S, dr); cos, sin (B, S, dr) per output column (transformers' form).
    half = x.shape[-1] // 2
    x1, x2 = x[..., 0::2], x[..., 1::2]
    if style == "interleave":
        return torch.cat([x1 * cos[..., :half] - x2 * sin[..., :half],
                          x2 * cos[..., half:] + x1 * sin[..., half:]], dim=-1)
    if style == "neox":
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
    if style == "gptj":
        c, s = cos[..., :half], sin[..., :half]
        return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)
    raise ValueError(f"rope_style = {style!r}: expected 'interleave', 'gptj' or 'neox'")


def _cos_sin_of_positions(positions, cos_sin_cache):
    # vLLM's table to transformers' form; a position outside the table gives NaN (as mla.h says).
    max_position, rope_dim = cos_sin_cache.shape
    inside = (positions >= 0) & (positions < max_position)
    rows = cos_sin_cache[positions.clamp(0, max_position - 1)]  # (B, S, dr)
    rows = torch.where(inside[..., None], rows, torch.full_like(rows, float("nan")))
    c, s = rows[..., :rope_dim // 2], rows[..., rope_dim // 2:]
    return torch.cat([c, c], dim=-1), torch.cat([s, s], dim=-1)


def _valid_slots(slot_mapping, num_slots):
    return (slot_mapping >= 0) & (slot_mapping < num_slots)


def reference_mla_kv_second_stage(kv_b_weight, num_heads, *, qk_nope_head_dim, v_head_dim,
                                  latent=None, k_pe=None, kv_cache=None, slot_mapping=None):
    """The unfused stage B (transformers' expand_kv), differentiable; arguments as in
    mla_kv_second_stage."""
    rank = kv_b_weight.shape[1]
    if latent is None:
        valid = _valid_slots(slot_mapping, kv_cache.shape[0])
        rows = kv_cache[slot_mapping.clamp(0, kv_cache.shape[0] - 1)]  # (B, S, R + dr)
        rows = torch.where(valid[..., None], rows, torch.zeros_like(rows))
        latent, k_pe = rows[..., :rank], rows[..., rank:]
    b, s, _ = latent.shape
    kv = (latent @ kv_b_weight.t()).view(b, s, num_heads, qk_nope_head_dim + v_head_dim)
    k = torch.cat([kv[..., :qk_nope_head_dim],
                   k_pe[:, :, None, :].expand(b, s, num_heads, k_pe.shape[-1])], dim=-1)
    return k, kv[..., qk_nope_head_dim:]


def reference_mla_kv(hidden, kv_a_weight, kv_a_norm_weight, kv_b_weight, num_heads, *,
                     qk_nope_head_dim, v_head_dim, cos=None, sin=None, positions=None,
                     cos_sin_cache=None, rope_style="interleave", eps=1e-6, kv_cache=None,
                     slot_mapping=None, q_a_weight=None, q_a_norm_weight=None):
    """The unfused MLA KV path as transformers computes it (linear, split, RMSNorm, RoPE,
    expand), differentiable, in the inputs' dtype (float64 inputs give a float64 reference).
    Same arguments and results as mla_kv, the cache written the same way (outside autograd)."""
    rank = kv_a_norm_weight.shape[0]
    ckv = hidden @ kv_a_weight.t()
    c = _rms_norm(ckv[..., :rank], kv_a_norm_weight, eps)
    if positions is not None:
        cos, sin = _cos_sin_of_positions(positions, cos_sin_cache)
    k_pe = _rope(ckv[..., rank:], cos.to(ckv.dtype), sin.to(ckv.dtype), rope_style)
    if kv_cache is not None:
        with torch.no_grad():
            rows = torch.cat([c, k_pe], dim=-1).reshape(-1, kv_cache.shape[1])  # (T, R + dr)
            if slot_mapping is None:
                kv_cache[:rows.shape[0]] = rows
            else:
                slots = slot_mapping.reshape(-1)
                valid = _valid_slots(slots, kv_cache.shape[0])
                kv_cache[slots[valid]] = rows[valid]
    k, v = reference_mla_kv_second_stage(kv_b_weight, num_heads, qk_nope_head_dim=qk_nope_head_dim,
                                         v_head_dim=v_head_dim, latent=c, k_pe=k_pe)
    if q_a_weight is None:
        return k, v
    return k, v, _rms_norm(hidden @ q_a_weight.t(), q_a_norm_weight, eps)


class MLARMSNorm(nn.Module):
    """transformers' DeepSeek RMSNorm (weight, variance_epsilon; float32 statistics)."""

    def __init__(self, hidden_size, eps=1e-6, *, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, x):
        return _rms_norm(x, self.weight, self.variance_epsilon)

    def extra_repr(self):
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


def _rope_style_of(config):
    # DeepseekV2 rotates pairs through complex numbers (GPT-J's layout); DeepseekV3 interleaves,
    # or rotates halves when rope_interleave is off.
    if getattr(config, "model_type", "") == "deepseek_v2":
        return "gptj"
    return "interleave" if getattr(config, "rope_interleave", True) else "neox"


class MLAKVProjection(nn.Module):
    """The KV side of a DeepSeek MLA attention layer, with transformers' submodule names:
    kv_a_proj_with_mqa (D -> R + dr), kv_a_layernorm (R), kv_b_proj (R -> H * (dn + dv)) and, with
    q_lora_rank, q_a_proj (D -> Rq) and q_a_layernorm (Rq), so the matching entries of a
    DeepseekV2Attention's / DeepseekV3Attention's state_dict load into it.

    forward(hidden, cos=None, sin=None, *, positions=None, cos_sin_cache=None, kv_cache=None,
    slot_mapping=None) -> (k, v), or (k, v, q_a) with q_a_proj; see mla_kv. The fused op runs when
    autograd records nothing, the reference math (transformers') otherwise, and on the CPU past
    the sizes where torch's own GEMMs are faster (bf16 on AVX512-BF16 past 32 tokens, float32 past
    128).
    """

    def __init__(self, hidden_size, kv_lora_rank, qk_rope_head_dim, num_heads, qk_nope_head_dim,
                 v_head_dim, *, q_lora_rank=None, rope_style="interleave", eps=1e-6, device=None,
                 dtype=None):
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("kv_lora_rank", kv_lora_rank),
                            ("qk_rope_head_dim", qk_rope_head_dim), ("num_heads", num_heads),
                            ("qk_nope_head_dim", qk_nope_head_dim), ("v_head_dim", v_head_dim)):
            _check_positive_int(name, value)
        if q_lora_rank is not None:
            _check_positive_int("q_lora_rank", q_lora_rank, " or None")
        if rope_style not in ROPE_STYLES:
            raise ValueError(f"rope_style = {rope_style!r}: expected one of {ROPE_STYLES}")
        factory = {"device": device, "dtype": dtype}
        self.num_heads = num_heads
        self.qk_nope_head_dim = qk_nope_head_dim
        self.v_head_dim = v_head_dim
        self.rope_style = rope_style
        self.eps = eps
        if q_lora_rank is not None:
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=False, **factory)
            self.q_a_layernorm = MLARMSNorm(q_lora_rank, eps, **factory)
        else:
            self.q_a_proj = self.q_a_layernorm = None
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim,
                                            bias=False, **factory)
        self.kv_a_layernorm = MLARMSNorm(kv_lora_rank, eps, **factory)
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim),
                                   bias=False, **factory)

    @classmethod
    def from_config(cls, config, *, num_heads=None, device=None, dtype=None):
        """From a transformers DeepseekV3Config / DeepseekV2Config (num_heads: a tensor-parallel
        rank's share, default all of config.num_attention_heads)."""
        if getattr(config, "attention_bias", False):
            raise ValueError("config.attention_bias = True: latentkv's MLA path has no biases")
        return cls(config.hidden_size, config.kv_lora_rank, config.qk_rope_head_dim,
                   num_heads or config.num_attention_heads, config.qk_nope_head_dim,
                   config.v_head_dim, q_lora_rank=config.q_lora_rank,
                   rope_style=_rope_style_of(config), device=device, dtype=dtype)

    def forward(self, hidden, cos=None, sin=None, *, positions=None, cos_sin_cache=None,
                kv_cache=None, slot_mapping=None):
        weights = [self.kv_a_proj_with_mqa.weight, self.kv_a_layernorm.weight,
                   self.kv_b_proj.weight]
        q_a = ((self.q_a_proj.weight, self.q_a_layernorm.weight) if self.q_a_proj is not None
               else (None, None))
        grads = _is_grad_enabled() and (hidden.requires_grad or any(
            w is not None and w.requires_grad for w in weights + list(q_a)))
        slower = _cpu_mla_prefers_torch(hidden, hidden.shape[0] * hidden.shape[1])
        run = reference_mla_kv if grads or slower else mla_kv
        return run(hidden, *weights, self.num_heads, qk_nope_head_dim=self.qk_nope_head_dim,
                   v_head_dim=self.v_head_dim, cos=cos, sin=sin, positions=positions,
                   cos_sin_cache=cos_sin_cache, rope_style=self.rope_style, eps=self.eps,
                   kv_cache=kv_cache, slot_mapping=slot_mapping, q_a_weight=q_a[0],
                   q_a_norm_weight=q_a[1])

    def extra_repr(self):
        return (f"num_heads={self.num_heads}, qk_nope_head_dim={self.qk_nope_head_dim}, "
                f"v_head_dim={self.v_head_dim}, rope_style={self.rope_style!r}, eps={self.eps}")
