"""What a model run measured: :class:`Profile`, one :class:`LayerProfile` per layer.

Accelerator layers come from the segment's run: on the ``sim`` backend the event trace
gives each operator's cycles (from the end of the previous operator's last instruction
to the end of its own, so the layers of a segment add up to the segment's cycles); on
``rtl`` and ``pynq`` only the segment total is measured. The DRAM bytes and GEMM
operations of a layer are counted from its instructions. CPU layers are timed on the
host.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tessera.config import HwConfig
from tessera.errors import TimelineError
from tessera.isa import Gemm, Load, Program, Store
from tessera.schedule import ScheduledTask

from .plan import BoardProjection

__all__ = ["LayerProfile", "Profile", "StreamResult", "frame_spans", "layer_profiles",
           "throughput"]


@dataclass
class LayerProfile:
    """One layer of a run."""

    name: str
    kind: str
    placement: str                  # "accelerator", "cpu" or "view"
    step: str                       # the segment or CPU step that ran it
    seconds: float
    cycles: int | None = None       # accelerator cycles (None where not measured)
    gemm_ops: int = 0
    dram_bytes: int = 0
    macs: int = 0
    bound_cycles: float | None = None
    bound_by: str = ""

    @property
    def utilisation(self) -> float | None:
        """GEMM operations per cycle (1.0 = the GEMM core busy every cycle)."""
        return self.gemm_ops / self.cycles if self.cycles else None


@dataclass
class Profile:
    """A model run: its layers, the accelerator's totals and the wall time."""

    backend: str
    config: HwConfig
    layers: list[LayerProfile] = field(default_factory=list)
    accel_cycles: int = 0
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    #: The simulator's trace of each segment (``sim`` backend), with its layer spans.
    traces: list[tuple[str, list, list[tuple[str, int, int]]]] = field(default_factory=list)
    #: Each accelerator step's run at the config's clock, by step index.
    segment_seconds: dict[int, float] = field(default_factory=dict)
    #: The run projected onto the board's CPU and accelerator (host model, schedule).
    board: BoardProjection | None = None
    #: The steps as they ran here (wall-clock seconds from the start, lanes).
    measured: list[ScheduledTask] = field(default_factory=list)

    @property
    def accel_seconds(self) -> float:
        """Accelerator time at the config's clock."""
        return self.config.cycles_to_seconds(self.accel_cycles)

    @property
    def latency_seconds(self) -> float:
        """Projected latency on the board (:attr:`board`'s schedule: the board CPU's
        modelled kernels, the accelerator, launches and transfers); without a projection,
        the accelerator time plus the CPU layers' time measured here."""
        if self.board is not None:
            return self.board.latency_seconds
        return self.accel_seconds + self.cpu_seconds

    @property
    def gemm_utilisation(self) -> float:
        ops = sum(x.gemm_ops for x in self.layers)
        return ops / self.accel_cycles if self.accel_cycles else 0.0

    def table(self) -> str:
        """The per-layer table ``tessera profile`` prints: a row per layer under headers
        with their units, the totals, and a legend of the columns."""
        mhz = self.config.clock_mhz
        rows = [_layer_row(x) for x in self.layers]
        lines = _aligned(_COLUMNS, rows)
        lines.append(f"accelerator: {self.accel_cycles:,} cycles = {self.accel_seconds * 1e3:.2f} "
                     f"ms at {mhz:g} MHz, GEMM utilisation {self.gemm_utilisation:.1%}")
        lines += self._board_lines()
        lines.append(f"measured here ({self.backend}): CPU layers {self.cpu_seconds * 1e3:.2f} "
                     f"ms, wall time {self.wall_seconds:.2f} s")
        return "\n".join(lines + ["", *_LEGEND])

    def _board_lines(self) -> list[str]:
        b = self.board
        if b is None:
            return []
        mode = "in parallel" if b.parallel else "one step at a time"
        return [f"projected on the board (host model {b.host!r}: {b.cpu}):",
                f"  accelerator {b.accel_seconds * 1e3:.3f} ms + board CPU "
                f"{b.cpu_seconds * 1e3:.3f} ms + launch/transfer {b.overhead_seconds * 1e3:.3f}"
                f" ms = {b.sequential_seconds * 1e3:.3f} ms",
                f"  projected latency {b.latency_seconds * 1e3:.3f} ms ({mode})"]

    def to_dict(self) -> dict[str, Any]:
        layers = [{**asdict(x), "utilisation": x.utilisation} for x in self.layers]
        return {"backend": self.backend, "config": self.config.name, "layers": layers,
                "accel_cycles": self.accel_cycles, "accel_seconds": self.accel_seconds,
                "cpu_seconds": self.cpu_seconds, "latency_seconds": self.latency_seconds,
                "board": None if self.board is None else self.board.to_dict(),
                "gemm_utilisation": self.gemm_utilisation, "wall_seconds": self.wall_seconds}

    def _board(self) -> BoardProjection:
        if self.board is None:
            raise TimelineError("this profile has no board projection (it was not made by "
                                "Model.run or Model.stream)")
        return self.board

    def write_board_timeline(self, path: str | Path, *, width: int | None = None) -> Path:
        """A PNG of the run projected onto the board: a lane per CPU core and the
        accelerator, CPU ops, segments and transfers, frames shaded apart (``width`` in
        pixels; None sizes it to the tasks)."""
        from .schedule_timeline import render_schedule_png
        b = self._board()
        mode = "parallel" if b.parallel else "sequential"
        title = (f"{self.config.name} on {b.cpu} ({b.host}), {mode}: "
                 f"{b.latency_seconds * 1e3:.3f} ms" + (f", {b.frames} frames"
                                                        if b.frames > 1 else ""))
        return render_schedule_png(b.schedule, path, title=title, cores=b.cores, width=width)

    def write_board_perfetto(self, path: str | Path) -> Path:
        """The board schedule as a Perfetto / Chrome trace (JSON)."""
        from .schedule_timeline import write_schedule_perfetto
        b = self._board()
        return write_schedule_perfetto(b.schedule, path, cores=b.cores)

    def _merged_trace(self):
        """All segments' events and spans on one cycle axis (segments back to back)."""
        from tessera.sim import TraceEvent
        if not self.traces:
            raise TimelineError(f"no trace of this {self.backend} run: the timeline and the "
                                "Perfetto trace come from the sim backend")
        events, spans, offset = [], [], 0
        for _, evs, sp in self.traces:
            events += [TraceEvent(e.module, e.name, e.index, e.start + offset, e.end + offset,
                                  e.unit) for e in evs]
            spans += [(n, a + offset, b + offset) for n, a, b in sp]
            offset = max([offset] + [e.end for e in events])
        return events, spans

    def write_timeline(self, path: str | Path) -> Path:
        """A PNG of the load/compute/store queues over time, with the layers on top."""
        from .timeline import render_timeline_png
        events, spans = self._merged_trace()
        return render_timeline_png(events, path, spans=spans,
                                   title=f"{self.config.name}: {self.accel_cycles:,} cycles")

    def write_perfetto(self, path: str | Path) -> Path:
        """A Perfetto / Chrome trace (JSON) of the run, with a track of layers."""
        from .timeline import write_perfetto_trace
        events, spans = self._merged_trace()
        return write_perfetto_trace(events, self.config, path, spans=spans)


#: The profile table's columns: (header, right-aligned).
_COLUMNS = (("layer", False), ("kind", False), ("runs on", False), ("cycles", True),
            ("time (ms)", True), ("GEMM use (%)", True), ("DRAM (KiB)", True),
            ("bound (cycles)", True), ("bound by", False), ("cycles / bound", True))
_LEGEND = (
    "time: accelerator layers at the config's clock, CPU layers as timed on this host",
    "GEMM use: GEMM operations per cycle of the layer (100% = the GEMM core busy every "
    "cycle)",
    "DRAM: bytes the layer's loads and stores move",
    "bound: the layer's fewest cycles by the roofline, set by the compute or the DRAM "
    "(bound by)",
    "cycles / bound: how far above its bound the layer ran (1.00 = at the roofline)",
    "-: not measured, or not applicable to the layer")


def _layer_row(x: LayerProfile) -> tuple[str, ...]:
    """The profile table's cells of one layer."""
    device = {"accelerator": "accelerator", "cpu": "CPU", "view": "view"}[x.placement]
    return (x.name, x.kind, device,
            f"{x.cycles:,}" if x.cycles is not None else "-",
            f"{x.seconds * 1e3:.3f}",
            f"{x.utilisation:.0%}".rstrip("%") if x.utilisation is not None and x.gemm_ops
            else "-",
            f"{x.dram_bytes / 1024:,.0f}" if x.dram_bytes else "-",
            f"{x.bound_cycles:,.0f}" if x.bound_cycles else "-",
            x.bound_by or "-",
            f"{x.cycles / x.bound_cycles:.2f}" if x.cycles and x.bound_cycles else "-")


def _aligned(columns: Sequence[tuple[str, bool]], rows: Sequence[Sequence[str]]) -> list[str]:
    """Header, rule, rows and rule of a text table, each column as wide as its widest
    cell (nothing cut off)."""
    widths = [max([len(head), *(len(r[i]) for r in rows)]) for i, (head, _) in
              enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if right else c.ljust(w)
                         for c, w, (_, right) in zip(cells, widths, columns)).rstrip()
    head = line([h for h, _ in columns])
    rule = "-" * len(head)
    return [head, rule, *map(line, rows), rule]


def frame_spans(schedule: Sequence[ScheduledTask]) -> list[tuple[float, float]]:
    """``(start, end)`` of each frame in a schedule: its first task's start, its last
    task's end."""
    spans: dict[int, tuple[float, float]] = {}
    for t in schedule:
        a, b = spans.get(t.frame, (t.start, t.end))
        spans[t.frame] = (min(a, t.start), max(b, t.end))
    return [spans[f] for f in sorted(spans)]


def throughput(schedule: Sequence[ScheduledTask]) -> float:
    """Frames per second in the steady state: frames after the first over the time from
    the first frame's end to the last's (one frame: 1 / its latency)."""
    spans = frame_spans(schedule)
    if len(spans) == 1:
        return 1.0 / max(spans[0][1] - spans[0][0], 1e-12)
    return (len(spans) - 1) / max(spans[-1][1] - spans[0][1], 1e-12)


@dataclass
class StreamResult:
    """A stream of frames: each frame's outputs, and the profile of the whole run
    (:attr:`Profile.board`: the frames scheduled on the board; :attr:`Profile.measured`:
    as they ran here)."""

    outputs: list[dict[str, np.ndarray]]
    profile: Profile

    @property
    def fps(self) -> float:
        """Projected frames per second on the board (steady state)."""
        return throughput(self.profile.board.schedule)

    @property
    def frame_latencies(self) -> list[float]:
        """Projected latency of each frame on the board (seconds)."""
        return [b - a for a, b in frame_spans(self.profile.board.schedule)]

    @property
    def measured_fps(self) -> float:
        """Frames per second measured on the backend used (steady state)."""
        return throughput(self.profile.measured)

    def table(self) -> str:
        """What ``tessera stream`` prints."""
        b = self.profile.board
        lat = self.frame_latencies
        mode = "pipelined" if b.parallel else "one frame at a time"
        return "\n".join([
            f"{len(self.outputs)} frames, {mode}, projected on the board (host model "
            f"{b.host!r}: {b.cpu}):",
            f"  throughput {self.fps:.2f} frames/s; frame latency {min(lat) * 1e3:.3f}-"
            f"{max(lat) * 1e3:.3f} ms",
            f"  per frame: accelerator {b.accel_seconds / b.frames * 1e3:.3f} ms, board CPU "
            f"{b.cpu_seconds / b.frames * 1e3:.3f} ms, launch/transfer "
            f"{b.overhead_seconds / b.frames * 1e3:.3f} ms",
            f"measured here ({self.profile.backend}): {self.measured_fps:.2f} frames/s, wall "
            f"time {self.profile.wall_seconds:.2f} s"])


def layer_profiles(program: Program, bounds: Sequence[tuple[str, int, int]],
                   trace: Sequence | None, total_cycles: int
                   ) -> list[tuple[str, int | None, int, int, tuple[int, int] | None]]:
    """Per operator ``(name, cycles, gemm_ops, dram_bytes, span)`` of one segment run.

    With a ``trace``, an operator's cycles run from the end of the previous operator's
    last instruction to the end of its own (the segment total is their sum); without
    one, a single operator gets the total and several get ``None``. An operator without
    instructions of its own (a max pool run in its convolution's tiles) gets ``None``.
    """
    isa = program.isa
    insns = program.instructions
    ends = np.zeros(len(insns), dtype=np.int64)
    if trace:
        for e in trace:
            if e.index < len(ends) and e.end > ends[e.index]:
                ends[e.index] = e.end
    rows = []
    previous = 0
    # the last operator with instructions takes the tail (FINISH) of the run
    last = max((k for k, (_, first, end) in enumerate(bounds) if end > first), default=-1)
    for k, (name, first, end) in enumerate(bounds):
        gemm = dram = 0
        for insn in insns[first:end]:
            if isinstance(insn, Gemm):
                gemm += insn.op_count
            elif isinstance(insn, (Load, Store)):
                dram += insn.y_size * insn.x_size * isa.elem_bytes(insn.mem)
        if end == first and len(bounds) > 1:
            cycles, span = None, None
        elif trace:
            done = int(ends[first:end].max()) if end > first else previous
            if k == last:
                done = max(done, total_cycles)
            cycles, span = max(0, done - previous), (previous, done)
            previous = max(previous, done)
        else:
            cycles, span = (total_cycles if len(bounds) == 1 else None), None
        rows.append((name, cycles, gemm, dram, span))
    return rows
