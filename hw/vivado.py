"""The Vivado board flow: a batch-mode Tcl script that builds a bitstream and its ``.hwh``.

:func:`flow_tcl` writes the whole flow for a board (:mod:`tessera.boards`) and a
:class:`~tessera.config.HwConfig`; :func:`write_project` puts it in a folder with the
exported Verilog, ready for ``vivado -mode batch -source build.tcl``. The flow

1. creates a project for the board's part and board part;
2. packages ``tessera_top.v`` as the IP :data:`tessera.hwh.IP_VLNV` (not a module
   reference, whose VLNV would be ``xilinx.com:module_ref:...``: the driver finds our
   IP in the ``.hwh`` by that VLNV), with the register map of :mod:`tessera.regmap`;
3. builds the block design :mod:`tessera.hwh` describes: the PS with the board preset
   (DDR, MIO), PL clock 0 at the config's clock with the divisors of
   :meth:`Board.pl_clock <tessera.boards.Board.pl_clock>` (plus a Clocking Wizard when
   the PS cannot come within 1% of it), an AXI interconnect from the PS master to
   ``s_axi_control``, a SmartConnect from each ``m_axi_p<k>`` to the PS's HP port
   ``k``, the interrupt, a ``proc_sys_reset``, and the address map (our registers at
   ``Board.registers``, every master's DDR segment);
4. synthesises, implements and writes the bitstream, keeps utilisation and timing
   reports, stops with exit code 1 if timing fails, and copies the bitstream and the
   ``.hwh`` to ``out/``.

Without Vivado, :func:`dry_run` executes the flow under ``tclsh`` against
``vivado_standin.tcl``, which defines every Vivado command the flow uses as a
recorder that checks its options (UG835) and models just enough of Vivado (IP
packaging from the Verilog's ports, the catalog, block-design objects, run and output
files) to answer the flow's queries; the :class:`FlowRecord` it returns says what the
flow asked Vivado to build.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tessera.boards import CLOCK_TOLERANCE, Board, PlClock, PsPort, get_board
from tessera.config import HwConfig, get_config
from tessera.errors import ConfigError, HardwareToolError
from tessera.hwh import (CONTROL_INTERFACE, IP_INSTANCE, IP_MODULE, IP_VLNV, REGISTER_ACCESS,
                         hwh_xml)
from tessera.regmap import AXI_ADDR_BITS, CTRL_DATA_BITS, REGISTERS, axi_ports, describe

__all__ = ["DEFAULT_ANSWERS", "STANDIN", "Address", "Cell", "Core",
           "FlowRecord", "VivadoProject", "dry_run", "flow_tcl", "write_project"]

#: The Vivado stand-in :func:`dry_run` executes the flow against.
STANDIN = Path(__file__).with_name("vivado_standin.tcl")
#: How close (in MHz) the PL clock Vivado reports must be to Board.pl_clock's: Vivado
#: rounds the PS reference clock differently in the sixth decimal.
_CLOCK_REPORT_MHZ = 0.02

# The folder layout of a project (relative to its directory).
_TCL = "build.tcl"
_EXPECTED_HWH = "expected.hwh"
_README = "README.txt"
_OUT = "out"
_REPORTS = "reports"
_BITSTREAM = "tessera.bit"
_HWH = "tessera.hwh"
_IP_REPO = "ip"
_VIVADO_DIR = "vivado"

# Xilinx IP the block design uses besides the PS (versions of Vivado 2020.2 to 2024.x).
_AXI_INTERCONNECT = "xilinx.com:ip:axi_interconnect:2.1"
_SMARTCONNECT = "xilinx.com:ip:smartconnect:1.0"
_PROC_SYS_RESET = "xilinx.com:ip:proc_sys_reset:5.0"
_CLK_WIZ = "xilinx.com:ip:clk_wiz:6.0"
_INTERRUPT_VLNV = "xilinx.com:signal:interrupt_rtl:1.0"

# Block-design cell names of the infrastructure.
_CONTROL_IC = "control_interconnect"
_RESET = "reset_aclk"
_CLK_WIZARD = "clk_wiz_0"


def _mhz(value: float) -> str:
    """A frequency in MHz to the microhertz, without trailing zeros."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _smartconnect(port: int) -> str:
    return f"p{port}_smartconnect"


@dataclass(frozen=True)
class _PsFlow:
    """What the flow needs to know about a PS IP beyond :class:`tessera.boards.ProcessingSystem`:
    Vivado's names for its board-preset automation, PL clock 0 and port clocks."""

    automation: str                          # apply_bd_automation -config of the board preset
    address_space: str                       # the PS master's address space
    pl0: tuple[str, str, str, str]           # PL clock 0: enable, source, divisor 0, divisor 1
    pl0_actual: str                          # read-only: the PL clock 0 Vivado achieves
    masters: tuple[str, ...]                 # enable parameter of every PS master port
    extra: tuple[tuple[str, str], ...]       # further parameters (the clock and reset pins)
    port_clock: Callable[[PsPort], str]      # the clock pin of a PS AXI port
    slave_map: Callable[[PsPort], str]       # the memory map behind a PS slave port


def _psu_slave_map(port: PsPort) -> str:
    # zynq_ultra_ps_e names the memory map behind S_AXI_HP<k>_FPD after the PS's slave GP
    # number (SAXIGP<k+2>), the number its enable parameter PSU__USE__S_AXI_GP<n> carries.
    match = re.search(r"GP(\d+)$", port.enable)
    if match is None:
        raise ConfigError(f"cannot tell the slave GP number of {port.name} from {port.enable}")
    return f"SAXIGP{match[1]}"


_PS_FLOW = {
    "processing_system7": _PsFlow(
        automation='make_external "FIXED_IO, DDR" apply_board_preset "1" '
                   'Master "Disable" Slave "Disable"',
        address_space="Data",
        pl0=("PCW_FPGA_FCLK0_ENABLE", "PCW_FCLK0_PERIPHERAL_CLKSRC",
             "PCW_FCLK0_PERIPHERAL_DIVISOR0", "PCW_FCLK0_PERIPHERAL_DIVISOR1"),
        pl0_actual="PCW_ACT_FPGA0_PERIPHERAL_FREQMHZ",
        masters=("PCW_USE_M_AXI_GP0", "PCW_USE_M_AXI_GP1"),
        extra=(("PCW_EN_CLK0_PORT", "1"), ("PCW_EN_RST0_PORT", "1")),
        port_clock=lambda port: f"{port.name}_ACLK",
        slave_map=lambda port: port.name,
    ),
    "zynq_ultra_ps_e": _PsFlow(
        automation='apply_board_preset "1"',
        address_space="Data",
        pl0=("PSU__FPGA_PL0_ENABLE", "PSU__CRL_APB__PL0_REF_CTRL__SRCSEL",
             "PSU__CRL_APB__PL0_REF_CTRL__DIVISOR0", "PSU__CRL_APB__PL0_REF_CTRL__DIVISOR1"),
        pl0_actual="PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ",
        # HPM0_FPD, HPM1_FPD, HPM0_LPD: the preset enables the first two, and an enabled
        # master with nothing on its clock pin fails validation.
        masters=("PSU__USE__M_AXI_GP0", "PSU__USE__M_AXI_GP1", "PSU__USE__M_AXI_GP2"),
        extra=(),
        # M_AXI_HPM0_FPD -> maxihpm0_fpd_aclk, S_AXI_HP0_FPD -> saxihp0_fpd_aclk
        port_clock=lambda port: port.name.lower().replace("_axi_", "axi", 1) + "_aclk",
        slave_map=_psu_slave_map,
    ),
}


# ------------------------------------------------------------------------------ API
@dataclass(frozen=True)
class VivadoProject:
    """A project folder :func:`write_project` wrote: run ``vivado -mode batch -source build.tcl``
    in :attr:`directory`."""

    directory: Path
    tcl: Path             # build.tcl: the whole flow
    verilog: Path         # the exported Verilog it packages
    bitstream: Path       # where the flow writes the .bit (out/tessera.bit)
    hwh: Path             # where the flow copies the .hwh, beside the .bit
    expected_hwh: Path    # tessera.hwh.hwh_xml(config, board): what the flow must produce
    reports: Path         # utilisation and timing reports
    board: str
    config: HwConfig


def flow_tcl(board: str | Board, config: HwConfig | str) -> str:
    """The Vivado batch-mode Tcl of the board flow for ``config`` on ``board``.

    Raises :class:`~tessera.errors.ConfigError` if the config does not fit the board
    (another part, too many DRAM ports, a bus width the HP ports lack).
    """
    board = get_board(board)
    config = get_config(config)
    board.check(config)
    return _Flow(board, config).tcl()


def write_project(board: str | Board, config: HwConfig | str, directory: str | Path, *,
                  verilog: str | Path | None = None) -> VivadoProject:
    """Write a ready-to-run project folder for ``config`` on ``board`` into ``directory``:
    ``build.tcl``, the exported Verilog (:func:`tessera.hw.export.write`, which takes
    minutes for large configs), the ``.hwh`` the flow must produce (``expected.hwh``) and a
    ``README.txt`` saying how to run it.

    ``verilog``: an already exported ``tessera_top.v`` of this config to copy instead of
    exporting again (its ``tessera_top.json`` is copied too when it sits beside it).
    """
    board = get_board(board)
    config = get_config(config)
    tcl = flow_tcl(board, config)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{IP_MODULE}.v"
    if verilog is None:
        from . import export
        if export.TOP_NAME != IP_MODULE:      # the flow packages the module tessera.hwh names
            raise ConfigError(f"hw.export writes {export.TOP_NAME}, tessera.hwh expects "
                              f"{IP_MODULE}")
        export.write(config, out)
    else:
        source = Path(verilog)
        if not source.is_file():
            raise ConfigError(f"no Verilog at {source}: export it with `tessera hw verilog` or "
                              "leave verilog=None")
        if source.resolve() != target.resolve():
            shutil.copyfile(source, target)
            description = source.with_suffix(".json")
            if description.is_file():
                shutil.copyfile(description, target.with_suffix(".json"))
    (out / _TCL).write_text(tcl)
    (out / _EXPECTED_HWH).write_text(hwh_xml(config, board))
    (out / _README).write_text(_readme(board, config))
    return VivadoProject(directory=out, tcl=out / _TCL, verilog=target,
                         bitstream=out / _OUT / _BITSTREAM, hwh=out / _OUT / _HWH,
                         expected_hwh=out / _EXPECTED_HWH, reports=out / _REPORTS,
                         board=board.name, config=config)


# ----------------------------------------------------------------------------- flow
def _tcl_word(value: object) -> str:
    """``value`` as one Tcl word."""
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_.:/+\-]+", text):
        return text
    if "\\" not in text and _balanced(text):
        return "{" + text + "}"
    return re.sub(r'([\\\[\]{}$";\s])', r"\\\1", text)


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def _tcl_dict(values: Mapping[str, object], prefix: str = "") -> str:
    """A ``[list K {V} ...]`` for ``set_property -dict``, one pair per line."""
    pairs = [f"    {prefix}{name} {{{value}}}" for name, value in values.items()]
    return "[list \\\n" + " \\\n".join(pairs) + " \\\n]"


class _Flow:
    """Writes the Tcl of one board flow (see the module docstring for its steps)."""

    def __init__(self, board: Board, config: HwConfig) -> None:
        self.board = board
        self.config = config
        self.ps = board.ps
        self.vivado = _PS_FLOW[board.ps.module]
        self.clock: PlClock = board.pl_clock(config.clock_mhz)
        self.ports = axi_ports(config)
        ports = describe(config)
        self.aclk = ports["clock"]["port"]
        self.aresetn = ports["reset"]["port"]
        self.interrupt = ports["interrupt"]["port"]
        self.name = "tessera_" + re.sub(r"\W", "_", config.name)
        #: The PS's PL clock 0 misses the config's clock by more than CLOCK_TOLERANCE.
        self.wizard = board.needs_clock_wizard(config.clock_mhz)
        self.lines: list[str] = []

    def tcl(self) -> str:
        for step in (self._header, self._project, self._package_ip, self._block_design,
                     self._build, self._outputs):
            step()
            self.lines.append("")
        return "\n".join(self.lines)

    def emit(self, *lines: str) -> None:
        self.lines.extend(lines)

    def section(self, title: str, *why: str) -> None:
        self.emit("# " + "-" * 78, f"# {title}", *(f"# {line}" for line in why))

    def pin(self, cell: str, pin: str) -> str:
        return f"[get_bd_pins {cell}/{pin}]"

    def intf(self, cell: str, pin: str) -> str:
        return f"[get_bd_intf_pins {cell}/{pin}]"

    # ---------------------------------------------------------------- steps
    def _header(self) -> None:
        board, config, clock = self.board, self.config, self.clock
        self.emit(
            f"# Tessera board flow: config {config.name!r} on the {board.title} ({board.name}).",
            "# Written by tessera.hw.vivado; regenerate it rather than editing it.",
            "#",
            "# Run from this folder:  vivado -mode batch -source build.tcl",
            f"# It writes {_OUT}/{_BITSTREAM} and {_OUT}/{_HWH} (what pynq.Overlay loads), the "
            f"reports in {_REPORTS}/,",
            "# and exits with code 1 when timing fails. TESSERA_VIVADO_JOBS sets the parallel "
            "jobs (default 4).",
            "",
            "set here [file dirname [file normalize [info script]]]",
            f"set name {self.name}",
            f"set project_dir [file join $here {_VIVADO_DIR}]",
            f"set ip_repo [file join $here {_IP_REPO}]",
            f"set out_dir [file join $here {_OUT}]",
            f"set reports_dir [file join $here {_REPORTS}]",
            "set jobs [expr {[info exists ::env(TESSERA_VIVADO_JOBS)] ? "
            "$::env(TESSERA_VIVADO_JOBS) : 4}]",
            "file mkdir $out_dir $reports_dir",
            "",
            "# What Vivado must report for the design to match tessera.hwh and the driver "
            "(checked below).",
            "set tessera_expect [dict create \\",
            f"    CONFIG.{self.vivado.pl0_actual} {clock.mhz:.6f} \\",
            "]",
            "",
            "proc tessera_fail {message} {",
            '    puts stderr "ERROR: \\[tessera\\] $message"',
            "    exit 1",
            "}",
        )

    def _project(self) -> None:
        board = self.board
        self.section("Project for the board's part; the board part gives the PS its DDR and MIO "
                     "preset.")
        self.emit(
            f"create_project -force $name $project_dir -part {board.part}",
            f"if {{[get_board_parts -quiet {board.board_part}] eq \"\"}} {{",
            f'    tessera_fail "the board files of {board.board_part} ({board.title}) are not '
            "installed: add them to Vivado's board repository (XHub stores, or the board "
            'vendor\'s files) and run again"',
            "}",
            f"set_property board_part {board.board_part} [current_project]",
            "set_property target_language Verilog [current_project]",
        )

    def _package_ip(self) -> None:
        vendor, library, name, version = IP_VLNV.split(":")
        control = CONTROL_INTERFACE
        masters = [p.name for p in self.ports]
        self.section(
            f"Package {IP_MODULE}.v as the IP {IP_VLNV}.",
            "A packaged IP rather than a module reference: the .hwh then carries this VLNV, "
            "which is",
            "how the driver (tessera.runtime.pynq_device) finds the accelerator in the overlay.",
        )
        self.emit(
            f"set ip_dir [file join $ip_repo {IP_MODULE}]",
            "file delete -force $ip_dir",
            "file mkdir $ip_dir",
            f"file copy -force [file join $here {IP_MODULE}.v] $ip_dir",
            f"ipx::infer_core -vendor {vendor} -library {library} -name {name} "
            f"-version {version} -taxonomy /UserIP -set_current true $ip_dir",
            "set core [ipx::current_core]",
            f"set_property display_name {_tcl_word(f'Tessera accelerator ({self.config.name})')}"
            " $core",
            f"set_property description {_tcl_word(self._ip_description())} $core",
            f"set_property supported_families {{{self.board.family} Production}} $core",
            "",
            "# The packager infers the AXI interfaces from the port names "
            "(<interface>_awvalid...), the",
            "# clock and the reset; stop here if it missed one.",
            f"foreach busif {{{' '.join([control, *masters, self.aclk, self.aresetn])}}} {{",
            "    if {[ipx::get_bus_interfaces $busif -of_objects $core] eq \"\"} {",
            f'        tessera_fail "the IP packager did not infer the interface $busif from the '
            f'ports of {IP_MODULE}.v"',
            "    }",
            "}",
            f"if {{[ipx::get_bus_interfaces {self.interrupt} -of_objects $core] eq \"\"}} {{",
            f"    ipx::infer_bus_interface {self.interrupt} {_INTERRUPT_VLNV} $core",
            "}",
            f"set irq [ipx::get_bus_interfaces {self.interrupt} -of_objects $core]",
            "set sensitivity [ipx::get_bus_parameters SENSITIVITY -of_objects $irq]",
            'if {$sensitivity eq ""} {set sensitivity [ipx::add_bus_parameter SENSITIVITY $irq]}',
            "set_property value LEVEL_HIGH $sensitivity",
            f"foreach busif {{{' '.join([control, *masters])}}} {{",
            f"    ipx::associate_bus_interfaces -busif $busif -clock {self.aclk} $core",
            "}",
            f"ipx::associate_bus_interfaces -clock {self.aclk} -reset {self.aresetn} $core",
            "",
            f"# {control}: one register block, the size of the board's register window (what",
            "# the .hwh gives the driver to map), with the registers of tessera.regmap.",
            f"set memory_map [ipx::get_memory_maps {control} -of_objects $core]",
            f'if {{$memory_map eq ""}} {{set memory_map [ipx::add_memory_map {control} $core]}}',
            f"set_property slave_memory_map_ref {control} "
            f"[ipx::get_bus_interfaces {control} -of_objects $core]",
            "set block [ipx::get_address_blocks reg0 -of_objects $memory_map]",
            'if {$block eq ""} {set block [ipx::add_address_block reg0 $memory_map]}',
            f"set_property range {self.board.registers.size} $block",
            f"set_property width {CTRL_DATA_BITS} $block",
            "set_property usage register $block",
            "foreach {register offset description} {",
            *(f"    {reg.name} {reg.offset:#04x} "
              f"{_tcl_word(f'{reg.doc} ({REGISTER_ACCESS[reg.access]})')}" for reg in REGISTERS),
            "} {",
            "    set reg [ipx::add_register $register $block]",
            "    set_property address_offset $offset $reg",
            f"    set_property size {CTRL_DATA_BITS} $reg",
            "    set_property description $description $reg",
            "}",
            "",
            f"# Each master addresses the {AXI_ADDR_BITS}-bit space its DDR segment is mapped "
            "into.",
            f"foreach master {{{' '.join(masters)}}} {{",
            "    set space [ipx::get_address_spaces $master -of_objects $core]",
            '    if {$space eq ""} {set space [ipx::add_address_space $master $core]}',
            f"    set_property range {1 << AXI_ADDR_BITS} $space",
            "    set_property master_address_space_ref $master "
            "[ipx::get_bus_interfaces $master -of_objects $core]",
            "}",
            "ipx::create_xgui_files $core",
            "ipx::update_checksums $core",
            "ipx::check_integrity $core",
            "ipx::save_core $core",
            "ipx::unload_core $core",
            "set_property ip_repo_paths [list $ip_repo] [current_project]",
            "update_ip_catalog -rebuild",
        )

    def _ip_description(self) -> str:
        return (f"Tessera accelerator, config {self.config.name} "
                f"({self.config.batch}x{self.config.block_in}x{self.config.block_out} GEMM core, "
                f"{self.config.clock_mhz:g} MHz)")

    def _ps_properties(self) -> dict[str, str]:
        """The PS parameters the flow sets on top of the board preset: those tessera.hwh lists
        that Vivado lets a user set, and the ports the preset may enable that we leave off."""
        ps, vivado, clock = self.ps, self.vivado, self.clock
        enable, source, divisor0, divisor1 = vivado.pl0
        values = {name: "0" for name in vivado.masters}
        values[ps.master.enable] = "1"
        if ps.master.width:
            values[ps.master.width] = str(CTRL_DATA_BITS)
        used = {port.index: port for port in self.ports}
        for index, slave in enumerate(ps.slaves):
            values[slave.enable] = "1" if index in used else "0"
            if index in used and slave.width:
                values[slave.width] = str(used[index].data_bits)
        values.update(ps.irq_enable)
        values.update({enable: "1", source: ps.pll.name,
                       ps.fclk_param: f"{self.config.clock_mhz:g}",
                       divisor0: str(clock.divisor0), divisor1: str(clock.divisor1)})
        values.update(vivado.extra)
        return values

    def _block_design(self) -> None:
        ps, vivado, board = self.ps, self.vivado, self.board
        self.section(
            f"Block design: the {ps.module} with the board preset, {IP_INSTANCE}, "
            "interconnects, clock, reset",
            "and interrupt: the design tessera.hwh describes.",
        )
        self.emit(
            "create_bd_design $name",
            f"create_bd_cell -type ip -vlnv {ps.vlnv} {ps.instance}",
            f"apply_bd_automation -rule xilinx.com:bd_rule:{ps.module} "
            f"-config {{{vivado.automation}}} [get_bd_cells {ps.instance}]",
            f"# PL clock 0 = {ps.pll.name} ({_mhz(ps.pll_mhz)} MHz) / {self.clock.divisor0} / "
            f"{self.clock.divisor1} = {_mhz(self.clock.mhz)} MHz (tessera.boards.Board.pl_clock); "
            "the HP ports",
            "# our masters use, at their data width; the PS master that reaches s_axi_control; "
            "the interrupt.",
            f"set_property -dict {_tcl_dict(self._ps_properties(), 'CONFIG.')} "
            f"[get_bd_cells {ps.instance}]",
            f"create_bd_cell -type ip -vlnv {IP_VLNV} {IP_INSTANCE}",
            f"create_bd_cell -type ip -vlnv {_PROC_SYS_RESET} {_RESET}",
            "",
        )
        aclk = self._clocking()
        self.emit(
            f"create_bd_cell -type ip -vlnv {_AXI_INTERCONNECT} {_CONTROL_IC}",
            f"set_property -dict [list CONFIG.NUM_SI {{1}} CONFIG.NUM_MI {{1}}] "
            f"[get_bd_cells {_CONTROL_IC}]",
            f"connect_bd_intf_net {self.intf(ps.instance, ps.master.name)} "
            f"{self.intf(_CONTROL_IC, 'S00_AXI')}",
            f"connect_bd_intf_net {self.intf(_CONTROL_IC, 'M00_AXI')} "
            f"{self.intf(IP_INSTANCE, CONTROL_INTERFACE)}",
            "# Each AXI4 master of ours through a SmartConnect (protocol and ID conversion: a "
            "PS7's HP ports",
            "# are AXI3) to the HP port tessera.regmap.axi_ports assigns it.",
        )
        for port in self.ports:
            smc = _smartconnect(port.index)
            self.emit(
                f"create_bd_cell -type ip -vlnv {_SMARTCONNECT} {smc}",
                f"set_property -dict [list CONFIG.NUM_SI {{1}} CONFIG.NUM_MI {{1}}] "
                f"[get_bd_cells {smc}]",
                f"connect_bd_intf_net {self.intf(IP_INSTANCE, port.name)} "
                f"{self.intf(smc, 'S00_AXI')}",
                f"connect_bd_intf_net {self.intf(smc, 'M00_AXI')} "
                f"{self.intf(ps.instance, board.slave(port.index).name)}",
            )
        clocked = [self.pin(IP_INSTANCE, self.aclk), self.pin(_RESET, "slowest_sync_clk"),
                   self.pin(ps.instance, vivado.port_clock(ps.master)),
                   *(self.pin(_CONTROL_IC, p) for p in ("ACLK", "S00_ACLK", "M00_ACLK"))]
        resets = [self.pin(IP_INSTANCE, self.aresetn),
                  *(self.pin(_CONTROL_IC, p) for p in ("S00_ARESETN", "M00_ARESETN"))]
        for port in self.ports:
            clocked += [self.pin(_smartconnect(port.index), "aclk"),
                        self.pin(ps.instance, vivado.port_clock(board.slave(port.index)))]
            resets.append(self.pin(_smartconnect(port.index), "aresetn"))
        self.emit(
            "# One clock for everything; the reset synchronised to it.",
            f"connect_bd_net {aclk} \\\n    " + " \\\n    ".join(clocked),
            f"connect_bd_net {self.pin(ps.instance, ps.fclk_reset)} "
            f"{self.pin(_RESET, 'ext_reset_in')}",
            f"connect_bd_net {self.pin(_RESET, 'interconnect_aresetn')} "
            f"{self.pin(_CONTROL_IC, 'ARESETN')}",
            f"connect_bd_net {self.pin(_RESET, 'peripheral_aresetn')} \\\n    "
            + " \\\n    ".join(resets),
            f"connect_bd_net {self.pin(IP_INSTANCE, self.interrupt)} "
            f"{self.pin(ps.instance, ps.irq)}",
            "",
            "# Address map: our registers where tessera.hwh and the driver expect them, and the "
            "DDR",
            "# for every master.",
            f"assign_bd_address -offset {board.registers.base:#010x} "
            f"-range {board.registers.size:#010x} "
            f"-target_address_space [get_bd_addr_spaces {ps.instance}/{vivado.address_space}] "
            f"[get_bd_addr_segs {IP_INSTANCE}/{CONTROL_INTERFACE}/reg0] -force",
        )
        for port in self.ports:
            slave = board.slave(port.index)
            segment = f"{ps.instance}/{vivado.slave_map(slave)}/" \
                      f"{ps.slave_segment.format(k=port.index)}"
            self.emit(
                f"assign_bd_address -offset {board.dram.base:#010x} -range {board.dram.size:#010x} "
                f"-target_address_space [get_bd_addr_spaces {IP_INSTANCE}/{port.name}] "
                f"[get_bd_addr_segs {segment}] -force",
            )
        self.emit(
            "validate_bd_design",
            "save_bd_design",
            "",
            "# Vivado derives the achieved PL clock from the divisors: it must be the one the "
            ".hwh",
            "# promises and the driver sets when it loads the overlay.",
            f"set achieved [get_property CONFIG.{vivado.pl0_actual} [get_bd_cells {ps.instance}]]",
            f"set promised [dict get $tessera_expect CONFIG.{vivado.pl0_actual}]",
            "if {![string is double -strict $achieved] || "
            f"abs($achieved - $promised) > {_CLOCK_REPORT_MHZ}}} {{",
            '    tessera_fail "PL clock 0 runs at $achieved MHz, tessera.boards and the .hwh '
            f'expect $promised MHz ({ps.pll.name} / {self.clock.divisor0} / '
            f'{self.clock.divisor1}): check the board preset\'s PLL"',
            "}",
        )

    def _clocking(self) -> str:
        """Emit the clock source of ``aclk``; return its pin."""
        ps, config, clock = self.ps, self.config, self.clock
        fclk = self.pin(ps.instance, ps.fclk)
        if not self.wizard:
            self.emit(f"# {IP_INSTANCE} runs on PL clock 0: {_mhz(clock.mhz)} MHz for the "
                      f"config's {config.clock_mhz:g} MHz.")
            return fclk
        error = abs(clock.mhz - config.clock_mhz) / config.clock_mhz
        wizard = {"PRIM_SOURCE": "No_buffer",
                  "CLKOUT1_REQUESTED_OUT_FREQ": f"{config.clock_mhz:g}",
                  "USE_LOCKED": "true", "USE_RESET": "true",
                  "RESET_TYPE": "ACTIVE_LOW", "RESET_PORT": "resetn"}
        self.emit(
            f"# Clocking Wizard: the closest PL clock 0 the {ps.pll.name} gives is "
            f"{_mhz(clock.mhz)} MHz ({_mhz(ps.pll_mhz)} / {clock.divisor0} / {clock.divisor1}),",
            f"# {error:.2%} off the config's {config.clock_mhz:g} MHz (more than "
            f"{CLOCK_TOLERANCE:.0%}), so {_CLK_WIZARD} makes exactly {config.clock_mhz:g} MHz "
            "from it.",
            "# Its input frequency propagates from the PS pin (setting it could disagree with "
            "the PS's",
            "# rounding); the PS clock already drives a global buffer, hence No_buffer.",
            f"create_bd_cell -type ip -vlnv {_CLK_WIZ} {_CLK_WIZARD}",
            f"set_property -dict {_tcl_dict(wizard, 'CONFIG.')} "
            f"[get_bd_cells {_CLK_WIZARD}]",
            f"connect_bd_net {fclk} {self.pin(_CLK_WIZARD, 'clk_in1')}",
            f"connect_bd_net {self.pin(ps.instance, ps.fclk_reset)} "
            f"{self.pin(_CLK_WIZARD, 'resetn')}",
            f"connect_bd_net {self.pin(_CLK_WIZARD, 'locked')} {self.pin(_RESET, 'dcm_locked')}",
        )
        return self.pin(_CLK_WIZARD, "clk_out1")

    def _build(self) -> None:
        self.section("Synthesis and implementation up to the bitstream; reports; the timing "
                     "verdict.")
        self.emit(
            "set wrapper [make_wrapper -files [get_files $name.bd] -top]",
            "add_files -norecurse $wrapper",
            "set_property top ${name}_wrapper [current_fileset]",
            "update_compile_order -fileset sources_1",
            "generate_target all [get_files $name.bd]",
            "",
            "launch_runs synth_1 -jobs $jobs",
            "wait_on_run synth_1",
            'if {[get_property PROGRESS [get_runs synth_1]] ne "100%"} {',
            '    tessera_fail "synthesis failed: see [get_property DIRECTORY [get_runs synth_1]]'
            '/runme.log"',
            "}",
            "launch_runs impl_1 -to_step write_bitstream -jobs $jobs",
            "wait_on_run impl_1",
            'if {[get_property PROGRESS [get_runs impl_1]] ne "100%"} {',
            '    tessera_fail "implementation failed: see [get_property DIRECTORY '
            '[get_runs impl_1]]/runme.log"',
            "}",
            "open_run impl_1",
            "report_utilization -file [file join $reports_dir utilization.rpt]",
            "report_utilization -hierarchical -file [file join $reports_dir "
            "utilization_hierarchical.rpt]",
            "report_timing_summary -max_paths 10 -report_unconstrained "
            "-file [file join $reports_dir timing_summary.rpt]",
            "set wns [get_property STATS.WNS [get_runs impl_1]]",
            "set whs [get_property STATS.WHS [get_runs impl_1]]",
            "if {$wns < 0 || $whs < 0} {",
            f'    tessera_fail "timing failed at {self.config.clock_mhz:g} MHz: WNS $wns ns '
            "(setup), WHS $whs ns (hold); see $reports_dir/timing_summary.rpt. Lower the "
            "config's clock_mhz or shrink the design; no bitstream was copied to $out_dir\"",
            "}",
        )

    def _outputs(self) -> None:
        self.section("The bitstream and its .hwh side by side, as pynq.Overlay wants them.")
        self.emit(
            "set run_dir [get_property DIRECTORY [get_runs impl_1]]",
            "set bit [file join $run_dir ${name}_wrapper.bit]",
            "set hwh \"\"",
            "# Vivado 2020.2 and later generate into <project>.gen, earlier ones into "
            "<project>.srcs.",
            "foreach generated {gen srcs} {",
            "    set candidate [file join $project_dir $name.$generated sources_1 bd $name "
            "hw_handoff $name.hwh]",
            "    if {[file exists $candidate]} {set hwh $candidate; break}",
            "}",
            'if {$hwh eq ""} {tessera_fail "Vivado wrote no hardware handoff for $name.bd"}',
            "set handle [open $hwh]",
            "set handoff [read $handle]",
            "close $handle",
            f"if {{[string first {{VLNV=\"{IP_VLNV}\"}} $handoff] < 0}} {{",
            f'    tessera_fail "$hwh has no {IP_VLNV}: the driver would not find the '
            'accelerator"',
            "}",
            f"file copy -force $bit [file join $out_dir {_BITSTREAM}]",
            f"file copy -force $hwh [file join $out_dir {_HWH}]",
            f'puts "tessera: wrote [file join $out_dir {_BITSTREAM}] and {_HWH} '
            '(WNS $wns ns, WHS $whs ns)"',
        )


def _readme(board: Board, config: HwConfig) -> str:
    flow = _Flow(board, config)
    if flow.wizard:
        clock = (f"PL clock 0 at {_mhz(flow.clock.mhz)} MHz, the closest the PS makes, and a "
                 f"Clocking Wizard making the config's {config.clock_mhz:g} MHz from it")
        handoff = (f"the same IP, addresses and clocks (our IP at the wizard's "
                   f"{config.clock_mhz:g} MHz, the PS's PL clock 0 at {_mhz(flow.clock.mhz)} "
                   "MHz)")
    else:
        clock = (f"PL clock 0 at {_mhz(flow.clock.mhz)} MHz for the config's "
                 f"{config.clock_mhz:g} MHz")
        handoff = "the same IP, addresses and clock"

    def fill(text: str) -> str:
        return textwrap.fill(text, 79)

    return "\n\n".join([
        f"Tessera board flow: config {config.name!r} on the {board.title} ({board.name}),\n"
        "written by tessera.hw.vivado.write_project.",
        f"Run it with Vivado 2020.2 or newer and the board files of\n{board.board_part} "
        "installed:",
        f"    cd <this folder>\n    vivado -mode batch -source {_TCL}",
        fill(f"TESSERA_VIVADO_JOBS sets the parallel jobs (default 4). The flow packages "
             f"{IP_MODULE}.v as the IP {IP_VLNV}, builds the block design ({board.ps.module}, "
             f"{clock}, registers at {board.registers.base:#010x}), synthesises, implements "
             "and writes:"),
        f"    {_OUT}/{_BITSTREAM}   the bitstream\n"
        f"    {_OUT}/{_HWH}   its hardware handoff, which pynq.Overlay reads\n"
        f"    {_REPORTS}/          utilization.rpt, utilization_hierarchical.rpt, "
        "timing_summary.rpt",
        fill("It exits with code 1 and says why when timing fails (no bitstream is copied "
             "then), when the board files are missing, or when Vivado's design differs from "
             f"what the runtime expects. {_EXPECTED_HWH} is the handoff tessera.hwh writes "
             "for this design (what the simulated board loads); the one Vivado writes "
             f"describes {handoff}."),
        "On the board, copy out/ next to your program and open the device with",
        f'    tessera.runtime.open_device("pynq", config, bitstream="{_OUT}/{_BITSTREAM}")',
        fill(f"Without Vivado, tessera.hw.vivado.dry_run(folder) runs {_TCL} under tclsh "
             "against a recording stand-in of the Vivado commands."),
    ]) + "\n"


# -------------------------------------------------------------------------- dry run
@dataclass(frozen=True)
class Cell:
    """A block-design cell the flow created."""

    name: str
    vlnv: str                          # for an IP; "" for a module reference
    type: str                          # "ip" or "module"
    reference: str                     # the module of a module reference
    properties: dict[str, str]


@dataclass(frozen=True)
class Address:
    """One ``assign_bd_address``: ``segment`` mapped at ``offset`` in ``space``."""

    space: str
    segment: str
    offset: int
    range: int


@dataclass(frozen=True)
class Core:
    """An IP the flow packaged: the pins and interfaces its cells have."""

    vlnv: str
    pins: tuple[str, ...]
    interfaces: tuple[str, ...]


@dataclass
class FlowRecord:
    """What a flow asked Vivado to do, from :func:`dry_run`.

    Object names are block-design paths without the leading ``/`` (``tessera_0/aclk``),
    file names are relative to the project folder when they are inside it.
    """

    commands: list[dict]                     # every recorded command: cmd, opts, args, notes
    stdout: str = ""
    part: str = ""
    board_part: str = ""
    cells: dict[str, Cell] = field(default_factory=dict)
    cores: dict[str, Core] = field(default_factory=dict)
    automations: list[tuple[str, str, str]] = field(default_factory=list)  # rule, object, config
    interface_nets: list[tuple[str, str]] = field(default_factory=list)
    nets: list[tuple[str, ...]] = field(default_factory=list)
    addresses: list[Address] = field(default_factory=list)
    runs: list[tuple[str, str]] = field(default_factory=list)       # (run, -to_step or "")
    files_added: list[str] = field(default_factory=list)
    reports: list[tuple[str, str]] = field(default_factory=list)    # (command, file)
    copies: list[tuple[str, str]] = field(default_factory=list)     # (source, destination)
    validated: bool = False

    def properties(self, cell: str) -> dict[str, str]:
        """The properties the flow set on ``cell`` (``CONFIG.*`` among them)."""
        return self.cells[cell].properties

    def connected(self) -> set[str]:
        """Every pin and interface pin some net connects."""
        return ({pin for net in self.nets for pin in net}
                | {end for net in self.interface_nets for end in net})

    def unconnected_ports(self, cell: str = IP_INSTANCE) -> list[str]:
        """The pins and interfaces of ``cell`` (a packaged IP) that nothing connects."""
        core = self.cores[self.cells[cell].vlnv]
        connected = self.connected()
        return [name for name in core.pins + core.interfaces
                if f"{cell}/{name}" not in connected]

    def net_of(self, pin: str) -> set[str]:
        """The pins on the net of ``pin`` (empty if none)."""
        pins: set[str] = set()
        for net in self.nets:
            if pin in net:
                pins.update(net)
        return pins

    def endpoints(self, cell: str, interface: str) -> list[str]:
        """Where the interface ``cell/interface`` leads: the interface pins at the far side
        of the AXI interconnects and SmartConnects on its way."""
        def peers(end: str) -> list[str]:
            return [b if a == end else a for a, b in self.interface_nets if end in (a, b)]

        found, seen, todo = [], set(), [f"{cell}/{interface}"]
        while todo:
            end = todo.pop()
            for peer in peers(end):
                if peer in seen:
                    continue
                seen.add(peer)
                owner, _, pin = peer.rpartition("/")
                if self._is_interconnect(owner):
                    # Through the interconnect: from a slave side to its master side and back.
                    side = "M" if pin.startswith("S") else "S"
                    todo += [f"{owner}/{p}" for p in self._interconnect_pins(owner)
                             if p.startswith(side) and f"{owner}/{p}" not in seen]
                else:
                    found.append(peer)
        return sorted(found)

    def _is_interconnect(self, cell: str) -> bool:
        vlnv = self.cells[cell].vlnv if cell in self.cells else ""
        return any(kind in vlnv for kind in (":axi_interconnect:", ":smartconnect:"))

    def _interconnect_pins(self, cell: str) -> set[str]:
        return {end.rpartition("/")[2] for net in self.interface_nets for end in net
                if end.rpartition("/")[0] == cell}

    def address_of(self, cell: str, interface: str) -> Address:
        """The assignment of ``cell/interface``: of its segment for a slave, of the segment
        its address space is given for a master (which must be exactly one)."""
        path = f"{cell}/{interface}"
        found = [a for a in self.addresses if a.segment.startswith(path + "/")] or \
                [a for a in self.addresses if a.space == path]
        if len(found) != 1:
            raise KeyError(f"{path} has {len(found)} address assignments, not one")
        return found[0]

    def masters(self) -> dict[str, list[Address]]:
        """Every address space given a segment, with its assignments."""
        spaces: dict[str, list[Address]] = {}
        for address in self.addresses:
            spaces.setdefault(address.space, []).append(address)
        return spaces


#: What the stand-in answers for properties only a real run knows: runs complete and
#: timing met. Other answers come from the flow's own ``tessera_expect`` (the values it
#: checks Vivado against), so by default the stand-in is a Vivado that agrees.
DEFAULT_ANSWERS = {"PROGRESS": "100%", "STATS.WNS": "0.125", "STATS.WHS": "0.010"}


def dry_run(project_or_tcl: VivadoProject | str | Path, *, tclsh: str | None = None,
            answers: Mapping[str, str] | None = None, verilog: str | Path | None = None,
            timeout: float = 120.0) -> FlowRecord:
    """Execute a flow's Tcl under ``tclsh`` with :data:`STANDIN` defining the Vivado commands
    as recorders, and return what it asked for.

    ``project_or_tcl``: a :class:`VivadoProject`, a project folder, a ``.tcl`` file, or Tcl
    text. It runs in a temporary copy of the folder (placeholders the stand-in writes never
    land in the project); Tcl text runs beside ``verilog`` when given. ``answers`` override
    what the stand-in's ``get_property`` says for properties the flow does not set (e.g.
    ``{"STATS.WNS": "-0.3"}``: a timing failure), over :data:`DEFAULT_ANSWERS`. ``tclsh``:
    the interpreter (default: ``tclsh`` on the PATH, else Python's ``tkinter.Tcl``).

    Raises :class:`~tessera.errors.HardwareToolError` when no Tcl interpreter is found, or
    the flow fails: a Tcl error (message and where), or the flow's own stop (exit code 1
    and its message, e.g. timing).
    """
    interpreter = _interpreter(tclsh)
    with tempfile.TemporaryDirectory(prefix="tessera-vivado-dry-run-") as tmp:
        run_dir = Path(tmp).resolve() / "project"
        run_dir.mkdir()
        script = _stage(project_or_tcl, run_dir, verilog)
        record_file = Path(tmp) / "record.jsonl"
        settings = {**DEFAULT_ANSWERS, **(answers or {})}
        args = [str(STANDIN), str(record_file), str(script),
                *(item for pair in settings.items() for item in pair)]
        try:
            done = subprocess.run(interpreter + args, cwd=run_dir, capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise HardwareToolError(f"the dry run of {script.name} did not finish within "
                                    f"{timeout:g} s") from None
        except OSError as exc:
            raise HardwareToolError(f"cannot run the Tcl interpreter {interpreter[0]}: "
                                    f"{exc.strerror}") from None
        entries = _read_record(record_file, run_dir)
        if done.returncode != 0:
            raise HardwareToolError(_failure(script.name, done))
        return _parse(entries, done.stdout)


def _interpreter(tclsh: str | None) -> list[str]:
    if tclsh is not None:
        found = shutil.which(tclsh)
        if found is None:
            raise HardwareToolError(f"Tcl interpreter {tclsh!r} not found")
        return [found]
    for name in ("tclsh", "tclsh8.6"):
        found = shutil.which(name)
        if found:
            return [found]
    try:
        import tkinter  # noqa: F401 - only whether Python has Tcl
    except ImportError:
        raise HardwareToolError("no Tcl interpreter: install Tcl 8.6 (apt install tcl, "
                                "brew install tcl-tk) or a Python with tkinter") from None
    return [sys.executable, "-c", _TKINTER_TCLSH]


# Runs a Tcl script like tclsh does, in Python's own Tcl (tkinter.Tcl).
_TKINTER_TCLSH = """\
import os, sys, tkinter
tcl = tkinter.Tcl()
tcl.createcommand("standin_host_exit", lambda code=0: os._exit(int(code)))
tcl.eval("set argv {}")
for arg in sys.argv[2:]:
    tcl.call("lappend", "argv", arg)
tcl.setvar("argc", len(sys.argv) - 2)
tcl.setvar("argv0", sys.argv[1])
try:
    tcl.call("source", sys.argv[1])
except tkinter.TclError as exc:
    sys.stderr.write(f"{exc}\\n")
    sys.exit(1)
"""


def _stage(project_or_tcl: VivadoProject | str | Path, run_dir: Path,
           verilog: str | Path | None) -> Path:
    """Copy the flow (and the Verilog it packages) into ``run_dir``; the script's path."""
    if isinstance(project_or_tcl, VivadoProject):
        tcl_file, verilog = project_or_tcl.tcl, verilog or project_or_tcl.verilog
    elif isinstance(project_or_tcl, Path) or _is_path(project_or_tcl):
        path = Path(project_or_tcl)
        tcl_file = path / _TCL if path.is_dir() else path
        if verilog is None and (tcl_file.parent / f"{IP_MODULE}.v").is_file():
            verilog = tcl_file.parent / f"{IP_MODULE}.v"
    else:
        tcl_file = None
    script = run_dir / _TCL
    if tcl_file is None:
        script.write_text(str(project_or_tcl))
    elif not tcl_file.is_file():
        raise HardwareToolError(f"no flow script at {tcl_file}")
    else:
        shutil.copyfile(tcl_file, script)
    if verilog is not None:
        shutil.copyfile(verilog, run_dir / f"{IP_MODULE}.v")
    return script


def _is_path(text: str) -> bool:
    """Whether ``text`` names an existing file or folder (rather than being Tcl)."""
    if "\n" in text:
        return False
    try:
        return Path(text).exists()
    except OSError:          # e.g. a line of Tcl longer than a file name may be
        return False


def _read_record(path: Path, run_dir: Path) -> list[dict]:
    if not path.is_file():
        return []
    prefix = str(run_dir) + "/"

    def local(value):
        if isinstance(value, str):
            return value.replace(prefix, "") if prefix in value else value
        if isinstance(value, list):
            return [local(v) for v in value]
        if isinstance(value, dict):
            return {k: local(v) for k, v in value.items()}
        return value

    return [local(json.loads(line, strict=False))
            for line in path.read_text().splitlines() if line.strip()]


def _failure(script: str, done: subprocess.CompletedProcess) -> str:
    """The message of a failed dry run: the flow's own ERROR lines, or the Tcl error."""
    stderr = done.stderr.strip()
    if done.returncode == 1 and "ERROR: [tessera]" in stderr:
        reasons = [line.split("] ", 1)[1] for line in stderr.splitlines()
                   if line.startswith("ERROR: [tessera]")]
        return f"the flow {script} stopped (exit code 1): " + "; ".join(reasons)
    lines = stderr.splitlines()
    message = lines[0].removeprefix("Tcl error: ") if lines else done.stdout[-2000:]
    where = re.search(r'\(file "[^"]*?([^"/]+)" line (\d+)\)', stderr)
    command = re.search(r'while executing\n"([^\n]*)', stderr)
    if where:
        message += f" ({where[1]} line {where[2]}"
        message += f": {command[1]})" if command else ")"
    return f"the flow {script} failed under the Vivado stand-in: {message}"


def _bd_path(handle: str) -> str:
    return handle.lstrip("/")


def _size(text: str) -> int:
    """An address or range as ``assign_bd_address`` takes it: ``0x10000`` or ``64K``."""
    match = re.fullmatch(r"(\d+)([KMGT])", text)
    if match:
        return int(match[1]) << (10 * " KMGT".index(match[2]))
    return int(text, 0)


def _parse(entries: list[dict], stdout: str) -> FlowRecord:
    record = FlowRecord(commands=entries, stdout=stdout)
    for entry in entries:
        cmd, opts, args = entry["cmd"], entry.get("opts", {}), entry.get("args", [])
        notes = entry.get("notes", {})
        if cmd == "create_project":
            record.part = opts.get("-part", "")
        elif cmd == "set_property":
            props = notes.get("properties", {})
            for obj in notes.get("objects", []):
                name = _bd_path(obj)
                if name in record.cells:
                    record.cells[name].properties.update(props)
                elif obj == notes.get("project") and "board_part" in props:
                    record.board_part = props["board_part"]
        elif cmd == "ipx::infer_core":
            core = notes["core"]
            record.cores[core["vlnv"]] = Core(core["vlnv"], tuple(core["pins"]),
                                              tuple(core["interfaces"]))
        elif cmd == "create_bd_cell":
            name = args[0]
            record.cells[name] = Cell(name, opts.get("-vlnv", ""), opts.get("-type", ""),
                                      opts.get("-reference", ""), {})
        elif cmd == "apply_bd_automation":
            record.automations.append((opts.get("-rule", ""), _bd_path(args[0]),
                                       opts.get("-config", "")))
        elif cmd == "connect_bd_intf_net":
            record.interface_nets.append((_bd_path(args[0]), _bd_path(args[1])))
        elif cmd == "connect_bd_net":
            record.nets.append(tuple(_bd_path(p) for p in notes["pins"]))
        elif cmd == "assign_bd_address":
            record.addresses.append(Address(_bd_path(opts["-target_address_space"]),
                                            _bd_path(args[0]), _size(opts["-offset"]),
                                            _size(opts["-range"])))
        elif cmd == "validate_bd_design":
            record.validated = True
        elif cmd == "launch_runs":
            record.runs += [(run, opts.get("-to_step", "")) for run in notes["runs"]]
        elif cmd == "add_files":
            record.files_added += notes["files"]
        elif cmd.startswith("report_") or cmd == "write_bitstream":
            record.reports.append((cmd, opts.get("-file", args[0] if args else "")))
        elif cmd == "file copy":
            record.copies.append((notes["source"], notes["destination"]))
    return record
