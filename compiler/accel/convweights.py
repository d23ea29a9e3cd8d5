"""A conv/dense step's weights: the reduction chunks, the weight tile a step loads (which
blocks, where in its slot, by which DMAs) and, for a layer that skips zero weight blocks
(:class:`~.layout.WeightBlocks`), the order of its kernel terms and their uops.

A step of output blocks ``ob0:ob1`` over input blocks ``j0:j1`` holds each output block's
non-zero blocks in packed order, one output block after the other: a dense tile is the
familiar ``[ob][j][ky][kx]``, loaded by one DMA of ``ob_n`` rows. In a sparse one the output
blocks hold unequal numbers of blocks, each a contiguous run in DRAM (a DMA per run of
equal counts). Its GEMM's uop kernel lists the non-zero terms; as they all add into the
tile's accumulator rows, one output block's terms must be the GEMM's hazard distance apart
(:func:`interleave_terms`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from tessera import timing

if TYPE_CHECKING:
    from .convplan import ConvGeom, ConvPlan, Tile


def reduction_chunks(g: "ConvGeom", p: "ConvPlan") -> list[tuple[int, int]]:
    """The input-block ranges ``(j0, j1)`` of a tile's steps (``j_t`` blocks each)."""
    return [(a, min(g.J, a + p.j_t)) for a in range(0, g.J, p.j_t)]


def weight_key(t: "Tile", j0: int, j1: int) -> tuple[int, int, int, int]:
    """The weight tile a step of tile ``t`` over input blocks ``j0:j1`` reads."""
    return (t.ob0, t.ob1, j0, j1)


@dataclass(frozen=True)
class WeightRun:
    """One weight DMA of a step: ``obs`` consecutive output blocks of ``count`` blocks each,
    ``stride`` blocks apart in DRAM from packed index ``dram``, to slot offset ``sram``."""

    sram: int
    dram: int
    obs: int
    count: int
    stride: int


@dataclass(frozen=True)
class StepWeights:
    """A step's weight tile: the slot offset of each output block's blocks (``offsets``,
    from the tile's first output block) and the DMAs that fill it."""

    offsets: tuple[int, ...]
    runs: tuple[WeightRun, ...]


@lru_cache(maxsize=1 << 16)
def step_weights(g: "ConvGeom", ob0: int, ob1: int, j0: int, j1: int) -> StepWeights:
    """The weights of output blocks ``ob0:ob1`` over input blocks ``j0:j1`` in a slot:
    each output block's non-zero blocks in packed order, one after the other. Output
    blocks of equal counts an equal distance apart in DRAM share a DMA, so a dense tile is
    one DMA of ``ob_n`` rows."""
    b = g.blocks
    offsets, runs = [], []
    sram = 0
    for ob in range(ob0, ob1):
        offsets.append(sram)
        n = b.count(ob, j0, j1)
        if n:
            # DRAM distance to the next output block's run (for the layer's last output
            # block its own row): a dense tile's runs are its rows, J * kh * kw apart.
            stride = (b.start(ob + 1, j0) - b.start(ob, j0) if ob + 1 < g.OB
                      else b.count(ob, 0, g.J))
            last = runs[-1] if runs else None
            if (last is not None and last.count == n and last.stride == stride
                    and last.dram + last.obs * stride == b.start(ob, j0)
                    and last.sram + last.obs * n == sram):
                runs[-1] = replace(last, obs=last.obs + 1)
            else:
                runs.append(WeightRun(sram, b.start(ob, j0), 1, n, stride))
        sram += n
    return StepWeights(tuple(offsets), tuple(runs))


def interleave_terms(per_ob: list[list], distance: int) -> list:
    """The terms of a step's output blocks (``per_ob[k]``: block k's, in order) in an
    order that puts one block's terms -- which add into the same accumulator rows -- at
    least ``distance`` GEMM operations apart: greedily the block with most terms left
    among those not used in the last ``distance - 1`` places (optimal: it succeeds whenever
    :func:`terms_interleave` holds); when none is free, the one with most left (a hazard
    the nest mapping then resolves with more uops, :func:`sparse_kernel_uops`)."""
    left = [list(reversed(q)) for q in per_ob]
    recent: list[int] = []
    out = []
    while any(left):
        free = [k for k in range(len(left)) if left[k] and k not in recent]
        pool = free or [k for k in range(len(left)) if left[k]]
        k = max(pool, key=lambda k: len(left[k]))
        out.append(left[k].pop())
        recent = (recent + [k])[-(distance - 1):] if distance > 1 else []
    return out


def terms_interleave(counts: list[int], distance: int) -> bool:
    """Whether output blocks with ``counts`` terms can be ordered with one block's terms
    ``distance`` operations apart: the scheduling bound ``(m - 1) * distance + k <=
    total`` (``m`` the largest count, ``k`` the blocks that have it)."""
    m = max(counts, default=0)
    return m <= 1 or sum(counts) >= (m - 1) * distance + counts.count(m)


def _ob_ranges(g: "ConvGeom", p: "ConvPlan") -> set[tuple[int, int]]:
    """The output-block ranges of a plan's tiles (with every halving of the end tiles' ranges
    a ramp may make: a superset)."""
    ranges = {(a, min(g.OB, a + p.ob_t)) for a in range(0, g.OB, p.ob_t)}
    if p.ramp:
        ends = [min(ranges), max(ranges)]
        for _ in range(p.ramp):
            ends = [h for a, b in ends for h in ((a, (a + b) // 2), ((a + b) // 2, b))
                    if b - a >= 2]
            ranges.update(ends)
    return ranges


@lru_cache(maxsize=1 << 12)
def sparse_kernel_uops(g: "ConvGeom", p: "ConvPlan") -> int:
    """Uops of one copy of every main GEMM kernel of a plan that skips zero blocks: per
    output-block range and input chunk its non-zero blocks, once each when the blocks'
    terms interleave (:func:`terms_interleave`), else once per output column or row of
    the tile (the nest mapping moves a pixel loop into the kernel to space the writes)."""
    d = timing.gemm_hazard_distance()
    spread = min(p.oh_t, g.oh, p.ow_t, g.ow)
    total = 0
    for a, b in _ob_ranges(g, p):
        for j0, j1 in reduction_chunks(g, p):
            counts = [g.blocks.count(ob, j0, j1) for ob in range(a, b)]
            total += sum(counts) * (1 if terms_interleave(counts, d) else max(d, spread))
    return total


@lru_cache(maxsize=1 << 12)
def weight_slot_entries(g: "ConvGeom", p: "ConvPlan") -> int:
    """Weight buffer entries one slot of plan ``p`` needs: ``ob_t x j_t x kh x kw`` blocks
    dense, the most non-zero blocks of any step when zero blocks are skipped (so a sparse
    layer fits larger tiles, which reload less input)."""
    if g.blocks.is_dense:
        return p.ob_t * p.j_t * g.khkw
    return max(sum(g.blocks.count(ob, j0, j1) for ob in range(a, b))
               for a, b in _ob_ranges(g, p) for j0, j1 in reduction_chunks(g, p))

