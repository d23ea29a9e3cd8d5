"""Softmax, log-softmax and layer norm (tessera.compiler.cpu.softmax / .norm) against
float64 numpy references and onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.compiler.cpu.kernel import TensorSpec
from tessera.compiler.cpu.norm import layer_norm
from tessera.compiler.cpu.softmax import log_softmax, softmax
from tessera.errors import CpuKernelError
from tessera.runtime.cpu import load_kernel

RNG = np.random.default_rng(99)


def spec(a: np.ndarray) -> TensorSpec:
    return TensorSpec(a.shape, a.dtype.name)


def softmax64(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def log_softmax64(x, axis):
    x = x.astype(np.float64)
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def ort_run(node, inputs, outputs, feeds, opset, initializers=()):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    def info(name, a):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, a.shape)
    graph = helper.make_graph([node], "g", [info(n, feeds[n]) for n in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in outputs], initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: feeds[n] for n in inputs})


# -- softmax


@pytest.mark.parametrize("shape, axis", [
    ((1, 1000), -1), ((4, 7, 33), -1), ((4, 7, 33), 1), ((4, 7, 33), 0),
    ((2, 16, 20, 20), 1),          # axis with 400 trailing lanes: one full block + a rest
    ((5,), 0), ((3, 1), 1), ((2, 3, 1, 4), 2),
])
def test_softmax_and_log_softmax_match_float64(shape, axis):
    x = (RNG.standard_normal(shape) * 6).astype(np.float32)
    (got,) = load_kernel(softmax(spec(x), axis))(x)
    np.testing.assert_allclose(got, softmax64(x, axis), rtol=2e-6, atol=1e-9)
    (got,) = load_kernel(log_softmax(spec(x), axis))(x)
    np.testing.assert_allclose(got, log_softmax64(x, axis), rtol=2e-6, atol=2e-6)


def test_softmax_is_stable_for_large_logits_and_handles_inf():
    x = np.array([[1e4, 1e4 - 1, -1e4, 0.0],
                  [-np.inf, 0.0, -np.inf, 0.0],
                  [np.inf, 0.0, 1.0, 2.0],
                  [np.nan, 0.0, 1.0, 2.0]], np.float32)
    (got,) = load_kernel(softmax(spec(x)))(x)
    e = np.exp(np.float64(-1))
    np.testing.assert_allclose(got[0], [1 / (1 + e), e / (1 + e), 0, 0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], [0, 0.5, 0, 0.5])
    assert np.isnan(got[2:]).all()       # numpy and onnxruntime give NaN too
    (got,) = load_kernel(log_softmax(spec(x)))(x)
    np.testing.assert_allclose(got[0, :2], np.log([1 / (1 + e), e / (1 + e)]), rtol=1e-6)
    np.testing.assert_allclose(got[0, 2], -2e4 - np.log1p(e), rtol=1e-7)


@pytest.mark.parametrize("shape, axis", [((2, 10, 5, 5), 1), ((3, 1000), -1)])
def test_softmax_matches_onnxruntime(shape, axis):
    from onnx import helper
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    for op, build in (("Softmax", softmax), ("LogSoftmax", log_softmax)):
        (want,) = ort_run(helper.make_node(op, ["x"], ["y"], axis=axis), ["x"], ["y"],
                          {"x": x}, opset=13)
        (got,) = load_kernel(build(spec(x), axis))(x)
        np.testing.assert_allclose(got, want, rtol=3e-6, atol=3e-6)


def test_softmax_rejects_bad_arguments():
    with pytest.raises(CpuKernelError, match="float32"):
        softmax(TensorSpec((2, 3), "int8"))
    with pytest.raises(CpuKernelError, match="out of range"):
        softmax(TensorSpec((2, 3), "float32"), axis=2)


@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 12), min_size=1, max_size=4), data=st.data(),
       seed=st.integers(0, 2**32 - 1))
def test_random_softmax_shapes(shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = (np.random.default_rng(seed).standard_normal(shape) * 10).astype(np.float32)
    (got,) = load_kernel(softmax(spec(x), axis))(x)
    np.testing.assert_allclose(got, softmax64(x, axis), rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(got.sum(axis), 1.0, rtol=1e-5)


# -- layer norm


def layer_norm64(x, scale, bias, axis, eps):
    axes = tuple(range(axis % x.ndim, x.ndim))
    x = x.astype(np.float64)
    mean = x.mean(axes, keepdims=True)
    inv = 1 / np.sqrt(x.var(axes, keepdims=True) + eps)
    return (x - mean) * inv * scale + (0 if bias is None else bias), mean, inv


@pytest.mark.parametrize("shape, axis, with_bias", [
    ((1, 197, 768), -1, True), ((2, 3, 4, 5), 1, True), ((2, 3, 4, 5), -2, False),
    ((8, 1), -1, True), ((3, 64), 0, True),
])
def test_layer_norm_matches_float64(shape, axis, with_bias):
    x = (RNG.standard_normal(shape) * 3 + 2).astype(np.float32)
    norm = shape[axis % len(shape):]
    scale = RNG.standard_normal(norm).astype(np.float32)
    bias = RNG.standard_normal(norm).astype(np.float32) if with_bias else None
    kernel = load_kernel(layer_norm(spec(x), spec(scale), spec(bias) if with_bias else None,
                                    axis=axis, epsilon=1e-5, stats=True))
    y, mean, inv = kernel(x, scale, *([bias] if with_bias else []))
    want, want_mean, want_inv = layer_norm64(x, scale, bias, axis, 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inv, want_inv, rtol=1e-5)


def test_layer_norm_constant_rows_use_epsilon():
    x = np.full((2, 16), 3.0, np.float32)
    one = np.ones(16, np.float32)
    (y,) = load_kernel(layer_norm(spec(x), spec(one), None, epsilon=0.25))(x, one)
    np.testing.assert_array_equal(y, np.zeros_like(x))


def test_layer_norm_scalar_scale_and_bias():
    x = RNG.standard_normal((4, 10)).astype(np.float32)
    s, b = np.float32([2.0]), np.float32([-1.0])
    (y,) = load_kernel(layer_norm(spec(x), spec(s), spec(b)))(x, s, b)
    want, _, _ = layer_norm64(x, 2.0, -1.0, -1, 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_layer_norm_matches_onnxruntime():
    from onnx import helper, numpy_helper
    x = (RNG.standard_normal((2, 50, 96)) * 2 - 1).astype(np.float32)
    scale = RNG.standard_normal(96).astype(np.float32)
    bias = RNG.standard_normal(96).astype(np.float32)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1,
                            epsilon=1e-5)
    (want,) = ort_run(node, ["x"], ["y"], {"x": x}, opset=17,
                      initializers=[numpy_helper.from_array(scale, "s"),
                                    numpy_helper.from_array(bias, "b")])
    (got,) = load_kernel(layer_norm(spec(x), spec(scale), spec(bias)))(x, scale, bias)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layer_norm_rejects_bad_arguments():
    x = TensorSpec((2, 8), "float32")
    with pytest.raises(CpuKernelError, match="must be \\(8,\\) or a single element"):
        layer_norm(x, TensorSpec((4,), "float32"))
    with pytest.raises(CpuKernelError, match="float32"):
        layer_norm(TensorSpec((2, 8), "int8"), TensorSpec((8,), "float32"))
    with pytest.raises(CpuKernelError, match="out of range"):
        layer_norm(x, TensorSpec((8,), "float32"), axis=3)
