"""PyTorch integration: the ops torch.ops.latentkv.kv_proj / kv_proj_with_latent and the
LatentKVProjection module, a drop-in for the reference module (same parameter names, shapes,
creation order and init, so state_dicts and seeds carry over).

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

__all__ = ["kv_proj", "reference_kv_proj", "LatentKVProjection"]

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


class LatentKVProjection(nn.Module):
    """Drop-in for the reference MLA KV projection module.

    Parameters w_down (D, R), w_up_k (R, H*Dh), w_up_v (R, H*Dh), created in that order with
    randn(...) / sqrt(fan_in), as the reference does. forward(x) with x (B, S, D) returns
    (2, B, S, H, Dh): the fused latentkv op when autograd records nothing, else the unfused
    reference math (latentkv has no backward yet).
    """

    def __init__(self, model_dim, rank, num_heads, head_dim, *, device=None, dtype=None):
        super().__init__()
        for name, value in (("model_dim", model_dim), ("rank", rank), ("num_heads", num_heads),
                            ("head_dim", head_dim)):
            if value <= 0:
                raise ValueError(f"{name} = {value} must be positive")
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
        if _is_grad_enabled() and (x.requires_grad or w_down.requires_grad
                                   or w_up_k.requires_grad or w_up_v.requires_grad):
            return reference_kv_proj(x, w_down, w_up_k, w_up_v, self.num_heads)
        return _op(x, w_down, w_up_k, w_up_v, self.num_heads)

    def extra_repr(self):
        return (f"model_dim={self.model_dim}, rank={self.rank}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim}")
