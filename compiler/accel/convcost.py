"""The step-level cycle model of a conv/dense tiling and the search over tilings
(:func:`plan_conv_tiles`).

Legal tilings come from :mod:`.convplan`; each is ranked by :class:`ConvCostModel`, a
pipeline model built on :mod:`tessera.timing` (the formulas the simulator and the RTL
meet; single instructions and steps priced in :mod:`.convsteps`), and the best few are
kept (:func:`cached_conv_plans`).
"""
from __future__ import annotations

import math
from contextlib import suppress
from dataclasses import replace

from tessera import timing
from tessera.config import HwConfig
from tessera.isa import MemType, get_isa

from .convsteps import (alu_op_cycles, fetch_cycles_per_insn, gemm_op_cycles,
                        input_load_cycles, load_cycles, quick_estimate, reset_cycles,
                        step_terms, store_cycles, total_gemm_ops, weight_load_cycles)
from .epilogue import EpStep, EpiloguePlan
from tessera.errors import CompileError
from .layout import ceil_div
from .convplan import (ConvGeom, ConvPlan, InTile, LAST_TILE_CHUNKS, MAX_SIMULATED_PLANS, SlotRing,
                       Tile, buffer_slots, conv_plan_fits, epilogue_chunks, estimate_uops,
                       gemm_dense_dims, input_tile, tile_replicas, tiles_of)
from .nest import map_nest
from .convweights import reduction_chunks, weight_key

def interleave(gemm: list[int], side: list[int],
               both: list[bool] | None = None) -> list[tuple[int, int]]:
    """Stream order of one tile's GEMM steps (cycles ``gemm``) and the ALU-unit
    instructions that run beside them (cycles ``side``: the previous tile's epilogue, the
    next tile's init), as ``(0, j)`` / ``(1, i)``.

    The first GEMM leads (it waits for both units); the rest follow by predicted start,
    each unit busy back to back from then (ties go to the ALU). A side instruction that
    takes both units (``both[i]``: a residual load into the accumulator) starts once both
    are free and holds both. Compute instructions start in program order, so an order
    close to the real start times keeps either unit from waiting behind an instruction of
    the other.
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
            if both is not None and both[i]:
                ta = tg = max(ta, tg) + side[i]
            else:
                ta += side[i]
            i += 1
        else:
            order.append((0, j))
            tg += gemm[j]
            j += 1
    return order


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
        self._kernel: dict[tuple, int] = {}     # GEMM kernel uops by step shape

    def step_costs(self, t: Tile, j0: int, j1: int) -> tuple:
        key = (t.nb0, t.nb1, t.ob0, t.ob1, t.oy0, t.oy1, t.ox0, t.ox1, j0, j1)
        hit = self._step.get(key)
        if hit is None:
            g, config = self.g, self.config
            it = input_tile(g, t, j0, j1)
            icyc, planes = input_load_cycles(config, g, it)
            wcyc = weight_load_cycles(config, g, t.ob0, t.ob1, j0, j1)
            terms = step_terms(g, t, j0, j1, it)
            ops = terms * (t.nb1 - t.nb0) * t.pixels
            shape = (t.nb1 - t.nb0, t.ob1 - t.ob0, t.oy1 - t.oy0, t.ox1 - t.ox0, it.rows,
                     it.cols, j1 - j0)
            uops = self._kernel.get((shape, terms))
            if uops is None:
                uops = self._kernel[shape, terms] = self.kernel_uops(t, it, j1 - j0, terms)
            hit = (it.key, icyc, planes, weight_key(t, j0, j1), wcyc,
                   gemm_op_cycles(ops) if ops else 0, ops, shape, uops)
            self._step[key] = hit
        return hit

    def kernel_uops(self, t: Tile, it: InTile, j_n: int, terms: int) -> int:
        """Uops of a step's GEMM kernel: those of the nest the tensorizer maps
        (:func:`~.convplan.gemm_dense_dims`) when its block pairs all exist, else about one
        per term (per term and pixel in a tile of fewer rows than the hazard distance)."""
        g, config = self.g, self.config
        nb_n, ob_n = t.nb1 - t.nb0, t.ob1 - t.ob0
        hazard = timing.gemm_hazard_distance()
        if (g.blocks.is_dense and g.gb.slope is not None and terms == ob_n * j_n * g.khkw
                and tile_replicas(config, g, nb_n, ob_n, t.pixels) == 1):
            # A nest that does not map (too many uops) is priced by the estimate below.
            with suppress(CompileError):
                return len(map_nest(gemm_dense_dims(g, t, it, j_n), (0, 0, 0), kind="gemm",
                                    isa=get_isa(config), distance=hazard,
                                    max_uops=config.uop_depth).uops)
        return terms * (1 if t.rows >= hazard else nb_n * t.pixels)

    def side_costs(self, nb_n: int, ob_n: int, px: int, r: int) -> tuple:
        """``(init, epilogue)``: the cycles of a tile's init instructions and of its
        epilogue's (``(cycles, takes both units)`` each) over ``nb_n x ob_n x px`` rows."""
        key = (nb_n, ob_n, px, r)
        hit = self._side.get(key)
        if hit is None:
            ep, rows = self.ep, nb_n * ob_n * px
            if ep.init is not None:
                init = [alu_op_cycles("MOV", ep.init.imm is not None, rows)]
                if r > 1:
                    init.append(reset_cycles((r - 1) * rows))
            else:
                init = [reset_cycles(r * rows)]
            epi = [(alu_op_cycles("ADD", False, rows), False)] * (r - 1)
            for st in ep.steps:     # in program order (see emit_epilogue)
                if st.kind == "residual":
                    epi.append((nb_n * load_cycles(self.config, MemType.ACC8, 1,
                                                    rows // nb_n, rows, (0, 0, 0, 0)), True))
                    if st.op:
                        epi.append((alu_op_cycles(st.op, st.imm is not None, rows), False))
                    epi.append((alu_op_cycles("ADD", False, rows), False))
                elif st.kind == "alu":
                    epi.append((alu_op_cycles(st.op, st.imm is not None, rows), False))
            hit = (tuple(init), tuple(epi))
            self._side[key] = hit
        return hit

    def _store(self, t: Tile, nb_n: int, ob_n: int) -> float:
        g, config = self.g, self.config
        if t.ox1 - t.ox0 == g.ow:
            return nb_n * store_cycles(config, ob_n, t.pixels, g.oh * g.ow)
        return nb_n * ob_n * store_cycles(config, t.oy1 - t.oy0, t.ox1 - t.ox0, g.ow)

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
        # The uop kernels the stream needs, by kernel (see uop_cycles).
        self.kernels: dict[tuple, int] = {}
        self._costs: list[tuple | None] = [None] * len(self.tiles)
        self.plan = p
        self.last_start = -1.0
        self.load_end = self.store_end = self.fetched = 0.0
        self.left = total_gemm_ops(g)  # GEMM work not yet issued: a lower bound on what remains

    def costs(self, ti: int) -> tuple:
        """:meth:`ConvCostModel.tile_costs` of tile ``ti`` (remembered per run)."""
        hit = self._costs[ti]
        if hit is None:
            hit = self._costs[ti] = self.model.tile_costs(self.tiles[ti],
                                                          ti == len(self.tiles) - 1)
        return hit

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
        return max(self.free[0], self.free[1], self.store_end) + self.uop_cycles()

    def uop_cycles(self) -> int:
        """Cycles of the operator's uop LOAD, which holds both units before anything
        computes: a GEMM kernel per step shape and slot combination met (its source,
        weight and destination offsets differ), about one uop per ALU instruction of a
        tile shape and region; skipped zero blocks make kernels irregular, counted as
        :func:`~.convplan.estimate_uops` does."""
        model = self.model
        if model.g.blocks.is_dense:
            shapes = {(t.nb1 - t.nb0, t.ob1 - t.ob0, t.pixels, ti % self.regions)
                      for ti, t in enumerate(self.tiles)}
            init, groups, _ = self.costs(0)
            alu = len(init) + sum(len(e) for e, _ in groups)
            uops = sum(self.kernels.values()) + len(shapes) * alu
        else:
            uops = estimate_uops(model.g, self.plan, model.config)
        return load_cycles(model.config, MemType.UOP, 1, uops, uops, (0, 0, 0, 0))

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
        for i in range(len(self.costs(ti)[0])):
            self.init_insn(ti, i, overlap)

    def init_insn(self, ti: int, i: int, overlap: bool) -> None:
        """Instruction ``i`` of tile ``ti``'s init."""
        c = self.costs(ti)[0][i]
        self.fetched += self.per_insn
        self.issue(1, c, overlap, max(self.fetched, self.acc_free[ti % self.regions]))

    def epilogue(self, ti: int, overlap: bool) -> None:
        """The epilogue and stores of tile ``ti`` (the first instruction with ``overlap``
        as given, the rest beside the GEMM unit when pipelined)."""
        groups = self.costs(ti)[1]
        for gi, (epi, _) in enumerate(groups):
            for i in range(len(epi)) or [-1]:
                self.epilogue_insn(ti, gi, i, overlap)
                overlap = overlap if i < 0 else self.pipelined

    def epilogue_insn(self, ti: int, gi: int, i: int, overlap: bool) -> None:
        """Instruction ``i`` of plane group ``gi`` of tile ``ti``'s epilogue (``-1``: the
        group has none) and, after the group's last, its store: the tile's region is free
        once the last group's store ends. One that takes both units (a residual load)
        never overlaps."""
        groups = self.costs(ti)[1]
        epi, store = groups[gi]
        end = self.free[1]
        if i >= 0:
            c, both = epi[i]
            self.fetched += self.per_insn
            end = self.issue(1, c, overlap and not both, self.fetched, both)
        if i == len(epi) - 1:
            self.fetched += self.per_insn
            self.store_end = max(self.store_end, end) + store
            if gi == len(groups) - 1:
                self.acc_free[ti % self.regions] = self.store_end

    def tile_gemms(self, ti: int, bound: float) -> bool:
        """The GEMM steps of tile ``ti``, interleaved with the ALU work beside them;
        ``False`` once pruned by ``bound``."""
        t = self.tiles[ti]
        steps = [self.model.step_costs(t, j0, j1) for j0, j1 in self.chunks]
        side = self.side_work(ti)
        first_gemm = True
        for unit, j in interleave([st[5] for st in steps], [c for c, *_ in side],
                                  [self.takes_both(*item) for item in side]):
            if unit == 1:
                _, kind, k, gi, i = side[j]
                if kind == "epi":
                    self.epilogue_insn(k, gi, i, True)
                else:
                    self.init_insn(k, i, True)
                continue
            end = self.step(steps[j], not first_gemm and self.pipelined, ti % self.regions)
            if end is None:
                continue
            first_gemm = False
            if end + self.left > bound:
                return False
        return True

    def side_work(self, ti: int) -> list[tuple[int, str, int, int, int]]:
        """What runs on the ALU unit beside tile ``ti``'s GEMMs when pipelined, one entry
        per instruction as the emitter interleaves them (``(cycles, kind, tile, plane
        group, index)``): the previous tile's epilogue (``"epi"``; index -1 for a plane
        group of no instruction, only its store) and the next tile's init."""
        if not self.pipelined:
            return []
        side: list[tuple[int, str, int, int, int]] = []
        if ti > 0:
            for gi, (epi, _) in enumerate(self.costs(ti - 1)[1]):
                side += ([(c, "epi", ti - 1, gi, i) for i, (c, _) in enumerate(epi)]
                         or [(0, "epi", ti - 1, gi, -1)])
        if ti + 1 < len(self.tiles):
            init = self.costs(ti + 1)[0]
            side += [(c, "init", ti + 1, 0, i) for i, c in enumerate(init)]
        return side

    def takes_both(self, cycles: int, kind: str, k: int, gi: int, i: int) -> bool:
        """Whether side instruction ``(cycles, kind, tile, group, index)`` (an entry of
        :meth:`side_work`) takes both units (a residual load)."""
        if kind != "epi" or i < 0:
            return False
        return self.costs(k)[1][gi][0][i][1]

    def step(self, costs: tuple, overlap: bool, region: int) -> float | None:
        """Load a step's input and weight tiles unless resident, then issue its GEMM (into
        accumulator ``region``); returns the GEMM's end (``None`` when the step has no
        GEMM)."""
        ikey, icyc, iplanes, wkey, wcyc, gcyc, ops, shape, uops = costs
        self.left -= ops
        islot, load_inp = self.inp.claim(ikey)
        wslot, load_wgt = self.wgt.claim(wkey)
        if gcyc:
            self.kernels[(shape, islot, wslot, region)] = uops
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
