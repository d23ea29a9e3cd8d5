"""Timelines of a board schedule: a PNG and a Perfetto trace of CPU cores and the accelerator.

>>> schedule = list_schedule(tasks, cores=2)                                 # doctest: +SKIP
>>> render_schedule_png(schedule, "run.png", title="captioning on PYNQ-Z2")  # doctest: +SKIP
>>> write_schedule_perfetto(schedule, "run.json")                            # doctest: +SKIP

A schedule is a list of :class:`tessera.schedule.ScheduledTask` (name, lane, start and
end in seconds, kind, frame). The PNG has a lane per CPU core (``"CPU 0"``,
``"CPU 1"``...) in core order and the accelerator's lane last; a box per task
coloured by its kind (:data:`SCHEDULE_PALETTE`), the boxes of odd frames lighter so
that frame f+1 running beside frame f in a pipelined stream shows as two shades; a
time axis in s, ms or us; a legend. Tasks overlapping on one lane (which a lane that
runs one thing at a time never has, but a hand-made list may) go on extra rows of
the lane rather than hide each other.

Every name stays readable at any model size: a box shows its name (and ``fN``, its
frame, when the schedule has several) where that fits, otherwise a number listed with
the full name in a key below the chart (:func:`~tessera.runtime.timeline.box_labels`);
the image widens with the number of boxes in the busiest lane (up to
:data:`~tessera.runtime.timeline.AUTO_WIDTH`) and grows taller with lanes and key.
The Perfetto trace has one track per lane in the same order and a complete event per
task (microseconds) with its kind, frame and lane in ``args``.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tessera.errors import PYTHON, TimelineError
from tessera.schedule import ACCELERATOR, ScheduledTask

from .png import GLYPH_H, RGB, draw_text, text_width, write_png
from .timeline import (_EDGE_MIN_PX, _EDGE_SHADE, _LANE_GAP, _LINE_H, _PAD, _TEXT,
                       _TITLE_SCALE, _WHITE, _colour, _Plot, _span_rows, blank_chart,
                       box_labels, key_height, legend_height, nice_step, paint_axis,
                       paint_box, paint_key, paint_legend, resolve_width, track_metadata)

__all__ = ["ODD_FRAME_TINT", "SCHEDULE_PALETTE", "kind_colour", "lane_order",
           "render_schedule_png", "schedule_perfetto", "write_schedule_perfetto"]

#: Colour of each task kind; light enough for the dark label text. Other kinds get a
#: stable colour of their own.
SCHEDULE_PALETTE: dict[str, RGB] = {
    "segment": (110, 165, 228),
    "cpu op": (246, 166, 90),
    "transfer": (128, 200, 128),
    "launch": (192, 148, 222),
    "view": (196, 196, 196),
}
#: How far the boxes of odd frames are blended toward white.
ODD_FRAME_TINT = 0.45

_ROW_H = 16           # one row of boxes in a lane
_CPU_LANE = re.compile(r"CPU (\d+)")


def kind_colour(kind: str, frame: int) -> RGB:
    """The fill of a box of ``kind`` in ``frame``: the kind's colour, lighter in odd frames."""
    base = np.array(SCHEDULE_PALETTE.get(kind) or _colour(kind), np.float64)
    if frame % 2:
        base += (np.array(_WHITE) - base) * ODD_FRAME_TINT
    r, g, b = (int(v) for v in np.rint(base))
    return r, g, b


def lane_order(lanes: Sequence[str], cores: int | None = None) -> list[str]:
    """The lanes drawn: ``CPU 0`` up to the highest core used (or ``cores - 1``), so an
    idle core shows as an empty lane, then the accelerator."""
    used = [int(m.group(1)) for m in map(_CPU_LANE.fullmatch, lanes) if m]
    n = max([cores or 1, *(c + 1 for c in used)])
    return [f"CPU {c}" for c in range(n)] + [ACCELERATOR]


def _check_task(i: int, t: Any) -> ScheduledTask:
    try:
        name, lane, kind = str(t.name), t.lane, str(t.kind)
        start, end, frame = float(t.start), float(t.end), t.frame
    except (AttributeError, TypeError, ValueError):
        raise TimelineError(f"task {i} must be a tessera.schedule.ScheduledTask with a "
                            f"numeric start and end, not {t!r}") from None
    where = f"task {i} ({name!r})"
    if not (isinstance(lane, str) and (lane == ACCELERATOR or _CPU_LANE.fullmatch(lane))):
        raise TimelineError(f"{where} is on lane {lane!r}: lanes are 'CPU <core>' (e.g. "
                            f"'CPU 0') or {ACCELERATOR!r}",
                            fix={PYTHON: "schedule with tessera.schedule.list_schedule"})
    if not (math.isfinite(start) and math.isfinite(end) and 0 <= start <= end):
        raise TimelineError(f"{where} runs from {start} s to {end} s: need finite "
                            f"0 <= start <= end")
    if not isinstance(frame, (int, np.integer)) or frame < 0:
        raise TimelineError(f"{where} has frame {frame!r}: need an integer >= 0")
    return ScheduledTask(name, lane, start, end, kind, int(frame))


def _check_tasks(tasks: Sequence[ScheduledTask] | None) -> list[ScheduledTask]:
    if tasks is None or isinstance(tasks, (str, bytes)):
        raise TimelineError(f"a schedule is a list of tessera.schedule.ScheduledTask, not "
                            f"{tasks!r}")
    return [_check_task(i, t) for i, t in enumerate(tasks)]


def _tracks(tasks: Sequence[ScheduledTask], lanes: Sequence[str]
            ) -> tuple[list[tuple[str, int]], list[int]]:
    """The (lane, row) tracks in drawing order and each task's row in its lane: one row
    per lane unless tasks overlap on it (first fit by start time)."""
    row = [0] * len(tasks)
    tracks = []
    for lane in lanes:
        mine = [i for i, t in enumerate(tasks) if t.lane == lane]
        rows = _span_rows([(tasks[i].name, tasks[i].start, tasks[i].end) for i in mine],
                          max_rows=len(mine))
        for i, r in zip(mine, rows, strict=True):
            row[i] = r
        tracks += [(lane, r) for r in range(max(rows, default=0) + 1)]
    return tracks, row


def _time_unit(t_max: float) -> tuple[str, float]:
    """The unit the axis counts in, and seconds -> that unit."""
    if t_max >= 1:
        return "s", 1.0
    return ("ms", 1e3) if t_max >= 1e-3 else ("us", 1e6)


@dataclass
class ScheduleLayout(_Plot):
    """Where everything of a schedule PNG goes; the tests read it to find a box."""

    width: int
    height: int
    plot_x0: int
    plot_w: int
    #: Seconds at the plot's right edge (the left edge is 0).
    t_max: float
    unit: tuple[str, float]
    lanes: list[str]
    #: Lane -> rows (y0, y1) of its band (all its rows of boxes).
    lane_rows: dict[str, tuple[int, int]]
    #: Per task (in the order given): its box (x0, x1, y0, y1) and its label.
    boxes: list[tuple[int, int, int, int]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    key: list[tuple[int, str]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    #: The frames in the schedule, in order.
    frames: list[int] = field(default_factory=list)
    axis_y: int = 0
    legend_y: int = 0
    key_y: int = 0


def _legend(lay: ScheduleLayout) -> dict[str, list[RGB]]:
    """Legend entries: each kind with its even- and (in a stream) odd-frame shades."""
    shades = sorted({f % 2 for f in lay.frames})
    out: dict[str, list[RGB]] = {k or "task": [kind_colour(k, f) for f in shades]
                                 for k in lay.kinds}
    if len(lay.frames) > 1:
        out["fN: frame N; odd frames lighter"] = []
    return out


def _layout(tasks: Sequence[ScheduledTask], title: str, width: int | None,
            cores: int | None) -> ScheduleLayout:
    lanes = lane_order([t.lane for t in tasks], cores)
    tracks, row = _tracks(tasks, lanes)
    t_max = max((t.end for t in tasks), default=0.0) or 1e-3
    unit = _time_unit(t_max)
    label_w = max(map(text_width, [*lanes, f"time ({unit[0]})", "key"])) + 2 * _PAD
    frames = sorted({t.frame for t in tasks})
    suffix = [f" f{t.frame}" if len(frames) > 1 else "" for t in tasks]
    busiest = Counter(zip((t.lane for t in tasks), row)).most_common(1)
    width = resolve_width(width, label_w, [t.name + s for t, r, s in zip(tasks, row, suffix)
                                           if (t.lane, r) == busiest[0][0]] if tasks else [])
    y = _PAD + (GLYPH_H * _TITLE_SCALE + _PAD if title else 0)
    lane_rows, track_y = {}, {}
    for lane in lanes:
        n = sum(1 for ln, _ in tracks if ln == lane)
        lane_rows[lane] = (y, y + n * _ROW_H)
        track_y.update({(lane, r): y + r * _ROW_H for r in range(n)})
        y += n * _ROW_H + _LANE_GAP
    kinds = sorted({t.kind for t in tasks}, key=lambda k: (
        list(SCHEDULE_PALETTE).index(k) if k in SCHEDULE_PALETTE else len(SCHEDULE_PALETTE), k))
    lay = ScheduleLayout(width=width, height=0, plot_x0=label_w, plot_w=width - label_w - _PAD,
                         t_max=t_max, unit=unit, lanes=lanes, lane_rows=lane_rows, kinds=kinds,
                         frames=frames, axis_y=y)
    for t, r in zip(tasks, row, strict=True):
        top = track_y[(t.lane, r)] + 1
        lay.boxes.append((*lay.box_x(t.start, t.end), top, top + _ROW_H - 2))
    y += 5 + _LINE_H + _PAD // 2          # tick, tick labels
    lay.legend_y = y
    y += legend_height(list(_legend(lay)), label_w, width)
    _label_boxes(lay, tasks, suffix)
    lay.key_y = y
    lay.height = y + key_height(lay.key, label_w, width)
    return lay


def _label_boxes(lay: ScheduleLayout, tasks: Sequence[ScheduledTask],
                 suffix: Sequence[str]) -> None:
    """Each box's label (name and ``suffix``, its frame) and the key, numbered left to
    right (by start, then lane)."""
    lay.labels, lay.key = box_labels(
        [t.name for t in tasks], [x1 - x0 - 4 for x0, x1, *_ in lay.boxes],
        [(t.start, lay.lanes.index(t.lane), t.end) for t in tasks], suffix)


def render_schedule_png(tasks: Sequence[ScheduledTask], path: str | Path, *, title: str = "",
                        width: int | None = None, cores: int | None = None) -> Path:
    """Draw a board schedule (:func:`tessera.schedule.list_schedule`'s result) as a PNG.

    A lane per CPU core (at least ``cores``, up to the highest core used) and the
    accelerator last; a box per task coloured by its kind, odd frames lighter, labelled
    with its name where it fits and otherwise with a number the key below lists with
    the full name; a time axis from 0 in s, ms or us; a legend. ``width`` is the image
    width in pixels; None sizes it to the busiest lane (see the module doc).

    An empty schedule gives the lanes with nothing in them. A task that is not a
    ``ScheduledTask``, ends before it starts, or is on a lane that is neither
    ``"CPU <n>"`` nor ``"accelerator"`` raises :class:`TimelineError`, as does a width
    too small for the labels. Returns ``path`` as a :class:`~pathlib.Path`.
    """
    tasks = _check_tasks(tasks)
    lay = _layout(tasks, title, width, cores)
    img = blank_chart(lay, title, lay.lane_rows, _ROW_H)
    name, factor = lay.unit
    paint_axis(img, lay, lay.lane_rows[lay.lanes[0]][0], lay.axis_y,
               nice_step(lay.t_max * factor, lay.plot_w) / factor, f"time ({name})",
               lambda t: f"{t * factor:g}")
    for t, box, label in zip(tasks, lay.boxes, lay.labels, strict=True):
        fill = kind_colour(t.kind, t.frame)
        edge = tuple(int(v * _EDGE_SHADE) for v in fill) if box[1] - box[0] >= _EDGE_MIN_PX \
            else None
        paint_box(img, box, fill, edge, label)
    paint_legend(img, _legend(lay), lay.plot_x0, lay.legend_y)
    if not tasks:
        draw_text(img, lay.plot_x0, lay.legend_y + 1, "no tasks scheduled", _TEXT)
    paint_key(img, lay.key, lay.plot_x0, lay.key_y)
    return write_png(img, path)


def schedule_perfetto(tasks: Sequence[ScheduledTask], *,
                      cores: int | None = None) -> dict[str, Any]:
    """The schedule as Chrome/Perfetto trace JSON: a track per lane in the PNG's order
    (``tid`` 0, 1, ... named by ``thread_name`` metadata), a complete (``"X"``) event per
    task with ``ts`` and ``dur`` in microseconds and ``args`` ``kind``, ``frame`` and
    ``lane``. Tasks overlapping on one lane go on extra tracks ``"<lane> (2)"``...,
    because Perfetto needs the slices of a track to nest. Errors as
    :func:`render_schedule_png`."""
    tasks = _check_tasks(tasks)
    tracks, row = _tracks(tasks, lane_order([t.lane for t in tasks], cores))
    tid = {track: i for i, track in enumerate(tracks)}
    out = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "board schedule"}}]
    for (lane, r), i in tid.items():
        out += track_metadata(i, lane if r == 0 else f"{lane} ({r + 1})", i)
    for t, r in zip(tasks, row, strict=True):
        out.append({"name": t.name, "cat": t.kind or "task", "ph": "X", "pid": 0,
                    "tid": tid[(t.lane, r)], "ts": t.start * 1e6, "dur": (t.end - t.start) * 1e6,
                    "args": {"kind": t.kind, "frame": t.frame, "lane": t.lane}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_schedule_perfetto(tasks: Sequence[ScheduledTask], path: str | Path, *,
                            cores: int | None = None) -> Path:
    """Write :func:`schedule_perfetto` as JSON (open it at https://ui.perfetto.dev);
    returns ``path`` as a :class:`~pathlib.Path`."""
    path = Path(path)
    path.write_text(json.dumps(schedule_perfetto(tasks, cores=cores)))
    return path
