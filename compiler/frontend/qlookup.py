"""Quantized activations as lookup tables: :func:`tabulate_quantized_activations`.

onnxruntime runs ``DequantizeLinear -> Sigmoid -> QuantizeLinear`` as QLinearSigmoid, and
the same with LeakyRelu as QLinearLeakyRelu (``contrib_ops/cpu/quantization/
qlinear_activations.cc``): the op has only 256 possible inputs, so it builds a 256-entry
table of ``Q(f(DQ(v)))`` (MLAS's logistic for the sigmoid) and looks every element up.
This pass does the same: the table is computed by onnxruntime itself (the DQ -> op -> Q
chain run on all 256 values, at compile time) and the pattern becomes standard ops the
CPU runs::

    DQ(x) -> Sigmoid -> Q   =>   Gather(table, Cast(x, int32))

``table`` holds the 256 outputs in the order of the input's bytes, so a uint8 ``x``
indexes it directly and an int8 one through Gather's negative indices (-1 is entry 255,
the byte 0xFF). The result is onnxruntime's bit for bit, whatever polynomial the CPU
backend uses for the float sigmoid.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph import Graph, Node
from .upgrade import IR_OPSET

__all__ = ["TABULATED_OPS", "tabulate_quantized_activations"]

#: The float ops between a DQ and a Q that onnxruntime runs as a lookup table.
TABULATED_OPS = ("Sigmoid", "LeakyRelu")
_QTYPES = ("int8", "uint8")


def tabulate_quantized_activations(graph: Graph) -> int:
    """Replace every ``DequantizeLinear -> op -> QuantizeLinear`` chain whose op is one of
    :data:`TABULATED_OPS` by a table lookup (module doc), in place; returns the count.

    A chain qualifies when both quantizations are per tensor with constant parameters,
    the quantized tensors are int8/uint8, and the float op's output is read by the Q
    alone. DequantizeLinear nodes left without readers stay for ``remove_unused``.
    """
    count = 0
    for node in list(graph.nodes):
        if node.op in TABULATED_OPS and not node.domain:
            chain = _chain(graph, node)
            if chain is not None:
                _replace(graph, node, *chain)
                count += 1
    graph.verify()
    return count


def _chain(graph: Graph, node: Node) -> tuple[Node, Node] | None:
    """The (DQ, Q) around ``node`` if the chain qualifies (see the pass)."""
    dq = graph.producer(node.inputs[0])
    readers = graph.consumers(node.outputs[0])
    if (dq is None or dq.op != "DequantizeLinear" or dq.domain or len(readers) != 1
            or node.outputs[0] in graph.outputs):
        return None
    q = readers[0]
    if q.op != "QuantizeLinear" or q.domain or q.inputs[0] != node.outputs[0]:
        return None
    source = graph.value(dq.inputs[0])
    if (source.is_const or source.dtype not in _QTYPES
            or graph.value(q.outputs[0]).dtype not in _QTYPES):
        return None
    if not (_per_tensor(graph, dq) and _per_tensor(graph, q)):
        return None
    return dq, q


def _per_tensor(graph: Graph, node: Node) -> bool:
    """Whether a Q/DQ's scale and zero point are single constants."""
    return all(graph.const(name) is not None and graph.const(name).size == 1
               for name in node.inputs[1:3] if name)


def _replace(graph: Graph, node: Node, dq: Node, q: Node) -> None:
    """``Gather(table, Cast(x, int32))`` writing the Q's output, where ``node`` was."""
    table = _table(graph, node, dq, q)
    index = graph.unique_name(f"{node.name}:index")
    source = dq.inputs[0]
    graph.add_value(index, graph.value(source).shape, "int32")
    table_name = graph.unique_name(f"{node.name}.table")
    graph.add_const(table_name, table)
    position = next(i for i, n in enumerate(graph.nodes) if n is node)
    graph.add_node("Cast", [source], [index], name=graph.unique_name(f"{node.name}/index"),
                   index=position, to=int(TensorProto.INT32))
    graph.add_node("Gather", [table_name, index], [q.outputs[0]],
                   name=graph.unique_name(f"{node.name}/lookup"), index=position + 1, axis=0)
    graph.remove_nodes([node, q])
    graph.values.pop(node.outputs[0], None)


def _table(graph: Graph, node: Node, dq: Node, q: Node) -> np.ndarray:
    """onnxruntime's outputs of the DQ -> op -> Q chain for the 256 input bytes."""
    import onnxruntime as ort

    dtype = graph.value(dq.inputs[0]).dtype
    out_dtype = graph.value(q.outputs[0]).dtype
    inputs = np.arange(256, dtype=np.uint8).view(dtype)
    params = [numpy_helper.from_array(graph.const(name), name)
              for name in dict.fromkeys([*dq.inputs[1:3], *q.inputs[1:3]]) if name]
    chain = [helper.make_node("DequantizeLinear", ["x", *dq.inputs[1:]], ["v"]),
             helper.make_node(node.op, ["v"], ["f"], **node.attrs),
             helper.make_node("QuantizeLinear", ["f", *q.inputs[1:]], ["y"])]
    model = helper.make_model(
        helper.make_graph(chain, f"{node.name}.table", [_tensor_info("x", dtype)],
                          [_tensor_info("y", out_dtype)], params),
        opset_imports=[helper.make_opsetid("", IR_OPSET)])
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdqisint8allowed", "1")
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": inputs})[0], dtype=out_dtype)


def _tensor_info(name: str, dtype: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [256])
