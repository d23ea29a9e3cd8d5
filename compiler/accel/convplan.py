"""Convolution and dense layers on the GEMM core: geometry, tiles and the legality of a tiling.

The cycle model that ranks legal tilings is :mod:`.convcost`; the tensorizer that
emits a chosen tiling is :mod:`.conv`.

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

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache


from tessera import timing
from tessera.config import HwConfig
from tessera.isa import get_isa

from .epilogue import EpiloguePlan
from .convweights import reduction_chunks, sparse_kernel_uops, weight_key, weight_slot_entries
from .layout import ActLayout, GroupBlocks, WeightBlocks, ceil_div
from .nest import Dim, dim
from .ops import Conv2d

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
    blocks: WeightBlocks
    #: DMA elements between a pixel's input block and the next pixel's: above 1 where a
    #: rectangular core's GEMM reads sub-blocks (:attr:`~.layout.ActLayout.pixel_stride`).
    #: (Sub-block stores are priced as whole rows: on the simulator that estimate was the
    #: closer one, docs/benchmarks.md.)
    in_stride: int = 1

    @classmethod
    def of(cls, op: Conv2d, in_shape: tuple[int, int, int, int], config: HwConfig,
           blocks: WeightBlocks | None = None, in_stride: int = 1) -> "ConvGeom":
        """The geometry of ``op`` on ``config``; ``blocks``: its non-zero weight blocks
        (default every block, i.e. the layer runs densely); ``in_stride``: the field's."""
        n, c, h, w = in_shape
        _, o, oh, ow = op.output_shape(in_shape)
        kh, kw = op.weight.shape[2:]
        gb = GroupBlocks.of(c, o, op.groups, config.block_in, config.block_out)
        OB = ceil_div(o, config.block_out)
        if blocks is None:
            blocks = WeightBlocks.dense((OB, gb.J, kh, kw))
        return cls(op.name, n, c, h, w, o, kh, kw, *op.stride, *op.dilation, *op.padding, oh, ow,
                   ceil_div(n, config.batch), ceil_div(c, config.block_in), OB, gb, blocks,
                   in_stride)

    @property
    def J(self) -> int:
        return self.gb.J

    @property
    def khkw(self) -> int:
        return self.kh * self.kw

    @cached_property
    def ragged(self) -> bool:
        """Some output blocks read fewer input blocks than others (grouped convolutions whose
        blocks run past the last input block)."""
        return any(lo + self.J > self.CB for lo in self.gb.cb_lo)

    @cached_property
    def uneven(self) -> bool:
        """Output blocks have unequal numbers of kernel terms (a ragged grouped
        convolution, or zero weight blocks skipped). Remembered: the tiling search asks
        for every candidate."""
        return self.ragged or not self.blocks.is_dense

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


def gemm_pixel_dims(g: ConvGeom, t: Tile, it: InTile) -> list[Dim]:
    """The output-pixel dimensions ``(nb, oy, ox)`` of the GEMM nest of a step of tile
    ``t`` reading input tile ``it`` (accumulator rows ``[nb][ob][oy][ox]``)."""
    plane = it.rows * it.cols
    oh_n, ow_n = t.oy1 - t.oy0, t.ox1 - t.ox0
    return [dim("nb", t.nb1 - t.nb0, dst=(t.ob1 - t.ob0) * t.pixels,
                src=(it.c1 - it.c0) * plane),
            dim("oy", oh_n, dst=ow_n, src=(g.sy // g.row_step) * it.cols),
            dim("ox", ow_n, dst=1, src=g.sx)]


def gemm_tap_dims(g: ConvGeom, it: InTile) -> list[Dim]:
    """The kernel-position dimensions ``(ky, kx)`` of a step's GEMM nest."""
    return [dim("ky", g.kh, src=g.dy * it.cols, wgt=g.kw), dim("kx", g.kw, src=g.dx, wgt=1)]


def gemm_dense_dims(g: ConvGeom, t: Tile, it: InTile, j_n: int) -> list[Dim]:
    """The whole GEMM nest of a step whose ``ob x j_n`` block pairs all exist (weights
    dense, no replica rows): pixels, taps, output blocks, input blocks."""
    plane = it.rows * it.cols
    ob_n = t.ob1 - t.ob0
    return gemm_pixel_dims(g, t, it) + gemm_tap_dims(g, it) + [
        dim("ob", ob_n, dst=t.pixels, src=g.gb.slope * plane, wgt=j_n * g.khkw),
        dim("j", j_n, src=plane, wgt=g.khkw)]


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
    density: float = 1.0         # of the weight blocks the GEMMs multiply (zero ones skipped)

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
                + (", epilogue beside the GEMMs" if self.pipelined else "")
                + (f", {self.density:.0%} of the weight blocks (zero ones skipped)"
                   if self.density < 1 else ""))


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


class SlotRing:
    """Input or weight buffer slots used in turn, each remembering the tile it holds (a
    tile already resident is not loaded again)."""

    def __init__(self, n: int) -> None:
        self.held: list[tuple | None] = [None] * n
        self.next = 0

    def claim(self, key: tuple) -> tuple[int, bool]:
        """The slot of tile ``key`` and whether it must be loaded there (into the next slot
        in turn, when no slot holds it)."""
        if key in self.held:
            return self.held.index(key), False
        slot = self.next
        self.held[slot] = key
        self.next = (slot + 1) % len(self.held)
        return slot, True


def schedule(g: ConvGeom, p: ConvPlan, acc_first: int = 0,
             slots: tuple[int, int] | None = None) -> list[Step]:
    """The steps of plan ``p`` in program order, with slot assignment and reuse
    (``slots``: input and weight slots, default ``p.threads`` each, used in turn;
    accumulator slots, ``p.regions`` of them, rotate from ``acc_first``)."""
    steps: list[Step] = []
    n_inp, n_wgt = slots or (p.threads, p.threads)
    inp, wgt = SlotRing(n_inp), SlotRing(n_wgt)
    chunks = reduction_chunks(g, p)
    for ti, t in enumerate(tiles_of(g, p)):
        for ci, (j0, j1) in enumerate(chunks):
            it = input_tile(g, t, j0, j1)
            islot, li = inp.claim(it.key)
            wslot, lw = wgt.claim(weight_key(t, j0, j1))
            steps.append(Step(ti, t, j0, j1, ci == 0, ci == len(chunks) - 1, it, islot, wslot,
                              (ti + acc_first) % p.regions, li, lw))
    return steps


def replicas(config: HwConfig, rows: int) -> int:
    """Replica accumulator sets a tile of ``rows`` rows needs to respect the GEMM hazard."""
    return max(1, ceil_div(timing.gemm_hazard_distance(), max(1, rows)))


def tile_replicas(config: HwConfig, g: ConvGeom, nb: int, ob: int, px: int) -> int:
    """Replicas of a tile: by its rows, or by one output block's rows when blocks have
    unequal numbers of terms (then consecutive terms may hit the same block)."""
    return replicas(config, nb * px if g.uneven else nb * ob * px)


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
    inp_slot, wgt_slot = max_input_entries(g, p), weight_slot_entries(g, p)
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
    dense = g.blocks.is_dense
    for a, b, c, d in shapes:
        rows = a * b * c * d
        per_term = c * d * a if rows < timing.gemm_hazard_distance() else 1
        if dense:
            total += combos * sum(b * j * g.khkw * per_term for j in sizes(g.J, p.j_t))
        else:
            # Zero blocks skipped: a kernel per output-block range and input chunk, in a
            # slot combination per spatial tile.
            n_sp = ceil_div(g.NB, p.nb_t) * ceil_div(g.oh, p.oh_t) * ceil_div(g.ow, p.ow_t)
            total = max(total, min(n_in * n_w * p.regions, n_sp) * per_term
                        * sparse_kernel_uops(g, p))
    return total + len(shapes) * p.regions * 8


def conv_plan_fits(g: ConvGeom, p: ConvPlan, config: HwConfig, ep: EpiloguePlan) -> Budget | str:
    """The buffer budget of ``p`` if it fits ``config``, else why not (analytic, no codegen)."""
    t_rows = p.nb_t * p.ob_t * p.oh_t * p.ow_t
    smallest = 1
    for total, size in ((g.NB, p.nb_t), (g.OB, p.ob_t), (g.oh, p.oh_t), (g.ow, p.ow_t)):
        smallest *= min(size, total - (ceil_div(total, size) - 1) * size)
    if smallest >> p.ramp >= timing.gemm_hazard_distance() and not g.uneven:
        acc_slot = t_rows  # no tile is small enough to need replica rows
    else:
        acc_slot = max(tile_replicas(config, g, a, b, c * d) * a * b * c * d
                       for a, b, c, d in tile_shapes(g, p))
    acc_slot += t_rows * len(ep.scratch_groups)
    inp_slot = max_input_entries(g, p)
    wgt_slot = weight_slot_entries(g, p)
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



def epilogue_chunks(t: Tile, chunks: int) -> list[tuple[int | None, int, int]]:
    """Plane groups ``(nb or None for all, ob0, ob1)`` of a tile's epilogue, at most ``chunks``."""
    ob_n = t.ob1 - t.ob0
    if chunks <= 1 or (ob_n == 1 and t.nb1 - t.nb0 == 1):
        return [(None, t.ob0, t.ob1)]
    per_nb = max(1, chunks // (t.nb1 - t.nb0))
    size = -(-ob_n // min(per_nb, ob_n))
    return [(nb, o, min(t.ob1, o + size)) for nb in range(t.nb0, t.nb1)
            for o in range(t.ob0, t.ob1, size)]



def tile_planes(layout: ActLayout, t: Tile, planes: list[tuple[int, int, int]], ow: int,
                view: tuple[int, int, int, int] | None) -> dict:
    """The :func:`~.emit.plane_dmas` geometry moving tile ``t``'s output planes
    ``(sram offset, image block, output block)`` to or from their places in an
    output-shaped tensor of ``layout`` (its pixels :attr:`~.ActLayout.pixel_stride`
    elements apart): rows of ``ow`` pixels, or, for a phase of a larger tensor (``view``:
    ``(sy, sx, ay, ax)``), rows ``sy`` apart and pixels ``sx`` apart (a DMA row per
    pixel)."""
    rows, cols = t.oy1 - t.oy0, t.ox1 - t.ox0
    ps = layout.pixel_stride
    if view is None:
        return dict(planes=[(s, layout.entry(n, o, t.oy0, t.ox0)) for s, n, o in planes],
                    rows=rows, cols=cols, row_stride=ow * ps, elem_stride=ps)
    sy, sx, ay, ax = view
    if sx == 1:
        return dict(planes=[(s, layout.entry(n, o, sy * t.oy0 + ay, t.ox0 + ax))
                            for s, n, o in planes],
                    rows=rows, cols=cols, row_stride=sy * layout.row_stride, elem_stride=ps)
    return dict(planes=[(s + r * cols, layout.entry(n, o, sy * (t.oy0 + r) + ay,
                                                    sx * t.ox0 + ax))
                        for s, n, o in planes for r in range(rows)],
                rows=cols, cols=1, row_stride=sx * ps)
