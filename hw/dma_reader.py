"""The LOAD engine: 2-D strided DMA from DRAM into an on-chip buffer, with zero padding.

It shares its geometry, instruction checks and address channel with the STORE engine
(:mod:`.dma`, whose docstring describes both); this module holds what only reading does:
the pad phases, assembling entries from the R beats (of one AXI master, or of the pieces
several masters read at once).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed

from tessera.config import HwConfig
from tessera.isa import MemType
from tessera.isa.encoding import DMA_SIZE_BITS, PAD_BITS
from tessera.regmap import ErrorCode

from .dma import DmaEngine, EngineLogic
from .ports import AXI_RESP_OKAY

__all__ = ["DmaReader"]


def _times_pad(pad, value):
    """``pad * value`` for a pad of ``PAD_BITS`` bits, as shift-and-add: a few adders in
    LUTs, where a ``*`` would take a DSP48 (the DSPs are the GEMM core's and the ALU's)."""
    return sum(Mux(pad[i], value << i, 0) for i in range(len(pad)))[:len(value) + len(pad)]


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

    With ``ports`` > 1 (``tessera.timing.load_ports``) the engine has that many AXI
    masters (``axis``); master ``p`` reads the ``p``-th equal piece of every entry, and
    an entry is written when all its pieces are in: a master whose piece is complete
    holds its last beat (``rready`` low) until the others' are.
    """

    def __init__(self, config: HwConfig, mem: MemType, axi_id: int,
                 also: tuple[MemType, ...] = (), ports: int = 1) -> None:
        super().__init__(config, mem, axi_id, read=True, also=also, ports=ports)
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
        m.d.comb += [gen.init.eq(1) for gen in self.gens]
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
        m, ins, sram = self.m, self.ins, self.eng.sram
        r_x, r_rows, r_addr = self.r_x, self.r_rows, self.r_addr
        m.d.comb += [gen.run.eq(1) for gen in self.gens]
        entry_done = Signal()
        if len(self.gens) == 1:
            self._assemble_entry(entry_done)
        else:
            self._assemble_pieces(entry_done)
        m.d.comb += [sram.en.eq(entry_done), sram.addr.eq(r_addr)]
        for axi in self.eng.axis:
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

    def _assemble_pieces(self, entry_done: Signal) -> None:
        """Drive ``sram.data`` and ``entry_done`` from the pieces the masters read: each
        piece's earlier beats wait in a shift register, its last one live or, when it came
        before another piece's, held (its master's ``rready`` low, from a register) until
        the entry is complete."""
        m, g = self.m, self.g
        beats = g.beats_per_entry // len(self.gens)
        beat_bits = 8 * g.bus
        complete, pieces, updates = [], [], []
        for p, axi in enumerate(self.eng.axis):
            count = Signal(range(beats), name=f"piece{p}_beat")
            held = Signal(beat_bits, name=f"piece{p}_held")
            full = Signal(name=f"piece{p}_full")
            early = Signal(beat_bits * (beats - 1), name=f"piece{p}_early")
            taken = axi.rvalid & ~full
            last = taken & (count == beats - 1)
            m.d.comb += axi.rready.eq(~full)
            complete.append(full | last)
            pieces.append(Cat(early, Mux(full, held, axi.rdata)))
            with m.If(taken):
                m.d.sync += count.eq(Mux(last, 0, count + 1))
                if beats > 1:
                    with m.If(~last):
                        m.d.sync += early.eq(Cat(early[beat_bits:], axi.rdata)
                                             if beats > 2 else axi.rdata)
            updates.append((full, held, last, axi.rdata))
        m.d.comb += [entry_done.eq(Cat(*complete).all()), self.eng.sram.data.eq(Cat(*pieces))]
        for full, held, last, rdata in updates:
            with m.If(entry_done):
                m.d.sync += full.eq(0)
            with m.Elif(last):
                m.d.sync += [full.eq(1), held.eq(rdata)]
