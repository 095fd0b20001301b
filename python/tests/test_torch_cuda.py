"""The torch side on the CUDA backend: results against the float64 reference (fp32, and bf16/fp16
where the kernels take them), LatentKVProjection against the reference module, torch.compile with
fullgraph=True, CUDA-graph capture, opcheck, the caller's stream, padded views, mixed devices.
Skipped without torch or without a CUDA device that latentkv can use."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import latentkv  # noqa: E402
import latentkv.torch as lt  # noqa: E402
import cases  # noqa: E402
from reference import FLOAT32_TOLERANCE, random_inputs, reference, rel_error  # noqa: E402
from reference_torch import ReferenceKVProjection  # noqa: E402

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and latentkv.cuda_available()),
        reason="needs a CUDA device (torch.cuda and latentkv both see one)",
    ),
]

LOW_PRECISION = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def cuda_inputs(shape, seed=0, dtype=torch.float32):
    arrays = random_inputs(np.random.default_rng(seed), *shape)
    return [torch.from_numpy(a).to("cuda", dtype) for a in arrays]


def ref_of(tensors, heads):
    return reference(*(t.detach().float().cpu().numpy() for t in tensors), heads)


def run_or_skip_unsupported(fn):
    """Runs fn; skips the test when the CUDA backend refuses the problem as unsupported (a dtype
    or size its kernels do not take yet), so these tests follow the kernels as they land."""
    try:
        return fn()
    except ValueError as e:
        if str(e).startswith("unsupported:"):
            pytest.skip(str(e))
        raise


# From the one case list (tests/common/cases.h): every edge shape, the first random shapes, a preset.
CASES = {"founding": cases.preset("seed"), **{n: cases.preset(n) for n in ("deepseek-v2-lite", "deepseek-v3")}}
CUDA_SHAPES = (cases.params("edge") + cases.params("random", count=8)
               + [pytest.param(CASES["deepseek-v2-lite"], id="deepseek-v2-lite")])


@pytest.mark.parametrize("shape", CUDA_SHAPES)
def test_float32_matches_float64_reference(shape):
    b, s, d, r, h, dh = shape
    args = cuda_inputs(shape, seed=1)
    latent = torch.full((b, s, r), float("nan"), device="cuda")
    out = run_or_skip_unsupported(lambda: latentkv.kv_proj(*args, h, latent_out=latent))
    assert out.device == args[0].device and out.dtype == torch.float32
    assert out.shape == (2, b, s, h, dh) and out.is_contiguous()
    torch.cuda.synchronize()
    ref, ref_latent = ref_of(args, h)
    assert rel_error(out.cpu().numpy(), ref) <= FLOAT32_TOLERANCE
    assert rel_error(latent.cpu().numpy(), ref_latent) <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("case", ["founding", "deepseek-v3"])
def test_presets_float32(case):
    b, s, d, r, h, dh = CASES[case]
    args = cuda_inputs(CASES[case], seed=2)
    out = run_or_skip_unsupported(lambda: latentkv.kv_proj(*args, h))
    assert rel_error(out.cpu().numpy(), ref_of(args, h)[0]) <= FLOAT32_TOLERANCE


def test_gemm_sized_call_gets_a_workspace():
    """Prefill-sized fp32: kAuto prefers a strategy that needs scratch for the latent when it has
    some; the binding says how much (workspace_size), the op allocates it through torch."""
    b, s, d, r, h, dh = shape = (1, 4096, 2048, 512, 16, 128)
    args = cuda_inputs(shape, seed=12)
    out = torch.empty(2, b, s, h, dh, device="cuda")
    wanted = latentkv._C.workspace_size(*args, out)
    workspace = torch.empty(wanted, dtype=torch.uint8, device="cuda") if wanted else None
    assert latentkv._C.kv_proj(*args, out, None, None, workspace) == 1
    ref = ref_of(args, h)[0]
    assert rel_error(out.cpu().numpy(), ref) <= FLOAT32_TOLERANCE
    got = run_or_skip_unsupported(lambda: lt.kv_proj(*args, h))
    assert rel_error(got.cpu().numpy(), ref) <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("dtype", list(LOW_PRECISION))
@pytest.mark.parametrize("case", ["founding", "deepseek-v2-lite", "deepseek-v3"])
def test_low_precision_within_twice_the_unfused_error(case, dtype):
    """design.md: bf16/fp16 within 2x of the error of the unfused same-precision computation."""
    b, s, d, r, h, dh = CASES[case]
    args = cuda_inputs(CASES[case], seed=3, dtype=LOW_PRECISION[dtype])
    out = run_or_skip_unsupported(lambda: latentkv.kv_proj(*args, h))
    assert out.dtype == LOW_PRECISION[dtype]
    ref = ref_of(args, h)[0]
    unfused = lt.reference_kv_proj(*args, h).float().cpu().numpy()
    ours = out.float().cpu().numpy()
    assert rel_error(ours, ref) <= 2 * rel_error(unfused, ref) + 1e-7


def test_module_on_cuda_matches_the_reference_module():
    b, s, d, r, h, dh = CASES["founding"]
    torch.manual_seed(7)
    ref = ReferenceKVProjection(d, r, h, dh).cuda()
    torch.manual_seed(7)
    ours = lt.LatentKVProjection(d, r, h, dh).cuda()
    for (name, a), (_, w) in zip(ref.state_dict().items(), ours.state_dict().items()):
        assert torch.equal(a, w), name
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(b, s, d, device="cuda")
    with torch.no_grad():
        got = run_or_skip_unsupported(lambda: ours(x))
        want = ref.double()(x.double())
    assert rel_error(got.cpu().numpy(), want.cpu().numpy()) <= FLOAT32_TOLERANCE


def test_torch_compile_fullgraph():
    torch.compiler.reset()
    b, s, d, r, h, dh = CASES["founding"]
    module = lt.LatentKVProjection(d, r, h, dh).cuda()
    x = torch.randn(b, s, d, device="cuda")
    with torch.no_grad():
        eager = run_or_skip_unsupported(lambda: module(x))
        compiled = torch.compile(module, fullgraph=True)
        got = compiled(x)
        got_again = compiled(torch.randn(b, s, d, device="cuda") * 0 + x)
    torch.testing.assert_close(got, eager)
    torch.testing.assert_close(got_again, eager)


def test_torch_compile_fullgraph_reduce_overhead():
    """mode="reduce-overhead": inductor wraps the graph, the op included, in a CUDA graph."""
    torch.compiler.reset()
    module = lt.LatentKVProjection(64, 16, 2, 8).cuda()
    x = torch.randn(2, 9, 64, device="cuda")
    with torch.no_grad():
        eager = run_or_skip_unsupported(lambda: module(x))
        compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
        for _ in range(3):
            got = compiled(x).clone()
    torch.testing.assert_close(got, eager)


def test_cuda_graph_capture_and_replay():
    b, s, d, r, h, dh = CASES["founding"]
    module = lt.LatentKVProjection(d, r, h, dh).cuda()
    static_x = torch.randn(b, s, d, device="cuda")
    with torch.no_grad():
        run_or_skip_unsupported(lambda: module(static_x))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as capture requires
            for _ in range(2):
                module(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = module(static_x)
        for seed in range(3):
            torch.manual_seed(seed)
            x = torch.randn(b, s, d, device="cuda")
            static_x.copy_(x)
            graph.replay()
            want = lt.reference_kv_proj(x.double(), *(p.double() for p in module.parameters()), h)
            torch.cuda.synchronize()
            assert rel_error(static_out.cpu().numpy(), want.cpu().numpy()) <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_graph_capture_of_a_call_with_workspace(dtype):
    """The workspace path (bf16, or GEMM-sized fp32) inside a CUDA graph: its scratch comes from
    the graph's pool."""
    b, s, d, r, h, dh = shape = (1, 2048, 2048, 512, 16, 128) if dtype == torch.float32 else CASES["founding"]
    static_args = cuda_inputs(shape, seed=13, dtype=dtype)
    with torch.no_grad():
        run_or_skip_unsupported(lambda: lt.kv_proj(*static_args, h))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            lt.kv_proj(*static_args, h)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = lt.kv_proj(*static_args, h)
        static_args[0].copy_(torch.randn_like(static_args[0]))
        graph.replay()
        want = lt.reference_kv_proj(*(t.double() for t in static_args), h)
        torch.cuda.synchronize()
        unfused = lt.reference_kv_proj(*static_args, h).double()
        limit = FLOAT32_TOLERANCE if dtype == torch.float32 else 2 * rel_error(
            unfused.cpu().numpy(), want.cpu().numpy()) + 1e-7
        assert rel_error(static_out.double().cpu().numpy(), want.cpu().numpy()) <= limit


def test_runs_on_the_callers_stream():
    """A long producer on a side stream, then kv_proj on that stream: correct only if kv_proj is
    ordered after the producer, i.e. runs on torch's current stream, not the default one."""
    b, s, d, r, h, dh = 4, 64, 512, 64, 4, 32
    _, w_down, w_up_k, w_up_v = cuda_inputs((b, s, d, r, h, dh), seed=4)
    run_or_skip_unsupported(lambda: latentkv.kv_proj(torch.ones(b, s, d, device="cuda"), w_down, w_up_k, w_up_v, h))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(4):
            big = big @ big / 64  # keeps the side stream busy
        x = torch.ones(b, s, d, device="cuda") + big[0, 0] * 0
        out = latentkv.kv_proj(x, w_down, w_up_k, w_up_v, h)
    side.synchronize()
    want = ref_of((x, w_down, w_up_k, w_up_v), h)[0]
    assert rel_error(out.cpu().numpy(), want) <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("op", ["kv_proj", "kv_proj_with_latent"])
def test_opcheck(op):
    args = cuda_inputs((2, 5, 24, 8, 2, 4), seed=5)
    run_or_skip_unsupported(lambda: latentkv.kv_proj(*args, 2))
    if op == "kv_proj":
        torch.library.opcheck(torch.ops.latentkv.kv_proj.default, (*args, 2))
    else:
        latent = torch.empty(2, 5, 8, device="cuda")
        torch.library.opcheck(torch.ops.latentkv.kv_proj_with_latent.default, (*args, 2, latent))


def test_padded_views():
    b, s, d, r, h, dh = shape = (2, 20, 96, 24, 2, 16)
    hidden, w_down, w_up_k, w_up_v = cuda_inputs(shape, seed=6)
    big = torch.randn(b, s + 3, d + 8, device="cuda")
    big[:, :s, :d] = hidden
    view = big[:, :s, :d]
    out = run_or_skip_unsupported(lambda: latentkv.kv_proj(view, w_down, w_up_k, w_up_v, h))
    assert rel_error(out.cpu().numpy(), ref_of((hidden, w_down, w_up_k, w_up_v), h)[0]) <= FLOAT32_TOLERANCE


def test_mixed_devices_are_value_error():
    hidden, w_down, w_up_k, w_up_v = cuda_inputs((1, 4, 16, 8, 2, 4), seed=7)
    with pytest.raises(ValueError, match="w_down is on cpu but hidden is on cuda:0"):
        latentkv.kv_proj(hidden, w_down.cpu(), w_up_k, w_up_v, 2)
    with pytest.raises(ValueError, match="hidden is on cpu"):
        latentkv.kv_proj(hidden.cpu(), w_down, w_up_k, w_up_v, 2)
    with pytest.raises(ValueError, match="all arrays must be on one device"):
        lt.kv_proj(hidden, w_down, w_up_k, w_up_v, 2, latent_out=torch.empty(1, 4, 8))
    with pytest.raises(TypeError, match="w_down: expected a torch.Tensor like hidden, got ndarray"):
        latentkv.kv_proj(hidden, w_down.cpu().numpy(), w_up_k, w_up_v, 2)


def test_float64_is_type_error():
    args = [t.double() for t in cuda_inputs((1, 4, 16, 8, 2, 4), seed=8)]
    with pytest.raises(TypeError, match="hidden has dtype float64"):
        latentkv.kv_proj(*args, 2)


def test_zero_size():
    args = cuda_inputs((0, 4, 16, 8, 2, 4), seed=9)
    out = latentkv.kv_proj(*args, 2)
    assert out.shape == (2, 0, 4, 2, 4) and out.device.type == "cuda"
    args = cuda_inputs((2, 4, 0, 8, 2, 4), seed=9)
    assert torch.count_nonzero(latentkv.kv_proj(*args, 2)).item() == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_another_device_than_the_current_one():
    args = [t.to("cuda:1") for t in cuda_inputs((2, 8, 32, 8, 2, 4), seed=10)]
    with torch.cuda.device(0):
        out = run_or_skip_unsupported(lambda: latentkv.kv_proj(*args, 2))
    assert out.device == torch.device("cuda:1")
    assert rel_error(out.cpu().numpy(), ref_of(args, 2)[0]) <= FLOAT32_TOLERANCE
