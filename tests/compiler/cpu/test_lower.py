"""``lower_node_to_cpu``: one node of the graph IR as CPU kernel steps.

Standard ops: one-node ONNX models (opset 17) against onnxruntime (exact for integer
outputs, a few ulp for float). ``tessera`` integer nodes: the zoo's fused QDQ models and
hand-built graphs against the golden model ``qref.run_reference``, bit for bit.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler import zoo
from tessera.compiler.cpu import lower_quantized
from tessera.compiler.cpu.lower import CpuStep, cpu_unsupported_reason, lower_node_to_cpu
from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qdq import DOMAIN, fuse_qdq
from tessera.compiler.golden.quantized import run_reference
from tessera.errors import CompileError, CpuKernelError
from tessera.runtime import jit
from tessera.runtime.cpu import run_cpu_steps


@pytest.fixture(scope="module", autouse=True)
def _private_llvm_cache(tmp_path_factory):
    """Kernels compile into a fresh cache folder (as in tests/compiler/cpu/conftest.py), so results
    never depend on (or pollute) the user's ``~/.cache/tessera``."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_CACHE", str(tmp_path_factory.mktemp("tessera-cache")))
    mp.setattr(jit, "_jit", None)
    yield
    mp.undo()


# ------------------------------------------------------------------- standard ops
RNG = np.random.default_rng(17)


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def ints(dtype: str, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


EXACT = None
FLOAT = (1e-6, 1e-7)        # elementwise float: a multiply or add, rounded once
ULPS = (1e-5, 1e-6)         # polynomials (exp, sigmoid, tanh) and reassociated sums


@dataclass
class Case:
    """A one-node model: ``feeds`` are graph inputs, ``consts`` initializers, ``inputs``
    the node's input names in order ("" for an omitted optional input)."""

    op: str
    feeds: dict[str, np.ndarray]
    inputs: list[str]
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    outputs: int = 1
    tol: tuple[float, float] | None = EXACT

    def model(self) -> onnx.ModelProto:
        node = helper.make_node(self.op, self.inputs, [f"y{i}" for i in range(self.outputs)],
                                name=f"{self.op.lower()}_node", **self.attrs)
        graph = helper.make_graph(
            [node], "case",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in self.feeds.items()],
            [helper.make_empty_tensor_value_info(f"y{i}") for i in range(self.outputs)],
            [numpy_helper.from_array(np.asarray(a), n) for n, a in self.consts.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def case(op: str, feeds: dict[str, np.ndarray], inputs: list[str] | None = None,
         consts: dict[str, np.ndarray] | None = None, tol=EXACT, outputs: int = 1,
         id: str | None = None, **attrs: Any):
    inputs = list(feeds) + list(consts or {}) if inputs is None else inputs
    return pytest.param(Case(op, feeds, inputs, dict(consts or {}), attrs, outputs, tol),
                        id=id or op)


def _scalar(v, dtype):
    return np.array(v, dtype=dtype)


CASES = [
    # quantization
    case("QuantizeLinear", {"x": f32(2, 3, 4, 5, scale=4)},
         consts={"s": _scalar(0.05, np.float32), "z": _scalar(3, np.int8)}, id="quantize-int8"),
    case("QuantizeLinear", {"x": f32(2, 7, scale=4)}, ["x", "s"],
         consts={"s": _scalar(0.03, np.float32)}, id="quantize-uint8-default-zp"),
    case("QuantizeLinear", {"x": f32(2, 3, 4, 4, scale=4)},
         consts={"s": np.array([0.02, 0.05, 0.1], np.float32),
                 "z": np.array([-5, 0, 7], np.int8)}, axis=1, id="quantize-per-axis"),
    case("DequantizeLinear", {"q": ints("int8", 2, 3, 8)},
         consts={"s": _scalar(0.07, np.float32), "z": _scalar(-9, np.int8)}, tol=FLOAT,
         id="dequantize-int8"),
    case("DequantizeLinear", {"q": ints("uint8", 4, 6)},
         consts={"s": np.array([0.1, 0.2, 0.3, 0.4], np.float32),
                 "z": np.array([0, 128, 3, 255], np.uint8)}, axis=0, tol=FLOAT,
         id="dequantize-uint8-per-axis"),
    case("DequantizeLinear", {"q": ints("int8", 2, 4, 3)},
         consts={"s": np.float32([0.1, 0.2, 0.3]), "z": np.int8([1, 2, 3])}, axis=-1,
         tol=FLOAT, id="dequantize-negative-axis"),
    case("DequantizeLinear", {"q": ints("int32", 3, 5)},
         consts={"s": _scalar(0.001, np.float32)}, tol=FLOAT, id="dequantize-int32"),
    # activations
    case("Relu", {"x": f32(2, 3, 5, 5)}),
    case("Relu", {"x": ints("int8", 3, 7)}, id="Relu-int8"),
    case("Clip", {"x": f32(4, 9, scale=3)},
         consts={"lo": _scalar(-1.5, np.float32), "hi": _scalar(0.5, np.float32)}),
    case("Clip", {"x": ints("int8", 4, 9)}, ["x", "lo"], consts={"lo": _scalar(-7, np.int8)},
         id="Clip-int8-min-only"),
    case("Sigmoid", {"x": f32(3, 50, scale=6)}, tol=ULPS),
    case("Tanh", {"x": f32(3, 50, scale=3)}, tol=ULPS),
    case("Exp", {"x": f32(3, 50, scale=5)}, tol=ULPS),
    case("Neg", {"x": f32(2, 11)}),
    case("Abs", {"x": ints("int32", 2, 11)}),
    # binary, broadcasting
    case("Add", {"a": f32(2, 3, 4), "b": f32(3, 1)}, tol=FLOAT, id="Add-broadcast"),
    case("Add", {"x": f32(1, 3, 4, 4)}, consts={"bias": f32(1, 3, 1, 1)}, tol=FLOAT,
         id="Add-const-per-channel"),
    case("Sub", {"a": ints("int32", 5, 6), "b": ints("int32", 5, 6)}, id="Sub-int32-wraps"),
    case("Mul", {"x": f32(4, 5)}, consts={"k": _scalar(-2.5, np.float32)}, tol=FLOAT,
         id="Mul-scalar-const"),
    case("Div", {"a": f32(3, 4), "b": f32(1, 4) + 3}, tol=FLOAT),
    case("Max", {"a": f32(2, 3), "b": f32(2, 3), "c": f32(3)}, id="Max-variadic"),
    case("Min", {"a": ints("int32", 2, 5), "b": ints("int32", 1, 5)}),
    case("Cast", {"x": f32(3, 8, scale=40)}, to=TensorProto.INT8, id="Cast-f32-int8"),
    case("Cast", {"x": ints("uint8", 3, 8)}, to=TensorProto.FLOAT, id="Cast-uint8-f32"),
    case("Cast", {"x": ints("int8", 3, 8)}, to=TensorProto.INT32, id="Cast-int8-int32"),
    case("Cast", {"x": f32(3, 8)}, to=TensorProto.FLOAT, id="Cast-same-type-view"),
    # normalisation
    case("Softmax", {"x": f32(4, 33, scale=3)}, tol=ULPS),
    case("Softmax", {"x": f32(2, 5, 3, 3)}, axis=1, tol=ULPS, id="Softmax-axis1"),
    case("LogSoftmax", {"x": f32(3, 17, scale=3)}, tol=ULPS),
    case("LayerNormalization", {"x": f32(2, 5, 16)},
         consts={"g": f32(16), "b": f32(16)}, tol=ULPS),
    case("LayerNormalization", {"x": f32(2, 4, 3, 3), "g": f32(4, 3, 3)}, axis=1,
         epsilon=1e-3, outputs=3, tol=ULPS, id="LayerNormalization-stats"),
    # reductions (ReduceSum takes axes as an input at opset 17, the others an attribute)
    case("ReduceMean", {"x": f32(2, 3, 4, 5)}, axes=[2, 3], tol=ULPS),
    case("ReduceSum", {"x": f32(2, 3, 4, 5)}, consts={"axes": np.array([1], np.int64)},
         keepdims=0, tol=ULPS, id="ReduceSum-axes-input"),
    case("ReduceSum", {"x": ints("int32", 3, 4, 5) // 8}, consts={"axes": np.array([-1])},
         id="ReduceSum-int32"),
    case("ReduceSum", {"x": f32(3, 4)}, noop_with_empty_axes=1, id="ReduceSum-noop-view"),
    case("ReduceMax", {"x": ints("int8", 2, 6, 7)}, axes=[0, 2], id="ReduceMax-int8"),
    case("ReduceMin", {"x": f32(2, 6, 7)}, id="ReduceMin-all-axes"),
    # pooling
    case("MaxPool", {"x": f32(1, 3, 9, 9)}, kernel_shape=[3, 3], strides=[2, 2],
         pads=[1, 1, 1, 1]),
    case("MaxPool", {"x": ints("int8", 2, 4, 8, 8)}, kernel_shape=[2, 2], strides=[2, 2],
         id="MaxPool-int8"),
    case("MaxPool", {"x": f32(1, 2, 7, 7)}, kernel_shape=[2, 2], auto_pad="SAME_UPPER",
         id="MaxPool-same-upper"),
    case("MaxPool", {"x": f32(1, 2, 7, 7)}, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
         dilations=[2, 2], id="MaxPool-dilated"),
    case("AveragePool", {"x": f32(1, 2, 7, 7)}, kernel_shape=[3, 3], strides=[2, 2],
         auto_pad="SAME_LOWER", tol=FLOAT, id="AveragePool-same-lower"),
    case("AveragePool", {"x": f32(1, 3, 8, 8)}, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
         tol=FLOAT),
    case("AveragePool", {"x": f32(1, 3, 8, 8)}, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
         count_include_pad=1, tol=FLOAT, id="AveragePool-include-pad"),
    case("GlobalAveragePool", {"x": f32(2, 5, 7, 7)}, tol=ULPS),
    case("GlobalMaxPool", {"x": f32(2, 5, 7, 7)}),
    # data movement
    case("Pad", {"x": f32(1, 2, 4, 5)},
         consts={"pads": np.array([0, 0, 1, 2, 0, 1, 3, 0], np.int64),
                 "v": _scalar(-1.5, np.float32)}),
    case("Pad", {"x": f32(2, 5, 6)}, consts={"pads": np.array([0, 2, 1, 0, 3, 2])},
         mode="reflect", id="Pad-reflect"),
    case("Pad", {"x": ints("int8", 3, 4)}, consts={"pads": np.array([1, 2, 2, 1])},
         mode="edge", id="Pad-edge-int8"),
    case("Transpose", {"x": f32(1, 8, 5, 6)}, perm=[0, 2, 3, 1]),
    case("Transpose", {"x": ints("int8", 3, 17, 5)}, id="Transpose-int8-default-perm"),
    case("Concat", {"a": f32(1, 2, 3, 3)}, ["a", "c", "a"], consts={"c": f32(1, 4, 3, 3)},
         axis=1),
    case("Concat", {"a": ints("int8", 2, 3), "b": ints("int8", 2, 5)}, axis=-1,
         id="Concat-int8"),
    case("Resize", {"x": f32(1, 2, 4, 5)}, ["x", "", "s"],
         consts={"s": np.array([1, 1, 2, 3], np.float32)}, mode="nearest",
         coordinate_transformation_mode="asymmetric", nearest_mode="floor",
         id="Resize-nearest-scales"),
    case("Resize", {"x": f32(1, 3, 5, 6)}, ["x", "", "", "sizes"],
         consts={"sizes": np.array([1, 3, 9, 4], np.int64)}, mode="linear", tol=FLOAT,
         id="Resize-linear-sizes"),
    case("Resize", {"x": f32(1, 2, 5, 7)}, ["x", "", "s"],
         consts={"s": np.float32([1, 1, 0.6, 1.7])}, mode="linear",
         coordinate_transformation_mode="align_corners", tol=FLOAT,
         id="Resize-linear-align-corners"),
    case("Resize", {"x": ints("int8", 1, 2, 3, 4)}, ["x", "", "", "sizes"],
         consts={"sizes": np.array([1, 2, 7, 9], np.int64)}, id="Resize-nearest-int8"),
    # views
    case("Flatten", {"x": f32(2, 3, 4)}, axis=2),
    case("Reshape", {"x": ints("int8", 2, 3, 4)}, consts={"shape": np.array([4, -1])}),
    case("Squeeze", {"x": f32(1, 3, 1, 4)}, consts={"axes": np.array([0, 2])}),
    case("Unsqueeze", {"x": f32(3, 4)}, consts={"axes": np.array([0, -1])}),
    case("Identity", {"x": ints("uint8", 5)}),
]


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("c", CASES)
def test_standard_op_matches_onnxruntime(c: Case) -> None:
    model = c.model()
    graph = import_onnx(model)
    [node] = graph.nodes
    steps = lower_node_to_cpu(graph, node)
    assert [s.op for s in steps] == [c.op] * len(steps)
    assert steps[-1].name == node.name
    env = dict(c.feeds)
    run_cpu_steps(steps, env)
    for i, expected in enumerate(_onnxruntime(model, c.feeds)):
        got = env[f"y{i}"]
        assert got.dtype == expected.dtype and got.shape == expected.shape, (i, got.dtype)
        if c.tol is EXACT:
            np.testing.assert_array_equal(got, expected)
        else:
            np.testing.assert_allclose(got, expected, rtol=c.tol[0], atol=c.tol[1])


def test_views_have_no_kernel() -> None:
    c = Case("Flatten", {"x": f32(2, 3, 4)}, ["x"])
    graph = import_onnx(c.model())
    [step] = lower_node_to_cpu(graph, graph.nodes[0])
    assert step.kernel is None and step.shape == (2, 12) and step.inputs == ("x",)


# ------------------------------------------------------------- tessera integer nodes
@pytest.fixture(scope="module")
def quantized() -> dict[str, tuple[Graph, dict[str, np.ndarray]]]:
    """Fused QDQ graphs of the zoo with qref's values of every tensor, per model."""
    out = {}
    for name, make in (("lenet", zoo.lenet), ("small_resnet", zoo.small_resnet)):
        model = make()
        graph = import_onnx(zoo.to_qdq(model, zoo.calibration_data(model)))
        fuse_qdq(graph)
        rng = np.random.default_rng(5)
        feed = {"input": rng.standard_normal(graph.values["input"].shape, dtype=np.float32)}
        names = [o for n in graph.nodes for o in n.outputs]
        out[name] = (graph, {**feed, **run_reference(graph, feed, outputs=names)})
    return out


def _run_node(graph: Graph, node_name: str, values: dict[str, np.ndarray]) -> np.ndarray:
    """The node's output computed by its CPU steps from qref's values of its inputs."""
    node = graph.node(node_name)
    env = {n: values[n] for n in node.inputs if n and not graph.values[n].is_const}
    run_cpu_steps(lower_node_to_cpu(graph, node), env)
    return env[node.outputs[0]]


def test_lenet_runs_on_cpu_bit_exact(quantized) -> None:
    """Every node of the fused LeNet (Q, QConv, QMaxPool, Flatten, QGemm, DQ) lowered and
    chained: each tensor equals qref's, the logits included."""
    graph, values = quantized["lenet"]
    env = {"input": values["input"]}
    for node in graph.nodes:
        run_cpu_steps(lower_node_to_cpu(graph, node), env)
        for name in node.outputs:
            assert env[name].dtype == values[name].dtype, node
            np.testing.assert_array_equal(env[name], values[name], err_msg=str(node))


@pytest.mark.parametrize("node_name", [
    "conv1_QConv",                     # 3 input channels (direct path), pads, x_zp 0
    "layer1.0.conv1_QConv",            # GEMM path, pads with x_zp -128
    "layer2.0.downsample.0_QConv",     # 1x1 stride 2, no pads
    "layer2.0.conv1_QConv",            # 3x3 stride 2, pads
    "layer1.0.add_QAdd",
    "layer3.0.add_QAdd",
    "avgpool_QGlobalAveragePool",
    "fc_QGemm",
])
def test_small_resnet_nodes_bit_exact(quantized, node_name: str) -> None:
    graph, values = quantized["small_resnet"]
    node = graph.node(node_name)
    got = _run_node(graph, node_name, values)
    assert got.dtype == values[node.outputs[0]].dtype
    np.testing.assert_array_equal(got, values[node.outputs[0]])


def test_qconv_steps(quantized) -> None:
    graph, _ = quantized["small_resnet"]
    node = graph.node("layer1.0.conv1_QConv")
    steps = lower_node_to_cpu(graph, node)
    assert [s.name for s in steps] == [f"{node.name}:conv", node.name]
    conv, requant = steps
    assert conv.outputs == requant.inputs[:1] == (f"{node.name}:acc",)
    assert node.inputs[1] in conv.constants       # the weight, by its graph name
    # Padding with a nonzero zero point: the correction depends on the pixel.
    assert requant.constants[f"{node.name}:offset"].shape == (1, 16, 32, 32)


def _uint8_graph() -> Graph:
    """uint8 activations, which the int8 kernels take shifted by 128: a depthwise dilated
    QConv with pads and a narrowed output range, a QGlobalAveragePool, a QGemm."""
    rng = np.random.default_rng(11)
    g = Graph("uint8")
    g.add_input("x", (2, 8, 9, 9), "uint8")
    g.add_const("w", rng.integers(-127, 128, (8, 1, 3, 3)).astype(np.int8))
    g.add_const("bias", rng.integers(-3000, 3000, 8).astype(np.int32))
    g.add_value("y", (2, 8, 9, 9), "uint8")
    g.add_node("QConv", ["x", "w", "bias"], ["y"], name="dw", domain=DOMAIN,
               x_scale=0.02, x_zero_point=200, w_scale=rng.uniform(0.002, 0.01, 8)
               .astype(np.float32), w_zero_point=np.zeros(8, np.int64), y_scale=0.05,
               y_zero_point=30, y_min=30, y_max=240, strides=[1, 1], pads=[2, 2, 2, 2],
               dilations=[2, 2], group=8)
    g.add_value("p", (2, 8, 1, 1), "uint8")
    g.add_node("QGlobalAveragePool", ["y"], ["p"], name="gap", domain=DOMAIN, x_scale=0.05,
               x_zero_point=30, y_scale=0.01, y_zero_point=5)
    g.add_value("f", (2, 8), "uint8")
    g.add_const("shape", np.array([2, 8], np.int64))
    g.add_node("Reshape", ["p", "shape"], ["f"], name="flat")
    g.add_const("w2", rng.integers(-127, 128, (5, 8)).astype(np.int8))
    g.add_value("z", (2, 5), "uint8")
    g.add_node("QGemm", ["f", "w2"], ["z"], name="fc", domain=DOMAIN, x_scale=0.01,
               x_zero_point=5, w_scale=np.float32([0.01]), w_zero_point=np.zeros(5, np.int64),
               y_scale=0.02, y_zero_point=128, y_min=0, y_max=255)
    g.outputs = ["z"]
    g.verify()
    return g


def test_uint8_nodes_bit_exact() -> None:
    graph = _uint8_graph()
    x = np.random.default_rng(3).integers(0, 256, (2, 8, 9, 9)).astype(np.uint8)
    values = run_reference(graph, {"x": x}, outputs=["y", "p", "f", "z"])
    env = {"x": x}
    for node in graph.nodes:
        steps = lower_node_to_cpu(graph, node)
        run_cpu_steps(steps, env)
        np.testing.assert_array_equal(env[node.outputs[0]], values[node.outputs[0]],
                                      err_msg=str(node))
    assert lower_node_to_cpu(graph, graph.node("dw"))[0].name == "dw:x_int8"


def _qadd_graph(dtype: str, **attrs: Any) -> Graph:
    """A QAdd over every pair of ``dtype`` values: a is the row, b the column index."""
    g = Graph("qadd")
    g.add_input("a", (256, 256), dtype)
    g.add_input("b", (256, 256), dtype)
    g.add_value("y", (256, 256), dtype)
    g.add_node("QAdd", ["a", "b"], ["y"], name="add", domain=DOMAIN, **attrs)
    g.outputs = ["y"]
    return g


#: Scales where the float32 formula without FMA differs from qref on some pairs.
QADD_PARAMS = [
    ("int8", dict(a_scale=0.05606423318386078, b_scale=0.04325571656227112,
                  y_scale=0.021712562069296837, a_zero_point=29, b_zero_point=-38,
                  y_zero_point=-12, y_min=-128, y_max=127)),
    ("uint8", dict(a_scale=0.06916896998882294, b_scale=0.06060390919446945,
                   y_scale=0.02350560389459133, a_zero_point=191, b_zero_point=110,
                   y_zero_point=173, y_min=0, y_max=200)),
]


@pytest.mark.parametrize("dtype, attrs", QADD_PARAMS, ids=["int8", "uint8"])
def test_qadd_equals_qref_on_every_pair(dtype: str, attrs: dict) -> None:
    graph = _qadd_graph(dtype, **attrs)
    node = graph.node("add")
    coefficients = lower_quantized._qadd_coefficients(attrs)
    info = np.iinfo(dtype)
    bounds = (max(info.min, attrs["y_min"]), min(info.max, attrs["y_max"]))
    assert lower_quantized._qadd_patches(node, dtype, dtype, coefficients, bounds)  # corrected
    values = np.arange(info.min, int(info.max) + 1).astype(dtype)
    a, b = np.meshgrid(values, values, indexing="ij")
    expected = run_reference(graph, {"a": a, "b": b})["y"]
    env = {"a": a, "b": b}
    run_cpu_steps(lower_node_to_cpu(graph, node), env)
    np.testing.assert_array_equal(env["y"], expected)


# ------------------------------------------------------------------ unsupported nodes
def _float64_conv_graph() -> Graph:
    c = Case("Conv", {"x": f32(1, 2, 6, 6).astype(np.float64)}, ["x", "w"],
             {"w": f32(4, 2, 3, 3).astype(np.float64)})
    return import_onnx(c.model())


def test_float64_conv_is_unsupported() -> None:
    """Float32 convolutions run on the CPU (tests/compiler/cpu/test_linear_ops.py); a
    float64 one is refused, naming the node and what to do."""
    graph = _float64_conv_graph()
    node = graph.nodes[0]
    reason = cpu_unsupported_reason(graph, node)
    assert reason is not None and "float64" in reason and "cast it" in reason
    with pytest.raises(CompileError, match="conv_node") as info:
        lower_node_to_cpu(graph, node)
    assert info.value.op == node.name and reason in str(info.value)


def test_unknown_op_is_unsupported() -> None:
    g = Graph("nms")
    g.add_input("boxes", (1, 10, 4), "float32")
    g.add_input("scores", (1, 1, 10), "float32")
    g.add_value("selected", (3, 3), "int64")
    node = g.add_node("NonMaxSuppression", ["boxes", "scores"], ["selected"], name="nms_1")
    assert "NonMaxSuppression" in cpu_unsupported_reason(g, node)
    with pytest.raises(CompileError, match="nms_1"):
        lower_node_to_cpu(g, node)
    foreign = g.add_node("QFoo", ["boxes"], ["selected"], name="foo", domain=DOMAIN)
    assert "QConv" in cpu_unsupported_reason(g, foreign)


@pytest.mark.parametrize("c, words", [
    (Case("MaxPool", {"x": f32(1, 1, 5, 5)}, ["x"], attrs={"kernel_shape": [2, 2],
                                                          "ceil_mode": 1}), "ceil_mode"),
    (Case("Resize", {"x": f32(1, 1, 4, 4)}, ["x", "", "s"],
          {"s": np.array([1, 1, 2, 2], np.float32)}, {"mode": "cubic"}), "cubic"),
    (Case("Pow", {"a": ints("int32", 3), "b": f32(3)}, ["a", "b"]), "float32"),
    (Case("ReduceMean", {"x": ints("int32", 3, 4)}, ["x"]), "int32"),
    (Case("Cast", {"x": f32(3)}, ["x"], attrs={"to": TensorProto.DOUBLE}), "float64"),
    (Case("Pad", {"x": f32(4, 4)}, ["x", "p"], {"p": np.array([0, -1, 0, 0])}), "negative"),
], ids=["ceil_mode", "cubic", "int-pow", "int-mean", "cast-float64", "crop"])
def test_unsupported_attribute_or_dtype(c: Case, words: str) -> None:
    graph = import_onnx(c.model())
    node = graph.nodes[0]
    assert words in cpu_unsupported_reason(graph, node)
    with pytest.raises(CompileError, match=node.name):
        lower_node_to_cpu(graph, node)


def test_supported_node_has_no_reason(quantized) -> None:
    graph, _ = quantized["lenet"]
    assert all(cpu_unsupported_reason(graph, n) is None for n in graph.nodes)


# ----------------------------------------------------------------- steps as records
def test_step_round_trips_through_json(quantized) -> None:
    graph, values = quantized["lenet"]
    node = graph.node("conv2_QConv")
    steps = lower_node_to_cpu(graph, node)
    store = {n: a for s in steps for n, a in s.constants.items()}
    records = json.loads(json.dumps([s.to_dict() for s in steps]))
    assert all(isinstance(name, str) for r in records for name in r["constants"])
    loaded = [CpuStep.from_dict(r, store) for r in records]
    assert [s.to_dict() for s in loaded] == [s.to_dict() for s in steps]
    env = {node.inputs[0]: values[node.inputs[0]]}
    run_cpu_steps(loaded, env)
    np.testing.assert_array_equal(env[node.outputs[0]], values[node.outputs[0]])
    with pytest.raises(CpuKernelError, match="constant"):
        CpuStep.from_dict(records[0], {})


def test_missing_input_is_reported() -> None:
    step = CpuStep("v", "Flatten", None, ("x",), ("y",), shape=(4,))
    with pytest.raises(CpuKernelError, match="'x'"):
        run_cpu_steps([step], {})
    env = {"x": np.arange(4).reshape(2, 2)}
    run_cpu_steps([step], env)
    assert env["y"].shape == (4,)
