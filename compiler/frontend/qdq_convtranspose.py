"""QDQ ``ConvTranspose`` fused into ``QConvTranspose``.

onnxruntime's ``quantize_static`` writes a transposed convolution in QDQ form
(``DQ(x)``, ``DQ(w)``, ``DQ(bias)`` -> ``ConvTranspose`` -> ``Q``) and runs it in float:
``Q(sum(x_f * w_f) + b_f)``. Its integer form, ``sum((x - x_zp) * w)`` in int32 plus the
int32 bias, then QLinearConv's requantization, gives the same int8 values (the sum is
exact in int32 and the float one is within rounding of it); the accelerator runs it by
sub-pixel decomposition (:mod:`..accel.convtranspose`).

``QConvTranspose(x, w, [bias])``: ``w`` constant ``(C, O/group, kh, kw)`` minus its zero
points (int8), ``bias`` int32 ``(O,)``; attributes as QConv (``w_scale`` per output
channel) plus ``output_padding``. Fused when everything QConv needs holds and, in
addition, the layer is 2-D with explicit pads (no ``auto_pad``, no ``output_shape``),
no dilation, an output padding below the stride, a sub-pixel decomposition into stride-1
convolutions (:func:`subpixel_axis_phase`: crops smaller than the kernel, as in every
common upsampling layer) and weights that fit int8 once centred (the accelerator
multiplies int8); otherwise it stays a float ConvTranspose between DQ and Q (a CPU
kernel).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .graph import Graph, Node

__all__ = ["AxisPhase", "fuse_conv_transpose", "subpixel_axis_phase"]


def fuse_conv_transpose(graph: Graph, node: Node) -> bool:
    """Rewrite the QDQ pattern around ``ConvTranspose`` ``node`` into a QConvTranspose;
    False (nothing changed) when it does not qualify (module doc)."""
    from . import qdq
    geometry = _geometry(graph, node)
    x = qdq._dequantized(graph, node.input(0))
    if geometry is None or x is None:
        return False
    c, og, _, _ = graph.value(node.input(1)).shape
    group = geometry["group"]
    weight = qdq._weight(graph, node.input(1), og, 1)
    out = qdq._output(graph, node)
    if weight is None or out is None or weight[0].dtype != np.int8:
        return False
    x_dq, x_params = x
    w, w_scale = weight
    w_scale = np.tile(w_scale, group)           # output channel g*og + j has scale j
    bias = (qdq._bias(graph, node.input(2), og * group, x_params.scale, w_scale)
            if node.input(2) else None)
    if bias is False:
        return False
    inputs = [x_dq.inputs[0], qdq._stored_weight(graph, node.input(1), w, node.name)]
    if bias is not None:
        inputs.append(qdq._add_weight(graph, f"{node.name}.bias_q", bias))
    attrs = {"x_scale": x_params.scale, "x_zero_point": x_params.zero_point,
             "w_scale": w_scale, "w_zero_point": np.zeros(og * group, np.int64),
             **qdq._output_attrs(out), **geometry}
    qdq._replace(graph, [node], out, "QConvTranspose", inputs, attrs, node.name)
    return True


def _geometry(graph: Graph, node: Node) -> dict | None:
    """strides, pads, dilations, group, output_padding of a 2-D ConvTranspose the fused
    node takes; None otherwise."""
    shape = graph.value(node.input(1)).shape
    if (len(shape) != 4 or node.attr("auto_pad", "NOTSET") != "NOTSET"
            or node.attr("output_shape") is not None
            or any(d != 1 for d in node.attr("dilations", [1, 1]))):
        return None
    strides = [int(s) for s in node.attr("strides", [1, 1])]
    output_padding = [int(p) for p in node.attr("output_padding", [0, 0])]
    group = int(node.attr("group", 1))
    pads = [int(p) for p in node.attr("pads", [0, 0, 0, 0])]
    if any(p >= s for p, s in zip(output_padding, strides)) or shape[0] % group:
        return None
    lengths, outs = graph.value(node.input(0)).shape[2:], graph.value(node.outputs[0]).shape[2:]
    if any(isinstance(subpixel_axis_phase(a, strides[i], pads[i], shape[2 + i], lengths[i],
                                          outs[i]), str)
           for i in range(2) for a in range(strides[i])):
        return None
    return {"strides": strides, "pads": pads, "dilations": [1, 1], "group": group,
            "output_padding": output_padding}


@dataclass(frozen=True)
class AxisPhase:
    """One sub-pixel phase along one axis: its kernel taps (in correlation order) and the
    padding of its stride-1 convolution."""

    taps: tuple[int, ...]
    begin: int
    end: int


def subpixel_axis_phase(a: int, stride: int, crop: int, kernel: int, length: int,
                        out: int) -> AxisPhase | None | str:
    """Phase ``a`` of a transposed convolution along one axis (stride, crop at the start,
    kernel, input and output lengths) as a stride-1 correlation
    (:mod:`..accel.convtranspose` has the derivation); None when it has no outputs, a
    reason string when a stride-1 convolution cannot compute it. Here because the fusion
    takes only decomposable layers (the others stay float, a CPU kernel)."""
    count = -(-(out - a) // stride)
    if count < 1:
        return None
    k0, e = (a + crop) % stride, (a + crop) // stride
    taps = tuple(range(k0, kernel, stride))[::-1]
    if not taps:            # no tap reaches it (kernel < stride): the bias alone
        if count < length:
            return (f"kernel {kernel} is smaller than stride {stride}: a phase without taps "
                    "is shorter than the input")
        return AxisPhase((), 0, count - length)
    begin = len(taps) - 1 - e
    end = count + len(taps) - 1 - length - begin
    if begin < 0 or end < 0:
        return (f"a crop of {crop} at the start with stride {stride} and kernel {kernel} makes "
                "a phase start or end inside the input (a view of the input the stores "
                "cannot express)")
    return AxisPhase(taps, begin, end)
