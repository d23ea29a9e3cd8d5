"""Step 3 of the board flow: the Tcl of the block design :mod:`tessera.hwh` describes.

The PS with the board preset (DDR, MIO), PL clock 0 at the config's clock with the
divisors of :meth:`Board.pl_clock <tessera.boards.Board.pl_clock>` (plus a Clocking
Wizard when the PS cannot come within 1% of it), an AXI interconnect from the PS master
to ``s_axi_control``, a SmartConnect from each ``m_axi_p<k>`` to the PS's HP port ``k``,
the interrupt, a ``proc_sys_reset``, and the address map (our registers at
``Board.registers``, every master's DDR segment).
"""
from __future__ import annotations

from tessera.boards import CLOCK_TOLERANCE
from tessera.hwh import CONTROL_INTERFACE, IP_INSTANCE, IP_VLNV
from tessera.regmap import CTRL_DATA_BITS

from .plan import FlowPlan
from .tcl import TclScript, bd_intf, bd_pin, mhz, tcl_dict

__all__ = ["block_design"]

#: How close (in MHz) the PL clock Vivado reports must be to Board.pl_clock's: Vivado
#: rounds the PS reference clock differently in the sixth decimal.
_CLOCK_REPORT_MHZ = 0.02

# Xilinx IP the block design uses besides the PS (versions of Vivado 2020.2 to 2024.x).
_AXI_INTERCONNECT = "xilinx.com:ip:axi_interconnect:2.1"
_SMARTCONNECT = "xilinx.com:ip:smartconnect:1.0"
_PROC_SYS_RESET = "xilinx.com:ip:proc_sys_reset:5.0"
_CLK_WIZ = "xilinx.com:ip:clk_wiz:6.0"

# Block-design cell names of the infrastructure.
_CONTROL_IC = "control_interconnect"
_RESET = "reset_aclk"
_CLK_WIZARD = "clk_wiz_0"


def _smartconnect(port: int) -> str:
    """The cell name of the SmartConnect of our master ``m_axi_p<port>``."""
    return f"p{port}_smartconnect"


def block_design(plan: FlowPlan, script: TclScript) -> None:
    """The block design, cell by cell and net by net, then validated against the clock
    the .hwh promises."""
    _processing_system(plan, script)
    aclk = _clocking(plan, script)
    _control_path(plan, script)
    _memory_paths(plan, script)
    _clock_reset_interrupt(plan, script, aclk)
    _address_map(plan, script)
    _validate(plan, script)


def _processing_system(plan: FlowPlan, script: TclScript) -> None:
    """The PS with the board preset and our parameters, our IP and the reset cell."""
    ps, clock = plan.ps, plan.clock
    script.section(
        f"Block design: the {ps.module} with the board preset, {IP_INSTANCE}, "
        "interconnects, clock, reset",
        "and interrupt: the design tessera.hwh describes.",
    )
    script.emit(
        "create_bd_design $name",
        f"create_bd_cell -type ip -vlnv {ps.vlnv} {ps.instance}",
        f"apply_bd_automation -rule xilinx.com:bd_rule:{ps.module} "
        f"-config {{{plan.vivado.automation}}} [get_bd_cells {ps.instance}]",
        f"# PL clock 0 = {ps.pll.name} ({mhz(ps.pll_mhz)} MHz) / {clock.divisor0} / "
        f"{clock.divisor1} = {mhz(clock.mhz)} MHz (tessera.boards.Board.pl_clock); "
        "the HP ports",
        "# our masters use, at their data width; the PS master that reaches s_axi_control; "
        "the interrupt.",
        f"set_property -dict {tcl_dict(_ps_properties(plan), 'CONFIG.')} "
        f"[get_bd_cells {ps.instance}]",
        f"create_bd_cell -type ip -vlnv {IP_VLNV} {IP_INSTANCE}",
        f"create_bd_cell -type ip -vlnv {_PROC_SYS_RESET} {_RESET}",
        "",
    )


def _ps_properties(plan: FlowPlan) -> dict[str, str]:
    """The PS parameters the flow sets on top of the board preset: those tessera.hwh lists
    that Vivado lets a user set, and the ports the preset may enable that we leave off."""
    ps, vivado, clock = plan.ps, plan.vivado, plan.clock
    enable, source, divisor0, divisor1 = vivado.pl0
    values = {name: "0" for name in vivado.masters}
    values[ps.master.enable] = "1"
    if ps.master.width:
        values[ps.master.width] = str(CTRL_DATA_BITS)
    used = {port.index: port for port in plan.ports}
    for index, slave in enumerate(ps.slaves):
        values[slave.enable] = "1" if index in used else "0"
        if index in used and slave.width:
            values[slave.width] = str(used[index].data_bits)
    values.update(ps.irq_enable)
    values.update({enable: "1", source: ps.pll.name,
                   ps.fclk_param: f"{plan.config.clock_mhz:g}",
                   divisor0: str(clock.divisor0), divisor1: str(clock.divisor1)})
    values.update(vivado.extra)
    return values


def _clocking(plan: FlowPlan, script: TclScript) -> str:
    """Emit the clock source of ``aclk``; return its pin."""
    ps, config, clock = plan.ps, plan.config, plan.clock
    fclk = bd_pin(ps.instance, ps.fclk)
    if not plan.wizard:
        script.emit(f"# {IP_INSTANCE} runs on PL clock 0: {mhz(clock.mhz)} MHz for the "
                    f"config's {config.clock_mhz:g} MHz.")
        return fclk
    error = abs(clock.mhz - config.clock_mhz) / config.clock_mhz
    wizard = {"PRIM_SOURCE": "No_buffer",
              "CLKOUT1_REQUESTED_OUT_FREQ": f"{config.clock_mhz:g}",
              "USE_LOCKED": "true", "USE_RESET": "true",
              "RESET_TYPE": "ACTIVE_LOW", "RESET_PORT": "resetn"}
    script.emit(
        f"# Clocking Wizard: the closest PL clock 0 the {ps.pll.name} gives is "
        f"{mhz(clock.mhz)} MHz ({mhz(ps.pll_mhz)} / {clock.divisor0} / {clock.divisor1}),",
        f"# {error:.2%} off the config's {config.clock_mhz:g} MHz (more than "
        f"{CLOCK_TOLERANCE:.0%}), so {_CLK_WIZARD} makes exactly {config.clock_mhz:g} MHz "
        "from it.",
        "# Its input frequency propagates from the PS pin (setting it could disagree with "
        "the PS's",
        "# rounding); the PS clock already drives a global buffer, hence No_buffer.",
        f"create_bd_cell -type ip -vlnv {_CLK_WIZ} {_CLK_WIZARD}",
        f"set_property -dict {tcl_dict(wizard, 'CONFIG.')} "
        f"[get_bd_cells {_CLK_WIZARD}]",
        f"connect_bd_net {fclk} {bd_pin(_CLK_WIZARD, 'clk_in1')}",
        f"connect_bd_net {bd_pin(ps.instance, ps.fclk_reset)} "
        f"{bd_pin(_CLK_WIZARD, 'resetn')}",
        f"connect_bd_net {bd_pin(_CLK_WIZARD, 'locked')} {bd_pin(_RESET, 'dcm_locked')}",
    )
    return bd_pin(_CLK_WIZARD, "clk_out1")


def _control_path(plan: FlowPlan, script: TclScript) -> None:
    """The AXI interconnect from the PS master to our control registers."""
    ps = plan.ps
    script.emit(
        f"create_bd_cell -type ip -vlnv {_AXI_INTERCONNECT} {_CONTROL_IC}",
        f"set_property -dict [list CONFIG.NUM_SI {{1}} CONFIG.NUM_MI {{1}}] "
        f"[get_bd_cells {_CONTROL_IC}]",
        f"connect_bd_intf_net {bd_intf(ps.instance, ps.master.name)} "
        f"{bd_intf(_CONTROL_IC, 'S00_AXI')}",
        f"connect_bd_intf_net {bd_intf(_CONTROL_IC, 'M00_AXI')} "
        f"{bd_intf(IP_INSTANCE, CONTROL_INTERFACE)}",
        "# Each AXI4 master of ours through a SmartConnect (protocol and ID conversion: a "
        "PS7's HP ports",
        "# are AXI3) to the HP port tessera.regmap.axi_ports assigns it.",
    )


def _memory_paths(plan: FlowPlan, script: TclScript) -> None:
    """A SmartConnect from each of our masters to its HP port."""
    for port in plan.ports:
        smc = _smartconnect(port.index)
        script.emit(
            f"create_bd_cell -type ip -vlnv {_SMARTCONNECT} {smc}",
            f"set_property -dict [list CONFIG.NUM_SI {{1}} CONFIG.NUM_MI {{1}}] "
            f"[get_bd_cells {smc}]",
            f"connect_bd_intf_net {bd_intf(IP_INSTANCE, port.name)} "
            f"{bd_intf(smc, 'S00_AXI')}",
            f"connect_bd_intf_net {bd_intf(smc, 'M00_AXI')} "
            f"{bd_intf(plan.ps.instance, plan.board.slave(port.index).name)}",
        )


def _clocked_and_reset_pins(plan: FlowPlan) -> tuple[list[str], list[str]]:
    """Every pin ``aclk`` drives, and every pin the synchronised reset drives."""
    ps, vivado, board = plan.ps, plan.vivado, plan.board
    clocked = [bd_pin(IP_INSTANCE, plan.aclk), bd_pin(_RESET, "slowest_sync_clk"),
               bd_pin(ps.instance, vivado.port_clock(ps.master)),
               *(bd_pin(_CONTROL_IC, p) for p in ("ACLK", "S00_ACLK", "M00_ACLK"))]
    resets = [bd_pin(IP_INSTANCE, plan.aresetn),
              *(bd_pin(_CONTROL_IC, p) for p in ("S00_ARESETN", "M00_ARESETN"))]
    for port in plan.ports:
        clocked += [bd_pin(_smartconnect(port.index), "aclk"),
                    bd_pin(ps.instance, vivado.port_clock(board.slave(port.index)))]
        resets.append(bd_pin(_smartconnect(port.index), "aresetn"))
    return clocked, resets


def _clock_reset_interrupt(plan: FlowPlan, script: TclScript, aclk: str) -> None:
    """One clock net for everything, the resets, and our interrupt to the PS."""
    ps = plan.ps
    clocked, resets = _clocked_and_reset_pins(plan)
    script.emit(
        "# One clock for everything; the reset synchronised to it.",
        f"connect_bd_net {aclk} \\\n    " + " \\\n    ".join(clocked),
        f"connect_bd_net {bd_pin(ps.instance, ps.fclk_reset)} "
        f"{bd_pin(_RESET, 'ext_reset_in')}",
        f"connect_bd_net {bd_pin(_RESET, 'interconnect_aresetn')} "
        f"{bd_pin(_CONTROL_IC, 'ARESETN')}",
        f"connect_bd_net {bd_pin(_RESET, 'peripheral_aresetn')} \\\n    "
        + " \\\n    ".join(resets),
        f"connect_bd_net {bd_pin(IP_INSTANCE, plan.interrupt)} "
        f"{bd_pin(ps.instance, ps.irq)}",
        "",
    )


def _address_map(plan: FlowPlan, script: TclScript) -> None:
    """Our registers where the .hwh and the driver expect them; the DDR for every master."""
    ps, vivado, board = plan.ps, plan.vivado, plan.board
    script.emit(
        "# Address map: our registers where tessera.hwh and the driver expect them, and the "
        "DDR",
        "# for every master.",
        f"assign_bd_address -offset {board.registers.base:#010x} "
        f"-range {board.registers.size:#010x} "
        f"-target_address_space [get_bd_addr_spaces {ps.instance}/{vivado.address_space}] "
        f"[get_bd_addr_segs {IP_INSTANCE}/{CONTROL_INTERFACE}/reg0] -force",
    )
    for port in plan.ports:
        slave = board.slave(port.index)
        segment = f"{ps.instance}/{vivado.slave_map(slave)}/" \
                  f"{board.slave_segment(port.index)}"
        script.emit(
            f"assign_bd_address -offset {board.dram.base:#010x} -range {board.dram.size:#010x} "
            f"-target_address_space [get_bd_addr_spaces {IP_INSTANCE}/{port.name}] "
            f"[get_bd_addr_segs {segment}] -force",
        )


def _validate(plan: FlowPlan, script: TclScript) -> None:
    """Validate and save the design; stop unless PL clock 0 is the one the .hwh promises."""
    ps, actual, clock = plan.ps, plan.vivado.pl0_actual, plan.clock
    script.emit(
        "validate_bd_design",
        "save_bd_design",
        "",
        "# Vivado derives the achieved PL clock from the divisors: it must be the one the "
        ".hwh",
        "# promises and the driver sets when it loads the overlay.",
        f"set achieved [get_property CONFIG.{actual} [get_bd_cells {ps.instance}]]",
        f"set promised [dict get $tessera_expect CONFIG.{actual}]",
        "if {![string is double -strict $achieved] || "
        f"abs($achieved - $promised) > {_CLOCK_REPORT_MHZ}}} {{",
        '    tessera_fail "PL clock 0 runs at $achieved MHz, tessera.boards and the .hwh '
        f'expect $promised MHz ({ps.pll.name} / {clock.divisor0} / '
        f'{clock.divisor1}): check the board preset\'s PLL"',
        "}",
    )
