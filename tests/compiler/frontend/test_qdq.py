"""QDQ fusion (``fuse_qdq``) and the integer golden model (``run_reference``) against
onnxruntime's int8 kernels, node by node, on the zoo's QDQ models."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler import zoo
from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qdq import DOMAIN, fuse_qdq
from tessera.compiler.golden.quantized import run_reference
from tests.compiler.qdq_models import exposed, session

MODELS = ("mlp", "lenet", "small_resnet", "mobilenet")
#: Fused op each float op of the zoo models must become.
FUSED = {"Conv": "QConv", "Gemm": "QGemm", "Add": "QAdd", "MaxPool": "QMaxPool",
         "GlobalAveragePool": "QGlobalAveragePool"}


@pytest.fixture(scope="module", params=MODELS)
def case(request) -> tuple[str, onnx.ModelProto, onnx.ModelProto, Graph]:
    """(name, float model, QDQ model, fused graph)."""
    model = zoo.ZOO[request.param]()
    qdq = zoo.to_qdq(model, zoo.calibration_data(model))
    graph = import_onnx(qdq)
    fuse_qdq(graph)
    return request.param, model, qdq, graph


def test_every_layer_fuses(case) -> None:
    name, model, _, graph = case
    graph.verify()
    expected = Counter(FUSED[n.op_type] for n in model.graph.node if n.op_type in FUSED)
    fused = Counter(n.op for n in graph.nodes if n.domain == DOMAIN)
    assert fused == expected
    # What stays: the input's Q, the logits' DQ and the int8 Flatten.
    assert Counter(n.op for n in graph.nodes if not n.domain) <= Counter(
        {"QuantizeLinear": 1, "DequantizeLinear": 1, "Flatten": 1})
    # The float weights went with their DequantizeLinear nodes: only Q/DQ scales are left.
    assert all(v.size == 1 for v in graph.values.values() if v.is_const and v.dtype == "float32")


def test_matches_onnxruntime_node_by_node(case) -> None:
    """Every fused node's int8 output and the logits against onnxruntime, on random
    inputs. Measured on x86 AVX2 (onnxruntime 1.31.1): all bit-exact."""
    name, _, qdq, graph = case
    fused = [n for n in graph.nodes if n.domain == DOMAIN]
    names = [n.outputs[0] for n in fused]
    ort_session = session(exposed(qdq, names))
    rng = np.random.default_rng(7)
    per_op: dict[str, list[int]] = {}
    for _ in range(2):
        feed = {"input": rng.standard_normal(graph.values["input"].shape, dtype=np.float32)}
        got = ort_session.run(None, feed)
        ref = run_reference(graph, feed, outputs=[*graph.outputs, *names])
        np.testing.assert_allclose(ref[graph.outputs[0]], got[0], rtol=0, atol=0)
        for node, actual in zip(fused, got[1:]):
            diff = np.abs(actual.astype(np.int64) - ref[node.outputs[0]].astype(np.int64))
            counts = per_op.setdefault(node.op, [0, 0, 0])
            counts[0] += diff.size
            counts[1] += int(np.count_nonzero(diff))
            counts[2] = max(counts[2], int(diff.max()))
    for op, (total, different, worst) in per_op.items():
        assert different <= total * 1e-3 and worst <= 1, (name, op, different, total, worst)


# ----------------------------------------------------------------- hand-built patterns
def _dense_model(weight_zero_point: int = 0) -> onnx.ModelProto:
    """Q -> DQ -> MatMul(DQ(w (K, N), axis 1)) + DQ(int32 bias) -> Relu -> Q -> DQ."""
    rng = np.random.default_rng(3)
    k, n = 24, 8
    x_scale, y_scale = np.float32(0.05), np.float32(0.1)
    w_scale = rng.uniform(0.005, 0.02, n).astype(np.float32)
    consts = {
        "x_scale": x_scale, "x_zp": np.int8(3), "y_scale": y_scale, "y_zp": np.int8(-5),
        "w": rng.integers(-127, 128, (k, n)).astype(np.int8), "w_scale": w_scale,
        "w_zp": np.full(n, weight_zero_point, np.int8),
        "b": rng.integers(-500, 500, n).astype(np.int32), "b_scale": x_scale * w_scale,
        "b_zp": np.zeros(n, np.int32)}
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "x_scale", "x_zp"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xf"]),
        helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zp"], ["wf"], axis=1),
        helper.make_node("DequantizeLinear", ["b", "b_scale", "b_zp"], ["bf"], axis=0),
        helper.make_node("MatMul", ["xf", "wf"], ["mm"]),
        helper.make_node("Add", ["mm", "bf"], ["pre"]),
        helper.make_node("Relu", ["pre"], ["act"]),
        helper.make_node("QuantizeLinear", ["act", "y_scale", "y_zp"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["logits"])]
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, k])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, n])],
        [numpy_helper.from_array(np.asarray(v), name) for name, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_matmul_bias_relu_fuses_and_matches_onnxruntime() -> None:
    model = _dense_model()
    graph = import_onnx(model)
    assert fuse_qdq(graph) == 1
    (dense,) = [n for n in graph.nodes if n.domain == DOMAIN]
    assert dense.op == "QGemm" and len(dense.inputs) == 3
    # Relu clamps at the quantized zero; the (K, N) weight is stored (N, K).
    assert (dense.attrs["y_min"], dense.attrs["y_max"]) == (-5, 127)
    assert graph.values[dense.inputs[1]].shape == (8, 24)
    feed = {"input": np.random.default_rng(4).standard_normal((2, 24), dtype=np.float32) * 3}
    expected = session(model).run(None, feed)[0]
    np.testing.assert_array_equal(run_reference(graph, feed)["logits"], expected)


def test_weight_zero_points_are_subtracted_from_the_weights() -> None:
    model = _dense_model(weight_zero_point=1)
    graph = import_onnx(model)
    assert fuse_qdq(graph) == 1
    (dense,) = [n for n in graph.nodes if n.domain == DOMAIN]
    stored = graph.values[dense.inputs[1]].data
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w"))
    np.testing.assert_array_equal(stored, (w.astype(np.int16) - 1).T)
    feed = {"input": np.random.default_rng(4).standard_normal((2, 24), dtype=np.float32) * 3}
    np.testing.assert_array_equal(run_reference(graph, feed)["logits"],
                                  session(model).run(None, feed)[0])


def test_float_tensor_read_twice_stays_unfused() -> None:
    model = _dense_model()
    model.graph.output.append(helper.make_tensor_value_info("pre", TensorProto.FLOAT, [2, 8]))
    graph = import_onnx(model)
    assert fuse_qdq(graph) == 0
    graph.verify()
