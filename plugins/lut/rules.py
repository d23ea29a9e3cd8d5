"""The LUT op's compiler pattern: a ``QLookup`` (any unary int8 activation of a QDQ
model, tabulated by onnxruntime: :mod:`tessera.compiler.frontend.qlookup`) becomes a
table lookup in the epilogue of the operator writing its input, e.g. a convolution's
``requantize -> clamp -> LUT``, bit-identical to onnxruntime.

Written against the public extension API only (:mod:`tessera.compiler.accel.patterns`).
"""
from __future__ import annotations

from tessera.compiler.accel.ops import Apply, Clip
from tessera.compiler.accel.patterns import Pattern, PatternContext


def _lookup(ctx: PatternContext):
    """Clamp to int8 (the LUT indexes the low byte: the value must be the int8 the
    node reads, which the store's saturation would otherwise make it only later), then
    the table."""
    table = ctx.lookup_table()
    return (Clip(-128, 127),
            Apply("LUT", table=table, out_range=(int(table.min()), int(table.max()))))


PATTERNS = (Pattern("QLookup", _lookup, doc="any int8 -> int8 function as a 256-entry table"),)

__all__ = ["PATTERNS"]
