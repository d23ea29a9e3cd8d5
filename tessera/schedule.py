"""List scheduling of a model's steps on a board: CPU cores and one accelerator.

The executor's runs and the board projections share this: a :class:`Task` is a piece
of work on one resource (``"cpu"``: any core; ``"accelerator"``: the one accelerator)
with the tasks it waits for; :func:`list_schedule` places tasks on the resources in
time, either one at a time in list order (``parallel=False``: the sequential executor)
or as soon as their inputs and a resource of their kind are free (a list scheduler:
among the ready tasks, the earliest frame first, then the longest remaining path to the
end of the frame, HEFT's upward rank). The result is a :class:`ScheduledTask` per task:
its lane (``"CPU 0"``, ``"CPU 1"``, ..., ``"accelerator"``), start and end in seconds,
which the timeline draws.

Core module, plain Python: the compiler's placement and the runtime both use it.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

__all__ = ["ACCELERATOR", "CPU", "ScheduledTask", "Task", "list_schedule", "makespan",
           "upward_ranks"]

CPU = "cpu"
ACCELERATOR = "accelerator"


@dataclass(frozen=True)
class Task:
    """One piece of work: ``seconds`` on a ``resource``, after the tasks ``deps`` (indices
    into the task list, all earlier in it: the list is in a topological order)."""

    name: str
    resource: str                  # CPU or ACCELERATOR
    seconds: float
    deps: tuple[int, ...] = ()
    frame: int = 0
    kind: str = ""                 # what the timeline colours it by: "cpu op", "segment", ...


@dataclass(frozen=True)
class ScheduledTask:
    """A task placed in time on a lane."""

    name: str
    lane: str                      # "CPU k" or "accelerator"
    start: float
    end: float
    kind: str = ""
    frame: int = 0


def upward_ranks(tasks: Sequence[Task]) -> list[float]:
    """Each task's longest path (in seconds, itself included) to a task nothing waits
    for: the list scheduler's priority within a frame."""
    rank = [t.seconds for t in tasks]
    for i in range(len(tasks) - 1, -1, -1):
        for d in tasks[i].deps:
            rank[d] = max(rank[d], tasks[d].seconds + rank[i])
    return rank


def list_schedule(tasks: Sequence[Task], cores: int, *,
                  parallel: bool = True) -> list[ScheduledTask]:
    """Place ``tasks`` on ``cores`` CPU cores and one accelerator (see the module doc).

    ``parallel=False`` runs them one at a time in list order (on core 0 and the
    accelerator), as the sequential executor does.
    """
    if cores < 1:
        raise ValueError(f"cores must be >= 1, not {cores}")
    for i, t in enumerate(tasks):
        if t.resource not in (CPU, ACCELERATOR) or any(not 0 <= d < i for d in t.deps):
            raise ValueError(f"task {i} ({t.name!r}): resource {t.resource!r} or deps "
                             f"{t.deps} invalid (deps must be earlier tasks)")
    if not parallel:
        return _sequential(tasks)
    return _parallel(tasks, cores)


def _sequential(tasks: Sequence[Task]) -> list[ScheduledTask]:
    out, now = [], 0.0
    for t in tasks:
        lane = "CPU 0" if t.resource == CPU else ACCELERATOR
        out.append(ScheduledTask(t.name, lane, now, now + t.seconds, t.kind, t.frame))
        now += t.seconds
    return out


def _parallel(tasks: Sequence[Task], cores: int) -> list[ScheduledTask]:
    """Event-driven list scheduling: at each moment a resource frees or a task becomes
    ready, start the highest-priority ready tasks on the free resources."""
    rank = upward_ranks(tasks)
    waiting = [len(t.deps) for t in tasks]
    readers: list[list[int]] = [[] for _ in tasks]
    for i, t in enumerate(tasks):
        for d in t.deps:
            readers[d].append(i)
    free = {CPU: list(range(cores)), ACCELERATOR: [0]}
    ready = {CPU: [], ACCELERATOR: []}
    for i, t in enumerate(tasks):
        if not t.deps:
            heapq.heappush(ready[t.resource], (t.frame, -rank[i], i))
    running: list[tuple[float, int, int]] = []          # (end, task, unit)
    placed: list[ScheduledTask | None] = [None] * len(tasks)
    now = 0.0
    while any(ready.values()) or running:
        for resource in (ACCELERATOR, CPU):
            while ready[resource] and free[resource]:
                _, _, i = heapq.heappop(ready[resource])
                unit = free[resource].pop(0)
                t = tasks[i]
                lane = f"CPU {unit}" if resource == CPU else ACCELERATOR
                placed[i] = ScheduledTask(t.name, lane, now, now + t.seconds, t.kind, t.frame)
                heapq.heappush(running, (now + t.seconds, i, unit))
        now, i, unit = heapq.heappop(running)
        free[tasks[i].resource].append(unit)
        free[tasks[i].resource].sort()
        for r in readers[i]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready[tasks[r].resource], (tasks[r].frame, -rank[r], r))
    return [p for p in placed if p is not None]


def makespan(schedule: Sequence[ScheduledTask]) -> float:
    """When the last task ends (0 for none)."""
    return max((s.end for s in schedule), default=0.0)
