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

Virtual threads. With ``threads = 2`` the input and weight buffers have at
least two slots used in turn: the loads of step s+1 and the store of tile k-1
overlap the GEMMs of step s. Data already resident in a slot (weights across
spatial tiles, inputs across output-channel tiles) is not loaded again; when
more slots fit than two (:func:`buffer_slots`, up to the number of distinct
tiles) loads run further ahead and more data stays resident. The token pass
orders whatever this produces.

Per tile: an *init* on the ALU (MOV of the bias from a per-channel parameter
row, or a reset), the GEMMs, then the *epilogue* (ALU steps) and the stores.
With two threads the compute stream is software-pipelined over the compute
module's two units (``ConvPlan.pipelined``): while the GEMM unit runs tile k,
the ALU unit runs the epilogue of tile k-1 and the init of tile k+1
(``overlap`` instructions). Consecutive tiles alternate accumulator banks, and
each bank holds two *regions* (tile k in region k % 4), so the init of tile
k+1 never writes rows the store of tile k-1 still reads; the parameter rows are
copied into both banks (an ALU instruction stays inside one bank). When a tile
has fewer accumulator rows than the GEMM's hazard distance (e.g. a one-row
dense layer), the reduction alternates between ``R`` replica rows that an ALU
ADD sums at the start of the epilogue.

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

from .acctile import reset_insn
from .emit import Emitter, Place, dma_cycles, plane_dmas
from .epilogue import EpiloguePlan, EpStep, plan_epilogue
from tessera.errors import CompileError
from .layout import ActLayout, GroupBlocks, ceil_div, pack_conv_weights
from .nest import Dim, dim, explicit_dim, map_nest
from .ops import Conv2d, Dense

#: Cap on candidate tilings simulated by the step model (the rest are pruned analytically).
MAX_SIMULATED_PLANS = 60
#: Ranked tilings tensorize tries when a better one's uop kernels overflow the uop buffer.
PLAN_FALLBACKS = 8
#: Plane groups of the last tile's epilogue and store (see tensorize_conv2d).
LAST_TILE_CHUNKS = 8
#: Accumulator regions of a pipelined plan: two per bank (tile k in region k % 4).
PIPELINE_REGIONS = 4
#: Most input or weight slots a two-thread plan uses (see buffer_slots).
MAX_SLOTS = 8


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
    innermost: weights stay resident). ``pipeline`` (with two threads): the
    epilogue of tile k-1 and the init of tile k+1 run on the ALU unit beside
    the GEMMs of tile k, in four accumulator regions (see the module doc);
    otherwise each tile's init, GEMMs and epilogue run one after the other in
    ``threads`` slots.
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
    pipeline: bool = True

    @property
    def pipelined(self) -> bool:
        return self.pipeline and self.threads > 1

    @property
    def regions(self) -> int:
        """Accumulator slots the tiles rotate through."""
        return PIPELINE_REGIONS if self.pipelined else self.threads

    def describe(self, config: HwConfig) -> str:
        return (f"{self.ob_t * config.block_out}ch x {self.oh_t}x{self.ow_t}px tiles, "
                f"{self.j_t} input block(s) per step, {self.threads} thread(s), "
                f"{self.order}-outer"
                + (f", first/last tiles halved {self.ramp}x" if self.ramp else "")
                + (", epilogue beside the GEMMs" if self.pipelined else ""))


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


def schedule(g: ConvGeom, p: ConvPlan, acc_first: int = 0,
             slots: tuple[int, int] | None = None) -> list[Step]:
    """The steps of plan ``p`` in program order, with slot assignment and reuse
    (``slots``: input and weight slots, default ``p.threads`` each, used in turn;
    accumulator slots, ``p.regions`` of them, rotate from ``acc_first``)."""
    steps: list[Step] = []
    n_inp, n_wgt = slots or (p.threads, p.threads)
    res_inp: list[tuple | None] = [None] * n_inp
    res_wgt: list[tuple | None] = [None] * n_wgt
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
                nxt_inp = (nxt_inp + 1) % n_inp
            wkey = (t.ob0, t.ob1, j0, j1)
            if wkey in res_wgt:
                wslot, lw = res_wgt.index(wkey), False
            else:
                wslot, lw = nxt_wgt, True
                res_wgt[wslot] = wkey
                nxt_wgt = (nxt_wgt + 1) % n_wgt
            steps.append(Step(ti, t, j0, j1, ci == 0, ci == len(chunks) - 1, it, islot, wslot,
                              (ti + acc_first) % p.regions, li, lw))
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
    inp_slots: int = 1
    wgt_slots: int = 1


@lru_cache(maxsize=1 << 14)
def buffer_slots(g: ConvGeom, p: ConvPlan, config: HwConfig) -> tuple[int, int]:
    """Input and weight slots of a plan: ``threads``, or with two threads as many as fit
    the buffer, up to the distinct tiles the plan loads (then every tile is loaded once)
    and :data:`MAX_SLOTS` (token queues of at least twice that depth), unless the uop
    kernels of more slots (one per slot combination) would not fit the uop buffer."""
    T = p.threads
    if T == 1:
        return 1, 1
    inp_slot, wgt_slot = max_input_entries(g, p), p.ob_t * p.j_t * g.khkw
    n_obt, n_j = ceil_div(g.OB, p.ob_t), ceil_div(g.J, p.j_t)
    n_sp = ceil_div(g.NB, p.nb_t) * ceil_div(g.oh, p.oh_t) * ceil_div(g.ow, p.ow_t)
    extra = (2 << p.ramp) * n_j if p.ramp else 0     # the halved end tiles' own tiles
    n_in = (n_sp if g.gb.slope == 0 else n_sp * n_obt) * n_j + extra
    n_w = n_obt * n_j + extra
    cap = min(MAX_SLOTS, config.token_queue_depth // 2)
    slots = (max(T, min(cap, n_in, config.inp_depth // max(1, inp_slot))),
             max(T, min(cap, n_w, config.wgt_depth // max(1, wgt_slot))))
    if slots != (T, T) and estimate_uops(g, p, config, slots) > config.uop_depth:
        return T, T
    return slots


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


def estimate_uops(g: ConvGeom, p: ConvPlan, config: HwConfig,
                  slots: tuple[int, int] | None = None) -> int:
    """Uops a plan's kernels take (analytic): a main GEMM kernel per distinct step shape and
    slot combination (the input tile's row pitch and plane size enter its source offsets),
    with one uop per kernel term (the output pixels are the hardware loops), or per term and
    pixel when a tile has fewer rows than the GEMM hazard distance; the few-uop init and
    epilogue kernels per shape and region."""
    def sizes(total, size):
        return {min(size, total), total - (ceil_div(total, size) - 1) * size}
    n_in, n_w = slots or buffer_slots(g, p, config)
    combos = min(n_in * n_w * p.regions, ceil_div(g.NB, p.nb_t) * ceil_div(g.OB, p.ob_t)
                 * ceil_div(g.oh, p.oh_t) * ceil_div(g.ow, p.ow_t) * ceil_div(g.J, p.j_t))
    total = 0
    shapes = tile_shapes(g, p)
    for a, b, c, d in shapes:
        rows = a * b * c * d
        per_term = c * d * a if rows < timing.gemm_hazard_distance() else 1
        for j in sizes(g.J, p.j_t):
            total += combos * b * j * g.khkw * per_term
    return total + len(shapes) * p.regions * 8


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
    params = ep.param_rows(g.OB)
    if p.pipelined:
        acc = p.regions * acc_slot + 2 * params   # the parameter rows in both banks
    else:
        acc = p.threads * acc_slot + params
    inp = p.threads * inp_slot
    wgt = p.threads * wgt_slot
    if inp > config.inp_depth:
        return (f"the input tile needs {inp_slot} entries per thread ({inp} with {p.threads} "
                f"thread(s)) but the input buffer has {config.inp_depth}")
    if wgt > config.wgt_depth:
        return (f"the weight tile of {p.ob_t} output block(s) x {p.j_t} input block(s) x "
                f"{g.khkw} taps needs {wgt_slot} entries per thread ({wgt} in all) but the "
                f"weight buffer has {config.wgt_depth}")
    n_in, n_w = buffer_slots(g, p, config)
    if p.pipelined and 2 * acc_slot + params > config.acc_bank_rows:
        return (f"the accumulator tile needs {acc_slot} rows per region; two regions and "
                f"{params} parameter rows per bank ({2 * acc_slot + params}) exceed a bank's "
                f"{config.acc_bank_rows} rows")
    if acc > config.acc_depth:
        return (f"the accumulator tile needs {acc_slot} rows per thread plus "
                f"{params} parameter rows ({acc} in all) but the accumulator "
                f"has {config.acc_depth}")
    uops = estimate_uops(g, p, config)
    if uops > config.uop_depth:
        return (f"its uop kernels need about {uops} uops but the uop buffer has "
                f"{config.uop_depth}")
    pad_max = get_isa(config).layouts[0].field("y_pad_0").hi
    if max(g.pt, g.pl, g.pb, g.pr) > pad_max:
        return f"padding {max(g.pt, g.pl, g.pb, g.pr)} exceeds the load DMA's {pad_max}"
    return Budget(inp_slot, wgt_slot, acc_slot, max(inp, n_in * inp_slot),
                  max(wgt, n_w * wgt_slot), acc, n_in, n_w)


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


def interleave(gemm: list[int], side: list[int]) -> list[tuple[int, int]]:
    """Stream order of one tile's GEMM steps (cycles ``gemm``) and the ALU-unit
    instructions that run beside them (cycles ``side``: the previous tile's epilogue, the
    next tile's init), as ``(0, j)`` / ``(1, i)``.

    The first GEMM leads (it waits for both units); the rest follow by predicted start,
    each unit busy back to back from then (ties go to the ALU). Compute instructions start
    in program order, so an order close to the real start times keeps either unit from
    waiting behind an instruction of the other.
    """
    order: list[tuple[int, int]] = []
    j = i = 0
    tg = ta = 0
    if gemm:
        order.append((0, 0))
        tg, ta, j = gemm[0], 1, 1
    while j < len(gemm) or i < len(side):
        if i < len(side) and (j >= len(gemm) or ta <= tg):
            order.append((1, i))
            ta += side[i]
            i += 1
        else:
            order.append((0, j))
            tg += gemm[j]
            j += 1
    return order


@lru_cache(maxsize=4096)
def _reset_cycles(rows: int) -> int:
    return timing.alu_cycles(Alu(reset=True, uop_begin=0, uop_end=1, iter_out=rows))


class ConvCostModel:
    """The pipeline model of one convolution's tilings (memoised per shape).

    :meth:`estimate` follows the instruction stream :func:`tensorize_conv2d`
    emits: the load of step s starts when the load module is free and the slot
    it fills was last read by a finished GEMM; each compute instruction (a
    step's GEMM, a tile's init and epilogue instructions) starts in stream
    order when its data is loaded, fetch has dispatched it and its unit (both
    units, unless it runs beside the other) is free; the init of a region
    waits for the store that last read it; stores follow each tile's
    epilogue. Durations come from :mod:`tessera.timing`.
    """

    def __init__(self, g: ConvGeom, config: HwConfig, ep: EpiloguePlan) -> None:
        self.g, self.config, self.ep = g, config, ep
        self.per_insn = fetch_cycles_per_insn(config)
        self._step: dict[tuple, tuple] = {}
        self._tile: dict[tuple, tuple] = {}
        self._side: dict[tuple, tuple] = {}
        self.epi = [(s.op, s.imm is not None) for s in ep.steps if s.kind == "alu"]

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
            hit = (it.key, icyc, planes, (t.ob0, t.ob1, j0, j1), wcyc,
                   _gemm_cycles(ops) if ops else 0, ops)
            self._step[key] = hit
        return hit

    def side_costs(self, nb_n: int, ob_n: int, px: int, r: int) -> tuple:
        """``(init, epilogue)``: the cycles of a tile's init instructions and of its
        epilogue's (``(cycles, takes both units)`` each) over ``nb_n x ob_n x px`` rows."""
        key = (nb_n, ob_n, px, r)
        hit = self._side.get(key)
        if hit is None:
            ep, rows = self.ep, nb_n * ob_n * px
            if ep.init is not None:
                init = [_alu_cycles("MOV", ep.init.imm is not None, rows)]
                if r > 1:
                    init.append(_reset_cycles((r - 1) * rows))
            else:
                init = [_reset_cycles(r * rows)]
            epi = [(_alu_cycles("ADD", False, rows), False)] * (r - 1)
            for _ in ep.residuals:
                epi.append((nb_n * _load_cycles(self.config, MemType.ACC8, 1, rows // nb_n,
                                                rows, (0, 0, 0, 0)), True))
                epi.append((_alu_cycles("ADD", False, rows), False))
            epi += [(_alu_cycles(op, imm, rows), False) for op, imm in self.epi]
            hit = (tuple(init), tuple(epi))
            self._side[key] = hit
        return hit

    def _store(self, t: Tile, nb_n: int, ob_n: int) -> float:
        g, config = self.g, self.config
        if t.ox1 - t.ox0 == g.ow:
            return nb_n * _store_cycles(config, ob_n, t.pixels, g.oh * g.ow)
        return nb_n * ob_n * _store_cycles(config, t.oy1 - t.oy0, t.ox1 - t.ox0, g.ow)

    def tile_costs(self, t: Tile, last: bool) -> tuple:
        """``(init, [(epilogue, store) per plane group], instructions)`` of a tile (the
        last one stores in plane groups)."""
        key = (t.nb0, t.nb1, t.ob0, t.ob1, t.oy0, t.oy1, t.ox0, t.ox1, last)
        hit = self._tile.get(key)
        if hit is None:
            g, config = self.g, self.config
            nb_n, ob_n, px = t.nb1 - t.nb0, t.ob1 - t.ob0, t.pixels
            r = tile_replicas(config, g, nb_n, ob_n, px)
            init, _ = self.side_costs(nb_n, ob_n, px, r)
            groups = []
            for k, (nb, oa, ob_) in enumerate(epilogue_chunks(t, LAST_TILE_CHUNKS if last
                                                              else 1)):
                cnb = nb_n if nb is None else 1
                _, epi = self.side_costs(cnb, ob_ - oa, px, r if k == 0 else 1)
                groups.append((epi, self._store(t, cnb, ob_ - oa)))
            insns = len(init) + sum(len(e) + 1 for e, _ in groups)
            hit = (init, groups, insns)
            self._tile[key] = hit
        return hit

    def estimate(self, p: ConvPlan, bound: float = math.inf) -> float:
        """Cycle estimate of plan ``p``; ``inf`` once it exceeds ``bound`` (pruning)."""
        g = self.g
        pipelined = p.pipelined
        regions = p.regions
        per_insn = self.per_insn
        chunks = [(a, min(g.J, a + p.j_t)) for a in range(0, g.J, p.j_t)]
        TI, TW = buffer_slots(g, p, self.config)
        res_inp: list = [None] * TI
        res_wgt: list = [None] * TW
        nxt_i = nxt_w = 0
        load_end = store_end = fetched = 0.0
        free = [0.0, 0.0]          # GEMM unit, ALU unit
        last_start = [-1.0]
        left = total_gemm_ops(g)  # GEMM work not yet issued: a lower bound on what remains
        read_inp = [0.0] * TI
        read_wgt = [0.0] * TW
        acc_free = [0.0] * regions
        tiles = tiles_of(g, p)
        n_tiles = len(tiles)

        def issue(unit: int, cycles: float, overlap: bool, ready: float,
                  both: bool = False) -> float:
            start = max(ready, last_start[0] + 1,
                        free[unit] if overlap else max(free[0], free[1]))
            last_start[0] = start
            end = start + cycles
            free[unit] = end
            if both:
                free[0] = free[1] = end
            return end

        def init(ti: int, overlap: bool) -> None:
            nonlocal fetched
            costs = self.tile_costs(tiles[ti], ti == n_tiles - 1)[0]
            for c in costs:
                fetched += per_insn
                issue(1, c, overlap, max(fetched, acc_free[ti % regions]))

        def epilogue(ti: int, overlap: bool) -> None:
            """The epilogue and stores of tile ``ti`` (the first instruction with ``overlap``
            as given, the rest beside the GEMM unit when pipelined)."""
            nonlocal fetched, store_end
            groups = self.tile_costs(tiles[ti], ti == n_tiles - 1)[1]
            first = True
            end = free[1]
            for epi, store in groups:
                for c, both in epi:
                    fetched += per_insn
                    end = issue(1, c, overlap and not both if first else pipelined and not both,
                                fetched, both)
                    first = False
                fetched += per_insn
                store_end = max(store_end, end) + store
            acc_free[ti % regions] = store_end

        if pipelined:
            init(0, True)
        for ti, t in enumerate(tiles):
            if not pipelined:
                init(ti, False)
            # the tile's steps: loads (in step order) and GEMM cycles
            steps = []
            for ci, (j0, j1) in enumerate(chunks):
                steps.append(self.step_costs(t, j0, j1))
            gcycs = [st[5] for st in steps]
            side: list[tuple[str, int]] = []
            if pipelined:
                if ti > 0:
                    side.append(("epi", ti - 1))
                if ti + 1 < n_tiles:
                    side.append(("init", ti + 1))
            side_cycles = []
            for kind, k in side:
                if kind == "epi":
                    side_cycles.append(sum(c for e, _ in self.tile_costs(tiles[k], False)[1]
                                           for c, _ in e))
                else:
                    side_cycles.append(sum(self.tile_costs(tiles[k], False)[0]))
            first_gemm = True
            for kind, j in interleave(gcycs, side_cycles):
                if kind == 1:
                    what, k = side[j]
                    if what == "epi":
                        epilogue(k, True)
                    else:
                        init(k, True)
                    continue
                ikey, icyc, iplanes, wkey, wcyc, gcyc, ops = steps[j]
                left -= ops
                n_insn = 1
                start = load_end
                loaded = False
                if ikey in res_inp:
                    islot = res_inp.index(ikey)
                else:
                    islot = nxt_i
                    res_inp[islot] = ikey
                    nxt_i = (nxt_i + 1) % TI
                    start = max(start, read_inp[islot])
                    n_insn += iplanes
                    loaded = True
                lc = icyc if loaded else 0
                if wkey in res_wgt:
                    wslot = res_wgt.index(wkey)
                else:
                    wslot = nxt_w
                    res_wgt[wslot] = wkey
                    nxt_w = (nxt_w + 1) % TW
                    start = max(start, read_wgt[wslot])
                    n_insn += 1
                    lc += wcyc
                    loaded = True
                if loaded:
                    load_end = start + lc
                fetched += n_insn * per_insn
                if not gcyc:
                    continue
                ready = max(fetched, load_end if loaded else 0.0)
                end = issue(0, gcyc, not first_gemm and pipelined, ready)
                first_gemm = False
                read_inp[islot] = end
                read_wgt[wslot] = end
                if end + left > bound:
                    return math.inf
            if not pipelined or ti == n_tiles - 1:
                epilogue(ti, False)
        return max(free[0], free[1], store_end)


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
    store`` with one; compute is the GEMM and ALU work one after the other, or
    when pipelined the larger of the two plus one tile of the smaller (the
    first tile's GEMMs and the last one's epilogue run alone). Load counts
    follow the reuse rules of :func:`schedule` (a weight or input tile stays
    resident while it fits the slots). Returns the estimate (without halved
    end tiles) and its fill + tail part.
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
    reps = tile_replicas(config, g, p.nb_t, p.ob_t, p.oh_t * p.ow_t)
    epi += (_alu_cycles("MOV", ep.init.imm is not None, tile_rows) if ep.init is not None
            else _reset_cycles(tile_rows * reps))
    # Edge tiles are smaller than tile_rows: charging every tile the full epilogue slightly
    # overestimates, equally for similar tilings.
    gemm = total_gemm_ops(g) + steps * drain
    exposed = 0.0
    if p.pipelined:
        exposed = min(gemm, n_tiles * epi) / n_tiles
        compute = max(gemm, n_tiles * epi) + exposed
    else:
        compute = gemm + n_tiles * epi
    it = input_tile(g, Tile(0, p.nb_t, 0, p.ob_t, 0, min(p.oh_t, g.oh), 0, min(p.ow_t, g.ow)),
                    0, min(g.J, p.j_t))
    l_in = (it.c1 - it.c0) * (it.nb1 - it.nb0) * _load_cycles(
        config, MemType.INP, it.rows - it.pads[0] - it.pads[1], it.cols - it.pads[2] - it.pads[3],
        g.w * g.row_step, it.pads)
    l_w = _load_cycles(config, MemType.WGT, min(p.ob_t, g.OB), min(g.J, p.j_t) * g.khkw,
                       g.J * g.khkw, (0, 0, 0, 0))
    TI, TW = buffer_slots(g, p, config)
    # Loads in all, and in the first pass over the outer loop (resident data is loaded
    # then, so that phase may be load-bound while the rest is not).
    if p.order == "channel":
        outer = n_obt
        w_res, i_res = n_j <= TW, n_sp * n_j <= TI and g.gb.slope == 0
        w_loads, w_first = (n_obt * n_j, n_j) if w_res else (steps, steps / outer)
        i_loads, i_first = (n_sp * n_j, n_sp * n_j) if i_res else (steps, steps / outer)
    else:
        outer = n_sp
        i_res, w_res = n_j <= TI and g.gb.slope == 0, n_obt * n_j <= TW
        i_loads, i_first = (n_sp * n_j, n_j) if i_res else (steps, steps / outer)
        w_loads, w_first = (n_obt * n_j, n_obt * n_j) if w_res else (steps, steps / outer)
    load = i_loads * l_in + w_loads * l_w
    first = i_first * l_in + w_first * l_w
    store = _store_cycles(config, 1, tile_rows, tile_rows)
    if T == 1:
        return compute + load + n_tiles * store, 0.0
    fill_tail = l_in + l_w + store + exposed
    body = compute - exposed
    return (max(body / outer, first) + max(body - body / outer, load - first) + fill_tail,
            fill_tail)


_PLAN_CACHE: dict[tuple, list[ConvPlan]] = {}
_PLAN_CACHE_SIZE = 256


def _epilogue_shape(ep: EpiloguePlan) -> tuple:
    """What of an epilogue plan the tiling depends on: its steps' kinds, ops and operand
    forms and its parameter rows, not the values (layers differing only in weights, biases
    and scales tile alike)."""
    def step(st: EpStep | None) -> tuple | None:
        return None if st is None else (st.kind, st.op, st.imm is None, st.param)
    return (tuple(step(st) for st in ep.steps), step(ep.init),
            tuple(p.size > 1 for p in ep.params))


def cached_conv_plans(g: ConvGeom, config: HwConfig, ep: EpiloguePlan, threads: int,
                      top: int, pipeline: bool) -> list[ConvPlan]:
    """:func:`plan_conv_tiles`, remembered per geometry and epilogue shape: a network
    repeats layer shapes (ResNet-18 has four 56x56 3x3 convolutions), and the tiling search
    is most of a layer's compile time."""
    key = (replace(g, name=""), config, _epilogue_shape(ep), threads, top, pipeline)
    if key not in _PLAN_CACHE:
        if len(_PLAN_CACHE) >= _PLAN_CACHE_SIZE:
            _PLAN_CACHE.pop(next(iter(_PLAN_CACHE)))
        _PLAN_CACHE[key] = plan_conv_tiles(g, config, ep, threads, top, pipeline)
    return list(_PLAN_CACHE[key])


def plan_conv_tiles(g: ConvGeom, config: HwConfig, ep: EpiloguePlan, threads: int = 2,
                    top: int = 1, pipeline: bool = True) -> list[ConvPlan]:
    """Legal tilings of ``g`` ranked by :func:`estimate_conv_cycles` (best ``top`` returned).

    Legality is analytic (:func:`conv_plan_fits`). The legal tilings are
    pre-ranked by :func:`quick_estimate`; the best few, each with 0-2 halvings
    of the end tiles, are costed by the pipeline model. With two threads the
    tilings are pipelined (``ConvPlan.pipeline``) when any fits the four
    accumulator regions, else not. Raises :class:`CompileError` naming the
    buffer that overflows when no tiling fits.
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
                        p = ConvPlan(nb_t, ob_t, oh_t, ow_t, j_t, threads, "channel",
                                     pipeline=pipeline)
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
        if threads > 1 and pipeline:
            # Four regions do not fit: the epilogue runs after the GEMMs, in two slots.
            return plan_conv_tiles(g, config, ep, threads, top, pipeline=False)
        smallest = conv_plan_fits(g, ConvPlan(1, 1, 1, 1, 1, threads, pipeline=False), config,
                                  ep)
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
    # tail), costed in that order by the pipeline model, which stops early once the GEMM
    # work left cannot fit under the best estimate so far. The halving levels take turns
    # (a halving also costs reloads the closed form does not see), so each gets its best
    # few costed.
    model = ConvCostModel(g, config, ep)
    levels: list[list[tuple[float, ConvPlan]]] = [[] for _ in range(3)]
    for p in plans:
        q, fill_tail = quick_estimate(g, p, config, ep)
        levels[0].append((q, p))
        if threads > 1:
            for r in (1, 2):
                v = replace(p, ramp=r)
                if not isinstance(conv_plan_fits(g, v, config, ep), str):
                    levels[r].append((q - fill_tail * (1 - 0.5 ** r), v))
    for lv in levels:
        lv.sort(key=lambda t: t[0])
    ranked: list[ConvPlan] = []
    best = math.inf
    done = [0, 0, 0]
    for _ in range(MAX_SIMULATED_PLANS):
        open_ = [r for r in range(3) if done[r] < len(levels[r])
                 and levels[r][done[r]][0] <= best * 1.05]
        if not open_:
            break
        r = min(open_, key=lambda r: (done[r], levels[r][done[r]][0]))
        q, v = levels[r][done[r]]
        done[r] += 1
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


def emit_param_prologue(em: Emitter, op_name: str, ep: EpiloguePlan, ob_count: int,
                        banked: bool = False) -> tuple[list[int], list[int]]:
    """Load the epilogue's parameter rows into the top of the accumulator (a compute-module
    LOAD, emitted here); with ``banked`` into the top of each bank (an ALU instruction that
    runs beside the GEMM unit reads its operands from its own bank): the second copy is an
    ALU MOV of the first (one row per cycle, far faster than a second DRAM read).

    Returns the first parameter row of each copy and each vector's row offset.
    """
    c = em.config
    data, starts = param_rows_data(ep, ob_count, c)
    n = data.shape[0]
    tops = [(b + 1) * c.acc_bank_rows for b in range(2)] if banked else [c.acc_depth]
    bases = [top - n for top in tops]
    if n:
        seg = em.add_segment(f"{op_name}.params", data)
        em.emit(Load(mem=MemType.ACC, sram_base=bases[0],
                     dram_base=em.elem(Place(seg), MemType.ACC), y_size=1, x_size=n,
                     x_stride=n))
        mov = ALU_OPS.by_name("MOV")
        for base in bases[1:]:
            nest = map_nest([dim("rows", n, dst=1, src=1)], (base, bases[0], 0), kind="alu",
                            isa=em.isa, distance=mov.timing.hazard_distance(False),
                            src_is_acc_read=True, where=f"{op_name!r} parameters")
            b, e = em.kernel(nest.uops)
            em.emit(Alu(alu_op=mov.opcode, uop_begin=b, uop_end=e, **nest.fields("alu")))
    return bases, starts


def tile_alu(em: Emitter, ep: EpiloguePlan, st: EpStep, *, acc_base: int, nb_n: int, ob_n: int,
             pixels: int, ob0: int, param_base: int, param_starts: list[int], where: str) -> Alu:
    """One ALU step (an immediate or a parameter vector) over tile rows ``[nb][ob][pix]``."""
    op = ALU_OPS.by_name(st.op)
    use_imm = st.imm is not None
    rows = nb_n * ob_n * pixels
    if use_imm:
        dims = [dim("rows", rows, dst=1)]
        base = (acc_base, 0, 0)
    else:
        vec = ep.params[st.param]
        s = 1 if vec.size > 1 else 0
        dims = [dim("nb", nb_n, dst=ob_n * pixels), dim("ob", ob_n, dst=pixels, src=s),
                dim("pix", pixels, dst=1)]
        base = (acc_base, param_base + param_starts[st.param] + ob0 * s, 0)
    nest = map_nest(dims, base, kind="alu", isa=em.isa,
                    distance=op.timing.hazard_distance(use_imm),
                    src_is_acc_read=not use_imm, where=where)
    b, e = em.kernel(nest.uops)
    return Alu(alu_op=op.opcode, use_imm=use_imm, imm=st.imm or 0, uop_begin=b, uop_end=e,
               **nest.fields("alu"))


def emit_epilogue(em: Emitter, ep: EpiloguePlan, *, acc_base: int, nb_n: int, ob_n: int,
                  pixels: int, ob0: int, param_base: int, param_starts: list[int],
                  scratch_base: int, residual_loads, where: str) -> None:
    """The tile's epilogue ALU steps (and residual loads/adds) over rows ``[nb][ob][pix]``."""
    isa = em.isa
    rows = nb_n * ob_n * pixels
    for st in ep.steps:
        if st.kind == "residual":
            em.emit(*residual_loads(st.tensor, scratch_base))
            if st.op:
                em.emit(tile_alu(em, ep, replace(st, kind="alu"), acc_base=scratch_base,
                                 nb_n=nb_n, ob_n=ob_n, pixels=pixels, ob0=ob0,
                                 param_base=param_base, param_starts=param_starts, where=where))
            op = ALU_OPS.by_name("ADD")
            nest = map_nest([dim("rows", rows, dst=1, src=1)], (acc_base, scratch_base, 0),
                            kind="alu", isa=isa, distance=op.timing.hazard_distance(False),
                            src_is_acc_read=True, where=where)
            b, e = em.kernel(nest.uops)
            em.emit(Alu(alu_op=op.opcode, uop_begin=b, uop_end=e, **nest.fields("alu")))
            continue
        em.emit(tile_alu(em, ep, st, acc_base=acc_base, nb_n=nb_n, ob_n=ob_n, pixels=pixels,
                         ob0=ob0, param_base=param_base, param_starts=param_starts,
                         where=where))


@dataclass
class TensorInfo:
    """A tensor's place and layout, as the builder hands them to the tensorizers."""

    name: str
    layout: ActLayout
    place: Place


def _first_region(last: tuple[int, int] | None, base_of, rows: int) -> int:
    """The region of an operator's first tile: neither it nor the second tile's region
    (initialised beside the first tile's GEMMs) holds rows the previous operator's last tile
    is still storing, if possible."""
    if last is None:
        return 0

    def free(r: int) -> bool:
        a = base_of(r % PIPELINE_REGIONS)
        return last[1] <= a or a + rows <= last[0]
    for need in (2, 1):
        for r in range(PIPELINE_REGIONS):
            if all(free(r + k) for k in range(need)):
                return r
    return 0


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
                       acc_range=acc_bound(conv.weight, c), init_bias=True, where=where)
    if plan is not None:
        # A forced pipelined tiling whose regions do not fit runs unpipelined.
        forced = [plan] + ([replace(plan, pipeline=False)] if plan.pipelined else [])
        fits = [p for p in forced if not isinstance(conv_plan_fits(g, p, c, ep), str)]
        if not fits:
            raise CompileError(f"{where}: the tiling {plan.describe(c)} does not fit: "
                               f"{conv_plan_fits(g, forced[-1], c, ep)}", op=op.name)
        candidates: Iterable[ConvPlan] = fits
    else:
        def ranked() -> Iterator[ConvPlan]:
            tried = set()
            sources = [lambda: cached_conv_plans(g, c, ep, threads, PLAN_FALLBACKS, True)]
            if threads > 1:
                # Last resorts on small uop buffers: two slots need half the kernels of
                # four regions, one thread a quarter.
                sources += [lambda: cached_conv_plans(g, c, ep, threads, PLAN_FALLBACKS // 2,
                                                      False),
                            lambda: cached_conv_plans(g, c, ep, 1, PLAN_FALLBACKS // 2, True)]
            for source in sources:
                for p in source():
                    if replace(p, est_cycles=0) not in tried:
                        tried.add(replace(p, est_cycles=0))
                        yield p
        candidates = ranked()
    wpacked, _ = pack_conv_weights(conv.weight, conv.groups, c)
    em.begin_op(op.name)
    wseg = em.add_segment(f"{op.name}.w", wpacked)
    w_elem = em.elem(Place(wseg), MemType.WGT)
    in_elem = em.elem(inp.place, MemType.INP)
    out_elem = em.elem(out.place, MemType.OUT)
    res_elem = {k: em.elem(v.place, MemType.ACC8) for k, v in residuals.items()}
    out_l = out.layout
    in_l = inp.layout
    hazard = timing.gemm_hazard_distance()

    last_region: list[tuple[int, int]] = []

    def body(plan: ConvPlan, budget: Budget) -> None:
        pipelined = plan.pipelined
        slot = budget.acc_slot
        bases, param_starts = emit_param_prologue(em, op.name, ep, g.OB, banked=pipelined)
        if pipelined:
            br = c.acc_bank_rows

            def region_base(r: int) -> int:
                return (r % 2) * br + (r // 2) * slot

            def params_of(r: int) -> int:
                return bases[r % 2]
            first = _first_region(em.last_acc_rows, region_base, slot)
        else:
            origin, first = em.acc_origin(slot, plan.threads, bases[0])

            def region_base(r: int) -> int:
                return origin + r * slot

            def params_of(r: int) -> int:
                return bases[0]
        steps = schedule(g, plan, first, (budget.inp_slots, budget.wgt_slots))
        tiles: list[list[Step]] = []
        for s in steps:
            if s.first:
                tiles.append([])
            tiles[-1].append(s)

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
                    # writes only the pad value, as y padding of an empty read.
                    if it.rows > em.max_dma["y_pad_0"]:
                        raise CompileError(
                            f"{where}: an input tile of {it.rows} rows lies entirely in the "
                            f"padding {conv.padding}, more than the DMA's "
                            f"{em.max_dma['y_pad_0']} rows of zero fill; use smaller padding",
                            op=op.name)
                    out_ += [Load(mem=MemType.INP, sram_base=s.inp_slot * budget.inp_slot + so,
                                  dram_base=in_elem + do, y_size=0, x_size=it.cols,
                                  x_stride=it.cols, y_pad_0=it.rows, pad_value=conv.pad_value)
                             for so, do in planes]
                else:
                    out_ += plane_dmas(Load, mem=MemType.INP,
                                       sram_base=s.inp_slot * budget.inp_slot,
                                       dram_base=in_elem, planes=planes, rows=rows, cols=cols,
                                       row_stride=g.w * g.row_step, pads=it.pads,
                                       pad_value=conv.pad_value, max_fields=em.max_dma)
            if s.load_wgt:
                ob_n, j_n = t.ob1 - t.ob0, s.j1 - s.j0
                out_.append(Load(mem=MemType.WGT, sram_base=s.wgt_slot * budget.wgt_slot,
                                 dram_base=w_elem + (t.ob0 * g.J + s.j0) * g.khkw, y_size=ob_n,
                                 x_size=j_n * g.khkw, x_stride=g.J * g.khkw))
            return out_

        def shape(t: Tile) -> tuple[int, int, int, int, int]:
            nb_n, ob_n, px = t.nb1 - t.nb0, t.ob1 - t.ob0, t.pixels
            return nb_n, ob_n, px, t.rows, tile_replicas(c, g, nb_n, ob_n, px)

        def init(s: Step) -> list:
            """The tile's accumulator rows start at the bias (MOV) or zero (a reset)."""
            t = s.tile
            nb_n, ob_n, px, rows, R = shape(t)
            base = region_base(s.acc_slot)
            if ep.init is None:
                return [reset_insn(em, base, R * rows, where)]
            res = [tile_alu(em, ep, ep.init, acc_base=base, nb_n=nb_n, ob_n=ob_n, pixels=px,
                            ob0=t.ob0, param_base=params_of(s.acc_slot),
                            param_starts=param_starts, where=where)]
            if R > 1:
                res.append(reset_insn(em, base + rows, (R - 1) * rows, where))
            return res

        def gemm(s: Step) -> Gemm | None:
            """The step's GEMM (``None`` when no block pair of the step exists)."""
            t, it = s.tile, s.intile
            nb_n, ob_n, px, rows, R = shape(t)
            oh_n, ow_n = t.oy1 - t.oy0, t.ox1 - t.ox0
            acc_base = region_base(s.acc_slot)
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
            if not pairs:
                return None
            nest = map_nest(dims, (acc_base, src0, s.wgt_slot * budget.wgt_slot), kind="gemm",
                            isa=isa, distance=hazard, max_uops=c.uop_depth, where=where)
            b, e = em.kernel(nest.uops)
            return Gemm(uop_begin=b, uop_end=e, **nest.fields("gemm"))

        def epilogue(s: Step, chunks: int) -> list[list]:
            """The tile's epilogue: compute instructions, each with the stores that follow it
            (the last tile's goes in plane groups: each group's store overlaps the next
            group's epilogue, so little of the final store is exposed)."""
            t = s.tile
            nb_n, ob_n, px, rows, R = shape(t)
            oh_n, ow_n = t.oy1 - t.oy0, t.ox1 - t.ox0
            acc_base = region_base(s.acc_slot)
            pbase = params_of(s.acc_slot)
            scratch = acc_base + R * rows
            items: list[list] = []
            add = ALU_OPS.by_name("ADD")
            for r in range(1, R):
                nest = map_nest([dim("rows", rows, dst=1, src=1)],
                                (acc_base, acc_base + r * rows, 0),
                                kind="alu", isa=isa, distance=add.timing.hazard_distance(False),
                                src_is_acc_read=True, where=where)
                b, e = em.kernel(nest.uops)
                items.append([Alu(alu_op=add.opcode, uop_begin=b, uop_end=e,
                                  **nest.fields("alu"))])
            for nb, oa, ob_ in epilogue_chunks(t, chunks):
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
                              pixels=px, ob0=oa, param_base=pbase, param_starts=param_starts,
                              scratch_base=scratch + (chunk_base - acc_base),
                              residual_loads=residual_loads, where=where)
                em.insns = em_insns
                items += [[i] for i in sub]
                planes = [(((n - t.nb0) * ob_n + (o - t.ob0)) * px,
                           out_l.entry(n, o, t.oy0, t.ox0)) for n in nbs
                          for o in range(oa, ob_)]
                stores = plane_dmas(Store, mem=MemType.OUT, sram_base=acc_base,
                                    dram_base=out_elem, planes=planes, rows=oh_n, cols=ow_n,
                                    row_stride=g.ow, max_fields=em.max_dma)
                if items:
                    items[-1] += stores
                else:
                    items.append(stores)
            return items

        def flagged(insns: list, overlap: bool) -> list:
            return [i.replace(overlap=overlap) if isinstance(i, (Gemm, Alu)) else i
                    for i in insns]

        def cycles(insns: list) -> int:
            """Compute-module cycles of ``insns`` (loads of inp/wgt and stores run elsewhere)."""
            return sum(timing.gemm_cycles(i) if isinstance(i, Gemm) else
                       timing.alu_cycles(i) if isinstance(i, Alu) else
                       dma_cycles(c, i) if isinstance(i, Load) and i.mem in (
                           MemType.ACC, MemType.ACC8) else 0 for i in insns)

        # Program order: the loads of step s+1 go before the GEMM of step s when they fill
        # other slots than step s reads, so fetch reaches them early (prefetch).
        gemm_items: list[list[list]] = []
        for k, s in enumerate(steps):
            nxt = steps[k + 1] if k + 1 < len(steps) else None
            hoist = nxt is not None and plan.threads > 1 and \
                not (nxt.load_inp and nxt.inp_slot == s.inp_slot) and \
                not (nxt.load_wgt and nxt.wgt_slot == s.wgt_slot)
            item = loads(nxt) if hoist else []
            gi = gemm(s)
            if gi is not None:
                item.append(gi)
            if nxt is not None and not hoist:
                item += loads(nxt)
            if s.first:
                gemm_items.append([])
            gemm_items[-1].append(item)

        em.emit(*loads(steps[0]))
        n_tiles = len(tiles)
        if pipelined:
            em.emit(*flagged(init(tiles[0][0]), True))
        for k, tsteps in enumerate(tiles):
            gitems = gemm_items[k]
            # The first GEMM of a tile waits for both units (its init ran on the ALU); the
            # others run beside the ALU.
            lead = True
            for item in gitems:
                if any(isinstance(i, Gemm) for i in item):
                    item[:] = flagged(item, not lead and pipelined)
                    lead = False
            if not pipelined:
                em.emit(*flagged(init(tsteps[0]), False))
                for item in gitems:
                    em.emit(*item)
                last = k == n_tiles - 1
                for item in epilogue(tsteps[-1], LAST_TILE_CHUNKS if last else 1):
                    em.emit(*flagged(item, False))
                continue
            side: list[list] = []
            if k > 0:
                side += [flagged(i, True) for i in epilogue(tiles[k - 1][-1], 1)]
            if k + 1 < n_tiles:
                side += [flagged([i], True) for i in init(tiles[k + 1][0])]
            for unit, j in interleave([cycles(i) for i in gitems], [cycles(i) for i in side]):
                em.emit(*(gitems[j] if unit == 0 else side[j]))
        if pipelined:
            # The last tile's epilogue: its first instruction waits for the GEMMs (same bank).
            lead = True
            for item in epilogue(tiles[-1][-1], LAST_TILE_CHUNKS):
                out_ = []
                for i in item:
                    if isinstance(i, (Gemm, Alu)):
                        out_.append(i.replace(overlap=not lead))
                        lead = False
                    else:
                        out_.append(i)
                em.emit(*out_)
        last_s = steps[-1]
        base = region_base(last_s.acc_slot)
        last_region[:] = [(base, base + slot)]

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
            em.last_acc_rows = last_region[0]
            break
        except CompileError as exc:
            em.rollback(cp)
            error = error or exc
    else:
        raise error  # type: ignore[misc]
    em.end_op()
    return plan
