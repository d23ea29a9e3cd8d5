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
from tessera.isa.instructions import LOAD_MODULE
from tessera.isa.encoding import MEM_BITS, OPCODE_BITS, get_isa
from tessera.regmap import AXI_BOUNDARY_BYTES, ErrorCode, axi_id

from tessera.regmap import ERROR_CODE_BITS
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
        cfg = self.config
        bus_bits = cfg.bus_bytes * 8
        chunk = timing.fetch_chunk_insns(cfg)
        chunk_beats = timing.fetch_chunk_beats(cfg, chunk)
        axi = self.axi

        next_index = Signal(32)           # first instruction of the current burst
        count = Signal(range(chunk + 1))  # instructions in the current burst
        beat = Signal(range(chunk_beats + 1))
        k = Signal(range(chunk + 1))      # next instruction of the burst to dispatch
        buf = Signal(chunk_beats * bus_bits)

        remaining = Signal(32)
        m.d.comb += remaining.eq(self.insn_count - next_index)
        n_now = Signal(range(chunk + 1))
        m.d.comb += n_now.eq(Mux(remaining < chunk, remaining, chunk))
        beats_now = Signal(range(chunk_beats + 1))
        m.d.comb += beats_now.eq((n_now * INSN_BYTES + cfg.bus_bytes - 1) // cfg.bus_bytes)

        m.d.comb += [axi.arid.eq(axi_id("fetch")), axi.arsize.eq(exact_log2(cfg.bus_bytes)),
                     axi.arburst.eq(AXI_BURST_INCR),
                     axi.araddr.eq(self.insn_addr + next_index * INSN_BYTES),
                     axi.arlen.eq(beats_now - 1)]

        # ---- routing of the instruction being dispatched
        word = Signal(INSN_BITS)
        m.d.comb += word.eq(buf.word_select(k, INSN_BITS))
        opcode = word[:OPCODE_BITS]
        mem_field = get_isa(cfg).layouts[Opcode.LOAD].field("mem")
        mem = word[mem_field.offset:mem_field.offset + MEM_BITS]
        target = {t: Signal(name=f"to_{t}") for t in TARGETS}
        bad = Signal(ERROR_CODE_BITS)
        with m.Switch(opcode):
            with m.Case(Opcode.LOAD):
                with m.Switch(mem):
                    for mt, module in LOAD_MODULE.items():
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
        index = Signal(32)
        m.d.comb += index.eq(next_index + k)
        ready = Signal()
        m.d.comb += ready.eq(sum(target[t] & getattr(self, f"cmd_{t}_rdy") for t in TARGETS) != 0)
        for t in TARGETS:
            m.d.comb += getattr(self, f"cmd_{t}_data").eq(word | (index << INSN_BITS))

        # A start resets this module (the top level's ResetInserter), which puts it
        # in REQUEST with next_index 0: the first burst is requested in the run's cycle 0.
        # IDLE (every instruction dispatched, or an error) has no way out but that reset.
        with m.FSM(init="REQUEST"):
            with m.State("IDLE"):
                pass
            with m.State("REQUEST"):
                with m.If(self.run):
                    with m.If(self.halt | (next_index >= self.insn_count)):
                        m.next = "IDLE"
                    with m.Elif(self.insn_addr[:exact_log2(AXI_BOUNDARY_BYTES)] != 0):
                        m.d.comb += [self.error_code.eq(ErrorCode.DRAM_ADDRESS),
                                     self.error_index.eq(next_index)]
                        m.next = "IDLE"
                    with m.Else():
                        m.d.comb += axi.arvalid.eq(1)
                        with m.If(axi.arready):
                            m.d.sync += [count.eq(n_now), beat.eq(0), k.eq(0)]
                            m.next = "RECEIVE"
            with m.State("RECEIVE"):
                m.d.comb += [self.busy.eq(1), axi.rready.eq(1)]
                with m.If(axi.rvalid):
                    m.d.sync += [buf.word_select(beat, bus_bits).eq(axi.rdata),
                                 beat.eq(beat + 1)]
                    with m.If(axi.rresp != 0):
                        m.d.comb += [self.error_code.eq(ErrorCode.AXI_RESPONSE),
                                     self.error_index.eq(next_index)]
                    with m.If(axi.rlast):
                        m.next = "DISPATCH"
            with m.State("DISPATCH"):
                m.d.comb += self.busy.eq(1)
                with m.If(self.halt):
                    m.next = "IDLE"
                with m.Elif(bad != 0):
                    m.d.comb += [self.error_code.eq(bad), self.error_index.eq(index)]
                    m.next = "IDLE"
                with m.Elif(ready):
                    for t in TARGETS:
                        m.d.comb += getattr(self, f"cmd_{t}_en").eq(target[t])
                    m.d.sync += k.eq(k + 1)
                    with m.If(k + 1 == count):
                        m.d.sync += next_index.eq(next_index + count)
                        m.next = "REQUEST"
        return m


def exact_log2(n: int) -> int:
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1
