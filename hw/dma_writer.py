"""The STORE engine: 2-D strided DMA from the output buffer to DRAM.

It shares its geometry, instruction checks and address channel with the LOAD engine
(:mod:`.dma`, whose docstring describes both); this module holds what only writing does:
packing entries into W beats with ``wstrb``, reading the output buffer ahead, counting
the write responses still due.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal

from tessera.config import HwConfig
from tessera.isa import MemType
from tessera.isa.encoding import DMA_SIZE_BITS, DRAM_ADDR_BITS
from tessera.regmap import ErrorCode

from .dma import ELEM_ADDR_BITS, DmaEngine, EngineLogic
from .ports import AXI_RESP_OKAY

__all__ = ["DmaWriter"]


class DmaWriter(DmaEngine):
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
        _WriterLogic(self, m).build()
        return m


class _WriterLogic(EngineLogic):
    """One elaboration of a :class:`DmaWriter`: SETUP issues the first SRAM read, DATA
    sends the W beats (reading ahead), steps along the rows and counts the write
    responses still due."""

    def __init__(self, eng: DmaWriter, m: Module) -> None:
        super().__init__(eng, m, "aw")
        self.beat_bits = 8 * self.g.bus
        self.addr_w = eng.addr_bits + 1

    def build(self) -> None:
        """The block size check, the registers, the address and response channels and
        the FSM."""
        m, ins = self.m, self.ins
        self.total = total = Signal(2 * DMA_SIZE_BITS)
        m.d.comb += total.eq(ins.y_size * ins.x_size)
        self.sram_err = (ins.sram_base + total) > self.eng.depth
        self._add_registers()
        self.drive_address_channel()
        m.d.comb += self.eng.axi.bready.eq(1)
        with m.FSM():
            with m.State("IDLE"):
                self.idle()
            with m.State("SETUP"):
                self._setup()
            with m.State("DATA"):
                self._send_data()

    def _add_registers(self) -> None:
        """The SRAM read cursor, the W side's row cursor and beat under assembly, and the
        count of bursts awaiting their response."""
        g, addr_w, beat_bits = self.g, self.addr_w, self.beat_bits
        rd_addr, rd_left = Signal(addr_w), Signal(addr_w)   # SRAM reads still to issue
        self.w_active = Signal()
        w_x, w_rows = Signal(DMA_SIZE_BITS), Signal(DMA_SIZE_BITS)
        self.w_elem = Signal(ELEM_ADDR_BITS)
        self.w_beat_addr = Signal(ELEM_ADDR_BITS + g.log2_eb)
        self.w_bcnt = Signal(range(max(2, g.max_burst)))   # beats sent in the current burst
        self.w_lane, self.w_first = Signal(g.log2_lanes), Signal(g.log2_lanes)
        self.w_acc = Signal(beat_bits)                      # entries waiting for their beat
        k = g.beats_per_entry
        self.w_beat = Signal(range(k))
        self.w_sh = Signal(beat_bits * (k - 1))             # the rest of a wide entry
        self.pending = Signal(DRAM_ADDR_BITS)               # bursts without a response yet
        self.rd_addr, self.rd_left = rd_addr, rd_left
        self.w_x, self.w_rows = w_x, w_rows

    def _setup(self) -> None:
        """The SETUP state: issue the first SRAM read and load the registers, unless the
        instruction fails its checks or has no rows."""
        m, g, ins, sram = self.m, self.g, self.ins, self.eng.sram
        ok = (ins.x_size != 0) & (ins.y_size != 0) & ~self.sram_err & ~self.dram_err
        m.d.comb += [self.gen.init.eq(1), sram.en.eq(ok), sram.addr.eq(ins.sram_base)]
        m.d.sync += [
            self.rd_addr.eq(ins.sram_base + 1), self.rd_left.eq(self.total - 1),
            self.w_active.eq(1), self.w_x.eq(ins.x_size), self.w_rows.eq(ins.y_size),
            self.w_elem.eq(ins.dram_base),
            self.w_beat_addr.eq(g.beat_addr(ins.dram_base)), self.w_bcnt.eq(0),
            self.w_lane.eq(g.lane(ins.dram_base)), self.w_first.eq(g.lane(ins.dram_base)),
            self.w_beat.eq(0), self.pending.eq(0),
        ]
        self.reject(self.sram_err)
        with m.Elif(ins.y_size == 0):
            self.finish()
        with m.Else():
            m.next = "DATA"

    def _send_data(self) -> None:
        """The DATA state: one W beat per handshake, the next SRAM read as soon as the
        entry on ``sram.data`` is used up, then the rows and responses."""
        m, g, axi, sram = self.m, self.g, self.eng.axi, self.eng.sram
        w_beat_addr, w_bcnt = self.w_beat_addr, self.w_bcnt
        rd_addr, rd_left = self.rd_addr, self.rd_left
        k = g.beats_per_entry
        m.d.comb += self.gen.run.eq(1)
        entry_last_beat = (self.w_beat == k - 1) if k > 1 else Const(1)
        row_last_beat = (self.w_x == 1) & entry_last_beat
        entry_done = Signal()           # the entry on sram.data has been used up
        beat = Signal()                 # a W handshake this cycle
        m.d.comb += [
            axi.wlast.eq(row_last_beat | g.at_boundary_end(w_beat_addr)
                         | (w_bcnt == g.max_burst - 1)),
            beat.eq(axi.wvalid & axi.wready),
        ]
        if g.lanes > 1:
            self._pack_entries(entry_done, beat)
        else:
            self._split_entry(entry_done, beat, entry_last_beat)

        m.d.comb += [sram.en.eq(entry_done & (rd_left != 0)), sram.addr.eq(rd_addr)]
        with m.If(sram.en):
            m.d.sync += [rd_addr.eq(rd_addr + 1), rd_left.eq(rd_left - 1)]

        with m.If(beat):
            m.d.sync += [w_beat_addr.eq(w_beat_addr + g.bus),
                         w_bcnt.eq(Mux(axi.wlast, 0, w_bcnt + 1))]
        self._next_entry(entry_done)
        self._count_responses()

    def _pack_entries(self, entry_done: Signal, beat: Signal) -> None:
        """Narrow entries: collect a beat's entries in ``w_acc`` and send it with its last
        entry (or the row's last), ``wstrb`` marking the lanes written."""
        m, g, axi, sram = self.m, self.g, self.eng.axi, self.eng.sram
        w_lane, w_first, w_acc, w_x = self.w_lane, self.w_first, self.w_acc, self.w_x
        # wvalid comes from registers (the beat's last entry is on sram.data,
        # which the read pipeline guarantees whenever w_active).
        lane_bits = self.eng.entry_bits
        m.d.comb += [
            axi.wvalid.eq(self.w_active & ((w_lane == g.lanes - 1) | (w_x == 1))),
            entry_done.eq(self.w_active & (~axi.wvalid | axi.wready)),
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
                    m.d.sync += w_acc[lane * lane_bits:(lane + 1) * lane_bits].eq(sram.data)
            with m.If(beat):
                m.d.sync += w_first.eq(w_lane + 1)

    def _split_entry(self, entry_done: Signal, beat: Signal, entry_last_beat) -> None:
        """Entries of one or more whole beats: send them beat by beat."""
        m, g, axi, sram = self.m, self.g, self.eng.axi, self.eng.sram
        w_beat, w_sh, beat_bits = self.w_beat, self.w_sh, self.beat_bits
        m.d.comb += [
            axi.wvalid.eq(self.w_active),
            entry_done.eq(beat & entry_last_beat),
            axi.wstrb.eq((1 << g.bus) - 1),
        ]
        if g.beats_per_entry == 1:
            m.d.comb += axi.wdata.eq(sram.data)
            return
        # The SRAM may start the next read while the entry's later beats
        # are still going out, so those wait in a shift register.
        m.d.comb += axi.wdata.eq(Mux(w_beat == 0, sram.data[:beat_bits], w_sh[:beat_bits]))
        with m.If(beat):
            m.d.sync += w_beat.eq(Mux(entry_last_beat, 0, w_beat + 1))
            with m.If(w_beat == 0):
                m.d.sync += w_sh.eq(sram.data[beat_bits:])
            with m.Else():
                m.d.sync += w_sh.eq(w_sh >> beat_bits)

    def _next_entry(self, entry_done: Signal) -> None:
        """Step to the next entry of the row, or to the start of the next row in DRAM;
        after the last row the W side stops."""
        m, g, ins = self.m, self.g, self.ins
        w_x, w_rows, w_elem = self.w_x, self.w_rows, self.w_elem
        with m.If(entry_done):
            with m.If(w_x == 1):
                next_elem = Signal(ELEM_ADDR_BITS)
                m.d.comb += next_elem.eq(w_elem + ins.x_stride)
                m.d.sync += [
                    w_x.eq(ins.x_size), w_rows.eq(w_rows - 1), w_elem.eq(next_elem),
                    self.w_beat_addr.eq(g.beat_addr(next_elem)),
                ]
                if g.lanes > 1:
                    m.d.sync += [self.w_lane.eq(g.lane(next_elem)),
                                 self.w_first.eq(g.lane(next_elem))]
                with m.If(w_rows == 1):
                    m.d.sync += self.w_active.eq(0)
            with m.Else():
                m.d.sync += w_x.eq(w_x - 1)

    def _count_responses(self) -> None:
        """Count the bursts awaiting a write response; the last response ends the
        instruction."""
        m, axi, pending = self.m, self.eng.axi, self.pending
        aw_hs = self.gen.valid & axi.awready
        b_hs = axi.bvalid
        m.d.sync += pending.eq(pending + aw_hs - b_hs)
        with m.If(b_hs & (axi.bresp != AXI_RESP_OKAY)):
            m.d.sync += self.eng.error.eq(ErrorCode.AXI_RESPONSE)
        # Every AW has gone out before its response can come back.
        with m.If(b_hs & self.gen.done & (pending == 1)):
            self.finish()
