"""Shared machinery of the operators that run on the tensor ALU (pooling, elementwise).

Their data enters the accumulator through ``LOAD acc8`` (int8 values sign
extended, executed by the compute module), the ALU computes in place, the
epilogue stages follow and the tile is stored. The output is cut into tiles of
``nb_t`` image blocks x ``cb_t`` channel blocks x ``oh_t`` rows x ``ow_t``
columns; with two virtual threads consecutive tiles use two accumulator slots
so the store of one tile overlaps the next tile's work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from tessera.config import HwConfig
from tessera.isa import ALU_OPS, Alu, Load, MemType, Store

from .emit import Emitter, TensorInfo, plane_dmas
from .epilogue import EpiloguePlan, emit_epilogue
from tessera.errors import CompileError
from .layout import ActLayout, ceil_div
from .nest import Dim, dim, map_nest


@dataclass(frozen=True)
class AluPlan:
    """Tile sizes of an ALU operator and its thread count."""

    nb_t: int
    cb_t: int
    oh_t: int
    ow_t: int
    threads: int = 2

    def describe(self, config: HwConfig) -> str:
        return (f"{self.cb_t * config.block_out}ch x {self.oh_t}x{self.ow_t}px tiles, "
                f"{self.threads} thread(s)")


@dataclass(frozen=True)
class AluTile:
    nb0: int
    nb1: int
    cb0: int
    cb1: int
    oy0: int
    oy1: int
    ox0: int
    ox1: int

    @property
    def rows(self) -> int:
        return (self.nb1 - self.nb0) * (self.cb1 - self.cb0) * (self.oy1 - self.oy0) * (
            self.ox1 - self.ox0)

    @property
    def pixels(self) -> int:
        """Output pixels per (image block, channel block) plane."""
        return (self.oy1 - self.oy0) * (self.ox1 - self.ox0)


def plan_alu_tiles(name: str, out: tuple[int, int, int, int], config: HwConfig, threads: int,
                   slot_rows: Callable[[int, int, int, int], int], reserved: int) -> AluPlan:
    """The largest tiles whose slot (``slot_rows(nb_t, cb_t, oh_t, ow_t)`` rows) fits
    ``threads`` times beside ``reserved`` parameter rows (analytic; fewest tiles wins)."""
    NB, CB, OH, OW = out

    def sizes(total):
        return sorted({ceil_div(total, k) for k in range(1, total + 1)}, reverse=True)
    best, best_key = None, None
    budget = config.acc_depth - reserved
    for nb_t in sizes(NB)[:3]:
        for cb_t in sizes(CB):
            for ow_t in sizes(OW):
                for oh_t in sizes(OH):
                    if threads * slot_rows(nb_t, cb_t, oh_t, ow_t) > budget:
                        continue
                    tiles = ceil_div(NB, nb_t) * ceil_div(CB, cb_t) * ceil_div(OH, oh_t) * \
                        ceil_div(OW, ow_t)
                    key = (tiles, -ow_t)
                    if best_key is None or key < best_key:
                        best, best_key = AluPlan(nb_t, cb_t, oh_t, ow_t, threads), key
                    break
    if best is None:
        raise CompileError(f"{name}: even a one-pixel tile needs {slot_rows(1, 1, 1, 1)} "
                           f"accumulator rows per thread ({threads} thread(s)) beside "
                           f"{reserved} parameter rows, but the accumulator has "
                           f"{config.acc_depth}; use threads=1 or a larger config")
    return best


def alu_tiles(out: tuple[int, int, int, int], p: AluPlan) -> list[AluTile]:
    NB, CB, OH, OW = out

    def ranges(total, size):
        return [(a, min(total, a + size)) for a in range(0, total, size)]
    return [AluTile(*nb, *cb, *oy, *ox) for nb in ranges(NB, p.nb_t) for cb in ranges(CB, p.cb_t)
            for oy in ranges(OH, p.oh_t) for ox in ranges(OW, p.ow_t)]


def tile_slots(em: Emitter, out: tuple[int, int, int, int], plan: AluPlan, slot: int,
               limit: int) -> Iterator[tuple[AluTile, int]]:
    """Each tile of ``out`` with the first row of its accumulator slot: ``plan.threads``
    slots of ``slot`` rows below ``limit`` in rotation (:meth:`Emitter.acc_origin`), each
    recorded in ``em.last_acc_rows`` as its tile starts."""
    origin, first = em.acc_origin(slot, plan.threads, limit)
    for k, t in enumerate(alu_tiles(out, plan)):
        base = origin + ((k + first) % plan.threads) * slot
        em.last_acc_rows = (base, base + slot)
        yield t, base


def emit_tile_epilogue(em: Emitter, ep: EpiloguePlan, t: AluTile, acc_base: int, *,
                       param_base: int, param_starts: list[int], scratch_base: int,
                       scratch_stride: int, out_layout: ActLayout, out_elem: int,
                       residuals: dict[str, TensorInfo], where: str) -> None:
    """Emit the epilogue of tile ``t`` (rows from ``acc_base``; its scratch groups
    ``scratch_stride`` rows apart from ``scratch_base``, where residual tensors, looked up in
    ``residuals``, load) and the tile's stores."""
    c = em.config

    def residual_loads(name: str, rbase: int) -> list[Load]:
        rl = residuals[name].layout.view(c.block_out)
        return plane_loads(em, rl, em.elem(residuals[name].place, MemType.ACC8), rbase, t,
                           t.oy0, t.oy1, t.ox0, t.ox1)

    emit_epilogue(em, ep, acc_base=acc_base, nb_n=t.nb1 - t.nb0, ob_n=t.cb1 - t.cb0,
                  pixels=t.pixels, ob0=t.cb0, param_base=param_base,
                  param_starts=param_starts, scratch_base=scratch_base,
                  scratch_stride=scratch_stride, residual_loads=residual_loads, where=where)
    em.emit(*tile_stores(em, out_layout.view(c.block_out), out_elem, acc_base, t))


def alu_insn(em: Emitter, op_name: str, dims: list[Dim], base: tuple[int, int], *,
             use_imm: bool, imm: int = 0, where: str) -> Alu:
    """One ALU instruction over ``dims`` (dst/src offsets), mapped to loops and uops."""
    op = ALU_OPS.by_name(op_name)
    nest = map_nest(dims, (base[0], base[1], 0), kind="alu", isa=em.isa,
                    distance=op.timing.hazard_distance(use_imm), src_is_acc_read=not use_imm,
                    where=where)
    b, e = em.kernel(nest.uops)
    return Alu(alu_op=op.opcode, use_imm=use_imm, imm=imm, uop_begin=b, uop_end=e,
               **nest.fields("alu"))


def reset_insn(em: Emitter, base: int, rows: int, where: str) -> Alu:
    """Zero ``rows`` accumulator rows from ``base`` (an ALU reset: GEMM reset timing)."""
    nest = map_nest([dim("rows", rows, dst=1)], (base, 0, 0), kind="alu", isa=em.isa,
                    distance=1, where=where)
    b, e = em.kernel(nest.uops)
    return Alu(reset=True, uop_begin=b, uop_end=e, **nest.fields("alu"))


def plane_loads(em: Emitter, layout: ActLayout, elem_base: int, sram_base: int, t: AluTile,
                y0: int, y1: int, x0: int, x1: int, mem: MemType = MemType.ACC8) -> list[Load]:
    """ACC8 loads of rows ``y0..y1`` x columns ``x0..x1`` of every (nb, cb) plane of tile ``t``,
    into ``[nb][cb][y][x]`` from ``sram_base``."""
    rows, cols = y1 - y0, x1 - x0
    planes = [(((nb - t.nb0) * (t.cb1 - t.cb0) + (cb - t.cb0)) * rows * cols,
               layout.entry(nb, cb, y0, x0))
              for nb in range(t.nb0, t.nb1) for cb in range(t.cb0, t.cb1)]
    return plane_dmas(Load, mem=mem, sram_base=sram_base, dram_base=elem_base, planes=planes,
                      rows=rows, cols=cols, row_stride=layout.row_stride,
                      elem_stride=layout.pixel_stride, max_fields=em.max_dma)


def tile_stores(em: Emitter, layout: ActLayout, elem_base: int, acc_base: int,
                t: AluTile) -> list[Store]:
    rows, cols = t.oy1 - t.oy0, t.ox1 - t.ox0
    planes = [(((nb - t.nb0) * (t.cb1 - t.cb0) + (cb - t.cb0)) * rows * cols,
               layout.entry(nb, cb, t.oy0, t.ox0))
              for nb in range(t.nb0, t.nb1) for cb in range(t.cb0, t.cb1)]
    return plane_dmas(Store, mem=MemType.OUT, sram_base=acc_base, dram_base=elem_base,
                      planes=planes, rows=rows, cols=cols, row_stride=layout.row_stride,
                      elem_stride=layout.pixel_stride,
                      max_fields=em.max_dma)


def check_acc8_layout(layout: ActLayout, config: HwConfig, where: str, name: str) -> None:
    if layout.block % config.block_out or config.out_width != 8:
        raise CompileError(f"{where}: tensor {name!r} must be int8 in blocks of "
                           f"{config.block_out} channels to load into the accumulator (acc8)")
