"""PyTorch integration: the ops torch.ops.latentkv.kv_proj / kv_proj_with_latent and the
LatentKVProjection module, a drop-in for the reference module (same parameter names, shapes,
creation order and init, so state_dicts and seeds carry over).

The ops have plain CPU and CUDA kernels plus a fake (meta) kernel: torch.compile(fullgraph=True)
traces them, CUDA graphs capture them (the kernel runs on torch's current stream and allocates its
output through torch), and torch.library.opcheck passes. Where the package was built against torch
(latentkv/_torch_ops.so, src/torch_ops.cpp), the ops and their kernels are registered in C++ and a
call is a C++ dispatch; otherwise, or with LATENTKV_TORCH_OPS=python, they are declared here with
torch.library and get Python kernels over the binding (~7 us more per call on an H200 host, which
is why the C++ registration exists). Either way the fake kernels are the Python ones below, and
OPS_BACKEND says which registration is active ("c++" or "python"). LATENTKV_TORCH_OPS=c++ makes a
missing or unloadable C++ library an ImportError instead of a fallback.
torch.library.custom_op would be shorter but puts a Python autograd wrapper in front of every call
(~5 us more per call, measured); this module's ops have no autograd formula. LatentKVProjection
therefore calls the fused op when no gradient is needed (torch.no_grad / inference_mode / frozen
weights) and the unfused, differentiable reference math otherwise, so training still works.

Importing this module registers the ops once per process.
"""

import math
import os
import warnings

import torch
from torch import nn
from torch.nn.modules import module as _nn_module

from . import _C, _out_shape

__all__ = ["kv_proj", "reference_kv_proj", "LatentKVProjection", "OPS_BACKEND"]

_C_kv_proj = _C.kv_proj

# torch >= 2.10 publishes the DLPack C exchange API: the binding reads tensors (also ones that
# require grad) straight from C and asks torch for the current stream itself. Older torch goes
# through DLPack capsules made without any stream synchronization (Tensor.__dlpack__ may record
# cross-stream events, which breaks CUDA graph capture), and the stream is passed explicitly.
_EXCHANGE_API = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
_to_dlpack = torch._C._to_dlpack


def _run_capsules(hidden, w_down, w_up_k, w_up_v, out, latent_out, stream=None, workspace=None):
    """The binding call for torch < 2.10: capsules without stream sync, the stream passed."""
    if stream is None and hidden.is_cuda:
        stream = torch.cuda.current_stream(hidden.device).cuda_stream
    return _C_kv_proj(
        _to_dlpack(hidden.detach()),
        _to_dlpack(w_down.detach()),
        _to_dlpack(w_up_k.detach()),
        _to_dlpack(w_up_v.detach()),
        _to_dlpack(out),
        None if latent_out is None else _to_dlpack(latent_out),
        stream,
        None if workspace is None else _to_dlpack(workspace),
    )


# _run(hidden, w_down, w_up_k, w_up_v, out, latent_out[, stream, workspace]) -> 1 when it ran;
# 0 or -bytes when it did not (see _finish).
_run = _C_kv_proj if _EXCHANGE_API else _run_capsules


def _finish(status, hidden, w_down, w_up_k, w_up_v, out, latent_out):
    """The uncommon outcomes of _run. 0: a zero dimension, nothing to compute; the result is empty
    or an empty sum (zeros), and only the latent may be non-trivial (H*Dh = 0 alone). -bytes: the
    strategy latentkv prefers for this call (cuBLAS for GEMM-sized work, or a dtype only it takes;
    the decode kernels) wants scratch (cuBLAS's own, the latent); it comes from torch's allocator,
    so it follows the stream and CUDA-graph pools like any other temporary."""
    if status == 0:
        out.zero_()
        if latent_out is not None:
            latent_out.copy_(hidden @ w_down)
        return
    workspace = hidden.new_empty(-status, dtype=torch.uint8)
    _run(hidden, w_down, w_up_k, w_up_v, out, latent_out, None, workspace)


_OPS_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_ops.so")


def _load_cpp_ops():
    """Registers the ops from latentkv/_torch_ops.so and returns "c++"; returns "python" where the
    library was not built (no torch at build time), does not load (built against another torch:
    warned about) or LATENTKV_TORCH_OPS=python asks for the Python registration."""
    choice = os.environ.get("LATENTKV_TORCH_OPS", "").strip().lower() or "auto"
    if choice not in ("auto", "c++", "python"):
        raise ValueError(f"LATENTKV_TORCH_OPS = {choice!r}: expected auto, c++ or python")
    if choice == "python":
        return "python"
    if not os.path.exists(_OPS_LIBRARY):
        if choice == "c++":
            raise ImportError(
                f"LATENTKV_TORCH_OPS=c++, but {_OPS_LIBRARY} was not built (build latentkv with "
                "torch importable: pip install --no-build-isolation .)"
            )
        return "python"
    try:
        torch.ops.load_library(_OPS_LIBRARY)
    except OSError as e:
        if choice == "c++":
            raise ImportError(f"LATENTKV_TORCH_OPS=c++, but {_OPS_LIBRARY} does not load: {e}") from e
        warnings.warn(
            f"latentkv: {_OPS_LIBRARY} does not load ({e}); the torch ops are registered from "
            "Python instead (rebuild latentkv against this torch to get the C++ ones)",
            RuntimeWarning,
            stacklevel=3,
        )
        return "python"
    return "c++"


# "c++" or "python": which registration of torch.ops.latentkv.* this process uses.
OPS_BACKEND = _load_cpp_ops()
if OPS_BACKEND == "c++":
    # The same file as a Python extension module (already loaded, so this only makes the module
    # object): its kv_proj_eager is the op's kernel without the dispatcher.
    from . import _torch_ops


def _kv_proj_kernel(hidden, w_down, w_up_k, w_up_v, num_heads):
    out = hidden.new_empty(_out_shape(hidden, w_up_k, num_heads))
    status = _run(hidden, w_down, w_up_k, w_up_v, out, None)
    if status != 1:
        _finish(status, hidden, w_down, w_up_k, w_up_v, out, None)
    return out


def _kv_proj_with_latent_kernel(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out):
    out = hidden.new_empty(_out_shape(hidden, w_up_k, num_heads))
    status = _run(hidden, w_down, w_up_k, w_up_v, out, latent_out)
    if status != 1:
        _finish(status, hidden, w_down, w_up_k, w_up_v, out, latent_out)
    return out


if OPS_BACKEND == "python":
    # The fallback: the same schemas as src/torch_ops.cpp, Python kernels over the binding.
    _lib = torch.library.Library("latentkv", "DEF")
    _lib.define(
        "kv_proj(Tensor hidden, Tensor w_down, Tensor w_up_k, Tensor w_up_v, int num_heads) -> Tensor"
    )
    _lib.define(
        "kv_proj_with_latent(Tensor hidden, Tensor w_down, Tensor w_up_k, Tensor w_up_v, "
        "int num_heads, Tensor(a!) latent_out) -> Tensor"
    )
    for _key in ("CPU", "CUDA"):
        _lib.impl("kv_proj", _kv_proj_kernel, _key)
        _lib.impl("kv_proj_with_latent", _kv_proj_with_latent_kernel, _key)


def _fake_checks(hidden, w_down, w_up_k, w_up_v, latent_out=None):
    """What the binding would refuse, checked at trace time so a compiled graph fails early."""
    tensors = {"hidden": hidden, "w_down": w_down, "w_up_k": w_up_k, "w_up_v": w_up_v}
    if latent_out is not None:
        tensors["latent_out"] = latent_out
    for name, t in tensors.items():
        if t.dtype != hidden.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but hidden has {hidden.dtype}")
        if t.device != hidden.device:
            raise ValueError(
                f"{name} is on {t.device} but hidden is on {hidden.device}; "
                "all arrays must be on one device"
            )
    if hidden.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"hidden has dtype {hidden.dtype}; latentkv takes float32, bfloat16 or float16")
    if w_down.dim() != 2 or w_down.shape[0] != hidden.shape[2]:
        raise ValueError(f"w_down has shape {tuple(w_down.shape)}, expected (D, R) with D = {hidden.shape[2]}")
    if w_up_k.shape[0] != w_down.shape[1] or w_up_v.shape != w_up_k.shape:
        raise ValueError(
            f"w_up_k {tuple(w_up_k.shape)} and w_up_v {tuple(w_up_v.shape)} must both be "
            f"(R, H*Dh) with R = {w_down.shape[1]}"
        )
    if latent_out is not None and latent_out.shape != (hidden.shape[0], hidden.shape[1], w_down.shape[1]):
        raise ValueError(f"latent_out has shape {tuple(latent_out.shape)}, expected (B, S, R)")


@torch.library.register_fake("latentkv::kv_proj")
def _kv_proj_fake(hidden, w_down, w_up_k, w_up_v, num_heads):
    shape = _out_shape(hidden, w_up_k, num_heads)
    _fake_checks(hidden, w_down, w_up_k, w_up_v)
    return hidden.new_empty(shape)


@torch.library.register_fake("latentkv::kv_proj_with_latent")
def _kv_proj_with_latent_fake(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out):
    shape = _out_shape(hidden, w_up_k, num_heads)
    _fake_checks(hidden, w_down, w_up_k, w_up_v, latent_out)
    return hidden.new_empty(shape)


_op = torch.ops.latentkv.kv_proj.default
_op_with_latent = torch.ops.latentkv.kv_proj_with_latent.default
_is_compiling = torch.compiler.is_compiling
# True only while dynamo traces (a constant there); half the cost of is_compiling in eager.
_is_dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", _is_compiling)
_is_grad_enabled = torch.is_grad_enabled
# The ops' C++ entry points: OpOverload.__call__ only forwards to them, so eager calls skip that
# Python frame (0.2 us a call); torch.compile cannot trace them and is given the OpOverloads.
_op_entry = getattr(_op, "_op", _op)
_op_with_latent_entry = getattr(_op_with_latent, "_op", _op_with_latent)
# The module's eager shortcut without the C++ registration, on torch >= 2.10: the binding gets the
# output (and any scratch) from torch's own allocator through the DLPack C exchange API and returns
# it, with no dispatcher in between. It answers None where the op should take the call (a zero
# dimension, num_heads not dividing H*Dh).
_kv_proj_allocating = getattr(_C, "kv_proj_allocating", None) if _EXCHANGE_API else None
_Tensor = torch.Tensor
_PLAIN_WEIGHTS = (torch.Tensor, nn.Parameter)
_torch_function_mode_enabled = torch._C._is_torch_function_mode_enabled
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_functorch_active = torch._C._are_functorch_transforms_active
_get_tracing_state = torch._C._get_tracing_state


# Dynamo's frame callback: installed while a torch.compile'd callable runs, also in frames dynamo
# skips (LatentKVProjection.__call__ at the top of a compiled module); None in plain eager code.
_dynamo_frame_callback = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None), "get_eval_frame_callback",
    lambda: None,
)


def _kv_proj_eager_python(x, w_down, w_up_k, w_up_v, num_heads):
    """_torch_ops.kv_proj_eager's contract over the allocating binding, for where the C++ library
    is not in use: the output for plain tensors with nothing for autograd to record, outside torch
    function / dispatch modes, functorch transforms and jit traces; None where the op must take
    the call (tensor subclasses, fake tensors, make_fx, vmap and the like, a zero dimension,
    num_heads not dividing H*Dh). A refusal raises the binding's error, which is the op's."""
    if (
        type(x) is _Tensor and type(num_heads) is int and type(w_down) in _PLAIN_WEIGHTS
        and type(w_up_k) in _PLAIN_WEIGHTS and type(w_up_v) in _PLAIN_WEIGHTS
        and not (_is_grad_enabled() and (x.requires_grad or w_down.requires_grad
                                         or w_up_k.requires_grad or w_up_v.requires_grad))
        and not (_torch_function_mode_enabled() or _dispatch_stack_len() or _functorch_active()
                 or _get_tracing_state())
    ):
        return _kv_proj_allocating(x, w_down, w_up_k, w_up_v, num_heads)
    return None


# kv_proj_eager(x, w_down, w_up_k, w_up_v, num_heads) -> Tensor or None: LatentKVProjection's eager
# path. With the C++ registration, the op's C++ kernel called from Python with no dispatcher and no
# Python frame (the checks above made in C++; it raises the op's errors itself); else the allocating
# binding behind Python checks; None on torch < 2.10 without the C++ library.
if OPS_BACKEND == "c++":
    _kv_proj_eager = _torch_ops.kv_proj_eager
elif _kv_proj_allocating is not None:
    _kv_proj_eager = _kv_proj_eager_python
else:
    _kv_proj_eager = None


def _needs_autograd(x, w_down, w_up_k, w_up_v):
    """True where autograd would record the module's forward (the op has no backward)."""
    return _is_grad_enabled() and (
        x.requires_grad or w_down.requires_grad or w_up_k.requires_grad or w_up_v.requires_grad
    )


def kv_proj(hidden, w_down, w_up_k, w_up_v, num_heads, *, latent_out=None):
    """latentkv.kv_proj for torch tensors, through the registered ops (traceable, capturable).

    latent_out, if given, is written in place (the op declares the mutation). No autograd: use
    reference_kv_proj, or LatentKVProjection, where gradients are needed. In eager mode, a call
    without latent_out on plain tensors takes the module's eager path (no dispatcher).
    """
    compiling = _is_compiling()
    if latent_out is None and not compiling and _kv_proj_eager is not None:
        out = _kv_proj_eager(hidden, w_down, w_up_k, w_up_v, num_heads)
        if out is not None:
            return out
    try:
        if latent_out is None:
            op = _op if compiling else _op_entry
            return op(hidden, w_down, w_up_k, w_up_v, num_heads)
        op = _op_with_latent if compiling else _op_with_latent_entry
        return op(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out)
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


# What nn.Module.__call__ looks at before it calls forward (torch edits these dicts in place).
_Module = nn.Module
_module_call = nn.Module.__call__
_global_forward_pre_hooks = _nn_module._global_forward_pre_hooks
_global_forward_hooks = _nn_module._global_forward_hooks
_global_backward_pre_hooks = _nn_module._global_backward_pre_hooks
_global_backward_hooks = _nn_module._global_backward_hooks


class LatentKVProjection(nn.Module):
    """Drop-in for the reference MLA KV projection module.

    Parameters w_down (D, R), w_up_k (R, H*Dh), w_up_v (R, H*Dh), created in that order with
    randn(...) / sqrt(fan_in), as the reference does. forward(x) with x (B, S, D) returns
    (2, B, S, H, Dh): the fused latentkv op when autograd needs no graph, else the unfused
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

    def __call__(self, *args, **kwargs):
        # nn.Module.__call__'s fast path (no hooks: just forward) with forward's eager shortcut
        # inlined (0.57 us of Python over the eager path's own call on a CPU host; 1.3-1.9 us on
        # the H200's hosts).
        # nn.Module resolves self.<name> through its __getattr__ hook (no attribute caching), so
        # the instance dict is read directly. Everything else goes through nn.Module.__call__:
        # hooks (global or this module's), module.compile(), torch.jit.trace, and tracers that
        # patch nn.Module.__call__ (torch.fx). Under torch.compile this frame is either traced
        # (is_dynamo_compiling is true) or skipped with dynamo's frame callback installed (see
        # _dynamo_skips_top_frame): both go to forward, which dynamo traces.
        d = self.__dict__
        if (
            d["_forward_pre_hooks"] or d["_forward_hooks"] or d["_backward_pre_hooks"]
            or d["_backward_hooks"] or _global_forward_pre_hooks or _global_forward_hooks
            or _global_backward_pre_hooks or _global_backward_hooks
            or d.get("_compiled_call_impl") is not None or _Module.__call__ is not _module_call
        ):
            return super().__call__(*args, **kwargs)
        if (
            len(args) == 1 and not kwargs and _kv_proj_eager is not None
            and not _is_dynamo_compiling() and _dynamo_frame_callback() is None
            and type(self) is LatentKVProjection and "forward" not in d
        ):
            # Plain tensors with nothing for autograd to record, outside modes and transforms, are
            # run here; the rest (tensor subclasses, fake tensors, make_fx, vmap and the like, and
            # calls that need autograd) get None and go to forward.
            params = d["_parameters"]
            out = _kv_proj_eager(args[0], params["w_down"], params["w_up_k"], params["w_up_v"],
                                 d["num_heads"])
            if out is not None:
                return out
        if _get_tracing_state():  # torch.jit.trace (the eager path declined it)
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, x):
        params = self._parameters
        w_down, w_up_k, w_up_v = params["w_down"], params["w_up_k"], params["w_up_v"]
        if _needs_autograd(x, w_down, w_up_k, w_up_v):
            return reference_kv_proj(x, w_down, w_up_k, w_up_v, self.num_heads)
        if _is_compiling():
            return _op(x, w_down, w_up_k, w_up_v, self.num_heads)
        return _op_entry(x, w_down, w_up_k, w_up_v, self.num_heads)

    def extra_repr(self):
        return (f"model_dim={self.model_dim}, rank={self.rank}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim}")


def _dynamo_skips_top_frame(code):
    """torch.compile(module) runs nn.Module.__call__ outside the graph (dynamo skips torch's own
    frames where it starts), so hooks registered after compiling still run; this gives
    LatentKVProjection.__call__ the same: dynamo skips that frame when it starts there and compiles
    the frames it calls (forward), and still inlines it inside a compiled caller. The API is
    private: where this torch lacks it, such late hooks need a recompile, as they do for any module
    inside a compiled model."""
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )
        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))
    except (ImportError, AttributeError, TypeError, RuntimeError):
        return  # another torch: only the late-hooks nicety is lost


_dynamo_skips_top_frame(LatentKVProjection.__call__.__code__)
if OPS_BACKEND == "c++":
    # `module(x)` runs __call__'s checks and fast path in C (the class's tp_call slot); __call__
    # above stays what torch.compile inlines and what every declined call runs. The checks live in
    # both places (module_fast_path in src/torch_ops.cpp): change them together.
    _torch_ops.install_fast_call(
        LatentKVProjection, LatentKVProjection.__call__, _Module, _module_call,
        _dynamo_frame_callback,
        (_global_forward_pre_hooks, _global_forward_hooks, _global_backward_pre_hooks,
         _global_backward_hooks),
    )
