"""Dynamically quantized models (onnxruntime's ``quantize_dynamic``): DynamicQuantizeLinear,
ConvInteger and MatMulInteger lowered to CPU kernels, bit for bit against onnxruntime, op
by op (one-node models through import and ``lower_node_to_cpu``) and on the zoo's models
compiled whole."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization as ortq

import tessera
from tessera.compiler import zoo
from tessera.compiler.cpu.lower import lower_node_to_cpu
from tessera.compiler.golden.check import reference_outputs
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.errors import CompileError
from tessera.runtime.cpu import run_cpu_steps

RNG = np.random.default_rng(23)


def _tensor_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _model(op: str, inputs: list[str], feeds: dict[str, np.ndarray],
           consts: dict[str, np.ndarray], outputs: int = 1, **attrs: Any) -> onnx.ModelProto:
    """A one-node model: ``feeds`` are graph inputs, ``consts`` initializers."""
    names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, inputs, names, name=f"{op.lower()}_node", **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(n, _tensor_type(str(a.dtype)), a.shape)
         for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info(n) for n in names],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _lowered(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's nodes as CPU steps (import, lower_node_to_cpu), run on ``feeds``."""
    graph = import_onnx(model)
    env = dict(feeds)
    for node in graph.nodes:
        run_cpu_steps(lower_node_to_cpu(graph, node), env)
    return [env[name] for name in graph.outputs]


def _assert_identical(ours: list[np.ndarray], theirs: list[np.ndarray]) -> None:
    """Same dtype, shape and bits (floats compared as bit patterns: -0.0 is not 0.0)."""
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


# ----------------------------------------------------------------- DynamicQuantizeLinear
def _ties(shape: tuple[int, ...]) -> np.ndarray:
    """Values on rounding ties of their own quantization: min -1, max 1.55 make the scale
    0.01 (to float32), and (k + 0.5) * 0.01 lands near x.5 steps."""
    k = RNG.integers(-100, 155, shape)
    x = ((k + 0.5) * np.float32(0.01)).astype(np.float32)
    x.flat[:2] = (-1.0, 1.55)
    return x


def _zero_point_tie(tie: float) -> Callable[[tuple[int, ...]], np.ndarray]:
    """Values whose range makes the scale 1/128 and ``-min / scale`` exactly ``tie`` (a
    half): the zero point rounds to even."""
    def data(shape: tuple[int, ...]) -> np.ndarray:
        low, high = -tie / 128, (255 - tie) / 128
        x = RNG.uniform(low, high, shape).astype(np.float32)
        x.flat[:2] = (low, high)
        return x
    return data


DATA = {
    "normal": lambda s: RNG.standard_normal(s).astype(np.float32),
    "positive": lambda s: RNG.uniform(0.5, 3.0, s).astype(np.float32),
    "negative": lambda s: RNG.uniform(-7.0, -0.1, s).astype(np.float32),
    "zeros": lambda s: np.zeros(s, np.float32),
    "negative zeros": lambda s: np.full(s, -0.0, np.float32),
    "constant": lambda s: np.full(s, 2.5, np.float32),
    "tiny": lambda s: (RNG.standard_normal(s) * 1e-30).astype(np.float32),
    "huge": lambda s: (RNG.standard_normal(s) * 1e30).astype(np.float32),
    "skewed": lambda s: (RNG.standard_normal(s) ** 3 + 0.2).astype(np.float32),
    "ties": _ties,
    "zero point tie to even (down)": _zero_point_tie(64.5),
    "zero point tie to even (up)": _zero_point_tie(63.5),
}


@pytest.mark.parametrize("shape", [(2,), (2, 3, 7, 11), (1, 1000)])
def test_dynamic_quantize_linear_is_bit_exact(shape: tuple[int, ...]) -> None:
    """Output, scale and zero point, on data of every kind and 300 random ranges."""
    x = np.zeros(shape, np.float32)
    model = _model("DynamicQuantizeLinear", ["x"], {"x": x}, {}, outputs=3)
    graph = import_onnx(model)
    [node] = graph.nodes
    steps = lower_node_to_cpu(graph, node)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = [f(shape) for f in DATA.values()]
    feeds += [(RNG.standard_normal(shape) * 10 ** RNG.uniform(-4, 4)
               + RNG.uniform(-3, 3) * 10 ** RNG.uniform(-4, 4)).astype(np.float32)
              for _ in range(300)]
    for data in feeds:
        env = {"x": data}
        run_cpu_steps(steps, env)
        _assert_identical([env[o] for o in node.outputs], session.run(None, {"x": data}))


def test_a_swish_feeding_dynamic_quantization_is_onnxruntimes_to_the_bit() -> None:
    """x * Sigmoid(x) -> DynamicQuantizeLinear, as between quantize_dynamic's convolutions
    (ddddocr's common_old.onnx): the range is measured on the swish, so an ulp of it moves
    the scale and then the whole int8 tensor; the Sigmoid must be MLAS's to the bit."""
    x = np.linspace(-9, 9, 20_001, dtype=np.float32).reshape(1, -1)
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"]),
             helper.make_node("DynamicQuantizeLinear", ["y"], ["q", "scale", "zp"])]
    graph = helper.make_graph(
        nodes, "swish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_empty_tensor_value_info(n) for n in ("y", "q", "scale", "zp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    _assert_identical(_lowered(model, {"x": x}), _onnxruntime(model, {"x": x}))


# ------------------------------------------------------------- ConvInteger, MatMulInteger
def _ints(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _integer_case(op: str, x_dtype: str, x_shape: tuple[int, ...], w: np.ndarray,
                  x_zp: str, w_zp: np.ndarray | None, **attrs: Any
                  ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """ConvInteger / MatMulInteger with the input zero point ``x_zp`` "omitted", a
    "constant" or an "input" (as DynamicQuantizeLinear gives it)."""
    x = _ints(x_dtype, x_shape)
    feeds, consts = {"x": x}, {"w": w}
    zp = np.array(RNG.integers(0, 100) - (100 if x_dtype == "int8" else 0), x_dtype)
    inputs = ["x", "w", "", ""]
    if x_zp != "omitted":
        inputs[2] = "x_zp"
        (feeds if x_zp == "input" else consts)["x_zp"] = zp
    if w_zp is not None:
        inputs[3] = "w_zp"
        consts["w_zp"] = w_zp
    while not inputs[-1]:
        inputs.pop()
    return _model(op, inputs, feeds, consts, **attrs), feeds


CONVS = {
    "3x3 pad 1": dict(w=(6, 4, 3, 3), pads=[1, 1, 1, 1]),
    "stride 2, dilation 2": dict(w=(8, 4, 3, 3), strides=[2, 2], dilations=[2, 2],
                                 pads=[2, 1, 0, 2]),
    "depthwise": dict(w=(4, 1, 3, 3), group=4, pads=[1, 1, 1, 1]),
    "1x1": dict(w=(16, 4, 1, 1)),
}


@pytest.mark.parametrize("geometry, x_dtype, w_dtype, x_zp, w_zp", [
    ("3x3 pad 1", "uint8", "int8", "input", 0),     # quantize_dynamic's default
    ("3x3 pad 1", "uint8", "uint8", "input", 131),  # QUInt8 weights: w - w_zp in [-255, 255]
    ("stride 2, dilation 2", "uint8", "uint8", "input", 131),
    ("depthwise", "int8", "int8", "constant", -3),
    ("depthwise", "uint8", "int8", "input", 0),
    ("1x1", "uint8", "uint8", "omitted", None),     # w_zp 0: w up to 255, in three parts
])
def test_conv_integer_is_bit_exact(geometry: str, x_dtype: str, w_dtype: str, x_zp: str,
                                   w_zp: int | None) -> None:
    attrs = dict(CONVS[geometry])
    w = _ints(w_dtype, attrs.pop("w"))
    w_zero_point = None if w_zp is None else np.array(w_zp, w_dtype)
    model, feeds = _integer_case("ConvInteger", x_dtype, (2, 4, 9, 10), w, x_zp,
                                 w_zero_point, **attrs)
    _assert_identical(_lowered(model, feeds), _onnxruntime(model, feeds))


@pytest.mark.parametrize("x_shape, x_dtype, w_dtype, x_zp, w_zp", [
    ((5, 33), "uint8", "int8", "input", "scalar"),
    ((2, 3, 33), "uint8", "int8", "input", "scalar"),
    ((5, 33), "uint8", "uint8", "input", "per column"),
    ((2, 3, 33), "int8", "uint8", "constant", "per column"),
    ((2, 3, 33), "int8", "int8", "omitted", None),
])
def test_matmul_integer_is_bit_exact(x_shape: tuple[int, ...], x_dtype: str, w_dtype: str,
                                     x_zp: str, w_zp: str | None) -> None:
    w = _ints(w_dtype, (33, 7))
    zero_points = {None: None, "scalar": _ints(w_dtype, ()), "per column": _ints(w_dtype, (7,))}
    model, feeds = _integer_case("MatMulInteger", x_dtype, x_shape, w, x_zp,
                                 zero_points[w_zp])
    _assert_identical(_lowered(model, feeds), _onnxruntime(model, feeds))


def test_integer_ops_with_a_weight_computed_at_run_time_are_refused() -> None:
    a = _ints("uint8", (3, 4))
    model = _model("MatMulInteger", ["a", "b"], {"a": a, "b": _ints("uint8", (4, 2))}, {})
    graph = import_onnx(model)
    with pytest.raises(CompileError, match="matmulinteger_node.*weight.*constant") as info:
        lower_node_to_cpu(graph, graph.nodes[0])
    assert info.value.op == "matmulinteger_node"


# ------------------------------------------------------------------------ whole models
def _quantize_dynamic(model: onnx.ModelProto, **options: Any) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "float.onnx", Path(tmp) / "dynamic.onnx"
        onnx.save(model, str(source))
        ortq.quantize_dynamic(str(source), str(target), **options)
        return onnx.load(str(target))


@pytest.mark.parametrize("name, options", [
    ("lenet", {"per_channel": True, "weight_type": ortq.QuantType.QUInt8}),
    ("small_resnet", {}),
])
def test_zoo_dynamic_model_matches_onnxruntime(name: str, options: dict) -> None:
    """Outputs equal onnxruntime's to a float32 ulp or two: the integer ops and the
    rescales are exact; a float op computed in another order (GlobalAveragePool's sum)
    may differ in the last bit, and so may what follows it."""
    float_model = zoo.ZOO[name]()
    dynamic = _quantize_dynamic(float_model, **options)
    model = tessera.compile(dynamic, "pynq")
    ops = {p.op for p in model.compiled.placements}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    for feed in zoo.calibration_data(float_model, 3, seed=5):
        outputs, _ = model.run(feed)
        [reference] = _onnxruntime(dynamic, feed)
        np.testing.assert_allclose(outputs[zoo.OUTPUT], reference, rtol=1e-6,
                                   atol=1e-6 * np.abs(reference).max())


def test_dynamically_quantized_lstm_gives_onnxruntimes_outputs() -> None:
    """A model of one DynamicQuantizeLSTM (quantize_dynamic's LSTM) compiles without
    calibration and runs on the CPU kernel with onnxruntime's bits."""
    hidden, features = 8, 4
    weights = {"W": (RNG.standard_normal((1, 4 * hidden, features)) * 0.3).astype(np.float32),
               "R": (RNG.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32)}
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hidden, name="rnn")
    graph = helper.make_graph(
        [node], "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, 1, hidden])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    dynamic = _quantize_dynamic(model)
    assert [n.op_type for n in dynamic.graph.node] == ["DynamicQuantizeLSTM"]
    compiled = tessera.compile(dynamic)
    assert [p.target for p in compiled.compiled.placements] == ["cpu"]
    x = RNG.standard_normal((5, 1, 4)).astype(np.float32)
    ours, _ = compiled.run({"x": x})
    np.testing.assert_array_equal(ours["y"], reference_outputs(dynamic, {"x": x})["y"])
