"""Shared by the Python tests and python/bench: the float64 numpy reference, the error metric, the
random inputs and the named cases python/bench runs. No torch here, so the numpy tests run where
torch is absent. The tests' shapes come from the one case list (cases.py)."""

import numpy as np

# (B, S, D, R, H, Dh): the founding case of the project ("seed") and the latentkv-bench presets,
# for python/bench, which runs without a build of the C++ tests; test_cases.py checks them against
# the one case list.
CASES = {
    "founding": (4, 96, 256, 48, 4, 32),
    "deepseek-v2-lite": (1, 64, 2048, 512, 16, 128),
    "deepseek-v3": (1, 128, 7168, 512, 128, 128),
}

# fp32 results must stay within this relative Frobenius error of the float64 reference.
FLOAT32_TOLERANCE = 1e-5


def reference(hidden, w_down, w_up_k, w_up_v, num_heads):
    """(out (2, B, S, H, Dh), latent (B, S, R)) in float64, from arrays of any float dtype."""
    h, wd, wk, wv = (np.asarray(a, dtype=np.float64) for a in (hidden, w_down, w_up_k, w_up_v))
    b, s, _ = h.shape
    latent = h @ wd
    n = wk.shape[1]
    dh = n // num_heads if num_heads else 0
    k = (latent @ wk).reshape(b, s, num_heads, dh)
    v = (latent @ wv).reshape(b, s, num_heads, dh)
    return np.stack([k, v]), latent


def rel_error(got, ref):
    """||got - ref||_F / ||ref||_F, +inf when got has a NaN or Inf (an unwritten poisoned element)."""
    got = np.asarray(got, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    norm = np.linalg.norm(ref)
    diff = np.linalg.norm(got - ref)
    return diff / norm if norm > 0 else diff


def random_inputs(rng, b, s, d, r, h, dh, dtype=np.float32):
    """hidden ~ U(-1, 1), weights ~ U(-1, 1) / sqrt(fan_in): outputs are O(1) at every size."""
    n = h * dh

    def uniform(shape, scale):
        return (rng.uniform(-1.0, 1.0, shape) * scale).astype(dtype)

    return (
        uniform((b, s, d), 1.0),
        uniform((d, r), 1.0 / max(d, 1) ** 0.5),
        uniform((r, n), 1.0 / max(r, 1) ** 0.5),
        uniform((r, n), 1.0 / max(r, 1) ** 0.5),
    )

