"""The AXI4-Lite control slave: start, instruction address and count, status,
cycle counter, error registers (offsets and bits from :mod:`tessera.regmap`)."""
from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from tessera.config import HwConfig
from tessera.regmap import (CONTROL_START, CTRL_DATA_BITS, ERROR_CODE_BITS, REG, VERSION,
                            config_id)

from .ports import axi_lite_signature
from .sequencer import INDEX_BITS



class Control(wiring.Component):
    """Registers and run state.

    A write of CONTROL.start (when not running) pulses ``start`` for one cycle
    and sets ``running`` from the next cycle, the run's cycle 0. The core
    raises ``finish`` in the one cycle FINISH executes; ``running`` drops
    after it, so CYCLES counts exactly the cycles the simulator reports. An
    error (``error_code`` non-zero with its ``error_index``) is latched; the
    core then drains and raises ``stopped``, which ends the run with the
    error bit.
    """

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        super().__init__({
            "bus": In(axi_lite_signature()),
            "start": Out(1), "running": Out(1),
            "insn_addr": Out(32), "insn_count": Out(32),
            "finish": In(1),
            "error_code": In(ERROR_CODE_BITS), "error_index": In(INDEX_BITS),
            "error": Out(1),              # an error was latched in this run
            "stopped": In(1),             # after an error: the core has drained
            "interrupt": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        bus = self.bus
        done = Signal()
        cycles = Signal(64)
        err_code = Signal(ERROR_CODE_BITS)
        err_index = Signal(INDEX_BITS)
        running = self.running

        # ---- run state
        m.d.sync += self.start.eq(0)
        with m.If(self.start):
            m.d.sync += [running.eq(1), done.eq(0), self.error.eq(0), err_code.eq(0),
                         cycles.eq(0)]
        with m.Elif(running):
            m.d.sync += cycles.eq(cycles + 1)
            with m.If(self.finish | (self.error & self.stopped)):
                m.d.sync += [running.eq(0), done.eq(1)]
            with m.If((self.error_code != 0) & ~self.error):
                m.d.sync += [self.error.eq(1), err_code.eq(self.error_code),
                             err_index.eq(self.error_index)]
        m.d.comb += self.interrupt.eq(done)

        # ---- AXI4-Lite writes: take address and data together, answer OKAY.
        aw_ok = Signal()
        m.d.comb += aw_ok.eq(bus.awvalid & bus.wvalid & ~bus.bvalid)
        m.d.comb += [bus.awready.eq(aw_ok), bus.wready.eq(aw_ok), bus.bresp.eq(0)]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        with m.If(aw_ok):
            m.d.sync += bus.bvalid.eq(1)
            with m.Switch(bus.awaddr):
                with m.Case(REG["CONTROL"]):
                    with m.If((bus.wdata & CONTROL_START).any() & ~running & ~self.start):
                        m.d.sync += self.start.eq(1)
                with m.Case(REG["INSN_ADDR"]):
                    m.d.sync += self.insn_addr.eq(bus.wdata)
                with m.Case(REG["INSN_COUNT"]):
                    m.d.sync += self.insn_count.eq(bus.wdata)

        # ---- AXI4-Lite reads: one cycle to the data.
        status = Signal(CTRL_DATA_BITS)
        m.d.comb += status.eq(done | (self.error << 1) | (running << 2))
        values = {
            "STATUS": status, "INSN_ADDR": self.insn_addr, "INSN_COUNT": self.insn_count,
            "CYCLES_LO": cycles[:32], "CYCLES_HI": cycles[32:], "ERROR_CODE": err_code,
            "ERROR_INDEX": err_index, "CONFIG_ID": config_id(self.config), "VERSION": VERSION,
        }
        m.d.comb += [bus.arready.eq(~bus.rvalid), bus.rresp.eq(0)]
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        with m.If(bus.arvalid & ~bus.rvalid):
            m.d.sync += [bus.rvalid.eq(1), bus.rdata.eq(0)]
            with m.Switch(bus.araddr):
                for name, value in values.items():
                    with m.Case(REG[name]):
                        m.d.sync += bus.rdata.eq(value)
        return m
