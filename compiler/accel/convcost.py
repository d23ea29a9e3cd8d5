"""The step-level cycle model of a conv/dense tiling and the search over tilings
(:func:`plan_conv_tiles`).

Legal tilings come from :mod:`.convplan`; each is ranked by :class:`ConvCostModel`, a
pipeline model built on :mod:`tessera.timing` (the formulas the simulator and the RTL
meet), and the best few are kept (:func:`cached_conv_plans`).
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache


from tessera import timing
from tessera.config import HwConfig
from tessera.isa import ALU_OPS, Alu, Gemm, Load, MemType, Store

from .emit import dma_cycles
from .epilogue import EpStep, EpiloguePlan
from tessera.errors import CompileError
from .layout import ceil_div
from .convplan import (ConvGeom, ConvPlan, InTile, LAST_TILE_CHUNKS, MAX_SIMULATED_PLANS, SlotRing,
                       Tile, buffer_slots, conv_plan_fits, epilogue_chunks, input_tile,
                       tile_replicas, tiles_of)
from .convweights import reduction_chunks, step_weights, weight_key

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


def input_load_cycles(config: HwConfig, g: ConvGeom, it: InTile) -> tuple[float, int]:
    """``(cycles, DMAs)`` loading input tile ``it``: a DMA per (image block, input block)
    plane, except for a batch of one-pixel images (a dense layer over many rows) whose
    tile holds every input block of each image: those planes lie evenly spaced in DRAM
    and :func:`~.emit.plane_dmas` loads them as one DMA (a row per plane)."""
    planes = (it.nb1 - it.nb0) * (it.c1 - it.c0)
    rows, cols = it.rows - it.pads[0] - it.pads[1], it.cols - it.pads[2] - it.pads[3]
    if (g.NB > 1 and g.h == g.w == 1 and planes > 1 and not any(it.pads)
            and (it.c1 - it.c0 == g.CB or it.nb1 - it.nb0 == 1)):
        return _load_cycles(config, MemType.INP, planes, 1, 1, (0, 0, 0, 0)), 1
    return planes * _load_cycles(config, MemType.INP, rows, cols, g.w * g.row_step,
                                 it.pads), planes


@lru_cache(maxsize=1 << 16)
def step_terms(g: ConvGeom, t: Tile, j0: int, j1: int, it: InTile) -> int:
    """Kernel terms ``(ob, j, ky, kx)`` of a step whose input block exists and whose weight
    block holds a non-zero."""
    n = 0
    for ob in range(t.ob0, t.ob1):
        for j in range(j0, j1):
            cb = g.gb.cb_lo[ob] + j
            if it.c0 <= cb < it.c1:
                n += g.blocks.count(ob, j, j + 1)
    return n


def weight_load_cycles(config: HwConfig, g: ConvGeom, ob0: int, ob1: int, j0: int,
                       j1: int) -> float:
    """Cycles of the DMAs loading a step's weight tile (:func:`~.convweights.step_weights`)."""
    return sum(_load_cycles(config, MemType.WGT, r.obs, r.count, r.stride, (0, 0, 0, 0))
               for r in step_weights(g, ob0, ob1, j0, j1).runs)


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
            icyc, planes = input_load_cycles(config, g, it)
            wcyc = weight_load_cycles(config, g, t.ob0, t.ob1, j0, j1)
            ops = step_terms(g, t, j0, j1, it) * (t.nb1 - t.nb0) * t.pixels
            hit = (it.key, icyc, planes, weight_key(t, j0, j1), wcyc,
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
        return _PipelineRun(self, p).run(bound)


class _PipelineRun:
    """One :meth:`ConvCostModel.estimate` of a plan, following its instruction stream: when
    each compute unit, the load and store modules and fetch are next free, which tiles the
    input and weight slots hold (and when a GEMM last read each), and when the last store
    of each accumulator region ends."""

    def __init__(self, model: ConvCostModel, p: ConvPlan) -> None:
        g = model.g
        self.model = model
        self.pipelined, self.regions = p.pipelined, p.regions
        self.per_insn = model.per_insn
        self.chunks = reduction_chunks(g, p)
        self.tiles = tiles_of(g, p)
        n_inp, n_wgt = buffer_slots(g, p, model.config)
        self.inp, self.wgt = SlotRing(n_inp), SlotRing(n_wgt)
        self.read_inp = [0.0] * n_inp
        self.read_wgt = [0.0] * n_wgt
        self.acc_free = [0.0] * p.regions
        self.free = [0.0, 0.0]          # GEMM unit, ALU unit
        self.last_start = -1.0
        self.load_end = self.store_end = self.fetched = 0.0
        self.left = total_gemm_ops(g)  # GEMM work not yet issued: a lower bound on what remains

    def run(self, bound: float) -> float:
        """The plan's cycles; ``inf`` once the GEMM work left cannot end under ``bound``."""
        last = len(self.tiles) - 1
        if self.pipelined:
            self.init(0, True)
        for ti in range(len(self.tiles)):
            if not self.pipelined:
                self.init(ti, False)
            if not self.tile_gemms(ti, bound):
                return math.inf
            if not self.pipelined or ti == last:
                self.epilogue(ti, False)
        return max(self.free[0], self.free[1], self.store_end)

    def issue(self, unit: int, cycles: float, overlap: bool, ready: float,
              both: bool = False) -> float:
        """Start a compute instruction in stream order once ``ready`` and its unit (both
        units unless ``overlap``) are free; returns its end."""
        free = self.free
        start = max(ready, self.last_start + 1, free[unit] if overlap else max(free[0], free[1]))
        self.last_start = start
        end = start + cycles
        free[unit] = end
        if both:
            free[0] = free[1] = end
        return end

    def init(self, ti: int, overlap: bool) -> None:
        """The init of tile ``ti``, once the store that last read its region is done."""
        costs = self.model.tile_costs(self.tiles[ti], ti == len(self.tiles) - 1)[0]
        for c in costs:
            self.fetched += self.per_insn
            self.issue(1, c, overlap, max(self.fetched, self.acc_free[ti % self.regions]))

    def epilogue(self, ti: int, overlap: bool) -> None:
        """The epilogue and stores of tile ``ti`` (the first instruction with ``overlap``
        as given, the rest beside the GEMM unit when pipelined)."""
        groups = self.model.tile_costs(self.tiles[ti], ti == len(self.tiles) - 1)[1]
        first = True
        end = self.free[1]
        for epi, store in groups:
            for c, both in epi:
                self.fetched += self.per_insn
                end = self.issue(1, c, overlap and not both if first else
                                 self.pipelined and not both, self.fetched, both)
                first = False
            self.fetched += self.per_insn
            self.store_end = max(self.store_end, end) + store
        self.acc_free[ti % self.regions] = self.store_end

    def tile_gemms(self, ti: int, bound: float) -> bool:
        """The GEMM steps of tile ``ti``, interleaved with the ALU work beside them;
        ``False`` once pruned by ``bound``."""
        t = self.tiles[ti]
        steps = [self.model.step_costs(t, j0, j1) for j0, j1 in self.chunks]
        side = self.side_work(ti)
        first_gemm = True
        for unit, j in interleave([st[5] for st in steps],
                                  [self.side_cycles(kind, k) for kind, k in side]):
            if unit == 1:
                kind, k = side[j]
                (self.epilogue if kind == "epi" else self.init)(k, True)
                continue
            end = self.step(steps[j], not first_gemm and self.pipelined)
            if end is None:
                continue
            first_gemm = False
            if end + self.left > bound:
                return False
        return True

    def side_work(self, ti: int) -> list[tuple[str, int]]:
        """What runs on the ALU unit beside tile ``ti``'s GEMMs when pipelined: the
        previous tile's epilogue (``"epi"``) and the next tile's init."""
        if not self.pipelined:
            return []
        side = []
        if ti > 0:
            side.append(("epi", ti - 1))
        if ti + 1 < len(self.tiles):
            side.append(("init", ti + 1))
        return side

    def side_cycles(self, kind: str, k: int) -> int:
        """ALU cycles of tile ``k``'s epilogue (``kind == "epi"``) or init."""
        init, groups, _ = self.model.tile_costs(self.tiles[k], False)
        if kind == "epi":
            return sum(c for e, _ in groups for c, _ in e)
        return sum(init)

    def step(self, costs: tuple, overlap: bool) -> float | None:
        """Load a step's input and weight tiles unless resident, then issue its GEMM;
        returns the GEMM's end (``None`` when the step has no GEMM)."""
        ikey, icyc, iplanes, wkey, wcyc, gcyc, ops = costs
        self.left -= ops
        islot, load_inp = self.inp.claim(ikey)
        wslot, load_wgt = self.wgt.claim(wkey)
        start, cycles, n_insn = self.load_end, 0, 1
        if load_inp:
            start = max(start, self.read_inp[islot])
            cycles += icyc
            n_insn += iplanes
        if load_wgt:
            start = max(start, self.read_wgt[wslot])
            cycles += wcyc
            n_insn += 1
        loaded = load_inp or load_wgt
        if loaded:
            self.load_end = start + cycles
        self.fetched += n_insn * self.per_insn
        if not gcyc:
            return None
        end = self.issue(0, gcyc, overlap, max(self.fetched, self.load_end if loaded else 0.0))
        self.read_inp[islot] = end
        self.read_wgt[wslot] = end
        return end


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
    blocks = sum(g.blocks.count(ob, 0, max(0, min(g.J, g.CB - lo)))
                 for ob, lo in enumerate(g.gb.cb_lo))
    return blocks * g.NB * g.oh * g.ow


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
    l_in = input_load_cycles(config, g, it)[0]
    l_w = weight_load_cycles(config, g, 0, min(p.ob_t, g.OB), 0, min(g.J, p.j_t))
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
    plans = _legal_plans(g, config, ep, threads, pipeline)
    if not plans:
        return _plans_when_none_fit(g, config, ep, threads, top, pipeline)
    levels = _halving_levels(g, config, ep, plans, threads)
    return _branch_and_bound(ConvCostModel(g, config, ep), levels)[:top]


def _legal_plans(g: ConvGeom, config: HwConfig, ep: EpiloguePlan, threads: int,
                 pipeline: bool) -> list[ConvPlan]:
    """The tilings that fit, each tile-size combination channel-outer (and spatial-outer
    when both orders differ): per width at most four heights, and no width under half the
    widest that fits."""
    plans: list[ConvPlan] = []
    ow_opts = candidate_sizes(g.ow)
    oh_opts = candidate_sizes(g.oh)
    for nb_t in _batch_tile_sizes(g.NB):
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
    return plans


def _batch_tile_sizes(total: int) -> list[int]:
    """Image-block tile sizes to try: the three largest even splits, and halvings down to
    one. Many images of one pixel (a dense layer over the rows of a sequence) need a
    small tile that holds every input block of each image; the halvings reach it without
    trying every split of thousands of rows."""
    halvings = {ceil_div(total, 1 << k) for k in range(total.bit_length())}
    return sorted(set(candidate_sizes(total, 3)) | halvings, reverse=True)


def _plans_when_none_fit(g: ConvGeom, config: HwConfig, ep: EpiloguePlan, threads: int,
                         top: int, pipeline: bool) -> list[ConvPlan]:
    """The search again with fewer accumulator regions, then one thread; raises
    :class:`CompileError` naming the overflow when even a one-pixel tile fails."""
    if threads > 1 and pipeline:
        # Four regions do not fit: the epilogue runs after the GEMMs, in two slots.
        return plan_conv_tiles(g, config, ep, threads, top, pipeline=False)
    smallest = conv_plan_fits(g, ConvPlan(1, 1, 1, 1, 1, threads, pipeline=False), config, ep)
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

def _halving_levels(g: ConvGeom, config: HwConfig, ep: EpiloguePlan, plans: list[ConvPlan],
                    threads: int) -> list[list[tuple[float, ConvPlan]]]:
    """Per number of halvings (0-2; halvings only with two threads), the plans that fit
    with their optimistic closed-form estimates, best first."""
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
    return levels


def _branch_and_bound(model: ConvCostModel,
                      levels: list[list[tuple[float, ConvPlan]]]) -> list[ConvPlan]:
    """Cost the plans of ``levels`` by the pipeline model, the levels taking turns, until
    none's estimate is within 5% of the best so far; returns the costed plans, best first."""
    ranked: list[ConvPlan] = []
    best = math.inf
    done = [0] * len(levels)
    for _ in range(MAX_SIMULATED_PLANS):
        open_ = [r for r in range(len(levels)) if done[r] < len(levels[r])
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
    return ranked
