"""The ``sim`` and ``rtl`` backends: a simulated accelerator (:mod:`.models`) as a device.

``sim`` (the default backend) runs the cycle-level simulator; ``rtl`` runs the
Verilator-compiled RTL, through its AXI4-Lite registers and its DRAM model, as a
driver on a board would. Buffers come from a first-fit page allocator that starts
one page in, so no buffer sits at address 0.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tessera.config import HwConfig

from .device import Device
from .memory import PAGE_BYTES, PageAllocator
from .models import DRAM_BYTES, RtlModel, SimModel, make_model

__all__ = ["ModelDevice", "RtlDevice", "SimDevice"]


class ModelDevice(Device):
    """A device over a simulated accelerator of kind ``model`` (``"sim"`` or ``"rtl"``)."""

    def __init__(self, config: HwConfig, model: str, memory_bytes: int,
                 options: dict[str, Any]) -> None:
        super().__init__(config)
        self.allocator = PageAllocator(PAGE_BYTES, memory_bytes - PAGE_BYTES)
        self.model: SimModel | RtlModel = make_model(model, config, memory_bytes,
                                                     self.allocator, options)
        self.model.power_up()
        self.check_identity()

    def _mem_alloc(self, nbytes: int) -> tuple[int, Any]:
        addr = self.allocator.allocate(nbytes)
        return addr, addr

    def _mem_free(self, handle: Any) -> None:
        self.allocator.free(handle)

    def _mem_write(self, handle: Any, offset: int, data: np.ndarray) -> None:
        self.model.write_memory(handle + offset, data)

    def _mem_read(self, handle: Any, offset: int, nbytes: int) -> np.ndarray:
        return self.model.read_memory(handle + offset, nbytes)

    def _reg_read(self, offset: int) -> int:
        return self.model.read(offset)

    def _reg_write(self, offset: int, value: int) -> None:
        self.model.write(offset, value)

    def _idle(self, seconds: float) -> None:
        self.model.idle(seconds)

    def _reset(self) -> None:
        self.model.power_up()

    def _error_detail(self) -> Exception | None:
        return self.model.error_detail()

    def _close(self) -> None:
        self.model.close()


class SimDevice(ModelDevice):
    """The cycle simulator as a device. ``trace=True`` records each run's event trace
    (:attr:`last_result`\\ ``.trace``)."""

    backend = "sim"
    #: The simulator reports a hung program itself (ErrorCode.SIMULATOR): no timeout.
    default_timeout = None

    def __init__(self, config: HwConfig, *, memory_bytes: int = DRAM_BYTES,
                 trace: bool = False) -> None:
        super().__init__(config, "sim", memory_bytes, {"trace": trace})

    @property
    def last_result(self):
        """The simulator's :class:`~tessera.sim.SimResult` of the last run (stats, trace)."""
        return self.model.registers.result

    def _run_stats(self) -> Any:
        result = self.last_result
        return None if result is None else result.stats


class RtlDevice(ModelDevice):
    """The Verilator model of ``config``'s RTL as a device.

    Building the model takes a minute or two the first time per config (cached on
    disk). ``options`` go to :class:`tessera.hw.harness.rtlsim.RtlSim` (``verilog``,
    ``dram_latency``, ``trace``, ...). Opening powers the model up and checks
    CONFIG_ID and VERSION.
    """

    backend = "rtl"
    default_timeout = 600.0

    def __init__(self, config: HwConfig, *, memory_bytes: int = DRAM_BYTES,
                 **options: Any) -> None:
        super().__init__(config, "rtl", memory_bytes, options)
