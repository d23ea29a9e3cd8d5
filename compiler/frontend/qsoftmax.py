"""``DequantizeLinear -> Softmax -> QuantizeLinear`` (int8) fused into ``QSoftmax``, with
onnxruntime's arithmetic.

onnxruntime runs that pattern as its ``QLinearSoftmax`` kernel, not as a float softmax:
``exp`` comes from a 256-entry float32 table over ``x - max(x)``, scaled up so that the
row sum still fits a float32; the row sum is accumulated in float32 in order; each output
is ``rint(table[x] * floor(1 / y_scale) / sum) + y_zero_point`` saturated. A float
softmax then quantized differs from it on a few values per thousand (ties that round the
other way), so the model's outputs would too; the fused node computes what onnxruntime
does (:func:`qlinear_softmax`, checked against onnxruntime on every test).

* ``QSoftmax(x, table)``: attributes axis, x_scale, y_scale, y_zero_point; ``x`` int8,
  the softmax axis the last one that is not 1 (the elements of a row contiguous), the
  output int8; ``table`` is :func:`qlinear_softmax_table` for the node's ``x_scale`` and
  row length.
"""
from __future__ import annotations

import math

import numpy as np

from .graph import Graph, Node

__all__ = ["fuse_softmax", "qlinear_softmax", "qlinear_softmax_table", "row_length"]

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def qlinear_softmax_table(x_scale: float, row: int) -> np.ndarray:
    """onnxruntime's float32 table: entry ``k`` is ``exp((k - 255 + shift) * x_scale)``
    (in float64, then rounded), ``shift`` making a row of ``row`` maximal values sum to
    below the float32 maximum with 5 e-folds to spare; ``k = x - max(x) + 255``."""
    scale = float(np.float32(x_scale))
    shift = max(0.0, math.log(_FLOAT32_MAX / row) - 5.0) / scale
    k = np.arange(256, dtype=np.float64)
    return np.exp((k - 255.0 + shift) * scale).astype(np.float32)


def row_length(shape: tuple[int, ...], axis: int) -> int:
    """The softmax row (``shape[axis]``) when a row's elements are contiguous, else 0."""
    axis %= len(shape)
    return shape[axis] if int(np.prod(shape[axis + 1:])) == 1 else 0


def qlinear_softmax(x: np.ndarray, table: np.ndarray, y_scale: float, y_zero_point: int,
                    axis: int = -1) -> np.ndarray:
    """The int8 result of onnxruntime's QLinearSoftmax of int8 ``x`` along ``axis``, whose
    rows must be contiguous (:func:`row_length`): the golden model of ``QSoftmax``."""
    row = row_length(x.shape, axis)
    if not row:
        raise ValueError(f"softmax rows along axis {axis} of shape {list(x.shape)} are "
                         f"not contiguous")
    xi = x.astype(np.int64).reshape(-1, row)
    entries = table[xi - xi.max(axis=-1, keepdims=True) + 255]
    total = np.cumsum(entries, axis=-1, dtype=np.float32)[..., -1:]  # in order, float32
    multiplier = np.floor(np.float32(1.0) / np.float32(y_scale)).astype(np.float32)
    q = np.rint(entries * multiplier / total).astype(np.int64) + int(y_zero_point)
    return np.clip(q, -128, 127).astype(np.int8).reshape(x.shape)


def fuse_softmax(graph: Graph, softmax: Node) -> bool:
    """Rewrite ``DQ(int8) -> Softmax -> Q(int8)`` (per tensor, rows contiguous) into a
    ``QSoftmax``; False (unchanged) for any other form, which stays a float softmax."""
    from . import qdq  # qdq imports this module for its table of rewrites

    shape = graph.value(softmax.input(0)).shape
    axis = int(softmax.attr("axis", -1)) % max(len(shape), 1)
    x = qdq._dequantized(graph, softmax.input(0))
    row = row_length(shape, axis) if shape else 0
    if x is None or not row or x[1].dtype != "int8" or len(softmax.outputs) != 1:
        return False
    out = qdq._output(graph, softmax)
    if out is None or out.absorbed or out.params.dtype != "int8":
        return False
    table = graph.unique_name(f"{softmax.name}_exp_table")
    graph.add_const(table, qlinear_softmax_table(x[1].scale, row))
    attrs = {"axis": axis, "x_scale": x[1].scale, "y_scale": out.params.scale,
             "y_zero_point": out.params.zero_point}
    qdq._replace(graph, [softmax], out, "QSoftmax", [x[0].inputs[0], table], attrs,
                 softmax.name)
    return True
