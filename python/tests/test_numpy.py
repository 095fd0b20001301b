"""latentkv.kv_proj and the binding on numpy arrays (CPU backend): results against the float64
reference, every output element written, padded and refused layouts, dtype and shape refusals with
latentkv's messages, zero-size inputs. Needs numpy only: this is what CI runs without torch."""

import threading

import numpy as np
import pytest

import latentkv
from latentkv import _C
import cases
from reference import FLOAT32_TOLERANCE, random_inputs, reference, rel_error

# The cheap edge shapes and the first random shapes of the one case list (tests/common/cases.h).
SHAPES = cases.params("edge", "cpu-cheap") + cases.params("random", count=12)


def inputs(shape, seed=0, dtype=np.float32):
    return random_inputs(np.random.default_rng(seed), *shape, dtype=dtype)


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference(shape):
    b, s, d, r, h, dh = shape
    hidden, w_down, w_up_k, w_up_v = inputs(shape)
    out = latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v, h)
    assert type(out) is np.ndarray and out.dtype == np.float32 and out.shape == (2, b, s, h, dh)
    assert out.flags.c_contiguous
    ref, _ = reference(hidden, w_down, w_up_k, w_up_v, h)
    assert rel_error(out, ref) <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("shape", cases.params("edge", "cpu-cheap") + cases.params("preset", "cpu-cheap"))
def test_poisoned_outputs_are_all_written(shape):
    b, s, d, r, h, dh = shape
    hidden, w_down, w_up_k, w_up_v = inputs(shape, seed=1)
    out = np.full((2, b, s, h, dh), np.nan, np.float32)
    latent = np.full((b, s, r), np.nan, np.float32)
    assert _C.kv_proj(hidden, w_down, w_up_k, w_up_v, out, latent) == 1
    ref, ref_latent = reference(hidden, w_down, w_up_k, w_up_v, h)
    assert rel_error(out, ref) <= FLOAT32_TOLERANCE
    assert rel_error(latent, ref_latent) <= FLOAT32_TOLERANCE


def test_latent_out_keyword():
    shape = (2, 9, 40, 12, 2, 6)
    hidden, w_down, w_up_k, w_up_v = inputs(shape, seed=2)
    latent = np.full((2, 9, 12), np.nan, np.float32)
    out = latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v, 2, latent_out=latent)
    ref, ref_latent = reference(hidden, w_down, w_up_k, w_up_v, 2)
    assert rel_error(out, ref) <= FLOAT32_TOLERANCE
    assert rel_error(latent, ref_latent) <= FLOAT32_TOLERANCE


def test_padded_inputs_and_outputs():
    """Views into larger arrays: padded outer strides work, and padding is never written."""
    b, s, d, r, h, dh = shape = (3, 10, 70, 20, 3, 8)
    rng = np.random.default_rng(3)
    hidden, w_down, w_up_k, w_up_v = inputs(shape, seed=3)
    big = rng.standard_normal((b + 1, s + 3, d + 5)).astype(np.float32)
    big[:b, :s, :d] = hidden
    hidden_view = big[:b, :s, :d]
    w_down_big = np.zeros((d, r + 4), np.float32)
    w_down_big[:, :r] = w_down
    out_big = np.full((2, b, s + 1, h, dh + 3), np.nan, np.float32)
    latent_big = np.full((b, s, r + 2), np.nan, np.float32)
    out = out_big[:, :, :s, :, :dh]
    latent = latent_big[:, :, :r]
    assert not hidden_view.flags.c_contiguous and not out.flags.c_contiguous
    assert _C.kv_proj(hidden_view, w_down_big[:, :r], w_up_k, w_up_v, out, latent) == 1
    ref, ref_latent = reference(hidden, w_down, w_up_k, w_up_v, h)
    assert rel_error(out, ref) <= FLOAT32_TOLERANCE
    assert rel_error(latent, ref_latent) <= FLOAT32_TOLERANCE
    assert np.isnan(out_big[:, :, s:]).all() and np.isnan(out_big[..., dh:]).all()
    assert np.isnan(latent_big[..., r:]).all()
    # and through kv_proj, whose output is fresh and packed
    ref_out = latentkv.kv_proj(hidden_view, w_down_big[:, :r], w_up_k, w_up_v, h)
    assert rel_error(ref_out, ref) <= FLOAT32_TOLERANCE


def test_read_only_inputs_work():
    hidden, w_down, w_up_k, w_up_v = inputs((1, 4, 16, 8, 2, 4), seed=5)
    for a in (hidden, w_down, w_up_k, w_up_v):
        a.flags.writeable = False
    out = latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v, 2)
    assert rel_error(out, reference(hidden, w_down, w_up_k, w_up_v, 2)[0]) <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("which", ["hidden", "w_down", "w_up_k", "w_up_v"])
def test_non_contiguous_last_dimension_is_refused(which):
    args = dict(zip(("hidden", "w_down", "w_up_k", "w_up_v"), inputs((2, 4, 16, 8, 2, 4), seed=6)))
    a = args[which]
    args[which] = np.asfortranarray(a) if a.ndim == 2 else np.ascontiguousarray(
        a.transpose(0, 2, 1)).transpose(0, 2, 1)
    assert args[which].strides[-1] != 4
    with pytest.raises(ValueError, match=f"{which}: the last dimension must be contiguous"):
        latentkv.kv_proj(**args, num_heads=2)


def test_negative_stride_gets_the_cpp_message():
    hidden, w_down, w_up_k, w_up_v = inputs((2, 4, 16, 8, 2, 4), seed=7)
    with pytest.raises(ValueError, match=r"invalid argument: args.hidden_stride_seq = -16 is negative"):
        latentkv.kv_proj(hidden[:, ::-1], w_down, w_up_k, w_up_v, 2)


def test_broadcast_rows_get_the_cpp_message():
    hidden, w_down, w_up_k, w_up_v = inputs((2, 4, 16, 8, 2, 4), seed=8)
    broadcast = np.broadcast_to(hidden[:1], hidden.shape)
    with pytest.raises(ValueError, match=r"args.hidden_stride_batch = 0 for hidden .* rows would overlap"):
        latentkv.kv_proj(broadcast, w_down, w_up_k, w_up_v, 2)


def test_output_aliasing_an_input_gets_the_cpp_message():
    b, s, d, r, h, dh = 1, 2, 8, 4, 2, 2
    hidden, w_down, w_up_k, w_up_v = inputs((b, s, d, r, h, dh), seed=9)
    buffer = np.zeros(64, np.float32)
    hidden_alias = buffer[: b * s * d].reshape(b, s, d)
    hidden_alias[...] = hidden
    out = buffer[8 : 8 + 2 * b * s * h * dh].reshape(2, b, s, h, dh)
    before = buffer.copy()
    with pytest.raises(ValueError, match="args.out overlaps args.hidden in memory"):
        _C.kv_proj(hidden_alias, w_down, w_up_k, w_up_v, out)
    np.testing.assert_array_equal(buffer, before)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64, np.complex64, np.bool_, np.uint8])
def test_unsupported_dtype_is_type_error(dtype):
    hidden, w_down, w_up_k, w_up_v = inputs((1, 3, 8, 4, 2, 2), seed=10)
    with pytest.raises(TypeError, match="hidden has dtype .*; latentkv takes float32, bfloat16 or float16"):
        latentkv.kv_proj(hidden.astype(dtype), w_down.astype(dtype), w_up_k.astype(dtype),
                         w_up_v.astype(dtype), 2)


def test_mixed_dtypes_are_type_error():
    hidden, w_down, w_up_k, w_up_v = inputs((1, 3, 8, 4, 2, 2), seed=11)
    with pytest.raises(TypeError, match="w_up_v has dtype float16 but hidden has float32"):
        latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v.astype(np.float16), 2)


@pytest.mark.parametrize("shape", cases.params("edge", "cpu-cheap")[:8] + [cases.preset("seed")])
def test_float16_within_twice_the_unfused_error(shape):
    """numpy float16 runs on the CPU backend (cpu-blocked): out and latent within 2x the error of
    the unfused float16 computation (float32 sums, the latent and each output rounded to float16)
    against the float64 reference; every element of the NaN-poisoned latent written."""
    b, s, d, r, h, dh = shape
    args = [a.astype(np.float16) for a in inputs(shape, seed=12)]
    ref_out, ref_latent = reference(*args, h)
    f32 = [a.astype(np.float32) for a in args]
    unfused_latent = (f32[0] @ f32[1]).astype(np.float16)
    unfused = np.stack([(unfused_latent.astype(np.float32) @ w).astype(np.float16) for w in f32[2:]])
    latent = np.full((b, s, r), np.nan, np.float16)
    out = latentkv.kv_proj(*args, h, latent_out=latent)
    assert out.dtype == np.float16 and out.shape == (2, b, s, h, dh)
    budget = 2 * rel_error(unfused.reshape(ref_out.shape), ref_out) + 1e-7
    assert rel_error(out.astype(np.float32), ref_out) <= budget
    assert not np.isnan(latent).any()
    assert rel_error(latent.astype(np.float32), ref_latent) <= 2 * rel_error(unfused_latent, ref_latent) + 1e-7


SHAPE_ERRORS = [
    # (hidden, w_down, w_up_k, w_up_v, num_heads), message
    (((2, 3, 8), (7, 4), (4, 6), (4, 6), 2), r"w_down has shape \(7, 4\), expected \(D, R\) with D = 8"),
    (((2, 3, 8), (8, 4), (5, 6), (5, 6), 2), r"w_up_k has shape \(5, 6\), expected \(R, H\*Dh\) with R = 4"),
    (((2, 3, 8), (8, 4), (4, 6), (4, 8), 2), r"w_up_v has shape \(4, 8\), expected the shape of w_up_k \(4, 6\)"),
    (((2, 3, 8), (8, 4), (4, 6), (4, 6), 4), r"num_heads = 4 must be positive and divide the width of w_up_k, 6"),
    (((2, 3, 8), (8, 4), (4, 6), (4, 6), 0), r"num_heads = 0 must be positive"),
    (((2, 3, 8), (8, 4), (4, 6), (4, 6), -3), r"num_heads = -3 must be positive"),
    (((6, 8), (8, 4), (4, 6), (4, 6), 2), r"hidden must be 3-D \(B, S, D\), got shape \(6, 8\)"),
    (((2, 3, 8), (8, 4, 1), (4, 6), (4, 6), 2), r"w_down must be 2-D \(D, R\), got shape \(8, 4, 1\)"),
    (((2, 3, 8), (8, 4), (4, 6, 1), (4, 6), 2), r"w_up_k must be 2-D \(R, H\*Dh\), got shape \(4, 6, 1\)"),
    (((2, 3, 8), (8, 4), (4, 6), (24,), 2), r"w_up_v must be 2-D \(R, H\*Dh\), got shape \(24,\)"),
]


@pytest.mark.parametrize("shapes,message", SHAPE_ERRORS)
def test_mismatched_shapes_are_value_error(shapes, message):
    *arrays, heads = shapes
    rng = np.random.default_rng(13)
    args = [rng.standard_normal(s).astype(np.float32) for s in arrays]
    with pytest.raises(ValueError, match=message):
        latentkv.kv_proj(*args, heads)


def test_wrong_output_shapes_through_the_binding():
    hidden, w_down, w_up_k, w_up_v = inputs((2, 3, 8, 4, 2, 3), seed=14)
    out = np.full((2, 2, 3, 2, 3), 7.0, np.float32)
    with pytest.raises(ValueError, match=r"out has shape \(2, 2, 3, 3, 3\), expected \(2, 2, 3, H, Dh\) with H\*Dh = 6"):
        _C.kv_proj(hidden, w_down, w_up_k, w_up_v, np.zeros((2, 2, 3, 3, 3), np.float32))
    with pytest.raises(ValueError, match=r"latent_out has shape \(2, 3, 5\), expected \(B, S, R\) = \(2, 3, 4\)"):
        _C.kv_proj(hidden, w_down, w_up_k, w_up_v, out, np.zeros((2, 3, 5), np.float32))
    assert (out == 7.0).all()
    with pytest.raises(ValueError, match=r"out must be 5-D \(2, B, S, H, Dh\), got shape \(2, 2, 3, 6\)"):
        _C.kv_proj(hidden, w_down, w_up_k, w_up_v, np.zeros((2, 2, 3, 6), np.float32))


def test_read_only_latent_out_is_refused():
    hidden, w_down, w_up_k, w_up_v = inputs((1, 3, 8, 4, 2, 2), seed=15)
    latent = np.zeros((1, 3, 4), np.float32)
    latent.flags.writeable = False
    with pytest.raises(ValueError, match="latent_out is read-only"):
        latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v, 2, latent_out=latent)


@pytest.mark.parametrize("bad", [[[[1.0]]], None, "hidden", 3.0])
def test_non_arrays_are_type_error(bad):
    _, w_down, w_up_k, w_up_v = inputs((1, 1, 1, 1, 1, 1))
    with pytest.raises(TypeError, match="hidden: expected a numpy.ndarray or torch.Tensor"):
        latentkv.kv_proj(bad, w_down, w_up_k, w_up_v, 1)
    hidden = np.zeros((1, 1, 1), np.float32)
    with pytest.raises(TypeError, match="w_down: expected an array"):
        latentkv.kv_proj(hidden, bad, w_up_k, w_up_v, 1)
    with pytest.raises(TypeError):
        latentkv.kv_proj(hidden, w_down, bad, w_up_v, 1)


def test_num_heads_must_be_an_integer():
    args = inputs((1, 2, 4, 2, 2, 2))
    with pytest.raises(TypeError):
        latentkv.kv_proj(*args, 2.0)
    out = latentkv.kv_proj(*args, np.int64(2))
    assert out.shape == (2, 1, 2, 2, 2)


@pytest.mark.parametrize("shape", [
    (0, 3, 8, 4, 2, 2), (2, 0, 8, 4, 2, 2), (2, 3, 0, 4, 2, 2), (2, 3, 8, 0, 2, 2), (2, 3, 8, 4, 1, 0),
    (0, 0, 0, 0, 1, 0),
], ids=lambda s: "x".join(map(str, s)))
def test_zero_size_gives_the_unfused_result(shape):
    """Zero B or S: an empty result; zero D or R: all zeros (an empty sum), as numpy's matmul gives;
    latent_out likewise, and still hidden @ w_down when only H*Dh is zero."""
    b, s, d, r, h, dh = shape
    hidden, w_down, w_up_k, w_up_v = inputs(shape, seed=16)
    latent = np.full((b, s, r), np.nan, np.float32)
    out = latentkv.kv_proj(hidden, w_down, w_up_k, w_up_v, h, latent_out=latent)
    ref, ref_latent = reference(hidden, w_down, w_up_k, w_up_v, h)
    assert out.shape == ref.shape == (2, b, s, h, dh)
    np.testing.assert_array_equal(out, ref)
    assert latent.shape == ref_latent.shape
    assert rel_error(latent, ref_latent) <= FLOAT32_TOLERANCE  # non-trivial when only H*Dh = 0


def test_zero_size_still_checks_dtypes_and_shapes():
    with pytest.raises(TypeError, match="float64"):
        latentkv.kv_proj(np.zeros((0, 3, 8)), np.zeros((8, 4)), np.zeros((4, 6)), np.zeros((4, 6)), 2)
    with pytest.raises(ValueError, match="w_down has shape"):
        latentkv.kv_proj(*(np.zeros(s, np.float32) for s in ((0, 3, 8), (9, 4), (4, 6), (4, 6))), 2)


def test_noop_checks_like_kv_proj_but_writes_nothing():
    hidden, w_down, w_up_k, w_up_v = inputs((2, 5, 16, 8, 2, 4), seed=17)
    out = np.full((2, 2, 5, 2, 4), np.nan, np.float32)
    assert _C._noop(hidden, w_down, w_up_k, w_up_v, out) == 1
    assert np.isnan(out).all()
    with pytest.raises(TypeError):
        _C._noop(hidden.astype(np.float64), w_down, w_up_k, w_up_v, out)


def test_concurrent_calls_from_threads():
    """run() is called with the GIL released; calls from several threads must not interfere."""
    shapes = [(2, 20 + i, 64 + i, 16, 2, 8) for i in range(4)]
    cases = [(inputs(s, seed=20 + i), s) for i, s in enumerate(shapes)]
    errors = []

    def work(args, shape):
        for _ in range(20):
            out = latentkv.kv_proj(*args, shape[4])
            errors.append(rel_error(out, reference(*args, shape[4])[0]))

    threads = [threading.Thread(target=work, args=case) for case in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 80 and max(errors) <= FLOAT32_TOLERANCE


def test_workspace_argument_is_checked():
    """A workspace (scratch for GPU strategies) is accepted and validated on any backend."""
    hidden, w_down, w_up_k, w_up_v = inputs((1, 3, 8, 4, 2, 2), seed=18)
    out = np.empty((2, 1, 3, 2, 2), np.float32)
    assert _C.workspace_size(hidden, w_down, w_up_k, w_up_v, out) == 0  # the CPU backend needs none
    assert _C.kv_proj(hidden, w_down, w_up_k, w_up_v, out, None, None, np.empty(64, np.uint8)) == 1
    assert rel_error(out, reference(hidden, w_down, w_up_k, w_up_v, 2)[0]) <= FLOAT32_TOLERANCE
    with pytest.raises(ValueError, match=r"workspace must be 1-D \(bytes,\), got shape \(8, 8\)"):
        _C.kv_proj(hidden, w_down, w_up_k, w_up_v, out, None, None, np.empty((8, 8), np.uint8))
    with pytest.raises(ValueError, match="workspace must be contiguous"):
        _C.kv_proj(hidden, w_down, w_up_k, w_up_v, out, None, None, np.empty(64, np.uint8)[::2])
    with pytest.raises(ValueError, match="args.workspace overlaps args.out"):
        _C.kv_proj(hidden, w_down, w_up_k, w_up_v, out, None, None, out.reshape(-1))


def test_cuda_available_is_a_bool():
    assert isinstance(latentkv.cuda_available(), bool)
