"""The cost models the placement compares: the host CPU's (a node's :class:`Work` priced by
the board CPU's :class:`~tessera.hostmodel.HostModel`) and the accelerator's (the
roofline bound of the lowered operator).

Models, not measurements: ``tessera profile`` measures the real figures.
"""
from __future__ import annotations

import numpy as np

from tessera.config import HwConfig
from tessera.hostmodel import Work
from tessera.sparsity import block_density, nm_pattern

from ..accel.lower import lower_node
from ..accel.roofline import op_roofline
from ..frontend.graph import Graph, Node

__all__ = ["accel_seconds", "kernel_kind", "node_weight", "node_work", "weight_density"]


def node_work(graph: Graph, node: Node) -> Work:
    """The features of ``node`` as one CPU kernel call (:class:`~tessera.hostmodel.Work`):
    its kernel kind, ops (MACs -- those of the kept weights of an N:M sparse weight --, or
    a pool's window taps), output elements, and the bytes of its tensors read and
    written."""
    nbytes = sum(graph.value(t).size * np.dtype(graph.value(t).dtype).itemsize
                 for t in [*node.inputs, *node.outputs] if t)
    elements = sum(graph.value(t).size for t in node.outputs if t)
    kind = kernel_kind(graph, node)
    if kind == "pool":
        ops = elements * _window(graph, node)
    elif kind == "reduce":
        ops = graph.value(node.inputs[0]).size
    else:
        ops = _node_macs(graph, node) * _kept_share(graph, node)
    return Work(kind, int(ops), int(elements), int(nbytes))


def _kept_share(graph: Graph, node: Node) -> float:
    """The share of a node's MACs its CPU kernel does: ``n / m`` for a constant weight of
    an N:M pattern (the sparse kernels multiply only the kept weights), else 1."""
    w = node_weight(graph, node)
    pattern = None if w is None else nm_pattern(w, axis=1)
    return 1.0 if pattern is None else pattern[0] / pattern[1]


def kernel_kind(graph: Graph, node: Node) -> str:
    """Which of :data:`~tessera.hostmodel.KINDS` a node's CPU kernel is."""
    if node.op in _MAC_OPS:
        dtype = graph.value(node.inputs[0]).dtype
        return "gemm_float" if dtype == "float32" else "gemm_int8"
    if node.op.startswith(("Reduce", "Arg")) or node.op == "Einsum":
        return "reduce"
    return next((kind for kind, ops in _KIND_OPS.items() if node.op in ops), "elementwise")


_KIND_OPS = {
    "pool": frozenset({"MaxPool", "AveragePool", "QMaxPool", "QAveragePool",
                       "GlobalAveragePool", "GlobalMaxPool", "QGlobalAveragePool", "LRN"}),
    "transcendental": frozenset({"Exp", "Log", "Tanh", "Sigmoid", "Erf", "Gelu", "Elu",
                                 "Selu", "Mish", "Softplus", "Pow", "Sqrt", "Softmax",
                                 "LogSoftmax", "QSoftmax", "LayerNormalization",
                                 "InstanceNormalization"}),
    "lookup": frozenset({"QLookup"}),
    "movement": frozenset({"Concat", "Slice", "Split", "Transpose", "Gather",
                           "GatherElements", "Pad", "Resize", "Upsample", "DepthToSpace",
                           "SpaceToDepth", "Tile", "Expand", "Cast"}),
}


def _window(graph: Graph, node: Node) -> int:
    """Input elements each output of a pooling node reads (the whole plane for global
    pools, the channels' neighbourhood for LRN)."""
    if node.op.startswith(("Global", "QGlobal")):
        return int(np.prod(graph.value(node.inputs[0]).shape[2:]))
    if node.op == "LRN":
        return int(node.attr("size", 1))
    return int(np.prod(node.attr("kernel_shape", [1])))


def _node_macs(graph: Graph, node: Node) -> int:
    """Multiply-accumulates of a conv, transposed conv, matrix product or recurrent layer
    (0 otherwise)."""
    if node.op not in _MAC_OPS:
        return 0
    x, w = (graph.value(t).shape for t in node.inputs[:2])
    if node.op in _RECURRENT_GATES:
        # every step: the gates' input and recurrent products, per direction
        directions, gates_x_hidden, features = w
        if node.op == "DynamicQuantizeLSTM":   # onnxruntime stores its W transposed
            directions, features, gates_x_hidden = w
        steps, batch = (x[0], x[1]) if node.attr("layout", 0) == 0 else (x[1], x[0])
        hidden = gates_x_hidden // _RECURRENT_GATES[node.op]
        return directions * steps * batch * gates_x_hidden * (features + hidden)
    out = graph.value(node.outputs[0]).size
    if node.op in ("QConv", "Conv", "ConvInteger"):
        return out * int(np.prod(w[1:]))                    # weight (O, C/g, kh, kw)
    if node.op in ("QConvTranspose", "ConvTranspose"):
        # every input pixel meets the whole kernel: weight (C, O/g, kh, kw)
        return int(np.prod(x)) * int(np.prod(w[1:]))
    if node.op == "QGemm":
        return out * int(w[-1])                             # weight (N, K)
    if node.op == "Gemm":
        return out * int(x[0] if node.attr("transA", 0) else x[-1])
    return out * int(x[-1])                                 # MatMul*: A (..., M, K)


#: Recurrent ops and their gates (W is ``(directions, gates * hidden, features)``,
#: DynamicQuantizeLSTM's ``(directions, features, gates * hidden)``).
_RECURRENT_GATES = {"LSTM": 4, "DynamicQuantizeLSTM": 4, "GRU": 3, "RNN": 1}
_MAC_OPS = frozenset({"QConv", "Conv", "ConvInteger", "QConvTranspose", "ConvTranspose",
                      "QGemm", "Gemm", "MatMul", "MatMulInteger", "QMatMul",
                      *_RECURRENT_GATES})


def accel_seconds(graph: Graph, node: Node, config: HwConfig) -> float:
    """The roofline time of ``node`` lowered for ``config`` (compute or DRAM bound)."""
    op = lower_node(graph, node, config)
    return config.cycles_to_seconds(op_roofline(op, lambda t: graph.value(t).shape,
                                                config).bound)


#: Nodes whose second input may be a constant weight (of :func:`node_weight`).
_WEIGHT_OPS = frozenset({"QConv", "Conv", "QGemm", "Gemm", "MatMul"})


def node_weight(graph: Graph, node: Node) -> np.ndarray | None:
    """A conv or dense node's constant weight as ``(outputs, inputs, *taps)`` (the layout
    :mod:`tessera.sparsity` cuts into blocks), or ``None`` (no constant weight)."""
    if node.op not in _WEIGHT_OPS or len(node.inputs) < 2 or not node.inputs[1]:
        return None
    value = graph.value(node.inputs[1])
    if not value.is_const or value.data.ndim < 2:
        return None
    w = value.data
    # A MatMul's B and a Gemm's B without transB are (inputs, outputs).
    if node.op == "MatMul" or (node.op == "Gemm" and not node.attr("transB", 0)):
        return w.T if w.ndim == 2 else None
    return w


def weight_density(graph: Graph, node: Node, config: HwConfig) -> float | None:
    """Fraction of a node's weight blocks (the config's GEMM blocks per kernel tap) that
    hold a non-zero -- the share of its work the accelerator runs -- or ``None`` for a
    node without a constant weight."""
    w = node_weight(graph, node)
    return None if w is None else block_density(w, config.block_out, config.block_in)

