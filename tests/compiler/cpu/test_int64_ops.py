"""int64 tensors through the CPU kernels (indices, shapes and token ids are int64 in real
models): data movement, elementwise arithmetic and comparisons, reductions and ArgMax,
against onnxruntime on values far beyond int32 (up to 2**40: a kernel that narrowed to
32 bits anywhere would differ)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.cpu.lower import lower_node_to_cpu
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.runtime.cpu import run_cpu_steps

X = (np.arange(2 * 3 * 4 * 4, dtype=np.int64).reshape(2, 3, 4, 4) * 3_000_000_007) \
    % 2**41 - 2**40
CONSTS = {"x2": X[:, :1] + 5, "starts": np.array([0, 1]), "ends": np.array([2, 3]),
          "idx": np.array([3, 0, 1]), "pads": np.array([0, 0, 1, 0, 0, 0, 0, 2]),
          "reps": np.array([1, 2, 1, 1]), "shape": np.array([2, 2, 3, 4, 4]),
          "axes": np.array([2]), "lo": np.array(-2**39), "hi": np.array(2**39)}

CASES = [
    ("Transpose", [], {"perm": [0, 2, 3, 1]}), ("Concat", ["x2"], {"axis": 1}),
    ("Slice", ["starts", "ends"], {}), ("Gather", ["idx"], {"axis": 2}),
    ("Pad", ["pads"], {}), ("Tile", ["reps"], {}), ("Expand", ["shape"], {}),
    ("Cast", [], {"to": TensorProto.FLOAT}), ("Add", ["x2"], {}), ("Sub", ["x2"], {}),
    ("Mul", ["x2"], {}), ("Div", ["x2"], {}), ("Max", ["x2"], {}), ("Min", ["x2"], {}),
    ("Abs", [], {}), ("Neg", [], {}), ("Sign", [], {}), ("Clip", ["lo", "hi"], {}),
    ("Equal", ["x2"], {}), ("Less", ["x2"], {}), ("ReduceSum", ["axes"], {}),
    ("ReduceMax", [], {"axes": [1]}), ("ArgMax", [], {"axis": 1}),
    ("ArgMin", [], {"axis": 3, "select_last_index": 1}),
]


def _model(op, extra, attrs):
    node = helper.make_node(op, ["x", *extra], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.INT64, X.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(np.asarray(CONSTS[n], np.int64), n) for n in extra])
    # Inference types the output (the checker in import wants it typed).
    return onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("op,extra,attrs", CASES, ids=[c[0] for c in CASES])
def test_int64_matches_onnxruntime(op, extra, attrs):
    model = _model(op, extra, attrs)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    graph = import_onnx(model)
    env = {"x": X}
    run_cpu_steps([s for n in graph.nodes for s in lower_node_to_cpu(graph, n)], env)
    got = env[graph.outputs[0]]
    assert got.dtype == want.dtype and np.array_equal(got, want), (got, want)
