"""The cost models the placement compares: the host CPU's (:class:`HostCost`, a model of
the board's CPU) and the accelerator's (the roofline bound of the lowered operator).

Models, not measurements: ``tessera profile`` measures the real figures.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.config import HwConfig

from ..accel.lower import lower_node
from ..accel.roofline import op_roofline
from ..frontend.graph import Graph, Node

__all__ = ["HostCost", "accel_seconds", "node_work"]


@dataclass(frozen=True)
class HostCost:
    """What the placement assumes of the host CPU and of a launch.

    The defaults model the PYNQ-Z1/Z2's dual Cortex-A9 at 650 MHz: NEON does 8 int8
    MACs per cycle at best, about 1e9 per second in practice for a convolution, and
    moves about 1 GB/s. A launch (program and buffers to the device, start, completion
    interrupt) costs about 100 us, plus the activation bytes over DDR.
    """

    macs_per_second: float = 1e9
    bytes_per_second: float = 1e9
    launch_seconds: float = 100e-6

    def seconds(self, macs: int, nbytes: int) -> float:
        """Modelled time of a CPU operator doing ``macs`` MACs and moving ``nbytes``."""
        return macs / self.macs_per_second + nbytes / self.bytes_per_second


def node_work(graph: Graph, node: Node) -> tuple[int, int]:
    """``(MACs, bytes read and written)`` of a node, from its tensors' shapes."""
    nbytes = sum(graph.value(t).size * np.dtype(graph.value(t).dtype).itemsize
                 for t in [*node.inputs, *node.outputs] if t)
    return _node_macs(graph, node), nbytes


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
