"""latentkv: the fused low-rank KV projection of Multi-head Latent Attention.

    latent = hidden @ w_down;  k, v = latent @ w_up_k, latent @ w_up_v
    kv_proj(...) = stack([k.view(B, S, H, Dh), v.view(B, S, H, Dh)])  -> (2, B, S, H, Dh)

kv_proj takes numpy arrays (the CPU backend, through the compiled binding latentkv._C) or torch
tensors (CPU or CUDA, through the torch op torch.ops.latentkv.kv_proj, which latentkv.torch
registers when it is first imported) and returns the result in the same array type and on the
same device. Refusals raise ValueError/TypeError with latentkv's message. Importing latentkv needs
numpy only; torch is imported by latentkv.torch.
"""

import sys

import numpy as _np

from . import _C
from ._C import cuda_available

__version__ = "0.1.0"
__all__ = ["kv_proj", "cuda_available"]

_ndarray = _np.ndarray
_kv_proj_numpy = _C.kv_proj_numpy
_torch_kv_proj = None


def kv_proj(hidden, w_down, w_up_k, w_up_v, num_heads, *, latent_out=None):
    """stack([k, v]) of the MLA low-rank KV projection, shape (2, B, S, H, Dh).

    hidden (B, S, D), w_down (D, R), w_up_k and w_up_v (R, H*Dh) with H = num_heads: all numpy
    arrays, or all torch tensors on one device; one dtype (float32 everywhere; bfloat16/float16
    where the backend has them). The last dimension of each must be contiguous. latent_out, if
    given, is a writable (B, S, R) array that receives hidden @ w_down (what an MLA cache stores).
    Zero-size inputs give the zero-size or all-zero result the unfused matmuls would.
    """
    if type(hidden) is _ndarray:
        return _kv_proj_numpy(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(hidden, torch.Tensor):
        global _torch_kv_proj
        if _torch_kv_proj is None:
            from .torch import kv_proj as _torch_kv_proj
        return _torch_kv_proj(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out=latent_out)
    raise TypeError(f"hidden: expected a numpy.ndarray or torch.Tensor, got {type(hidden).__name__}")
