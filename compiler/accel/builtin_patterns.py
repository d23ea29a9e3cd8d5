"""The compiler patterns of the built-in ALU intrinsics (:mod:`.patterns`).

* ADD: ``QAdd``, onnxruntime's QLinearAdd in fixed point (:func:`~.lower.qlinear_add`):
  ``acc = A*a``, then ``+ B*b`` (a residual), an offset, a shift and the clamp; either
  operand may be the value operand, so the add joins the epilogue of whichever operand's
  convolution the segment computes last.
* CLIP: a ``QLookup`` whose table is only a clamp of its input (an int8 ReLU6 or Clip on
  equal input and output quantization, or the identity): one CLIP step, no table.
* MAX (approximate): a ``QLookup`` as a sum of shifted ReLUs ``max(v, b_k)``, the IIS
  method (:mod:`.relu_sum`), for configs whose ALU has no exact pattern for it (no LUT):
  only on nodes :func:`mark_approximate_activations` marked (``tessera.compile(...,
  activations="approximate")``), since it changes results.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import numpy as np

from tessera.config import HwConfig
from tessera.errors import CLI, PYTHON, CompileError
from tessera.isa import get_isa

from ..frontend.graph import Graph, Node
from ..frontend.qdq import DOMAIN
from .lower import qadd_stages
from .ops import Clip, Mul, Stage
from .patterns import BYTES, Pattern, PatternContext, match_node
from .relu_sum import ReluSum, alu_cycles_per_row, fit_relu_sum, relu_sum_error

__all__ = ["ADD_PATTERNS", "CLIP_PATTERNS", "MAX_PATTERNS", "clamp_of_table",
           "mark_approximate_activations"]


def _qadd(ctx: PatternContext) -> tuple[Stage, ...]:
    """QAdd with input ``ctx.value`` in the accumulator: ``Mul(A)`` then the stages."""
    graph, node = ctx.graph, ctx.node
    other = node.inputs[1 - ctx.value]
    if graph.value(other).shape != ctx.shape(ctx.value):
        raise CompileError("QAdd operands differ in shape")
    if any(graph.value(t).is_const for t in node.inputs[:2]):
        raise CompileError("an add of a constant runs on the CPU")
    big_a, stages = qadd_stages(node, ctx.value)
    return (Mul(big_a), *stages)


ADD_PATTERNS = (Pattern("QAdd", _qadd, operands=(0, 1),
                        doc="QLinearAdd in fixed point, bit-exact with MLAS"),)


def clamp_of_table(table: np.ndarray) -> tuple[int, int] | None:
    """``(lo, hi)`` when ``table[v] == clip(v, lo, hi)`` for every int8 ``v``."""
    values = np.asarray(table, dtype=np.int64)
    lo, hi = int(values.min()), int(values.max())
    return (lo, hi) if np.array_equal(values, np.clip(BYTES, lo, hi)) else None


def _clamp_lookup(ctx: PatternContext) -> tuple[Stage, ...] | None:
    bounds = clamp_of_table(ctx.lookup_table())
    return None if bounds is None else (Clip(*bounds),)


CLIP_PATTERNS = (Pattern("QLookup", _clamp_lookup,
                         doc="a lookup that is a clamp (ReLU6, Clip, identity): one CLIP"),)


# ------------------------------------------------------------------ MAX: ReLU sums
def _relu_sum_lookup(ctx: PatternContext) -> tuple[Stage, ...]:
    """A lookup approximated by a sum of shifted ReLUs (:mod:`.relu_sum`), clamped to the
    int8 value it reads and the int8 value it stands for."""
    return (Clip(-128, 127), _fitted(ctx), Clip(-128, 127))


def _fitted(ctx: PatternContext) -> ReluSum:
    a = ctx.node.attrs
    weights = a.get("weights")
    return _fit(ctx.lookup_table().tobytes(),
                None if weights is None else np.asarray(weights, np.float64).tobytes(),
                a.get("pieces"), a.get("tolerance"), get_isa(ctx.config).imm_bits)


@lru_cache(maxsize=512)
def _fit(table: bytes, weights: bytes | None, pieces: int | None, tolerance: float | None,
         imm_bits: int) -> ReluSum:
    """The fit, cached: placement, costing and lowering all ask for it."""
    w = None if weights is None else np.frombuffer(weights, np.float64)
    return fit_relu_sum(np.frombuffer(table, np.int8), w, pieces=pieces, tolerance=tolerance,
                        imm_bits=imm_bits)


def _describe_relu_sum(ctx: PatternContext, stages: tuple[Stage, ...]) -> str:
    rs = next(s for s in stages if isinstance(s, ReluSum))
    weights = ctx.node.attrs.get("weights")
    worst, mean = relu_sum_error(ctx.lookup_table(), rs, weights)
    imm_bits = get_isa(ctx.config).imm_bits
    return (f"approximated: a sum of {rs.pieces} shifted ReLUs (MAX pattern), max error "
            f"{worst} LSB, mean {mean:.2f} LSB, +{alu_cycles_per_row(rs, imm_bits=imm_bits)} "
            "ALU cycles per row")


MAX_PATTERNS = (Pattern("QLookup", _relu_sum_lookup, approximate=True,
                        doc="a sum of shifted ReLUs (approximate)",
                        describe=_describe_relu_sum),)


def mark_approximate_activations(graph: Graph, config: HwConfig, *, pieces: int | None = None,
                                 tolerance: float | None = None,
                                 histograms: Mapping[str, np.ndarray] | None = None) -> int:
    """Ask for the ReLU-sum approximation on every ``QLookup`` no exact pattern of
    ``config`` lowers (a config without the LUT): the node gets ``approximate``, the
    ``pieces``/``tolerance`` the fit takes, and ``weights``, the calibration histogram of
    its input in byte order (``histograms`` by input tensor; uniform without). Returns the
    count. Exactly one of ``pieces`` and ``tolerance`` (a :class:`CompileError` otherwise).
    """
    if (pieces is None) == (tolerance is None):
        raise CompileError("approximate activations need exactly one of a number of pieces "
                           "(shifted ReLUs per activation) and a tolerance (max error in "
                           "output LSBs)",
                           fix={PYTHON: "pass pieces=K or tolerance=T with "
                                        "activations='approximate'",
                                CLI: "give --pieces K or --tolerance T with --activations "
                                     "approximate"})
    count = 0
    for node in graph.nodes:
        if node.op != "QLookup" or node.domain != DOMAIN or _exact(graph, node, config):
            continue
        node.attrs.update(approximate=1, pieces=pieces, tolerance=tolerance)
        hist = (histograms or {}).get(node.inputs[0])
        if hist is not None:
            node.attrs["weights"] = np.asarray(hist, dtype=np.float64)
        count += 1
    return count


def _exact(graph: Graph, node: Node, config: HwConfig) -> bool:
    try:
        return match_node(graph, node, config) is not None
    except CompileError:
        return False
