"""Pooling kernels (tessera.compiler.cpu.pool) against a numpy reference and
onnxruntime (one-node MaxPool / AveragePool models)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view

from tessera.compiler.cpu.kernel import TensorSpec
from tessera.compiler.cpu.pool import (build_average_pool, build_global_average_pool,
                                       build_global_max_pool, build_max_pool)
from tessera.errors import CpuKernelError
from tessera.runtime.cpu import load_kernel

RNG = np.random.default_rng(5)


def data(shape, dtype):
    if dtype == "float32":
        return RNG.standard_normal(shape).astype(np.float32)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    return RNG.integers(lo, hi, shape).astype(dtype)


def run(kernel, x):
    (out,) = load_kernel(kernel)(x)
    return out


def reference_pool(x, kind, kernel, strides, pads, dilations, count_include_pad=0):
    """float64 pooling over windows; padding is NaN so it never counts (except in the
    average's divisor with count_include_pad). 8-bit means round half to even."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])),
                constant_values=np.nan)
    win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]
    if kind == "max":
        out = np.nanmax(win, axis=(-2, -1))
    else:
        count = kh * kw if count_include_pad else np.sum(~np.isnan(win), axis=(-2, -1))
        out = np.nansum(win, axis=(-2, -1)) / count
        if x.dtype != np.float32:
            out = np.rint(out)
    return out.astype(x.dtype)


def check_pool(x, kind, kernel, strides, pads, dilations, count_include_pad=0):
    s = TensorSpec(x.shape, x.dtype.name)
    if kind == "max":
        k = build_max_pool(s, kernel, strides, pads, dilations)
    else:
        k = build_average_pool(s, kernel, strides, pads, dilations, count_include_pad)
    got = run(k, x)
    want = reference_pool(x, kind, kernel, strides, pads, dilations, count_include_pad)
    assert got.shape == want.shape and got.dtype == want.dtype
    if x.dtype == np.float32 and kind == "avg":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("kind", ["max", "avg0", "avg1"])
@pytest.mark.parametrize("shape, kernel, strides, pads, dilations", [
    ((1, 8, 112, 112), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),   # ResNet stem pool
    ((1, 4, 13, 11), (2, 3), (1, 2), (0, 2, 1, 0), (1, 1)),
    ((2, 3, 9, 9), (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),       # dilated, wide pads
    ((1, 2, 7, 7), (7, 7), (1, 1), (0, 0, 0, 0), (1, 1)),       # one window per plane
])
def test_pool_matches_reference(shape, kernel, strides, pads, dilations, kind, dtype):
    check_pool(data(shape, dtype), kind[:3], kernel, strides, pads, dilations,
               count_include_pad=int(kind == "avg1"))


@settings(max_examples=30, deadline=None)
@given(h=st.integers(1, 12), w=st.integers(1, 12), kh=st.integers(1, 4),
       kw=st.integers(1, 4), s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       d=st.tuples(st.integers(1, 2), st.integers(1, 2)), data_=st.data(),
       dtype=st.sampled_from(["int8", "uint8", "float32"]),
       kind=st.sampled_from(["max", "avg0", "avg1"]))
def test_pool_random_geometry(h, w, kh, kw, s, d, data_, dtype, kind):
    pads = tuple(data_.draw(st.integers(0, k - 1)) for k in (kh, kw, kh, kw))
    assume((kh - 1) * d[0] + 1 <= h + pads[0] + pads[2])
    assume((kw - 1) * d[1] + 1 <= w + pads[1] + pads[3])
    # Windows entirely in the padding (possible with dilation) are rejected; see below.
    empty = reference_pool(np.zeros((1, 1, h, w), np.float32), "avg", (kh, kw), s, pads, d)
    assume(not np.isnan(empty).any())
    check_pool(data((1, 2, h, w), dtype), kind[:3], (kh, kw), s, pads, d,
               count_include_pad=int(kind == "avg1"))


def test_max_pool_int32_and_uint8():
    for dtype in ("int32", "uint8"):
        check_pool(data((1, 3, 10, 10), dtype), "max", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1))


def test_max_pool_propagates_nan():
    x = data((1, 1, 6, 6), "float32")
    x[0, 0, 2, 3] = np.nan
    got = run(build_max_pool(TensorSpec(x.shape, "float32"), (3, 3)), x)
    want = sliding_window_view(x, (3, 3), axis=(2, 3)).max(axis=(-2, -1))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_int8_average_rounds_half_to_even():
    # 2x1 windows: sums 3, -3, 1, 5 over 2 -> 1.5, -1.5, 0.5, 2.5 -> 2, -2, 0, 2
    x = np.array([1, 2, -1, -2, 0, 1, 2, 3], np.int8).reshape(1, 1, 8, 1)
    got = run(build_average_pool(TensorSpec(x.shape, "int8"), (2, 1), (2, 1)), x)
    np.testing.assert_array_equal(got.ravel(), [2, -2, 0, 2])


# --- onnxruntime ---------------------------------------------------------------------

def ort_pool(op, x, **attrs):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper
    elem = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", elem, x.shape)],
                              [helper.make_tensor_value_info("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("dtype", ["int8", "uint8", "float32"])
def test_max_pool_matches_onnxruntime(dtype):
    x = data((2, 5, 17, 15), dtype)
    attrs = dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2])
    got = run(build_max_pool(TensorSpec(x.shape, dtype), [3, 2], [2, 1], [1, 0, 1, 1],
                             [1, 2]), x)
    np.testing.assert_array_equal(got, ort_pool("MaxPool", x, **attrs))


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_matches_onnxruntime(count_include_pad):
    x = data((1, 6, 14, 13), "float32")
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                 count_include_pad=count_include_pad)
    got = run(build_average_pool(TensorSpec(x.shape, "float32"), [3, 3], [2, 2],
                                 [1, 1, 1, 1], count_include_pad=count_include_pad), x)
    np.testing.assert_allclose(got, ort_pool("AveragePool", x, **attrs), rtol=1e-5, atol=1e-6)


def test_global_pools_match_onnxruntime():
    x = data((2, 9, 7, 5), "float32")
    g = run(build_global_average_pool(TensorSpec(x.shape, "float32")), x)
    np.testing.assert_allclose(g, ort_pool("GlobalAveragePool", x), rtol=1e-5, atol=1e-6)
    m = run(build_global_max_pool(TensorSpec(x.shape, "float32")), x)
    np.testing.assert_array_equal(m, ort_pool("GlobalMaxPool", x))


# --- global pools ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["int8", "uint8", "float32"])
@pytest.mark.parametrize("hw", [(7, 7), (1, 1), (3, 5), (16, 16), (1, 13)])
def test_global_pools_match_numpy(dtype, hw):
    x = data((2, 6, *hw), dtype)
    s = TensorSpec(x.shape, dtype)
    np.testing.assert_array_equal(run(build_global_max_pool(s), x),
                                  x.max(axis=(2, 3), keepdims=True))
    got = run(build_global_average_pool(s), x)
    mean = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    if dtype == "float32":
        np.testing.assert_allclose(got, mean, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, np.rint(mean).astype(dtype))


def test_global_average_int8_rounds_half_to_even():
    # 2-element planes: means 1.5, -1.5, 0.5, -0.5, 2.5 -> 2, -2, 0, 0, 2
    x = np.array([[1, 2], [-1, -2], [0, 1], [0, -1], [2, 3]], np.int8).reshape(1, 5, 1, 2)
    got = run(build_global_average_pool(TensorSpec(x.shape, "int8")), x)
    np.testing.assert_array_equal(got.ravel(), [2, -2, 0, 0, 2])


def test_global_max_pool_propagates_nan():
    x = data((1, 3, 5, 5), "float32")
    x[0, 1, 4, 4] = np.nan
    got = run(build_global_max_pool(TensorSpec(x.shape, "float32")), x).ravel()
    assert np.isnan(got[1]) and not np.isnan(got[[0, 2]]).any()


# --- errors ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(kernel_shape=(3, 3), ceil_mode=1), "MaxPool: ceil_mode=1 is not supported"),
    (dict(kernel_shape=(6, 3)),
     r"MaxPool: kernel_shape \[6, 3\] .* larger than the padded input height 5"),
    (dict(kernel_shape=(3, 3), pads=(0, -1, 0, 0)), r"MaxPool: pads \[0, -1, 0, 0\]"),
    (dict(kernel_shape=(3, 3), strides=(0, 1)), r"MaxPool: strides \[0, 1\]"),
    (dict(kernel_shape=(3,)), r"MaxPool: kernel_shape \[3\]"),
    (dict(kernel_shape=(2, 2), pads=(0, 0, 3, 0)),
     r"MaxPool: pads \[0, 0, 3, 0\] put the whole window of output row 5"),
])
def test_max_pool_rejects_bad_parameters(kwargs, match):
    with pytest.raises(CpuKernelError, match=match):
        build_max_pool(TensorSpec((1, 1, 5, 5), "float32"), **kwargs)


def test_pool_rejects_bad_inputs():
    with pytest.raises(CpuKernelError, match="AveragePool: dtype int32"):
        build_average_pool(TensorSpec((1, 1, 5, 5), "int32"), (2, 2))
    with pytest.raises(CpuKernelError, match="MaxPool: input must be NCHW"):
        build_max_pool(TensorSpec((5, 5), "float32"), (2, 2))
    with pytest.raises(CpuKernelError, match="GlobalAveragePool: dtype int32"):
        build_global_average_pool(TensorSpec((1, 1, 5, 5), "int32"))
