"""The compiler patterns of the built-in ALU intrinsics (:mod:`.patterns`).

* ADD: ``QAdd``, onnxruntime's QLinearAdd in fixed point (:func:`~.lower.qlinear_add`):
  ``acc = A*a``, then ``+ B*b`` (a residual), an offset, a shift and the clamp; either
  operand may be the value operand, so the add joins the epilogue of whichever operand's
  convolution the segment computes last.
* CLIP: a ``QLookup`` whose table is only a clamp of its input (an int8 ReLU6 or Clip on
  equal input and output quantization, or the identity): one CLIP step, no table.
"""
from __future__ import annotations

import numpy as np

from tessera.errors import CompileError

from .lower import qadd_stages
from .ops import Clip, Mul, Stage
from .patterns import Pattern, PatternContext

__all__ = ["ADD_PATTERNS", "CLIP_PATTERNS", "clamp_of_table", "lookup_table"]


def _qadd(ctx: PatternContext) -> tuple[Stage, ...]:
    """QAdd with input ``ctx.value`` in the accumulator: ``Mul(A)`` then the stages."""
    graph, node = ctx.graph, ctx.node
    other = node.inputs[1 - ctx.value]
    if graph.value(other).shape != ctx.shape(ctx.value):
        raise CompileError("QAdd operands differ in shape")
    if graph.value(other).is_const:
        raise CompileError("an add of a constant runs on the CPU")
    big_a, stages = qadd_stages(node, ctx.value)
    return (Mul(big_a), *stages)


ADD_PATTERNS = (Pattern("QAdd", _qadd, operands=(0, 1),
                        doc="QLinearAdd in fixed point, bit-exact with MLAS"),)


def lookup_table(ctx: PatternContext) -> np.ndarray:
    """The 256 int8 entries of a QLookup, indexed by the input's byte (int8 -> int8 only:
    :mod:`..frontend.qshift` has shifted uint8 tensors by then)."""
    table = ctx.const(1)
    dtypes = {ctx.graph.value(t).dtype for t in (ctx.node.inputs[0], ctx.node.outputs[0])}
    if table is None or table.size != 256 or dtypes != {"int8"}:
        raise CompileError(f"a lookup runs on the accelerator as int8 -> int8 with a constant "
                           f"256-entry table, not {'/'.join(sorted(dtypes))}")
    return np.asarray(table, dtype=np.int8).reshape(256)


#: Every int8 value, in the order of a byte-indexed table (entry k is the byte k).
BYTES = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.int64)


def clamp_of_table(table: np.ndarray) -> tuple[int, int] | None:
    """``(lo, hi)`` when ``table[v] == clip(v, lo, hi)`` for every int8 ``v``."""
    values = np.asarray(table, dtype=np.int64)
    lo, hi = int(values.min()), int(values.max())
    return (lo, hi) if np.array_equal(values, np.clip(BYTES, lo, hi)) else None


def _clamp_lookup(ctx: PatternContext) -> tuple[Stage, ...] | None:
    bounds = clamp_of_table(lookup_table(ctx))
    return None if bounds is None else (Clip(-128, 127), Clip(*bounds))


CLIP_PATTERNS = (Pattern("QLookup", _clamp_lookup,
                         doc="a lookup that is a clamp (ReLU6, Clip, identity): one CLIP"),)
