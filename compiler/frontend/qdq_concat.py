"""QDQ ``Concat`` of tensors that share one quantization: a Concat of the stored values.

``DQ(a), DQ(b), ... -> Concat -> Q`` with every DequantizeLinear's scale and zero point
equal to the QuantizeLinear's only moves values: ``Q(DQ(v)) = v`` for each of them
(onnxruntime drops such Q/DQ pairs alike). :func:`fuse_concat` rewrites it into a Concat
of the int8/uint8 tensors, which the accelerator can run without a copy (its producers
store side by side into the concat's buffer, :mod:`..accel.dram`) or the CPU as a
copy.

Concats whose inputs are quantized differently (onnxruntime's quantizer gives each its
own scale) first get the output's quantization on every input:
:func:`requantize_concat_inputs` replaces ``DQ(a)`` by ``DQ(QLookup(a))``, the lookup's
table being onnxruntime's ``Q(DQ(v))`` with the output's parameters for each of the 256
values of ``v``: exactly what the float Concat followed by its Q computes element by
element. The lookup usually then merges into the activation table before it
(:func:`~.qlookup.compose_lookups`) and runs in the producing convolution's epilogue.
"""
from __future__ import annotations

from .graph import Graph, Node

__all__ = ["fuse_concat", "requantize_concat_inputs"]


def requantize_concat_inputs(graph: Graph) -> int:
    """Give each input of every QDQ Concat the quantization of its output, through a
    lookup table (module doc); returns the number of inputs requantized."""
    from . import qdq
    count = 0
    for concat in [n for n in graph.nodes if n.op == "Concat" and not n.domain]:
        if not concat.inputs or any(not name for name in concat.inputs):
            continue
        parts = [qdq._dequantized(graph, name) for name in concat.inputs]
        out = qdq._output(graph, concat) if all(parts) else None
        if out is None or out.absorbed:
            continue
        for k, (dq, params) in enumerate(parts):
            if params != out.params and _requantize_input(graph, concat, k, dq, out.quantize):
                count += 1
    return count


def _requantize_input(graph: Graph, concat: Node, k: int, dq: Node, q: Node) -> bool:
    """Input ``k`` of ``concat`` (``dq``'s output) as ``DQ(QLookup(a))`` with ``q``'s
    parameters; False when onnxruntime cannot tabulate it (the Concat stays in float)."""
    from .qlookup import LOOKUP_OP, tabulate_subgraph
    from .qdq import DOMAIN
    source = dq.inputs[0]
    shape = graph.value(source).shape
    stored = graph.unique_name(f"{concat.name}:in{k}")
    graph.add_value(stored, shape, graph.value(q.outputs[0]).dtype)
    requantize = Node("QuantizeLinear", f"{stored}/q", [dq.outputs[0], *q.inputs[1:]], [stored])
    table = tabulate_subgraph(graph, [dq, requantize], source, stored)
    if table is None:
        graph.values.pop(stored, None)
        return False
    table_name = graph.unique_name(f"{stored}.table")
    graph.add_const(table_name, table)
    index = next(i for i, n in enumerate(graph.nodes) if n is concat)
    graph.add_node(LOOKUP_OP, [source, table_name], [stored], name=f"{concat.name}/requant{k}",
                   index=index, domain=DOMAIN, ops="Requantize")
    value = graph.unique_name(f"{stored}:dq")
    graph.add_value(value, shape, graph.value(dq.outputs[0]).dtype)
    graph.add_node("DequantizeLinear", [stored, *q.inputs[1:]], [value],
                   name=f"{concat.name}/dq{k}", index=index + 1)
    concat.inputs[k] = value
    if not graph.consumers(dq.outputs[0]) and dq.outputs[0] not in graph.outputs:
        graph.remove_nodes([dq])        # so that the lookup is its source's one reader
        graph.values.pop(dq.outputs[0], None)
    return True


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
