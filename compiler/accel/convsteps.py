"""Cycles of a convolution's single instructions and steps on a config: its DMAs, GEMMs
and ALU operations, a step's input and weight loads and kernel terms, the layer's GEMM
work; and the closed-form estimate of a tiling built from them (:func:`quick_estimate`,
which pre-ranks tilings before :mod:`.convcost`'s pipeline model costs the best). Every
duration from :mod:`tessera.timing` (through :func:`~.emit.dma_cycles`).
"""
from __future__ import annotations

from functools import lru_cache

from tessera import timing
from tessera.config import HwConfig
from tessera.isa import ALU_OPS, Alu, Gemm, Load, MemType, Store

from .convplan import ConvGeom, ConvPlan, InTile, Tile, buffer_slots, input_tile, tile_replicas
from .convweights import step_weights
from .emit import dma_cycles, dma_field_limits, plane_dmas
from .epilogue import EpiloguePlan
from .layout import ceil_div


@lru_cache(maxsize=65536)
def load_cycles(config: HwConfig, mem: MemType, y: int, x: int, stride: int,
                 pads: tuple[int, int, int, int]) -> int:
    """Cycles of a LOAD of ``y x x`` elements of ``mem`` (row pitch ``stride``, DMA pads)."""
    return dma_cycles(config, Load(mem=mem, y_size=y, x_size=x, x_stride=stride,
                                   y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2],
                                   x_pad_1=pads[3]))


@lru_cache(maxsize=65536)
def store_cycles(config: HwConfig, y: int, x: int, stride: int) -> int:
    """Cycles of a STORE of ``y x x`` entries (row pitch ``stride``)."""
    return dma_cycles(config, Store(y_size=y, x_size=x, x_stride=stride))


@lru_cache(maxsize=65536)
def sub_block_loads(config: HwConfig, mem: MemType, rows: int, cols: int, row_stride: int,
                    stride: int, pads: tuple[int, int, int, int]) -> tuple[int, int]:
    """``(cycles, DMAs)`` loading a ``rows x cols`` plane of sub-blocks ``stride``
    elements apart (pads ``(y0, y1, x0, x1)``): the DMAs :func:`~.emit.plane_dmas` emits
    for it (a DMA per row, and one per padding band above and below)."""
    dmas = plane_dmas(Load, mem=mem, sram_base=0, dram_base=0, planes=[(0, 0)], rows=rows,
                      cols=cols, row_stride=row_stride, pads=pads, elem_stride=stride,
                      max_fields=dma_field_limits(config))
    return sum(dma_cycles(config, d) for d in dmas), len(dmas)


@lru_cache(maxsize=4096)
def gemm_op_cycles(ops: int) -> int:
    """Cycles of a GEMM of ``ops`` operations."""
    return timing.gemm_cycles(Gemm(uop_begin=0, uop_end=1, iter_out=ops))


@lru_cache(maxsize=4096)
def alu_op_cycles(op: str, use_imm: bool, ops: int) -> int:
    """Cycles of an ALU ``op`` (immediate or tensor operand) over ``ops`` rows."""
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
    if g.in_stride > 1:
        cycles, dmas = sub_block_loads(config, MemType.INP, rows, cols,
                                       g.w * g.row_step * g.in_stride, g.in_stride, it.pads)
        return planes * cycles, planes * dmas
    if (g.NB > 1 and g.h == g.w == 1 and planes > 1 and not any(it.pads)
            and (it.c1 - it.c0 == g.CB or it.nb1 - it.nb0 == 1)):
        return load_cycles(config, MemType.INP, planes, 1, 1, (0, 0, 0, 0)), 1
    return planes * load_cycles(config, MemType.INP, rows, cols, g.w * g.row_step,
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
    return sum(load_cycles(config, MemType.WGT, r.obs, r.count, r.stride, (0, 0, 0, 0))
               for r in step_weights(g, ob0, ob1, j0, j1).runs)


@lru_cache(maxsize=4096)
def reset_cycles(rows: int) -> int:
    """Cycles of an ALU reset of ``rows`` accumulator rows."""
    return timing.alu_cycles(Alu(reset=True, uop_begin=0, uop_end=1, iter_out=rows))



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
    drain = gemm_op_cycles(1) - 1
    epi = sum(alu_op_cycles(s.op, s.imm is not None, tile_rows) for s in ep.steps
              if s.kind == "alu")
    reps = tile_replicas(config, g, p.nb_t, p.ob_t, p.oh_t * p.ow_t)
    epi += (alu_op_cycles("MOV", ep.init.imm is not None, tile_rows) if ep.init is not None
            else reset_cycles(tile_rows * reps))
    # A residual load into the accumulator holds both units: the GEMMs wait for it too.
    res_load = len(ep.residuals) * load_cycles(config, MemType.ACC8, 1, tile_rows, tile_rows,
                                                (0, 0, 0, 0))
    epi += res_load
    # Edge tiles are smaller than tile_rows: charging every tile the full epilogue slightly
    # overestimates, equally for similar tilings.
    gemm = total_gemm_ops(g) + steps * drain + n_tiles * res_load
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
    store = store_cycles(config, 1, tile_rows, tile_rows)
    if T == 1:
        return compute + load + n_tiles * store, 0.0
    fill_tail = l_in + l_w + store + exposed
    body = compute - exposed
    return (max(body / outer, first) + max(body - body / outer, load - first) + fill_tail,
            fill_tail)
