"""The torch side on the CPU backend: latentkv.kv_proj on torch tensors, the registered ops
(results, latent_out mutation, opcheck, torch.compile without graph breaks, inductor included), and
LatentKVProjection against the reference module (state_dict, seed, forward through the op without
autograd and the reference math with it, hooks, torch.compile, jit.trace and torch.fx). Skipped
without torch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import latentkv  # noqa: E402
import latentkv.torch as lt  # noqa: E402
import cases  # noqa: E402
from reference import FLOAT32_TOLERANCE, random_inputs, reference, rel_error  # noqa: E402
from reference_torch import ReferenceKVProjection, unfused_budgets  # noqa: E402


def torch_inputs(shape, seed=0, requires_grad=False):
    arrays = random_inputs(np.random.default_rng(seed), *shape)
    return [torch.from_numpy(a).requires_grad_(requires_grad) for a in arrays]


def ref_of(tensors, heads):
    return reference(*(t.detach().numpy() for t in tensors), heads)


@pytest.mark.parametrize("shape", cases.params("edge", "cpu-cheap"))
def test_kv_proj_on_torch_tensors(shape):
    b, s, d, r, h, dh = shape
    args = torch_inputs(shape, seed=1)
    out = latentkv.kv_proj(*args, h)
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu" and out.dtype == torch.float32
    assert out.shape == (2, b, s, h, dh) and out.is_contiguous()
    assert rel_error(out.numpy(), ref_of(args, h)[0]) <= FLOAT32_TOLERANCE
    op_out = torch.ops.latentkv.kv_proj(*args, h)
    assert rel_error(op_out.numpy(), ref_of(args, h)[0]) <= FLOAT32_TOLERANCE


def test_latent_out_is_written_through_the_op():
    shape = (2, 7, 40, 12, 2, 6)
    args = torch_inputs(shape, seed=2)
    latent = torch.full((2, 7, 12), float("nan"))
    out = latentkv.kv_proj(*args, 2, latent_out=latent)
    ref, ref_latent = ref_of(args, 2)
    assert rel_error(out.numpy(), ref) <= FLOAT32_TOLERANCE
    assert rel_error(latent.numpy(), ref_latent) <= FLOAT32_TOLERANCE


def test_tensors_requiring_grad_are_read_directly():
    args = torch_inputs((1, 5, 16, 8, 2, 4), seed=3, requires_grad=True)
    out = lt.kv_proj(*args, 2)
    assert rel_error(out.detach().numpy(), ref_of(args, 2)[0]) <= FLOAT32_TOLERANCE


def test_padded_views_work():
    b, s, d, r, h, dh = shape = (2, 6, 30, 10, 2, 5)
    hidden, w_down, w_up_k, w_up_v = torch_inputs(shape, seed=5)
    big = torch.randn(b, s + 2, d + 3)
    big[:, :s, :d] = hidden
    view = big[:, :s, :d]
    assert not view.is_contiguous()
    out = latentkv.kv_proj(view, w_down, w_up_k, w_up_v, h)
    assert rel_error(out.numpy(), ref_of((hidden, w_down, w_up_k, w_up_v), h)[0]) <= FLOAT32_TOLERANCE


def test_refusals():
    hidden, w_down, w_up_k, w_up_v = torch_inputs((1, 4, 16, 8, 2, 4), seed=6)
    with pytest.raises(TypeError, match="hidden has dtype float64"):
        latentkv.kv_proj(hidden.double(), w_down.double(), w_up_k.double(), w_up_v.double(), 2)
    with pytest.raises(TypeError, match="w_down has dtype float16 but hidden has float32"):
        latentkv.kv_proj(hidden, w_down.half(), w_up_k, w_up_v, 2)
    with pytest.raises(ValueError, match="w_up_k: the last dimension must be contiguous"):
        latentkv.kv_proj(hidden, w_down, w_up_k.t().contiguous().t(), w_up_v, 2)
    with pytest.raises(ValueError, match=r"w_down has shape \(15, 8\)"):
        latentkv.kv_proj(hidden, w_down[:15], w_up_k, w_up_v, 2)
    with pytest.raises(ValueError, match="num_heads = 3 must be positive and divide"):
        latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v, 3)
    with pytest.raises(TypeError, match="hidden: expected a numpy.ndarray or torch.Tensor"):
        latentkv.kv_proj(hidden.tolist(), w_down, w_up_k, w_up_v, 2)
    with pytest.raises(TypeError, match="w_up_v: expected a torch.Tensor like hidden, got ndarray"):
        latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v.numpy(), 2)
    with pytest.raises(TypeError, match="latent_out: expected a torch.Tensor like hidden, got list"):
        latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v, 2, latent_out=[])


@pytest.mark.parametrize("shape", [(0, 3, 8, 4, 2, 2), (2, 3, 0, 4, 2, 2), (2, 3, 8, 4, 1, 0)])
def test_zero_size(shape):
    b, s, d, r, h, dh = shape
    args = torch_inputs(shape, seed=7)
    latent = torch.full((b, s, r), float("nan"))
    out = latentkv.kv_proj(*args, h, latent_out=latent)
    ref, ref_latent = ref_of(args, h)
    assert out.shape == (2, b, s, h, dh)
    np.testing.assert_array_equal(out.numpy(), ref)
    assert rel_error(latent.numpy(), ref_latent) <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("op", ["kv_proj", "kv_proj_with_latent"])
def test_opcheck(op):
    args = torch_inputs((2, 5, 24, 8, 2, 4), seed=8)
    if op == "kv_proj":
        torch.library.opcheck(torch.ops.latentkv.kv_proj.default, (*args, 2))
    else:
        latent = torch.empty(2, 5, 8)
        torch.library.opcheck(torch.ops.latentkv.kv_proj_with_latent.default, (*args, 2, latent))


def graph_recorder():
    """A torch.compile backend that records the FX graphs it is given and runs them as they are."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend, graphs


def test_module_compiles_fullgraph_with_the_op_in_the_graph():
    torch.compiler.reset()
    module = lt.LatentKVProjection(32, 8, 2, 4)
    backend, graphs = graph_recorder()
    compiled = torch.compile(module, backend=backend, fullgraph=True)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        got = compiled(x)
        want = module(x)
    torch.testing.assert_close(got, want)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert "latentkv.kv_proj.default" in targets


class Wrapper(torch.nn.Module):
    """A model around LatentKVProjection, so it is also called as a submodule."""

    def __init__(self):
        super().__init__()
        self.kv = lt.LatentKVProjection(32, 8, 2, 4)

    def forward(self, x):
        return self.kv(x) * 2


def test_module_hooks_run():
    """Every kind of hook runs, in eager mode and in a fullgraph compile."""
    torch.manual_seed(10)
    model = Wrapper()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        plain = model.kv.forward(x)
        pre = model.kv.register_forward_pre_hook(lambda m, args: (args[0] * 0.5,))
        post = model.kv.register_forward_hook(lambda m, args, out: out + 1)
        want = (model.kv.forward(x * 0.5) + 1) * 2
        torch.testing.assert_close(model(x), want)
        backend, graphs = graph_recorder()
        torch.compiler.reset()
        torch.testing.assert_close(torch.compile(model, backend=backend, fullgraph=True)(x), want)
        assert len(graphs) == 1
        pre.remove()
        post.remove()
        seen = []
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, args, out: seen.append(type(m).__name__))
        try:
            torch.testing.assert_close(model.kv(x), plain)
        finally:
            handle.remove()
        assert seen == ["LatentKVProjection"]
    grads = []
    model.kv.register_full_backward_hook(lambda m, grad_in, grad_out: grads.append(grad_out))
    model(x.requires_grad_()).sum().backward()
    assert len(grads) == 1 and grads[0][0].shape == (2, 2, 5, 2, 4)


def test_module_hook_registered_after_torch_compile_runs():
    """As for any nn.Module, a hook registered after compiling the module runs (and stops when
    removed)."""
    torch.compiler.reset()
    module = lt.LatentKVProjection(32, 8, 2, 4)
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = compiled(x)
        handle = module.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
        assert torch.count_nonzero(compiled(x)) == 0
        handle.remove()
        torch.testing.assert_close(compiled(x), want)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace")
def test_module_call_respects_module_compile_jit_trace_and_fx():
    torch.manual_seed(11)
    model = Wrapper()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = model(x)
        traced = torch.jit.trace(model.kv, x)
        assert "latentkv::kv_proj" in str(traced.graph)
        torch.testing.assert_close(traced(x) * 2, want)
        # torch.fx patches nn.Module.__call__ to record leaf modules as call_module nodes.
        tracer = torch.fx.Tracer()
        tracer.is_leaf_module = lambda m, name: isinstance(m, lt.LatentKVProjection)
        graph = tracer.trace(model)
        ops = [n.op for n in graph.nodes]
        assert ops == ["placeholder", "call_module", "call_function", "output"]
        torch.compiler.reset()
        backend, graphs = graph_recorder()
        model.kv.compile(backend=backend, fullgraph=True)
        torch.testing.assert_close(model(x), want)
        assert len(graphs) == 1


def test_functional_with_latent_compiles_fullgraph():
    torch.compiler.reset()

    def f(x, wd, wk, wv, latent):
        return latentkv.kv_proj(x, wd, wk, wv, 2, latent_out=latent) * 2

    args = torch_inputs((1, 4, 16, 8, 2, 4), seed=9)
    latent = torch.zeros(1, 4, 8)
    latent_eager = torch.zeros(1, 4, 8)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(*args, latent)
    want = f(*args, latent_eager)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(latent, latent_eager)


def test_module_parameters_match_the_reference_module():
    ref = ReferenceKVProjection(64, 16, 4, 8)
    ours = lt.LatentKVProjection(64, 16, 4, 8)
    assert [(n, p.shape) for n, p in ref.named_parameters()] == [
        (n, p.shape) for n, p in ours.named_parameters()
    ]
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)


def test_same_seed_gives_the_same_weights():
    torch.manual_seed(1234)
    ref = ReferenceKVProjection(48, 12, 3, 8)
    torch.manual_seed(1234)
    ours = lt.LatentKVProjection(48, 12, 3, 8)
    for (name, a), (_, b) in zip(ref.state_dict().items(), ours.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("case", ["founding", "small"])
def test_module_forward_matches_the_reference_module(case):
    b, s, d, r, h, dh = cases.preset("seed") if case == "founding" else (2, 3, 20, 6, 2, 3)
    torch.manual_seed(5)
    ref = ReferenceKVProjection(d, r, h, dh)
    torch.manual_seed(5)
    ours = lt.LatentKVProjection(d, r, h, dh)
    x = torch.randn(b, s, d)
    with torch.no_grad():
        want64 = ReferenceKVProjection(d, r, h, dh).double()
        want64.load_state_dict(ref.state_dict())
        want = want64(x.double()).numpy()
        got = ours(x)
        assert rel_error(got.numpy(), want) <= FLOAT32_TOLERANCE
    with torch.inference_mode():
        assert rel_error(ours(x).numpy(), want) <= FLOAT32_TOLERANCE


def test_training_falls_back_to_differentiable_math():
    torch.manual_seed(6)
    ref = ReferenceKVProjection(24, 6, 2, 4)
    ours = lt.LatentKVProjection(24, 6, 2, 4)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 24)
    grad = torch.randn(2, 2, 3, 2, 4)
    ref(x).backward(grad)
    ours(x).backward(grad)
    for (name, a), (_, b) in zip(ref.named_parameters(), ours.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_training_with_an_empty_batch_matches_the_reference():
    ref = ReferenceKVProjection(24, 6, 2, 4)
    ours = lt.LatentKVProjection(24, 6, 2, 4)
    ours.load_state_dict(ref.state_dict())
    for shape in ((0, 3, 24), (2, 0, 24)):
        x = torch.randn(shape)
        want, got = ref(x), ours(x)
        assert got.shape == want.shape == (2, *shape[:2], 2, 4)


def test_module_repr_and_validation():
    assert "num_heads=4" in repr(lt.LatentKVProjection(8, 4, 4, 2))
    with pytest.raises(ValueError, match="rank = 0 must be positive"):
        lt.LatentKVProjection(8, 0, 4, 2)
    # bool is an int subclass, but True is not a head count; a float is not a size either.
    with pytest.raises(ValueError, match="num_heads = True must be an integer"):
        lt.LatentKVProjection(8, 4, True, 2)
    with pytest.raises(ValueError, match="head_dim = 2.0 must be an integer"):
        lt.LatentKVProjection(8, 4, 4, 2.0)


def test_module_forward_overrides_are_called():
    """A subclass's forward, or one set on the instance, is what a call runs."""

    class Doubled(lt.LatentKVProjection):
        def forward(self, x):
            return 2 * super().forward(x)

    module = Doubled(24, 8, 2, 4).eval()
    x = torch.randn(3, 2, 24)
    with torch.no_grad():
        plain = lt.reference_kv_proj(x, module.w_down, module.w_up_k, module.w_up_v, 2)
        assert torch.allclose(module(x), 2 * plain, rtol=1e-5, atol=1e-6)
        base = lt.LatentKVProjection(24, 8, 2, 4).eval()
        base.forward = lambda t: torch.zeros(1)
        assert torch.equal(base(x), torch.zeros(1))
        del base.forward
        assert base(x).shape == (2, 3, 2, 2, 4)


def test_module_under_dispatch_modes_goes_through_the_op():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    module = lt.LatentKVProjection(24, 8, 2, 4).eval()
    x = torch.randn(3, 2, 24)
    with torch.no_grad():
        graph = make_fx(lambda t: module(t))(x)
    assert any(n.target is torch.ops.latentkv.kv_proj.default for n in graph.graph.nodes)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad():
        fake = module(mode.from_tensor(x))
    assert fake.shape == (2, 3, 2, 2, 4)


class OpRecorder(TorchDispatchMode):
    """Records the ops that reach the dispatcher's Python mode (latentkv's op, matmuls, ...)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_module_runs_the_op_without_autograd_and_the_reference_with_it():
    module = lt.LatentKVProjection(24, 8, 2, 4)
    x = torch.randn(3, 2, 24)
    want = lt.reference_kv_proj(x, module.w_down, module.w_up_k, module.w_up_v, 2).detach()
    for context in (torch.no_grad, torch.inference_mode):
        with context(), OpRecorder() as seen:
            got = module(x)
        assert seen.ops == [torch.ops.latentkv.kv_proj.default]
        assert not got.requires_grad and torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    frozen = lt.LatentKVProjection(24, 8, 2, 4).requires_grad_(False)
    with OpRecorder() as seen:
        frozen(x)
    assert seen.ops == [torch.ops.latentkv.kv_proj.default]
    with OpRecorder() as seen:
        got = module(x)
    assert torch.ops.latentkv.kv_proj.default not in seen.ops
    assert torch.ops.aten.mm.default in seen.ops or torch.ops.aten.bmm.default in seen.ops
    assert got.requires_grad and torch.allclose(got.detach(), want, rtol=1e-5, atol=1e-6)


def test_kv_proj_on_torch_tensors_runs_the_op():
    hidden, w_down, w_up_k, w_up_v = torch_inputs((2, 3, 8, 4, 2, 2), seed=12)
    latent = torch.empty(2, 3, 4)
    with OpRecorder() as seen:
        latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v, 2)
        latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v, 2, latent_out=latent)
        lt.kv_proj(hidden, w_down, w_up_k, w_up_v, 2)
    assert seen.ops == [torch.ops.latentkv.kv_proj.default,
                        torch.ops.latentkv.kv_proj_with_latent.default,
                        torch.ops.latentkv.kv_proj.default]


def test_module_compiles_fullgraph_with_inductor_on_cpu():
    """The default backend: inductor calls the op's CPU kernel from its generated code."""
    torch.compiler.reset()
    module = Wrapper()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = module(x)
        compiled = torch.compile(module, fullgraph=True)
        torch.testing.assert_close(compiled(x), want)
        x2 = torch.randn(2, 5, 32)
        torch.testing.assert_close(compiled(x2), module(x2))


def test_torch_kv_proj_names_the_argument_that_is_not_a_tensor():
    """latentkv.torch.kv_proj goes through the dispatcher, whose refusals of non-tensors
    (RuntimeError, or NotImplementedError when no argument is a tensor) become TypeErrors that
    name the argument."""
    hidden, w_down, w_up_k, w_up_v = torch_inputs((2, 3, 8, 4, 2, 2), seed=4)
    with pytest.raises(TypeError, match="hidden: expected a torch.Tensor, got ndarray"):
        lt.kv_proj(hidden.numpy(), w_down, w_up_k, w_up_v, 2)
    with pytest.raises(TypeError, match="hidden: expected a torch.Tensor, got ndarray"):
        lt.kv_proj(*(t.numpy() for t in (hidden, w_down, w_up_k, w_up_v)), 2)
    with pytest.raises(TypeError, match="w_up_k: expected a torch.Tensor like hidden, got list"):
        lt.kv_proj(hidden, w_down, [1.0], w_up_v, 2)


LOW_PRECISION = {"bfloat16": torch.bfloat16, "float16": torch.float16}
HALF_SHAPES = (cases.params("edge", "cpu-cheap")[:12]
               + [pytest.param(cases.preset(n), id=n) for n in ("seed", "deepseek-v2-lite")])


@pytest.mark.parametrize("dtype", list(LOW_PRECISION))
@pytest.mark.parametrize("shape", HALF_SHAPES)
def test_low_precision_within_twice_the_unfused_error(shape, dtype):
    """design.md: bf16/fp16 within 2x of the error of the unfused same-precision computation (torch's
    own bf16 / fp16 matmuls on the CPU) against the float64 reference; kv_proj, the registered op
    and the latent output."""
    b, s, d, r, h, dh = shape
    args = [t.to(LOW_PRECISION[dtype]) for t in torch_inputs(shape, seed=11)]
    ref_out, ref_latent, budget, latent_budget = unfused_budgets(args, h)
    latent = torch.full((b, s, r), float("nan"), dtype=LOW_PRECISION[dtype])
    out = latentkv.kv_proj(*args, h, latent_out=latent)
    op_out = torch.ops.latentkv.kv_proj(*args, h)
    assert out.dtype == LOW_PRECISION[dtype] and out.shape == (2, b, s, h, dh)
    assert rel_error(out.float().numpy(), ref_out) <= budget
    assert rel_error(op_out.float().numpy(), ref_out) <= budget
    assert rel_error(latent.float().numpy(), ref_latent) <= latent_budget


def _ops_seen(module, x):
    """The module's output and the names of the aten / latentkv ops its forward dispatched."""
    seen = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Ops():
        got = module(x)
    return got, seen


@pytest.mark.parametrize("tokens", [(1, 1), (2, 3), (1, 7), (4, 6), (1, 24), (1, 25), (5, 5)])
def test_module_in_bfloat16_on_cpu_takes_the_op_at_few_tokens(tokens):
    # bf16 on the CPU: the op up to 24 tokens where cpu-blocked's products run on AVX512-BF16
    # (faster than torch's bf16 GEMMs there, docs/perf.md), within 2x the reference module's own
    # error against float64; past 24 tokens, or without AVX512-BF16, exactly the reference
    # module's math.
    torch.manual_seed(3)
    module = lt.LatentKVProjection(32, 8, 2, 4).to(torch.bfloat16)
    x = torch.randn(*tokens, 32).to(torch.bfloat16)
    got, seen = _ops_seen(module, x)
    want = lt.reference_kv_proj(x, module.w_down, module.w_up_k, module.w_up_v, 2)
    assert got.dtype == torch.bfloat16
    fused = (tokens[0] * tokens[1] <= latentkv._C.cpu_split_tokens("bfloat16")
             and latentkv._C.cpu_bf16_isa() == "avx512-bf16")
    assert any("latentkv" in name for name in seen) == fused, seen
    if not fused:
        assert torch.equal(got, want)
        return
    params = (x, module.w_down, module.w_up_k, module.w_up_v)
    ref = reference(*(t.detach().float().numpy() for t in params), 2)[0]
    budget = 2 * rel_error(want.detach().float().numpy(), ref) + 1e-7
    assert rel_error(got.float().numpy(), ref) <= budget


def test_cpu_bf16_isa_names_the_products():
    assert latentkv._C.cpu_bf16_isa() in ("avx512-bf16", "avx2")


def test_cpu_split_tokens_are_the_bounds_the_parametrization_straddles():
    # The parametrization above holds calls of 24 and 25 tokens: the bf16 bound the library
    # reports on AVX512-BF16; every other case splits up to one register tile (6 tokens).
    dot = latentkv._C.cpu_bf16_isa() == "avx512-bf16"
    assert latentkv._C.cpu_split_tokens("bfloat16") == (24 if dot else 6)
    assert latentkv._C.cpu_split_tokens("float32") == 6
    assert latentkv._C.cpu_split_tokens("float16") == 6
    with pytest.raises(ValueError, match="dtype = 'int8'"):
        latentkv._C.cpu_split_tokens("int8")


@pytest.mark.parametrize("dtype", [torch.float16])
def test_module_in_half_precision_on_cpu_runs_the_op(dtype):
    # Without autograd, an fp16 module on the CPU runs the fused op (cpu-blocked takes every
    # dtype), within 2x the error of the reference module's own math against float64.
    torch.manual_seed(3)
    module = lt.LatentKVProjection(32, 8, 2, 4).to(dtype)
    x = torch.randn(2, 5, 32).to(dtype)
    got, seen = _ops_seen(module, x)
    assert got.dtype == dtype
    assert any("latentkv" in name for name in seen), seen
    want = lt.reference_kv_proj(x, module.w_down, module.w_up_k, module.w_up_v, 2)
    params = (x, module.w_down, module.w_up_k, module.w_up_v)
    ref = reference(*(t.detach().float().numpy() for t in params), 2)[0]
    assert rel_error(got.float().numpy(), ref) <= 2 * rel_error(want.detach().float().numpy(), ref) + 1e-7
