"""The MLA KV ops on the CPU backend (float32) against the float64 reference (reference_mla_kv,
transformers' math): both stages and each alone, every RoPE style and form, dense and paged cache
with padding slots, q_a, edge shapes (T = 1, odd H and R, dr != 64, dn != dv, Rq = 0 and > 0),
strided inputs and cache, NaN-poisoned outputs, positions and slots past the tables (mla.h: NaN
k_pe; skipped rows; zero K/V rows); the fake kernels (opcheck, torch.compile fullgraph), refusals,
MLAKVProjection (HF state_dict, autograd fallback)."""

import pytest

torch = pytest.importorskip("torch")

import latentkv.torch as lt  # noqa: E402
from mla_common import (FLOAT32_TOLERANCE, as_double, count_calls, layer, rel_error,  # noqa: E402
                        split_call)

# (B, S, D, R, dr, H, dn, dv, Rq)
SHAPES = [
    (1, 1, 16, 8, 4, 1, 4, 4, 0),        # T = 1
    (2, 3, 40, 21, 6, 3, 10, 6, 0),      # odd R and H, dr != 64, dn != dv
    (1, 7, 33, 16, 8, 5, 8, 12, 12),     # Rq > 0, odd D
    (3, 5, 64, 32, 64, 2, 16, 16, 20),   # dr = 64
    (2, 40, 24, 12, 2, 4, 3, 5, 7),      # tiles of many tokens, the smallest dr
]


def nan_like(shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


def check_all(got, ref):
    for g, r in zip(got, ref):
        assert rel_error(g, r) <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("style", lt.ROPE_STYLES)
def test_both_stages_against_float64(shape, style):
    b, s, d, r, dr, h, dn, dv, rq = shape
    args = layer(*shape, seed=hash((shape, style)) % 1000)
    pos, kw = split_call(args)
    cache = nan_like((b * s + 2, r + dr))
    got = lt.mla_kv(*pos, rope_style=style, kv_cache=cache, **kw)
    ref_cache = nan_like((b * s + 2, r + dr), torch.float64)
    dpos, dkw = split_call(as_double(args))
    ref = lt.reference_mla_kv(*dpos, rope_style=style, kv_cache=ref_cache, **dkw)
    assert len(got) == (3 if rq else 2)
    assert got[0].shape == (b, s, h, dn + dr) and got[1].shape == (b, s, h, dv)
    check_all(got, ref)
    assert rel_error(cache, ref_cache) <= FLOAT32_TOLERANCE  # the 2 spare rows stay NaN


@pytest.mark.parametrize("style", lt.ROPE_STYLES)
def test_positions_form_paged_cache_and_stage_b_from_it(style):
    b, s, d, r, dr, h, dn, dv, rq = shape = (2, 6, 30, 14, 8, 3, 6, 4, 9)
    args = layer(*shape, seed=3)
    del args["cos"], args["sin"]
    max_pos = 10
    angles = torch.rand(max_pos, dr // 2, dtype=torch.float64) * 6
    table = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.randint(0, max_pos, (b, s))
    positions[0, 1], positions[1, 2] = max_pos, -1  # past the table: NaN k_pe, nothing read
    num_slots = 20
    slots = torch.randperm(num_slots)[: b * s].view(b, s)
    slots[0, 3], slots[1, 0], slots[1, 4] = -1, -5, num_slots + 2  # padding, and past the cache
    pos, kw = split_call(args)
    cache = nan_like((num_slots, r + dr))
    got = lt.mla_kv(*pos, positions=positions, cos_sin_cache=table.float(), rope_style=style,
                    kv_cache=cache, slot_mapping=slots, **kw)
    ref_cache = nan_like((num_slots, r + dr), torch.float64)
    dpos, dkw = split_call(as_double(args))
    ref = lt.reference_mla_kv(*dpos, positions=positions, cos_sin_cache=table, rope_style=style,
                              kv_cache=ref_cache, slot_mapping=slots, **dkw)
    check_all(got, ref)
    assert got[0][0, 1, :, dn:].isnan().all() and got[0][1, 2, :, dn:].isnan().all()
    assert not got[0][0, 1, :, :dn].isnan().any()
    assert rel_error(cache, ref_cache) <= FLOAT32_TOLERANCE  # untouched rows still NaN

    # Stage B alone from the paged cache: skipped slots give zero K and V rows.
    k, v = lt.mla_kv_second_stage(args["kv_b_weight"], h, qk_nope_head_dim=dn, v_head_dim=dv,
                                  kv_cache=cache, slot_mapping=slots)
    rk, rv = lt.reference_mla_kv_second_stage(args["kv_b_weight"].double(), h,
                                              qk_nope_head_dim=dn, v_head_dim=dv,
                                              kv_cache=ref_cache, slot_mapping=slots)
    check_all((k, v), (rk, rv))
    for bi, si in ((0, 3), (1, 0), (1, 4)):
        assert (k[bi, si] == 0).all() and (v[bi, si] == 0).all()


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_stages_alone_equal_both(shape):
    b, s, d, r, dr, h, dn, dv, rq = shape
    args = layer(*shape, seed=7)
    pos, kw = split_call(args)
    both = lt.mla_kv(*pos, **kw)
    rows = nan_like((b * s, r + dr))
    first_kw = {k: v for k, v in kw.items() if k not in ("qk_nope_head_dim", "v_head_dim")}
    q_a = lt.mla_kv_first_stage(args["hidden"], args["kv_a_weight"], args["kv_a_norm_weight"],
                                rows, **first_kw)
    assert (q_a is None) == (rq == 0)
    rows = rows.view(b, s, r + dr)
    k, v = lt.mla_kv_second_stage(args["kv_b_weight"], h, qk_nope_head_dim=dn, v_head_dim=dv,
                                  latent=rows[..., :r], k_pe=rows[..., r:])  # strided views
    assert torch.equal(k, both[0]) and torch.equal(v, both[1])
    if rq:
        assert torch.equal(q_a, both[2])


def test_strided_inputs_and_cache():
    b, s, d, r, dr, h, dn, dv, rq = shape = (2, 5, 20, 10, 4, 2, 6, 3, 6)
    args = layer(*shape, seed=11)
    padded = {}
    for name in ("hidden", "cos", "sin"):
        t = args[name]
        big = torch.randn(t.shape[0], t.shape[1] + 2, t.shape[2] + 3)
        big[:, : t.shape[1], : t.shape[2]] = t
        padded[name] = big[:, : t.shape[1], : t.shape[2]]
    for name in ("kv_a_weight", "kv_b_weight", "q_a_weight"):
        t = args[name]
        big = torch.randn(t.shape[0], t.shape[1] + 5)
        big[:, : t.shape[1]] = t
        padded[name] = big[:, : t.shape[1]]
    # cos and sin views of one buffer share a layout, as MlaArgs needs.
    table = torch.randn(b, s + 1, 2 * dr + 1)
    table[:, :s, :dr], table[:, :s, dr:2 * dr] = args["cos"], args["sin"]
    padded["cos"], padded["sin"] = table[:, :s, :dr], table[:, :s, dr:2 * dr]
    cache_store = nan_like((b * s, r + dr + 7))
    cache = cache_store[:, : r + dr]
    pos, kw = split_call({**args, **padded})
    assert not pos[0].is_contiguous()
    got = lt.mla_kv(*pos, kv_cache=cache, **kw)
    ref_cache = nan_like((b * s, r + dr), torch.float64)
    dpos, dkw = split_call(as_double(args))
    ref = lt.reference_mla_kv(*dpos, kv_cache=ref_cache, **dkw)
    check_all(got, ref)
    assert rel_error(cache, ref_cache) <= FLOAT32_TOLERANCE
    assert cache_store[:, r + dr:].isnan().all()  # the padding columns are not written


def test_shared_batch_row_of_cos_sin():
    shape = (3, 4, 16, 8, 4, 2, 4, 4, 0)
    args = layer(*shape, seed=12)
    args["cos"], args["sin"] = args["cos"][:1], args["sin"][:1]
    pos, kw = split_call(args)
    got = lt.mla_kv(*pos, **kw)
    full = {**args, "cos": args["cos"].expand(3, -1, -1), "sin": args["sin"].expand(3, -1, -1)}
    dpos, dkw = split_call(as_double(full))
    check_all(got, lt.reference_mla_kv(*dpos, **dkw))


def test_zero_tokens():
    args = layer(0, 4, 16, 8, 4, 2, 4, 4, 0)
    pos, kw = split_call(args)
    k, v = lt.mla_kv(*pos, **kw)
    assert k.shape == (0, 4, 2, 8) and v.shape == (0, 4, 2, 4)


def test_refusals_name_the_argument():
    args = layer(1, 3, 16, 8, 4, 2, 4, 4, 5)
    pos, kw = split_call(args)
    with pytest.raises(ValueError, match="rope_style = 'rotate'"):
        lt.mla_kv(*pos, **{**kw, "rope_style": "rotate"})
    with pytest.raises(TypeError, match="kv_b_weight has dtype float16 but hidden has float32"):
        lt.mla_kv(*pos[:3], pos[3].half(), pos[4], **kw)
    with pytest.raises(ValueError, match=r"kv_b_weight has shape \(16, 8\), expected"):
        lt.mla_kv(*pos[:4], 1, **kw)
    with pytest.raises(ValueError, match="q_a_weight is given without q_a_norm_weight"):
        lt.mla_kv(*pos, **{**kw, "q_a_norm_weight": None})
    with pytest.raises(TypeError, match="slot_mapping has dtype int32; expected int64"):
        lt.mla_kv(*pos, kv_cache=torch.zeros(8, 12), slot_mapping=torch.zeros(1, 3,
                                                                                 dtype=torch.int32),
                  **kw)
    with pytest.raises(ValueError, match=r"kv_cache has shape \(8, 11\)"):
        lt.mla_kv(*pos, kv_cache=torch.zeros(8, 11), **kw)
    with pytest.raises(ValueError, match="num_slots = 2 is less than the 3 tokens"):
        lt.mla_kv(*pos, kv_cache=torch.zeros(2, 12), **kw)
    with pytest.raises(ValueError, match="cos is given without sin"):
        lt.mla_kv(*pos, **{**kw, "sin": None})
    with pytest.raises(ValueError, match="both set; give one RoPE form"):
        lt.mla_kv(*pos, positions=torch.zeros(1, 3, dtype=torch.long),
                  cos_sin_cache=torch.zeros(4, 4), **kw)
    with pytest.raises(ValueError, match="got neither pair"):
        lt.mla_kv_second_stage(pos[3], 2, qk_nope_head_dim=4, v_head_dim=4)


def test_refused_call_writes_nothing():
    args = layer(1, 3, 16, 8, 4, 2, 4, 4, 0)
    pos, kw = split_call(args)
    cache = nan_like((3, 12))
    with pytest.raises(ValueError):
        lt.mla_kv(*pos, kv_cache=cache, slot_mapping=torch.zeros(1, 2, dtype=torch.long), **kw)
    assert cache.isnan().all()


def opcheck_args(q_a):
    args = layer(2, 3, 16, 8, 4, 3, 4, 2, 6 if q_a else 0, seed=5)
    pos, kw = split_call(args)
    cache = torch.zeros(6, 12)
    op_args = (*pos, kw["qk_nope_head_dim"], kw["v_head_dim"], kw["cos"], kw["sin"], None, None,
               "interleave", 1e-6, cache, None, kw.get("q_a_weight"), kw.get("q_a_norm_weight"))
    return args, op_args


@pytest.mark.parametrize("q_a", [False, True])
def test_opcheck(q_a):
    args, op_args = opcheck_args(q_a)
    torch.library.opcheck(torch.ops.latentkv.mla_kv.default, op_args)
    cache = op_args[13]
    first = (op_args[0], op_args[1], op_args[2], cache, *op_args[7:13], None, *op_args[15:])
    torch.library.opcheck(torch.ops.latentkv.mla_kv_first_stage.default, first)
    rows = cache.view(2, 3, 12)
    second = (args["kv_b_weight"], 3, 4, 2, rows[..., :8].contiguous(), rows[..., 8:].contiguous(),
              None, None)
    torch.library.opcheck(torch.ops.latentkv.mla_kv_second_stage.default, second)
    slots = torch.tensor([[0, 2, -1], [5, 4, 3]])
    torch.library.opcheck(torch.ops.latentkv.mla_kv_second_stage.default,
                          (args["kv_b_weight"], 3, 4, 2, None, None, cache, slots))


def test_torch_compile_fullgraph():
    args = layer(2, 5, 24, 12, 4, 3, 6, 4, 8, seed=9)
    pos, kw = split_call(args)

    def step(hidden, cache):
        k, v, q_a = lt.mla_kv(hidden, *pos[1:], kv_cache=cache, **kw)
        return k.sum(-1), v * 2, q_a

    cache, ref_cache = torch.zeros(10, 16), torch.zeros(10, 16)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(pos[0], cache)
    ref = step(pos[0], ref_cache)
    for g, r in zip(got, ref):
        assert torch.equal(g, r)
    assert torch.equal(cache, ref_cache)


def test_cpu_rule_hands_long_steps_to_torch(monkeypatch):
    # The rule's bounds (latentkv.torch._CPU_MLA_OP_ROWS), then MLAKVProjection on both sides of
    # float32's: the op up to 128 tokens, transformers' math past them.
    rule = lt._cpu_mla_prefers_torch
    f32 = torch.empty(0)
    assert not rule(f32, 128) and rule(f32, 129)
    assert not rule(torch.empty(0, dtype=torch.float16), 1 << 20)
    bf16 = torch.empty(0, dtype=torch.bfloat16)
    if lt._C.cpu_bf16_isa() == "avx512-bf16":
        assert not rule(bf16, 32) and rule(bf16, 33)
    else:
        assert not rule(bf16, 1 << 20)
    assert not rule(torch.empty(0, device="meta"), 1 << 20)
    module = lt.MLAKVProjection(16, 8, 4, 2, 4, 4)
    calls = count_calls(monkeypatch, lt, ("mla_kv", "reference_mla_kv"))
    with torch.no_grad():
        for tokens in (128, 129):
            hidden = torch.randn(1, tokens, 16)
            angles = torch.rand(1, tokens, 2) * 6
            module(hidden, torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1))
    assert calls == ["mla_kv", "reference_mla_kv"]


def test_module_loads_transformers_weights_and_falls_back_for_autograd():
    transformers = pytest.importorskip("transformers")
    from mla_common import tiny_config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    cfg = tiny_config(3)
    attn = DeepseekV3Attention(cfg, layer_idx=0)
    module = lt.MLAKVProjection.from_config(cfg)
    missing, unexpected = module.load_state_dict(attn.state_dict(), strict=False)
    assert not missing and sorted(unexpected) == ["o_proj.weight", "q_b_proj.weight"]
    hidden = torch.randn(2, 4, cfg.hidden_size)
    angles = torch.rand(2, 4, cfg.qk_rope_head_dim // 2) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    with torch.no_grad():
        fused = module(hidden, cos, sin)
    unfused = module(hidden, cos, sin)  # parameters require grad: the reference math
    assert unfused[0].requires_grad
    check_all(fused, unfused)
    unfused[0].sum().backward()
    assert module.kv_a_proj_with_mqa.weight.grad is not None
    with pytest.raises(ValueError, match="num_heads = 0 must be positive"):
        lt.MLAKVProjection(8, 4, 2, 0, 2, 2)
    with pytest.raises(ValueError, match="num_heads = True must be an integer"):
        lt.MLAKVProjection(8, 4, 2, True, 2, 2)
    with pytest.raises(ValueError, match="q_lora_rank = 0 must be positive or None"):
        lt.MLAKVProjection(8, 4, 2, 2, 2, 2, q_lora_rank=0)
