"""The RTL simulation the tests share (one Verilator build per config, cached on disk)."""
from __future__ import annotations

from functools import lru_cache

from tessera.config import HwConfig
from tessera.isa import Program

#: Simulated DRAM beyond the program's image (stores past it answer SLVERR).
_DRAM_MARGIN = 1 << 16


@lru_cache(maxsize=None)
def rtl_sim(config: HwConfig):
    """A long-lived Verilator model of ``config``'s accelerator (buffers keep their
    contents from run to run, as on a board)."""
    from tessera.hw.rtlsim import RtlSim

    return RtlSim(config)


def rtl_run(program: Program):
    """Run ``program`` on a freshly powered-up model of its config's RTL.

    A fresh model has zeroed buffers, like the simulator: programs may read
    buffer entries they never wrote (the tests do), which on a long-lived
    model would hold the previous program's data.
    """
    from tessera.hw.rtlsim import RtlSim, run_program

    dram = program.dram_image().size + _DRAM_MARGIN
    with RtlSim(program.config, dram_bytes=dram, quiet=True) as sim:
        return run_program(program, sim)
