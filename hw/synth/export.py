"""Verilog export of the accelerator, with the port names Vivado's IP integrator infers.

The top module ``tessera_top`` has ``aclk``, ``aresetn`` (active low),
``interrupt``, the AXI4-Lite slave ``s_axi_control_*`` and the AXI4 masters
``m_axi_p<k>_*``; :func:`tessera.regmap.describe` documents them in JSON.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from amaranth.back import rtlil as amaranth_rtlil
from amaranth.back import verilog as amaranth_verilog
from amaranth.hdl import (ClockDomain, ClockSignal, Elaboratable, Fragment, Module, ResetSignal,
                          Signal)
from amaranth.lib import wiring

from tessera.config import HwConfig
from tessera.regmap import describe

from ..accelerator import Accelerator

TOP_NAME = "tessera_top"

#: HwConfig fields the RTL reads only through the CONFIG_ID register's constant (a CRC of
#: the whole config): the config's name, the part it is placed on, and what the simulator
#: assumes of the world around the design (its clock, the DRAM's latency and bandwidth).
#: :func:`design_config` sets them to the defaults' values, so configs that differ only
#: in them share one synthesis (a sweep over the clock, say).
NON_DESIGN_FIELDS = ("name", "part", "clock_mhz", "dram_latency", "ddr_bytes_per_cycle")

#: The stages :func:`verilog` reports, in order (on ``pynq`` the export takes over a minute,
#: most of it in the RTLIL conversion).
EXPORT_STAGES = ("elaborating the design", "converting to RTLIL", "writing Verilog with yosys")


class _Top(Elaboratable):
    """Flat, explicitly named ports around :class:`Accelerator` in its own clock domain."""

    def __init__(self, config: HwConfig) -> None:
        self.core = Accelerator(config)
        self.aclk = Signal(name="aclk")
        self.aresetn = Signal(name="aresetn")
        self.flat: list[tuple[Signal, Signal, bool]] = []   # (top port, core signal, is output)
        for path, member, value in self.core.signature.flatten(self.core):
            name = "_".join(str(part) for part in path)
            self.flat.append((Signal(len(value), name=name), value, member.flow == wiring.Out))

    @property
    def ports(self) -> list[Signal]:
        return [self.aclk, self.aresetn] + [port for port, _, _ in self.flat]

    def elaborate(self, platform) -> Module:
        m = Module()
        m.domains.sync = ClockDomain("sync")
        m.d.comb += [ClockSignal("sync").eq(self.aclk), ResetSignal("sync").eq(~self.aresetn)]
        m.submodules.core = self.core
        for port, value, is_output in self.flat:
            m.d.comb += port.eq(value) if is_output else value.eq(port)
        return m


def design_config(config: HwConfig) -> HwConfig:
    """``config`` with the fields the RTL does not read (:data:`NON_DESIGN_FIELDS`) at
    their defaults: the same Verilog, a key shared by every config that has it."""
    default = HwConfig()
    return config.replace(**{name: getattr(default, name) for name in NON_DESIGN_FIELDS})


def verilog(config: HwConfig, progress: Callable[[str], None] | None = None) -> str:
    """The Verilog of the accelerator for ``config`` (top module ``tessera_top``).

    ``progress``, if given, is called with each of :data:`EXPORT_STAGES` as it starts.
    """
    report = progress or (lambda stage: None)
    top = _Top(config)
    # amaranth.back.verilog.convert's three steps, taken one at a time to report each;
    # _convert_rtlil_text is Amaranth's own yosys step (pyproject pins Amaranth 0.5.10).
    report(EXPORT_STAGES[0])
    fragment = Fragment.get(top, None)
    report(EXPORT_STAGES[1])
    rtlil_text, _ = amaranth_rtlil.convert_fragment(fragment, top.ports, TOP_NAME,
                                                    emit_src=False)
    report(EXPORT_STAGES[2])
    return amaranth_verilog._convert_rtlil_text(rtlil_text, strip_internal_attrs=True)


def write(config: HwConfig, directory: str | Path,
          progress: Callable[[str], None] | None = None) -> list[Path]:
    """Write ``tessera_top.v`` and ``tessera_top.json`` (register map and ports) to
    ``directory``; ``progress`` as for :func:`verilog`."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    v = out / f"{TOP_NAME}.v"
    v.write_text(verilog(config, progress))
    j = out / f"{TOP_NAME}.json"
    j.write_text(json.dumps({"top": TOP_NAME, **describe(config)}, indent=2) + "\n")
    return [v, j]
