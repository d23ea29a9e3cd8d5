"""The simulated accelerators behind the ``sim`` and ``rtl`` backends and the simulated
PYNQ board: a register window and a DRAM, as a driver sees the hardware.

:class:`SimModel` is the cycle simulator (:class:`tessera.sim.registers.SimRegisters`
over a numpy DRAM); :class:`RtlModel` is the Verilator model of the RTL
(:class:`tessera.hw.harness.rtlsim.RtlSim`, whose harness holds the DRAM). Both answer
register reads and writes at offsets of :mod:`tessera.regmap`, move bytes in and
out of DRAM, and power up (on-chip buffers zeroed). Buffers are placed by the
owner's :class:`~tessera.runtime.memory.PageAllocator`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tessera.config import HwConfig
from tessera.errors import DeviceError
from tessera.regmap import CONTROL_START, REG
from tessera.sim.registers import SimRegisters

from .memory import PageAllocator

__all__ = ["DRAM_BYTES", "MODELS", "RtlModel", "SimModel", "make_model"]

#: The simulated DRAM of every simulated device and board (numpy zero pages and the
#: harness's calloc: only what buffers touch is resident).
DRAM_BYTES = 1 << 28

#: Cycles the RTL model runs per register read while a run is in progress: the driver's
#: STATUS polling is what moves it on, so a hung program runs into the driver's timeout.
POLL_CYCLES = 20_000


class SimModel:
    """The cycle simulator behind the register map; DRAM is a numpy array it shares."""

    def __init__(self, config: HwConfig, memory_bytes: int, allocator: PageAllocator, *,
                 trace: bool = False) -> None:
        self.config = config
        self.memory = np.zeros(memory_bytes, dtype=np.uint8)     # zero pages until touched
        self.allocator = allocator
        self.trace = trace
        self.registers = SimRegisters(config, self.memory, trace=trace)

    def read(self, offset: int) -> int:
        return self.registers.read(offset)

    def write(self, offset: int, value: int) -> None:
        # A run sees memory up to the highest buffer: it copies no more than that.
        self.registers.extent = self.allocator.high_water
        self.registers.write(offset, value)

    def write_memory(self, address: int, data: np.ndarray) -> None:
        self.memory[address:address + data.size] = data

    def read_memory(self, address: int, nbytes: int) -> np.ndarray:
        return self.memory[address:address + nbytes].copy()

    def idle(self, seconds: float) -> None:
        self.registers.join(seconds)

    def power_up(self) -> None:
        # A run still going would write its results over memory after the reset; the
        # simulator always ends, so let it.
        self.registers.join()
        self.registers = SimRegisters(self.config, self.memory, trace=self.trace)

    def error_detail(self) -> Exception | None:
        return self.registers.error

    def close(self) -> None:
        self.registers.join()


class RtlModel:
    """The accelerator's Verilator model; DRAM is the harness's DRAM model."""

    def __init__(self, config: HwConfig, memory_bytes: int, options: dict[str, Any]) -> None:
        try:
            from tessera.hw.harness.rtlsim import RtlSim
        except ImportError as exc:
            raise DeviceError(f"the RTL model needs the hardware tools ({exc.name} is missing): "
                              'pip install -e ".[hw]", or use the simulator') from None
        # Not quiet: a first build takes minutes and says so on stderr.
        self.sim = RtlSim(config, dram_bytes=memory_bytes, **options)
        self._started = False

    def read(self, offset: int) -> int:
        if self._started and not self.sim.interrupt:
            self.sim.run_until_interrupt(POLL_CYCLES)
        return self.sim.read_reg(offset)

    def write(self, offset: int, value: int) -> None:
        self.sim.write_reg(offset, value)
        if offset == REG["CONTROL"] and value & CONTROL_START:
            self._started = True

    def write_memory(self, address: int, data: np.ndarray) -> None:
        self.sim.write_dram(address, data)

    def read_memory(self, address: int, nbytes: int) -> np.ndarray:
        return self.sim.read_dram(address, nbytes)

    def idle(self, seconds: float) -> None:
        """Nothing: the next register read runs the model on."""

    def power_up(self) -> None:
        self.sim.reset(power_on=True)
        self._started = False

    def error_detail(self) -> Exception | None:
        return None

    def close(self) -> None:
        self.sim.close()


MODELS = ("rtl", "sim")


def make_model(kind: str, config: HwConfig, memory_bytes: int, allocator: PageAllocator,
               options: dict[str, Any]) -> SimModel | RtlModel:
    """A model of ``kind`` (``"rtl"`` or ``"sim"``); ``options`` go to ``RtlSim`` for the RTL
    and may hold ``trace`` for the simulator."""
    if kind == "rtl":
        return RtlModel(config, memory_bytes, options)
    if kind == "sim":
        unknown = sorted(set(options) - {"trace"})
        if unknown:
            raise DeviceError(f"options {unknown} are for the RTL model; the simulator takes "
                              "only trace")
        return SimModel(config, memory_bytes, allocator, **options)
    raise DeviceError(f"unknown model {kind!r}: choose one of {', '.join(MODELS)}")
