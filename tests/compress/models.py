"""Tiny hand-built float ONNX models for the pruner's tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def dense_chain(seed: int = 0, batch: int = 2) -> onnx.ModelProto:
    """x (batch, 16) -> MatMul W (16, 32) -> Relu -> Gemm transB=0 (32, 24) -> Relu ->
    Gemm transB=1 (8, 24) -> y: the three weight layouts of dense layers."""
    rng = np.random.default_rng(seed)

    def weight(name: str, shape: tuple[int, int], fan_in: int) -> onnx.TensorProto:
        w = rng.standard_normal(shape).astype(np.float32) * np.sqrt(2 / fan_in)
        return numpy_helper.from_array(w, name)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm"),
             helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
             helper.make_node("Gemm", ["r1", "w2"], ["h2"], name="gemm_kn", transB=0),
             helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
             helper.make_node("Gemm", ["r2", "w3"], ["y"], name="gemm_nk", transB=1)]
    graph = helper.make_graph(
        nodes, "dense_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8])],
        [weight("w1", (16, 32), 16), weight("w2", (32, 24), 32), weight("w3", (8, 24), 24)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def feeds(model: onnx.ModelProto, n: int = 3, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """``n`` random normal feeds of the model's one input."""
    rng = np.random.default_rng(seed)
    x = model.graph.input[0]
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
    return [{x.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]
