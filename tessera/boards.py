"""The boards Tessera runs on: the facts the board driver, the simulated board and the
Vivado flow share.

One :class:`Board` per supported board: the FPGA part, the processing system (PS)
and how the accelerator attaches to it (the PS master that reaches our control
registers and where they sit, the high-performance slave ports our DRAM masters
use, the PL clock and interrupt pins), and the HwConfig preset it takes by default.
:mod:`tessera.hwh` writes the hardware handoff (``.hwh``) from these, the board
flow will write its block-design Tcl from them, and
:mod:`tessera.runtime.pynq_sim` models the board's PS from them. Plain Python:
a board needs only the runtime installed.

Parameter names (``enable``, ``width``, ``fclk_param``...) are the Vivado ``CONFIG.*``
properties of the PS IP that set each feature.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from .config import HwConfig
from .errors import ConfigError
from .regmap import axi_ports

__all__ = ["BOARD_CPUS", "BOARDS", "CLOCK_TOLERANCE", "Board", "PlClock", "Pll",
           "ProcessingSystem", "PsPort", "Window", "get_board"]

#: The AXI4-Lite register window of our IP on every board. Vivado assigns an AXI-Lite
#: slave at least 4 KiB; its "assign all" gives 64 KiB to IP on these PS masters (as in
#: PYNQ's own overlays), so the simulated .hwh and a Vivado-built one agree, and pynq
#: maps the window as a whole, so its size costs nothing. The registers use the
#: first 256 bytes (``tessera.regmap.CTRL_ADDR_BITS``); the rest aliases them.
REGISTER_RANGE = 64 * 1024

#: The boards' CPUs by ``ProcessingSystem.arch`` (the board's ``platform.machine()``):
#: triple and features; the CPU is the board's host model name (``Board.host``), which
#: is LLVM's name for it. Zynq-7000: Cortex-A9, ARMv7-A with NEON and VFPv3, hard-float
#: Linux (PYNQ's images are armhf); Zynq UltraScale+: Cortex-A53, AArch64. The third
#: entry: the features a CPU must have to run objects built for it (LLVM names).
BOARD_CPUS = {"armv7l": ("armv7-unknown-linux-gnueabihf", "+neon,+vfp3", ("neon",)),
              "aarch64": ("aarch64-unknown-linux-gnu", "+neon", ("neon",))}

#: How far the PS's PL clock may miss a config's clock (relative) before the board flow
#: adds a Clocking Wizard that makes the config's clock exactly.
CLOCK_TOLERANCE = 0.01


@dataclass(frozen=True)
class Window:
    """An address range ``[base, base + size)`` and the Vivado address segment naming it."""

    base: int
    size: int
    segment: str = ""

    @property
    def high(self) -> int:
        """The last byte's address (the ``HIGHVALUE`` Vivado writes)."""
        return self.base + self.size - 1

    def __contains__(self, address: int) -> bool:
        return self.base <= address <= self.high


@dataclass(frozen=True)
class PsPort:
    """One AXI interface between the PS and the PL."""

    name: str                      # the PS IP's bus interface
    enable: str                    # CONFIG parameter that turns it on (value 1)
    width: str | None              # CONFIG parameter of its data width (None: fixed)
    widths: tuple[int, ...]        # data widths in bits it supports

    @property
    def short(self) -> str:
        """Its short name (``S_AXI_HPC0_FPD`` -> ``HPC0``), as address segments name it."""
        return self.name.split("_")[2]


@dataclass(frozen=True)
class Pll:
    """The PS PLL that drives the PL clocks: ``ref_mhz * fbdiv / (2 if div2 else 1)``."""

    name: str                      # as the PS configuration names the clock source
    fbdiv: int
    div2: bool = False


@dataclass(frozen=True)
class PlClock:
    """A PL clock's setting: two 6-bit divisors of the PLL, and the frequency they give."""

    divisor0: int
    divisor1: int
    mhz: float


@dataclass(frozen=True)
class ProcessingSystem:
    """The hard processor system of a Zynq part, as Vivado instantiates it."""

    module: str                    # IP name (the .hwh MODTYPE)
    vlnv: str
    instance: str                  # instance name in the block design
    arch: str                      # platform.machine() of the board's Linux
    ref_mhz: float                 # PS reference clock
    pll: Pll                       # source of the PL clock
    fclk: str                      # PL clock 0 pin, our aclk
    fclk_reset: str                # its reset pin, our aresetn
    fclk_param: str                # CONFIG parameter: PL clock 0 requested frequency in MHz
    master: PsPort                 # reaches our s_axi_control
    master_window: Window          # what that master addresses
    slaves: tuple[PsPort, ...]     # the HP ports our masters use, in order
    slave_segment: str             # address segment of DDR through a slave ({port}: short)
    irq: str                       # PL-to-PS interrupt pin our interrupt drives
    irq_enable: tuple[tuple[str, str], ...]   # CONFIG parameters enabling it

    @property
    def pll_mhz(self) -> float:
        return self.ref_mhz * self.pll.fbdiv / (2 if self.pll.div2 else 1)


@dataclass(frozen=True)
class Board:
    """A board: part, PS, where the accelerator's registers sit, and its default preset."""

    name: str
    title: str
    board_part: str                # Vivado board part (board files)
    part: str
    family: str                    # Vivado architecture name ("zynq", "zynquplus")
    ps: ProcessingSystem
    preset: str                    # the tessera.config PRESETS entry it takes by default
    registers: Window              # our s_axi_control window
    dram: Window                   # PS DDR as the HP ports see it
    host: str = "cortex-a9"        # its CPU's host cost model (tessera/hostmodels/<host>.json)

    def check(self, config: HwConfig) -> None:
        """Raise :class:`ConfigError` unless ``config`` can be built for this board."""
        if config.part != self.part:
            raise ConfigError(f"config {config.name!r} targets part {config.part}, board "
                              f"{self.name} has {self.part}: use a config for this part "
                              f"(preset {self.preset!r})")
        bits = config.bus_bytes * 8
        for port in axi_ports(config):
            if port.index >= len(self.ps.slaves):
                raise ConfigError(f"config {config.name!r} uses DRAM port {port.index}, board "
                                  f"{self.name} has {len(self.ps.slaves)} slave ports: set "
                                  f"module_ports to ports below {len(self.ps.slaves)}")
            if bits not in self.ps.slaves[port.index].widths:
                raise ConfigError(f"config {config.name!r} has a {bits}-bit bus, the HP ports "
                                  f"of board {self.name} take {self.ps.slaves[port.index].widths}"
                                  " bits: change bus_bytes")

    def slave(self, port: int) -> PsPort:
        """The PS slave port our DRAM master ``m_axi_p<port>`` connects to (HP<port>)."""
        return self.ps.slaves[port]

    def slave_segment(self, port: int) -> str:
        """The address segment of DDR behind the slave of ``m_axi_p<port>``."""
        return self.ps.slave_segment.format(port=self.slave(port).short)

    def pl_clock(self, mhz: float) -> PlClock:
        """The divisors of the PS PLL closest to ``mhz``, and the frequency they give (what
        Vivado reports as the achieved PL clock)."""
        pll = self.ps.pll_mhz
        d0, d1 = min(product(range(1, 64), repeat=2),
                     key=lambda d: (abs(pll / (d[0] * d[1]) - mhz), d[1], d[0]))
        return PlClock(d0, d1, round(pll / (d0 * d1), 6))

    def needs_clock_wizard(self, mhz: float) -> bool:
        """Whether the PS's PL clock misses ``mhz`` by more than :data:`CLOCK_TOLERANCE`
        (the accelerator then runs from a Clocking Wizard at exactly ``mhz``)."""
        return abs(self.pl_clock(mhz).mhz - mhz) > CLOCK_TOLERANCE * mhz

    def accelerator_clock(self, mhz: float) -> PlClock:
        """The clock our IP runs at for a config asking ``mhz``: the PS's PL clock, or
        exactly ``mhz`` from the Clocking Wizard (divisors 0: not a PS clock)."""
        return PlClock(0, 0, float(mhz)) if self.needs_clock_wizard(mhz) else self.pl_clock(mhz)


def _zynq_hp(k: int) -> PsPort:
    return PsPort(f"S_AXI_HP{k}", f"PCW_USE_S_AXI_HP{k}", f"PCW_S_AXI_HP{k}_DATA_WIDTH", (32, 64))


def _zynqmp_slave(name: str, gp: int) -> PsPort:
    return PsPort(f"S_AXI_{name}_FPD", f"PSU__USE__S_AXI_GP{gp}",
                  f"PSU__SAXIGP{gp}__DATA_WIDTH", (32, 64, 128))


#: The ZynqMP's FPD slave ports our masters may use, as DRAM ports 0..5: the
#: high-performance HP0..HP3 (the PS's slave GP2..GP5), then the coherent HPC0 and HPC1
#: (slave GP0, GP1; our masters issue non-coherent reads, so they serve as two more HP
#: ports; the zcu104 preset's load module reads over HP1 and HPC0).
_ZYNQMP_SLAVES = tuple(_zynqmp_slave(f"HP{k}", k + 2) for k in range(4)) + \
    tuple(_zynqmp_slave(f"HPC{k}", k) for k in range(2))


#: Zynq-7000 PS of the PYNQ-Z1/Z2: 50 MHz PS_CLK, IO PLL at 1000 MHz.
PS7 = ProcessingSystem(
    module="processing_system7", vlnv="xilinx.com:ip:processing_system7:5.5",
    instance="processing_system7_0", arch="armv7l", ref_mhz=50.0, pll=Pll("IO PLL", 20),
    fclk="FCLK_CLK0", fclk_reset="FCLK_RESET0_N", fclk_param="PCW_FPGA0_PERIPHERAL_FREQMHZ",
    master=PsPort("M_AXI_GP0", "PCW_USE_M_AXI_GP0", None, (32,)),
    master_window=Window(0x4000_0000, 0x4000_0000),
    slaves=tuple(_zynq_hp(k) for k in range(4)), slave_segment="{port}_DDR_LOWOCM",
    irq="IRQ_F2P", irq_enable=(("PCW_USE_FABRIC_INTERRUPT", "1"), ("PCW_IRQ_F2P_INTR", "1")),
)

#: Zynq UltraScale+ PS of the ZCU104: 33.333 MHz PSS_REF_CLK, IOPLL at 1500 MHz.
PSU = ProcessingSystem(
    module="zynq_ultra_ps_e", vlnv="xilinx.com:ip:zynq_ultra_ps_e:3.4",
    instance="zynq_ultra_ps_e_0", arch="aarch64", ref_mhz=33.333, pll=Pll("IOPLL", 90, True),
    fclk="pl_clk0", fclk_reset="pl_resetn0", fclk_param="PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ",
    master=PsPort("M_AXI_HPM0_FPD", "PSU__USE__M_AXI_GP0", "PSU__MAXIGP0__DATA_WIDTH",
                  (32, 64, 128)),
    master_window=Window(0xA000_0000, 0x1000_0000),
    slaves=_ZYNQMP_SLAVES, slave_segment="{port}_DDR_LOW",
    irq="pl_ps_irq0", irq_enable=(("PSU__USE__IRQ0", "1"),),
)


def _pynq_board(name: str, title: str, board_part: str) -> Board:
    return Board(name=name, title=title, board_part=board_part, part="xc7z020clg400-1",
                 family="zynq", ps=PS7, preset="pynq",
                 registers=Window(0x4000_0000, REGISTER_RANGE),
                 dram=Window(0x0000_0000, 512 << 20))


BOARDS: dict[str, Board] = {
    "pynq-z1": _pynq_board("pynq-z1", "Digilent PYNQ-Z1", "www.digilentinc.com:pynq-z1:part0:1.0"),
    "pynq-z2": _pynq_board("pynq-z2", "TUL PYNQ-Z2", "tul.com.tw:pynq-z2:part0:1.0"),
    # The UltraScale+ board: the ZCU104, because its xczu7ev (1728 DSPs) holds the
    # zcu104 preset's 32x32 GEMM core, which the Ultra96's xczu3eg (360 DSPs) does not.
    "zcu104": Board(name="zcu104", title="AMD Zynq UltraScale+ ZCU104",
                    board_part="xilinx.com:zcu104:part0:1.1", part="xczu7ev-ffvc1156-2-e",
                    family="zynquplus", ps=PSU, preset="zcu104",
                    registers=Window(0xA000_0000, REGISTER_RANGE),
                    dram=Window(0x0000_0000, 2 << 30), host="cortex-a53"),
}


def get_board(name: str | Board) -> Board:
    """A board by name (``pynq-z1``, ``pynq-z2``, ``zcu104``)."""
    if isinstance(name, Board):
        return name
    try:
        return BOARDS[name]
    except KeyError:
        raise ConfigError(f"unknown board {name!r}: choose one of {', '.join(BOARDS)}") from None
