"""What a board flow is made of: the project folder's layout, Vivado's names for each
processing system, and the :class:`FlowPlan` every step of the flow's Tcl reads.

Core only (the tessera core and the standard library): :mod:`tessera.bitstreams.build`
reads a project folder's layout from here without the Verilog export.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tessera.boards import Board, PlClock, ProcessingSystem, PsPort
from tessera.config import HwConfig
from tessera.errors import ConfigError
from tessera.regmap import AxiPort, axi_ports, describe

from . import BIT_NAME, HWH_NAME

__all__ = ["BIT_NAME", "EXPECTED_HWH_NAME", "HWH_NAME", "IP_REPO_DIR", "OUT_DIR", "PS_FLOW",
           "README_NAME", "REPORTS_DIR", "TCL_NAME", "VIVADO_DIR", "FlowPlan", "PsFlow",
           "VivadoProject"]

# The folder layout of a project (relative to its directory). The flow writes the
# bitstream and its .hwh into OUT_DIR under the names an installed folder keeps.
TCL_NAME = "build.tcl"
EXPECTED_HWH_NAME = "expected.hwh"
README_NAME = "README.txt"
OUT_DIR = "out"
REPORTS_DIR = "reports"
IP_REPO_DIR = "ip"
VIVADO_DIR = "vivado"


@dataclass(frozen=True)
class VivadoProject:
    """A project folder :func:`~tessera.bitstreams.flow.write_project` wrote: run
    ``vivado -mode batch -source build.tcl`` in :attr:`directory`."""

    directory: Path
    tcl: Path             # build.tcl: the whole flow
    verilog: Path         # the exported Verilog it packages
    bitstream: Path       # where the flow writes the .bit (out/tessera.bit)
    hwh: Path             # where the flow copies the .hwh, beside the .bit
    expected_hwh: Path    # tessera.hwh.hwh_xml(config, board): what the flow must produce
    reports: Path         # utilisation and timing reports
    board: str
    config: HwConfig


@dataclass(frozen=True)
class PsFlow:
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
    """The zynq_ultra_ps_e memory map behind the slave port ``port``."""
    # zynq_ultra_ps_e names the memory map behind S_AXI_HP<k>_FPD after the PS's slave GP
    # number (SAXIGP<k+2>), the number its enable parameter PSU__USE__S_AXI_GP<n> carries.
    match = re.search(r"GP(\d+)$", port.enable)
    if match is None:
        raise ConfigError(f"cannot tell the slave GP number of {port.name} from {port.enable}")
    return f"SAXIGP{match[1]}"


#: Vivado's names for each PS IP, by its module name (ProcessingSystem.module).
PS_FLOW = {
    "processing_system7": PsFlow(
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
    "zynq_ultra_ps_e": PsFlow(
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


@dataclass(frozen=True)
class FlowPlan:
    """What every step of one board flow reads: the board, the config, and the clock,
    ports and names that follow from them."""

    board: Board
    config: HwConfig
    vivado: PsFlow                 # Vivado's names for the board's PS
    clock: PlClock                 # PL clock 0 (Board.pl_clock)
    ports: tuple[AxiPort, ...]     # our AXI4 masters (tessera.regmap.axi_ports)
    aclk: str                      # our IP's clock, reset and interrupt pins
    aresetn: str
    interrupt: str
    name: str                      # of the Vivado project and its block design
    #: The PS's PL clock 0 misses the config's clock by more than CLOCK_TOLERANCE.
    wizard: bool

    @classmethod
    def of(cls, board: Board, config: HwConfig) -> FlowPlan:
        """The plan of ``config`` on ``board`` (which must fit: :meth:`Board.check`)."""
        signals = describe(config)
        return cls(board=board, config=config, vivado=PS_FLOW[board.ps.module],
                   clock=board.pl_clock(config.clock_mhz), ports=tuple(axi_ports(config)),
                   aclk=signals["clock"]["port"], aresetn=signals["reset"]["port"],
                   interrupt=signals["interrupt"]["port"],
                   name="tessera_" + re.sub(r"\W", "_", config.name),
                   wizard=board.needs_clock_wizard(config.clock_mhz))

    @property
    def ps(self) -> ProcessingSystem:
        """The board's processing system."""
        return self.board.ps
