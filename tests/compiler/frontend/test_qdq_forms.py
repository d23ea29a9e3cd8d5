"""Every QDQ form onnxruntime's ``quantize_static`` writes (per-tensor or per-channel,
scalar or one-element parameters, int8 or uint8 activations and weights, symmetric or
not) fuses completely, and the golden model of the fused graph is bit-identical to
onnxruntime node by node; the constant DQ chains fusion leaves fold into constants."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.cpu.lower import cpu_unsupported_reason
from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qdq import DOMAIN, fuse_qdq
from tessera.compiler.frontend.quantize import quantize_static
from tessera.compiler.golden.check import int8_agreement, output_scales
from tessera.compiler.golden.quantized import run_reference
from tessera.errors import CompileError
from tests.compiler.qdq_models import FORMS, exposed, feeds, ort_quantize, pool_net, session

#: What pool_net's float ops fuse into.
FUSED = Counter({"QConv": 3, "QGemm": 1, "QAdd": 1, "QMaxPool": 1, "QAveragePool": 1,
                 "QGlobalAveragePool": 1})


@pytest.fixture(scope="module", params=list(FORMS))
def form(request) -> tuple[str, onnx.ModelProto, Graph]:
    """(form name, onnxruntime's QDQ model of pool_net, its fused graph)."""
    model = pool_net()
    qdq = ort_quantize(model, feeds(model, 8), pre_process=False, **FORMS[request.param])
    graph = import_onnx(qdq)
    fuse_qdq(graph)
    return request.param, qdq, graph


def test_every_form_fuses_every_layer(form) -> None:
    name, qdq, graph = form
    assert Counter(n.op for n in graph.nodes if n.domain == DOMAIN) == FUSED, name
    # Left: the input's Q, the int8 Flatten and the logits' DQ; nothing for the CPU to
    # refuse.
    assert Counter(n.op for n in graph.nodes if not n.domain) == Counter(
        {"QuantizeLinear": 1, "Flatten": 1, "DequantizeLinear": 1})
    assert all(cpu_unsupported_reason(graph, n) is None for n in graph.nodes)


def test_every_form_matches_onnxruntime_node_by_node(form) -> None:
    """Every fused node's output (a uint8 tensor stored minus 128) and the logits
    against onnxruntime, on random inputs: all bit-identical."""
    name, qdq, graph = form
    fused = [n for n in graph.nodes if n.domain == DOMAIN]
    names = [n.outputs[0] for n in fused]
    ort_session = session(exposed(qdq, names))
    for feed in feeds(pool_net(), 3, seed=5):
        got = ort_session.run(None, feed)
        ref = run_reference(graph, feed, outputs=[*graph.outputs, *names])
        np.testing.assert_array_equal(ref["y"], got[0])
        for node, actual in zip(fused, got[1:]):
            stored = actual.astype(np.int64) - (128 if actual.dtype == np.uint8 else 0)
            np.testing.assert_array_equal(ref[node.outputs[0]], stored,
                                          err_msg=f"{name}: {node.name}")


def test_uint8_activations_are_stored_as_int8(form) -> None:
    name, qdq, graph = form
    unsigned = "u8" in name
    activations = [v for v in graph.values.values() if not v.is_const
                   and v.dtype in ("int8", "uint8")]
    assert {v.dtype for v in activations} == {"int8"}
    for node in (n for n in graph.nodes if n.domain == DOMAIN):
        assert bool(node.attrs.get("from_uint8")) == unsigned, node.name
    q = next(n for n in graph.nodes if n.op == "QuantizeLinear")
    ort_zero_point = numpy_helper.to_array(next(
        t for t in qdq.graph.initializer if t.name == "x_zero_point"))
    assert graph.const(q.inputs[2]) == ort_zero_point.astype(np.int64) - 128 * unsigned


def test_weights_are_stored_minus_their_zero_points(form) -> None:
    """Per-tensor asymmetric weights span more than int8 once centred (int16, for the
    CPU); symmetric ones, uint8 with zero point 128 included, are int8."""
    name, _, graph = form
    dtypes = {graph.values[n.inputs[1]].dtype for n in graph.nodes
              if n.op in ("QConv", "QGemm")}
    assert dtypes == ({"int16"} if name in ("asymmetric-weights", "u8-weights") else {"int8"})
    for node in (n for n in graph.nodes if n.op in ("QConv", "QGemm")):
        assert not np.any(node.attrs["w_zero_point"])


@pytest.mark.parametrize("per_channel", [False, True])
def test_our_quantizer_fuses_every_layer(per_channel) -> None:
    """Per tensor, onnxruntime writes the bias scale as [1] and its zero point as []."""
    model = pool_net()
    qdq = quantize_static(model, feeds(model, 4), per_channel=per_channel)
    graph = import_onnx(qdq)
    fuse_qdq(graph)
    assert Counter(n.op for n in graph.nodes if n.domain == DOMAIN) == FUSED


def test_mismatched_parameter_shapes_name_the_node() -> None:
    model = pool_net()
    qdq = ort_quantize(model, feeds(model, 2), pre_process=False)
    for tensor in qdq.graph.initializer:
        if tensor.name == "x_zero_point":
            tensor.CopyFrom(numpy_helper.from_array(np.zeros(3, np.int8), tensor.name))
    graph = import_onnx(qdq)
    with pytest.raises(CompileError, match="'x_DequantizeLinear' has a scale of shape "
                                           r"\[\] but a zero point of shape \[3\]"):
        fuse_qdq(graph)


# ---------------------------------------------------------- constant DQ chains
def _scalar_model() -> onnx.ModelProto:
    """Conv -> Tanh -> Mul 0.5 -> Add 0.5 -> Conv, and a Mul of the input by 0.5: the
    scalar operands our quantizer writes as int8 constants behind a DQ."""
    rng = np.random.default_rng(2)
    consts = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
              "w2": rng.standard_normal((4, 8, 1, 1)).astype(np.float32) * 0.3,
              "half": np.array(0.5, np.float32)}
    make = helper.make_node
    nodes = [make("Mul", ["x", "half"], ["xs"], name="scale_input"),
             make("Conv", ["xs", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             make("Tanh", ["c"], ["t"], name="tanh"),
             make("Mul", ["t", "half"], ["m"], name="half_tanh"),
             make("Add", ["m", "half"], ["a"], name="shift"),
             make("Conv", ["a", "w2"], ["y"], name="head")]
    graph = helper.make_graph(
        nodes, "scalars", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_constant_dequantize_chains_fold_into_float_constants() -> None:
    """Our own quantizer's model of ``x * 0.5`` and ``Tanh -> Mul 0.5 -> Add 0.5``: no
    DequantizeLinear of constants is left for the CPU ("fold it in the model"), every
    node has a CPU kernel, and the scalar Muls and the Add are fused with their stored
    0.5 (QMul, QAdd), as onnxruntime runs them (QLinearMul, QLinearAdd): exact."""
    model = _scalar_model()
    qdq = quantize_static(model, feeds(model, 4))
    graph = import_onnx(qdq)
    dq_of_constants = [n for n in graph.nodes if n.op == "DequantizeLinear"
                       and graph.values[n.inputs[0]].is_const]
    assert len(dq_of_constants) >= 3                # the scalars and both weights
    fuse_qdq(graph)
    assert Counter(n.op for n in graph.nodes if n.domain == DOMAIN) == {
        "QConv": 2, "QMul": 2, "QAdd": 1}
    for node in graph.nodes:
        assert not all(graph.values[i].is_const for i in node.inputs if i), node.name
        assert cpu_unsupported_reason(graph, node) is None, node.name
    half_tanh = next(n for n in graph.nodes if n.name.startswith("half_tanh"))
    half = graph.const(half_tanh.inputs[1]).astype(np.float32)
    stored = (half - half_tanh.attrs["b_zero_point"]) * half_tanh.attrs["b_scale"]
    assert half.size == 1 and abs(float(stored) - 0.5) < 1e-2
    feed = feeds(model, 1, seed=9)[0]
    ref = run_reference(graph, feed)["y"]
    got = session(qdq).run(None, feed)[0]
    agreement = int8_agreement(ref, got, output_scales(qdq)["y"])
    assert agreement.fraction == 1.0, agreement


def test_folded_constants_are_onnxruntimes_values() -> None:
    """DQ of a per-channel int8 and of an int32 constant, and a Q of a float constant
    read by a DQ, folded by fold_constant_dequantize: the constants equal what
    onnxruntime's DequantizeLinear/QuantizeLinear compute."""
    from tessera.compiler.frontend.passes import fold_constant_dequantize
    rng = np.random.default_rng(6)
    consts = {"w": rng.integers(-128, 128, (2, 3, 4)).astype(np.int8),
              "w_scale": rng.uniform(0.001, 0.1, 3).astype(np.float32),
              "w_zp": rng.integers(-5, 5, 3).astype(np.int8),
              "b": rng.integers(-2**30, 2**30, (2, 3, 4)).astype(np.int32),
              "b_scale": np.float32(1.7e-7), "f": rng.standard_normal((2, 3, 4)).astype(
                  np.float32), "f_scale": np.float32(0.013), "f_zp": np.uint8(131)}
    make = helper.make_node
    nodes = [make("DequantizeLinear", ["w", "w_scale", "w_zp"], ["wf"], axis=1),
             make("DequantizeLinear", ["b", "b_scale"], ["bf"]),
             make("QuantizeLinear", ["f", "f_scale", "f_zp"], ["fq"]),
             make("DequantizeLinear", ["fq", "f_scale", "f_zp"], ["ff"]),
             make("Sum", ["x", "wf", "bf", "ff"], ["y"])]
    graph_proto = helper.make_graph(
        nodes, "consts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [2, 3, 4])
         for t in ("y", "wf", "bf", "ff")],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    graph = import_onnx(model)
    assert fold_constant_dequantize(graph) == 4
    assert graph.ops() == ["Sum"]
    expected = session(model).run(None, {"x": np.zeros((2, 3, 4), np.float32)})
    for name, want in zip(("wf", "bf", "ff"), expected[1:]):
        np.testing.assert_array_equal(graph.const(name), want, err_msg=name)
