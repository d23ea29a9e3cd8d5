"""A dependency-free progress bar for long compiles and simulations.

>>> with Progress(len(layers), "compile", unit="layers") as bar:   # doctest: +SKIP
...     for layer in layers:
...         bar.update(item=layer.name)
compile [==============================] 100% 21/21 layers in 4.2s

By default the bar shows only on an interactive terminal (``stream.isatty()``), so
logs, pipes and CI output stay clean. The environment variable ``TESSERA_PROGRESS``
overrides that: ``0`` never shows it, ``1`` always does. An explicit ``enabled=``
argument wins over both (a ``--quiet`` flag must stay quiet). A disabled bar writes
nothing at all, not even the final line.

Work with no known fraction (a yosys synthesis, a Verilog export) is reported by
:class:`StageLines` instead: one plain line per stage with the time elapsed since the
work began, e.g. ``synthesis: abc9 (LUT mapping) at 1:02``. Plain lines read well in
logs and CI too, so they show wherever the bar would and also off a terminal; only
``TESSERA_PROGRESS=0`` (or ``enabled=False``) hides them.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from types import TracebackType
from typing import TextIO

__all__ = ["ENV_VAR", "MIN_INTERVAL", "Progress", "StageLines", "format_duration"]

#: Environment variable: ``0`` hides every progress bar, ``1`` shows them even when
#: the stream is not a terminal.
ENV_VAR = "TESSERA_PROGRESS"

#: Seconds between redraws: enough to look live, few enough that a loop of a million
#: cheap updates does not spend its time writing to the terminal.
MIN_INTERVAL = 0.1

_BAR_WIDTH = 30
_DEFAULT_COLUMNS = 80

# The clock the bar reads; a module attribute so tests can substitute a fake one.
_clock = time.monotonic


def format_duration(seconds: float) -> str:
    """``4.2s`` under a minute, then ``m:ss`` and ``h:mm:ss``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _env_enabled(stream: TextIO, *, default: bool | None = None) -> bool:
    """``TESSERA_PROGRESS`` if set, else ``default``, else whether ``stream`` is a
    terminal."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env == "0":
        return False
    if env == "1":
        return True
    if default is not None:
        return default
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):   # no isatty, or a closed stream
        return False


class Progress:
    """A one-line progress bar redrawn in place with ``\\r``.

    ``total`` is the number of steps (``None`` when unknown: then a counter, the
    elapsed time and the rate are shown instead of a bar, percentage and ETA).
    ``label`` starts the line, ``unit`` follows the counts (``"layers"``,
    ``"insns"``). ``stream`` defaults to ``sys.stderr`` (looked up when the bar is
    made, so redirections in effect then apply). ``enabled`` ``None`` follows the
    terminal and ``TESSERA_PROGRESS`` (see the module docstring).

    Redraws happen at most every :data:`MIN_INTERVAL` seconds (the first update
    always draws); :meth:`close` writes the final line with the elapsed time and a
    newline. Not thread-safe: update it from one thread.
    """

    def __init__(self, total: int | None, label: str, *, stream: TextIO | None = None,
                 enabled: bool | None = None, unit: str = "") -> None:
        if total is not None and total < 0:
            raise ValueError(f"a progress total must be >= 0 or None, not {total}")
        self.total = total
        self.label = label
        self.unit = unit
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.enabled = _env_enabled(self.stream) if enabled is None else bool(enabled)
        self.done = 0
        self.item = ""
        self.closed = False
        self._start = _clock()
        self._last_draw: float | None = None
        self._last_len = 0
        self.redraws = 0

    # ------------------------------------------------------------------ updates
    def update(self, n: int = 1, *, item: str = "") -> None:
        """Advance by ``n`` steps; ``item`` names what is being worked on now."""
        self.set(self.done + n, item=item)

    def set(self, done: int, *, item: str = "") -> None:
        """Set the number of finished steps to ``done``."""
        if self.closed:
            return
        self.done = done
        if item:
            self.item = item
        if not self.enabled:
            return
        now = _clock()
        if self._last_draw is None or now - self._last_draw >= MIN_INTERVAL:
            self._draw(self._line(now), now)

    def close(self) -> None:
        """Write the final line (the elapsed time instead of the ETA) and a newline.
        Closing twice does nothing the second time."""
        if self.closed:
            return
        self.closed = True
        if self.enabled:
            now = _clock()
            self._draw(self._line(now, final=True), now, end="\n")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # close even on an exception: the final line shows how far the work got
        self.close()

    # ------------------------------------------------------------------ drawing
    def _columns(self) -> int:
        # A stream without isatty, or a closed one, is not a terminal.
        with contextlib.suppress(AttributeError, ValueError, OSError):
            if self.stream.isatty():
                return shutil.get_terminal_size((_DEFAULT_COLUMNS, 24)).columns
        return _DEFAULT_COLUMNS

    def _line(self, now: float, *, final: bool = False) -> str:
        elapsed = max(0.0, now - self._start)
        unit = f" {self.unit}" if self.unit else ""
        if self.total is None:
            rate = ""
            if elapsed > 0 and self.done:
                r = self.done / elapsed
                rate = f" ({r:,.0f}/s)" if r >= 100 else f" ({r:.1f}/s)"
            head = f"{self.label} {self.done:,}{unit}"
            tail = (f" in {format_duration(elapsed)}{rate}" if final
                    else f" {format_duration(elapsed)}{rate}")
        else:
            frac = min(1.0, self.done / self.total) if self.total else 1.0
            filled = int(frac * _BAR_WIDTH)
            bar = "=" * filled + (">" if filled < _BAR_WIDTH else "") \
                + " " * (_BAR_WIDTH - filled - 1)
            head = (f"{self.label} [{bar}] {int(frac * 100):3d}% "
                    f"{self.done:,}/{self.total:,}{unit}")
            if final:
                tail = f" in {format_duration(elapsed)}"
            elif 0 < self.done < self.total:
                eta = elapsed * (self.total - self.done) / self.done
                tail = f" {format_duration(elapsed)} ETA {format_duration(eta)}"
            else:
                tail = f" {format_duration(elapsed)}"
        line = head + tail
        # the final line drops the item: the work is over, and a stale name misleads
        if self.item and not final:
            room = self._columns() - 1 - len(line) - 1
            if room >= 4:
                item = self.item if len(self.item) <= room else self.item[:room - 3] + "..."
                line += " " + item
        # a line wider than the terminal wraps, and "\r" then returns only to the
        # wrapped part, so every redraw would leave a new line behind
        return line[:self._columns() - 1]

    def _draw(self, line: str, now: float, end: str = "") -> None:
        pad = " " * max(0, self._last_len - len(line))   # erase a longer previous line
        try:
            self.stream.write("\r" + line + pad + end)
            self.stream.flush()
        except (OSError, ValueError):
            # a closed or broken stream must not abort the compile it reports on
            self.enabled = False
            return
        self._last_len = len(line)
        self._last_draw = now
        self.redraws += 1


class StageLines:
    """Stages of work with no known fraction, one line each with the elapsed time.

    ``stage(name)`` writes ``<label>: <name> at <elapsed>``; :meth:`close` writes
    ``<label>: done in <elapsed>`` (or ``stopped after`` when the work raised, as a
    context manager), unless no stage started. ``stream`` defaults to ``sys.stderr``;
    ``enabled`` ``None`` shows the lines unless ``TESSERA_PROGRESS=0`` (see the module
    docstring). A repeated stage name is written once.
    """

    def __init__(self, label: str, *, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.label = label
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.enabled = (_env_enabled(self.stream, default=True) if enabled is None
                        else bool(enabled))
        self.current: str | None = None
        self.closed = False
        self._start = _clock()

    @property
    def elapsed(self) -> float:
        """Seconds since the lines were started."""
        return max(0.0, _clock() - self._start)

    def stage(self, name: str) -> None:
        """Start stage ``name`` (a no-op when it is the current one)."""
        if self.closed or name == self.current:
            return
        self.current = name
        self._write(f"{self.label}: {name} at {format_duration(self.elapsed)}")

    def close(self, *, failed: bool = False) -> None:
        """Write the final line with the total time (none when no stage started: the
        work failed its checks before it began); closing twice writes it once."""
        if self.closed:
            return
        self.closed = True
        if self.current is None:
            return
        verb = "stopped after" if failed else "done in"
        self._write(f"{self.label}: {verb} {format_duration(self.elapsed)}")

    def __enter__(self) -> StageLines:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(failed=exc_type is not None)

    def _write(self, line: str) -> None:
        if not self.enabled:
            return
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            # a closed or broken stream must not abort the work it reports on
            self.enabled = False
