"""A small stand-in for the accelerator's top level, to test the Verilator harness.

:class:`CopierTop` has exactly the ports of ``tessera_top`` for a config (``aclk``,
``aresetn``, ``interrupt``, ``s_axi_control_*`` and one ``m_axi_p<k>_*`` master per
:func:`tessera.regmap.axi_ports` entry) but, instead of running programs, copies
DRAM: on start it reads ``INSN_COUNT * 16`` bytes from ``INSN_ADDR`` over
``m_axi_p0`` and writes them to ``DST`` over the first port with a write channel.
Ports it does not use are tied off (no valid, ready high).

Registers (the regmap's, plus test-only ones from 0x40):

* CONTROL, STATUS, INSN_ADDR (source), INSN_COUNT (16-byte units), CYCLES_LO/HI
  (cycles with STATUS.running set), ERROR_CODE (``AXI_RESPONSE`` on the first
  SLVERR), ERROR_INDEX (the beat index of the first bad R beat, or the burst
  index of the first bad B response), CONFIG_ID, VERSION.
* ``DST`` 0x40: destination byte address (reset 0).
* ``BURST`` 0x44: beats per burst, 1..16 (reset 16).
* ``MODE`` 0x48: bit 0 *independent*: the reader streams every burst back to
  back (several outstanding) and the writer, concurrently, writes a pattern
  (word ``j`` of beat ``k`` is ``0xA5000000 | k << 8 | j``); otherwise *copy*:
  read one burst into a buffer, write it back, wait for its B, next burst.
  Bit 1 *slow*: ``rready`` only every other cycle. Bit 2 *late AW*: each write
  burst's AW comes in the cycle after its last W beat (W before AW). Bit 3
  *combinational rready*: ``rready`` follows ``rvalid`` combinationally, which the
  harness's DRAM model must report as a protocol error.
* ``WSTRB`` 0x4C: the write strobe of every W beat (reset all ones).
* ``CHECKSUM`` 0x50...: XOR of every R beat received, ``bus_bits / 32`` words.
* ``SCRATCH`` 0x70: a register ``aresetn`` does not reset (like on-chip memory).

Every valid/ready output is a function of registers only, as the harness's
DRAM model requires (except with MODE bit 3).
"""
from __future__ import annotations

from amaranth.back import verilog
from amaranth.hdl import Array, Cat, ClockDomain, Const, Elaboratable, Module, Mux, Shape, Signal

from tessera.config import HwConfig
from tessera.hw.ports import axi_lite_signature, axi_read_members, axi_write_members
from tessera.regmap import REG, VERSION, ErrorCode, axi_ports, config_id

DST, BURST, MODE, WSTRB, CHECKSUM, SCRATCH = 0x40, 0x44, 0x48, 0x4C, 0x50, 0x70
MODE_INDEPENDENT, MODE_SLOW, MODE_LATE_AW, MODE_COMB_RREADY = 1, 2, 4, 8
MAX_BURST = 16


def pattern_word(beat: int, word: int) -> int:
    """Word ``word`` of the independent-mode write beat ``beat``."""
    return 0xA500_0000 | (beat & 0xFFFF) << 8 | word


class CopierTop(Elaboratable):
    def __init__(self, config: HwConfig) -> None:
        self.config = config
        self.bus_bytes = config.bus_bytes
        self.bits = config.bus_bytes * 8
        self.ports = axi_ports(config)
        if not self.ports[0].reads or not any(p.writer for p in self.ports):
            raise ValueError("the copier needs port 0 to read and some port to write")
        self.io: list[Signal] = []
        self.s: dict[str, Signal] = {}
        self._port("aclk", 1)
        self._port("aresetn", 1)
        self._port("interrupt", 1)
        for m, member in axi_lite_signature().members.items():
            self._port(f"s_axi_control_{m}", member.shape)
        for p in self.ports:
            members = {}
            if p.reads:
                members.update(axi_read_members(p.data_bits))
            if p.writer:
                members.update(axi_write_members(p.data_bits))
            for m, member in members.items():
                self._port(f"{p.name}_{m}", member.shape)
        self.rd = self.ports[0].name
        self.wr = next(p for p in self.ports if p.writer).name

    def _port(self, name: str, shape) -> None:
        sig = Signal(Shape.cast(shape).width, name=name)
        self.s[name] = sig
        self.io.append(sig)

    def elaborate(self, platform):
        m = Module()
        s = self.s
        B, bits = self.bus_bytes, self.bits
        log2b = B.bit_length() - 1
        m.domains.sync = cd = ClockDomain("sync")
        m.d.comb += [cd.clk.eq(s["aclk"]), cd.rst.eq(~s["aresetn"])]

        # ------------------------------------------------ registers
        src = Signal(32)
        count = Signal(32)
        dst = Signal(32)
        burst = Signal(5, init=MAX_BURST)
        mode = Signal(4)
        wstrb = Signal(B, init=(1 << B) - 1)
        done = Signal()
        error = Signal()
        running = Signal()
        cycles = Signal(64)
        err_code = Signal(32)
        err_index = Signal(32)
        checksum = Signal(bits)
        start = Signal()
        scratch = Signal(32, reset_less=True)
        m.d.comb += s["interrupt"].eq(done)

        # ------------------------------------------- AXI4-Lite slave
        c = lambda n: s[f"s_axi_control_{n}"]
        aw_ok, w_ok, bvalid = Signal(), Signal(), Signal()
        awaddr_q = Signal(8)
        wdata_q = Signal(32)
        m.d.comb += [c("awready").eq(~aw_ok & ~bvalid), c("wready").eq(~w_ok & ~bvalid),
                     c("bvalid").eq(bvalid), c("bresp").eq(0)]
        with m.If(c("awvalid") & c("awready")):
            m.d.sync += [aw_ok.eq(1), awaddr_q.eq(c("awaddr"))]
        with m.If(c("wvalid") & c("wready")):
            m.d.sync += [w_ok.eq(1), wdata_q.eq(c("wdata"))]
        with m.If(aw_ok & w_ok & ~bvalid):
            m.d.sync += [bvalid.eq(1), aw_ok.eq(0), w_ok.eq(0)]
            with m.Switch(awaddr_q[2:]):
                with m.Case(REG["CONTROL"] >> 2):
                    m.d.comb += start.eq(wdata_q[0])
                with m.Case(REG["INSN_ADDR"] >> 2):
                    m.d.sync += src.eq(wdata_q)
                with m.Case(REG["INSN_COUNT"] >> 2):
                    m.d.sync += count.eq(wdata_q)
                with m.Case(DST >> 2):
                    m.d.sync += dst.eq(wdata_q)
                with m.Case(BURST >> 2):
                    m.d.sync += burst.eq(Mux((wdata_q == 0) | (wdata_q > MAX_BURST),
                                             MAX_BURST, wdata_q))
                with m.Case(MODE >> 2):
                    m.d.sync += mode.eq(wdata_q)
                with m.Case(WSTRB >> 2):
                    m.d.sync += wstrb.eq(wdata_q)
                with m.Case(SCRATCH >> 2):
                    m.d.sync += scratch.eq(wdata_q)
        with m.If(bvalid & c("bready")):
            m.d.sync += bvalid.eq(0)

        rvalid = Signal()
        rdata = Signal(32)
        m.d.comb += [c("arready").eq(~rvalid), c("rvalid").eq(rvalid), c("rdata").eq(rdata),
                     c("rresp").eq(0)]
        with m.If(c("arvalid") & c("arready")):
            m.d.sync += rvalid.eq(1)
            with m.Switch(c("araddr")[2:]):
                regs = {
                    "STATUS": Cat(done, error, running), "INSN_ADDR": src, "INSN_COUNT": count,
                    "CYCLES_LO": cycles[:32], "CYCLES_HI": cycles[32:], "ERROR_CODE": err_code,
                    "ERROR_INDEX": err_index, "CONFIG_ID": Const(config_id(self.config), 32),
                    "VERSION": Const(VERSION, 32),
                }
                for name, value in regs.items():
                    with m.Case(REG[name] >> 2):
                        m.d.sync += rdata.eq(value)
                extra = {DST: dst, BURST: burst, MODE: mode, WSTRB: wstrb, SCRATCH: scratch}
                for i in range(bits // 32):
                    extra[CHECKSUM + 4 * i] = checksum[32 * i:32 * (i + 1)]
                for offset, value in extra.items():
                    with m.Case(offset >> 2):
                        m.d.sync += rdata.eq(value)
                with m.Default():
                    m.d.sync += rdata.eq(0)
        with m.If(rvalid & c("rready")):
            m.d.sync += rvalid.eq(0)

        # ------------------------------------------------- tie-offs
        for p in self.ports:
            if p.name not in (self.rd, self.wr):
                if p.reads:
                    m.d.comb += [s[f"{p.name}_{n}"].eq(0) for n in
                                 ("arvalid", "araddr", "arlen", "arsize", "arburst", "arid")]
                    m.d.comb += s[f"{p.name}_rready"].eq(1)
            if p.name != self.wr and p.writer:
                m.d.comb += [s[f"{p.name}_{n}"].eq(0) for n in
                             ("awvalid", "awaddr", "awlen", "awsize", "awburst", "awid",
                              "wvalid", "wdata", "wstrb", "wlast")]
                m.d.comb += s[f"{p.name}_bready"].eq(1)
            if p.name == self.wr and p.reads and p.name != self.rd:
                m.d.comb += [s[f"{p.name}_{n}"].eq(0) for n in
                             ("arvalid", "araddr", "arlen", "arsize", "arburst", "arid")]
                m.d.comb += s[f"{p.name}_rready"].eq(1)
        if self.rd == self.wr:
            raise ValueError("the copier reads and writes over different ports")

        r = lambda n: s[f"{self.rd}_{n}"]
        w = lambda n: s[f"{self.wr}_{n}"]
        indep = mode[0]

        # -------------------------------------------------- engine state
        COPY_READ, COPY_WRITE = 0, 1
        copy_state = Signal(2)          # 0 issue AR / read, 1 write, 2 wait B
        copy_n = Signal(5)
        buf = Array(Signal(bits, name=f"buf{i}") for i in range(MAX_BURST))
        rd_addr, wr_addr = Signal(32), Signal(32)
        ar_left, r_left, w_left = Signal(32), Signal(32), Signal(32)
        ar_wait = Signal()              # copy mode: a burst is being read
        r_idx = Signal(5)
        r_beat = Signal(32)             # global R beat index
        w_beat = Signal(32)             # global W beat index
        w_cnt = Signal(5)               # beats sent in the current write burst
        aw_sent = Signal()
        b_pending = Signal(32)
        b_count = Signal(32)
        tog = Signal()

        def fail(index):
            with m.If(err_code == 0):
                m.d.sync += [err_code.eq(ErrorCode.AXI_RESPONSE), err_index.eq(index), error.eq(1)]

        # AR issuer
        ar_n = Signal(5)
        m.d.comb += ar_n.eq(Mux(ar_left < burst, ar_left, burst))
        m.d.comb += [
            r("arvalid").eq(running & (ar_left != 0)
                            & (indep | ((copy_state == COPY_READ) & ~ar_wait))),
            r("araddr").eq(rd_addr), r("arlen").eq(ar_n - 1), r("arsize").eq(log2b),
            r("arburst").eq(1), r("arid").eq(1),
        ]
        with m.If(r("arvalid") & r("arready")):
            m.d.sync += [ar_left.eq(ar_left - ar_n), rd_addr.eq(rd_addr + (ar_n << log2b)),
                         ar_wait.eq(1), copy_n.eq(ar_n)]

        # R consumer
        m.d.sync += tog.eq(~tog)
        m.d.comb += r("rready").eq(Mux(mode[3], running & r("rvalid"),
                                       running & (~mode[1] | tog)))
        with m.If(r("rvalid") & r("rready")):
            m.d.sync += [checksum.eq(checksum ^ r("rdata")), buf[r_idx].eq(r("rdata")),
                         r_idx.eq(r_idx + 1), r_beat.eq(r_beat + 1), r_left.eq(r_left - 1)]
            with m.If(r("rresp") != 0):
                fail(r_beat)
            with m.If(r("rlast")):
                m.d.sync += r_idx.eq(0)
                with m.If(~indep):
                    m.d.sync += [copy_state.eq(COPY_WRITE), ar_wait.eq(0)]

        # writer: AW and the W beats of a burst together
        w_active = Signal()
        w_n = Signal(5)
        m.d.comb += [
            w_active.eq(running & Mux(indep, w_left != 0, copy_state == COPY_WRITE)),
            w_n.eq(Mux(indep, Mux(w_left < burst, w_left, burst), copy_n)),
        ]
        pattern = Cat(*(Cat(Const(j, 8), w_beat[:16], Const(0xA5, 8)) for j in range(bits // 32)))
        m.d.comb += [
            w("awvalid").eq(w_active & ~aw_sent & (~mode[2] | (w_cnt == w_n))),
            w("awaddr").eq(wr_addr), w("awlen").eq(w_n - 1),
            w("awsize").eq(log2b), w("awburst").eq(1), w("awid").eq(3),
            w("wvalid").eq(w_active & (w_cnt != w_n)),
            w("wdata").eq(Mux(indep, pattern, buf[w_cnt])),
            w("wstrb").eq(wstrb), w("wlast").eq(w_cnt == w_n - 1),
            w("bready").eq(running),
        ]
        aw_hs = w("awvalid") & w("awready")
        w_hs = w("wvalid") & w("wready")
        b_hs = w("bvalid") & w("bready")
        with m.If(aw_hs):
            m.d.sync += aw_sent.eq(1)
        with m.If(w_hs):
            m.d.sync += [w_cnt.eq(w_cnt + 1), w_beat.eq(w_beat + 1)]
        burst_done = w_active & (aw_sent | aw_hs) & ((w_cnt == w_n) | (w_hs & (w_cnt == w_n - 1)))
        with m.If(burst_done):
            m.d.sync += [aw_sent.eq(0), w_cnt.eq(0), wr_addr.eq(wr_addr + (w_n << log2b)),
                         w_left.eq(w_left - w_n)]
            with m.If(~indep):
                m.d.sync += copy_state.eq(2)
        m.d.sync += b_pending.eq(b_pending + burst_done - b_hs)
        with m.If(b_hs):
            m.d.sync += b_count.eq(b_count + 1)
            with m.If(w("bresp") != 0):
                fail(b_count)
            with m.If(~indep):
                m.d.sync += copy_state.eq(COPY_READ)

        # ------------------------------------------------ run control
        with m.If(running):
            m.d.sync += cycles.eq(cycles + 1)
            with m.If((ar_left == 0) & (r_left == 0) & (w_left == 0) & (b_pending == 0)
                      & ~aw_sent & (w_cnt == 0)):
                m.d.sync += [running.eq(0), done.eq(1)]
        with m.Elif(start):
            beats = Signal(32)
            m.d.comb += beats.eq((count << 4) >> log2b)
            m.d.sync += [
                running.eq(1), done.eq(0), error.eq(0), cycles.eq(0), err_code.eq(0),
                err_index.eq(0), checksum.eq(0), rd_addr.eq(src), wr_addr.eq(dst),
                ar_left.eq(beats), r_left.eq(beats), w_left.eq(beats), copy_state.eq(COPY_READ),
                ar_wait.eq(0), r_idx.eq(0), r_beat.eq(0), w_beat.eq(0), w_cnt.eq(0),
                aw_sent.eq(0), b_pending.eq(0), b_count.eq(0),
            ]
        return m


def copier_verilog(config: HwConfig) -> str:
    """The Verilog of :class:`CopierTop` for ``config``, module ``tessera_top``."""
    top = CopierTop(config)
    return verilog.convert(top, name="tessera_top", ports=top.io, emit_src=False)
