"""Convolution and dense layers: tiling (``plan_conv_tiles``) and tensorization
(``tensorize_conv2d``) onto the GEMM core.

Geometry. The output is cut into tiles of ``nb_t`` image blocks x ``ob_t``
output channel blocks x ``oh_t`` rows x ``ow_t`` columns; a tile accumulates
in one accumulator *slot* laid out ``[nb][ob][oy][ox]`` (the DRAM order, so
its rows store with few DMAs). Its reduction runs over chunks of ``j_t`` input
channel blocks (of the ``J`` an output block reads, see
:class:`~.layout.GroupBlocks`); each (tile, chunk) is a *step* that needs one
input tile ``[nb][cb][rows][cols]`` (with the zero padding the load DMA
writes) and one weight tile ``[ob][j][ky][kx]`` in a slot of the input and
weight buffers. A step is one GEMM instruction: :func:`~.nest.map_nest` puts
two of the dimensions (usually the output rows and columns) in the hardware
loops and the kernel terms ``(ob, j, ky, kx)`` in the uop kernel.

Virtual threads. With ``threads = 2`` each buffer has two slots used in
turn: the loads of step s+1 and the store of tile T-1 overlap the GEMMs of
step s. Data already resident in a slot (weights across spatial tiles,
inputs across output-channel tiles) is not loaded again. The token pass
orders whatever this produces.

Per tile: a reset and (when the bias folds, see
:func:`~.epilogue.decompose_bias`) one bias GEMM operation per row at the
first step; the epilogue's ALU steps and the stores after the last. When a
tile has fewer accumulator rows than the GEMM's hazard distance (e.g. a
one-row dense layer), the reduction alternates between ``R`` replica rows that
an ALU ADD sums at the end.

Tiling legality is computed from the config before any instruction exists
(:func:`conv_plan_fits`); among legal tilings :func:`plan_conv_tiles` picks the
one with the lowest cycle estimate of a step-level pipeline model built on
:mod:`tessera.timing` (:func:`estimate_conv_cycles`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterable, Iterator

import numpy as np

from tessera import timing
from tessera.config import HwConfig
from tessera.isa import ALU_OPS, Alu, Gemm, Load, MemType, Store, get_isa

from .emit import Emitter, Place, dma_cycles, plane_dmas
from .epilogue import EpiloguePlan, plan_epilogue
from tessera.errors import CompileError
from .layout import ActLayout, GroupBlocks, ceil_div, int_dtype, pack_conv_weights
from .nest import Dim, dim, explicit_dim, map_nest
from .ops import Conv2d, Dense

#: Cap on candidate tilings simulated by the step model (the rest are pruned analytically).
MAX_SIMULATED_PLANS = 60
#: Ranked tilings tensorize tries when a better one's uop kernels overflow the uop buffer.
PLAN_FALLBACKS = 8
#: Plane groups of the last tile's epilogue and store (see tensorize_conv2d).
LAST_TILE_CHUNKS = 8


# ------------------------------------------------------------------ geometry
@dataclass(frozen=True)
class ConvGeom:
    """Shapes of one convolution on one config (all sizes in blocks where it says so)."""

    name: str
    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    sy: int
    sx: int
    dy: int
    dx: int
    pt: int
    pl: int
    pb: int
    pr: int
    oh: int
    ow: int
    NB: int
    CB: int
    OB: int
    gb: GroupBlocks

    @classmethod
    def of(cls, op: Conv2d, in_shape: tuple[int, int, int, int], config: HwConfig) -> "ConvGeom":
        n, c, h, w = in_shape
        _, o, oh, ow = op.output_shape(in_shape)
        kh, kw = op.weight.shape[2:]
        gb = GroupBlocks.of(c, o, op.groups, config.block_in, config.block_out)
        return cls(op.name, n, c, h, w, o, kh, kw, *op.stride, *op.dilation, *op.padding, oh, ow,
                   ceil_div(n, config.batch), ceil_div(c, config.block_in),
                   ceil_div(o, config.block_out), gb)

    @property
    def J(self) -> int:
        return self.gb.J

    @property
    def khkw(self) -> int:
        return self.kh * self.kw

    @property
    def ragged(self) -> bool:
        """Some output blocks read fewer input blocks than others (grouped convolutions whose
        blocks run past the last input block)."""
        return any(lo + self.J > self.CB for lo in self.gb.cb_lo)

    @property
    def row_step(self) -> int:
        """Input rows a tile holds are this far apart (a 1-row kernel skips strided rows)."""
        return self.sy if self.kh == 1 else 1



@dataclass(frozen=True)
class Tile:
    nb0: int
    nb1: int
    ob0: int
    ob1: int
    oy0: int
    oy1: int
    ox0: int
    ox1: int

    @property
    def pixels(self) -> int:
        return (self.oy1 - self.oy0) * (self.ox1 - self.ox0)

    @property
    def rows(self) -> int:
        """Accumulator rows of the tile."""
        return (self.nb1 - self.nb0) * (self.ob1 - self.ob0) * self.pixels


@dataclass(frozen=True)
class InTile:
    """The input a step needs: blocks, rows and columns (padded), and the DMA pads."""

    nb0: int
    nb1: int
    c0: int
    c1: int
    iy0: int
    rows: int
    ix0: int
    cols: int
    pads: tuple[int, int, int, int]   # y_pad_0, y_pad_1, x_pad_0, x_pad_1

    @property
    def entries(self) -> int:
        return (self.nb1 - self.nb0) * (self.c1 - self.c0) * self.rows * self.cols

    @property
    def key(self) -> tuple:
        return (self.nb0, self.nb1, self.c0, self.c1, self.iy0, self.rows, self.ix0, self.cols)


@lru_cache(maxsize=1 << 16)
def input_tile(g: ConvGeom, t: Tile, j0: int, j1: int) -> InTile:
    obs = range(t.ob0, t.ob1)
    c0 = min(g.gb.cb_lo[ob] + j0 for ob in obs)
    c1 = min(g.CB, max(g.gb.cb_lo[ob] + j1 for ob in obs))
    rs = g.row_step
    iy0 = t.oy0 * g.sy - g.pt
    if rs > 1:
        rows = t.oy1 - t.oy0
    else:
        rows = (t.oy1 - 1) * g.sy - g.pt + g.dy * (g.kh - 1) + 1 - iy0
    ix0 = t.ox0 * g.sx - g.pl
    cols = (t.ox1 - 1) * g.sx - g.pl + g.dx * (g.kw - 1) + 1 - ix0
    top = min(rows, ceil_div(-iy0, rs)) if iy0 < 0 else 0
    last = iy0 + (rows - 1) * rs
    bottom = min(rows - top, max(0, (last - g.h) // rs + 1)) if last >= g.h else 0
    left = min(cols, max(0, -ix0))
    right = min(cols - left, max(0, ix0 + cols - g.w))
    return InTile(t.nb0, t.nb1, c0, c1, iy0, rows, ix0, cols, (top, bottom, left, right))


# ------------------------------------------------------------------ plans
@dataclass(frozen=True)
class ConvPlan:
    """A tiling: tile sizes (in blocks / rows / columns), virtual threads, tile order.

    ``order`` is ``"spatial"`` (output-channel tiles innermost: an input tile
    is reused by every output block) or ``"channel"`` (spatial tiles
    innermost: weights stay resident).
    """

    nb_t: int
    ob_t: int
    oh_t: int
    ow_t: int
    j_t: int
    threads: int = 2
    order: str = "channel"
    ramp: int = 0
    est_cycles: int = 0

    def describe(self, config: HwConfig) -> str:
        return (f"{self.ob_t * config.block_out}ch x {self.oh_t}x{self.ow_t}px tiles, "
                f"{self.j_t} input block(s) per step, {self.threads} thread(s), "
                f"{self.order}-outer"
                + (f", first/last tiles halved {self.ramp}x" if self.ramp else ""))


def _halves(t: Tile, level: int = 0) -> list[Tile]:
    """Split a tile in two: rows at even ``level`` s, output blocks at odd ones (so the
    first step's input *and* weight tiles shrink), whichever the tile has."""
    order = ("oy", "ob", "ox") if level % 2 == 0 else ("ob", "oy", "ox")
    for d in order:
        a, b = getattr(t, d + "0"), getattr(t, d + "1")
        if b - a >= 2:
            m = (a + b) // 2
            return [replace(t, **{d + "1": m}), replace(t, **{d + "0": m})]
    return [t]


def tiles_of(g: ConvGeom, p: ConvPlan) -> list[Tile]:
    """The output tiles in program order.

    With ``ramp`` the first and the last tile are split in halves: the first
    GEMM then waits for half a tile of input, and the last store that nothing
    overlaps is half as long.
    """
    def ranges(total, size):
        return [(a, min(total, a + size)) for a in range(0, total, size)]
    nbs, obs = ranges(g.NB, p.nb_t), ranges(g.OB, p.ob_t)
    oys, oxs = ranges(g.oh, p.oh_t), ranges(g.ow, p.ow_t)
    if p.order == "spatial":
        tiles = [Tile(*nb, *ob, *oy, *ox) for nb in nbs for oy in oys for ox in oxs for ob in obs]
    else:
        tiles = [Tile(*nb, *ob, *oy, *ox) for ob in obs for nb in nbs for oy in oys for ox in oxs]
    for level in range(p.ramp):
        if len(tiles) == 1:
            tiles = _halves(tiles[0], level)
        else:
            tiles = _halves(tiles[0], level) + tiles[1:-1] + _halves(tiles[-1], level)[::-1]
    return tiles


@dataclass
class Step:
    tile_index: int
    tile: Tile
    j0: int
    j1: int
    first: bool
    last: bool
    intile: InTile
    inp_slot: int
    wgt_slot: int
    acc_slot: int
    load_inp: bool
    load_wgt: bool


def schedule(g: ConvGeom, p: ConvPlan, acc_first: int = 0) -> list[Step]:
    """The steps of plan ``p`` in program order, with slot assignment and reuse
    (accumulator slots rotate from ``acc_first``)."""
    steps: list[Step] = []
    res_inp: list[tuple | None] = [None] * p.threads
    res_wgt: list[tuple | None] = [None] * p.threads
    nxt_inp = nxt_wgt = 0
    chunks = [(a, min(g.J, a + p.j_t)) for a in range(0, g.J, p.j_t)]
    for ti, t in enumerate(tiles_of(g, p)):
        for ci, (j0, j1) in enumerate(chunks):
            it = input_tile(g, t, j0, j1)
            if it.key in res_inp:
                islot, li = res_inp.index(it.key), False
            else:
                islot, li = nxt_inp, True
                res_inp[islot] = it.key
                nxt_inp = (nxt_inp + 1) % p.threads
            wkey = (t.ob0, t.ob1, j0, j1)
            if wkey in res_wgt:
                wslot, lw = res_wgt.index(wkey), False
            else:
                wslot, lw = nxt_wgt, True
                res_wgt[wslot] = wkey
                nxt_wgt = (nxt_wgt + 1) % p.threads
            steps.append(Step(ti, t, j0, j1, ci == 0, ci == len(chunks) - 1, it, islot, wslot,
                              (ti + acc_first) % p.threads, li, lw))
    return steps


def replicas(config: HwConfig, rows: int) -> int:
    """Replica accumulator sets a tile of ``rows`` rows needs to respect the GEMM hazard."""
    return max(1, ceil_div(timing.gemm_hazard_distance(), max(1, rows)))


def tile_replicas(config: HwConfig, g: ConvGeom, nb: int, ob: int, px: int) -> int:
    """Replicas of a tile: by its rows, or by one output block's rows when blocks have
    unequal numbers of terms (then consecutive terms may hit the same block)."""
    return replicas(config, nb * px if g.ragged else nb * ob * px)


@dataclass(frozen=True)
class Budget:
    """Buffer space a plan takes (entries), from :func:`conv_plan_fits`."""

    inp_slot: int
    wgt_slot: int
    acc_slot: int
    inp: int
    wgt: int
    acc: int


def max_input_entries(g: ConvGeom, p: ConvPlan) -> int:
    """Largest input tile of the plan (the first tiles of each kind bound it)."""
    rs = g.row_step
    rows = p.oh_t if rs > 1 else (p.oh_t - 1) * g.sy + g.dy * (g.kh - 1) + 1
    cols = (p.ow_t - 1) * g.sx + g.dx * (g.kw - 1) + 1
    if g.gb.slope == 0:
        span = p.j_t
    else:
        span = max(max(g.gb.cb_lo[a:a + p.ob_t]) - min(g.gb.cb_lo[a:a + p.ob_t])
                   for a in range(0, g.OB, p.ob_t)) + p.j_t
    return p.nb_t * min(span, g.CB) * rows * cols


def _halve_extents(e: tuple[int, int, int, int], level: int) -> list[tuple[int, int, int, int]]:
    """:func:`_halves` on extents ``(nb, ob, oy, ox)``."""
    order = (2, 1, 3) if level % 2 == 0 else (1, 2, 3)
    for d in order:
        if e[d] >= 2:
            lo = list(e)
            hi = list(e)
            lo[d] = e[d] // 2
            hi[d] = e[d] - e[d] // 2
            return [tuple(lo), tuple(hi)]  # type: ignore[list-item]
    return [e]


def tile_shapes(g: ConvGeom, p: ConvPlan) -> set[tuple[int, int, int, int]]:
    """Extents ``(nb, ob, oy, ox)`` of every distinct tile shape of the plan (analytic)."""
    def sizes(total, size):
        last = total - (ceil_div(total, size) - 1) * size
        return {min(size, total), last}
    shapes = set()
    for a in sizes(g.NB, p.nb_t):
        for b in sizes(g.OB, p.ob_t):
            for c in sizes(g.oh, p.oh_t):
                for d in sizes(g.ow, p.ow_t):
                    parts = [(a, b, c, d)]
                    shapes.add((a, b, c, d))
                    for level in range(p.ramp):
                        parts = [h for e in parts for h in _halve_extents(e, level)]
                        shapes.update(parts)
    return shapes


def estimate_uops(g: ConvGeom, p: ConvPlan, config: HwConfig) -> int:
    """Uops a plan's kernels take (analytic): a main GEMM kernel per distinct step shape and
    slot combination (the input tile's row pitch and plane size enter its source offsets),
    with one uop per kernel term (the output pixels are the hardware loops), or per term and
    pixel when a tile has fewer rows than the GEMM hazard distance; the one-uop reset, bias
    and epilogue kernels per shape."""
    def sizes(total, size):
        return {min(size, total), total - (ceil_div(total, size) - 1) * size}
    combos = min(p.threads ** 3, ceil_div(g.NB, p.nb_t) * ceil_div(g.OB, p.ob_t)
                 * ceil_div(g.oh, p.oh_t) * ceil_div(g.ow, p.ow_t) * ceil_div(g.J, p.j_t))
    total = 0
    shapes = tile_shapes(g, p)
    for a, b, c, d in shapes:
        rows = a * b * c * d
        per_term = c * d * a if rows < timing.gemm_hazard_distance() else 1
        for j in sizes(g.J, p.j_t):
            total += combos * b * j * g.khkw * per_term
    return total + len(shapes) * p.threads * 8


def conv_plan_fits(g: ConvGeom, p: ConvPlan, config: HwConfig, ep: EpiloguePlan) -> Budget | str:
    """The buffer budget of ``p`` if it fits ``config``, else why not (analytic, no codegen)."""
    t_rows = p.nb_t * p.ob_t * p.oh_t * p.ow_t
    smallest = 1
    for total, size in ((g.NB, p.nb_t), (g.OB, p.ob_t), (g.oh, p.oh_t), (g.ow, p.ow_t)):
        smallest *= min(size, total - (ceil_div(total, size) - 1) * size)
    if smallest >> p.ramp >= timing.gemm_hazard_distance() and not g.ragged:
        acc_slot = t_rows  # no tile is small enough to need replica rows
    else:
        acc_slot = max(tile_replicas(config, g, a, b, c * d) * a * b * c * d
                       for a, b, c, d in tile_shapes(g, p))
    acc_slot += t_rows if ep.residuals else 0
    inp_slot = max_input_entries(g, p)
    wgt_slot = p.ob_t * p.j_t * g.khkw
    extra_inp = 1 if ep.gemm_bias is not None else 0
    extra_wgt = g.OB if ep.gemm_bias is not None else 0
    acc = p.threads * acc_slot + ep.param_rows(g.OB)
    inp = p.threads * inp_slot + extra_inp
    wgt = p.threads * wgt_slot + extra_wgt
    if inp > config.inp_depth:
        return (f"the input tile needs {inp_slot} entries per thread ({inp} with {p.threads} "
                f"thread(s)) but the input buffer has {config.inp_depth}")
    if wgt > config.wgt_depth:
        return (f"the weight tile of {p.ob_t} output block(s) x {p.j_t} input block(s) x "
                f"{g.khkw} taps needs {wgt_slot} entries per thread ({wgt} in all) but the "
                f"weight buffer has {config.wgt_depth}")
    if acc > config.acc_depth:
        return (f"the accumulator tile needs {acc_slot} rows per thread plus "
                f"{ep.param_rows(g.OB)} parameter rows ({acc} in all) but the accumulator "
                f"has {config.acc_depth}")
    uops = estimate_uops(g, p, config)
    if uops > config.uop_depth:
        return (f"its uop kernels need about {uops} uops but the uop buffer has "
                f"{config.uop_depth}")
    pad_max = get_isa(config).layouts[0].field("y_pad_0").hi
    if max(g.pt, g.pl, g.pb, g.pr) > pad_max:
        return f"padding {max(g.pt, g.pl, g.pb, g.pr)} exceeds the load DMA's {pad_max}"
    return Budget(inp_slot, wgt_slot, acc_slot, inp, wgt, acc)


# ------------------------------------------------------------------ cost model
@lru_cache(maxsize=65536)
def _load_cycles(config: HwConfig, mem: MemType, y: int, x: int, stride: int,
                 pads: tuple[int, int, int, int]) -> int:
    return dma_cycles(config, Load(mem=mem, y_size=y, x_size=x, x_stride=stride,
                                   y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2],
                                   x_pad_1=pads[3]))


@lru_cache(maxsize=65536)
def _store_cycles(config: HwConfig, y: int, x: int, stride: int) -> int:
    return dma_cycles(config, Store(y_size=y, x_size=x, x_stride=stride))


@lru_cache(maxsize=4096)
def _gemm_cycles(ops: int) -> int:
    return timing.gemm_cycles(Gemm(uop_begin=0, uop_end=1, iter_out=ops))


@lru_cache(maxsize=4096)
def _alu_cycles(op: str, use_imm: bool, ops: int) -> int:
    return timing.alu_cycles(Alu(alu_op=ALU_OPS.by_name(op).opcode, use_imm=use_imm,
                                 uop_begin=0, uop_end=1, iter_out=ops))


def fetch_cycles_per_insn(config: HwConfig) -> float:
    """Average cycles fetch spends per instruction (burst read plus dispatch)."""
    n = timing.fetch_chunk_insns(config)
    return (config.dram_latency + timing.fetch_chunk_beats(config, n)
            + n * timing.FETCH_DISPATCH_CYCLES) / n


@lru_cache(maxsize=1 << 16)
def step_terms(g: ConvGeom, t: Tile, j0: int, j1: int, it: InTile) -> int:
    """Kernel terms ``(ob, j, ky, kx)`` of a step whose input block exists."""
    n = 0
    for ob in range(t.ob0, t.ob1):
        for j in range(j0, j1):
            cb = g.gb.cb_lo[ob] + j
            if it.c0 <= cb < it.c1:
                n += 1
    return n * g.khkw


class ConvCostModel:
    """The step-level pipeline model of one convolution's tilings (memoised per shape).

    :meth:`estimate` follows :func:`schedule` step by step: the load of step s
    starts when the load module is free and the slot it fills was last read by
    a finished GEMM; its compute starts when its data is loaded, its
    accumulator slot was stored, and fetch has dispatched it; stores follow each
    tile's epilogue. Durations come from :mod:`tessera.timing`.
    """

    def __init__(self, g: ConvGeom, config: HwConfig, ep: EpiloguePlan) -> None:
        self.g, self.config, self.ep = g, config, ep
        self.per_insn = fetch_cycles_per_insn(config)
        self._step: dict[tuple, tuple] = {}
        self._tile: dict[tuple, tuple] = {}
        self.epi = [(s.op, s.imm is not None) for s in ep.steps if s.kind == "alu"]
        # Cycles one more set of epilogue instructions costs beyond their rows.
        self.chunk_overhead = sum(_alu_cycles(op, imm, 1) - ALU_OPS.by_name(op).timing.ii(imm)
                                  for op, imm in self.epi)

    def step_costs(self, t: Tile, j0: int, j1: int) -> tuple:
        key = (t.nb0, t.nb1, t.ob0, t.ob1, t.oy0, t.oy1, t.ox0, t.ox1, j0, j1)
        hit = self._step.get(key)
        if hit is None:
            g, config = self.g, self.config
            it = input_tile(g, t, j0, j1)
            planes = (it.nb1 - it.nb0) * (it.c1 - it.c0)
            icyc = planes * _load_cycles(config, MemType.INP, it.rows - it.pads[0] - it.pads[1],
                                         it.cols - it.pads[2] - it.pads[3], g.w * g.row_step,
                                         it.pads)
            wcyc = _load_cycles(config, MemType.WGT, t.ob1 - t.ob0, (j1 - j0) * g.khkw,
                                g.J * g.khkw, (0, 0, 0, 0))
            ops = step_terms(g, t, j0, j1, it) * (t.nb1 - t.nb0) * t.pixels
            hit = (it.key, icyc, planes, (t.ob0, t.ob1, j0, j1), wcyc, _gemm_cycles(ops), ops)
            self._step[key] = hit
        return hit

    def tile_costs(self, t: Tile) -> tuple:
        key = (t.nb0, t.nb1, t.ob0, t.ob1, t.oy0, t.oy1, t.ox0, t.ox1)
        hit = self._tile.get(key)
        if hit is None:
            g, config, ep = self.g, self.config, self.ep
            rows = t.rows
            r = tile_replicas(config, g, t.nb1 - t.nb0, t.ob1 - t.ob0, t.pixels)
            first = _gemm_cycles(rows * r)
            last = (r - 1) * _alu_cycles("ADD", False, rows)
            last += sum(_alu_cycles(op, imm, rows) for op, imm in self.epi)
            if ep.gemm_bias is not None:
                last += _gemm_cycles(rows)
            nb_n = t.nb1 - t.nb0
            for _ in ep.residuals:
                last += nb_n * _load_cycles(config, MemType.ACC8, 1, rows // nb_n, rows,
                                            (0, 0, 0, 0)) + _alu_cycles("ADD", False, rows)
            if t.ox1 - t.ox0 == g.ow:
                store = nb_n * _store_cycles(config, t.ob1 - t.ob0, t.pixels, g.oh * g.ow)
            else:
                store = nb_n * (t.ob1 - t.ob0) * _store_cycles(config, t.oy1 - t.oy0,
                                                              t.ox1 - t.ox0, g.ow)
            insns = 2 + len(ep.steps) + (t.ob1 - t.ob0) + r
            hit = (first, last, store, insns)
            self._tile[key] = hit
        return hit

    def estimate(self, p: ConvPlan, bound: float = math.inf) -> float:
        """Cycle estimate of plan ``p``; ``inf`` once it exceeds ``bound`` (pruning)."""
        g = self.g
        T = p.threads
        per_insn = self.per_insn
        chunks = [(a, min(g.J, a + p.j_t)) for a in range(0, g.J, p.j_t)]
        res_inp: list = [None] * T
        res_wgt: list = [None] * T
        nxt_i = nxt_w = 0
        load_end = comp_end = store_end = fetched = 0.0
        left = total_gemm_ops(g)  # GEMM work not yet issued: a lower bound on what remains
        read_inp = [0.0] * T
        read_wgt = [0.0] * T
        acc_free = [0.0] * T
        last_chunk = len(chunks) - 1
        tiles = tiles_of(g, p)
        n_tiles = len(tiles)
        for ti, t in enumerate(tiles):
            first_c, last_c, store_c, t_insns = self.tile_costs(t)
            aslot = ti % T
            for ci, (j0, j1) in enumerate(chunks):
                ikey, icyc, iplanes, wkey, wcyc, gcyc, ops = self.step_costs(t, j0, j1)
                left -= ops
                n_insn = 1
                start = load_end
                loaded = False
                if ikey in res_inp:
                    islot = res_inp.index(ikey)
                else:
                    islot = nxt_i
                    res_inp[islot] = ikey
                    nxt_i = (nxt_i + 1) % T
                    start = max(start, read_inp[islot])
                    n_insn += iplanes
                    loaded = True
                lc = icyc if loaded else 0
                if wkey in res_wgt:
                    wslot = res_wgt.index(wkey)
                else:
                    wslot = nxt_w
                    res_wgt[wslot] = wkey
                    nxt_w = (nxt_w + 1) % T
                    start = max(start, read_wgt[wslot])
                    n_insn += 1
                    lc += wcyc
                    loaded = True
                if loaded:
                    load_end = start + lc
                ccyc = gcyc
                if ci == 0:
                    ccyc += first_c
                if ci == last_chunk:
                    ccyc += last_c
                    n_insn += t_insns
                fetched += n_insn * per_insn
                cstart = comp_end
                if loaded and load_end > cstart:
                    cstart = load_end
                if fetched > cstart:
                    cstart = fetched
                if ci == 0 and acc_free[aslot] > cstart:
                    cstart = acc_free[aslot]
                comp_end = cstart + ccyc
                read_inp[islot] = comp_end
                read_wgt[wslot] = comp_end
                if ci == last_chunk:
                    if ti == n_tiles - 1:
                        # Plane groups: only the last group's store is exposed, each group
                        # adds its own epilogue instructions.
                        n_ch = len(epilogue_chunks(t, LAST_TILE_CHUNKS))
                        comp_end += (n_ch - 1) * self.chunk_overhead
                        store_c = store_c / n_ch
                    store_end = max(store_end, comp_end) + store_c
                    acc_free[aslot] = store_end
                if comp_end + left > bound:
                    return math.inf
        return max(comp_end, store_end)


def estimate_conv_cycles(g: ConvGeom, p: ConvPlan, config: HwConfig, ep: EpiloguePlan,
                         bound: float = math.inf) -> float:
    """Cycle estimate of plan ``p`` (see :class:`ConvCostModel`)."""
    return ConvCostModel(g, config, ep).estimate(p, bound)


def candidate_sizes(total: int, limit: int | None = None) -> list[int]:
    """Tile sizes that split ``total`` evenly: ``ceil(total / k)`` for every k, largest first."""
    sizes = sorted({ceil_div(total, k) for k in range(1, total + 1)}, reverse=True)
    return sizes if limit is None else sizes[:limit]


@lru_cache(maxsize=256)
def total_gemm_ops(g: ConvGeom) -> int:
    """GEMM operations of the whole layer (independent of the tiling)."""
    lo = np.asarray(g.gb.cb_lo)
    pairs = int(np.clip(g.CB - lo, 0, g.J).sum())
    return pairs * g.khkw * g.NB * g.oh * g.ow


def quick_estimate(g: ConvGeom, p: ConvPlan, config: HwConfig, ep: EpiloguePlan
                   ) -> tuple[float, float]:
    """Closed-form cycle estimate used to pre-rank tilings (no schedule is built).

    ``max(compute, load) + fill + tail`` with two threads, ``compute + load +
    store`` with one; load counts follow the reuse rules of :func:`schedule`
    (a weight or input tile stays resident while it fits the slots). Returns
    the estimate (without halved end tiles) and its fill + tail part.
    """
    T = p.threads
    n_obt = ceil_div(g.OB, p.ob_t)
    n_sp = ceil_div(g.NB, p.nb_t) * ceil_div(g.oh, p.oh_t) * ceil_div(g.ow, p.ow_t)
    n_j = ceil_div(g.J, p.j_t)
    n_tiles = n_sp * n_obt
    steps = n_tiles * n_j
    tile_rows = p.nb_t * p.ob_t * p.oh_t * p.ow_t
    drain = _gemm_cycles(1) - 1
    epi = sum(_alu_cycles(s.op, s.imm is not None, tile_rows) for s in ep.steps
              if s.kind == "alu")
    epi += _gemm_cycles(tile_rows * tile_replicas(config, g, p.nb_t, p.ob_t, p.oh_t * p.ow_t))
    if ep.gemm_bias is not None:
        epi += _gemm_cycles(tile_rows)
    # Edge tiles are smaller than tile_rows: charging every tile the full epilogue slightly
    # overestimates, equally for similar tilings.
    compute = total_gemm_ops(g) + steps * drain + n_tiles * epi
    it = input_tile(g, Tile(0, p.nb_t, 0, p.ob_t, 0, min(p.oh_t, g.oh), 0, min(p.ow_t, g.ow)),
                    0, min(g.J, p.j_t))
    l_in = (it.c1 - it.c0) * (it.nb1 - it.nb0) * _load_cycles(
        config, MemType.INP, it.rows - it.pads[0] - it.pads[1], it.cols - it.pads[2] - it.pads[3],
        g.w * g.row_step, it.pads)
    l_w = _load_cycles(config, MemType.WGT, min(p.ob_t, g.OB), min(g.J, p.j_t) * g.khkw,
                       g.J * g.khkw, (0, 0, 0, 0))
    if p.order == "channel":
        w_loads = n_obt * n_j if n_j <= T else steps
        i_loads = n_j if (n_sp == 1 and n_j <= T and g.gb.slope == 0) else steps
    else:
        i_loads = n_sp * n_j if (n_j <= T and g.gb.slope == 0) else steps
        w_loads = n_obt * n_j if n_obt * n_j <= T else steps
    load = i_loads * l_in + w_loads * l_w
    store = _store_cycles(config, 1, tile_rows, tile_rows)
    if T == 1:
        return compute + load + n_tiles * store, 0.0
    return max(compute, load) + l_in + l_w + store, l_in + l_w + store


def plan_conv_tiles(g: ConvGeom, config: HwConfig, ep: EpiloguePlan, threads: int = 2,
                    top: int = 1) -> list[ConvPlan]:
    """Legal tilings of ``g`` ranked by :func:`estimate_conv_cycles` (best ``top`` returned).

    Legality is analytic (:func:`conv_plan_fits`). The legal tilings are
    pre-ranked by :func:`quick_estimate`; the best few, each with 0-2 halvings
    of the end tiles, are costed by the step model. Raises
    :class:`CompileError` naming the buffer that overflows when no tiling fits.
    """
    plans: list[ConvPlan] = []
    ow_opts = candidate_sizes(g.ow)
    oh_opts = candidate_sizes(g.oh)
    for nb_t in candidate_sizes(g.NB, 3):
        for ob_t in candidate_sizes(g.OB):
            for j_t in candidate_sizes(g.J):
                best_w = None
                for ow_t in ow_opts:
                    if best_w is not None and ow_t < best_w // 2:
                        break
                    found = 0
                    for oh_t in oh_opts:
                        p = ConvPlan(nb_t, ob_t, oh_t, ow_t, j_t, threads, "channel")
                        fit = conv_plan_fits(g, p, config, ep)
                        if isinstance(fit, str):
                            continue
                        plans.append(p)
                        n_sp = ceil_div(g.NB, nb_t) * ceil_div(g.oh, oh_t) * ceil_div(g.ow, ow_t)
                        if n_sp > 1 and ob_t < g.OB:
                            plans.append(replace(p, order="spatial"))
                        best_w = best_w or ow_t
                        found += 1
                        if found >= 4:
                            break
    if not plans:
        smallest = conv_plan_fits(g, ConvPlan(1, 1, 1, 1, 1, threads), config, ep)
        if threads > 1 and not isinstance(conv_plan_fits(g, ConvPlan(1, 1, 1, 1, 1, 1), config,
                                                         ep), str):
            # Double buffering does not fit; run without latency hiding rather than not at all.
            return plan_conv_tiles(g, config, ep, 1, top)
        raise CompileError(f"conv2d {g.name!r}: no tiling fits config {config.name!r}: even a "
                           f"one-pixel tile of one output block and one input block fails "
                           f"because {smallest}; use a config with larger buffers",
                           op=g.name)
    # Branch and bound: every plan with 0-2 halvings of its end tiles, ordered by an
    # optimistic closed-form estimate (a halving can save up to that share of the fill and
    # tail), costed in that order by the step model, which stops early once the GEMM work
    # left cannot fit under the best estimate so far.
    model = ConvCostModel(g, config, ep)
    variants = []
    for p in plans:
        q, fill_tail = quick_estimate(g, p, config, ep)
        variants.append((q, p))
        if threads > 1:
            for r in (1, 2):
                v = replace(p, ramp=r)
                if not isinstance(conv_plan_fits(g, v, config, ep), str):
                    variants.append((q - fill_tail * (1 - 0.5 ** r), v))
    variants.sort(key=lambda t: t[0])
    ranked: list[ConvPlan] = []
    best = math.inf
    for q, v in variants[:MAX_SIMULATED_PLANS]:
        if q > best * 1.05:
            break
        est = model.estimate(v, bound=best)
        if est < math.inf:
            ranked.append(replace(v, est_cycles=int(est)))
            best = min(best, est)
    ranked.sort(key=lambda p: p.est_cycles)
    return ranked[:top]


# ------------------------------------------------------------------ codegen
def epilogue_chunks(t: Tile, chunks: int) -> list[tuple[int | None, int, int]]:
    """Plane groups ``(nb or None for all, ob0, ob1)`` of a tile's epilogue, at most ``chunks``."""
    ob_n = t.ob1 - t.ob0
    if chunks <= 1 or (ob_n == 1 and t.nb1 - t.nb0 == 1):
        return [(None, t.ob0, t.ob1)]
    per_nb = max(1, chunks // (t.nb1 - t.nb0))
    size = -(-ob_n // min(per_nb, ob_n))
    return [(nb, o, min(t.ob1, o + size)) for nb in range(t.nb0, t.nb1)
            for o in range(t.ob0, t.ob1, size)]


def acc_bound(weight: np.ndarray, config: HwConfig) -> tuple[int, int]:
    """Bounds of the raw accumulator: sum |w| x the largest input magnitude, per channel."""
    m = 1 << (config.inp_width - 1)
    w = weight.reshape(weight.shape[0], -1).astype(np.int32)  # int8 abs(-128) would wrap
    s = int(np.abs(w).sum(axis=1, dtype=np.int64).max()) * m
    return -s, s


def param_rows_data(ep: EpiloguePlan, ob_count: int,
                    config: HwConfig) -> tuple[np.ndarray, list[int]]:
    """The parameter rows (int32 accumulator entries) and each vector's first row."""
    bo, n = config.block_out, config.batch
    rows, starts = [], []
    for p in ep.params:
        starts.append(sum(r.shape[0] for r in rows))
        if p.size == 1:
            rows.append(np.full((1, n, bo), p[0], dtype=np.int64))
        else:
            lanes = np.zeros(ob_count * bo, dtype=np.int64)
            lanes[:p.size] = p
            rows.append(np.broadcast_to(lanes.reshape(ob_count, 1, bo), (ob_count, n, bo)))
    data = (np.concatenate(rows) if rows else np.zeros((0, n, bo), np.int64))
    return _to_int32(data), starts


def _to_int32(a: np.ndarray) -> np.ndarray:
    return ((np.asarray(a, dtype=np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def emit_param_prologue(em: Emitter, op_name: str, ep: EpiloguePlan, ob_count: int
                        ) -> tuple[int, list[int], list[Load]]:
    """Load the epilogue's parameter rows into the top of the accumulator (a compute-module
    LOAD, emitted here).

    Returns the first parameter row, each vector's row offset, and (if the bias folds into the
    GEMM) the load-module LOADs of its constant input row and weights, for the caller to
    place after its first data loads (the bias GEMM runs at the end of a tile).
    """
    c = em.config
    data, starts = param_rows_data(ep, ob_count, c)
    base = c.acc_depth - data.shape[0]
    if data.shape[0]:
        seg = em.add_segment(f"{op_name}.params", data)
        em.emit(Load(mem=MemType.ACC, sram_base=base, dram_base=em.elem(Place(seg), MemType.ACC),
                     y_size=1, x_size=data.shape[0], x_stride=data.shape[0]))
    late: list[Load] = []
    if ep.gemm_bias is not None:
        bi, bo = c.block_in, c.block_out
        const = np.broadcast_to(ep.gemm_bias_const.reshape(1, bi), (c.batch, bi))
        seg = em.add_segment(f"{op_name}.bias_row", const.astype(int_dtype(c.inp_width)))
        late.append(Load(mem=MemType.INP, sram_base=c.inp_depth - 1,
                         dram_base=em.elem(Place(seg), MemType.INP), y_size=1, x_size=1,
                         x_stride=1))
        w = np.zeros((ob_count * bo, bi), dtype=np.int64)
        w[:ep.gemm_bias_weights.shape[0]] = ep.gemm_bias_weights
        seg = em.add_segment(f"{op_name}.bias_w", w.reshape(ob_count, bo, bi)
                             .astype(int_dtype(c.wgt_width)))
        late.append(Load(mem=MemType.WGT, sram_base=c.wgt_depth - ob_count,
                         dram_base=em.elem(Place(seg), MemType.WGT), y_size=1, x_size=ob_count,
                         x_stride=ob_count))
    return base, starts, late


def emit_epilogue(em: Emitter, ep: EpiloguePlan, *, acc_base: int, nb_n: int, ob_n: int,
                  pixels: int, ob0: int, param_base: int, param_starts: list[int],
                  scratch_base: int, residual_loads, where: str) -> None:
    """The tile's epilogue ALU steps (and residual loads/adds) over rows ``[nb][ob][pix]``."""
    isa = em.isa
    rows = nb_n * ob_n * pixels
    for st in ep.steps:
        if st.kind == "residual":
            em.emit(*residual_loads(st.tensor, scratch_base))
            op = ALU_OPS.by_name("ADD")
            nest = map_nest([dim("rows", rows, dst=1, src=1)], (acc_base, scratch_base, 0),
                            kind="alu", isa=isa, distance=op.timing.hazard_distance(False),
                            src_is_acc_read=True, where=where)
            b, e = em.kernel(nest.uops)
            em.emit(Alu(alu_op=op.opcode, uop_begin=b, uop_end=e, **nest.fields("alu")))
            continue
        op = ALU_OPS.by_name(st.op)
        use_imm = st.imm is not None
        if use_imm:
            dims = [dim("rows", rows, dst=1)]
            base = (acc_base, 0, 0)
        else:
            vec = ep.params[st.param]
            s = 1 if vec.size > 1 else 0
            dims = [dim("nb", nb_n, dst=ob_n * pixels), dim("ob", ob_n, dst=pixels, src=s),
                    dim("pix", pixels, dst=1)]
            base = (acc_base, param_base + param_starts[st.param] + ob0 * s, 0)
        nest = map_nest(dims, base, kind="alu", isa=isa,
                        distance=op.timing.hazard_distance(use_imm),
                        src_is_acc_read=not use_imm, where=where)
        b, e = em.kernel(nest.uops)
        em.emit(Alu(alu_op=op.opcode, use_imm=use_imm, imm=st.imm or 0, uop_begin=b, uop_end=e,
                    **nest.fields("alu")))


@dataclass
class TensorInfo:
    """A tensor's place and layout, as the builder hands them to the tensorizers."""

    name: str
    layout: ActLayout
    place: Place


def tensorize_conv2d(em: Emitter, op: Conv2d | Dense, inp: TensorInfo, out: TensorInfo,
                     residuals: dict[str, TensorInfo], *, threads: int = 2,
                     plan: ConvPlan | None = None) -> ConvPlan:
    """Emit the instructions of one convolution (or dense layer) into ``em``.

    Returns the plan used. Instructions carry no tokens:
    :func:`~.sync.insert_dependency_tokens` adds them for the whole program.
    """
    conv = op.as_conv() if isinstance(op, Dense) else op
    c = em.config
    isa = em.isa
    where = f"conv2d {op.name!r}"
    g = ConvGeom.of(conv, inp.layout.shape, c)
    if inp.layout.block != c.block_in:
        raise CompileError(f"{where}: input {inp.name!r} is packed in blocks of "
                           f"{inp.layout.block} channels but the GEMM reads {c.block_in}",
                           op=op.name)
    ep = plan_epilogue(conv.epilogue, channels=g.o, config=c,
                       acc_range=acc_bound(conv.weight, c), gemm_bias=True, where=where)
    if plan is not None:
        budget = conv_plan_fits(g, plan, c, ep)
        if isinstance(budget, str):
            raise CompileError(f"{where}: the tiling {plan.describe(c)} does not fit: {budget}",
                               op=op.name)
        candidates: Iterable[ConvPlan] = [plan]
    else:
        def ranked() -> Iterator[ConvPlan]:
            yield from plan_conv_tiles(g, c, ep, threads, top=PLAN_FALLBACKS)
            if threads > 1:
                # Last resorts on small uop buffers: one thread needs half the kernels.
                yield from plan_conv_tiles(g, c, ep, 1, top=PLAN_FALLBACKS // 2)
        candidates = ranked()
    wpacked, _ = pack_conv_weights(conv.weight, conv.groups, c)
    em.begin_op(op.name)
    param_base, param_starts, bias_loads = emit_param_prologue(em, op.name, ep, g.OB)
    wseg = em.add_segment(f"{op.name}.w", wpacked)
    w_elem = em.elem(Place(wseg), MemType.WGT)
    in_elem = em.elem(inp.place, MemType.INP)
    out_elem = em.elem(out.place, MemType.OUT)
    res_elem = {k: em.elem(v.place, MemType.ACC8) for k, v in residuals.items()}
    out_l = out.layout
    in_l = inp.layout
    hazard = timing.gemm_hazard_distance()
    bias_wgt = c.wgt_depth - g.OB
    const_row = c.inp_depth - 1

    steps_of_plan: list[Step] = []
    acc_origin = [0]

    def body(plan: ConvPlan, budget: Budget) -> None:
        origin, first = em.acc_origin(budget.acc_slot, plan.threads, param_base)
        steps = schedule(g, plan, first)
        steps_of_plan[:] = steps
        acc_origin[0] = origin

        def loads(s: Step) -> list:
            out_ = []
            t, it = s.tile, s.intile
            if s.load_inp:
                y0, y1, x0, x1 = it.pads
                rows = it.rows - y0 - y1
                cols = it.cols - x0 - x1
                yf = it.iy0 + y0 * g.row_step
                xf = it.ix0 + x0
                plane = it.rows * it.cols
                planes = [(((nb - it.nb0) * (it.c1 - it.c0) + (cb - it.c0)) * plane,
                           in_l.entry(nb, cb, max(yf, 0), max(xf, 0)))
                          for nb in range(it.nb0, it.nb1) for cb in range(it.c0, it.c1)]
                if rows <= 0 or cols <= 0:
                    # The tile sees only padding (e.g. a padded 1x1 kernel at the border): the DMA
                    # writes zeros only, as y padding of an empty read.
                    if it.rows > em.max_dma["y_pad_0"]:
                        raise CompileError(
                            f"{where}: an input tile of {it.rows} rows lies entirely in the "
                            f"padding {conv.padding}, more than the DMA's "
                            f"{em.max_dma['y_pad_0']} rows of zero fill; use smaller padding",
                            op=op.name)
                    out_ += [Load(mem=MemType.INP, sram_base=s.inp_slot * budget.inp_slot + so,
                                  dram_base=in_elem + do, y_size=0, x_size=it.cols,
                                  x_stride=it.cols, y_pad_0=it.rows) for so, do in planes]
                else:
                    out_ += plane_dmas(Load, mem=MemType.INP,
                                       sram_base=s.inp_slot * budget.inp_slot,
                                       dram_base=in_elem, planes=planes, rows=rows, cols=cols,
                                       row_stride=g.w * g.row_step, pads=it.pads,
                                       max_fields=em.max_dma)
            if s.load_wgt:
                ob_n, j_n = t.ob1 - t.ob0, s.j1 - s.j0
                out_.append(Load(mem=MemType.WGT, sram_base=s.wgt_slot * budget.wgt_slot,
                                 dram_base=w_elem + (t.ob0 * g.J + s.j0) * g.khkw, y_size=ob_n,
                                 x_size=j_n * g.khkw, x_stride=g.J * g.khkw))
            return out_

        def compute(s: Step) -> list:
            t, it = s.tile, s.intile
            nb_n, ob_n = t.nb1 - t.nb0, t.ob1 - t.ob0
            oh_n, ow_n = t.oy1 - t.oy0, t.ox1 - t.ox0
            px = oh_n * ow_n
            rows = t.rows
            R = tile_replicas(c, g, nb_n, ob_n, px)
            acc_base = acc_origin[0] + s.acc_slot * budget.acc_slot
            scratch = acc_base + R * rows
            res: list = []
            if s.first:
                nest = map_nest([dim("rows", R * rows, dst=1)], (acc_base, 0, 0), kind="gemm",
                                isa=isa, distance=hazard, where=where)
                b, e = em.kernel(nest.uops)
                res.append(Gemm(reset=True, uop_begin=b, uop_end=e, **nest.fields("gemm")))
            # The step's GEMM.
            plane = it.rows * it.cols
            cbn = it.c1 - it.c0
            j_n = s.j1 - s.j0
            dims: list[Dim] = [dim("nb", nb_n, dst=ob_n * px, src=cbn * plane),
                               dim("oy", oh_n, dst=ow_n, src=(g.sy // g.row_step) * it.cols),
                               dim("ox", ow_n, dst=1, src=g.sx),
                               dim("ky", g.kh, src=g.dy * it.cols, wgt=g.kw),
                               dim("kx", g.kw, src=g.dx, wgt=1)]
            pairs = [(ob, j) for ob in range(ob_n) for j in range(j_n)
                     if it.c0 <= g.gb.cb_lo[t.ob0 + ob] + s.j0 + j < it.c1]
            src0 = s.inp_slot * budget.inp_slot
            if R > 1:
                # Fewer rows than the GEMM's hazard distance: the terms of each output block
                # cycle over R replica rows, and blocks interleave, so a (row, replica) pair
                # recurs only every ob_n * R terms.
                per_ob = [[(ob, j, ky, kx) for (o_, j) in pairs if o_ == ob
                           for ky in range(g.kh) for kx in range(g.kw)] for ob in range(ob_n)]
                terms = [(q[i], i % R) for i in range(max(map(len, per_ob)))
                         for q in per_ob if i < len(q)]
                dims = dims[:3] + [explicit_dim(
                    "term",
                    [ob * px + rep * rows for (ob, j, ky, kx), rep in terms],
                    [(g.gb.cb_lo[t.ob0 + ob] + s.j0 + j - it.c0) * plane + ky * g.dy * it.cols
                     + kx * g.dx for (ob, j, ky, kx), _ in terms],
                    [((ob * j_n + j) * g.kh + ky) * g.kw + kx for (ob, j, ky, kx), _ in terms])]
            elif len(pairs) == ob_n * j_n and g.gb.slope is not None:
                dims += [dim("ob", ob_n, dst=px, src=g.gb.slope * plane, wgt=j_n * g.khkw),
                         dim("j", j_n, src=plane, wgt=g.khkw)]
                src0 += (g.gb.cb_lo[t.ob0] + s.j0 - it.c0) * plane
            else:
                # Ragged or irregular block pairs: interleave output blocks so consecutive
                # operations write different rows.
                pairs = sorted(pairs, key=lambda p_: (p_[1], p_[0]))
                dims += [explicit_dim("obj", [ob * px for ob, j in pairs],
                                      [(g.gb.cb_lo[t.ob0 + ob] + s.j0 + j - it.c0) * plane
                                       for ob, j in pairs],
                                      [(ob * j_n + j) * g.khkw for ob, j in pairs])]
            if pairs:
                nest = map_nest(dims, (acc_base, src0, s.wgt_slot * budget.wgt_slot), kind="gemm",
                                isa=isa, distance=hazard, max_uops=c.uop_depth, where=where)
                b, e = em.kernel(nest.uops)
                res.append(Gemm(uop_begin=b, uop_end=e, **nest.fields("gemm")))
            if s.last:
                # The bias is added last (addition commutes): its loads never delay the first GEMM.
                if ep.gemm_bias is not None:
                    nest = map_nest([dim("nb", nb_n, dst=ob_n * px), dim("ob", ob_n, dst=px, wgt=1),
                                     dim("pix", px, dst=1)],
                                    (acc_base, const_row, bias_wgt + t.ob0),
                                    kind="gemm", isa=isa, distance=hazard, where=where)
                    b, e = em.kernel(nest.uops)
                    res.append(Gemm(uop_begin=b, uop_end=e, **nest.fields("gemm")))
                add = ALU_OPS.by_name("ADD")
                for r in range(1, R):
                    nest = map_nest([dim("rows", rows, dst=1, src=1)],
                                    (acc_base, acc_base + r * rows, 0),
                                    kind="alu", isa=isa, distance=add.timing.hazard_distance(False),
                                    src_is_acc_read=True, where=where)
                    b, e = em.kernel(nest.uops)
                    res.append(Alu(alu_op=add.opcode, uop_begin=b, uop_end=e, **nest.fields("alu")))

                # The last tile's epilogue and store go in plane groups: each group's store
                # overlaps the next group's epilogue, so little of the final store is exposed.
                is_last = s is steps[-1]
                for nb, oa, ob_ in epilogue_chunks(t, LAST_TILE_CHUNKS if is_last else 1):
                    chunk_base = acc_base + ((0 if nb is None else nb - t.nb0) * ob_n
                                             + (oa - t.ob0)) * px
                    chunk_nb = t.nb1 - t.nb0 if nb is None else 1
                    nbs = range(t.nb0, t.nb1) if nb is None else range(nb, nb + 1)

                    def residual_loads(name: str, base: int, nbs=nbs, oa=oa, ob_=ob_) -> list:
                        rl = ActLayout.of(out_l.shape, c, c.block_out)
                        planes = [(((n - nbs[0]) * (ob_ - oa) + (o - oa)) * px,
                                   rl.entry(n, o, t.oy0, t.ox0)) for n in nbs
                                  for o in range(oa, ob_)]
                        return plane_dmas(Load, mem=MemType.ACC8, sram_base=base,
                                          dram_base=res_elem[name], planes=planes, rows=oh_n,
                                          cols=ow_n, row_stride=g.ow, max_fields=em.max_dma)

                    sub: list = []
                    em_insns, em.insns = em.insns, sub
                    emit_epilogue(em, ep, acc_base=chunk_base, nb_n=chunk_nb, ob_n=ob_ - oa,
                                  pixels=px, ob0=oa, param_base=param_base,
                                  param_starts=param_starts,
                                  scratch_base=scratch + (chunk_base - acc_base),
                                  residual_loads=residual_loads, where=where)
                    em.insns = em_insns
                    res += sub
                    planes = [(((n - t.nb0) * ob_n + (o - t.ob0)) * px,
                               out_l.entry(n, o, t.oy0, t.ox0)) for n in nbs
                              for o in range(oa, ob_)]
                    res += plane_dmas(Store, mem=MemType.OUT, sram_base=acc_base,
                                      dram_base=out_elem, planes=planes, rows=oh_n, cols=ow_n,
                                      row_stride=g.ow, max_fields=em.max_dma)
            return res

        # Program order: the loads of step s+1 go before the compute of step s when they fill
        # other slots than step s reads, so fetch reaches them early (prefetch).
        em.emit(*loads(steps[0]), *bias_loads)
        for k, s in enumerate(steps):
            nxt = steps[k + 1] if k + 1 < len(steps) else None
            hoist = nxt is not None and plan.threads > 1 and \
                not (nxt.load_inp and nxt.inp_slot == s.inp_slot) and \
                not (nxt.load_wgt and nxt.wgt_slot == s.wgt_slot)
            if hoist:
                em.emit(*loads(nxt))
            em.emit(*compute(s))
            if nxt is not None and not hoist:
                em.emit(*loads(nxt))

    # The uop kernels of a tiling are only known once its nests are mapped: a tiling whose
    # kernels overflow the uop buffer gives way to the next best (nothing is kept of it).
    error = None
    for plan in candidates:
        cp = em.checkpoint()
        try:
            budget = conv_plan_fits(g, plan, c, ep)
            body(plan, budget)  # type: ignore[arg-type]
            if em.uop_count > c.uop_depth:
                raise CompileError(f"{where}: the tiling {plan.describe(c)} needs "
                                   f"{em.uop_count} uops but the uop buffer has {c.uop_depth}",
                                   op=op.name)
            last = steps_of_plan[-1]
            base = acc_origin[0] + last.acc_slot * budget.acc_slot
            em.last_acc_rows = (base, base + budget.acc_slot)
            break
        except CompileError as exc:
            em.rollback(cp)
            error = error or exc
    else:
        raise error  # type: ignore[misc]
    em.end_op()
    return plan

