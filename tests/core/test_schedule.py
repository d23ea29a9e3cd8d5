"""The list scheduler every board projection uses (tessera.schedule)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.schedule import ACCELERATOR, CPU, Task, list_schedule, makespan, upward_ranks


@st.composite
def task_graphs(draw):
    n = draw(st.integers(1, 14))
    tasks = []
    for i in range(n):
        deps = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else ()
        tasks.append(Task(f"t{i}", draw(st.sampled_from([CPU, ACCELERATOR])),
                          draw(st.integers(0, 20)) / 4, deps, draw(st.integers(0, 2))))
    return tasks


def _check_schedule(tasks, schedule, cores):
    assert [s.name for s in schedule] == [t.name for t in tasks]
    for t, s in zip(tasks, schedule):
        assert s.end - s.start == pytest.approx(t.seconds)
        assert all(schedule[d].end <= s.start + 1e-12 for d in t.deps)
        assert (s.lane == ACCELERATOR) == (t.resource == ACCELERATOR)
    lanes = {s.lane for s in schedule}
    assert lanes <= {ACCELERATOR, *(f"CPU {k}" for k in range(cores))}
    for lane in lanes:      # a lane runs one task at a time
        spans = sorted((s.start, s.end) for s in schedule if s.lane == lane and s.end > s.start)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))


@given(task_graphs(), st.integers(1, 4))
@settings(max_examples=150, deadline=None)
def test_list_schedules_respect_dependencies_and_resources(tasks, cores) -> None:
    sequential = list_schedule(tasks, cores, parallel=False)
    parallel = list_schedule(tasks, cores)
    _check_schedule(tasks, sequential, 1)
    _check_schedule(tasks, parallel, cores)
    total = sum(t.seconds for t in tasks)
    assert makespan(sequential) == pytest.approx(total)
    # A resource idles only while nothing of its kind is ready: never longer than in turn.
    assert makespan(parallel) <= total + 1e-9


def test_independent_cpu_and_accelerator_work_overlaps() -> None:
    tasks = [Task("in", CPU, 1.0), Task("conv", ACCELERATOR, 4.0, (0,)),
             Task("branch", CPU, 3.0, (0,)), Task("join", CPU, 1.0, (1, 2))]
    assert makespan(list_schedule(tasks, 1, parallel=False)) == 9.0
    schedule = list_schedule(tasks, 1)
    assert makespan(schedule) == 6.0
    assert schedule[2].start == 1.0 and schedule[2].lane == "CPU 0"


def test_cores_bound_parallel_cpu_work() -> None:
    tasks = [Task(f"k{i}", CPU, 1.0) for i in range(4)]
    assert makespan(list_schedule(tasks, 2)) == 2.0
    assert makespan(list_schedule(tasks, 4)) == 1.0


def test_earlier_frames_and_longer_paths_go_first() -> None:
    tasks = [Task("short", CPU, 1.0, frame=0), Task("long", CPU, 1.0, frame=0),
             Task("tail", CPU, 5.0, (1,), frame=0), Task("later", CPU, 9.0, frame=1)]
    assert upward_ranks(tasks) == [1.0, 6.0, 5.0, 9.0]
    schedule = list_schedule(tasks, 1)
    assert [s.name for s in sorted(schedule, key=lambda s: s.start)] == [
        "long", "tail", "short", "later"]


def test_malformed_task_lists_are_refused() -> None:
    with pytest.raises(ValueError, match="deps must be earlier"):
        list_schedule([Task("a", CPU, 1.0, (0,))], 1)
    with pytest.raises(ValueError, match="resource"):
        list_schedule([Task("a", "gpu", 1.0)], 1)
    with pytest.raises(ValueError, match="cores"):
        list_schedule([], 0)
