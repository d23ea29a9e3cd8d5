"""int8 conv / matmul kernels (tessera.compiler.cpu.conv) against an int64 numpy
reference and onnxruntime's ConvInteger / MatMulInteger."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tessera.compiler.cpu.conv import build_conv_int8, build_matmul_int8
from tessera.compiler.cpu.kernel import TensorSpec
from tessera.errors import CpuKernelError
from tessera.runtime.cpu import load_kernel

RNG = np.random.default_rng(9)


def i8(shape):
    return RNG.integers(-128, 128, shape, dtype=np.int8)


def reference_conv(x, w, bias, strides, pads, dilations, group):
    """int64 direct convolution, one kernel tap at a time."""
    n, _, h, wd = x.shape
    m, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (wd + pads[1] + pads[3] - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((n, m, oh, ow), np.int64)
    mg = m // group
    for g in range(group):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * mg:(g + 1) * mg].astype(np.int64)
        for ky in range(kh):
            for kx in range(kw):
                patch = xs[:, :, ky * dh:ky * dh + (oh - 1) * sh + 1:sh,
                           kx * dw:kx * dw + (ow - 1) * sw + 1:sw]
                out[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", patch, ws[:, :, ky, kx])
    if bias is not None:
        out += bias.astype(np.int64)[None, :, None, None]
    return out.astype(np.int32)


def check_conv(x_shape, w_shape, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1),
               group=1, bias=False, x=None, w=None):
    x = i8(x_shape) if x is None else x
    w = i8(w_shape) if w is None else w
    b = RNG.integers(-5000, 5000, w_shape[0], dtype=np.int32) if bias else None
    k = build_conv_int8(TensorSpec(x.shape, "int8"), TensorSpec(w.shape, "int8"), bias,
                        strides, pads, dilations, group)
    args = (x, w, b) if bias else (x, w)
    (got,) = load_kernel(k)(*args)
    np.testing.assert_array_equal(got, reference_conv(x, w, b, strides, pads, dilations, group))


@pytest.mark.parametrize("x_shape, w_shape, strides, pads, dilations, group, bias", [
    # GEMM path (>= 8 channels per group)
    ((1, 64, 28, 28), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    ((2, 20, 7, 8), (5, 20, 3, 2), (2, 1), (0, 1, 2, 0), (1, 2), 1, False),
    ((1, 32, 11, 9), (12, 8, 3, 3), (1, 2), (1, 1, 1, 1), (1, 1), 4, True),
    ((1, 17, 5, 6), (4, 17, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, True),
    ((1, 16, 9, 9), (7, 16, 5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 1, False),
    ((1, 8, 4, 4), (2, 8, 3, 3), (1, 1), (3, 3, 3, 3), (1, 1), 1, True),   # all-pad windows
    # direct path (depthwise, small groups)
    ((1, 128, 56, 56), (128, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 128, False),
    ((1, 6, 9, 9), (6, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 6, True),
    ((1, 8, 9, 9), (16, 1, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 8, False),  # multiplier 2
    ((2, 6, 8, 7), (4, 3, 3, 3), (1, 1), (2, 1, 0, 1), (2, 1), 2, True),
    ((1, 3, 10, 10), (7, 3, 5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 1, False),
    ((1, 4, 7, 7), (4, 1, 7, 7), (1, 1), (3, 3, 3, 3), (1, 1), 4, True),    # 7x7 depthwise
])
def test_conv_matches_reference(x_shape, w_shape, strides, pads, dilations, group, bias):
    check_conv(x_shape, w_shape, strides, pads, dilations, group, bias)


@pytest.mark.parametrize("x_shape, w_shape, group", [
    ((1, 32, 6, 6), (8, 32, 3, 3), 1),     # GEMM path
    ((1, 4, 6, 6), (4, 1, 3, 3), 4),       # direct path
])
def test_conv_extreme_values(x_shape, w_shape, group):
    # -128 * -128 everywhere: the largest products and sums int8 can give.
    x = np.full(x_shape, -128, np.int8)
    w = np.full(w_shape, -128, np.int8)
    check_conv(x_shape, w_shape, pads=(1, 1, 1, 1), group=group, bias=True, x=x, w=w)


@settings(max_examples=15, deadline=None)
@given(cg=st.sampled_from([1, 2, 3, 8, 9, 16, 20]), mg=st.integers(1, 5),
       group=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9),
       k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       s=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       d=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       p=st.tuples(*[st.integers(0, 2)] * 4), bias=st.booleans())
def test_conv_random(cg, mg, group, h, w, k, s, d, p, bias):
    assume((k[0] - 1) * d[0] + 1 <= h + p[0] + p[2])
    assume((k[1] - 1) * d[1] + 1 <= w + p[1] + p[3])
    check_conv((1, cg * group, h, w), (mg * group, cg, *k), s, p, d, group, bias)


@pytest.mark.parametrize("m, k, n", [
    (256, 256, 256), (5, 7, 3), (33, 100, 17), (1, 1, 1), (3, 16, 64), (64, 17, 1),
])
def test_matmul_matches_numpy(m, k, n):
    a, b = i8((m, k)), i8((k, n))
    kern = build_matmul_int8(TensorSpec(a.shape, "int8"), TensorSpec(b.shape, "int8"))
    (got,) = load_kernel(kern)(a, b)
    np.testing.assert_array_equal(got, a.astype(np.int32) @ b.astype(np.int32))


# --- onnxruntime ---------------------------------------------------------------------

def ort_run(node, inputs):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, TensorProto.INT8, v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    model = helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)[0]


def test_conv_matches_onnxruntime_conv_integer():
    from onnx import helper
    x, w = i8((1, 24, 10, 9)), i8((12, 12, 3, 3))
    attrs = dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2], group=2)
    want = ort_run(helper.make_node("ConvInteger", ["x", "w"], ["y"], **attrs),
                   {"x": x, "w": w})
    k = build_conv_int8(TensorSpec(x.shape, "int8"), TensorSpec(w.shape, "int8"),
                        strides=(2, 1), pads=(1, 0, 2, 1), dilations=(1, 2), group=2)
    (got,) = load_kernel(k)(x, w)
    np.testing.assert_array_equal(got, want)


def test_matmul_matches_onnxruntime_matmul_integer():
    from onnx import helper
    a, b = i8((37, 70)), i8((70, 29))
    want = ort_run(helper.make_node("MatMulInteger", ["a", "b"], ["y"]), {"a": a, "b": b})
    k = build_matmul_int8(TensorSpec(a.shape, "int8"), TensorSpec(b.shape, "int8"))
    (got,) = load_kernel(k)(a, b)
    np.testing.assert_array_equal(got, want)


# --- errors ------------------------------------------------------------------------

@pytest.mark.parametrize("x, w, kwargs, match", [
    ((1, 6, 5, 5), (4, 3, 3, 3), dict(group=4), "ConvInteger: group 4 must divide"),
    ((1, 6, 5, 5), (4, 2, 3, 3), dict(group=2), "ConvInteger: w has 2 input channels per group"),
    ((1, 4, 5, 5), (4, 4, 7, 3), dict(),
     r"ConvInteger: kernel_shape \[7, 3\] .* larger than the padded input height 5"),
    ((1, 4, 5, 5), (4, 4, 3, 3), dict(pads=(-1, 0, 0, 0)), r"ConvInteger: pads \[-1, 0, 0, 0\]"),
    ((1, 4, 5, 5), (4, 4, 3, 3), dict(strides=(1, 0)), r"ConvInteger: strides \[1, 0\]"),
    ((1, 4, 5), (4, 4, 3, 3), dict(), "ConvInteger: x and w must be rank 4"),
])
def test_conv_rejects_bad_parameters(x, w, kwargs, match):
    with pytest.raises(CpuKernelError, match=match):
        build_conv_int8(TensorSpec(x, "int8"), TensorSpec(w, "int8"), **kwargs)


def test_rejects_bad_dtypes_and_shapes():
    with pytest.raises(CpuKernelError, match="ConvInteger: x and w must be int8"):
        build_conv_int8(TensorSpec((1, 4, 5, 5), "uint8"), TensorSpec((4, 4, 3, 3), "int8"))
    with pytest.raises(CpuKernelError, match="MatMulInteger: inner dimensions differ"):
        build_matmul_int8(TensorSpec((3, 4), "int8"), TensorSpec((5, 6), "int8"))
    with pytest.raises(CpuKernelError, match="MatMulInteger: B must be a 2-D int8 matrix"):
        build_matmul_int8(TensorSpec((3, 4), "int8"), TensorSpec((4, 6), "float32"))
