"""The 2-D strided DMA engines behind LOAD and STORE (docs/timing.md, "LOAD and STORE").

:class:`DmaReader` moves a block from DRAM into one on-chip buffer (padded with
the instruction's ``pad_value``), :class:`~.dma_writer.DmaWriter` (in :mod:`.dma_writer`) moves a block of the output buffer to DRAM. Both
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

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from tessera.config import HwConfig
from tessera.isa import MemType, get_isa
from tessera.isa.encoding import DMA_SIZE_BITS, DRAM_ADDR_BITS, PAD_BITS
from tessera.isa.instructions import LOAD_MODULE
from tessera.regmap import (AXI_ADDR_BITS, AXI_BOUNDARY_BYTES, AXI_LEN_BITS, ERROR_CODE_BITS,
                            ErrorCode)

from .layouts import mem_layout
from .ports import (AXI_BURST_INCR, AXI_RESP_OKAY, axi_signature, sram_read_signature,
                    sram_write_signature)

__all__ = ["ELEM_ADDR_BITS", "BurstAddressGenerator", "DmaEngine", "DmaReader", "EngineLogic",
           "load_modules", "sram_addr_bits"]

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


def _times_pad(pad, value):
    """``pad * value`` for a pad of ``PAD_BITS`` bits, as shift-and-add: a few adders in
    LUTs, where a ``*`` would take a DSP48 (the DSPs are the GEMM core's and the ALU's)."""
    return sum(Mux(pad[i], value << i, 0) for i in range(len(pad)))[:len(value) + len(pad)]


class BurstAddressGenerator(wiring.Component):
    """Splits the rows of a 2-D transfer into AXI bursts, one address handshake each.

    ``init`` (one cycle) loads the transfer: ``y_size`` rows of ``x_size``
    elements of ``elem_bytes`` bytes, row ``y`` at element ``base + y *
    stride``. While ``run`` is high the generator offers one burst per cycle
    on ``valid``/``addr``/``len`` (AXI ``arlen``/``awlen`` encoding) and moves
    on when ``ready``; ``done`` rises once the last burst has been accepted.
    Outputs depend on registers only (never on ``ready``).
    """

    def __init__(self, config: HwConfig, elem_bytes: int) -> None:
        self._geo = _Geometry(config, elem_bytes)
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
                elem.eq(self.base), beat.eq(g.beat_addr(self.base)),
                rem.eq(g.row_beats(self.base, self.x_size)),
                rows.eq(self.y_size), x_size.eq(self.x_size), stride.eq(self.stride),
                self.done.eq((self.y_size == 0) | (self.x_size == 0)),
            ]
        with m.Elif(self.valid & self.ready):
            with m.If(rem == n):
                next_elem = elem + stride
                m.d.sync += [
                    elem.eq(next_elem), beat.eq(g.beat_addr(next_elem)),
                    rem.eq(g.row_beats(next_elem, x_size)), rows.eq(rows - 1),
                ]
                with m.If(rows == 1):
                    m.d.sync += self.done.eq(1)
            with m.Else():
                m.d.sync += [beat.eq(beat + (n << g.log2_bus)), rem.eq(rem - n)]
        return m


class DmaEngine(wiring.Component):
    """What both engines share: the buffer's geometry and the start/busy/error,
    AXI and SRAM ports (a reader writes the buffer, a writer reads it)."""

    def __init__(self, config: HwConfig, mem: MemType, axi_id: int, *, read: bool,
                 also: tuple[MemType, ...] = ()) -> None:
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
        super().__init__({
            "start": In(1), "insn": In(mem_layout(config)),
            "busy": Out(1), "error": Out(ERROR_CODE_BITS),
            "axi": Out(axi_signature(8 * config.bus_bytes, read=read, write=not read)),
            "sram": Out(sram(self.addr_bits, self.entry_bits)),
        })


class EngineLogic:
    """One elaboration of a DMA engine: its address generator (submodule ``channel``, the
    AXI address channel it drives), the latched instruction and its DRAM address check,
    and the FSM steps both engines share. Signals are attributes of the engine's logic;
    those made in pairs keep the statement form (locals or attributes) that gives their
    Verilog names (Amaranth's tracer names them from it)."""

    def __init__(self, eng: DmaEngine, m: Module, channel: str) -> None:
        self.eng, self.m, self.g = eng, m, eng._geo
        self.channel = channel
        m.submodules[channel] = self.gen = BurstAddressGenerator(eng.config, eng.elem_bytes)
        self.ins = Signal(mem_layout(eng.config))
        dram_stmts, self.dram_err = self.g.dram_error(self.ins)
        m.d.comb += dram_stmts

    def drive_address_channel(self) -> None:
        """The address generator walks the instruction's rows and offers its bursts on
        the AXI address channel."""
        gen, ins, axi, ch = self.gen, self.ins, self.eng.axi, self.channel
        self.m.d.comb += [
            gen.base.eq(ins.dram_base), gen.stride.eq(ins.x_stride),
            gen.x_size.eq(ins.x_size), gen.y_size.eq(ins.y_size),
            getattr(axi, f"{ch}valid").eq(gen.valid), gen.ready.eq(getattr(axi, f"{ch}ready")),
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


class DmaReader(DmaEngine):
    """LOAD engine: 2-D strided DMA from DRAM into one on-chip buffer, with padding.

    Built for one memory type ``mem``; ``axi_id`` tags its reads. Pulse
    ``start`` with the instruction on ``insn``; ``busy`` is high from the next
    cycle until the instruction ends, and ``error`` then holds an
    :class:`~tessera.regmap.ErrorCode` (0 = none) until the next start.

    Timeline (S = the start cycle): S+1 checks the instruction (an error ends
    it there, with no write and no DRAM access); from S+2 the pads are
    written one entry per cycle (``pad_value`` sign-extended or wrapped to
    ``lane_bits`` in every lane; acc8 lanes are 8 bits, which the load
    module sign-extends like data); then the reads are requested one burst per
    cycle and their data written at most one entry and one beat per cycle,
    an entry in the cycle its last beat is on the R channel. Uncontended,
    the instruction lasts exactly ``DMA_SETUP_CYCLES + pad_cycles +
    (dram_latency + data_cycles if data_cycles else 0)`` cycles.

    ``start`` is ignored while ``busy``. Attributes: ``elem_bytes`` (bytes
    per element = per entry), ``entry_bits``, ``lane_bits``, ``depth`` and
    ``addr_bits`` of the buffer (the largest, with ``also``). The engine serves
    ``mem``, and the memory types of ``also`` with the same element and lanes (acc8
    and tbl: rows of int8 lanes); ``insn.mem`` only picks the depth its block is
    checked against, the caller routes the writes.
    """

    def __init__(self, config: HwConfig, mem: MemType, axi_id: int,
                 also: tuple[MemType, ...] = ()) -> None:
        super().__init__(config, mem, axi_id, read=True, also=also)
        #: Bits of one lane of an entry as it comes from DRAM (a uop is one lane).
        lanes = {MemType.UOP: self.entry_bits, MemType.INP: config.inp_width,
                 MemType.WGT: config.wgt_width, MemType.ACC: config.acc_width,
                 MemType.ACC8: 8, MemType.TBL: 8}
        self.lane_bits = lanes[self.mem]
        if any(lanes[mt] != self.lane_bits for mt in self.mems):
            raise ValueError(f"one DMA reader serves memory types of one lane width, not "
                             f"{[mt.label for mt in self.mems]}")

    def elaborate(self, platform):
        m = Module()
        _ReaderLogic(self, m).build()
        return m


class _ReaderLogic(EngineLogic):
    """One elaboration of a :class:`DmaReader`: SETUP sizes the block's three bands (top
    pad rows, data rows with their side pads, bottom pad rows), TOP, MID and BOT write the
    pads, DATA the entries read from DRAM."""

    def __init__(self, eng: DmaReader, m: Module) -> None:
        super().__init__(eng, m, "ar")
        # Addresses in the buffer: past depth only after the bounds check has failed.
        self.addr_w = eng.addr_bits + 1
        self.size_w = DMA_SIZE_BITS + 1                     # a size plus its two pads

    def build(self) -> None:
        """The block shape, the phases' registers, the address channel and the FSM."""
        m = self.m
        self._add_block_shape()
        self._add_pad_registers()
        self._add_data_registers()
        self.drive_address_channel()
        with m.FSM():
            with m.State("IDLE"):
                self.idle()
            with m.State("SETUP"):
                self._setup()
            with m.State("TOP"):
                self._write_top_pads()
            with m.State("MID"):
                self._write_side_pads()
            with m.State("BOT"):
                self._write_bottom_pads()
            with m.State("DATA"):
                self._write_data()

    def _add_block_shape(self) -> None:
        """The block's columns, the size and start of each band, the buffer bounds check,
        and the pad entry."""
        m, ins, eng, size_w = self.m, self.ins, self.eng, self.size_w
        cols = Signal(size_w)
        top_n = Signal(size_w + PAD_BITS)
        bot_n = Signal(size_w + PAD_BITS)
        mid_start, bot_start = Signal(2 * size_w + 1), Signal(2 * size_w + 1)
        side = Signal(PAD_BITS + 1)
        # The pad entry: pad_value sign-extended (or wrapped) to a lane, in every lane. The
        # pad phases write it; DATA drives sram.data itself.
        pad_lane = Signal(signed(eng.lane_bits))
        m.d.comb += [pad_lane.eq(ins.pad_value),
                     eng.sram.data.eq(pad_lane.replicate(eng.entry_bits // eng.lane_bits))]
        m.d.comb += [
            cols.eq(ins.x_pad_0 + ins.x_size + ins.x_pad_1),
            top_n.eq(_times_pad(ins.y_pad_0, cols)),
            mid_start.eq(ins.sram_base + top_n),
            bot_start.eq(mid_start + ins.y_size * cols),
            bot_n.eq(_times_pad(ins.y_pad_1, cols)),
            side.eq(ins.x_pad_0 + ins.x_pad_1),
        ]
        self.cols, self.top_n, self.bot_n, self.side = cols, top_n, bot_n, side
        self.mid_start, self.bot_start = mid_start, bot_start
        # rows * cols without another multiplier: the three bands of the block.
        self.sram_err = (bot_start + bot_n) > self._depth()
        self.has_mid_now = (ins.y_size != 0) & (side != 0)

    def _depth(self):
        """The depth of the latched instruction's buffer (of ``mem`` unless ``also``)."""
        eng = self.eng
        depth = eng.depths[eng.mem]
        for mt in eng.mems[1:]:
            depth = Mux(self.ins.mem == mt, eng.depths[mt], depth)
        return depth

    def _add_pad_registers(self) -> None:
        """The pad phases' cursors: TOP and BOT are runs of whole rows, MID the side pads
        of each data row; and which phases follow TOP."""
        addr_w = self.addr_w
        self.cols_r = Signal(self.size_w)
        has_mid, has_bot, has_data = Signal(), Signal(), Signal()
        pad_addr, pad_cnt = Signal(addr_w), Signal(addr_w)
        bot_addr, bot_cnt = Signal(addr_w), Signal(addr_w)
        mid_base, mid_rows = Signal(addr_w), Signal(DMA_SIZE_BITS)
        self.mid_j = Signal(PAD_BITS + 1)
        self.has_mid, self.has_bot, self.has_data = has_mid, has_bot, has_data
        self.pad_addr, self.pad_cnt = pad_addr, pad_cnt
        self.bot_addr, self.bot_cnt = bot_addr, bot_cnt
        self.mid_base, self.mid_rows = mid_base, mid_rows

    def _add_data_registers(self) -> None:
        """The data phase's write side: the entry's address, the row and column left, the
        lane of the beat it is in, and the earlier beats of a wide entry."""
        g = self.g
        self.r_addr = Signal(self.addr_w)
        r_x, r_rows = Signal(DMA_SIZE_BITS), Signal(DMA_SIZE_BITS)
        r_row_lane, r_lane = Signal(g.log2_lanes), Signal(g.log2_lanes)
        k = g.beats_per_entry
        self.r_beat = Signal(range(k))
        self.r_buf = Signal(8 * g.bus * (k - 1))
        self.r_x, self.r_rows = r_x, r_rows
        self.r_row_lane, self.r_lane = r_row_lane, r_lane

    def _goto(self, options: list) -> None:
        """Enter the first phase whose condition holds, or end the instruction."""
        m = self.m
        for i, (cond, state) in enumerate(options):
            with (m.If if i == 0 else m.Elif)(cond):
                m.next = state
        with m.Else():
            self.finish()

    def _setup(self) -> None:
        """The SETUP state: load every phase's registers, then start the first phase
        with work, unless the instruction fails its checks."""
        m, g, ins = self.m, self.g, self.ins
        m.d.comb += self.gen.init.eq(1)
        m.d.sync += [
            self.cols_r.eq(self.cols),
            self.has_mid.eq(self.has_mid_now), self.has_bot.eq(self.bot_n != 0),
            self.has_data.eq(ins.y_size != 0),
            self.pad_addr.eq(ins.sram_base), self.pad_cnt.eq(self.top_n),
            self.bot_addr.eq(self.bot_start), self.bot_cnt.eq(self.bot_n),
            self.mid_base.eq(self.mid_start), self.mid_rows.eq(ins.y_size), self.mid_j.eq(0),
            self.r_addr.eq(self.mid_start + ins.x_pad_0), self.r_x.eq(ins.x_size),
            self.r_rows.eq(ins.y_size),
            self.r_row_lane.eq(g.lane(ins.dram_base)), self.r_lane.eq(g.lane(ins.dram_base)),
            self.r_beat.eq(0),
        ]
        self.reject(self.sram_err)
        with m.Else():
            self._goto([(self.top_n != 0, "TOP"), (self.has_mid_now, "MID"),
                        (self.bot_n != 0, "BOT"), (ins.y_size != 0, "DATA")])

    def _write_top_pads(self) -> None:
        """The TOP state: one pad entry per cycle."""
        m, sram, pad_addr, pad_cnt = self.m, self.eng.sram, self.pad_addr, self.pad_cnt
        m.d.comb += [sram.en.eq(1), sram.addr.eq(pad_addr)]
        m.d.sync += [pad_addr.eq(pad_addr + 1), pad_cnt.eq(pad_cnt - 1)]
        with m.If(pad_cnt == 1):
            self._goto([(self.has_mid, "MID"), (self.has_bot, "BOT"), (self.has_data, "DATA")])

    def _write_side_pads(self) -> None:
        """The MID state: the left then right pads of each data row, one per cycle."""
        m, ins, sram = self.m, self.ins, self.eng.sram
        mid_j, mid_base, mid_rows = self.mid_j, self.mid_base, self.mid_rows
        skip = Mux(mid_j >= ins.x_pad_0, ins.x_size, 0)
        m.d.comb += [sram.en.eq(1), sram.addr.eq(mid_base + mid_j + skip)]
        with m.If(mid_j == self.side - 1):
            m.d.sync += [mid_j.eq(0), mid_base.eq(mid_base + self.cols_r),
                         mid_rows.eq(mid_rows - 1)]
            with m.If(mid_rows == 1):
                self._goto([(self.has_bot, "BOT"), (self.has_data, "DATA")])
        with m.Else():
            m.d.sync += mid_j.eq(mid_j + 1)

    def _write_bottom_pads(self) -> None:
        """The BOT state: one pad entry per cycle."""
        m, sram, bot_addr, bot_cnt = self.m, self.eng.sram, self.bot_addr, self.bot_cnt
        m.d.comb += [sram.en.eq(1), sram.addr.eq(bot_addr)]
        m.d.sync += [bot_addr.eq(bot_addr + 1), bot_cnt.eq(bot_cnt - 1)]
        with m.If(bot_cnt == 1):
            self._goto([(self.has_data, "DATA")])

    def _write_data(self) -> None:
        """The DATA state: request the bursts, write each entry as its last beat arrives,
        and step along the rows (skipping their side pads)."""
        m, ins, axi, sram = self.m, self.ins, self.eng.axi, self.eng.sram
        r_x, r_rows, r_addr = self.r_x, self.r_rows, self.r_addr
        m.d.comb += self.gen.run.eq(1)
        entry_done = Signal()
        self._assemble_entry(entry_done)
        m.d.comb += [sram.en.eq(entry_done), sram.addr.eq(r_addr)]
        with m.If(axi.rvalid & axi.rready & (axi.rresp != AXI_RESP_OKAY)):
            m.d.sync += self.eng.error.eq(ErrorCode.AXI_RESPONSE)
        with m.If(entry_done):
            with m.If(r_x == 1):
                next_lane = Signal(self.g.log2_lanes)
                m.d.comb += next_lane.eq(self.r_row_lane + ins.x_stride)
                m.d.sync += [
                    r_x.eq(ins.x_size), r_rows.eq(r_rows - 1),
                    r_addr.eq(r_addr + 1 + self.side),
                    self.r_row_lane.eq(next_lane), self.r_lane.eq(next_lane),
                ]
                with m.If(r_rows == 1):
                    self.finish()
            with m.Else():
                m.d.sync += [r_x.eq(r_x - 1), r_addr.eq(r_addr + 1)]

    def _assemble_entry(self, entry_done: Signal) -> None:
        """Drive ``sram.data`` and ``entry_done`` (an entry is complete on the R channel)
        from the beats: one of several lanes, a whole beat, or the last of several beats."""
        m, g, axi, sram = self.m, self.g, self.eng.axi, self.eng.sram
        r_lane, r_beat, r_buf, k = self.r_lane, self.r_beat, self.r_buf, g.beats_per_entry
        if g.lanes > 1:
            # A beat is released only with its last entry (or the row's last one), so
            # rready comes from registers alone, as the DRAM model requires.
            m.d.comb += [
                axi.rready.eq((r_lane == g.lanes - 1) | (self.r_x == 1)),
                entry_done.eq(axi.rvalid),
                sram.data.eq(axi.rdata.word_select(r_lane, self.eng.entry_bits)),
            ]
            with m.If(entry_done):
                m.d.sync += r_lane.eq(r_lane + 1)
        elif k == 1:
            m.d.comb += [axi.rready.eq(1), entry_done.eq(axi.rvalid), sram.data.eq(axi.rdata)]
        else:
            # Earlier beats wait in a shift register; the last one joins them live.
            m.d.comb += [axi.rready.eq(1), entry_done.eq(axi.rvalid & (r_beat == k - 1)),
                         sram.data.eq(Cat(r_buf, axi.rdata))]
            with m.If(axi.rvalid):
                m.d.sync += r_beat.eq(Mux(r_beat == k - 1, 0, r_beat + 1))
                if k == 2:
                    m.d.sync += r_buf.eq(axi.rdata)
                else:
                    m.d.sync += r_buf.eq(Cat(r_buf[8 * g.bus:], axi.rdata))
