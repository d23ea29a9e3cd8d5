"""Stage lines (tessera.progress.StageLines): one line per stage with the elapsed time,
shown off a terminal too, hidden by TESSERA_PROGRESS=0. A fake clock keeps the times
exact."""
from __future__ import annotations

import io

import pytest

from tessera import progress
from tessera.progress import StageLines


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress, "_clock", lambda: now[0])
    return now


def test_each_stage_is_a_line_with_the_elapsed_time(clock, monkeypatch):
    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    out = io.StringIO()                       # not a terminal: lines show all the same
    with StageLines("synthesis", stream=out) as lines:
        lines.stage("proc")
        clock[0] += 2.5
        lines.stage("abc9")
        lines.stage("abc9")                   # the current stage again: no new line
        clock[0] += 70
    assert out.getvalue().splitlines() == ["synthesis: proc at 0.0s",
                                           "synthesis: abc9 at 2.5s",
                                           "synthesis: done in 1:12"]


def test_a_failure_says_when_the_work_stopped(clock):
    out = io.StringIO()
    with pytest.raises(RuntimeError):
        with StageLines("export", stream=out, enabled=True) as lines:
            lines.stage("elaborating")
            clock[0] += 1
            raise RuntimeError
    assert out.getvalue().splitlines()[-1] == "export: stopped after 1.0s"


def test_env_var_hides_them_and_enabled_wins(clock, monkeypatch):
    monkeypatch.setenv(progress.ENV_VAR, "0")
    out = io.StringIO()
    with StageLines("x", stream=out) as lines:
        lines.stage("a")
    assert out.getvalue() == ""
    with StageLines("x", stream=out, enabled=True) as lines:
        lines.stage("a")
    assert out.getvalue().startswith("x: a at")


def test_a_closed_stream_does_not_stop_the_work(clock):
    out = io.StringIO()
    out.close()
    lines = StageLines("x", stream=out, enabled=True)
    lines.stage("a")
    lines.close()
    assert not lines.enabled


def test_no_stage_no_final_line(clock):
    out = io.StringIO()
    with pytest.raises(ValueError):
        with StageLines("x", stream=out, enabled=True):
            raise ValueError                  # e.g. a bad argument, before any work
    assert out.getvalue() == ""
