"""Statistics and event traces of a simulation run."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tessera.config import MODULES, HwConfig


@dataclass
class ModuleStats:
    """Cycles of one module by what it was doing. ``idle`` is waiting for a command."""

    busy: int = 0
    wait_token: int = 0
    wait_dram: int = 0
    wait_queue: int = 0
    instructions: int = 0

    def idle(self, total: int) -> int:
        return total - self.busy - self.wait_token - self.wait_dram - self.wait_queue


@dataclass
class TraceEvent:
    module: str
    name: str
    index: int
    start: int
    end: int
    #: The compute unit ("gemm", "alu") of a GEMM or ALU instruction, else "".
    unit: str = ""

    @property
    def track(self) -> str:
        return f"{self.module}.{self.unit}" if self.unit else self.module


@dataclass
class SimStats:
    """Everything a run measured."""

    config: HwConfig
    cycles: int = 0
    modules: dict[str, ModuleStats] = field(default_factory=lambda: {m: ModuleStats() for m in MODULES})
    dram_read_bytes: dict[str, int] = field(default_factory=dict)
    dram_write_bytes: dict[str, int] = field(default_factory=dict)
    gemm_ops: int = 0
    gemm_resets: int = 0
    alu_ops: int = 0
    leftover_tokens: dict[str, int] = field(default_factory=dict)
    #: Cycles each compute unit ("gemm", "alu") ran an instruction; with ``overlap``
    #: they add up to more than the compute module's busy cycles.
    unit_busy: dict[str, int] = field(default_factory=dict)
    #: Whether concurrent DRAM transfers ever had to share bandwidth (then the
    #: RTL's per-beat arbitration may differ from the simulator by a few cycles).
    dram_contended: bool = False

    @property
    def gemm_utilisation(self) -> float:
        """GEMM ops (one per cycle at peak) over total cycles."""
        return self.gemm_ops / self.cycles if self.cycles else 0.0

    @property
    def seconds(self) -> float:
        return self.config.cycles_to_seconds(self.cycles)

    @property
    def macs(self) -> int:
        return self.gemm_ops * self.config.peak_macs_per_cycle

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.name, "cycles": self.cycles, "seconds": self.seconds,
            "gemm_ops": self.gemm_ops, "gemm_resets": self.gemm_resets, "alu_ops": self.alu_ops,
            "gemm_utilisation": self.gemm_utilisation,
            "modules": {m: dict(asdict(s), idle=s.idle(self.cycles)) for m, s in self.modules.items()},
            "dram_read_bytes": self.dram_read_bytes, "dram_write_bytes": self.dram_write_bytes,
            "leftover_tokens": self.leftover_tokens, "dram_contended": self.dram_contended,
            "unit_busy": self.unit_busy,
        }

    def table(self) -> str:
        """A human-readable report."""
        c = self.config
        lines = [
            f"cycles            {self.cycles:,}  ({self.seconds * 1e3:.3f} ms at {c.clock_mhz:g} MHz)",
            f"GEMM ops          {self.gemm_ops:,}  (+{self.gemm_resets:,} resets)  "
            f"utilisation {100 * self.gemm_utilisation:.1f}%  "
            f"({2 * self.macs / self.seconds / 1e9 if self.cycles else 0:.2f} of {c.peak_gops:.1f} GOPS)",
            f"ALU ops           {self.alu_ops:,}",
            "compute units     " + (", ".join(f"{u} busy {c:,}" for u, c in self.unit_busy.items())
                                    or "-"),
            "",
            f"{'module':<9}{'insns':>7}{'busy':>11}{'wait token':>12}{'wait DRAM':>11}"
            f"{'wait queue':>12}{'idle':>11}",
        ]
        for m, s in self.modules.items():
            lines.append(f"{m:<9}{s.instructions:>7}{s.busy:>11,}{s.wait_token:>12,}"
                         f"{s.wait_dram:>11,}{s.wait_queue:>12,}{s.idle(self.cycles):>11,}")
        lines.append("")
        kinds = sorted(set(self.dram_read_bytes) | set(self.dram_write_bytes))
        lines.append("DRAM bytes        " + ", ".join(
            f"{k} {self.dram_read_bytes.get(k, 0):,} read" if k not in self.dram_write_bytes
            else f"{k} {self.dram_write_bytes[k]:,} written" for k in kinds))
        return "\n".join(lines)


def chrome_trace(events: list[TraceEvent], config: HwConfig) -> dict[str, Any]:
    """Events as Chrome/Perfetto trace JSON (timestamps in microseconds at the config clock)."""
    us = 1.0 / config.clock_mhz
    tracks = list(MODULES) + sorted({e.track for e in events} - set(MODULES))
    tids = {m: i for i, m in enumerate(tracks)}
    out: list[dict[str, Any]] = [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": m}}
        for m, tid in tids.items()]
    for e in events:
        out.append({"name": e.name, "ph": "X", "pid": 0, "tid": tids[e.track],
                    "ts": e.start * us, "dur": (e.end - e.start) * us,
                    "args": {"index": e.index, "start_cycle": e.start, "end_cycle": e.end}})
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"config": config.name, "clock_mhz": config.clock_mhz}}


def write_chrome_trace(events: list[TraceEvent], config: HwConfig, path: str | Path) -> None:
    Path(path).write_text(json.dumps(chrome_trace(events, config)))
