"""torch.ops.latentkv.*, registered once, in C++ (latentkv/_torch_ops.so): that its CPU (and,
with a CUDA torch, CUDA) kernels are there, that import latentkv.torch says what is wrong and how
to fix it where torch or the library is missing or does not load (and import latentkv works
without torch), that the ops refuse bad calls with ValueError/TypeError naming the argument and
write nothing then, and that they match the binding bit for bit. Skipped without torch."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import latentkv  # noqa: E402
import latentkv.torch as lt  # noqa: E402
from reference import random_inputs  # noqa: E402

TESTS = Path(__file__).resolve().parent


def torch_inputs(shape, seed=0, device="cpu"):
    arrays = random_inputs(np.random.default_rng(seed), *shape)
    return [torch.from_numpy(a).to(device) for a in arrays]


def test_the_ops_have_cpu_and_cuda_kernels():
    for op in (torch.ops.latentkv.kv_proj.default, torch.ops.latentkv.kv_proj_with_latent.default):
        assert op.has_kernel_for_dispatch_key("CPU")
        assert op.has_kernel_for_dispatch_key("CUDA") == bool(torch.version.cuda)


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          cwd=TESTS.parent.parent, capture_output=True, text=True, timeout=300)


def test_without_torch_latentkv_imports_and_latentkv_torch_says_how_to_fix_it():
    got = run_python(
        "import sys; sys.modules['torch'] = None\n"  # import torch now raises ImportError
        "import numpy as np, latentkv\n"
        "out = latentkv.kv_proj(np.ones((1, 2, 4), np.float32), np.ones((4, 2), np.float32),\n"
        "                       np.ones((2, 4), np.float32), np.ones((2, 4), np.float32), 2)\n"
        "assert out.shape == (2, 1, 2, 2, 2) and (out == 8).all(), out\n"
        "import latentkv.torch\n")
    assert got.returncode != 0 and "ImportError: latentkv.torch needs PyTorch" in got.stderr, got.stderr
    assert "install torch" in got.stderr and "pip install --no-build-isolation ." in got.stderr


def copy_of_the_package(tmp_path, library_bytes=None):
    """latentkv copied to tmp_path without _torch_ops.so, or with these bytes as _torch_ops.so."""
    shutil.copytree(Path(latentkv.__file__).parent, tmp_path / "latentkv",
                    ignore=shutil.ignore_patterns("__pycache__", "_torch_ops.so"))
    if library_bytes is not None:
        (tmp_path / "latentkv" / "_torch_ops.so").write_bytes(library_bytes)
    return str(tmp_path)


def test_a_package_built_without_torch_says_how_to_rebuild(tmp_path):
    got = run_python("import latentkv.torch", PYTHONPATH=copy_of_the_package(tmp_path))
    assert got.returncode != 0 and "ImportError" in got.stderr
    assert "_torch_ops.so was not built" in got.stderr, got.stderr
    assert "pip install --no-build-isolation ." in got.stderr


def test_a_library_that_does_not_load_says_how_to_rebuild(tmp_path):
    """E.g. built against another torch."""
    got = run_python("import latentkv.torch",
                     PYTHONPATH=copy_of_the_package(tmp_path, b"not a shared library"))
    assert got.returncode != 0 and "ImportError" in got.stderr
    assert "_torch_ops.so does not load" in got.stderr, got.stderr
    assert "pip install --no-build-isolation ." in got.stderr


def refusals():
    """(id, make the call's arguments from good ones, exception, message)."""
    def latent(shape=(1, 4, 8), dtype=torch.float32):
        return torch.full(shape, float("nan"), dtype=dtype)

    return [
        ("hidden-2d", lambda h, wd, wk, wv: (h[0], wd, wk, wv, 2), ValueError,
         r"hidden must be 3-D \(B, S, D\), got shape \(4, 16\)"),
        ("w_up_k-3d", lambda h, wd, wk, wv: (h, wd, wk[None], wv, 2), ValueError, "w_up_k must be 2-D"),
        ("num_heads", lambda h, wd, wk, wv: (h, wd, wk, wv, 3), ValueError,
         "num_heads = 3 must be positive and divide the width of w_up_k, 8"),
        ("num_heads-0", lambda h, wd, wk, wv: (h, wd, wk, wv, 0), ValueError,
         "num_heads = 0 must be positive"),
        ("float64", lambda h, wd, wk, wv: (h.double(), wd.double(), wk.double(), wv.double(), 2), TypeError,
         "hidden has dtype float64; latentkv takes float32, bfloat16 or float16"),
        ("mixed-dtype", lambda h, wd, wk, wv: (h, wd.half(), wk, wv, 2), TypeError,
         "w_down has dtype float16 but hidden has float32"),
        ("w_down-shape", lambda h, wd, wk, wv: (h, wd[:15], wk, wv, 2), ValueError,
         r"w_down has shape \(15, 8\), expected \(D, R\) with D = 16"),
        ("w_up_k-shape", lambda h, wd, wk, wv: (h, wd, wk[:7], wv, 2), ValueError,
         r"w_up_k has shape \(7, 8\), expected \(R, H\*Dh\) with R = 8"),
        ("w_up_v-shape", lambda h, wd, wk, wv: (h, wd, wk, wv[:, :4], 2), ValueError,
         r"w_up_v has shape \(8, 4\), expected the shape of w_up_k \(8, 8\)"),
        ("strided", lambda h, wd, wk, wv: (h, wd, wk.t().contiguous().t(), wv, 2), ValueError,
         r"w_up_k: the last dimension must be contiguous \(stride 1\), got stride 8"),
        ("latent-shape", lambda h, wd, wk, wv: (h, wd, wk, wv, 2, latent((1, 4, 7))), ValueError,
         r"latent_out has shape \(1, 4, 7\), expected \(B, S, R\) = \(1, 4, 8\)"),
        ("latent-dtype", lambda h, wd, wk, wv: (h, wd, wk, wv, 2, latent(dtype=torch.float16)), TypeError,
         "latent_out has dtype float16 but hidden has float32"),
        ("latent-strided", lambda h, wd, wk, wv: (h, wd, wk, wv, 2, latent((1, 8, 4)).transpose(1, 2)),
         ValueError, "latent_out: the last dimension must be contiguous"),
    ]


@pytest.mark.parametrize("make,error,message", [r[1:] for r in refusals()], ids=[r[0] for r in refusals()])
def test_refusals_name_the_argument_and_write_nothing(make, error, message):
    args = make(*torch_inputs((1, 4, 16, 8, 2, 4), seed=1))
    op = torch.ops.latentkv.kv_proj_with_latent if len(args) == 6 else torch.ops.latentkv.kv_proj
    with pytest.raises(error, match=message):
        op(*args)
    if len(args) == 6:
        assert torch.isnan(args[5].float()).all()


@pytest.mark.parametrize("shape", [(2, 7, 40, 12, 2, 6), (1, 1, 8, 4, 1, 4), (3, 5, 33, 9, 3, 7)],
                         ids=lambda s: "x".join(map(str, s)))
def test_op_matches_the_binding_bit_for_bit(shape):
    b, s, d, r, h, dh = shape
    hidden, w_down, w_up_k, w_up_v = torch_inputs(shape, seed=2)
    padded = torch.zeros(b, s + 1, d + 3)
    padded[:, :s, :d] = hidden
    view = padded[:, :s, :d]
    latent = torch.full((b, s, r), float("nan"))
    got = torch.ops.latentkv.kv_proj_with_latent(view, w_down, w_up_k, w_up_v, h, latent)
    want = torch.empty(2, b, s, h, dh)
    want_latent = torch.empty(b, s, r)
    assert latentkv._C.kv_proj(hidden, w_down, w_up_k, w_up_v, want, want_latent) == 1
    assert torch.equal(got, want) and torch.equal(latent, want_latent)
    assert torch.equal(torch.ops.latentkv.kv_proj(view, w_down, w_up_k, w_up_v, h), want)


def test_extent_one_dimensions_with_odd_strides():
    """torch leaves arbitrary strides on dimensions of extent 1; the op must not pass them on."""
    hidden, w_down, w_up_k, w_up_v = torch_inputs((1, 1, 16, 8, 2, 4), seed=3)
    odd = torch.empty_strided((1, 1, 16), (1, 1, 1))
    odd.copy_(hidden)
    assert torch.equal(torch.ops.latentkv.kv_proj(odd, w_down, w_up_k, w_up_v, 2),
                       torch.ops.latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v, 2))


def test_meta_tensors_use_the_fake_kernel():
    args = [t.to("meta") for t in torch_inputs((2, 3, 8, 4, 2, 3), seed=4)]
    out = torch.ops.latentkv.kv_proj(*args, 2)
    assert out.device.type == "meta" and out.shape == (2, 2, 3, 2, 3)


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and latentkv.cuda_available()),
                    reason="needs a CUDA device (torch.cuda and latentkv both see one)")
def test_cuda_refusals_through_the_op():
    hidden, w_down, w_up_k, w_up_v = torch_inputs((1, 4, 16, 8, 2, 4), seed=5, device="cuda")
    with pytest.raises(ValueError, match="w_up_v is on cpu but hidden is on cuda:0; all arrays"):
        torch.ops.latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v.cpu(), 2)
    with pytest.raises(ValueError, match="latent_out is on cpu but hidden is on cuda:0"):
        torch.ops.latentkv.kv_proj_with_latent(hidden, w_down, w_up_k, w_up_v, 2, torch.empty(1, 4, 8))
    with pytest.raises(TypeError, match="hidden has dtype float64"):
        torch.ops.latentkv.kv_proj(*(t.double() for t in (hidden, w_down, w_up_k, w_up_v)), 2)
