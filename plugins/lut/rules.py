"""The LUT op's compiler pattern: a ``QLookup`` (any unary int8 activation of a QDQ
model, tabulated by onnxruntime: :mod:`tessera.compiler.frontend.qlookup`) becomes a
table lookup in the epilogue of the operator writing its input, e.g. a convolution's
``requantize -> clamp -> LUT``, bit-identical to onnxruntime.

Written against the public extension API only (:mod:`tessera.compiler.accel.patterns`).
"""
from __future__ import annotations

from tessera.compiler.accel.ops import Apply
from tessera.compiler.accel.patterns import Pattern, PatternContext


def _lookup(ctx: PatternContext):
    """The table; the LUT saturates its input to int8 itself, as the store would, so a
    conv's requantization needs no clamp before it (``saturates``)."""
    table = ctx.lookup_table()
    return (Apply("LUT", table=table, out_range=(int(table.min()), int(table.max())),
                  saturates=(-128, 127)),)


PATTERNS = (Pattern("QLookup", _lookup, doc="any int8 -> int8 function as a 256-entry table"),)

__all__ = ["PATTERNS"]
