"""Property test of the public numpy entry point latentkv.kv_proj (CPU backend) with hypothesis:
random shapes (zero sizes included), dtypes, strided and reversed views, inconsistent shapes and
wrong argument types. Every call either returns what the float64 reference gives (within 1e-5
relative for float32) or raises ValueError or TypeError; nothing else (no crash, no other
exception, no result from a call the reference cannot make sense of)."""

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
latentkv = pytest.importorskip("latentkv")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from reference import FLOAT32_TOLERANCE, reference, rel_error  # noqa: E402

# A dtype the CPU backend may refuse; a result in one of these is held to a looser tolerance.
_DTYPES = [np.float32, np.float64, np.float16, np.int32, np.complex64]
_TOLERANCE = {np.dtype(np.float32): FLOAT32_TOLERANCE, np.dtype(np.float64): FLOAT32_TOLERANCE,
              np.dtype(np.float16): 1e-2}


def _layout(draw, rng, shape, dtype, odd):
    """An array of `shape`: contiguous or a padded view into a larger array; with `odd` also with
    a reversed outer axis, a non-contiguous last axis, or Fortran-ordered."""
    kinds = ["contiguous", "padded"] + (["reversed", "inner", "fortran"] if odd else [])
    kind = draw(st.sampled_from(kinds))
    values = lambda s: rng.uniform(-1, 1, s).astype(dtype) if np.dtype(dtype).kind != "c" else (
        rng.uniform(-1, 1, s) + 0j).astype(dtype)
    if kind == "padded":
        big = values(tuple(n + 3 for n in shape))
        return big[tuple(slice(1, 1 + n) for n in shape)]
    if kind == "reversed" and len(shape) > 1:
        return values(shape)[::-1]
    if kind == "inner":
        return values(shape[:-1] + (2 * shape[-1],))[..., ::2]
    if kind == "fortran":
        return np.asfortranarray(values(shape))
    return values(shape)


def _rarely(draw, one_in):
    """True about once in `one_in` draws (st.integers favours its bounds, so not integers == 0)."""
    return draw(st.sampled_from([True] + [False] * (one_in - 1)))


@st.composite
def calls(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    small = st.integers(0, 5) if _rarely(draw, 4) else st.integers(1, 5)
    b, s = draw(small), draw(small)
    d, r = draw(st.integers(0, 40)), draw(st.integers(0, 24))
    h = 0 if _rarely(draw, 10) else draw(st.integers(1, 4))
    dh = 0 if _rarely(draw, 10) else draw(st.integers(1, 9))
    n = h * dh
    # Most calls well-formed (so results get checked), the rest with one or more things wrong.
    odd = _rarely(draw, 4)
    dtype = draw(st.sampled_from(_DTYPES)) if odd else np.float32
    # Shapes the call may get wrong: a wrong leading dim, an N that does not split into heads.
    shapes = {"hidden": (b, s, d), "w_down": (d, r), "w_up_k": (r, n), "w_up_v": (r, n)}
    if _rarely(draw, 10):
        name = draw(st.sampled_from(sorted(shapes)))
        shapes[name] = tuple(x + draw(st.integers(1, 2)) for x in shapes[name])
    if _rarely(draw, 10):
        shapes["hidden"] = shapes["hidden"][1:]  # wrong rank
    arrays = {k: _layout(draw, rng, v, dtype, odd and draw(st.booleans()))
              for k, v in shapes.items()}
    num_heads = h
    if _rarely(draw, 10):
        num_heads = draw(st.sampled_from([float(h), str(h), None, -1, h + 1, True]))
    if _rarely(draw, 15):
        arrays["hidden"] = arrays["hidden"].tolist()  # not an array
    latent_out = None
    if draw(st.booleans()):
        latent_out = np.full((b, s, r), np.nan, np.float32)
        if _rarely(draw, 6):
            latent_out = latent_out[..., ::-1] if r > 1 else latent_out.astype(np.float64)
    return arrays, num_heads, latent_out


def _expected(arrays, num_heads, latent_out):
    """(out, latent) of the float64 reference, or None where the call makes no sense."""
    if not all(isinstance(a, np.ndarray) for a in arrays.values()):
        return None
    # bool is an int to Python (operator.index(True) == 1): accepted as a count, as numpy does.
    if not isinstance(num_heads, int) or num_heads < 0:
        return None
    num_heads = int(num_heads)
    if any(a.dtype.kind != "f" for a in arrays.values()):
        return None  # integer and complex inputs must be refused
    hidden, w_down, w_up_k, w_up_v = (arrays[k] for k in ("hidden", "w_down", "w_up_k", "w_up_v"))
    if hidden.ndim != 3 or w_down.ndim != 2 or w_up_k.ndim != 2 or w_up_v.shape != w_up_k.shape:
        return None
    if hidden.shape[2] != w_down.shape[0] or w_down.shape[1] != w_up_k.shape[0]:
        return None
    n = w_up_k.shape[1]
    if num_heads == 0 and n != 0 or num_heads > 0 and n % num_heads != 0:
        return None
    if latent_out is not None and latent_out.shape != hidden.shape[:2] + (w_down.shape[1],):
        return None
    return reference(hidden, w_down, w_up_k, w_up_v, num_heads)


# database=None: no .hypothesis directory in the checkout; failures print their example.
@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(calls())
def test_matches_reference_or_refuses(call):
    arrays, num_heads, latent_out = call
    expected = _expected(arrays, num_heads, latent_out)
    try:
        out = latentkv.kv_proj(arrays["hidden"], arrays["w_down"], arrays["w_up_k"],
                               arrays["w_up_v"], num_heads, latent_out=latent_out)
    except (ValueError, TypeError):
        hypothesis.event("refused")
        return
    hypothesis.event("computed")
    assert expected is not None, "kv_proj returned a result for a call that makes no sense"
    ref, ref_latent = expected
    assert isinstance(out, np.ndarray) and out.shape == ref.shape
    tolerance = _TOLERANCE.get(np.dtype(out.dtype))
    assert tolerance is not None, f"result dtype {out.dtype}"
    assert rel_error(out, ref) <= tolerance
    if latent_out is not None:
        assert rel_error(latent_out, ref_latent) <= tolerance
