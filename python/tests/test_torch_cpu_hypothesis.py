"""Property test of latentkv.kv_proj on CPU bf16 / fp16 torch tensors with hypothesis: random
shapes around the CPU backend's tile edges (6-row register tiles, 16- and 64-column vectors, odd
and even inner dimensions, the few-token column split), hidden packed or a padded view, the latent
output on or off. Every result is within 2x the error of torch's own unfused matmuls in the same
dtype against the float64 reference (design.md's budget), and a poisoned latent_out is fully
written. On a CPU with AVX512-BF16 the bf16 calls take its dot-product kernels, elsewhere the
widening ones (the C++ suite runs both on such a CPU). Skipped without torch or hypothesis."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import latentkv  # noqa: E402
from reference import random_inputs, rel_error  # noqa: E402
from reference_torch import unfused_budgets  # noqa: E402

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@st.composite
def calls(draw):
    b = draw(st.integers(1, 3))
    s = draw(st.integers(1, 9))
    d = draw(st.integers(1, 300))
    r = draw(st.integers(1, 80))
    h = draw(st.integers(1, 4))
    dh = draw(st.integers(1, 40))
    dtype = draw(st.sampled_from(sorted(_DTYPES)))
    padded = draw(st.booleans())
    with_latent = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return (b, s, d, r, h, dh), dtype, padded, with_latent, seed


# database=None: no .hypothesis directory in the checkout; failures print their example.
@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(calls())
def test_low_precision_within_twice_the_unfused_error(call):
    (b, s, d, r, h, dh), dtype, padded, with_latent, seed = call
    t = _DTYPES[dtype]
    args = [torch.from_numpy(a).to(t)
            for a in random_inputs(np.random.default_rng(seed), b, s, d, r, h, dh)]
    if padded:  # hidden as a view into a wider buffer: row stride d + 5
        wide = torch.full((b, s, d + 5), float("nan"), dtype=t)
        wide[..., 2:2 + d] = args[0]
        args[0] = wide[..., 2:2 + d]
    ref_out, ref_latent, budget, latent_budget = unfused_budgets(args, h)
    latent = torch.full((b, s, r), float("nan"), dtype=t) if with_latent else None
    out = latentkv.kv_proj(*args, h, latent_out=latent)
    assert out.dtype == t and out.shape == (2, b, s, h, dh)
    assert rel_error(out.float().numpy(), ref_out) <= budget
    if with_latent:
        assert rel_error(latent.float().numpy(), ref_latent) <= latent_budget
