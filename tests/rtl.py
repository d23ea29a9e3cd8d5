"""The RTL simulation the tests share (one Verilator build per config, cached on disk)."""
from __future__ import annotations

from functools import lru_cache

from tessera.config import HwConfig


@lru_cache(maxsize=None)
def rtl_sim(config: HwConfig):
    """A long-lived Verilator model of ``config``'s accelerator (buffers keep their
    contents from run to run, as on a board)."""
    from tessera.hw.harness.rtlsim import RtlSim

    return RtlSim(config)



def open_backend(backend: str, config: HwConfig):
    """A device of ``backend`` for the one-test-many-backends suites: ``sim``, ``rtl``, or
    ``pynq`` -- the simulated PYNQ board (the real pynq API) driving the Verilator model."""
    if backend == "pynq":
        from tessera.runtime.pynq_sim import open_simulated_pynq

        return open_simulated_pynq(config, model="rtl")
    from tessera.runtime import open_device

    return open_device(backend, config)
