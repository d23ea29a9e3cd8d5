"""Split's ``num_outputs`` (opset 18) survives the conversion to opset 17, the IR's: an
uneven split (the last part smaller) gets its sizes as a constant input, which opset
17's Split (even parts only without sizes) needs."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tessera.compiler.frontend.onnx_import import import_onnx


def _split_model(size: int, parts: int, axis: int):
    shape = [2, size] if axis else [size, 3]
    outputs = [f"y{k}" for k in range(parts)]
    node = helper.make_node("Split", ["x"], outputs, axis=axis, num_outputs=parts)
    graph = helper.make_graph(
        [node], "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    # onnx's opset-18 inference types the outputs (the checker in import wants them).
    return onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


@pytest.mark.parametrize("size,parts,axis", [(7, 4, 0), (8, 3, 1), (6, 3, 1), (5, 5, 0)])
def test_num_outputs_split_keeps_onnxruntimes_sizes(size, parts, axis):
    model = _split_model(size, parts, axis)
    shape = [2, size] if axis else [size, 3]
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    graph = import_onnx(model)
    [split] = graph.nodes
    assert [graph.values[o].shape for o in split.outputs] == [w.shape for w in want]
    sizes = graph.const(split.inputs[1])
    assert sizes is not None and list(sizes) == [w.shape[axis] for w in want]
