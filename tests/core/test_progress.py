"""The progress bar: what it writes, when it writes nothing, the env var, the rate limit.

Time is a fake clock (``tessera.progress._clock``) so no assertion depends on how fast
the machine is.
"""
from __future__ import annotations

import io

import pytest

from tessera import progress
from tessera.progress import Progress, format_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(progress, "_clock", fake)
    return fake


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def final_line(text: str) -> str:
    assert text.endswith("\n")
    return text[:-1].split("\r")[-1].rstrip()


def test_known_total(clock):
    out = io.StringIO()
    with Progress(40, "compile", stream=out, enabled=True, unit="layers") as bar:
        for i in range(40):
            clock.now += 0.25
            bar.update(item=f"conv{i}")
    text = out.getvalue()
    last = final_line(text)
    assert last.startswith("compile [")
    assert "100%" in last and "40/40 layers" in last and "in 10.0s" in last
    assert "conv39" not in last   # the final line drops the stale item
    assert "conv" in text         # ... but the redraws showed it
    assert "ETA" in text
    assert text.count("\n") == 1


def test_progress_line_contents(clock):
    out = io.StringIO()
    bar = Progress(200, "sim", stream=out, enabled=True)
    clock.now += 10
    bar.set(50, item="GEMM 1234")
    line = out.getvalue().split("\r")[-1]
    assert " 25% 50/200" in line
    assert "ETA 30.0s" in line and "GEMM 1234" in line
    assert line.count("=") + line.count(">") == 30 // 4 + 1


def test_unknown_total_shows_a_counter(clock):
    out = io.StringIO()
    with Progress(None, "simulate", stream=out, enabled=True, unit="insns") as bar:
        clock.now += 2
        bar.update(1000)
    last = final_line(out.getvalue())
    assert "simulate 1,000 insns in 2.0s" in last and "(500/s)" in last
    assert "%" not in out.getvalue() and "[" not in out.getvalue()
    with Progress(None, "slow", stream=out, enabled=True) as bar:
        clock.now += 4
        bar.update(10)
    assert "(2.5/s)" in final_line(out.getvalue())


def test_disabled_writes_nothing(clock):
    out = Tty()
    with Progress(10, "quiet", stream=out, enabled=False) as bar:
        for _ in range(10):
            clock.now += 1
            bar.update(item="x")
    assert out.getvalue() == ""


def test_env_var_and_tty(monkeypatch, clock):
    def shown(stream, **kw) -> bool:
        with Progress(3, "p", stream=stream, **kw) as bar:
            bar.update(3)
        return stream.getvalue() != ""

    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    assert shown(Tty())                     # a terminal: on
    assert not shown(io.StringIO())         # a pipe or file: off
    monkeypatch.setenv(progress.ENV_VAR, "0")
    assert not shown(Tty())                 # 0 silences terminals too
    assert shown(io.StringIO(), enabled=True)   # but an explicit argument wins
    monkeypatch.setenv(progress.ENV_VAR, "1")
    assert shown(io.StringIO())             # 1 forces it on
    assert not shown(Tty(), enabled=False)


def test_default_stream_is_stderr(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV_VAR, "1")
    with Progress(2, "to-stderr") as bar:
        bar.update(2)
    captured = capsys.readouterr()
    assert captured.out == "" and "to-stderr" in captured.err


def test_rate_limit(clock):
    out = io.StringIO()
    bar = Progress(1000, "fast", stream=out, enabled=True)
    for _ in range(1000):
        clock.now += 0.001          # 1 s in all: about ten redraws allowed
        bar.update()
    redraws_before_close = out.getvalue().count("\r")
    bar.close()
    assert 2 <= redraws_before_close <= 11
    assert bar.redraws == redraws_before_close + 1
    assert out.getvalue().count("\r") == redraws_before_close + 1


def test_close_is_idempotent_and_stops_updates(clock):
    out = io.StringIO()
    bar = Progress(5, "once", stream=out, enabled=True)
    bar.update(2)
    bar.close()
    text = out.getvalue()
    bar.close()
    bar.update(3)
    assert out.getvalue() == text
    assert " 40% 2/5" in final_line(text)   # closed early: says how far it got


def test_exception_still_closes(clock):
    out = io.StringIO()
    with pytest.raises(RuntimeError):
        with Progress(4, "boom", stream=out, enabled=True) as bar:
            bar.update()
            raise RuntimeError("stop")
    assert "1/4" in final_line(out.getvalue())


def test_long_items_are_truncated_and_shorter_lines_erase_longer(clock):
    out = io.StringIO()
    bar = Progress(10, "x", stream=out, enabled=True)
    bar.update(item="a" * 500)
    first = out.getvalue().split("\r")[-1]
    assert len(first) < 80 and first.endswith("...")
    clock.now += 1
    bar.update(item="b")
    second = out.getvalue().split("\r")[-1]
    assert len(second) == len(first)        # padded with blanks over the old text
    assert second.rstrip().endswith(" b")


def test_zero_total_and_bad_total(clock):
    out = io.StringIO()
    with Progress(0, "nothing", stream=out, enabled=True):
        pass
    assert "100% 0/0" in final_line(out.getvalue())
    with pytest.raises(ValueError):
        Progress(-1, "bad")


def test_broken_stream_disables_the_bar(clock):
    out = io.StringIO()
    bar = Progress(3, "b", stream=out, enabled=True)
    out.close()
    bar.update()      # must not raise: a progress bar never aborts the work
    bar.close()
    assert not bar.enabled


def test_format_duration():
    assert format_duration(4.24) == "4.2s"
    assert format_duration(75) == "1:15"
    assert format_duration(3 * 3600 + 62) == "3:01:02"
