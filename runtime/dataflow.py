"""Running units of work with inter-operator parallelism: CPU units on a pool of
``cores`` threads, accelerator units on one thread of their own, each unit started once
the units it waits for are done.

Why no unit can race another on a buffer, by construction:

* every tensor is written by exactly one step (:func:`.plan.producers` checks it) into
  an array the step allocates (CPU kernels return fresh outputs; a segment's outputs are
  copies read back from its device buffer), and no step writes an array it reads;
* a unit is submitted only after every unit writing its inputs has completed: the
  completion is observed here, on the submitting thread, through the future, which
  orders the writer's stores before the reader's loads;
* the device buffers are touched only by the accelerator thread, one segment at a time,
  and each segment has a buffer of its own; its next frame waits for its previous one
  (:func:`.plan.frame_units`), so a buffer is never rewritten while its results are
  being read back.

So a CPU kernel and a segment can only share host arrays that both read, and CPU
kernels running at once write disjoint, fresh arrays.
"""
from __future__ import annotations

import heapq
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tessera.schedule import ACCELERATOR, CPU

from .plan import Unit

__all__ = ["UnitRun", "run_units"]


@dataclass(frozen=True)
class UnitRun:
    """When a unit ran (seconds from the start) and on which lane."""

    start: float
    end: float
    lane: str
    result: Any


def run_units(units: Sequence[Unit], resource: Callable[[Unit], str],
              run: Callable[[Unit], Any], *, cores: int = 1,
              parallel: bool = True, before: Callable[[Unit], None] | None = None
              ) -> list[UnitRun]:
    """Run every unit (``run(unit)``) respecting ``deps``; returns a :class:`UnitRun`
    per unit, in the units' order.

    ``parallel=False`` runs them in order on the calling thread. Otherwise CPU units run
    on ``cores`` threads and ACCELERATOR units on one thread; among ready units the
    earliest frame, then the earliest step, goes first. ``before(unit)`` is called on
    the submitting thread just before a unit is started (e.g. to hand it the recurrent
    state of the previous frame). The first exception a unit raises is raised here, once
    the running units have finished; nothing new starts after it.
    """
    start = time.perf_counter()
    if not parallel:
        return [_timed(run, before, u, start, "CPU 0" if resource(u) == CPU
                       else ACCELERATOR) for u in units]
    return _Scheduler(units, resource, run, cores, before, start).run()


def _timed(run, before, unit: Unit, start: float, lane: str) -> UnitRun:
    if before is not None:
        before(unit)
    t0 = time.perf_counter() - start
    result = run(unit)
    return UnitRun(t0, time.perf_counter() - start, lane, result)


class _Scheduler:
    """The submit/complete loop of :func:`run_units` (one instance per call)."""

    def __init__(self, units, resource, run, cores: int, before, start: float) -> None:
        self.units, self.resource, self.fn = units, resource, run
        self.cores, self.before, self.start = cores, before, start
        self.waiting = [len(u.deps) for u in units]
        self.readers: list[list[int]] = [[] for _ in units]
        for i, u in enumerate(units):
            for d in u.deps:
                self.readers[d].append(i)
        self.ready = {CPU: [], ACCELERATOR: []}
        self.busy = {CPU: 0, ACCELERATOR: 0}
        self.limit = {CPU: cores, ACCELERATOR: 1}
        self.runs: list[UnitRun | None] = [None] * len(units)
        self.lanes = threading.local()
        self.lane_count = 0
        self.lane_lock = threading.Lock()

    def run(self) -> list[UnitRun]:
        for i, u in enumerate(self.units):
            if not u.deps:
                self._make_ready(i)
        pools = {CPU: ThreadPoolExecutor(self.cores, thread_name_prefix="tessera-cpu"),
                 ACCELERATOR: ThreadPoolExecutor(1, thread_name_prefix="tessera-accel")}
        running: dict[Future, int] = {}
        error: BaseException | None = None
        try:
            while running or (error is None and any(self.ready.values())):
                if error is None:
                    self._submit_ready(pools, running)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = running.pop(fut)
                    self.busy[self.resource(self.units[i])] -= 1
                    if fut.exception() is not None:
                        error = error or fut.exception()
                        continue
                    self.runs[i] = fut.result()
                    for r in self.readers[i]:
                        self.waiting[r] -= 1
                        if self.waiting[r] == 0:
                            self._make_ready(r)
        finally:
            for pool in pools.values():
                pool.shutdown(wait=True)
        if error is not None:
            raise error
        return [r for r in self.runs if r is not None]

    def _make_ready(self, i: int) -> None:
        u = self.units[i]
        heapq.heappush(self.ready[self.resource(u)], (u.frame, u.step, i))

    def _submit_ready(self, pools, running: dict) -> None:
        for kind in (ACCELERATOR, CPU):
            while self.ready[kind] and self.busy[kind] < self.limit[kind]:
                _, _, i = heapq.heappop(self.ready[kind])
                if self.before is not None:
                    self.before(self.units[i])
                self.busy[kind] += 1
                running[pools[kind].submit(self._call, i, kind)] = i

    def _call(self, i: int, kind: str) -> UnitRun:
        t0 = time.perf_counter() - self.start
        result = self.fn(self.units[i])
        return UnitRun(t0, time.perf_counter() - self.start, self._lane(kind), result)

    def _lane(self, kind: str) -> str:
        """The calling pool thread's lane name ("CPU k" numbered by first use)."""
        if kind == ACCELERATOR:
            return ACCELERATOR
        if not hasattr(self.lanes, "name"):
            with self.lane_lock:
                self.lanes.name = f"CPU {self.lane_count}"
                self.lane_count += 1
        return self.lanes.name
