"""QDQ fusion of the binary ops onnxruntime runs as integer kernels: ``Mul`` into the
integer node ``QMul``, as onnxruntime's QDQ transformer makes a ``DequantizeLinear -> Mul
-> QuantizeLinear`` group into com.microsoft ``QLinearMul`` (its BinaryOp selector: both
inputs dequantized, the output quantized, one element type for all three), and a
``MatMul`` of two activations into ``QMatMul``, which it runs as QLinearMatMul.

``QMul(a, b)``: the stored product, :func:`~.qlinear.qlinear_mul_reference`'s arithmetic
(MLAS's). ``a`` is an activation, ``b`` an activation or a constant (the ``0.5`` of ``x *
0.5``, stored int8/uint8 behind its DequantizeLinear, as onnxruntime's quantizer writes
it), the two broadcast (numpy rules) to the output's shape. Attributes a_scale,
a_zero_point, b_scale, b_zero_point, y_scale, y_zero_point, y_min, y_max (the type's
range: onnxruntime fuses no Relu into QLinearMul, so neither does this).

An ``Add`` of an activation and a constant (``x + 3`` of a decomposed hard-swish), which
onnxruntime also runs as QLinearAdd, becomes :mod:`.qdq`'s ``QAdd`` with the constant,
broadcast to the activation's shape, as its ``b`` (stored, like the activations).

``QMatMul(a, b)``: numpy matmul (batched, broadcasting) of two stored activations,
:func:`~.qlinear.qlinear_matmul_reference`'s arithmetic (exact int32 sums of the centred
operands, then onnxruntime's float32 requantization). Attributes as QMul's; an absorbed
Relu or Clip narrows ``[y_min, y_max]`` as for the other fused layers. (A MatMul with a
constant weight is :mod:`.qdq`'s QGemm.)

The rules (:mod:`.qdq`'s checks of parameters) live there; this module adds only the
patterns, registered in :mod:`.qdq`'s rewrite table.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .graph import Graph, Node
from .qlinear import qlinear_matmul_reference, qlinear_mul_reference

__all__ = ["fuse_activation_matmul", "fuse_add_constant", "fuse_mul", "qmatmul_reference",
           "qmul_reference"]


def fuse_mul(graph: Graph, mul: Node) -> bool:
    """Rewrite ``DQ(a) * DQ(b) -> Q`` (``b`` an activation or a constant, on either side)
    into a ``QMul``; False (graph unchanged) when the pattern does not qualify."""
    from . import qdq

    if len(mul.inputs) != 2:
        return False
    operands = [qdq._dequantized(graph, n) or _constant_dequantized(graph, n)
                for n in mul.inputs]
    if any(o is None for o in operands):
        return False
    (a_dq, a), (b_dq, b) = operands
    if graph.value(a_dq.inputs[0]).is_const:
        if graph.value(b_dq.inputs[0]).is_const:
            return False        # import folds a product of constants
        (a_dq, a), (b_dq, b) = (b_dq, b), (a_dq, a)
    out = qdq._output(graph, mul)
    if out is None or out.absorbed or not a.dtype == b.dtype == out.params.dtype:
        return False
    attrs = {"a_scale": a.scale, "a_zero_point": a.zero_point, "b_scale": b.scale,
             "b_zero_point": b.zero_point, **qdq._output_attrs(out)}
    qdq._replace(graph, [mul], out, "QMul", [a_dq.inputs[0], b_dq.inputs[0]], attrs, mul.name)
    return True


def fuse_add_constant(graph: Graph, add: Node) -> bool:
    """Rewrite ``DQ(a) + DQ(c) -> Q`` with ``c`` a stored constant (a scalar or any shape
    that broadcasts to ``a``'s) into a ``QAdd`` whose ``b`` is ``c`` broadcast to ``a``'s
    shape, as onnxruntime runs it (QLinearAdd with a constant operand: the same
    arithmetic as two activations, :func:`~.qlinear.qlinear_add_reference`); False
    (graph unchanged) when the pattern does not qualify."""
    from . import qdq

    if len(add.inputs) != 2:
        return False
    activation = [qdq._dequantized(graph, n) for n in add.inputs]
    constant = [_constant_dequantized(graph, n) for n in add.inputs]
    if activation[0] is not None and constant[1] is not None:
        (a_dq, a), (c_dq, c) = activation[0], constant[1]
    elif activation[1] is not None and constant[0] is not None:
        (a_dq, a), (c_dq, c) = activation[1], constant[0]
    else:
        return False
    shape = graph.value(a_dq.inputs[0]).shape
    out = qdq._output(graph, add)
    if (out is None or graph.value(add.outputs[0]).shape != shape
            or not a.dtype == c.dtype == out.params.dtype):
        return False
    stored = np.broadcast_to(graph.const(c_dq.inputs[0]), shape)
    b = qdq._add_weight(graph, f"{add.name}.b_q", stored)
    attrs = {"a_scale": a.scale, "a_zero_point": a.zero_point, "b_scale": c.scale,
             "b_zero_point": c.zero_point, **qdq._output_attrs(out)}
    qdq._replace(graph, [add], out, "QAdd", [a_dq.inputs[0], b], attrs, add.name)
    return True


def fuse_activation_matmul(graph: Graph, matmul: Node) -> bool:
    """Rewrite ``DQ(a) @ DQ(b) -> Q`` of two activations (an attention product) into a
    ``QMatMul``; False (graph unchanged) when the pattern does not qualify."""
    from . import qdq

    operands = [qdq._dequantized(graph, n) for n in matmul.inputs]
    if len(operands) != 2 or any(o is None for o in operands):
        return False
    (a_dq, a), (b_dq, b) = operands
    out = qdq._output(graph, matmul)
    if out is None:
        return False
    attrs = {"a_scale": a.scale, "a_zero_point": a.zero_point, "b_scale": b.scale,
             "b_zero_point": b.zero_point, **qdq._output_attrs(out)}
    qdq._replace(graph, [matmul], out, "QMatMul", [a_dq.inputs[0], b_dq.inputs[0]], attrs,
                 matmul.name)
    return True


def _constant_dequantized(graph: Graph, name: str):
    """``(dq, params)`` of a DQ of a constant int8/uint8 tensor with per-tensor
    parameters (an operand like the ``0.5`` of ``x * 0.5``), else None."""
    from . import qdq

    dq = graph.producer(name)
    if dq is None or dq.op != "DequantizeLinear" or dq.domain:
        return None
    params = qdq._qparams(graph, dq)
    source = graph.value(dq.inputs[0])
    if params is None or not source.is_const or source.dtype != params.dtype:
        return None
    return dq, params


def qmul_reference(a: np.ndarray, b: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """onnxruntime's QLinearMul (:func:`~.qlinear.qlinear_mul_reference`) of the stored
    operands of a fused QMul with attributes ``attrs``, on the model's values (uint8 for a
    node shifted from uint8, :mod:`.qshift`); int64, stored domain."""
    from .qshift import on_model_values
    return on_model_values(qlinear_mul_reference, a, b, attrs)


def qmatmul_reference(a: np.ndarray, b: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """onnxruntime's QLinearMatMul (:func:`~.qlinear.qlinear_matmul_reference`) of the
    stored operands of a fused QMatMul; int64, stored domain (a node shifted from uint8
    computes the same on its shifted values and zero points)."""
    return qlinear_matmul_reference(a, b, attrs["a_scale"], attrs["a_zero_point"],
                                    attrs["b_scale"], attrs["b_zero_point"], attrs["y_scale"],
                                    attrs["y_zero_point"], attrs["y_min"], attrs["y_max"])
