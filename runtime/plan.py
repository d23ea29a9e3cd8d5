"""The dependency graph of a compiled model's steps over one or more frames, and its
projection onto a board.

:func:`frame_units` unrolls the steps over ``frames`` inputs: a :class:`Unit` is one
step of one frame with the units it waits for. Inside a frame a step waits for the
steps writing its inputs. Across frames, a recurrent state input (e.g. an LSTM's
``h``) waits for the step writing the output carried into it (``h_out`` of the
previous frame), and every step waits for its own run on the previous frame: each
step takes the frames in order, so step k of frame f runs beside step k+1 of frame
f-1 (a software pipeline whose depth bounds the frames in flight), and an accelerator
segment never rewrites its one device buffer while the previous frame's results are
being read from it.

The executor runs these units (in order, or on a pool: :mod:`.dataflow`);
:func:`board_tasks` turns them into :class:`tessera.schedule.Task` s priced for a
board (the CPU steps by the host model, a segment as its host-side launch and input
transfer, its accelerator run, its output transfer) for
:func:`tessera.schedule.list_schedule`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tessera.compiler.model import AccelStep, CompiledModel
from tessera.errors import RunError
from tessera.hostmodel import HostModel, Work
from tessera.schedule import ACCELERATOR, CPU, ScheduledTask, Task, list_schedule, makespan

__all__ = ["BoardProjection", "Unit", "board_tasks", "frame_units", "node_of", "producers",
           "project_board"]


@dataclass(frozen=True)
class Unit:
    """Step ``step`` of frame ``frame``, after the units ``deps`` (indices, all earlier)."""

    step: int
    frame: int
    deps: tuple[int, ...]


def node_of(step_name: str) -> str:
    """The graph node a CPU step comes from (extra steps are named ``node:suffix``)."""
    return step_name.split(":")[0]


def producers(compiled: CompiledModel) -> dict[str, int]:
    """Tensor name -> index of the step writing it. Every tensor is written by one step
    (the executor's race freedom rests on it), so a second writer is a RunError."""
    writer: dict[str, int] = {}
    for k, step in enumerate(compiled.steps):
        for name in step.outputs:
            if name in writer:
                raise RunError(f"tensor {name!r} is written by steps {writer[name]} and {k}; "
                               "recompile the model")
            writer[name] = k
    return writer


def frame_units(compiled: CompiledModel, frames: int = 1,
                state: Mapping[str, str] | None = None, in_flight: int = 2) -> list[Unit]:
    """The steps of ``frames`` frames as units in a topological order (frame by frame).

    ``state`` maps a recurrent state input to the output carried into it from the
    previous frame. At most ``in_flight`` frames are in the pipeline at once: a frame's
    first steps wait for the frame ``in_flight`` before it to finish (two: the CNN of
    frame f+1 beside the RNN of frame f, as a double-buffered stream runs).
    """
    writer = producers(compiled)
    state = dict(state or {})
    per_frame = len(compiled.steps)
    local = [sorted({writer[t] for t in step.inputs if t in writer})
             for step in compiled.steps]
    read = {d for deps in local for d in deps}
    sinks = [k for k in range(per_frame) if k not in read]
    units: list[Unit] = []
    for f in range(frames):
        base = f * per_frame
        for k, step in enumerate(compiled.steps):
            deps = {base + d for d in local[k]}
            if f > 0:
                deps |= {base - per_frame + writer[state[t]] for t in step.inputs
                         if t in state}
                deps.add(base - per_frame + k)
            if f >= in_flight and not local[k]:
                deps |= {base - in_flight * per_frame + s for s in sinks}
            units.append(Unit(k, f, tuple(sorted(deps))))
    return units


def board_tasks(compiled: CompiledModel, units: Sequence[Unit], host: HostModel,
                segment_seconds: Mapping[int, float]) -> list[Task]:
    """The units as board tasks: a CPU step takes its node's modelled time (shared by the
    node's steps; a view takes none); a segment is three tasks: launch and input transfer
    on a core, the run on the accelerator (``segment_seconds[step]``: measured, or the
    roofline when not run), output transfer on a core."""
    node_seconds = _node_seconds(compiled, host)
    steps_of_node: dict[str, int] = {}
    for step in compiled.steps:
        steps_of_node[node_of(step.name)] = steps_of_node.get(node_of(step.name), 0) + 1
    tasks: list[Task] = []
    last: list[int] = []                 # unit index -> its last task
    for unit in units:
        step = compiled.steps[unit.step]
        deps = tuple(last[d] for d in unit.deps)
        if isinstance(step, AccelStep):
            tasks += _segment_tasks(step, unit, deps, len(tasks), host,
                                    segment_seconds[unit.step])
        else:
            node = node_of(step.name)
            seconds = node_seconds.get(node, 0.0) / steps_of_node[node]
            kind = "view" if step.kernel is None else "cpu op"
            tasks.append(Task(step.name, CPU, seconds, deps, unit.frame, kind))
        last.append(len(tasks) - 1)
    return tasks


def _segment_tasks(step: AccelStep, unit: Unit, deps: tuple[int, ...], first: int,
                   host: HostModel, run_seconds: float) -> list[Task]:
    # A segment's inputs and outputs are int8 images: one byte per element.
    moved_in = sum(int(np.prod(step.shapes[t])) for t in step.inputs)
    moved_out = sum(int(np.prod(step.shapes[t])) for t in step.outputs)
    return [Task(f"{step.name} launch+in", CPU,
                 host.launch_seconds + host.transfer_seconds(moved_in), deps, unit.frame,
                 "transfer"),
            Task(step.name, ACCELERATOR, run_seconds, (first,), unit.frame, "segment"),
            Task(f"{step.name} out", CPU, host.transfer_seconds(moved_out), (first + 1,),
                 unit.frame, "transfer")]


def _node_seconds(compiled: CompiledModel, host: HostModel) -> dict[str, float]:
    """Each CPU-placed node's modelled time on ``host`` (from its recorded work)."""
    seconds = {}
    for p in compiled.placements:
        if p.target == "cpu":
            work = getattr(p, "work", None)
            if work is None:
                raise RunError(f"node {p.node!r} has no recorded work to price on host "
                               f"model {host.name!r}; recompile the model")
            seconds[p.node] = host.kernel_seconds(work if isinstance(work, Work)
                                                  else Work.from_dict(work))
    return seconds


@dataclass
class BoardProjection:
    """A run projected onto the board: the board CPU's modelled kernel time, the
    accelerator's time (the simulator's cycles at the config's clock), the host's launch
    and transfer overhead, and the schedule of them on the CPU cores and the accelerator
    (sequential, or list-scheduled when the run was parallel or pipelined)."""

    host: str                       # the host model's name
    cpu: str                        # and its CPU
    accel_seconds: float
    cpu_seconds: float
    overhead_seconds: float
    schedule: list[ScheduledTask]
    parallel: bool
    frames: int = 1
    cores: int = 1                  # the host's cores (lanes of the schedule)

    @property
    def sequential_seconds(self) -> float:
        """Everything one after the other: accelerator + CPU + overhead."""
        return self.accel_seconds + self.cpu_seconds + self.overhead_seconds

    @property
    def latency_seconds(self) -> float:
        """The schedule's length (the sequential sum unless it ran in parallel)."""
        return makespan(self.schedule)

    def to_dict(self) -> dict:
        return {"host": self.host, "cpu": self.cpu, "accel_seconds": self.accel_seconds,
                "cpu_seconds": self.cpu_seconds, "overhead_seconds": self.overhead_seconds,
                "sequential_seconds": self.sequential_seconds,
                "latency_seconds": self.latency_seconds, "parallel": self.parallel,
                "frames": self.frames}


def project_board(compiled: CompiledModel, units: Sequence[Unit], host: HostModel,
                  segment_seconds: Mapping[int, float], parallel: bool) -> BoardProjection:
    """Price ``units`` for ``host`` and schedule them (see :class:`BoardProjection`)."""
    tasks = board_tasks(compiled, units, host, segment_seconds)
    schedule = list_schedule(tasks, host.cores, parallel=parallel)
    total = {kind: sum(t.seconds for t in tasks if t.kind == kind)
             for kind in ("segment", "transfer")}
    cpu = sum(t.seconds for t in tasks if t.resource == CPU and t.kind != "transfer")
    return BoardProjection(host.name, host.cpu, total["segment"], cpu, total["transfer"],
                           schedule, parallel, 1 + max((u.frame for u in units), default=0),
                           host.cores)
