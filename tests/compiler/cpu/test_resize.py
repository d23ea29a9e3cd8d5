"""Resize (tessera.compiler.cpu.resize) against onnxruntime, one-node models."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tessera.compiler.cpu.kernel import TensorSpec
from tessera.compiler.cpu.resize import build_resize
from tessera.errors import CpuKernelError
from tessera.runtime.cpu import load_kernel

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

RNG = np.random.default_rng(3)
COORD_MODES = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def data(shape, dtype):
    if dtype == "float32":
        return (RNG.standard_normal(shape) * 10).astype(np.float32)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    return RNG.integers(lo, hi, shape).astype(dtype)


def ort_resize(x, scales=None, sizes=None, **attrs):
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    inits = [helper.make_tensor("roi", TensorProto.FLOAT, [0], [])]
    if scales is not None:
        inits.append(helper.make_tensor("scales", TensorProto.FLOAT, [4], scales))
        names = ["x", "roi", "scales"]
    else:
        inits.append(helper.make_tensor("sizes", TensorProto.INT64, [4], sizes))
        names = ["x", "roi", "", "sizes"]
    graph = helper.make_graph(
        [helper.make_node("Resize", names, ["y"], **attrs)], "resize",
        [helper.make_tensor_value_info("x", elem, x.shape)],
        [helper.make_tensor_value_info("y", elem, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def check(x, scales=None, sizes=None, mode="nearest", ctm="half_pixel",
          nearest_mode="round_prefer_floor"):
    k = build_resize(TensorSpec(x.shape, x.dtype.name), scales=scales, sizes=sizes,
                     mode=mode, coordinate_transformation_mode=ctm,
                     nearest_mode=nearest_mode)
    (got,) = load_kernel(k)(x)
    want = ort_resize(x, scales, sizes, mode=mode, coordinate_transformation_mode=ctm,
                      nearest_mode=nearest_mode)
    assert got.shape == want.shape and got.dtype == want.dtype
    if mode == "linear":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    else:
        np.testing.assert_array_equal(got, want)


GEOMETRIES = [
    ((1, 3, 5, 7), [1, 1, 2, 2], None),          # integer upscale (periodic rows)
    ((1, 2, 8, 9), [1, 1, 3, 1.5], None),        # rational scale along W
    ((2, 2, 12, 10), [1, 1, 0.5, 0.6], None),    # downscale
    ((1, 2, 7, 9), None, [1, 2, 3, 20]),         # sizes
]


@pytest.mark.parametrize("shape, scales, sizes", GEOMETRIES)
@pytest.mark.parametrize("ctm", COORD_MODES)
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
def test_nearest_matches_onnxruntime(shape, scales, sizes, ctm, nearest_mode):
    check(data(shape, "float32"), scales, sizes, "nearest", ctm, nearest_mode)


@pytest.mark.parametrize("shape, scales, sizes", GEOMETRIES)
@pytest.mark.parametrize("ctm", COORD_MODES)
def test_linear_matches_onnxruntime(shape, scales, sizes, ctm):
    check(data(shape, "float32"), scales, sizes, "linear", ctm)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32"])
@pytest.mark.parametrize("ctm, nearest_mode", [("asymmetric", "floor"),
                                               ("half_pixel", "round_prefer_floor")])
def test_nearest_integer_dtypes(dtype, ctm, nearest_mode):
    check(data((1, 4, 14, 14), dtype), [1, 1, 2, 2], None, "nearest", ctm, nearest_mode)


def test_common_upsample_at_full_size():
    check(data((1, 64, 56, 56), "int8"), [1, 1, 2, 2], None, "nearest", "asymmetric", "floor")
    check(data((1, 16, 56, 56), "float32"), [1, 1, 2, 2], None, "linear", "half_pixel")


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 9), w=st.integers(1, 9),
       fy=st.sampled_from([0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0]),
       fx=st.sampled_from([0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0]),
       mode=st.sampled_from(["nearest", "linear"]), ctm=st.sampled_from(COORD_MODES),
       nearest_mode=st.sampled_from(NEAREST_MODES))
def test_random_scales(h, w, fy, fx, mode, ctm, nearest_mode):
    assume(int(h * fy) >= 1 and int(w * fx) >= 1)
    check(data((1, 2, h, w), "float32"), [1, 1, fy, fx], None, mode, ctm, nearest_mode)


@pytest.mark.parametrize("kwargs, match", [
    (dict(), "Resize: give exactly one of scales and sizes"),
    (dict(scales=[1, 1, 2, 2], sizes=[1, 2, 8, 8]), "exactly one of scales and sizes"),
    (dict(scales=[1, 2, 2, 2]), r"Resize: scales \[1.0, 2.0, 2.0, 2.0\] must be"),
    (dict(sizes=[1, 3, 8, 8]), r"Resize: sizes \[1, 3, 8, 8\] must be"),
    (dict(scales=[1, 1, 2, 2], mode="cubic"), "Resize: mode 'cubic' is not supported"),
    (dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="tf_crop_and_resize"),
     "coordinate_transformation_mode 'tf_crop_and_resize'"),
    (dict(scales=[1, 1, 2, 2], nearest_mode="up"), "nearest_mode 'up'"),
    (dict(scales=[1, 1, 0.1, 0.1]), "empty output"),
])
def test_rejects_bad_parameters(kwargs, match):
    with pytest.raises(CpuKernelError, match=match):
        build_resize(TensorSpec((1, 2, 4, 4), "float32"), **kwargs)


def test_linear_needs_float32():
    with pytest.raises(CpuKernelError, match="Resize: linear mode needs float32"):
        build_resize(TensorSpec((1, 2, 4, 4), "int8"), scales=[1, 1, 2, 2], mode="linear")
