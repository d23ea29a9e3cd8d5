"""QDQ ``Concat`` of tensors that share one quantization: a Concat of the stored values.

``DQ(a), DQ(b), ... -> Concat -> Q`` with every DequantizeLinear's scale and zero point
equal to the QuantizeLinear's only moves values: ``Q(DQ(v)) = v`` for each of them
(onnxruntime drops such Q/DQ pairs alike). :func:`fuse_concat` rewrites it into a Concat
of the int8/uint8 tensors, which the accelerator can run without a copy (its producers
store side by side into the concat's buffer, :mod:`..accel.dram`) or the CPU as a
copy. Concats whose inputs are quantized differently (onnxruntime's default: the output
takes the first input's parameters) stay as they are.
"""
from __future__ import annotations

from .graph import Graph, Node

__all__ = ["fuse_concat"]


def fuse_concat(graph: Graph, concat: Node) -> bool:
    """Rewrite the QDQ Concat ``concat`` into a Concat of the stored tensors when every
    input and the output share their quantization (module doc); False otherwise."""
    from . import qdq
    if not concat.inputs or any(not name for name in concat.inputs):
        return False
    parts = [qdq._dequantized(graph, name) for name in concat.inputs]
    out = qdq._output(graph, concat) if all(parts) else None
    if out is None or out.absorbed or any(params != out.params for _, params in parts):
        return False
    y = out.quantize.outputs[0]
    graph.add_node("Concat", [dq.inputs[0] for dq, _ in parts], [y],
                   name=graph.unique_name(f"{concat.name}_q"),
                   index=qdq._index(graph, out.quantize), **concat.attrs)
    graph.remove_nodes([concat, out.quantize])
    graph.values.pop(concat.outputs[0], None)
    return True
