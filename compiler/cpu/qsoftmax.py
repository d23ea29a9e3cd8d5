"""``QSoftmax`` on the CPU: onnxruntime's QLinearSoftmax, bit-exact
(:func:`~..frontend.qsoftmax.qlinear_softmax` is its golden model).

Per row of ``n`` contiguous int8 values: the maximum; the row sum of
``table[x - max + 255]`` accumulated in float32 in order (no reassociation: the order
is onnxruntime's, and the sum decides ties); then each output
``rint(table[x - max + 255] * multiplier / sum) + y_zero_point`` saturated to int8,
with ``multiplier = floor(1 / y_scale)`` as onnxruntime computes it in float32.
"""
from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module
from .lower_plan import NodeLowering, Plan, first_input
from ..frontend.qsoftmax import qlinear_softmax_table, row_length

__all__ = ["build_qlinear_softmax", "lower_qsoftmax"]

_I32 = ir.IntType(32)


def build_qlinear_softmax(x: TensorSpec, row: int, y_scale: float,
                          y_zero_point: int) -> CpuKernel:
    """Kernel ``entry(x int8, table float32[256], y int8)`` over rows of ``row`` values."""
    name = f"qlinear_softmax(row={row})"
    module = new_module(name)
    table = TensorSpec((256,), "float32")
    fn, b = kernel_function(module, "entry", [x, table], [x])
    xp, tp, yp = fn.args
    multiplier = float(np.floor(np.float32(1.0) / np.float32(y_scale)))
    with U.for_range(b, x.size // row if row else 0, name="row") as r:
        base = b.mul(r, U.i64(row))

        def value(b: ir.IRBuilder, i: ir.Value) -> ir.Value:
            return U.widen(b, U.load(b, xp, b.add(base, i)), "int8")
        top = U.reduce_range(b, row, ir.Constant(_I32, -128),
                             lambda b, i, m: U.maximum(b, value(b, i), m, "int32"), name="max")

        def entry(b: ir.IRBuilder, i: ir.Value) -> ir.Value:
            k = b.add(b.sub(value(b, i), top), ir.Constant(_I32, 255))
            return U.load(b, tp, b.sext(k, ir.IntType(64)))
        total = U.reduce_range(b, row, U.f32(0.0), lambda b, i, s: b.fadd(s, entry(b, i)),
                               name="sum")
        with U.for_range(b, row, name="i") as i:
            q = U.round_half_even(b, b.fdiv(b.fmul(entry(b, i), U.f32(multiplier)), total))
            y = b.add(b.fptosi(q, _I32), ir.Constant(_I32, int(y_zero_point)))
            U.store(b, U.saturate_int(b, y, "int32", "int8"), yp, b.add(base, i))
    b.ret_void()
    return CpuKernel(name, str(module), "entry", (x, table), (x,))


def lower_qsoftmax(low: NodeLowering) -> list[Plan]:
    """QSoftmax: one kernel; the table is checked to be the one for the node's scale."""
    a = low.require_attrs("axis", "x_scale", "y_scale", "y_zero_point")
    x = low.spec(first_input(low), ("int8",))
    row = row_length(x.shape, int(a["axis"]))
    low.require(row > 0, "its softmax rows are not contiguous")
    table = low.const(low.node.input(1), "exp table")
    low.require(np.array_equal(table, qlinear_softmax_table(float(a["x_scale"]), row)),
                "its exp table is not onnxruntime's for its x_scale")
    out = low.output()
    return [Plan(None, (first_input(low), low.node.input(1)), (out.name,),
                 lambda: build_qlinear_softmax(x, row, float(a["y_scale"]),
                                               int(a["y_zero_point"])),
                 {low.node.input(1): table})]
