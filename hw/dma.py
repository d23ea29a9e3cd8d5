"""The 2-D strided DMA engines behind LOAD and STORE (docs/timing.md, "LOAD and STORE").

:class:`~.dma_reader.DmaReader` (in :mod:`.dma_reader`) moves a block from DRAM into one
on-chip buffer (padded with the instruction's ``pad_value``), :class:`~.dma_writer.DmaWriter`
(in :mod:`.dma_writer`) moves a block of the output buffer to DRAM. Both
take one LOAD/STORE instruction at a time and reproduce ``Datapath.load`` /
``Datapath.store`` of the simulator bit for bit and
:func:`tessera.timing.dma_cost` cycle for cycle when the DRAM is uncontended.

Geometry: an element of ``eb`` bytes is one SRAM entry; the bus carries ``B``
bytes per beat. Both are powers of two, so either an entry spans ``eb / B``
whole beats (rows are then beat-aligned), or a beat holds ``B / eb`` entries
("lanes") and a row may start and end in the middle of a beat. Each row is
read or written as the bus-aligned beats that cover it, split into bursts of
at most ``max_burst_beats`` that never cross a 4 KiB boundary.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from tessera.config import HwConfig
from tessera.isa import MemType, get_isa
from tessera.isa.encoding import DMA_SIZE_BITS, DRAM_ADDR_BITS
from tessera.isa.instructions import LOAD_MODULE
from tessera.regmap import (AXI_ADDR_BITS, AXI_BOUNDARY_BYTES, AXI_LEN_BITS, ERROR_CODE_BITS,
                            ErrorCode)

from .layouts import mem_layout
from .ports import AXI_BURST_INCR, axi_signature, sram_read_signature, sram_write_signature

__all__ = ["ELEM_ADDR_BITS", "SOFT_MULTIPLIER", "BurstAddressGenerator", "DmaEngine",
           "EngineLogic", "load_modules", "sram_addr_bits"]

#: A row's element address dram_base + y * x_stride may exceed 32 bits before the
#: address check has rejected the instruction (or one row past the last).
ELEM_ADDR_BITS = DRAM_ADDR_BITS + DMA_SIZE_BITS + 1


def _log2(n: int) -> int:
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1


def load_modules(config: HwConfig) -> dict[MemType, str]:
    """The memory types a LOAD may write on ``config``, with the module that runs each
    (``LOAD_MODULE``; tbl only with a table memory: elsewhere the fetch rejects it with
    ``ErrorCode.MEM_TYPE``, as ``check_instruction`` does)."""
    return {mt: module for mt, module in LOAD_MODULE.items()
            if mt != MemType.TBL or config.table_entries}


def sram_addr_bits(depth: int) -> int:
    """Address width of a buffer of ``depth`` entries (as ``HwConfig`` sizes its indices)."""
    return max(1, (depth - 1).bit_length())


#: Attributes of a signal holding a product that should be built from LUTs (yosys
#: synth_xilinx through tessera.hw.synth.resources, and Vivado, honour ``use_dsp``).
SOFT_MULTIPLIER = {"use_dsp": "no"}


class _Geometry:
    """Element/bus arithmetic of one memory type, as Amaranth expressions."""

    def __init__(self, config: HwConfig, eb: int) -> None:
        self.eb = eb
        self.bus = config.bus_bytes
        self.max_burst = config.max_burst_beats
        if self.bus > AXI_BOUNDARY_BYTES:
            raise ValueError(f"bus_bytes {self.bus} exceeds the AXI {AXI_BOUNDARY_BYTES}-byte "
                             "burst boundary")
        self.log2_eb = _log2(eb)
        self.log2_bus = _log2(self.bus)
        #: Entries per beat (1 when an entry fills one or more beats).
        self.lanes = max(1, self.bus // eb)
        self.log2_lanes = _log2(self.lanes)
        #: Beats per entry (1 when an entry fits in a beat).
        self.beats_per_entry = max(1, eb // self.bus)
        #: A row of 2**16 - 1 entries, plus one beat for an unaligned start.
        self.row_beat_bits = DMA_SIZE_BITS + _log2(self.beats_per_entry) + 1

    def byte_addr(self, elem):
        return Cat(Const(0, self.log2_eb), elem)

    def beat_addr(self, elem):
        """The bus-aligned address of the beat holding the first byte of element ``elem``."""
        byte = self.byte_addr(elem)
        return Cat(Const(0, self.log2_bus), byte[self.log2_bus:])

    def lane(self, elem):
        """The lane of element ``elem`` inside its beat."""
        return elem[:self.log2_lanes]

    def row_beats(self, elem, x_size):
        """Beats covering ``x_size`` elements from element ``elem`` (``beats_y`` of timing.md)."""
        if self.lanes == 1:
            return x_size << _log2(self.beats_per_entry)
        offset = Cat(Const(0, self.log2_eb), self.lane(elem))
        return (offset + (x_size << self.log2_eb) + (self.bus - 1)) >> self.log2_bus

    def at_boundary_end(self, beat_addr):
        """The beat at ``beat_addr`` is the last before a 4 KiB boundary."""
        top = _log2(AXI_BOUNDARY_BYTES)
        if self.log2_bus >= top:
            return Const(1)
        return beat_addr[self.log2_bus:top] == (AXI_BOUNDARY_BYTES >> self.log2_bus) - 1

    def dram_error(self, ins):
        """``(statements, flag)``: the flag is set if a byte of the rows lies at or above 2**32."""
        y_last = Signal(DMA_SIZE_BITS)
        end = Signal(ELEM_ADDR_BITS + 1)          # one past the last element of the last row
        # A once-per-instruction check: LUTs, so the DSPs stay with the GEMM core and ALU.
        span = Signal(2 * DMA_SIZE_BITS, attrs=SOFT_MULTIPLIER)
        stmts = [y_last.eq(ins.y_size - 1), span.eq(y_last * ins.x_stride),
                 end.eq(ins.dram_base + span + ins.x_size)]
        return stmts, (ins.y_size != 0) & (self.byte_addr(end) > (1 << AXI_ADDR_BITS))


class BurstAddressGenerator(wiring.Component):
    """Splits the rows of a 2-D transfer into AXI bursts, one address handshake each.

    ``init`` (one cycle) loads the transfer: ``y_size`` rows of ``x_size``
    elements of ``elem_bytes`` bytes, row ``y`` at element ``base + y *
    stride``. While ``run`` is high the generator offers one burst per cycle
    on ``valid``/``addr``/``len`` (AXI ``arlen``/``awlen`` encoding) and moves
    on when ``ready``; ``done`` rises once the last burst has been accepted.
    Outputs depend on registers only (never on ``ready``).

    With ``pieces`` > 1 (elements of whole beats, a multiple of ``pieces`` each), the
    generator walks the ``piece``-th of the ``pieces`` equal parts of every element
    instead of whole rows: one port's share of a LOAD read over several
    (:func:`tessera.timing.load_ports`).
    """

    def __init__(self, config: HwConfig, elem_bytes: int, pieces: int = 1,
                 piece: int = 0) -> None:
        self._geo = _Geometry(config, elem_bytes)
        self.pieces, self.piece = pieces, piece
        if pieces > 1 and (self._geo.lanes > 1 or self._geo.beats_per_entry % pieces):
            raise ValueError(f"an element of {elem_bytes} bytes is not {pieces} pieces of "
                             f"whole {config.bus_bytes}-byte beats")
        super().__init__({
            "init": In(1), "base": In(DRAM_ADDR_BITS), "stride": In(DMA_SIZE_BITS),
            "x_size": In(DMA_SIZE_BITS), "y_size": In(DMA_SIZE_BITS),
            "run": In(1), "valid": Out(1), "ready": In(1),
            "addr": Out(AXI_ADDR_BITS), "len": Out(AXI_LEN_BITS), "done": Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self._geo
        elem = Signal(ELEM_ADDR_BITS)
        beat = Signal(ELEM_ADDR_BITS + g.log2_eb)
        rem = Signal(g.row_beat_bits)          # beats of the current row not yet requested
        rows = Signal(DMA_SIZE_BITS)
        x_size = Signal(DMA_SIZE_BITS)
        stride = Signal(DMA_SIZE_BITS)

        to_boundary = Signal(range((AXI_BOUNDARY_BYTES >> g.log2_bus) + 1))
        if g.log2_bus >= _log2(AXI_BOUNDARY_BYTES):
            m.d.comb += to_boundary.eq(1)
        else:
            m.d.comb += to_boundary.eq((AXI_BOUNDARY_BYTES >> g.log2_bus)
                                       - beat[g.log2_bus:_log2(AXI_BOUNDARY_BYTES)])
        n = Signal(range(g.max_burst + 1))
        m.d.comb += n.eq(g.max_burst)
        with m.If(rem < g.max_burst):
            m.d.comb += n.eq(rem)
        with m.If((to_boundary < rem) & (to_boundary < g.max_burst)):
            m.d.comb += n.eq(to_boundary)

        m.d.comb += [
            self.valid.eq(self.run & ~self.done),
            self.addr.eq(beat),
            self.len.eq(n - 1),
        ]

        with m.If(self.init):
            m.d.sync += [
                rows.eq(self.y_size), x_size.eq(self.x_size), stride.eq(self.stride),
                self.done.eq((self.y_size == 0) | (self.x_size == 0)),
            ]
        step = self.valid & self.ready
        with m.If(step & (rem != n)):
            m.d.sync += [beat.eq(beat + (n << g.log2_bus)), rem.eq(rem - n)]
        if self.pieces == 1:
            self._walk_rows(m, elem, beat, rem, rows, x_size, stride, step & (rem == n))
        else:
            self._walk_pieces(m, elem, beat, rem, rows, x_size, stride, step & (rem == n))
        return m

    def _walk_rows(self, m, elem, beat, rem, rows, x_size, stride, row_done) -> None:
        """Whole rows: each row's beats in turn, the next row ``stride`` elements on."""
        g = self._geo
        with m.If(self.init):
            m.d.sync += [elem.eq(self.base), beat.eq(g.beat_addr(self.base)),
                         rem.eq(g.row_beats(self.base, self.x_size))]
        with m.Elif(row_done):
            next_elem = elem + stride
            m.d.sync += [
                elem.eq(next_elem), beat.eq(g.beat_addr(next_elem)),
                rem.eq(g.row_beats(next_elem, x_size)), rows.eq(rows - 1),
            ]
            with m.If(rows == 1):
                m.d.sync += self.done.eq(1)

    def _walk_pieces(self, m, elem, beat, rem, rows, x_size, stride, piece_done) -> None:
        """One piece of each element: the row's elements in turn, then the next row."""
        g = self._geo
        piece_beats = g.beats_per_entry // self.pieces
        offset = self.piece * piece_beats * g.bus            # inside the element

        def piece_addr(e):
            return Cat(Const(offset, g.log2_eb), e)

        row_elem = Signal(ELEM_ADDR_BITS)
        x_left = Signal(DMA_SIZE_BITS)
        with m.If(self.init):
            m.d.sync += [elem.eq(self.base), row_elem.eq(self.base), x_left.eq(self.x_size),
                         beat.eq(piece_addr(self.base)), rem.eq(piece_beats)]
        with m.Elif(piece_done):
            m.d.sync += rem.eq(piece_beats)
            with m.If(x_left == 1):
                next_row = row_elem + stride
                m.d.sync += [elem.eq(next_row), row_elem.eq(next_row), x_left.eq(x_size),
                             beat.eq(piece_addr(next_row)), rows.eq(rows - 1)]
                with m.If(rows == 1):
                    m.d.sync += self.done.eq(1)
            with m.Else():
                m.d.sync += [elem.eq(elem + 1), x_left.eq(x_left - 1),
                             beat.eq(piece_addr(elem + 1))]


class DmaEngine(wiring.Component):
    """What both engines share: the buffer's geometry and the start/busy/error,
    AXI and SRAM ports (a reader writes the buffer, a writer reads it)."""

    def __init__(self, config: HwConfig, mem: MemType, axi_id: int, *, read: bool,
                 also: tuple[MemType, ...] = (), ports: int = 1) -> None:
        isa = get_isa(config)
        self.config = config
        self.mem = MemType(mem)
        #: Every memory type the engine serves: ``mem`` and those of ``also`` (same element).
        self.mems = (self.mem,) + tuple(MemType(mt) for mt in also)
        self.axi_id = axi_id
        self.elem_bytes = isa.elem_bytes(self.mem)
        if any(isa.elem_bytes(mt) != self.elem_bytes for mt in self.mems):
            raise ValueError(f"one DMA engine serves memory types of one element size, "
                             f"not {[mt.label for mt in self.mems]}")
        self.entry_bits = 8 * self.elem_bytes
        #: Entries of each memory type's buffer; ``depth`` the largest.
        self.depths = {mt: isa.depth(mt) for mt in self.mems}
        self.depth = max(self.depths.values())
        self.addr_bits = sram_addr_bits(self.depth)
        self._geo = _Geometry(config, self.elem_bytes)
        sram = sram_write_signature if read else sram_read_signature
        axi = axi_signature(8 * config.bus_bytes, read=read, write=not read)
        #: The AXI masters' member names: ``axi``, then ``axi1``... for a reader over
        #: several ports (port ``p`` reads the ``p``-th piece of every entry).
        self.axi_names = ("axi",) + tuple(f"axi{p}" for p in range(1, ports))
        super().__init__({
            "start": In(1), "insn": In(mem_layout(config)),
            "busy": Out(1), "error": Out(ERROR_CODE_BITS),
            **{name: Out(axi) for name in self.axi_names},
            "sram": Out(sram(self.addr_bits, self.entry_bits)),
        })

    @property
    def axis(self) -> list:
        """The engine's AXI masters, one per port it reads over."""
        return [getattr(self, name) for name in self.axi_names]


class EngineLogic:
    """One elaboration of a DMA engine: its address generator (submodule ``channel``, the
    AXI address channel it drives), the latched instruction and its DRAM address check,
    and the FSM steps both engines share. Signals are attributes of the engine's logic;
    those made in pairs keep the statement form (locals or attributes) that gives their
    Verilog names (Amaranth's tracer names them from it)."""

    def __init__(self, eng: DmaEngine, m: Module, channel: str) -> None:
        self.eng, self.m, self.g = eng, m, eng._geo
        self.channel = channel
        pieces = len(eng.axi_names)
        #: An address generator per AXI master (submodules ``ar``, ``ar1``...).
        self.gens = [BurstAddressGenerator(eng.config, eng.elem_bytes, pieces, p)
                     for p in range(pieces)]
        for p, gen in enumerate(self.gens):
            m.submodules[channel + (str(p) if p else "")] = gen
        self.gen = self.gens[0]
        self.ins = Signal(mem_layout(eng.config))
        dram_stmts, self.dram_err = self.g.dram_error(self.ins)
        m.d.comb += dram_stmts

    def drive_address_channel(self) -> None:
        """Each address generator walks the instruction's rows (or its piece of every
        entry) and offers its bursts on its AXI master's address channel."""
        ins, ch = self.ins, self.channel
        for gen, axi in zip(self.gens, self.eng.axis):
            self.m.d.comb += [
                gen.base.eq(ins.dram_base), gen.stride.eq(ins.x_stride),
                gen.x_size.eq(ins.x_size), gen.y_size.eq(ins.y_size),
                getattr(axi, f"{ch}valid").eq(gen.valid),
                gen.ready.eq(getattr(axi, f"{ch}ready")),
                getattr(axi, f"{ch}addr").eq(gen.addr), getattr(axi, f"{ch}len").eq(gen.len),
                getattr(axi, f"{ch}size").eq(self.g.log2_bus),
                getattr(axi, f"{ch}burst").eq(AXI_BURST_INCR),
                getattr(axi, f"{ch}id").eq(self.eng.axi_id),
            ]

    def finish(self) -> None:
        """End the instruction: back to IDLE."""
        self.m.d.sync += self.eng.busy.eq(0)
        self.m.next = "IDLE"

    def idle(self) -> None:
        """The IDLE state: latch the instruction at ``start``."""
        m, eng = self.m, self.eng
        with m.If(eng.start):
            m.d.sync += [self.ins.eq(eng.insn), eng.busy.eq(1), eng.error.eq(0)]
            m.next = "SETUP"

    def reject(self, sram_err) -> None:
        """SETUP's checks: end an instruction with no columns, or one whose block leaves
        the buffer or DRAM (with its error code). The caller continues the If chain."""
        m, eng = self.m, self.eng
        with m.If(self.ins.x_size == 0):
            self.finish()
        with m.Elif(sram_err):
            m.d.sync += eng.error.eq(ErrorCode.SRAM_BOUNDS)
            self.finish()
        with m.Elif(self.dram_err):
            m.d.sync += eng.error.eq(ErrorCode.DRAM_ADDRESS)
            self.finish()
