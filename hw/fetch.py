"""Instruction fetch: read the stream in bursts, route each instruction to the
command queue of the module that executes it.

Timing (docs/timing.md, "Fetch"): one burst of ``fetch_chunk_insns``
instructions is requested, received, then dispatched one instruction per
cycle (stalling while the target queue is full); the next burst is requested
the cycle after the last dispatch.
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from tessera import timing
from tessera.config import HwConfig
from tessera.errors import ConfigError
from tessera.isa import INSN_BITS, INSN_BYTES, MemType, Opcode
from tessera.isa.encoding import MEM_BITS, OPCODE_BITS, get_isa
from tessera.regmap import AXI_BOUNDARY_BYTES, ErrorCode, axi_id

from tessera.regmap import ERROR_CODE_BITS
from .dma import load_modules
from .ports import AXI_BURST_INCR, axi_signature
from .sequencer import INDEX_BITS

#: Target queues, in the order of the ``cmd_*`` members.
TARGETS = ("load", "compute", "store")


class Fetch(wiring.Component):
    """Reads instructions over AXI and feeds the load, compute and store command queues.

    Malformed words (reserved opcode, a memory type the instruction cannot
    use) raise ``error_code`` with ``error_index`` instead of being dispatched.
    The stream must start on a 4 KiB boundary (as ``Program`` and page-aligned
    buffers place it), so no burst crosses one.
    """

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        chunk_bytes = timing.fetch_chunk_insns(config) * INSN_BYTES
        if AXI_BOUNDARY_BYTES % chunk_bytes:
            raise ConfigError(
                f"an instruction burst of {chunk_bytes} bytes must divide the AXI 4 KiB boundary "
                f"so bursts never cross it; choose max_burst_beats * bus_bytes as a power of two "
                f"(config {config.name!r})")
        members = {
            "run": In(1), "halt": In(1),
            "insn_addr": In(32), "insn_count": In(32),
            "axi": Out(axi_signature(config.bus_bytes * 8, write=False)),
            "error_code": Out(ERROR_CODE_BITS), "error_index": Out(INDEX_BITS),
            "busy": Out(1),            # a burst is in flight or being dispatched
        }
        for t in TARGETS:
            members[f"cmd_{t}_data"] = Out(INSN_BITS + INDEX_BITS)
            members[f"cmd_{t}_en"] = Out(1)
            members[f"cmd_{t}_rdy"] = In(1)
        super().__init__(members)

    def elaborate(self, platform) -> Module:
        m = Module()
        _FetchLogic(self, m).build()
        return m


class _FetchLogic:
    """One elaboration of :class:`Fetch`: the registers of the current burst, and the
    steps that request it, receive it and dispatch its instructions."""

    def __init__(self, fetch: Fetch, m: Module) -> None:
        self.fetch, self.m = fetch, m
        cfg = self.cfg = fetch.config
        self.bus_bits = cfg.bus_bytes * 8
        chunk = timing.fetch_chunk_insns(cfg)
        chunk_beats = timing.fetch_chunk_beats(cfg, chunk)
        self.next_index = Signal(32)           # first instruction of the current burst
        self.count = Signal(range(chunk + 1))  # instructions in the current burst
        self.beat = Signal(range(chunk_beats + 1))
        self.k = Signal(range(chunk + 1))      # next instruction of the burst to dispatch
        self.buf = Signal(chunk_beats * self.bus_bits)
        self.chunk, self.chunk_beats = chunk, chunk_beats

    def build(self) -> None:
        """The read address, the routing of the instruction at ``k``, and the FSM."""
        m = self.m
        self._drive_read_address()
        self._route()
        # A start resets this module (the top level's ResetInserter), which puts it
        # in REQUEST with next_index 0: the first burst is requested in the run's cycle 0.
        # IDLE (every instruction dispatched, or an error) has no way out but that reset.
        with m.FSM(init="REQUEST"):
            with m.State("IDLE"):
                pass
            with m.State("REQUEST"):
                self._request()
            with m.State("RECEIVE"):
                self._receive()
            with m.State("DISPATCH"):
                self._dispatch()

    def _drive_read_address(self) -> None:
        """The next burst on the AR channel: up to a chunk of the instructions left."""
        m, cfg, chunk, axi = self.m, self.cfg, self.chunk, self.fetch.axi
        remaining = Signal(32)
        m.d.comb += remaining.eq(self.fetch.insn_count - self.next_index)
        self.n_now = n_now = Signal(range(chunk + 1))
        m.d.comb += n_now.eq(Mux(remaining < chunk, remaining, chunk))
        beats_now = Signal(range(self.chunk_beats + 1))
        m.d.comb += beats_now.eq((n_now * INSN_BYTES + cfg.bus_bytes - 1) // cfg.bus_bytes)

        m.d.comb += [axi.arid.eq(axi_id("fetch")), axi.arsize.eq(exact_log2(cfg.bus_bytes)),
                     axi.arburst.eq(AXI_BURST_INCR),
                     axi.araddr.eq(self.fetch.insn_addr + self.next_index * INSN_BYTES),
                     axi.arlen.eq(beats_now - 1)]

    def _route(self) -> None:
        """The instruction at ``k``: the queue it goes to (``target``), or the error it
        raises (``bad``); its global ``index``; and whether its queue is ``ready``."""
        m, fetch = self.m, self.fetch
        word = Signal(INSN_BITS)
        m.d.comb += word.eq(self.buf.word_select(self.k, INSN_BITS))
        self.target = {t: Signal(name=f"to_{t}") for t in TARGETS}
        self.bad = Signal(ERROR_CODE_BITS)
        self._decode_target(word)
        self.index = index = Signal(32)
        m.d.comb += index.eq(self.next_index + self.k)
        self.ready = ready = Signal()
        m.d.comb += ready.eq(sum(self.target[t] & getattr(fetch, f"cmd_{t}_rdy")
                                 for t in TARGETS) != 0)
        for t in TARGETS:
            m.d.comb += getattr(fetch, f"cmd_{t}_data").eq(word | (index << INSN_BITS))

    def _decode_target(self, word: Signal) -> None:
        """Set ``target`` from the opcode (and a LOAD's or STORE's memory type), or ``bad``
        for a reserved opcode or a memory type the instruction cannot use."""
        m, target, bad = self.m, self.target, self.bad
        opcode = word[:OPCODE_BITS]
        mem_field = get_isa(self.cfg).layouts[Opcode.LOAD].field("mem")
        mem = word[mem_field.offset:mem_field.offset + MEM_BITS]
        with m.Switch(opcode):
            with m.Case(Opcode.LOAD):
                with m.Switch(mem):
                    for mt, module in load_modules(self.cfg).items():
                        with m.Case(mt):
                            m.d.comb += target[module].eq(1)
                    with m.Default():
                        m.d.comb += bad.eq(ErrorCode.MEM_TYPE)
            with m.Case(Opcode.STORE):
                with m.If(mem == MemType.OUT):
                    m.d.comb += target["store"].eq(1)
                with m.Else():
                    m.d.comb += bad.eq(ErrorCode.MEM_TYPE)
            with m.Case(Opcode.GEMM, Opcode.ALU, Opcode.FINISH):
                m.d.comb += target["compute"].eq(1)
            with m.Default():
                m.d.comb += bad.eq(ErrorCode.OPCODE)

    def _request(self) -> None:
        """The REQUEST state: request the next burst, or stop (halted, every instruction
        fetched, or a stream not on a 4 KiB boundary)."""
        m, fetch, axi, next_index = self.m, self.fetch, self.fetch.axi, self.next_index
        with m.If(fetch.run):
            with m.If(fetch.halt | (next_index >= fetch.insn_count)):
                m.next = "IDLE"
            with m.Elif(fetch.insn_addr[:exact_log2(AXI_BOUNDARY_BYTES)] != 0):
                m.d.comb += [fetch.error_code.eq(ErrorCode.DRAM_ADDRESS),
                             fetch.error_index.eq(next_index)]
                m.next = "IDLE"
            with m.Else():
                m.d.comb += axi.arvalid.eq(1)
                with m.If(axi.arready):
                    m.d.sync += [self.count.eq(self.n_now), self.beat.eq(0), self.k.eq(0)]
                    m.next = "RECEIVE"

    def _receive(self) -> None:
        """The RECEIVE state: store the burst's beats in ``buf``."""
        m, fetch, axi, beat = self.m, self.fetch, self.fetch.axi, self.beat
        m.d.comb += [fetch.busy.eq(1), axi.rready.eq(1)]
        with m.If(axi.rvalid):
            m.d.sync += [self.buf.word_select(beat, self.bus_bits).eq(axi.rdata),
                         beat.eq(beat + 1)]
            with m.If(axi.rresp != 0):
                m.d.comb += [fetch.error_code.eq(ErrorCode.AXI_RESPONSE),
                             fetch.error_index.eq(self.next_index)]
            with m.If(axi.rlast):
                m.next = "DISPATCH"

    def _dispatch(self) -> None:
        """The DISPATCH state: one instruction per cycle into its queue while that has
        room; after the burst's last, request the next."""
        m, fetch, k, count = self.m, self.fetch, self.k, self.count
        m.d.comb += fetch.busy.eq(1)
        with m.If(fetch.halt):
            m.next = "IDLE"
        with m.Elif(self.bad != 0):
            m.d.comb += [fetch.error_code.eq(self.bad), fetch.error_index.eq(self.index)]
            m.next = "IDLE"
        with m.Elif(self.ready):
            for t in TARGETS:
                m.d.comb += getattr(fetch, f"cmd_{t}_en").eq(self.target[t])
            m.d.sync += k.eq(k + 1)
            with m.If(k + 1 == count):
                m.d.sync += self.next_index.eq(self.next_index + count)
                m.next = "REQUEST"


def exact_log2(n: int) -> int:
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1
