"""The 2-D strided DMA engines behind LOAD and STORE (docs/timing.md, "LOAD and STORE").

:class:`DmaReader` moves a block from DRAM into one on-chip buffer (padded with
the instruction's ``pad_value``), :class:`DmaWriter` moves a block of the output buffer to DRAM. Both
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
from tessera.regmap import (AXI_ADDR_BITS, AXI_BOUNDARY_BYTES, AXI_LEN_BITS, ERROR_CODE_BITS,
                            ErrorCode)

from .layouts import mem_layout
from .ports import (AXI_BURST_INCR, AXI_RESP_OKAY, axi_signature, sram_read_signature,
                    sram_write_signature)

__all__ = ["BurstAddressGenerator", "DmaReader", "DmaWriter", "sram_addr_bits"]

#: A row's element address dram_base + y * x_stride may exceed 32 bits before the
#: address check has rejected the instruction (or one row past the last).
_ELEM_BITS = DRAM_ADDR_BITS + DMA_SIZE_BITS + 1


def _log2(n: int) -> int:
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1


def sram_addr_bits(depth: int) -> int:
    """Address width of a buffer of ``depth`` entries (as ``HwConfig`` sizes its indices)."""
    return max(1, (depth - 1).bit_length())


#: Attributes of a signal holding a product that should be built from LUTs (yosys
#: synth_xilinx through tessera.hw.resources, and Vivado, honour ``use_dsp``).
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
        end = Signal(_ELEM_BITS + 1)          # one past the last element of the last row
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
        elem = Signal(_ELEM_BITS)
        beat = Signal(_ELEM_BITS + g.log2_eb)
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


class _DmaEngine(wiring.Component):
    """What both engines share: the buffer's geometry and the start/busy/error,
    AXI and SRAM ports (a reader writes the buffer, a writer reads it)."""

    def __init__(self, config: HwConfig, mem: MemType, axi_id: int, *, read: bool) -> None:
        isa = get_isa(config)
        self.config = config
        self.mem = MemType(mem)
        self.axi_id = axi_id
        self.elem_bytes = isa.elem_bytes(self.mem)
        self.entry_bits = 8 * self.elem_bytes
        self.depth = isa.depth(self.mem)
        self.addr_bits = sram_addr_bits(self.depth)
        self._geo = _Geometry(config, self.elem_bytes)
        sram = sram_write_signature if read else sram_read_signature
        super().__init__({
            "start": In(1), "insn": In(mem_layout(config)),
            "busy": Out(1), "error": Out(ERROR_CODE_BITS),
            "axi": Out(axi_signature(8 * config.bus_bytes, read=read, write=not read)),
            "sram": Out(sram(self.addr_bits, self.entry_bits)),
        })


class DmaReader(_DmaEngine):
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
    ``addr_bits`` of the buffer. ``insn.mem`` is not looked at: the engine
    serves ``mem``.
    """

    def __init__(self, config: HwConfig, mem: MemType, axi_id: int) -> None:
        super().__init__(config, mem, axi_id, read=True)
        #: Bits of one lane of an entry as it comes from DRAM (a uop is one lane).
        self.lane_bits = {MemType.UOP: self.entry_bits, MemType.INP: config.inp_width,
                          MemType.WGT: config.wgt_width, MemType.ACC: config.acc_width,
                          MemType.ACC8: 8}[self.mem]

    def elaborate(self, platform):
        m = Module()
        g = self._geo
        m.submodules.ar = ar = BurstAddressGenerator(self.config, self.elem_bytes)
        axi, sram = self.axi, self.sram

        ins = Signal(mem_layout(self.config))
        # Addresses in the buffer: past depth only after the bounds check has failed.
        addr_w = self.addr_bits + 1
        size_w = DMA_SIZE_BITS + 1                     # a size plus its two pads

        # ---- setup: block shape, checks, and the start of every phase
        cols = Signal(size_w)
        top_n = Signal(size_w + PAD_BITS)
        bot_n = Signal(size_w + PAD_BITS)
        mid_start, bot_start = Signal(2 * size_w + 1), Signal(2 * size_w + 1)
        side = Signal(PAD_BITS + 1)
        dram_stmts, dram_err = g.dram_error(ins)
        m.d.comb += dram_stmts
        # The pad entry: pad_value sign-extended (or wrapped) to a lane, in every lane. The
        # pad phases write it; DATA drives sram.data itself.
        pad_lane = Signal(signed(self.lane_bits))
        m.d.comb += [pad_lane.eq(ins.pad_value),
                     sram.data.eq(pad_lane.replicate(self.entry_bits // self.lane_bits))]
        m.d.comb += [
            cols.eq(ins.x_pad_0 + ins.x_size + ins.x_pad_1),
            top_n.eq(_times_pad(ins.y_pad_0, cols)),
            mid_start.eq(ins.sram_base + top_n),
            bot_start.eq(mid_start + ins.y_size * cols),
            bot_n.eq(_times_pad(ins.y_pad_1, cols)),
            side.eq(ins.x_pad_0 + ins.x_pad_1),
        ]
        # rows * cols without another multiplier: the three bands of the block.
        sram_err = (bot_start + bot_n) > self.depth
        has_mid_now = (ins.y_size != 0) & (side != 0)

        cols_r = Signal(size_w)
        has_mid, has_bot, has_data = Signal(), Signal(), Signal()
        # Pad phases: TOP and BOT are runs of whole rows, MID the side pads of each data row.
        pad_addr, pad_cnt = Signal(addr_w), Signal(addr_w)
        bot_addr, bot_cnt = Signal(addr_w), Signal(addr_w)
        mid_base, mid_rows = Signal(addr_w), Signal(DMA_SIZE_BITS)
        mid_j = Signal(PAD_BITS + 1)
        # The data phase's write side.
        r_addr = Signal(addr_w)
        r_x, r_rows = Signal(DMA_SIZE_BITS), Signal(DMA_SIZE_BITS)
        r_row_lane, r_lane = Signal(g.log2_lanes), Signal(g.log2_lanes)
        k = g.beats_per_entry
        r_beat = Signal(range(k))
        r_buf = Signal(8 * g.bus * (k - 1))

        m.d.comb += [
            ar.base.eq(ins.dram_base), ar.stride.eq(ins.x_stride),
            ar.x_size.eq(ins.x_size), ar.y_size.eq(ins.y_size),
            axi.arvalid.eq(ar.valid), ar.ready.eq(axi.arready),
            axi.araddr.eq(ar.addr), axi.arlen.eq(ar.len),
            axi.arsize.eq(g.log2_bus), axi.arburst.eq(AXI_BURST_INCR), axi.arid.eq(self.axi_id),
        ]

        def finish():
            m.d.sync += self.busy.eq(0)
            m.next = "IDLE"

        def goto(options):
            """Enter the first phase whose condition holds, or end the instruction."""
            for i, (cond, state) in enumerate(options):
                with (m.If if i == 0 else m.Elif)(cond):
                    m.next = state
            with m.Else():
                finish()

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [ins.eq(self.insn), self.busy.eq(1), self.error.eq(0)]
                    m.next = "SETUP"

            with m.State("SETUP"):
                m.d.comb += ar.init.eq(1)
                m.d.sync += [
                    cols_r.eq(cols),
                    has_mid.eq(has_mid_now), has_bot.eq(bot_n != 0), has_data.eq(ins.y_size != 0),
                    pad_addr.eq(ins.sram_base), pad_cnt.eq(top_n),
                    bot_addr.eq(bot_start), bot_cnt.eq(bot_n),
                    mid_base.eq(mid_start), mid_rows.eq(ins.y_size), mid_j.eq(0),
                    r_addr.eq(mid_start + ins.x_pad_0), r_x.eq(ins.x_size), r_rows.eq(ins.y_size),
                    r_row_lane.eq(g.lane(ins.dram_base)), r_lane.eq(g.lane(ins.dram_base)),
                    r_beat.eq(0),
                ]
                with m.If(ins.x_size == 0):
                    finish()
                with m.Elif(sram_err):
                    m.d.sync += self.error.eq(ErrorCode.SRAM_BOUNDS)
                    finish()
                with m.Elif(dram_err):
                    m.d.sync += self.error.eq(ErrorCode.DRAM_ADDRESS)
                    finish()
                with m.Else():
                    goto([(top_n != 0, "TOP"), (has_mid_now, "MID"), (bot_n != 0, "BOT"),
                          (ins.y_size != 0, "DATA")])

            with m.State("TOP"):
                m.d.comb += [sram.en.eq(1), sram.addr.eq(pad_addr)]
                m.d.sync += [pad_addr.eq(pad_addr + 1), pad_cnt.eq(pad_cnt - 1)]
                with m.If(pad_cnt == 1):
                    goto([(has_mid, "MID"), (has_bot, "BOT"), (has_data, "DATA")])

            with m.State("MID"):
                skip = Mux(mid_j >= ins.x_pad_0, ins.x_size, 0)
                m.d.comb += [sram.en.eq(1), sram.addr.eq(mid_base + mid_j + skip)]
                with m.If(mid_j == side - 1):
                    m.d.sync += [mid_j.eq(0), mid_base.eq(mid_base + cols_r),
                                 mid_rows.eq(mid_rows - 1)]
                    with m.If(mid_rows == 1):
                        goto([(has_bot, "BOT"), (has_data, "DATA")])
                with m.Else():
                    m.d.sync += mid_j.eq(mid_j + 1)

            with m.State("BOT"):
                m.d.comb += [sram.en.eq(1), sram.addr.eq(bot_addr)]
                m.d.sync += [bot_addr.eq(bot_addr + 1), bot_cnt.eq(bot_cnt - 1)]
                with m.If(bot_cnt == 1):
                    goto([(has_data, "DATA")])

            with m.State("DATA"):
                m.d.comb += ar.run.eq(1)
                entry_done = Signal()
                if g.lanes > 1:
                    # A beat is released only with its last entry (or the row's last one), so
                    # rready comes from registers alone, as the DRAM model requires.
                    m.d.comb += [
                        axi.rready.eq((r_lane == g.lanes - 1) | (r_x == 1)),
                        entry_done.eq(axi.rvalid),
                        sram.data.eq(axi.rdata.word_select(r_lane, self.entry_bits)),
                    ]
                    with m.If(entry_done):
                        m.d.sync += r_lane.eq(r_lane + 1)
                elif k == 1:
                    m.d.comb += [axi.rready.eq(1), entry_done.eq(axi.rvalid),
                                 sram.data.eq(axi.rdata)]
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
                m.d.comb += [sram.en.eq(entry_done), sram.addr.eq(r_addr)]
                with m.If(axi.rvalid & axi.rready & (axi.rresp != AXI_RESP_OKAY)):
                    m.d.sync += self.error.eq(ErrorCode.AXI_RESPONSE)
                with m.If(entry_done):
                    with m.If(r_x == 1):
                        next_lane = Signal(g.log2_lanes)
                        m.d.comb += next_lane.eq(r_row_lane + ins.x_stride)
                        m.d.sync += [
                            r_x.eq(ins.x_size), r_rows.eq(r_rows - 1),
                            r_addr.eq(r_addr + 1 + side),
                            r_row_lane.eq(next_lane), r_lane.eq(next_lane),
                        ]
                        with m.If(r_rows == 1):
                            finish()
                    with m.Else():
                        m.d.sync += [r_x.eq(r_x - 1), r_addr.eq(r_addr + 1)]
        return m


class DmaWriter(_DmaEngine):
    """STORE engine: 2-D strided DMA from the output buffer to DRAM.

    Entries ``sram_base .. sram_base + y_size * x_size - 1`` are written
    row-major, row ``y`` to DRAM element ``dram_base + y * x_stride``;
    ``axi_id`` tags the writes. ``start``/``insn``/``busy``/``error`` behave
    as for :class:`DmaReader`.

    Timeline (S = the start cycle): S+1 checks the instruction and issues
    the first SRAM read; from S+2 one W beat per cycle (narrow entries are
    packed into a beat with ``wstrb``; a beat leaves with its last entry or
    at the row's end), each burst's AW no later than its first W beat; the
    instruction ends the cycle after the last write response. Uncontended
    that is ``DMA_SETUP_CYCLES + data_cycles + dram_latency`` cycles. When
    ``wready`` is low the beat is held and the SRAM read pipeline stalls.
    """

    def __init__(self, config: HwConfig, axi_id: int) -> None:
        super().__init__(config, MemType.OUT, axi_id, read=False)

    def elaborate(self, platform):
        m = Module()
        g = self._geo
        m.submodules.aw = aw = BurstAddressGenerator(self.config, self.elem_bytes)
        axi, sram = self.axi, self.sram
        beat_bits = 8 * g.bus

        ins = Signal(mem_layout(self.config))
        addr_w = self.addr_bits + 1

        total = Signal(2 * DMA_SIZE_BITS)
        dram_stmts, dram_err = g.dram_error(ins)
        m.d.comb += dram_stmts
        m.d.comb += total.eq(ins.y_size * ins.x_size)
        sram_err = (ins.sram_base + total) > self.depth

        rd_addr, rd_left = Signal(addr_w), Signal(addr_w)   # SRAM reads still to issue
        w_active = Signal()
        w_x, w_rows = Signal(DMA_SIZE_BITS), Signal(DMA_SIZE_BITS)
        w_elem = Signal(_ELEM_BITS)
        w_beat_addr = Signal(_ELEM_BITS + g.log2_eb)
        w_bcnt = Signal(range(max(2, g.max_burst)))        # beats sent in the current burst
        w_lane, w_first = Signal(g.log2_lanes), Signal(g.log2_lanes)
        w_acc = Signal(beat_bits)                           # entries waiting for their beat
        k = g.beats_per_entry
        w_beat = Signal(range(k))
        w_sh = Signal(beat_bits * (k - 1))                  # the rest of a wide entry
        pending = Signal(DRAM_ADDR_BITS)                    # bursts without a response yet

        m.d.comb += [
            aw.base.eq(ins.dram_base), aw.stride.eq(ins.x_stride),
            aw.x_size.eq(ins.x_size), aw.y_size.eq(ins.y_size),
            axi.awvalid.eq(aw.valid), aw.ready.eq(axi.awready),
            axi.awaddr.eq(aw.addr), axi.awlen.eq(aw.len),
            axi.awsize.eq(g.log2_bus), axi.awburst.eq(AXI_BURST_INCR), axi.awid.eq(self.axi_id),
            axi.bready.eq(1),
        ]

        def finish():
            m.d.sync += self.busy.eq(0)
            m.next = "IDLE"

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [ins.eq(self.insn), self.busy.eq(1), self.error.eq(0)]
                    m.next = "SETUP"

            with m.State("SETUP"):
                ok = (ins.x_size != 0) & (ins.y_size != 0) & ~sram_err & ~dram_err
                m.d.comb += [aw.init.eq(1), sram.en.eq(ok), sram.addr.eq(ins.sram_base)]
                m.d.sync += [
                    rd_addr.eq(ins.sram_base + 1), rd_left.eq(total - 1), w_active.eq(1),
                    w_x.eq(ins.x_size), w_rows.eq(ins.y_size), w_elem.eq(ins.dram_base),
                    w_beat_addr.eq(g.beat_addr(ins.dram_base)), w_bcnt.eq(0),
                    w_lane.eq(g.lane(ins.dram_base)), w_first.eq(g.lane(ins.dram_base)),
                    w_beat.eq(0), pending.eq(0),
                ]
                with m.If(ins.x_size == 0):
                    finish()
                with m.Elif(sram_err):
                    m.d.sync += self.error.eq(ErrorCode.SRAM_BOUNDS)
                    finish()
                with m.Elif(dram_err):
                    m.d.sync += self.error.eq(ErrorCode.DRAM_ADDRESS)
                    finish()
                with m.Elif(ins.y_size == 0):
                    finish()
                with m.Else():
                    m.next = "DATA"

            with m.State("DATA"):
                m.d.comb += aw.run.eq(1)
                entry_last_beat = (w_beat == k - 1) if k > 1 else Const(1)
                row_last_beat = (w_x == 1) & entry_last_beat
                entry_done = Signal()           # the entry on sram.data has been used up
                beat = Signal()                 # a W handshake this cycle
                m.d.comb += [
                    axi.wlast.eq(row_last_beat | g.at_boundary_end(w_beat_addr)
                                 | (w_bcnt == g.max_burst - 1)),
                    beat.eq(axi.wvalid & axi.wready),
                ]
                if g.lanes > 1:
                    # wvalid comes from registers (the beat's last entry is on sram.data,
                    # which the read pipeline guarantees whenever w_active).
                    lane_bits = self.entry_bits
                    m.d.comb += [
                        axi.wvalid.eq(w_active & ((w_lane == g.lanes - 1) | (w_x == 1))),
                        entry_done.eq(w_active & (~axi.wvalid | axi.wready)),
                        axi.wdata.eq(Cat(*(Mux(w_lane == lane, sram.data,
                                               w_acc[lane * lane_bits:(lane + 1) * lane_bits])
                                           for lane in range(g.lanes)))),
                        axi.wstrb.eq(Cat(*(((w_first <= lane) & (w_lane >= lane)).replicate(g.eb)
                                           for lane in range(g.lanes)))),
                    ]
                    with m.If(entry_done):
                        m.d.sync += w_lane.eq(w_lane + 1)
                        for lane in range(g.lanes):
                            with m.If(w_lane == lane):
                                m.d.sync += w_acc[lane * lane_bits:(lane + 1) * lane_bits] \
                                    .eq(sram.data)
                        with m.If(beat):
                            m.d.sync += w_first.eq(w_lane + 1)
                else:
                    m.d.comb += [
                        axi.wvalid.eq(w_active),
                        entry_done.eq(beat & entry_last_beat),
                        axi.wstrb.eq((1 << g.bus) - 1),
                    ]
                    if k == 1:
                        m.d.comb += axi.wdata.eq(sram.data)
                    else:
                        # The SRAM may start the next read while the entry's later beats
                        # are still going out, so those wait in a shift register.
                        m.d.comb += axi.wdata.eq(Mux(w_beat == 0, sram.data[:beat_bits],
                                                     w_sh[:beat_bits]))
                        with m.If(beat):
                            m.d.sync += w_beat.eq(Mux(entry_last_beat, 0, w_beat + 1))
                            with m.If(w_beat == 0):
                                m.d.sync += w_sh.eq(sram.data[beat_bits:])
                            with m.Else():
                                m.d.sync += w_sh.eq(w_sh >> beat_bits)

                m.d.comb += [sram.en.eq(entry_done & (rd_left != 0)), sram.addr.eq(rd_addr)]
                with m.If(sram.en):
                    m.d.sync += [rd_addr.eq(rd_addr + 1), rd_left.eq(rd_left - 1)]

                with m.If(beat):
                    m.d.sync += [w_beat_addr.eq(w_beat_addr + g.bus),
                                 w_bcnt.eq(Mux(axi.wlast, 0, w_bcnt + 1))]
                with m.If(entry_done):
                    with m.If(w_x == 1):
                        next_elem = Signal(_ELEM_BITS)
                        m.d.comb += next_elem.eq(w_elem + ins.x_stride)
                        m.d.sync += [
                            w_x.eq(ins.x_size), w_rows.eq(w_rows - 1), w_elem.eq(next_elem),
                            w_beat_addr.eq(g.beat_addr(next_elem)),
                        ]
                        if g.lanes > 1:
                            m.d.sync += [w_lane.eq(g.lane(next_elem)),
                                         w_first.eq(g.lane(next_elem))]
                        with m.If(w_rows == 1):
                            m.d.sync += w_active.eq(0)
                    with m.Else():
                        m.d.sync += w_x.eq(w_x - 1)

                aw_hs = aw.valid & axi.awready
                b_hs = axi.bvalid
                m.d.sync += pending.eq(pending + aw_hs - b_hs)
                with m.If(b_hs & (axi.bresp != AXI_RESP_OKAY)):
                    m.d.sync += self.error.eq(ErrorCode.AXI_RESPONSE)
                # Every AW has gone out before its response can come back.
                with m.If(b_hs & aw.done & (pending == 1)):
                    finish()
        return m
