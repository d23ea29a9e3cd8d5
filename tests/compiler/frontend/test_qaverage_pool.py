"""QAveragePool, onnxruntime's QLinearAveragePool: the golden model against onnxruntime on
every pair of inputs of a two-tap window and on random pools, int8 and uint8."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qdq import DOMAIN, fuse_qdq
from tessera.compiler.golden.quantized import run_reference
from tests.compiler.qdq_models import session


def pool_model(dtype: str, shape: tuple[int, ...], x_params: tuple[float, int],
               y_params: tuple[float, int], **attrs) -> onnx.ModelProto:
    """Stored ``dtype`` input -> DQ -> AveragePool(``attrs``) -> Q -> stored output."""
    elem = TensorProto.INT8 if dtype == "int8" else TensorProto.UINT8
    consts = {"x_scale": np.float32(x_params[0]), "x_zp": np.array(x_params[1], dtype),
              "y_scale": np.float32(y_params[0]), "y_zp": np.array(y_params[1], dtype)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "x_scale", "x_zp"], ["xf"]),
             helper.make_node("AveragePool", ["xf"], ["pf"], name="pool", **attrs),
             helper.make_node("QuantizeLinear", ["pf", "y_scale", "y_zp"], ["y"])]
    graph = helper.make_graph(nodes, "avgpool", [helper.make_tensor_value_info("x", elem,
                                                                                shape)],
                              # Its shape is the import's to infer.
                              [helper.make_tensor_value_info("y", elem, list("nchw"))],
                              [numpy_helper.from_array(np.asarray(v), k)
                               for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def fused(model: onnx.ModelProto) -> Graph:
    graph = import_onnx(model)
    fuse_qdq(graph)
    return graph


def every_pair_window(dtype: str) -> np.ndarray:
    """(1, 1, 256, 512): row r, column 2c holds value r and column 2c + 1 value c, so a
    1x2 window with stride 2 sees every pair of 8-bit values once."""
    values = np.arange(256) + np.iinfo(dtype).min
    x = np.empty((1, 1, 256, 512), np.int64)
    x[..., 0::2] = values[:, None]
    x[..., 1::2] = values[None, :]
    return x.astype(dtype)


def _float_path(x: np.ndarray, x_params: tuple[float, int], y_params: tuple[float, int]
                ) -> np.ndarray:
    """A 1x2, stride-2 pool as ONNX's float ops define it: DequantizeLinear, the mean of
    the pair, QuantizeLinear ``saturate(rint(v / y_scale) + y_zp)`` (what the compiler ran
    before the pool was fused)."""
    f32 = np.float32
    real = (x.astype(np.int64) - x_params[1]).astype(f32) * f32(x_params[0])
    mean = (real[..., 0::2] + real[..., 1::2]) / f32(2)
    info = np.iinfo(x.dtype)
    return np.clip(np.rint(mean / f32(y_params[0])) + y_params[1], info.min, info.max)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("params", [((0.05, 3), (0.05, 3)), ((0.0234, -128), (0.0234, -128)),
                                    ((0.031, 17), (0.0217, -9))],
                         ids=["equal-scales", "relu-range", "rescaled"])
def test_every_pair_of_a_two_tap_window_matches_onnxruntime(dtype, params) -> None:
    (xs, xz), (ys, yz) = params
    if dtype == "uint8":
        xz, yz = xz + 128, yz + 128
    model = pool_model(dtype, (1, 1, 256, 512), (xs, xz), (ys, yz), kernel_shape=[1, 2],
                       strides=[1, 2])
    graph = fused(model)
    assert [n.op for n in graph.nodes if n.domain == DOMAIN] == ["QAveragePool"]
    x = every_pair_window(dtype)
    expected = session(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"], expected)
    if params == ((0.05, 3), (0.05, 3)):
        # At ties (every odd sum) the float path's rounding differs: this test would
        # have caught the unfused pool.
        assert np.count_nonzero(_float_path(x, (xs, xz), (ys, yz)) != expected) > 100


def _random_pool(rng: np.random.Generator) -> tuple[str, dict, tuple, tuple]:
    dtype = str(rng.choice(["int8", "uint8"]))
    kernel = [int(k) for k in rng.integers(1, 4, 2)]
    attrs = {"kernel_shape": kernel, "strides": [int(s) for s in rng.integers(1, 3, 2)],
             "pads": [int(rng.integers(0, kernel[i % 2])) for i in range(4)],
             "ceil_mode": int(rng.integers(0, 2)),
             "count_include_pad": int(rng.integers(0, 2))}
    info = np.iinfo(dtype)
    params = [(float(rng.uniform(0.005, 0.2)), int(rng.integers(info.min, info.max + 1)))
              for _ in range(2)]
    if rng.random() < 0.5:
        params[1] = params[0]                  # onnxruntime's quantizer shares them
    return dtype, attrs, params[0], params[1]


def test_random_pools_match_onnxruntime() -> None:
    """40 random pools (kernel, strides, pads, ceil_mode, count_include_pad, scales, zero
    points, int8/uint8) on random full-range inputs: all bit-identical."""
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(40):
        dtype, attrs, x_params, y_params = _random_pool(rng)
        shape = (2, 3, int(rng.integers(3, 10)), int(rng.integers(3, 10)))
        model = pool_model(dtype, shape, x_params, y_params, **attrs)
        graph = fused(model)
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
        expected = session(model).run(None, {"x": x})[0]
        if graph.values["y"].shape != expected.shape:
            # ONNX's shape inference and onnxruntime disagree on a ceil_mode size: the
            # pool is left unfused rather than given onnxruntime's shape.
            assert attrs["ceil_mode"] and not any(n.domain for n in graph.nodes)
            continue
        ops = [n.op for n in graph.nodes if n.domain == DOMAIN]
        assert ops in (["QAveragePool"], ["QGlobalAveragePool"]), attrs
        np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"], expected,
                                      err_msg=str((dtype, attrs, x_params, y_params)))
        checked += 1
    assert checked >= 30


def test_a_window_over_the_whole_image_is_a_global_average_pool() -> None:
    """onnxruntime runs such a pool with its integer global kernel, not the float one."""
    model = pool_model("int8", (1, 4, 5, 5), (0.04, 3), (0.04, 3), kernel_shape=[5, 5])
    graph = fused(model)
    assert [n.op for n in graph.nodes if n.domain == DOMAIN] == ["QGlobalAveragePool"]
    x = np.random.default_rng(2).integers(-128, 128, (1, 4, 5, 5)).astype(np.int8)
    np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"],
                                  session(model).run(None, {"x": x})[0])


def test_auto_padded_pools_stay_float() -> None:
    graph = fused(pool_model("int8", (1, 2, 8, 8), (0.05, 0), (0.05, 0), kernel_shape=[3, 3],
                             auto_pad="SAME_UPPER"))
    assert "AveragePool" in graph.ops() and not any(n.domain for n in graph.nodes)


def test_uint8_graph_input_and_output_are_converted_at_the_boundary() -> None:
    """A uint8 model interface stays uint8; inside, the tensors are int8 (value - 128)."""
    model = pool_model("uint8", (1, 2, 6, 6), (0.05, 131), (0.05, 131), kernel_shape=[2, 2],
                       strides=[2, 2])
    graph = fused(model)
    assert [graph.values[t].dtype for t in (*graph.inputs, *graph.outputs)] == ["uint8"] * 2
    (pool,) = [n for n in graph.nodes if n.domain == DOMAIN]
    assert graph.values[pool.inputs[0]].dtype == graph.values[pool.outputs[0]].dtype == "int8"
    assert pool.attrs["x_zero_point"] == 3 and pool.attrs["from_uint8"] == 1
    assert [n.op for n in graph.nodes] == ["DequantizeLinear", "QuantizeLinear",
                                           "QAveragePool", "DequantizeLinear",
                                           "QuantizeLinear"]
    x = np.random.default_rng(3).integers(0, 256, (1, 2, 6, 6)).astype(np.uint8)
    got = run_reference(graph, {"x": x})["y"]
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, session(model).run(None, {"x": x})[0])
