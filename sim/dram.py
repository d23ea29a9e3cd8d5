"""DRAM ports with latency and bandwidth behind a shared DDR bandwidth limit.

Each module's DMA goes through the port the config assigns it. A transfer
first waits the port latency, then streams as a *flow*: alone, a flow takes
exactly its ``cycles`` (one beat and one SRAM entry per cycle at most, see
:func:`tessera.timing.dma_cost`). Concurrent flows share bandwidth max-min
fairly under two limits: ``bus_bytes`` per cycle on each port and
``ddr_bytes_per_cycle`` for the whole DDR. Times are rounded up to whole
cycles when a flow ends.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.config import HwConfig

from .kernel import Event, Kernel

_EPS = 1e-9


@dataclass(eq=False)
class _Flow:
    port: int
    max_rate: float          # bytes per cycle when alone
    remaining: float         # bytes
    done: Event
    rate: float = 0.0


class DramSystem:
    """The DRAM model all modules' transfers go through."""

    def __init__(self, kernel: Kernel, config: HwConfig) -> None:
        self.kernel = kernel
        self.config = config
        self._flows: list[_Flow] = []
        self._last = 0
        self._generation = 0
        #: Set once any flow ran below its stand-alone rate.
        self.contended = False

    def transfer(self, port: int, cycles: int, nbytes: int) -> Event:
        """Stream ``nbytes`` over ``port``; alone this takes ``cycles``. Triggers when done."""
        done = Event(self.kernel)
        if cycles <= 0:
            return done.succeed()
        self._advance()
        self._flows.append(_Flow(port, nbytes / cycles, float(nbytes), done))
        self._reschedule()
        return done

    def _advance(self) -> None:
        elapsed = self.kernel.now - self._last
        if elapsed:
            for f in self._flows:
                f.remaining -= f.rate * elapsed
        self._last = self.kernel.now

    def _allocate(self) -> None:
        """Max-min fair rates by progressive filling under the port and DDR limits."""
        bus, ddr = float(self.config.bus_bytes), float(self.config.ddr_bytes_per_cycle)
        if len(self._flows) == 1:
            # Alone, one filling step: the same rate as the loop below, computed directly.
            f = self._flows[0]
            f.rate = 0.0 + min(f.max_rate, bus, ddr)
            self.contended |= f.max_rate - f.rate > _EPS
            return
        for f in self._flows:
            f.rate = 0.0
        active = list(self._flows)
        while active:
            port_load: dict[int, float] = {}
            port_count: dict[int, int] = {}
            for f in self._flows:
                port_load[f.port] = port_load.get(f.port, 0.0) + f.rate
            for f in active:
                port_count[f.port] = port_count.get(f.port, 0) + 1
            used = sum(f.rate for f in self._flows)
            delta = min(
                min(f.max_rate - f.rate for f in active),
                min((bus - port_load[p]) / n for p, n in port_count.items()),
                (ddr - used) / len(active),
            )
            for f in active:
                f.rate += delta
            used += delta * len(active)
            saturated_ports = {p for p in port_count
                               if bus - (port_load[p] + delta * port_count[p]) <= _EPS}
            ddr_full = ddr - used <= _EPS
            active = [f for f in active
                      if not (ddr_full or f.port in saturated_ports or f.max_rate - f.rate <= _EPS)]
        if any(f.max_rate - f.rate > _EPS for f in self._flows):
            self.contended = True

    def _reschedule(self) -> None:
        self._allocate()
        self._generation += 1
        if not self._flows:
            return
        gen = self._generation
        end = min(self.kernel.now + f.remaining / f.rate for f in self._flows)
        wake = max(self.kernel.now, math.ceil(end - 1e-6))
        self.kernel.at(wake, self._wake, gen)

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return  # rates changed since this wake-up was planned
        self._advance()
        finished = [f for f in self._flows if f.remaining <= f.rate * 1e-6]
        self._flows = [f for f in self._flows if f not in finished]
        for f in finished:
            f.done.succeed()
        self._reschedule()
