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

