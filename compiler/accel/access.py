"""Which on-chip entries and DRAM bytes each instruction of a program touches.

The dependency-token pass (:mod:`.sync`) and the verifier (:mod:`.verify`)
both work from this analysis of the instructions themselves, so they apply to
any :class:`~tessera.isa.Program`, hand-written or compiled.

Memory *spaces*: ``inp``, ``wgt`` and ``acc`` (the output buffer mirrors the
accumulator row by row, so a STORE reading ``out`` rows reads ``acc`` rows),
and DRAM. The uop buffer is private to the compute module (which executes in
order), so it never needs a token and is not tracked. DRAM is tracked only in
segments some STORE writes (elsewhere nothing can conflict), in granules of
the greatest common divisor of the element sizes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from tessera.isa import (ALU_OPS, Alu, Gemm, Instruction, Load, MemType, Program, Store,
                         module_of)
from tessera.timing import units_taken

#: Module names and their index in vector clocks.
MODULE_INDEX = {"load": 0, "compute": 1, "store": 2}
MODULE_NAMES = ("load", "compute", "store")

#: An index set: a half-open range ``(lo, hi)`` or an array of indices.
Index = Union[tuple[int, int], np.ndarray]

_SRAM_SPACE = {MemType.INP: "inp", MemType.WGT: "wgt", MemType.ACC: "acc", MemType.ACC8: "acc",
               MemType.OUT: "acc", MemType.TBL: "tbl"}

#: Which modules can touch each space (the others never conflict there).
SPACE_MODULES = {"inp": (0, 1), "wgt": (0, 1), "acc": (1, 2)}

#: Ordering lanes of the verifier: each runs its instructions one after the
#: other. The compute module is two lanes, its GEMM and ALU units
#: (``tessera.timing.COMPUTE_UNITS``); LOAD uop/acc and FINISH take both.
LANE_NAMES = ("load", "compute GEMM unit", "compute ALU unit", "store")
LANE_OF_UNIT = {"gemm": 1, "alu": 2}
#: Which lanes can touch each space.
SPACE_LANES = {"inp": (0, 1), "wgt": (0, 1), "acc": (1, 2, 3)}


def as_index(values: np.ndarray) -> Index:
    """Unique sorted indices, as a range when they are contiguous."""
    if values.size == 0:
        return (0, 0)
    lo, hi = int(values.min()), int(values.max()) + 1
    if hi - lo == values.size:
        return (lo, hi)
    u = np.unique(values)
    if u.size == hi - lo:
        return (lo, hi)
    return u


def index_size(idx: Index) -> int:
    return idx[1] - idx[0] if isinstance(idx, tuple) else int(idx.size)


def index_lo_hi(idx: Index) -> tuple[int, int]:
    if isinstance(idx, tuple):
        return idx
    return int(idx[0]), int(idx[-1]) + 1


def _select(arr: np.ndarray, idx: Index) -> np.ndarray:
    return arr[idx[0]:idx[1]] if isinstance(idx, tuple) else arr[idx]


def nest_index(base: np.ndarray, factor_out: int, iter_out: int, factor_in: int,
               iter_in: int) -> Index:
    """The set ``{b + o * factor_out + i * factor_in}`` of a loop nest, deduplicated early."""
    a = np.unique(base.astype(np.int64))
    for factor, count in ((factor_in, iter_in), (factor_out, iter_out)):
        if count > 1 and factor and a.size:
            a = np.unique((a[:, None] + factor * np.arange(count, dtype=np.int64)[None, :]).ravel())
    return as_index(a)


@dataclass
class Access:
    """What one instruction reads and writes: lists of ``(space, index set)``."""

    reads: list[tuple[str, Index]] = field(default_factory=list)
    writes: list[tuple[str, Index]] = field(default_factory=list)


class AccessAnalyzer:
    """Computes :class:`Access` of a program's instructions, in program order.

    It follows the uop buffer's contents through LOAD uop instructions, so
    :meth:`access` must see the compute module's instructions in order.
    """

    def __init__(self, program: Program) -> None:
        self.program = program
        self.config = program.config
        self.isa = program.isa
        c = program.config
        self.uop_dst = np.zeros(c.uop_depth, dtype=np.int64)
        self.uop_src = np.zeros(c.uop_depth, dtype=np.int64)
        self.uop_wgt = np.zeros(c.uop_depth, dtype=np.int64)
        self.dram = {s.name: s for s in program.segments}
        self.granule = math.gcd(*(self.isa.elem_bytes(m) for m in
                                  (MemType.INP, MemType.WGT, MemType.ACC, MemType.ACC8,
                                   MemType.OUT)))
        # Segments some STORE writes: the only DRAM where loads and stores can conflict.
        self.tracked: dict[str, tuple[int, int]] = {}
        for insn in program.instructions:
            if isinstance(insn, Store) and not insn.is_nop:
                seg = self._segment_of(insn)
                if seg is not None:
                    self.tracked[seg.name] = (seg.addr, -(-seg.size // self.granule))

    # ------------------------------------------------------------ spaces
    def space_sizes(self) -> dict[str, int]:
        c = self.config
        sizes = {"inp": c.inp_depth, "wgt": c.wgt_depth, "acc": c.acc_depth,
                 "tbl": c.table_rows}
        sizes.update({f"dram:{name}": n for name, (_, n) in self.tracked.items()})
        return sizes

    def _segment_of(self, insn: Load | Store):
        eb = self.isa.elem_bytes(insn.mem)
        addr = insn.dram_base * eb
        for seg in self.program.segments:
            if seg.addr <= addr < seg.end:
                return seg
        return None

    def _dram(self, insn: Load | Store) -> tuple[str, Index] | None:
        seg = self._segment_of(insn)
        if seg is None or seg.name not in self.tracked or insn.y_size == 0:
            return None
        eb = self.isa.elem_bytes(insn.mem)
        g = self.granule
        first = insn.dram_base * eb - seg.addr
        row = insn.x_size * eb
        if insn.y_size == 1 or insn.x_stride == insn.x_size:
            idx: Index = (first // g, (first + (insn.y_size - 1) * insn.x_stride * eb + row) // g)
        else:
            starts = first + np.arange(insn.y_size, dtype=np.int64) * insn.x_stride * eb
            idx = as_index(((starts // g)[:, None]
                            + np.arange(row // g, dtype=np.int64)[None, :]).ravel())
        return f"dram:{seg.name}", idx

    # ------------------------------------------------------------ access
    def access(self, insn: Instruction) -> Access:
        """The reads and writes of ``insn`` (call in program order)."""
        a = Access()
        if isinstance(insn, Load):
            if insn.is_nop:
                return a
            rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
            cols = insn.x_pad_0 + insn.x_size + insn.x_pad_1
            if insn.mem == MemType.UOP:
                self._load_uops(insn)
            else:
                a.writes.append((_SRAM_SPACE[insn.mem], (insn.sram_base,
                                                          insn.sram_base + rows * cols)))
            d = self._dram(insn)
            if d is not None:
                a.reads.append(d)
        elif isinstance(insn, Store):
            if insn.is_nop:
                return a
            a.reads.append(("acc", (insn.sram_base, insn.sram_base + insn.y_size * insn.x_size)))
            d = self._dram(insn)
            if d is not None:
                a.writes.append(d)
        elif isinstance(insn, (Gemm, Alu)):
            if insn.op_count == 0:
                return a
            u = slice(insn.uop_begin, insn.uop_end)
            dst = nest_index(self.uop_dst[u], insn.dst_factor_out, insn.iter_out,
                             insn.dst_factor_in, insn.iter_in)
            a.writes.append(("acc", dst))
            if insn.reset:
                return a
            if isinstance(insn, Gemm) or ALU_OPS.get(insn.alu_op).timing.reads_dst:
                a.reads.append(("acc", dst))
            if isinstance(insn, Alu) and ALU_OPS.get(insn.alu_op).reads_table:
                a.reads.append(("tbl", (0, self.config.table_rows)))
            if isinstance(insn, Gemm):
                a.reads.append(("inp", nest_index(self.uop_src[u], insn.src_factor_out,
                                                  insn.iter_out, insn.src_factor_in,
                                                  insn.iter_in)))
                a.reads.append(("wgt", nest_index(self.uop_wgt[u], insn.wgt_factor_out,
                                                  insn.iter_out, insn.wgt_factor_in,
                                                  insn.iter_in)))
            elif not insn.use_imm:
                a.reads.append(("acc", nest_index(self.uop_src[u], insn.src_factor_out,
                                                  insn.iter_out, insn.src_factor_in,
                                                  insn.iter_in)))
        return a

    def _load_uops(self, insn: Load) -> None:
        eb = self.isa.elem_bytes(MemType.UOP)
        image = self._image()
        words = []
        for y in range(insn.y_size):
            start = (insn.dram_base + y * insn.x_stride) * eb
            words.append(image[start:start + insn.x_size * eb])
        raw = np.concatenate(words) if words else np.zeros(0, np.uint8)
        vals = raw.view(np.dtype(f"<u{eb}"))
        dst, src, wgt = self.isa.decode_uop_fields(vals)
        cols = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        block = np.zeros((insn.y_pad_0 + insn.y_size + insn.y_pad_1, cols, 3), dtype=np.int64)
        block[insn.y_pad_0:insn.y_pad_0 + insn.y_size,
              insn.x_pad_0:insn.x_pad_0 + insn.x_size] = np.stack(
                  [dst, src, wgt], axis=-1).reshape(insn.y_size, insn.x_size, 3)
        flat = block.reshape(-1, 3)
        s = slice(insn.sram_base, insn.sram_base + flat.shape[0])
        self.uop_dst[s], self.uop_src[s], self.uop_wgt[s] = flat[:, 0], flat[:, 1], flat[:, 2]

    def _image(self) -> np.ndarray:
        if not hasattr(self, "_dram_image"):
            self._dram_image = self.program.dram_image()
        return self._dram_image

    def uop_fields(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The uop buffer's current (dst, src, wgt) fields."""
        return self.uop_dst, self.uop_src, self.uop_wgt


class HazardTracker:
    """Per space and module (or lane), the last instruction (its sequence number there)
    that read or wrote each entry; answers "which earlier instructions does this one
    conflict with".

    By default the rows are the three modules; ``lanes``/``space_lanes`` give
    other ordering units (the verifier's :data:`LANE_NAMES`).
    """

    def __init__(self, sizes: dict[str, int], lanes: int = 3,
                 space_lanes: dict[str, tuple[int, ...]] = SPACE_MODULES) -> None:
        self.lanes = lanes
        self.space_lanes = space_lanes
        self.last_write = {k: np.full((lanes, n), -1, dtype=np.int64) for k, n in sizes.items()}
        self.last_read = {k: np.full((lanes, n), -1, dtype=np.int64) for k, n in sizes.items()}

    def _modules(self, space: str) -> tuple[int, ...]:
        return self.space_lanes.get(space, tuple(range(self.lanes)))

    def needs(self, module: int | tuple[int, ...], access: Access) -> list[int]:
        """For each other module (lane), the latest sequence number it must have finished
        first; ``module`` may be several lanes (an instruction taking both compute units)."""
        own = module if isinstance(module, tuple) else (module,)
        need = [-1] * self.lanes
        for space, idx in access.reads:
            lw = self.last_write.get(space)
            if lw is None or index_size(idx) == 0:
                continue
            for m in self._modules(space):
                if m not in own:
                    need[m] = max(need[m], int(_select(lw[m], idx).max()))
        for space, idx in access.writes:
            lw = self.last_write.get(space)
            if lw is None or index_size(idx) == 0:
                continue
            lr = self.last_read[space]
            for m in self._modules(space):
                if m not in own:
                    need[m] = max(need[m], int(_select(lw[m], idx).max()),
                                  int(_select(lr[m], idx).max()))
        return need

    def culprit(self, module: int, access: Access, other: int, seq: int) -> str:
        """Describe which access of ``access`` conflicts with instruction ``seq`` of ``other``."""
        for kind, items in (("reads", access.reads), ("writes", access.writes)):
            for space, idx in items:
                lw = self.last_write.get(space)
                if lw is None:
                    continue
                hit = _select(lw[other], idx) == seq
                what = "written"
                if kind == "writes" and not hit.any():
                    hit = _select(self.last_read[space][other], idx) == seq
                    what = "read"
                if hit.any():
                    entries = (np.arange(*idx) if isinstance(idx, tuple) else idx)[hit]
                    return (f"{kind} {space} entries {int(entries[0])}..{int(entries[-1])} "
                            f"{what} by it")
        return "conflicts with it"

    def record(self, module: int, seq: int, access: Access) -> None:
        for space, idx in access.reads:
            if space in self.last_read:
                if isinstance(idx, tuple):
                    self.last_read[space][module, idx[0]:idx[1]] = seq
                else:
                    self.last_read[space][module, idx] = seq
        for space, idx in access.writes:
            if space in self.last_write:
                if isinstance(idx, tuple):
                    self.last_write[space][module, idx[0]:idx[1]] = seq
                else:
                    self.last_write[space][module, idx] = seq


def acc_banks(access: Access, bank_rows: int) -> frozenset[int]:
    """The accumulator banks (``HwConfig.acc_bank_rows`` rows each) ``access`` touches."""
    banks: set[int] = set()
    for space, idx in access.reads + access.writes:
        if space != "acc" or index_size(idx) == 0:
            continue
        if isinstance(idx, tuple):
            banks.update(range(idx[0] // bank_rows, (idx[1] - 1) // bank_rows + 1))
        else:
            banks.update(np.unique(idx // bank_rows).tolist())
    return frozenset(banks)


def module_index(insn: Instruction) -> int:
    return MODULE_INDEX[module_of(insn)]


def lanes_of(insn: Instruction) -> tuple[int, ...]:
    """The verifier lanes (:data:`LANE_NAMES`) ``insn`` occupies."""
    module = module_of(insn)
    if module == "compute":
        return tuple(LANE_OF_UNIT[u] for u in units_taken(insn))
    return (0,) if module == "load" else (3,)
