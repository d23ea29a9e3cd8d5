"""``tensorize_conv2d``: a convolution or dense layer, tiled by :mod:`.convplan` and
:mod:`.convcost`, emitted as GEMM and ALU instructions with their uop kernels by a
:class:`ConvTensorizer` (one per layer, trying the ranked tilings in turn).

See :mod:`.convplan` for the geometry (tiles, steps, slots, virtual threads, the software
pipeline over the compute module's two units) this module turns into instructions.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Iterable, Iterator

import numpy as np

from tessera import timing
from tessera.config import HwConfig
from tessera.isa import ALU_OPS, Alu, Gemm, Load, MemType, Store

from .acctile import reset_insn
from .emit import Emitter, Place, TensorInfo, dma_cycles, plane_dmas
from .epilogue import (EpiloguePlan, emit_epilogue, emit_param_prologue, plan_epilogue,
                       tile_alu)
from tessera.errors import CompileError
from .layout import WeightBlocks, pack_conv_weights
from .nest import Dim, dim, explicit_dim, map_nest
from .ops import Conv2d, Dense
from .convplan import (Budget, ConvGeom, ConvPlan, LAST_TILE_CHUNKS, PIPELINE_REGIONS,
                       PLAN_FALLBACKS, Step, Tile, conv_plan_fits, epilogue_chunks,
                       gemm_dense_dims, gemm_pixel_dims, gemm_tap_dims, schedule,
                       tile_planes, tile_replicas)
from .convweights import interleave_terms, step_weights
from .convcost import cached_conv_plans, interleave
from .poolfuse import FusedPool, check_pool_plan, epilogue_commutes, fused_pool_plans
from .simtune import SimTuner

def acc_bound(weight: np.ndarray, config: HwConfig) -> tuple[int, int]:
    """Bounds of the raw accumulator: sum |w| x the largest input magnitude, per channel."""
    m = 1 << (config.inp_width - 1)
    w = weight.reshape(weight.shape[0], -1).astype(np.int32)  # int8 abs(-128) would wrap
    s = int(np.abs(w).sum(axis=1, dtype=np.int64).max()) * m
    return -s, s


def conv_epilogue(conv: Conv2d, channels: int, config: HwConfig, where: str) -> EpiloguePlan:
    """The epilogue plan of a convolution's tiles (the bias as the rows' initial value)."""
    return plan_epilogue(conv.epilogue, channels=channels, config=config,
                         acc_range=acc_bound(conv.weight, config), init_bias=True, where=where)


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


def _steps_by_tile(steps: list[Step]) -> list[list[Step]]:
    """``steps`` grouped by output tile (a tile's steps are consecutive)."""
    tiles: list[list[Step]] = []
    for s in steps:
        if s.first:
            tiles.append([])
        tiles[-1].append(s)
    return tiles


def _flagged(insns: list, overlap: bool) -> list:
    """``insns`` with every compute instruction's ``overlap`` flag set to ``overlap``."""
    return [i.replace(overlap=overlap) if isinstance(i, (Gemm, Alu)) else i for i in insns]


def _flag_gemm_items(items: list[list], pipelined: bool) -> None:
    """Flag one tile's GEMM items in place: the first GEMM waits for both units (its init
    ran on the ALU); when pipelined the others run beside the ALU."""
    lead = True
    for item in items:
        if any(isinstance(i, Gemm) for i in item):
            item[:] = _flagged(item, not lead and pipelined)
            lead = False


def _image_blocks(t: Tile, nb: int | None) -> range:
    """The image blocks of an epilogue plane group (``nb``, or all of the tile's for None)."""
    return range(t.nb0, t.nb1) if nb is None else range(nb, nb + 1)


class ConvTensorizer:
    """The tensorization of one convolution (or dense layer).

    Holds the layer's state (geometry, epilogue plan, DRAM operands) and, while a tiling
    is emitted (:meth:`emit`), its plan, buffer budget and accumulator regions. The steps
    of a tiling: the parameter prologue and region placement, the GEMM items of every step
    (with its prefetched loads), then per tile the init, GEMMs and epilogue, sequential or
    software-pipelined over the compute module's two units.
    """

    plan: ConvPlan
    budget: Budget
    param_bases: list[int]
    param_starts: list[int]
    acc_origin: int
    last_region: tuple[int, int]

    def __init__(self, em: Emitter, op: Conv2d | Dense, inp: TensorInfo, out: TensorInfo,
                 residuals: dict[str, TensorInfo], skip_zero_blocks: bool = True) -> None:
        self.em, self.op = em, op
        self.conv = op.as_conv() if isinstance(op, Dense) else op
        self.config = c = em.config
        self.inp, self.out, self.residuals = inp, out, residuals
        self.where = f"conv2d {op.name!r}"
        self.wpacked, _ = pack_conv_weights(self.conv.weight, self.conv.groups, c)
        blocks = (WeightBlocks.of(self.wpacked) if skip_zero_blocks
                  else WeightBlocks.dense(self.wpacked.shape[:4]))
        if inp.layout.block % c.block_in:
            raise CompileError(f"{self.where}: input {inp.name!r} is packed in blocks of "
                               f"{inp.layout.block} channels but the GEMM reads {c.block_in}",
                               op=op.name)
        self.in_l = inp.layout.view(c.block_in)
        self.g = ConvGeom.of(self.conv, inp.layout.shape, c, blocks, self.in_l.pixel_stride)
        self.ep = conv_epilogue(self.conv, self.g.o, c, self.where)
        self.hazard = timing.gemm_hazard_distance()
        self.pool, self.fused = getattr(op, "pool", None), None   # :mod:`.poolfuse`

    # ------------------------------------------------------------ candidate tilings
    def forced_plans(self, plan: ConvPlan) -> list[ConvPlan]:
        """The forced tiling ``plan``, or unpipelined when its pipelined regions do not fit
        (raises when neither fits)."""
        g, c, ep = self.g, self.config, self.ep
        if self.pool is not None:
            check_pool_plan(self.where, self.op.name, g, plan, c)
        forced = [plan] + ([replace(plan, pipeline=False)] if plan.pipelined else [])
        fits = [p for p in forced if not isinstance(conv_plan_fits(g, p, c, ep), str)]
        if not fits:
            raise CompileError(f"{self.where}: the tiling {plan.describe(c)} does not fit: "
                               f"{conv_plan_fits(g, forced[-1], c, ep)}", op=self.op.name)
        return fits

    def ranked_plans(self, threads: int) -> Iterator[ConvPlan]:
        """The best tilings by cycle estimate, then (lazily: only searched when every one
        before overflows) the last resorts on small uop buffers: two slots need half the
        kernels of four regions, one thread a quarter."""
        if self.pool is not None:
            yield from fused_pool_plans(self.g, self.config, self.ep, threads)
            return
        searches = [(threads, PLAN_FALLBACKS, True)]
        if threads > 1:
            searches += [(threads, PLAN_FALLBACKS // 2, False), (1, PLAN_FALLBACKS // 2, True)]
        tried = set()
        for search_threads, top, pipeline in searches:
            for p in cached_conv_plans(self.g, self.config, self.ep, search_threads, top,
                                       pipeline):
                if replace(p, est_cycles=0) not in tried:
                    tried.add(replace(p, est_cycles=0))
                    yield p

    # ------------------------------------------------------------ the operator
    def emit(self, candidates: Iterable[ConvPlan]) -> ConvPlan:
        """Emit the operator with the first of ``candidates`` that fits; returns that plan.

        The uop kernels of a tiling are only known once its nests are mapped: a tiling
        whose kernels overflow the uop buffer gives way to the next (nothing is kept of it).
        """
        em = self.em
        self._begin_op()
        error = None
        for plan in candidates:
            cp = em.checkpoint()
            try:
                budget = conv_plan_fits(self.g, plan, self.config, self.ep)
                self._emit_plan(plan, budget)  # type: ignore[arg-type]
                if em.uop_count > self.config.uop_depth:
                    raise CompileError(f"{self.where}: the tiling {plan.describe(self.config)} "
                                       f"needs {em.uop_count} uops but the uop buffer has "
                                       f"{self.config.uop_depth}", op=self.op.name)
                em.last_acc_rows = self.last_region
                break
            except CompileError as exc:
                em.rollback(cp)
                error = error or exc
        else:
            raise error  # type: ignore[misc]
        em.end_op()
        return plan

    def _begin_op(self) -> None:
        """Start the operator: its packed weight segment and its operands' DRAM elements."""
        em = self.em
        em.begin_op(self.op.name)
        wseg = em.add_segment(f"{self.op.name}.w", self.g.blocks.pack(self.wpacked))
        self.w_elem = em.elem(Place(wseg), MemType.WGT)
        self.in_elem = em.elem(self.inp.place, MemType.INP)
        self.out_elem = em.elem(self.out.place, MemType.OUT)
        self.res_elem = {k: em.elem(v.place, MemType.ACC8) for k, v in self.residuals.items()}

    def _emit_plan(self, plan: ConvPlan, budget: Budget) -> None:
        """Emit every instruction of one tiling (its uop kernels join the operator's)."""
        self.plan, self.budget = plan, budget
        if self.pool is not None:
            self.fused = FusedPool(self.em, self.pool, self.out, plan.oh_t, self.g.ow)
        first = self._place_regions()
        steps = schedule(self.g, plan, first, (budget.inp_slots, budget.wgt_slots))
        tiles = _steps_by_tile(steps)
        gemm_items = self._gemm_items(steps)
        self.em.emit(*self._loads(steps[0]))
        if plan.pipelined:
            self._emit_pipelined(tiles, gemm_items)
        else:
            self._emit_sequential(tiles, gemm_items)
        base = self.region_base(steps[-1].acc_slot)
        self.last_region = (base, base + budget.acc_slot)

    # ------------------------------------------------------------ accumulator regions
    def _place_regions(self) -> int:
        """Load the epilogue's parameter rows and place the accumulator regions clear of
        the rows the previous operator still stores; returns the first tile's region."""
        pipelined = self.plan.pipelined
        self.param_bases, self.param_starts = emit_param_prologue(
            self.em, self.op.name, self.ep, self.g.OB, banked=pipelined)
        if pipelined:
            return _first_region(self.em.last_acc_rows, self.region_base, self.budget.acc_slot)
        self.acc_origin, first = self.em.acc_origin(self.budget.acc_slot, self.plan.threads,
                                                    self.param_bases[0])
        return first

    def region_base(self, r: int) -> int:
        """First accumulator row of region ``r`` (pipelined: two regions per bank)."""
        if self.plan.pipelined:
            return (r % 2) * self.config.acc_bank_rows + (r // 2) * self.budget.acc_slot
        return self.acc_origin + r * self.budget.acc_slot

    def params_of(self, r: int) -> int:
        """First parameter row region ``r``'s ALU instructions read (the copy in its bank)."""
        return self.param_bases[r % 2 if self.plan.pipelined else 0]

    def _shape(self, t: Tile) -> tuple[int, int, int, int, int]:
        """``(image blocks, output blocks, pixels, rows, replicas)`` of tile ``t``."""
        nb_n, ob_n, px = t.nb1 - t.nb0, t.ob1 - t.ob0, t.pixels
        return nb_n, ob_n, px, t.rows, tile_replicas(self.config, self.g, nb_n, ob_n, px)

    # ------------------------------------------------------------ program order
    def _gemm_items(self, steps: list[Step]) -> list[list[list]]:
        """Per tile, each step's GEMM with the loads of the next step, flagged for overlap.

        The loads of step s+1 go before the GEMM of step s when they fill other slots than
        step s reads, so fetch reaches them early (prefetch).
        """
        items: list[list[list]] = []
        for k, s in enumerate(steps):
            nxt = steps[k + 1] if k + 1 < len(steps) else None
            hoist = nxt is not None and self.plan.threads > 1 and \
                not (nxt.load_inp and nxt.inp_slot == s.inp_slot) and \
                not (nxt.load_wgt and nxt.wgt_slot == s.wgt_slot)
            item = self._loads(nxt) if hoist else []
            gi = self._gemm(s)
            if gi is not None:
                item.append(gi)
            if nxt is not None and not hoist:
                item += self._loads(nxt)
            if s.first:
                items.append([])
            items[-1].append(item)
        for tile_items in items:
            _flag_gemm_items(tile_items, self.plan.pipelined)
        return items

    def _emit_sequential(self, tiles: list[list[Step]], gemm_items: list[list[list]]) -> None:
        """Each tile's init, GEMMs and epilogue one after the other (the last tile's
        epilogue in plane groups)."""
        em = self.em
        for k, tsteps in enumerate(tiles):
            em.emit(*_flagged(self._init(tsteps[0]), False))
            for item in gemm_items[k]:
                em.emit(*item)
            chunks = LAST_TILE_CHUNKS if k == len(tiles) - 1 else 1
            for item in self._epilogue(tsteps[-1], chunks):
                em.emit(*_flagged(item, False))

    def _emit_pipelined(self, tiles: list[list[Step]], gemm_items: list[list[list]]) -> None:
        """The software pipeline: while the GEMM unit runs tile k, the ALU unit runs the
        epilogue of tile k-1 and the init of tile k+1, interleaved by predicted start."""
        em = self.em
        em.emit(*_flagged(self._init(tiles[0][0]), True))
        for k, gitems in enumerate(gemm_items):
            side: list[list] = []
            if k > 0:
                side += [_flagged(i, True) for i in self._epilogue(tiles[k - 1][-1], 1)]
            if k + 1 < len(tiles):
                side += [_flagged([i], True) for i in self._init(tiles[k + 1][0])]
            for unit, j in interleave([self._cycles(i) for i in gitems],
                                      [self._cycles(i) for i in side],
                                      [self._takes_both(i) for i in side]):
                em.emit(*(gitems[j] if unit == 0 else side[j]))
        self._emit_last_epilogue(tiles[-1][-1])

    def _emit_last_epilogue(self, s: Step) -> None:
        """The pipelined last tile's epilogue: its first compute instruction waits for the
        GEMMs (same bank), the rest run beside them."""
        lead = True
        for item in self._epilogue(s, LAST_TILE_CHUNKS):
            flagged = []
            for i in item:
                if isinstance(i, (Gemm, Alu)):
                    flagged.append(i.replace(overlap=not lead))
                    lead = False
                else:
                    flagged.append(i)
            self.em.emit(*flagged)

    @staticmethod
    def _takes_both(insns: list) -> bool:
        """Whether ``insns`` hold a compute-module load (it takes both compute units)."""
        return any(isinstance(i, Load) and i.mem in (MemType.ACC, MemType.ACC8) for i in insns)

    def _cycles(self, insns: list) -> int:
        """Compute-module cycles of ``insns`` (loads of inp/wgt and stores run elsewhere)."""
        return sum(timing.gemm_cycles(i) if isinstance(i, Gemm) else
                   timing.alu_cycles(i) if isinstance(i, Alu) else
                   dma_cycles(self.config, i) if isinstance(i, Load) and i.mem in (
                       MemType.ACC, MemType.ACC8) else 0 for i in insns)

    # ------------------------------------------------------------ loads
    def _loads(self, s: Step) -> list:
        """The input and weight loads step ``s`` needs (none for resident data)."""
        loads = self._input_loads(s) if s.load_inp else []
        if s.load_wgt:
            base = s.wgt_slot * self.budget.wgt_slot
            loads += [Load(mem=MemType.WGT, sram_base=base + r.sram, dram_base=self.w_elem + r.dram,
                           y_size=r.obs, x_size=r.count, x_stride=r.stride)
                      for r in step_weights(self.g, s.tile.ob0, s.tile.ob1, s.j0, s.j1).runs]
        return loads

    def _input_loads(self, s: Step) -> list:
        """The DMAs of step ``s``'s input tile, one plane per (image block, input block),
        with the zero padding the DMA writes."""
        g, it, em = self.g, s.intile, self.em
        y0, y1, x0, x1 = it.pads
        rows = it.rows - y0 - y1
        cols = it.cols - x0 - x1
        yf = it.iy0 + y0 * g.row_step
        xf = it.ix0 + x0
        plane = it.rows * it.cols
        planes = [(((nb - it.nb0) * (it.c1 - it.c0) + (cb - it.c0)) * plane,
                   self.in_l.entry(nb, cb, max(yf, 0), max(xf, 0)))
                  for nb in range(it.nb0, it.nb1) for cb in range(it.c0, it.c1)]
        sram_base = s.inp_slot * self.budget.inp_slot
        if rows > 0 and cols > 0:
            return plane_dmas(Load, mem=MemType.INP, sram_base=sram_base,
                              dram_base=self.in_elem, planes=planes, rows=rows, cols=cols,
                              row_stride=self.in_l.row_stride * g.row_step, pads=it.pads,
                              pad_value=self.conv.pad_value,
                              elem_stride=self.in_l.pixel_stride, max_fields=em.max_dma)
        # The tile sees only padding (e.g. a padded 1x1 kernel at the border): the DMA
        # writes only the pad value, as y padding of an empty read.
        if it.rows > em.max_dma["y_pad_0"]:
            raise CompileError(
                f"{self.where}: an input tile of {it.rows} rows lies entirely in the "
                f"padding {self.conv.padding}, more than the DMA's "
                f"{em.max_dma['y_pad_0']} rows of zero fill; use smaller padding",
                op=self.op.name)
        return [Load(mem=MemType.INP, sram_base=sram_base + so, dram_base=self.in_elem + do,
                     y_size=0, x_size=it.cols, x_stride=it.cols, y_pad_0=it.rows,
                     pad_value=self.conv.pad_value)
                for so, do in planes]

    # ------------------------------------------------------------ compute
    def _init(self, s: Step) -> list:
        """The tile's accumulator rows start at the bias (MOV) or zero (a reset)."""
        t = s.tile
        nb_n, ob_n, px, rows, R = self._shape(t)
        base = self.region_base(s.acc_slot)
        if self.ep.init is None:
            return [reset_insn(self.em, base, R * rows, self.where)]
        res = [tile_alu(self.em, self.ep, self.ep.init, acc_base=base, nb_n=nb_n, ob_n=ob_n,
                        pixels=px, ob0=t.ob0, param_base=self.params_of(s.acc_slot),
                        param_starts=self.param_starts, where=self.where)]
        if R > 1:
            res.append(reset_insn(self.em, base + rows, (R - 1) * rows, self.where))
        return res

    def _gemm(self, s: Step) -> Gemm | None:
        """The step's GEMM (``None`` when no block pair of the step exists)."""
        g, t, it = self.g, s.tile, s.intile
        nb_n, ob_n, px, rows, R = self._shape(t)
        j_n = s.j1 - s.j0
        pairs = [(ob, j) for ob in range(ob_n) for j in range(j_n)
                 if it.c0 <= g.gb.cb_lo[t.ob0 + ob] + s.j0 + j < it.c1]
        if not pairs:
            return None
        dims: list[Dim] = gemm_pixel_dims(g, t, it)
        taps = gemm_tap_dims(g, it)
        src0 = s.inp_slot * self.budget.inp_slot
        if R > 1 or not g.blocks.is_dense:
            per_ob = self._step_terms(s, pairs)
            if not any(per_ob):
                return None
            dims.append(self._replica_terms_dim(s, per_ob, R) if R > 1 else
                        self._sparse_terms_dim(s, per_ob))
        elif len(pairs) == ob_n * j_n and g.gb.slope is not None:
            dims = gemm_dense_dims(g, t, it, j_n)
            src0 += self._block_src(s, 0, 0)
        else:
            # Ragged or irregular block pairs: interleave output blocks so consecutive
            # operations write different rows.
            pairs = sorted(pairs, key=lambda p_: (p_[1], p_[0]))
            dims += taps + [explicit_dim("obj", [ob * px for ob, j in pairs],
                                         [self._block_src(s, ob, j) for ob, j in pairs],
                                         [(ob * j_n + j) * g.khkw for ob, j in pairs])]
        nest = map_nest(dims, (self.region_base(s.acc_slot), src0,
                               s.wgt_slot * self.budget.wgt_slot), kind="gemm", isa=self.em.isa,
                        distance=self.hazard, max_uops=self.config.uop_depth, where=self.where)
        b, e = self.em.kernel(nest.uops)
        return Gemm(uop_begin=b, uop_end=e, **nest.fields("gemm"))

    def _block_src(self, s: Step, ob: int, j: int) -> int:
        """Offset in step ``s``'s input tile of the block output block ``ob`` reads as its
        ``j``-th (both relative to the step)."""
        it = s.intile
        return (self.g.gb.cb_lo[s.tile.ob0 + ob] + s.j0 + j - it.c0) * it.rows * it.cols

    def _step_terms(self, s: Step, pairs: list[tuple[int, int]]) -> list[list[tuple]]:
        """Per output block of the step (relative), its kernel terms ``(ob, j, ky, kx,
        weight entry)``: the taps of its block pairs ``pairs`` whose weight block holds a
        non-zero, the weight entry their place in the step's slot
        (:func:`~.convweights.step_weights`)."""
        g, t = self.g, s.tile
        offsets = step_weights(g, t.ob0, t.ob1, s.j0, s.j1).offsets
        per_ob: list[list[tuple]] = [[] for _ in range(t.ob1 - t.ob0)]
        for ob, j in pairs:
            entry = offsets[ob] + g.blocks.start(t.ob0 + ob, s.j0 + j) - \
                g.blocks.start(t.ob0 + ob, s.j0)
            for k, tap in enumerate(g.blocks.taps(t.ob0 + ob, s.j0 + j)):
                per_ob[ob].append((ob, j, *divmod(int(tap), g.kw), entry + k))
        return per_ob

    def _term_src(self, s: Step, ob: int, j: int, ky: int, kx: int) -> int:
        """Input-tile offset term ``(ob, j, ky, kx)`` of step ``s`` reads."""
        return self._block_src(s, ob, j) + ky * self.g.dy * s.intile.cols + kx * self.g.dx

    def _sparse_terms_dim(self, s: Step, per_ob: list[list[tuple]]) -> Dim:
        """The kernel terms of a step that skips zero weight blocks, interleaved so one
        output block's terms are the GEMM hazard distance apart
        (:func:`~.convweights.interleave_terms`)."""
        px = s.tile.pixels
        terms = interleave_terms(per_ob, self.hazard)
        return explicit_dim("term", [ob * px for ob, *_ in terms],
                            [self._term_src(s, ob, j, ky, kx) for ob, j, ky, kx, _ in terms],
                            [w for *_, w in terms])

    def _replica_terms_dim(self, s: Step, per_ob: list[list[tuple]], R: int) -> Dim:
        """The kernel terms of a tile with fewer rows than the GEMM's hazard distance: the
        terms of each output block cycle over R replica rows, and blocks interleave, so a
        (row, replica) pair recurs only every ob_n * R terms."""
        px, rows = s.tile.pixels, s.tile.rows
        terms = [(q[i], i % R) for i in range(max(map(len, per_ob)))
                 for q in per_ob if i < len(q)]
        return explicit_dim(
            "term",
            [ob * px + rep * rows for (ob, *_), rep in terms],
            [self._term_src(s, ob, j, ky, kx) for (ob, j, ky, kx, _), _ in terms],
            [w for (*_, w), _ in terms])

    # ------------------------------------------------------------ epilogue
    def _epilogue(self, s: Step, chunks: int) -> list[list]:
        """The tile's epilogue: compute instructions, each with the stores that follow it
        (the last tile's goes in plane groups: each group's store overlaps the next
        group's epilogue, so little of the final store is exposed)."""
        t = s.tile
        items = self._replica_sums(s)
        if self.fused is not None:   # the tile's epilogue and its pool, in the cheaper order
            after = epilogue_commutes(self.ep)
            epilogue = self._chunk_epilogue(s, epilogue_chunks(t, 1)[0],
                                            self.fused.pooled_dims(t) if after else None)
            return items + self.fused.items(epilogue, t, s.acc_slot, self.plan.regions,
                                            self.region_base, after=after)
        for chunk in epilogue_chunks(t, chunks):
            items += [[i] for i in self._chunk_epilogue(s, chunk)]
            stores = self._chunk_stores(s, chunk)
            if items:
                items[-1] += stores
            else:
                items.append(stores)
        return items

    def _replica_sums(self, s: Step) -> list[list]:
        """ALU ADDs summing a tile's replica rows into the first set."""
        nb_n, ob_n, px, rows, R = self._shape(s.tile)
        acc_base = self.region_base(s.acc_slot)
        add = ALU_OPS.by_name("ADD")
        items: list[list] = []
        for r in range(1, R):
            nest = map_nest([dim("rows", rows, dst=1, src=1)], (acc_base, acc_base + r * rows, 0),
                            kind="alu", isa=self.em.isa,
                            distance=add.timing.hazard_distance(False), src_is_acc_read=True,
                            where=self.where)
            b, e = self.em.kernel(nest.uops)
            items.append([Alu(alu_op=add.opcode, uop_begin=b, uop_end=e, **nest.fields("alu"))])
        return items

    def _chunk_epilogue(self, s: Step, chunk: tuple[int | None, int, int],
                        pix_dims: tuple[tuple[int, int], ...] | None = None) -> list:
        """The epilogue instructions of one plane group ``(nb, ob0, ob1)`` of the tile (of
        the rows ``pix_dims`` gives in each plane, :func:`~.epilogue.tile_alu`)."""
        em, t = self.em, s.tile
        nb, oa, ob_ = chunk
        nb_n, ob_n, px, rows, R = self._shape(t)
        acc_base = self.region_base(s.acc_slot)
        offset = ((0 if nb is None else nb - t.nb0) * ob_n + (oa - t.ob0)) * px
        insns: list = []
        # Collected aside (the caller interleaves them with the next tile's GEMMs); restored
        # even on an error, so a plan fallback rolls back the real instruction list.
        em_insns, em.insns = em.insns, insns
        try:
            emit_epilogue(em, self.ep, acc_base=acc_base + offset,
                          nb_n=t.nb1 - t.nb0 if nb is None else 1, ob_n=ob_ - oa, pixels=px,
                          ob0=oa, param_base=self.params_of(s.acc_slot),
                          param_starts=self.param_starts,
                          scratch_base=acc_base + R * rows + offset, scratch_stride=rows,
                          residual_loads=partial(self._residual_loads, t,
                                                 _image_blocks(t, nb), oa, ob_),
                          where=self.where, pix_dims=pix_dims)
        finally:
            em.insns = em_insns
        return insns

    def _residual_loads(self, t: Tile, nbs: range, oa: int, ob_: int, name: str,
                        base: int) -> list:
        """Loads of residual ``name``'s plane group (image blocks ``nbs``, output blocks
        ``oa:ob_`` of tile ``t``) to accumulator rows ``base``."""
        c = self.config
        rl = self.residuals[name].layout.view(c.block_out)
        px = t.pixels
        planes = [(((n - nbs[0]) * (ob_ - oa) + (o - oa)) * px, n, o)
                  for n in nbs for o in range(oa, ob_)]
        return plane_dmas(Load, mem=MemType.ACC8, sram_base=base, dram_base=self.res_elem[name],
                          **tile_planes(rl, t, planes, self.g.ow, self.out.view),
                          max_fields=self.em.max_dma)

    def _chunk_stores(self, s: Step, chunk: tuple[int | None, int, int]) -> list:
        """The stores of one plane group ``(nb, ob0, ob1)`` of the tile."""
        t = s.tile
        nb, oa, ob_ = chunk
        ob_n, px = t.ob1 - t.ob0, t.pixels
        planes = [(((n - t.nb0) * ob_n + (o - t.ob0)) * px, n, o)
                  for n in _image_blocks(t, nb) for o in range(oa, ob_)]
        return plane_dmas(Store, mem=MemType.OUT, sram_base=self.region_base(s.acc_slot),
                          dram_base=self.out_elem,
                          **tile_planes(self.out.layout.view(self.config.block_out), t, planes,
                                       self.g.ow, self.out.view),
                          max_fields=self.em.max_dma)


def tensorize_conv2d(em: Emitter, op: Conv2d | Dense, inp: TensorInfo, out: TensorInfo,
                     residuals: dict[str, TensorInfo], *, threads: int = 2,
                     plan: ConvPlan | None = None, skip_zero_blocks: bool = True,
                     tuner: SimTuner | None = None) -> ConvPlan:
    """Emit the instructions of one convolution (or dense layer) into ``em``.

    ``plan`` forces a tiling (unpipelined if its pipelined regions do not fit); otherwise
    the ranked tilings are tried in turn until one's uop kernels fit. With
    ``skip_zero_blocks`` the weight blocks of zeros are neither stored, loaded nor
    multiplied (:class:`~.layout.WeightBlocks`); a layer no tiling can run that way (its
    output blocks' terms too few to interleave, its kernels too many for the uop buffer)
    runs densely. ``tuner`` (a :class:`~.simtune.SimTuner`) may reorder the ranked
    tilings by simulating them. Returns the plan used. Instructions carry no tokens:
    :func:`~.sync.insert_dependency_tokens` adds them for the whole program.
    """
    tz = ConvTensorizer(em, op, inp, out, residuals, skip_zero_blocks)
    if not tz.g.blocks.is_dense:
        cp = em.checkpoint()
        try:
            used = tz.emit(_candidates(tz, threads, plan, tuner))
            return replace(used, density=tz.g.blocks.density)
        except CompileError:
            em.rollback(cp)
            tz = ConvTensorizer(em, op, inp, out, residuals, skip_zero_blocks=False)
    return tz.emit(_candidates(tz, threads, plan, tuner))


def _candidates(tz: ConvTensorizer, threads: int, plan: ConvPlan | None,
                tuner: SimTuner | None) -> Iterable[ConvPlan]:
    """The tilings ``tz`` tries in turn: the forced one, else the ranked ones (in the
    tuner's order when there is one; a fused pool's tilings are its own)."""
    if plan is not None:
        return tz.forced_plans(plan)
    if tuner is None or tz.pool is not None:
        return tz.ranked_plans(threads)
    return tuner.order(tz, tz.ranked_plans(threads), threads)
