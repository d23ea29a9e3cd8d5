"""The hardware handoff (``.hwh``) of a Tessera block design.

``pynq.Overlay`` reads the ``.hwh`` beside a bitstream to find the IP in it: its
type (VLNV), where its registers sit, its parameters. Vivado writes it for a real
build; :func:`hwh_xml` writes the same description for the simulated PYNQ board
(:mod:`tessera.runtime.pynq_sim`) and for tests. It describes the design the
board flow builds: the board's processing system, our IP :data:`IP_INSTANCE`, its
``s_axi_control`` slave on the PS master at the board's register window, each
``m_axi_p<k>`` master of :func:`tessera.regmap.axi_ports` on the PS's HP port
``k``, ``aclk``/``aresetn`` from PL clock 0 and ``interrupt`` on the PS interrupt
pin. It leaves out what only Vivado needs (the AXI interconnects, reset
controllers and port-level signal maps).

The board facts come from :mod:`tessera.boards`; the register map from
:mod:`tessera.regmap`. Parses with pynq's ``RuntimeMetadataParser`` (pynq 3.x and
4.0) and with its older ``HWH`` parser.
"""
from __future__ import annotations

import json
import re
from xml.etree.ElementTree import Comment, Element, SubElement, indent, tostring

from .boards import Board, PlClock, get_board
from .config import HwConfig
from .regmap import (AXI_ADDR_BITS, AXI_ID_BITS, CONTROL_START, CTRL_ADDR_BITS,
                     CTRL_DATA_BITS, REGISTERS, STATUS_DONE, STATUS_ERROR, STATUS_RUNNING,
                     VERSION, AxiPort, axi_ports, config_id)

__all__ = ["CONTROL_INTERFACE", "IP_INSTANCE", "IP_MODULE", "IP_VLNV", "REGISTER_ACCESS",
           "hwh_xml"]

#: The accelerator IP as Vivado knows it: packaged from ``tessera_top``.
IP_VLNV = "tessera.dev:tessera:tessera_top:1.0"
IP_MODULE = "tessera_top"
#: Its instance name in the block design (the key of its ``ip_dict`` entry in pynq).
IP_INSTANCE = "tessera_0"
CONTROL_INTERFACE = "s_axi_control"

_AXIMM = "xilinx.com:interface:aximm:1.0"
#: IP-XACT access of each register access mode of tessera.regmap.
REGISTER_ACCESS = {"rw": "read-write", "r": "read-only", "w": "write-only"}
_FIELDS = {
    "CONTROL": {"START": CONTROL_START},
    "STATUS": {"DONE": STATUS_DONE, "ERROR": STATUS_ERROR, "RUNNING": STATUS_RUNNING},
}


def hwh_xml(config: HwConfig, board: str | Board) -> str:
    """The ``.hwh`` of ``config``'s accelerator in the block design for ``board``.

    Raises :class:`tessera.errors.ConfigError` if the config does not fit the board
    (another part, more DRAM ports than HP ports, a bus width the ports lack).
    """
    board = get_board(board)
    board.check(config)
    clock = board.pl_clock(config.clock_mhz)
    root = Element("EDKSYSTEM", EDWVERSION="1.2")
    root.append(Comment(f" Written by tessera.hwh for config {config.name!r} on board "
                        f"{board.name}: the block design the board flow builds, not a "
                        "Vivado output "))
    device, package, speed = _part_fields(board.part)
    SubElement(root, "SYSTEMINFO", ARCH=board.family, BOARD=board.board_part, DEVICE=device,
               NAME=f"tessera_{config.name}", PACKAGE=package, SPEEDGRADE=speed)
    SubElement(root, "EXTERNALPORTS")
    SubElement(root, "EXTERNALINTERFACES")
    modules = SubElement(root, "MODULES")
    modules.append(_ps_module(config, board, clock))
    # With a Clocking Wizard (a clock the PS cannot make) our IP runs at the config's clock.
    modules.append(_ip_module(config, board, board.accelerator_clock(config.clock_mhz)))
    indent(root)
    return ('<?xml version="1.0" encoding="UTF-8" standalone="no" ?>\n'
            + tostring(root, encoding="unicode") + "\n")


# ------------------------------------------------------------ processing system
def _ps_module(config: HwConfig, board: Board, clock: PlClock) -> Element:
    ps = board.ps
    module = Element("MODULE", FULLNAME=f"/{ps.instance}", INSTANCE=ps.instance,
                     IPTYPE="PERIPHERAL", IS_ENABLE="1", IS_PL="FALSE", MODTYPE=ps.module,
                     VLNV=ps.vlnv)
    params = {ps.master.enable: "1", **dict(ps.irq_enable),
              **_CLOCK_PARAMETERS[ps.module](config, board, clock)}
    if ps.master.width:
        params[ps.master.width] = str(CTRL_DATA_BITS)
    for port in axi_ports(config):
        slave = board.slave(port.index)
        params[slave.enable] = "1"
        if slave.width:
            params[slave.width] = str(port.data_bits)
    _parameters(module, params)
    memory_map = SubElement(module, "MEMORYMAP")
    _memrange(memory_map, "reg0", board.registers.base, board.registers.high, IP_INSTANCE,
              ps.master.name, "REGISTER", CONTROL_INTERFACE)
    ports = SubElement(module, "PORTS")
    _port(ports, ps.fclk, "O", _net(ps.instance, ps.fclk), [(IP_INSTANCE, "aclk")],
          SIGIS="clk", CLKFREQUENCY=_hz(clock))
    _port(ports, ps.fclk_reset, "O", _net(ps.instance, ps.fclk_reset),
          [(IP_INSTANCE, "aresetn")], SIGIS="rst")
    _port(ports, ps.irq, "I", _net(IP_INSTANCE, "interrupt"), [(IP_INSTANCE, "interrupt")],
          SIGIS="INTERRUPT", LEFT="0", RIGHT="0", SENSITIVITY="LEVEL_HIGH")
    interfaces = SubElement(module, "BUSINTERFACES")
    SubElement(interfaces, "BUSINTERFACE", BUSNAME=_net(ps.instance, ps.master.name),
               NAME=ps.master.name, TYPE="MASTER", VLNV=_AXIMM)
    for port in axi_ports(config):
        SubElement(interfaces, "BUSINTERFACE", BUSNAME=_net(IP_INSTANCE, port.name),
                   NAME=board.slave(port.index).name, TYPE="SLAVE", VLNV=_AXIMM)
    return module


def _ps7_clocks(config: HwConfig, board: Board, clock: PlClock) -> dict[str, str]:
    """How Vivado records the PS7's PL clocks (3.x reads the divisors and enables)."""
    ps = board.ps
    params = {"PCW_CRYSTAL_PERIPHERAL_FREQMHZ": f"{ps.ref_mhz:g}",
              "PCW_IOPLL_CTRL_FBDIV": str(ps.pll.fbdiv),
              ps.fclk_param: f"{config.clock_mhz:g}",
              "PCW_ACT_FPGA0_PERIPHERAL_FREQMHZ": f"{clock.mhz:.6f}",
              # pynq 4.0 reads every PS's achieved PL clock under the UltraScale+ name,
              # even the PS7's; without it its Overlay cannot set FCLK0.
              "PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ": f"{clock.mhz:.6f}"}
    for i, (d0, d1) in enumerate(_divisors(clock)):
        params[f"PCW_FPGA_FCLK{i}_ENABLE"] = "1" if i == 0 else "0"
        params[f"PCW_FCLK{i}_PERIPHERAL_CLKSRC"] = ps.pll.name
        params[f"PCW_FCLK{i}_PERIPHERAL_DIVISOR0"] = str(d0)
        params[f"PCW_FCLK{i}_PERIPHERAL_DIVISOR1"] = str(d1)
    return params


def _psu_clocks(config: HwConfig, board: Board, clock: PlClock) -> dict[str, str]:
    """How Vivado records the zynq_ultra_ps_e's PL clocks."""
    ps = board.ps
    params = {"PSU__PSS_REF_CLK__FREQMHZ": f"{ps.ref_mhz:g}",
              "PSU__CRL_APB__IOPLL_CTRL__FBDIV": str(ps.pll.fbdiv),
              "PSU__CRL_APB__IOPLL_CTRL__DIV2": "1" if ps.pll.div2 else "0",
              ps.fclk_param: f"{config.clock_mhz:g}",
              "PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ": f"{clock.mhz:.6f}"}
    for i, (d0, d1) in enumerate(_divisors(clock)):
        prefix = f"PSU__CRL_APB__PL{i}_REF_CTRL__"
        params[f"PSU__FPGA_PL{i}_ENABLE"] = "1" if i == 0 else "0"
        params[prefix + "SRCSEL"] = ps.pll.name
        params[prefix + "DIVISOR0"] = str(d0)
        params[prefix + "DIVISOR1"] = str(d1)
    return params


_CLOCK_PARAMETERS = {"processing_system7": _ps7_clocks, "zynq_ultra_ps_e": _psu_clocks}


def _divisors(clock: PlClock) -> list[tuple[int, int]]:
    """Divisors of the four PL clocks: clock 0 is ours, 1 to 3 are off (parsers want all)."""
    return [(clock.divisor0, clock.divisor1)] + [(1, 1)] * 3


# ---------------------------------------------------------------------- our IP
def _ip_module(config: HwConfig, board: Board, clock: PlClock) -> Element:
    ps = board.ps
    module = Element("MODULE", FULLNAME=f"/{IP_INSTANCE}", INSTANCE=IP_INSTANCE,
                     IPTYPE="PERIPHERAL", IS_ENABLE="1", MODCLASS="PERIPHERAL",
                     MODTYPE=IP_MODULE, VLNV=IP_VLNV)
    _parameters(module, {
        "CONFIG_NAME": config.name, "CONFIG_ID": f"{config_id(config):#010x}",
        "INTERFACE_VERSION": f"{VERSION:#010x}",
        "CONFIG": json.dumps(config.to_dict(), sort_keys=True, separators=(",", ":")),
        "C_S_AXI_CONTROL_BASEADDR": f"{board.registers.base:#010x}",
        "C_S_AXI_CONTROL_HIGHADDR": f"{board.registers.high:#010x}",
    })
    _address_block(SubElement(module, "ADDRESSBLOCKS"), board.registers.size)
    memory_map = SubElement(module, "MEMORYMAP")
    for port in axi_ports(config):
        _memrange(memory_map, board.slave_segment(port.index), board.dram.base,
                  board.dram.high, ps.instance, port.name, "MEMORY",
                  board.slave(port.index).name)
    ports = SubElement(module, "PORTS")
    buses = ":".join([CONTROL_INTERFACE] + [p.name for p in axi_ports(config)])
    _port(ports, "aclk", "I", _net(ps.instance, ps.fclk), [(ps.instance, ps.fclk)],
          SIGIS="clk", CLKFREQUENCY=_hz(clock), ASSOCIATED_BUSIF=buses,
          ASSOCIATED_RESET="aresetn")
    _port(ports, "aresetn", "I", _net(ps.instance, ps.fclk_reset),
          [(ps.instance, ps.fclk_reset)], SIGIS="rst", POLARITY="ACTIVE_LOW")
    _port(ports, "interrupt", "O", _net(IP_INSTANCE, "interrupt"), [(ps.instance, ps.irq)],
          SIGIS="INTERRUPT", SENSITIVITY="LEVEL_HIGH")
    interfaces = SubElement(module, "BUSINTERFACES")
    control = SubElement(interfaces, "BUSINTERFACE", BUSNAME=_net(ps.instance, ps.master.name),
                         DATAWIDTH=str(CTRL_DATA_BITS), NAME=CONTROL_INTERFACE, TYPE="SLAVE",
                         VLNV=_AXIMM)
    _parameters(control, {"PROTOCOL": "AXI4LITE", "DATA_WIDTH": str(CTRL_DATA_BITS),
                          "ADDR_WIDTH": str(CTRL_ADDR_BITS), "FREQ_HZ": _hz(clock)})
    for port in axi_ports(config):
        _master_interface(interfaces, port, config, clock)
    return module


def _master_interface(interfaces: Element, port: AxiPort, config: HwConfig,
                      clock: PlClock) -> None:
    mode = ("READ_WRITE" if port.reads and port.writer
            else "READ_ONLY" if port.reads else "WRITE_ONLY")
    master = SubElement(interfaces, "BUSINTERFACE", BUSNAME=_net(IP_INSTANCE, port.name),
                        DATAWIDTH=str(port.data_bits), NAME=port.name, TYPE="MASTER",
                        VLNV=_AXIMM)
    _parameters(master, {"PROTOCOL": "AXI4", "DATA_WIDTH": str(port.data_bits),
                         "ADDR_WIDTH": str(AXI_ADDR_BITS), "ID_WIDTH": str(AXI_ID_BITS),
                         "MAX_BURST_LENGTH": str(config.max_burst_beats),
                         "READ_WRITE_MODE": mode, "FREQ_HZ": _hz(clock)})


def _address_block(blocks: Element, size: int) -> None:
    """The register map of ``s_axi_control`` (pynq shows it as the IP's ``registers``)."""
    block = SubElement(blocks, "ADDRESSBLOCK", ACCESS="read-write", INTERFACE=CONTROL_INTERFACE,
                       NAME="reg0", RANGE=str(size), USAGE="register")
    registers = SubElement(block, "REGISTERS")
    for reg in REGISTERS:
        element = SubElement(registers, "REGISTER", NAME=reg.name)
        _properties(element, {"DESCRIPTION": reg.doc, "ADDRESS_OFFSET": f"{reg.offset:#x}",
                              "SIZE": str(CTRL_DATA_BITS), "ACCESS": REGISTER_ACCESS[reg.access],
                              "IS_ENABLED": "true", "RESET_VALUE": "0"})
        fields = SubElement(element, "FIELDS")
        for name, mask in _FIELDS.get(reg.name, {}).items():
            field = SubElement(fields, "FIELD", NAME=name)
            _properties(field, {"DESCRIPTION": f"{reg.name}.{name}",
                                "ACCESS": REGISTER_ACCESS[reg.access],
                                "BIT_OFFSET": str(mask.bit_length() - 1), "BIT_WIDTH": "1"})


# --------------------------------------------------------------------- helpers
def _part_fields(part: str) -> tuple[str, str, str]:
    """SYSTEMINFO's DEVICE, PACKAGE and SPEEDGRADE of a part name."""
    match = re.fullmatch(r"xc(?P<device>\w+?)-?(?P<package>[a-z]{3,4}\d+)-(?P<speed>\d+)(-\w)?",
                         part)
    if match is None:
        raise ValueError(f"cannot split part name {part!r} into device, package and speed grade")
    return match["device"], match["package"], f"-{match['speed']}"


def _net(instance: str, pin: str) -> str:
    return f"{instance}_{pin}"


def _hz(clock: PlClock) -> str:
    return str(round(clock.mhz * 1e6))


def _parameters(parent: Element, values: dict[str, str]) -> None:
    params = SubElement(parent, "PARAMETERS")
    for name, value in values.items():
        SubElement(params, "PARAMETER", NAME=name, VALUE=value)


def _properties(parent: Element, values: dict[str, str]) -> None:
    for name, value in values.items():
        SubElement(parent, "PROPERTY", NAME=name, VALUE=value)


def _memrange(parent: Element, block: str, base: int, high: int, instance: str, master: str,
              memtype: str, slave: str) -> None:
    SubElement(parent, "MEMRANGE", ADDRESSBLOCK=block, BASENAME="C_BASEADDR",
               BASEVALUE=f"{base:#010x}", HIGHNAME="C_HIGHADDR", HIGHVALUE=f"{high:#010x}",
               INSTANCE=instance, IS_DATA="TRUE", IS_INSTRUCTION="TRUE",
               MASTERBUSINTERFACE=master, MEMTYPE=memtype, SLAVEBUSINTERFACE=slave)


def _port(parent: Element, name: str, direction: str, net: str,
          connections: list[tuple[str, str]], **attrs: str) -> None:
    port = SubElement(parent, "PORT", DIR=direction, NAME=name, SIGNAME=net, **attrs)
    conns = SubElement(port, "CONNECTIONS")
    for instance, pin in connections:
        SubElement(conns, "CONNECTION", INSTANCE=instance, PORT=pin)
