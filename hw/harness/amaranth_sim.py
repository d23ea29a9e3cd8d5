"""Run programs on the RTL in Amaranth's own simulator (the slow, dependency-free tier).

Good for unit tests of short programs on small configs; the Verilator path
(:mod:`tessera.hw.harness.rtlsim`) runs the same Verilog orders of magnitude faster.
Both drive the accelerator exactly as a driver does: program image into DRAM,
INSN_ADDR/INSN_COUNT, CONTROL.start, wait for the interrupt, read back.
"""
from __future__ import annotations

from amaranth.sim import Simulator

from tessera.errors import DeadlockError
from tessera.isa import Program
from tessera.regmap import CONTROL_START, REG, ErrorCode

from ..accelerator import Accelerator
from .axi_dram import AxiDram
from .rtlsim import RtlResult

#: Clock period used for the simulation (only the cycle count matters).
_PERIOD = 1e-8


async def write_reg(ctx, bus, offset: int, value: int) -> None:
    """One AXI4-Lite write, as a CPU would issue it."""
    ctx.set(bus.awaddr, offset)
    ctx.set(bus.wdata, value)
    ctx.set(bus.wstrb, 0xF)
    ctx.set(bus.awvalid, 1)
    ctx.set(bus.wvalid, 1)
    ctx.set(bus.bready, 1)
    await ctx.tick().until(bus.awready)
    ctx.set(bus.awvalid, 0)
    ctx.set(bus.wvalid, 0)
    if not ctx.get(bus.bvalid):
        await ctx.tick().until(bus.bvalid)
    await ctx.tick()
    ctx.set(bus.bready, 0)


async def read_reg(ctx, bus, offset: int) -> int:
    """One AXI4-Lite read."""
    ctx.set(bus.araddr, offset)
    ctx.set(bus.arvalid, 1)
    ctx.set(bus.rready, 1)
    await ctx.tick().until(bus.arready)
    ctx.set(bus.arvalid, 0)
    if not ctx.get(bus.rvalid):
        await ctx.tick().until(bus.rvalid)
    value = ctx.get(bus.rdata)
    await ctx.tick()
    ctx.set(bus.rready, 0)
    return value


def run_program(program: Program, *, max_cycles: int = 100_000,
                vcd: str | None = None) -> RtlResult:
    """Run ``program`` on the accelerator RTL of its config in Amaranth's simulator."""
    config = program.config
    dut = Accelerator(config)
    image = program.dram_image().copy()
    dram = AxiDram(config, image)
    sim = Simulator(dut)
    sim.add_clock(_PERIOD)
    dram.attach(sim, {p.index: getattr(dut, p.name) for p in dut.ports})
    outcome: dict[str, int] = {}

    async def driver(ctx):
        bus = dut.s_axi_control
        await write_reg(ctx, bus, REG["INSN_ADDR"], program.insn_addr)
        await write_reg(ctx, bus, REG["INSN_COUNT"], len(program.instructions))
        await write_reg(ctx, bus, REG["CONTROL"], CONTROL_START)
        for cycle in range(max_cycles):
            if ctx.get(dut.interrupt):
                outcome["sim_cycles"] = cycle
                break
            await ctx.tick()
        else:
            outcome["timeout"] = 1
            return
        for name in ("CYCLES_LO", "CYCLES_HI", "ERROR_CODE", "ERROR_INDEX", "STATUS"):
            outcome[name] = await read_reg(ctx, bus, REG[name])

    sim.add_testbench(driver)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()
    if "timeout" in outcome:
        raise DeadlockError(f"the RTL did not finish within {max_cycles} cycles; check the "
                            "program's dependency tokens and its FINISH, or raise max_cycles")
    return RtlResult(program=program, dram=image,
                     cycles=outcome["CYCLES_LO"] | outcome["CYCLES_HI"] << 32,
                     error=ErrorCode(outcome["ERROR_CODE"]), error_index=outcome["ERROR_INDEX"],
                     status=outcome["STATUS"], sim_cycles=outcome["sim_cycles"])
