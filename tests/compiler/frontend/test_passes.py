"""Graph passes (BatchNormalization folding, Identity removal) and static quantization."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler import zoo
from tessera.compiler.frontend.onnx_import import import_onnx, to_onnx
from tessera.compiler.frontend.passes import fold_batch_norm, remove_identity
from tessera.compiler.frontend.quantize import is_quantized, quantize_static
from tessera.errors import CompileError

FLOAT_NETS = ("lenet", "small_resnet", "mobilenet")


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    return {name: zoo.ZOO[name]() for name in FLOAT_NETS}


def _run(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """Every output of every feed, without onnxruntime's graph optimisations (which fold
    BatchNormalization themselves): the reference is the model as written."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return [out for feed in feeds for out in session.run(None, feed)]


def _assert_same(original: onnx.ModelProto, graph, feeds) -> None:
    """``graph`` computes what ``original`` does, up to float32 rounding."""
    graph.verify()
    for ours, ref in zip(_run(to_onnx(graph), feeds), _run(original, feeds), strict=True):
        # Folding reassociates float32 arithmetic: through MobileNet's 27 layers that moves
        # the logits by ~1e-5 of their range (onnxruntime's own fusion moves them as much).
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=2e-5 * np.abs(ref).max())


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    """An opset-17 model of float tensors given as (name, shape)."""
    def info(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    graph = helper.make_graph(nodes, "test", [info(*i) for i in inputs],
                              [info(*o) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = zoo.IR_VERSION
    return model


def _bn_params(prefix: str, channels: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {f"{prefix}.scale": rng.normal(1, 0.2, channels).astype(np.float32),
            f"{prefix}.bias": rng.normal(0, 0.2, channels).astype(np.float32),
            f"{prefix}.mean": rng.normal(0, 0.5, channels).astype(np.float32),
            f"{prefix}.var": rng.uniform(0.5, 2, channels).astype(np.float32)}


def _bn(prefix: str, x: str, y: str) -> onnx.NodeProto:
    return helper.make_node("BatchNormalization", [x] + [f"{prefix}.{p}" for p in
                            ("scale", "bias", "mean", "var")], [y], name=prefix, epsilon=1e-3)


def _feeds(model: onnx.ModelProto, n: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim],
                                         dtype=np.float32) for i in model.graph.input}
            for _ in range(n)]


# ------------------------------------------------------------------ fold_batch_norm
@pytest.mark.parametrize("name", FLOAT_NETS)
def test_passes_keep_zoo_models_equivalent(models, name):
    model = models[name]
    graph = import_onnx(model)
    bns = graph.ops().count("BatchNormalization")
    assert fold_batch_norm(graph) == bns
    assert remove_identity(graph) == 0
    graph.verify()
    assert "BatchNormalization" not in graph.ops()
    assert graph.ops().count("Conv") == Counter(n.op_type for n in model.graph.node)["Conv"]
    _assert_same(model, graph, zoo.calibration_data(model, n=2))


def test_fold_conv_with_bias_shared_weights_and_gemm():
    """A biased Conv, two bias-free Convs sharing one weight, and a Gemm, each + BN."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
               "b": rng.standard_normal(4).astype(np.float32),
               "w2": rng.standard_normal((4, 4, 1, 1)).astype(np.float32),
               "fc.w": rng.standard_normal((5, 64)).astype(np.float32),
               "fc.b": rng.standard_normal(5).astype(np.float32),
               "flat": np.array([1, 64], dtype=np.int64)}
    for prefix, channels in (("bn1", 4), ("bn2", 4), ("bn3", 4), ("bn4", 5)):
        weights.update(_bn_params(prefix, channels, rng))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c1"], pads=[1, 1, 1, 1]),
             _bn("bn1", "c1", "y1"),
             helper.make_node("Conv", ["y1", "w2"], ["c2"]), _bn("bn2", "c2", "y2"),
             helper.make_node("Conv", ["y2", "w2"], ["c3"]), _bn("bn3", "c3", "y3"),
             helper.make_node("Reshape", ["y3", "flat"], ["f"]),
             helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["g"], transB=1),
             _bn("bn4", "g", "out")]
    model = _model(nodes, [("x", [1, 3, 4, 4])], [("out", [1, 5])], weights)
    graph = import_onnx(model)
    assert fold_batch_norm(graph) == 4
    assert graph.ops() == ["Conv", "Conv", "Conv", "Reshape", "Gemm"]
    assert "w2" not in graph.values            # each Conv got its own folded copy
    _assert_same(model, graph, _feeds(model))


@pytest.mark.parametrize("elsewhere", ["read by another node", "a graph output"])
def test_bn_stays_when_conv_output_is_used_elsewhere(elsewhere):
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((4, 3, 1, 1)).astype(np.float32),
               **_bn_params("bn", 4, rng)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), _bn("bn", "c", "y")]
    outputs = [("out", [1, 4, 4, 4])]
    if elsewhere == "a graph output":
        nodes.append(helper.make_node("Relu", ["y"], ["out"]))
        outputs.append(("c", [1, 4, 4, 4]))
    else:
        nodes += [helper.make_node("Relu", ["c"], ["r"]),
                  helper.make_node("Add", ["y", "r"], ["out"])]
    model = _model(nodes, [("x", [1, 3, 4, 4])], outputs, weights)
    graph = import_onnx(model)
    assert fold_batch_norm(graph) == 0
    assert "BatchNormalization" in graph.ops()
    _assert_same(model, graph, _feeds(model))


# ------------------------------------------------------------------ remove_identity
def test_remove_identity_and_dropout():
    """Identity and Dropout go, the graph output ``out`` (an Identity's output) keeps its
    name; the Identity copying graph input to graph output ``copy`` must stay."""
    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Dropout", ["b", "ratio"], ["c", "mask"]),
             helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("Identity", ["d"], ["out"]),
             helper.make_node("Identity", ["x"], ["copy"])]
    model = _model(nodes, [("x", [2, 3])], [("out", [2, 3]), ("copy", [2, 3])],
                   {"ratio": np.array(0.5, dtype=np.float32)})
    graph = import_onnx(model)
    assert remove_identity(graph) == 3
    graph.verify()
    assert graph.ops() == ["Relu", "Relu", "Identity"]
    assert graph.outputs == ["out", "copy"] and graph.producer("out").op == "Relu"
    assert not {"a", "c", "d", "mask", "ratio"} & set(graph.values)
    _assert_same(model, graph, _feeds(model))


def test_dropout_in_training_mode_stays():
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["out"])]
    model = _model(nodes, [("x", [2, 3])], [("out", [2, 3])],
                   {"ratio": np.array(0.0, dtype=np.float32)})
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "training"))
    graph = import_onnx(model)
    assert remove_identity(graph) == 0 and graph.ops() == ["Dropout"]


# ------------------------------------------------------------------ quantization
@pytest.fixture(scope="module")
def lenet_qdq(models) -> onnx.ModelProto:
    model = models["lenet"]
    return quantize_static(model, zoo.calibration_data(model, n=4))


def test_quantize_static_wraps_every_conv_and_gemm_in_qdq(models, lenet_qdq):
    producers = {o: n for n in lenet_qdq.graph.node for o in n.output}
    readers: dict[str, list[str]] = {}
    for node in lenet_qdq.graph.node:
        for i in node.input:
            readers.setdefault(i, []).append(node.op_type)
    layers = [n for n in lenet_qdq.graph.node if n.op_type in ("Conv", "Gemm")]
    assert len(layers) == 4
    for node in layers:
        assert [producers[i].op_type for i in node.input] == ["DequantizeLinear"] * 3, node.name
        assert readers[node.output[0]] == ["QuantizeLinear"], node.name
    assert is_quantized(import_onnx(lenet_qdq))
    assert not is_quantized(import_onnx(models["lenet"]))


def _activation_zero_points(qdq: onnx.ModelProto) -> set[int]:
    consts = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    return {int(consts[n.input[2]]) for n in qdq.graph.node
            if n.op_type == "QuantizeLinear" and n.input[2] in consts}


def test_quantize_static_activation_zero_points(models, lenet_qdq):
    """Asymmetric by default (a ReLU output gets zero point -128); symmetric on request."""
    assert -128 in _activation_zero_points(lenet_qdq)
    model = models["lenet"]
    symmetric = quantize_static(model, zoo.calibration_data(model, n=4),
                                symmetric_activations=True)
    assert _activation_zero_points(symmetric) == {0}


def _good(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return zoo.calibration_data(model, n=1)[0]


@pytest.mark.parametrize("bad, message", [
    ({}, "lacks input 'input'"),
    ({"input": np.zeros((1, 1, 28, 27), np.float32)}, "input 'input', has shape [1, 1, 28, 27]"),
    ({"input": np.zeros((1, 1, 28, 28), np.float64)}, "input 'input', has dtype float64"),
    ({"input": np.full((1, 1, 28, 28), np.nan, np.float32)}, "input 'input', holds 784 NaN"),
    ({"input": np.zeros((1, 1, 28, 28), np.float32), "extra": np.zeros(1)}, "feeds 'extra'"),
])
def test_quantize_static_names_the_bad_sample_and_input(models, bad, message):
    model = models["lenet"]
    with pytest.raises(CompileError) as info:
        quantize_static(model, [_good(model), bad])
    assert "calibration sample 1" in str(info.value) and message in str(info.value)


@pytest.mark.parametrize("calibration", [[], iter(())])
def test_quantize_static_needs_calibration_data(models, calibration):
    with pytest.raises(CompileError, match="non-empty list of input feeds"):
        quantize_static(models["lenet"], calibration)
