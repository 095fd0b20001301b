"""latentkv: the fused low-rank KV projection of Multi-head Latent Attention.

    latent = hidden @ w_down;  k, v = latent @ w_up_k, latent @ w_up_v
    kv_proj(...) = stack([k.view(B, S, H, Dh), v.view(B, S, H, Dh)])  -> (2, B, S, H, Dh)

kv_proj takes numpy arrays (CPU backend) or torch tensors (CPU or CUDA, through the torch op
torch.ops.latentkv.kv_proj, registered when latentkv.torch is first imported) and returns the
result in the same array type and on the same device. The hot path is a few attribute reads, one
allocation and one call into the compiled binding (latentkv._C), which derives the problem from
the shapes, checks everything and raises ValueError/TypeError with latentkv's message on refusal.
"""

import operator
import sys

import numpy as _np

from . import _C
from ._C import cuda_available

__version__ = "0.1.0"
__all__ = ["kv_proj", "cuda_available"]

_ndarray = _np.ndarray
_np_empty = _np.empty
_index = operator.index
_C_kv_proj = _C.kv_proj


def _out_shape(hidden, w_up_k, num_heads):
    """(2, B, S, H, Dh) from the inputs' shapes; the checks that need num_heads live here, the
    binding checks the rest against the array it is given."""
    try:
        hidden_shape = hidden.shape
        w_shape = w_up_k.shape
    except AttributeError:
        bad, name = (hidden, "hidden") if not hasattr(hidden, "shape") else (w_up_k, "w_up_k")
        raise TypeError(
            f"{name}: expected a numpy.ndarray or torch.Tensor, got {type(bad).__name__}"
        ) from None
    if len(hidden_shape) != 3:
        raise ValueError(f"hidden must be 3-D (B, S, D), got shape {tuple(hidden_shape)}")
    if len(w_shape) != 2:
        raise ValueError(f"w_up_k must be 2-D (R, H*Dh), got shape {tuple(w_shape)}")
    heads = _index(num_heads)
    width = w_shape[1]
    if heads <= 0 or width % heads:
        raise ValueError(
            f"num_heads = {heads} must be positive and divide the width of w_up_k, {width} "
            "(= num_heads * head_dim)"
        )
    return (2, hidden_shape[0], hidden_shape[1], heads, width // heads)


_torch_kv_proj = None


def _kv_proj_torch(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out):
    global _torch_kv_proj
    if _torch_kv_proj is None:
        from .torch import kv_proj as _torch_kv_proj
    return _torch_kv_proj(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out=latent_out)


def kv_proj(hidden, w_down, w_up_k, w_up_v, num_heads, *, latent_out=None):
    """stack([k, v]) of the MLA low-rank KV projection, shape (2, B, S, H, Dh).

    hidden (B, S, D), w_down (D, R), w_up_k and w_up_v (R, H*Dh) with H = num_heads: all numpy
    arrays, or all torch tensors on one device; one dtype (float32 everywhere; bfloat16/float16
    where the backend has them). The last dimension of each must be contiguous. latent_out, if
    given, is a writable (B, S, R) array that receives hidden @ w_down (what an MLA cache stores).
    Zero-size inputs give the zero-size or all-zero result the unfused matmuls would.
    """
    if type(hidden) is _ndarray:
        out = _np_empty(_out_shape(hidden, w_up_k, num_heads), hidden.dtype)
        if _C_kv_proj(hidden, w_down, w_up_k, w_up_v, out, latent_out) != 1:
            # A zero dimension (the CPU backend never asks for a workspace): nothing for latentkv
            # to compute, the result is empty or an empty sum (zeros); only the latent can still
            # be non-trivial (H*Dh = 0 alone).
            out[...] = 0
            if latent_out is not None:
                latent_out[...] = hidden @ w_down
        return out
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(hidden, torch.Tensor):
        return _kv_proj_torch(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out)
    raise TypeError(f"hidden: expected a numpy.ndarray or torch.Tensor, got {type(hidden).__name__}")
