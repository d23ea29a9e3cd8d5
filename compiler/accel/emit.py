"""The program under construction: segments, instructions, uop kernels and DMA helpers."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera import timing
from tessera.config import HwConfig
from tessera.isa import Instruction, Load, MemType, Opcode, Program, Store, Uop, get_isa

from tessera.errors import CompileError
from .layout import ActLayout


@dataclass(frozen=True)
class Place:
    """Where a tensor or constant lives: a segment and a byte offset into it."""

    segment: str
    offset: int = 0


class Emitter:
    """Accumulates one :class:`~tessera.isa.Program`.

    Instructions are appended in program order (the sequential semantics the
    token pass works from). Each operator's uop kernels are deduplicated and
    loaded once, at the operator's start, into uop entries ``0..``.
    """

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        self.isa = get_isa(config)
        self.program = Program(config)
        self.insns: list[Instruction | None] = []
        self._kernels: dict[tuple, tuple[int, int]] = {}
        self._uops: list[Uop] = []
        self._uop_load: int | None = None
        self._op = ""
        #: ``(operator, index of its first instruction in insns)``, in order.
        self._op_starts: list[tuple[str, int]] = []
        #: Accumulator rows the previous operator's last tile used: the next operator starts
        #: its slot rotation elsewhere, so its first tile need not wait for that store.
        self.last_acc_rows: tuple[int, int] | None = None
        #: Tables resident in the ALU table memory (their bytes -> first entry), and how
        #: many were loaded (the next goes into slot ``count mod slots``).
        self._tables: dict[bytes, int] = {}
        self._tables_loaded = 0
        self.max_dma = dma_field_limits(config)

    # ----------------------------------------------------------- segments
    def add_segment(self, name: str, data: np.ndarray | int) -> str:
        names = {s.name for s in self.program.segments}
        base, k = name, 1
        while name in names:
            k += 1
            name = f"{base}#{k}"
        self.program.add_segment(name, data)
        return name

    def elem(self, place: Place, mem: MemType) -> int:
        """The element address (``dram_base``) of ``place`` for memory type ``mem``."""
        seg = self.program.segment(place.segment)
        eb = self.isa.elem_bytes(mem)
        addr = seg.addr + place.offset
        if addr % eb:
            raise CompileError(f"{place.segment}+{place.offset} is not aligned to the "
                               f"{eb}-byte elements of {mem.label}")
        return addr // eb

    def table_base(self, table: np.ndarray) -> int:
        """The first entry of ``table`` (int8 entries) in the ALU table memory.

        A table is loaded (``LOAD tbl``, a compute-module instruction) the first time the
        program needs it, into the next table-sized slot of the memory, round robin, so
        the tables of the last few operators stay resident and a segment whose layers
        share an activation loads it once. Overwriting a slot an earlier operator read is
        safe: a LOAD waits for the tensor ALU to drain (it takes every compute unit).
        """
        key = table.tobytes()
        if key in self._tables:
            return self._tables[key]
        c = self.config
        lanes = c.batch * c.block_out
        if not c.table_entries or table.size > c.table_entries or table.size % lanes:
            raise CompileError(f"operator {self._op!r} needs a {table.size}-entry table: "
                               f"config {c.name!r} has a table memory of {c.table_entries} "
                               f"entries in rows of {lanes}", op=self._op)
        slots = c.table_entries // table.size
        base = (self._tables_loaded % slots) * table.size
        self._tables_loaded += 1
        self._tables = {k: b for k, b in self._tables.items() if b != base}
        self._tables[key] = base
        rows = table.reshape(-1, lanes).astype(np.int8)
        seg = self.add_segment(f"{self._op}.table", rows)
        self.emit(Load(mem=MemType.TBL, sram_base=base // lanes,
                       dram_base=self.elem(Place(seg), MemType.TBL), y_size=1,
                       x_size=rows.shape[0], x_stride=rows.shape[0]))
        return base

    # -------------------------------------------------------- instructions
    def emit(self, *insns: Instruction) -> None:
        self.insns.extend(insns)

    def acc_origin(self, slot_rows: int, threads: int, limit: int) -> tuple[int, int]:
        """Where an operator's accumulator slots go: ``(first row, first slot)``.

        The slots are ``threads`` regions of ``slot_rows`` rows from the first row, below
        ``limit``; the first tile's slot avoids the rows the previous operator's last tile
        used (they are still being stored), so the two operators overlap.
        """
        if self.last_acc_rows is None:
            return 0, 0
        lo, hi = self.last_acc_rows
        for origin in (0, hi):
            if origin + threads * slot_rows > limit:
                continue
            for k in range(threads):
                a = origin + k * slot_rows
                if hi <= a or a + slot_rows <= lo:
                    return origin, k
        return 0, 0

    def begin_op(self, name: str) -> None:
        """Start an operator: a placeholder for its uop LOAD, an empty kernel cache."""
        self._op = name
        self._op_starts.append((name, len(self.insns)))
        self._kernels = {}
        self._uops = []
        self._uop_load = len(self.insns)
        self.insns.append(None)

    def kernel(self, uops: tuple[Uop, ...]) -> tuple[int, int]:
        """``(uop_begin, uop_end)`` of a uop kernel (deduplicated within the operator)."""
        key = tuple((u.dst, u.src, u.wgt) for u in uops)
        hit = self._kernels.get(key)
        if hit is None:
            begin = len(self._uops)
            self._uops.extend(uops)
            hit = self._kernels[key] = (begin, len(self._uops))
        return hit

    def checkpoint(self) -> tuple:
        """State to :meth:`rollback` to (instructions, kernels, segments, the operator begun)."""
        return (len(self.insns), dict(self._kernels), len(self._uops),
                len(self.program.segments), len(self._op_starts), self._op, self._uop_load)

    def rollback(self, cp: tuple) -> None:
        n_insns, kernels, n_uops, n_segs, n_ops, self._op, self._uop_load = cp
        del self.insns[n_insns:]
        self._kernels = kernels
        del self._uops[n_uops:]
        del self.program.segments[n_segs:]
        del self._op_starts[n_ops:]

    @property
    def uop_count(self) -> int:
        return len(self._uops)

    def end_op(self) -> None:
        """Place the operator's uop kernels and fill in its uop LOAD."""
        if self._uops:
            if len(self._uops) > self.config.uop_depth:
                raise CompileError(f"{self._op!r}: its uop kernels need {len(self._uops)} "
                                   f"entries but the uop buffer has {self.config.uop_depth}",
                                   op=self._op)
            seg = self.add_segment(f"{self._op}.uops", self.isa.encode_uops(self._uops))
            n = len(self._uops)
            self.insns[self._uop_load] = Load(mem=MemType.UOP, dram_base=self.elem(
                Place(seg), MemType.UOP), y_size=1, x_size=n, x_stride=n)
        self._uop_load = None

    def finish(self) -> Program:
        """The program: the instructions emitted, then FINISH."""
        from tessera.isa import Finish
        self.program.instructions = [i for i in self.insns if i is not None] + [Finish()]
        return self.program

    def op_bounds(self) -> list[tuple[str, int, int]]:
        """``(operator, first, end)``: each operator's instructions in the finished program
        (before tokens; see :func:`~.sync.insert_dependency_tokens` for the mapping after)."""
        kept = np.cumsum([0] + [i is not None for i in self.insns])
        starts = [(name, int(kept[k])) for name, k in self._op_starts]
        ends = [s for _, s in starts[1:]] + [int(kept[-1])]
        return [(name, s, e) for (name, s), e in zip(starts, ends)]


def dma_cycles(config: HwConfig, insn: Load | Store) -> int:
    """Cycles of one LOAD/STORE alone on its port (docs/timing.md, from tessera.timing)."""
    cost = timing.dma_cost(config, insn)
    cycles = timing.DMA_SETUP_CYCLES + cost.pad_cycles
    if cost.data_cycles:
        cycles += config.dram_latency + cost.data_cycles
    return cycles


def dma_field_limits(config: HwConfig) -> dict[str, int]:
    """The largest value of each DMA field a plane's DMAs are limited by (the ISA's)."""
    lay = get_isa(config).layouts[Opcode.LOAD]
    return {f: lay.field(f).hi for f in ("y_size", "x_size", "x_stride", "y_pad_0")}


def plane_dmas(kind: type, *, mem: MemType, sram_base: int, dram_base: int,
               planes: list[tuple[int, int]], rows: int, cols: int, row_stride: int,
               pads: tuple[int, int, int, int] = (0, 0, 0, 0), pad_value: int = 0,
               elem_stride: int = 1, max_fields: dict[str, int]) -> list[Load | Store]:
    """DMAs moving ``len(planes)`` 2-D planes of ``rows x cols`` elements.

    ``planes`` lists ``(sram offset, dram offset)`` of each plane; the SRAM side
    of a plane is contiguous (with its padding of ``pad_value``, for loads), the DRAM side
    has rows ``row_stride`` elements apart, and a row's elements ``elem_stride`` apart
    (:attr:`~.layout.ActLayout.pixel_stride`). Planes equally spaced on both
    sides and without padding merge into fewer DMAs, when the fields allow.
    """
    if elem_stride != 1:
        return _strided_plane_dmas(kind, mem=mem, sram_base=sram_base, dram_base=dram_base,
                                   planes=planes, rows=rows, cols=cols, row_stride=row_stride,
                                   pads=pads, pad_value=pad_value, elem_stride=elem_stride,
                                   max_fields=max_fields)
    y0, y1, x0, x1 = pads
    out: list[Load | Store] = []
    padded = any(pads)
    contiguous_rows = row_stride == cols or rows == 1
    if not padded and contiguous_rows and len(planes) > 1 and rows * cols <= max_fields["x_size"]:
        # Each plane is one contiguous run: a plane per DMA row.
        ds = planes[1][1] - planes[0][1]
        ss = planes[1][0] - planes[0][0]
        uniform = all(p[1] - q[1] == ds and p[0] - q[0] == ss for q, p in zip(planes, planes[1:]))
        if uniform and ss == rows * cols and 0 <= ds <= max_fields["x_stride"] and \
                len(planes) <= max_fields["y_size"]:
            return [kind(mem=mem, sram_base=sram_base + planes[0][0],
                         dram_base=dram_base + planes[0][1], y_size=len(planes),
                         x_size=rows * cols, x_stride=ds)]
    for s_off, d_off in planes:
        if not padded and contiguous_rows and rows * cols <= max_fields["x_size"]:
            out.append(kind(mem=mem, sram_base=sram_base + s_off, dram_base=dram_base + d_off,
                            y_size=1, x_size=rows * cols, x_stride=rows * cols))
            continue
        if row_stride > max_fields["x_stride"] or rows > max_fields["y_size"]:
            raise CompileError(f"a DMA row stride of {row_stride} elements or {rows} rows "
                               f"exceed the DMA fields (x_stride <= {max_fields['x_stride']}, "
                               f"y_size <= {max_fields['y_size']})")
        fields = dict(y_pad_0=y0, y_pad_1=y1, x_pad_0=x0, x_pad_1=x1,
                      pad_value=pad_value if padded else 0) if kind is Load else {}
        out.append(kind(mem=mem, sram_base=sram_base + s_off, dram_base=dram_base + d_off,
                        y_size=rows, x_size=cols, x_stride=row_stride, **fields))
    return out


def _strided_plane_dmas(kind: type, *, mem: MemType, sram_base: int, dram_base: int,
                        planes: list[tuple[int, int]], rows: int, cols: int, row_stride: int,
                        pads: tuple[int, int, int, int], pad_value: int, elem_stride: int,
                        max_fields: dict[str, int]) -> list[Load | Store]:
    """:func:`plane_dmas` for elements ``elem_stride`` apart: a DMA per plane row, whose
    ``cols`` elements are its rows of one element (the row's x padding is then its y
    padding), and the plane's top and bottom padding as DMAs that only pad."""
    y0, y1, x0, x1 = pads
    width = x0 + cols + x1
    if elem_stride > max_fields["x_stride"] or cols > max_fields["y_size"]:
        raise CompileError(f"a row of {cols} elements {elem_stride} apart exceeds the DMA "
                           f"fields (x_stride <= {max_fields['x_stride']}, y_size <= "
                           f"{max_fields['y_size']})")
    fill = dict(pad_value=pad_value) if kind is Load and any(pads) else {}
    out: list[Load | Store] = []
    for s_off, d_off in planes:
        sram = sram_base + s_off
        if y0:
            out.append(Load(mem=mem, sram_base=sram, dram_base=dram_base + d_off, y_size=0,
                            x_size=width, x_stride=width, y_pad_0=y0, **fill))
        for r in range(rows):
            pad = dict(y_pad_0=x0, y_pad_1=x1, **fill) if kind is Load else {}
            out.append(kind(mem=mem, sram_base=sram + (y0 + r) * width,
                            dram_base=dram_base + d_off + r * row_stride, y_size=cols,
                            x_size=1, x_stride=elem_stride, **pad))
        if y1:
            out.append(Load(mem=mem, sram_base=sram + (y0 + rows) * width,
                            dram_base=dram_base + d_off, y_size=0, x_size=width,
                            x_stride=width, y_pad_0=y1, **fill))
    return out


@dataclass
class TensorInfo:
    """A tensor's place and layout, as the builder hands them to the tensorizers."""

    name: str
    layout: ActLayout
    place: Place
    #: Set when an operator writes one phase of the tensor (a transposed convolution's
    #: sub-pixel decomposition): ``(sy, sx, ay, ax)`` puts pixel ``(y, x)`` of the
    #: operator's output at ``(sy*y + ay, sx*x + ax)`` of ``layout``.
    view: tuple[int, int, int, int] | None = None

