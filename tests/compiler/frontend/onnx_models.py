"""Shared helpers of the ONNX import tests: small models built with onnx.helper, onnxruntime
runs, and the round trip (import, export, same outputs)."""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import import_onnx, to_onnx

F = TensorProto.FLOAT


def make_model(nodes, inputs, outputs, initializers=(), opset=17, ir_version=None
               ) -> onnx.ModelProto:
    """A model from nodes; inputs and outputs are (name, shape) pairs of float tensors
    (a shape of None: unknown). ``ir_version`` defaults to the one the opset needs (at
    least 8, ONNX's for opset 17)."""
    graph = helper.make_graph(
        nodes, "test", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(initializers).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version or (8 if opset >= 13 else _ir_of(opset))
    return model


def _ir_of(opset: int) -> int:
    return helper.find_min_ir_version_for([helper.make_opsetid("", opset)])


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    # No graph optimisation: both models run the same kernels, so outputs match bit for bit.
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # old models' unused initializers are not news
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def round_trip(model: onnx.ModelProto, input_shapes=None, seed=0) -> Graph:
    """Import, verify, export; both models give identical outputs on a random input."""
    graph = import_onnx(model, input_shapes)
    graph.verify()
    rng = np.random.default_rng(seed)
    feeds = {name: rng.standard_normal(graph.values[name].shape).astype(graph.values[name].dtype)
             for name in graph.inputs}
    expected = run_ort(model, feeds)
    actual = run_ort(to_onnx(graph), feeds)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a, e)
    return graph


def weights(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

