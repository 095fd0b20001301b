"""latentkv against transformers' own DeepSeek code (float32, CPU): MLAKVProjection with the weights
of a DeepseekV3Attention / DeepseekV2Attention gives the K and V their forward computes (read from
their expand_kv inputs through a forward hook on kv_b_proj and the cache), and patch_model leaves a
small random DeepseekV3 / DeepseekV2 model's logits and greedy generation unchanged."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import latentkv.hf as hf  # noqa: E402
import latentkv.torch as lt  # noqa: E402
from mla_common import count_calls, rel_error, tiny_config  # noqa: E402

# Logits go through two layers of attention, MoE and the LM head in float32: both sides round
# differently at each step, so they agree to a few float32 ulps of the logits' scale, not 1e-5 of
# each K entry.
LOGITS_TOLERANCE = 2e-5
KV_TOLERANCE = 1e-5


def hf_kv(attn, hidden, position_embeddings):
    """K and V (B, S, H, .) as transformers' attention computes them: its forward runs with an
    eager attention function that records key and value states."""
    mod = __import__(type(attn).__module__, fromlist=["x"])
    seen = {}

    def record(module, query, key, value, attention_mask, **kwargs):
        seen["k"], seen["v"] = key.transpose(1, 2), value.transpose(1, 2)
        return mod.eager_attention_forward(module, query, key, value, attention_mask, **kwargs)

    interface = mod.ALL_ATTENTION_FUNCTIONS
    interface["latentkv_record"] = record
    attn.config._attn_implementation = "latentkv_record"
    try:
        if type(attn).__name__.startswith("DeepseekV2"):
            attn(hidden, attention_mask=None, position_embeddings=position_embeddings)
        else:
            attn(hidden, position_embeddings, None)
    finally:
        attn.config._attn_implementation = "eager"
        del interface["latentkv_record"]
    return seen["k"], seen["v"]


def rotary(cfg, version, b, s):
    mod = transformers.models.deepseek_v3.modeling_deepseek_v3 if version == 3 else \
        transformers.models.deepseek_v2.modeling_deepseek_v2
    emb = (mod.DeepseekV3RotaryEmbedding if version == 3 else mod.DeepseekV2RotaryEmbedding)(cfg)
    x = torch.zeros(b, s, cfg.hidden_size)
    positions = torch.arange(s).expand(b, s) + 3
    return emb(x, positions)


CASES = [(3, 24, True), (3, None, True), (3, 24, False), (2, None, True), (2, 24, True)]


@pytest.mark.parametrize("version,q_lora_rank,interleave", CASES)
def test_kv_matches_transformers_attention(version, q_lora_rank, interleave):
    torch.manual_seed(version * 10 + (q_lora_rank or 0))
    cfg = tiny_config(version, q_lora_rank=q_lora_rank, rope_interleave=interleave)
    cls = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention if version == 3 \
        else transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2Attention
    attn = cls(cfg, layer_idx=0).eval()
    for p in attn.parameters():  # not the ones-initialized norms
        torch.nn.init.normal_(p, 1.0 if p.dim() == 1 else 0.0, 0.3 if p.dim() == 1 else 0.1)
    module = lt.MLAKVProjection.from_config(cfg)
    module.load_state_dict(attn.state_dict(), strict=False)
    expected_style = "gptj" if version == 2 else ("interleave" if interleave else "neox")
    assert module.rope_style == expected_style
    b, s = 2, 7
    hidden = torch.randn(b, s, cfg.hidden_size)
    pe = rotary(cfg, version, b, s)
    with torch.no_grad():
        ref_k, ref_v = hf_kv(attn, hidden, pe)
        cos, sin = lt.cos_sin_from_freqs_cis(pe) if version == 2 else pe
        out = module(hidden, cos, sin)
    # Outside no_grad, with parameters that require grad, the module runs the reference math:
    # in float64 here.
    double = lt.MLAKVProjection.from_config(cfg, dtype=torch.float64)
    double.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
    ref64 = double(hidden.double(), cos.double(), sin.double())
    assert len(out) == (3 if q_lora_rank else 2)
    assert rel_error(out[0], ref_k) <= KV_TOLERANCE and rel_error(out[1], ref_v) <= KV_TOLERANCE
    assert rel_error(out[0], ref64[0]) <= KV_TOLERANCE
    if q_lora_rank:
        with torch.no_grad():
            ref_q_a = attn.q_a_layernorm(attn.q_a_proj(hidden))
        assert rel_error(out[2], ref_q_a) <= KV_TOLERANCE


@pytest.mark.parametrize("version,q_lora_rank", [(3, 24), (3, None), (2, None), (2, 24)])
def test_patch_model_keeps_logits_and_generation(version, q_lora_rank):
    torch.manual_seed(version)
    cfg = tiny_config(version, q_lora_rank=q_lora_rank)
    cls = transformers.DeepseekV3ForCausalLM if version == 3 else transformers.DeepseekV2ForCausalLM
    model = cls(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ref = model(ids).logits
        ref_gen = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
        assert hf.patch_model(model) == cfg.num_hidden_layers
        assert hf.patch_model(model) == cfg.num_hidden_layers  # twice: a no-op
        got = model(ids).logits  # the cache path: stage A, cache.update, stage B
        got_uncached = model(ids, use_cache=False).logits  # both stages in one call
        got_gen = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    assert rel_error(got, ref) <= LOGITS_TOLERANCE
    assert rel_error(got_uncached, ref) <= LOGITS_TOLERANCE
    assert torch.equal(got_gen, ref_gen)
    # Gradients: transformers' forward runs (the patched one has no backward).
    loss = model(ids).logits.sum()
    loss.backward()
    assert model.model.layers[0].self_attn.kv_b_proj.weight.grad is not None
    assert hf.unpatch_model(model) == cfg.num_hidden_layers
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("use_cache,ops", [(False, ["mla_kv"]),
                                            (True, ["mla_kv_first_stage", "mla_kv_second_stage"])])
def test_patched_forward_runs_latentkv(use_cache, ops, monkeypatch):
    cfg = tiny_config(3)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    hf.patch_model(model)
    calls = count_calls(monkeypatch, hf, ("mla_kv", "mla_kv_first_stage", "mla_kv_second_stage"))
    with torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (1, 4)), use_cache=use_cache)
    assert calls == ops * cfg.num_hidden_layers


@pytest.mark.parametrize("version,dtype", [(3, torch.bfloat16), (2, torch.bfloat16),
                                           (3, torch.float16)])
def test_patch_model_half_precision_on_cpu(version, dtype, monkeypatch):
    # A bf16 / fp16 model on the CPU runs its KV side through latentkv (cpu-mla in that dtype),
    # and its logits are as close to the float32 model's as transformers' own half-precision
    # forward is (within 2x of that forward's error, both against float32).
    torch.manual_seed(20 + version)
    cfg = tiny_config(version)
    cls = transformers.DeepseekV3ForCausalLM if version == 3 else transformers.DeepseekV2ForCausalLM
    model32 = cls(cfg).eval()
    model = cls(cfg).eval()
    model.load_state_dict(model32.state_dict())
    model = model.to(dtype)
    ids = torch.randint(0, cfg.vocab_size, (2, 8))  # 16 rows: the op's side of the CPU rule
    calls = count_calls(monkeypatch, hf, ("mla_kv", "mla_kv_first_stage"))
    with torch.no_grad():
        exact = model32(ids).logits.double()
        unfused = model(ids).logits.double()
        hf.patch_model(model)
        got = model(ids).logits.double()
        got_uncached = model(ids, use_cache=False).logits.double()
    # the cached forward through the stages, the uncached one through mla_kv, every layer
    assert calls == (["mla_kv_first_stage"] * cfg.num_hidden_layers
                     + ["mla_kv"] * cfg.num_hidden_layers)
    budget = 2 * rel_error(unfused, exact)
    assert rel_error(got, exact) <= budget
    assert rel_error(got_uncached, exact) <= budget


def test_cpu_steps_past_the_rule_run_torchs_math(monkeypatch):
    # On the CPU, float32 steps of more than 128 tokens run transformers' own forward (torch's
    # GEMMs are faster there); the decode step after such a prompt runs stage A through latentkv
    # and stage B, over the 130 cached rows, through torch's math. Logits as unpatched.
    torch.manual_seed(7)
    cfg = tiny_config(3)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 129))
    greedy = {"attention_mask": torch.ones_like(prompt), "max_new_tokens": 2, "do_sample": False,
              "output_logits": True, "return_dict_in_generate": True}
    with torch.no_grad():
        ref = model(prompt).logits
        ref_gen = model.generate(prompt, **greedy)
        hf.patch_model(model)
        calls = count_calls(monkeypatch, hf, ("mla_kv", "mla_kv_first_stage", "mla_kv_second_stage",
                                              "reference_mla_kv_second_stage"))
        got = model(prompt).logits
        assert calls == []
        got_gen = model.generate(prompt, **greedy)  # the prompt's step, then one decode step
    assert calls == ["mla_kv_first_stage", "reference_mla_kv_second_stage"] * cfg.num_hidden_layers
    assert rel_error(got, ref) <= LOGITS_TOLERANCE
    assert torch.equal(got_gen.sequences, ref_gen.sequences)
    assert rel_error(got_gen.logits[1], ref_gen.logits[1]) <= LOGITS_TOLERANCE
