"""Timelines of a simulation run: a PNG picture and a Perfetto trace with layer spans.

>>> result = simulate(program, trace=True)                           # doctest: +SKIP
>>> spans = [("conv1", 0, 5_000), ("conv2", 5_000, 12_000)]          # doctest: +SKIP
>>> render_timeline_png(result.trace, "run.png", spans=spans,   # doctest: +SKIP
...                     title="resnet18 on pynq")
>>> write_perfetto_trace(result.trace, program.config, "run.json", spans=spans)  # doctest: +SKIP

The PNG has one lane per track (the modules of :data:`tessera.config.MODULES` in
order, each followed by its compute-unit sub-tracks such as ``compute.gemm``), a bar
per instruction coloured by its kind (``LOAD inp``, ``GEMM``, ``ALU``, ``STORE``...),
a top lane of labelled layer boxes when ``spans`` are given, a cycle axis and a
legend. It needs nothing but numpy: a built-in 5x7 bitmap font and a small PNG
encoder (zlib + struct), so it works on a board or in CI without matplotlib.

Many instructions fall into one pixel column on long runs (ResNet-18 is ~100k
instructions over ~1,600 columns). Each column then shows the instruction kind that
was busy for most of its cycles, its colour faded by how busy the track was in that
column (never below :data:`MIN_ALPHA`, so a lone short instruction stays visible). A
fully busy column has exactly the kind's colour.

Layer names are never cut: a box too narrow for its name shows a number, listed with
the full name in a key below the chart (:func:`box_labels`), and a width of None sizes
the image to the number of layers (:func:`resolve_width`). The chart pieces here (axis,
legend, key, lanes, boxes) also draw the board schedule
(:mod:`tessera.runtime.schedule_timeline`); the font and the PNG writer are
:mod:`tessera.runtime.png`.

An empty event list is not an error: it gives a valid image with empty lanes (and the
layer boxes, if any), because a run that executed nothing is still a run worth
showing next to others. ``events=None`` (a run simulated without ``trace=True``)
raises :class:`TimelineError`.
"""
from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tessera.config import MODULES, HwConfig
from tessera.errors import PYTHON, TimelineError
from tessera.sim.stats import TraceEvent, chrome_trace

from .png import ADVANCE, GLYPH_H, RGB, draw_text, text_width, write_png

__all__ = ["AUTO_WIDTH", "MIN_ALPHA", "PALETTE", "Span", "blank_chart", "box_labels",
           "instruction_kind", "key_height", "legend_height", "nice_step", "paint_axis",
           "paint_box", "paint_key", "paint_legend", "perfetto_trace", "render_timeline_png",
           "resolve_width", "track_metadata", "write_perfetto_trace", "write_png"]

#: ``(layer name, start cycle, end cycle)``.
Span = tuple[str, int, int]


# --------------------------------------------------------------------------- colours

#: Colour of each instruction kind (see :func:`instruction_kind`); loads are shades of
#: blue so the load lane tells inputs from weights at a glance.
PALETTE: dict[str, RGB] = {
    "LOAD inp": (76, 120, 168),
    "LOAD wgt": (140, 190, 230),
    "LOAD uop": (118, 104, 186),
    "LOAD acc": (38, 150, 150),
    "LOAD acc8": (92, 196, 196),
    "LOAD tbl": (156, 210, 120),
    "GEMM": (245, 133, 24),
    "ALU": (84, 162, 75),
    "STORE": (178, 121, 162),
    "FINISH": (90, 90, 90),
}

#: Lowest opacity of a bar in a pixel column the track was busy in only briefly.
MIN_ALPHA = 0.4

_WHITE: RGB = (255, 255, 255)
_TEXT: RGB = (40, 40, 40)
_AXIS: RGB = (90, 90, 90)
_GRID: RGB = (222, 222, 222)
_LANE_BG: RGB = (244, 244, 244)
_LAYER_FILL: tuple[RGB, RGB] = ((255, 226, 180), (205, 224, 244))
_LAYER_EDGE: RGB = (120, 120, 120)
# a bar wide enough to show its own start gets a darker first column, so back-to-back
# instructions of one kind do not melt into one block
_EDGE_MIN_PX = 4
_EDGE_SHADE = 0.65
# compute units in the order the hardware documentation lists them; others sort after
_UNIT_ORDER = ("gemm", "alu")


def instruction_kind(name: str) -> str:
    """The colour key of an instruction name: ``LOAD inp`` stays whole (the memory
    matters), every other name keeps its opcode (``ALU MAX`` -> ``ALU``)."""
    head = name.split(" ", 1)[0]
    return name if head == "LOAD" else head


def _colour(kind: str) -> RGB:
    if kind in PALETTE:
        return PALETTE[kind]
    # unknown kinds get a stable mid-saturation colour, the same in every image
    h = zlib.crc32(kind.encode())
    return (60 + h % 150, 60 + (h >> 8) % 150, 60 + (h >> 16) % 150)


# --------------------------------------------------------------------------- labels

def box_labels(names: Sequence[str], room: Sequence[int], starts: Sequence[float],
               suffixes: Sequence[str] | None = None) -> tuple[list[str], list[tuple[int, str]]]:
    """The label of each box (``room[i]`` pixels for text) and the numbered key.

    A box shows its name (plus ``suffixes[i]``, e.g. a frame) where that fits; otherwise
    a key number (with the suffix if that fits), and the key lists the number with the
    full name, so no name is ever cut. Numbers go to distinct names in the order of the
    boxes' ``starts`` (left to right, so the key reads like the picture). Returns
    ``(labels, [(number, name), ...])``; a label is ``""`` where not even the number fits.
    """
    suffixes = suffixes if suffixes is not None else [""] * len(names)
    numbers: dict[str, int] = {}
    labels = [""] * len(names)
    for i in sorted(range(len(names)), key=lambda i: starts[i]):
        name, px, suffix = names[i], room[i], suffixes[i]
        if text_width(name + suffix) <= px:
            labels[i] = name + suffix
            continue
        n = numbers.setdefault(name, len(numbers) + 1)
        labels[i] = next((t for t in (f"{n}{suffix}", str(n)) if text_width(t) <= px), "")
    return labels, [(n, name) for name, n in numbers.items()]


# --------------------------------------------------------------------------- layout

_PAD = 8
_LANE_H = 16          # one track lane
_BAR_INSET = 2        # blank rows above and below the bars inside a lane
_LANE_GAP = 3
_LAYER_ROW_H = 13     # one row of layer boxes (7-px text + margins)
_MAX_LAYER_ROWS = 4
_LINE_H = GLYPH_H + 4
_TITLE_SCALE = 2
#: Bounds of an automatic image width: wide enough to name a few dozen boxes, small
#: enough to open anywhere.
AUTO_WIDTH = (1600, 8000)
# the pixels an automatic width gives a box: room for the typical name, within bounds
_BOX_PX = (24, 160)


class _Plot:
    """Time -> pixel column of a plot ``plot_w`` columns from ``plot_x0``, time 0 to ``t_max``."""

    width: int
    height: int
    plot_x0: int
    plot_w: int
    t_max: float

    def x_of(self, t: float) -> int:
        """The pixel column holding time ``t``."""
        return self.plot_x0 + min(self.plot_w - 1, int(t * self.plot_w / self.t_max))

    def box_x(self, start: float, end: float) -> tuple[int, int]:
        """Columns [x0, x1) of a box from ``start`` to ``end``: at least one column, and
        a box ending at the plot's end reaches its last column."""
        x0 = self.x_of(start)
        return x0, max(x0 + 1, self.x_of(end) if end < self.t_max else self.plot_x0 + self.plot_w)


@dataclass
class _Layout(_Plot):
    """Where everything goes; the tests read it to find a bar's pixels."""

    width: int
    height: int
    plot_x0: int
    plot_w: int
    #: The cycle at the right edge of the plot (the left edge is cycle 0).
    t_max: int
    tracks: list[str]
    #: Track -> rows (y0, y1) of its bars.
    bar_rows: dict[str, tuple[int, int]]
    #: Track -> rows (y0, y1) of its lane.
    lane_rows: dict[str, tuple[int, int]]
    #: Rows of the layer lane (None without spans), and each span's row in it.
    layer_rows: tuple[int, int] | None
    span_row: list[int] = field(default_factory=list)
    axis_y: int = 0
    legend_y: int = 0
    legend: list[str] = field(default_factory=list)
    #: Each span's label (its name, a key number or ""), and the key below the legend.
    labels: list[str] = field(default_factory=list)
    key: list[tuple[int, str]] = field(default_factory=list)
    key_y: int = 0


def _track_key(track: str) -> tuple[int, str, int, str]:
    module, _, unit = track.partition(".")
    mi = MODULES.index(module) if module in MODULES else len(MODULES)
    ui = 0 if not unit else 1 + (_UNIT_ORDER.index(unit) if unit in _UNIT_ORDER
                                 else len(_UNIT_ORDER))
    return mi, module, ui, unit


def _tracks(events: Sequence[TraceEvent]) -> list[str]:
    return sorted(set(MODULES) | {e.track for e in events}, key=_track_key)


def _span_rows(spans: Sequence[Span], max_rows: int) -> list[int]:
    """A row per span so overlapping spans (pipelined layers) sit on different rows:
    greedy first fit by start cycle; past ``max_rows`` the row that frees up first."""
    ends: list[int] = []
    rows = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: (spans[i][1], spans[i][2])):
        _, start, end = spans[i]
        free = [r for r, e in enumerate(ends) if e <= start]
        if free:
            r = free[0]
        elif len(ends) < max_rows:
            r = len(ends)
            ends.append(0)
        else:
            r = min(range(len(ends)), key=ends.__getitem__)
        ends[r] = max(ends[r], end)
        rows[i] = r
    return rows


def _check_spans(spans: Sequence[Span]) -> list[Span]:
    out = []
    for i, span in enumerate(spans):
        try:
            name, start, end = span
            start, end = int(start), int(end)
        except (TypeError, ValueError):
            raise TimelineError(f"span {i} must be (layer name, start cycle, end cycle), "
                                f"not {span!r}") from None
        if start < 0 or end < start:
            raise TimelineError(f"span {i} ({name!r}) runs from cycle {start} to {end}: "
                                f"need 0 <= start <= end")
        out.append((str(name), start, end))
    return out


def _check_events(events: Sequence[TraceEvent] | None) -> Sequence[TraceEvent]:
    if events is None:
        raise TimelineError("no trace: simulate with trace=True (tessera.sim.simulate(program, "
                            "trace=True)) to record the events a timeline is drawn from")
    return events


def resolve_width(width: int | None, label_w: int, busiest_row: Sequence[str]) -> int:
    """``width``, or with None one giving each box of the busiest row (its labels in
    ``busiest_row``) room for their median label, within :data:`AUTO_WIDTH`. A width too
    small for the labels column raises :class:`TimelineError`."""
    if width is None:
        box = np.clip(np.median([text_width(n) for n in busiest_row] or [0]) + 6, *_BOX_PX)
        width = int(np.clip(label_w + _PAD + len(busiest_row) * box, *AUTO_WIDTH))
    if width < label_w + 64 + _PAD:
        raise TimelineError(f"a timeline needs width >= {label_w + 64 + _PAD} pixels "
                            f"(the labels take {label_w}), not {width}",
                            fix={PYTHON: "pass a larger width=, or width=None for one that "
                                         "fits the picture"})
    return width


def _layout(events: Sequence[TraceEvent], spans: Sequence[Span], title: str,
            width: int | None) -> _Layout:
    tracks = _tracks(events)
    label_w = max(text_width(t) for t in [*tracks, "layers", "cycles", "key"]) + 2 * _PAD
    span_row = _span_rows(spans, _MAX_LAYER_ROWS) if spans else []
    busiest = max(range(max(span_row, default=0) + 1), key=span_row.count)
    width = resolve_width(width, label_w, [s[0] for s, r in zip(spans, span_row) if r == busiest])
    y = _PAD
    if title:
        y += GLYPH_H * _TITLE_SCALE + _PAD
    layer_rows = None
    if spans:
        h = _LAYER_ROW_H * (max(span_row) + 1)
        layer_rows = (y, y + h)
        y += h + _LANE_GAP + 2
    lane_rows, bar_rows = {}, {}
    for t in tracks:
        lane_rows[t] = (y, y + _LANE_H)
        bar_rows[t] = (y + _BAR_INSET, y + _LANE_H - _BAR_INSET)
        y += _LANE_H + _LANE_GAP
    axis_y = y
    y += 5 + _LINE_H + _PAD // 2          # tick, tick labels
    kinds = sorted({instruction_kind(n) for n in {e.name for e in events}},
                   key=lambda k: (list(PALETTE).index(k) if k in PALETTE else len(PALETTE), k))
    lay = _Layout(width=width, height=0, plot_x0=label_w, plot_w=width - label_w - _PAD,
                  t_max=max([1, *(e.end for e in events), *(s[2] for s in spans)]),
                  tracks=tracks, bar_rows=bar_rows, lane_rows=lane_rows,
                  layer_rows=layer_rows, span_row=span_row, axis_y=axis_y,
                  legend_y=y, legend=kinds)
    y += legend_height(kinds, label_w, width)
    room = [x1 - x0 - 4 for x0, x1 in (lay.box_x(start, end) for _, start, end in spans)]
    lay.labels, lay.key = box_labels([s[0] for s in spans], room, [s[1:] for s in spans])
    lay.key_y = y
    lay.height = y + key_height(lay.key, label_w, width)
    return lay


def _key_items(key: Sequence[tuple[int, str]], x0: int, width: int
               ) -> list[tuple[str, int, int]]:
    """(text, x, line) of the key's lines: entries ``"n: name"`` numbered down columns as
    wide as the widest entry; an entry wider than the image continues on the next line."""
    if not key:
        return []
    avail = width - _PAD - x0
    per_line = max(1, (avail + 1) // ADVANCE)
    lines = [t[i:i + per_line] for t in (f"{n}: {name}" for n, name in key)
             for i in range(0, len(t), per_line)]
    col_w = max(map(text_width, lines)) + 3 * ADVANCE
    rows = -(-len(lines) // max(1, (avail + 3 * ADVANCE) // col_w))
    return [(text, x0 + i // rows * col_w, i % rows) for i, text in enumerate(lines)]


def key_height(key: Sequence[tuple[int, str]], x0: int, width: int) -> int:
    """Pixel rows the key of :func:`box_labels` takes below a chart (0 without one)."""
    items = _key_items(key, x0, width)
    return (1 + max(line for _, _, line in items)) * _LINE_H + _PAD if items else 0


def paint_key(img: np.ndarray, key: Sequence[tuple[int, str]], x0: int, y: int) -> None:
    """Draw the key of :func:`box_labels` with its first line at row ``y``."""
    if key:
        draw_text(img, _PAD, y + 1, "key", _TEXT)
    for text, x, line in _key_items(key, x0, img.shape[1]):
        draw_text(img, x, y + 1 + line * _LINE_H, text, _TEXT)


def _legend_items(kinds: Sequence[str], x0: int, width: int) -> list[tuple[str, int, int]]:
    """(kind, x, line) of every legend entry, wrapped at the image's right edge."""
    out, x, line = [], x0, 0
    for k in kinds:
        w = 12 + text_width(k) + 14
        if x + w > width - _PAD and x > x0:
            x, line = x0, line + 1
        out.append((k, x, line))
        x += w
    return out


def legend_height(entries: Sequence[str], x0: int, width: int) -> int:
    """Pixel rows a legend of ``entries`` takes (one line at least)."""
    lines = 1 + max((line for *_, line in _legend_items(entries, x0, width)), default=0)
    return lines * _LINE_H + _PAD


def paint_legend(img: np.ndarray, swatches: Mapping[str, Sequence[RGB]], x0: int,
                 y: int) -> None:
    """Draw a legend entry per key of ``swatches`` (wrapped as :func:`_legend_items`):
    a 10-px swatch split evenly between its colours (none: text only), then the text."""
    for text, x, line in _legend_items(list(swatches), x0, img.shape[1]):
        top = y + line * _LINE_H
        colours = swatches[text]
        edges = [x + 10 * i // max(1, len(colours)) for i in range(len(colours) + 1)]
        for c, a, b in zip(colours, edges, edges[1:]):
            img[top:top + GLYPH_H + 1, a:b] = c
        draw_text(img, x + 14 if colours else x, top + 1, text, _TEXT)


def nice_step(t_max: float, plot_w: int) -> float:
    """A 1/2/5 x 10^k step of time giving a tick about every 100 pixels."""
    raw = t_max / max(1, plot_w // 100)
    mag = 10.0 ** np.floor(np.log10(raw))
    return float(next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9)))


def _cycle_label(c: float) -> str:
    if c >= 10_000_000:
        return f"{c / 1e6:g}M"
    if c >= 10_000:
        return f"{c / 1e3:g}k"
    return str(int(c))


def blank_chart(plot: _Plot, title: str, lanes: Mapping[str, tuple[int, int]],
                row_h: int) -> np.ndarray:
    """A white ``plot.height`` x ``plot.width`` image with ``title`` and the ``lanes``
    (name -> rows y0, y1): grey bands named in the labels column, centred on the first
    ``row_h`` rows."""
    img = np.full((plot.height, plot.width, 3), 255, np.uint8)
    draw_text(img, _PAD, _PAD, title, _TEXT, scale=_TITLE_SCALE, clip_x=plot.width - _PAD)
    for name, (y0, y1) in lanes.items():
        img[y0:y1, plot.plot_x0:plot.plot_x0 + plot.plot_w] = _LANE_BG
        draw_text(img, _PAD, y0 + (row_h - GLYPH_H) // 2, name, _TEXT)
    return img


def paint_axis(img: np.ndarray, plot: _Plot, top: int, axis_y: int, step: float,
               caption: str, label: Callable[[float], str]) -> None:
    """A time axis at row ``axis_y``: a tick and ``label(t)`` every ``step`` from 0 to
    ``plot.t_max``, ``caption`` in the labels column, and a grid line in the lane
    background (rows ``top`` to the axis) where nothing is drawn yet."""
    px0, px1 = plot.plot_x0, plot.plot_x0 + plot.plot_w
    img[axis_y, px0:px1] = _AXIS
    draw_text(img, _PAD, axis_y + 5, caption, _TEXT)
    for i in range(int(plot.t_max / step * (1 + 1e-9)) + 1):
        t = i * step
        x = plot.x_of(t) if t < plot.t_max else px1 - 1
        column = img[top:axis_y, x]
        column[(column == _LANE_BG).all(axis=1)] = _GRID
        img[axis_y:axis_y + 4, x] = _AXIS
        text = label(t)
        lx = min(x - text_width(text) // 2, img.shape[1] - 2 - text_width(text))
        draw_text(img, max(px0, lx), axis_y + 6, text, _TEXT)


# --------------------------------------------------------------------------- drawing

def _paint_lane(img: np.ndarray, lay: _Layout, rows: tuple[int, int], kinds: list[str],
                kind_id: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
    """Paint one track's bars: per pixel column, the kind busy longest there, faded by
    the fraction of the column's cycles the track was busy."""
    w = lay.plot_w
    bounds = np.arange(w + 1, dtype=np.float64) * (lay.t_max / w)
    occ = np.zeros((len(kinds), w))
    for k in np.unique(kind_id):
        # cycles of kind k before each boundary T: sum over its events of
        # clamp(T - start, 0, duration), evaluated at every boundary at once from
        # sorted starts and ends (O((n + w) log n), no per-event loop)
        covered = np.zeros(w + 1)
        for times, sign in ((start[kind_id == k], 1.0), (end[kind_id == k], -1.0)):
            t = np.sort(times)
            csum = np.concatenate([[0.0], np.cumsum(t)])
            n = np.searchsorted(t, bounds, side="left")
            covered += sign * (n * bounds - csum[n])
        occ[k] = np.diff(covered)
    busy = occ.sum(axis=0)
    on = busy > 1e-9
    if not on.any():
        return
    alpha = np.clip(busy / (lay.t_max / w), MIN_ALPHA, 1.0)[on]
    colours = np.array([_colour(k) for k in kinds], np.float64)[occ.argmax(axis=0)[on]]
    y0, y1 = rows
    x0 = lay.plot_x0
    region = img[y0:y1, x0:x0 + w][:, on].astype(np.float64)
    blended = region + (colours[None] - region) * alpha[None, :, None]
    img[y0:y1, np.flatnonzero(on) + x0] = np.rint(blended).astype(np.uint8)
    # the first column of every bar wide enough to have one of its own
    scale = w / lay.t_max
    wide = (end - start) * scale >= _EDGE_MIN_PX
    if wide.any():
        cols = np.minimum(w - 1, (start[wide] * scale).astype(np.int64)) + x0
        shade = np.array([_colour(k) for k in kinds], np.float64)[kind_id[wide]] * _EDGE_SHADE
        img[y0:y1, cols] = shade.astype(np.uint8)[None]


def _paint_layers(img: np.ndarray, lay: _Layout, spans: Sequence[Span]) -> None:
    assert lay.layer_rows is not None
    top = lay.layer_rows[0]
    draw_text(img, _PAD, top + 3, "layers", _TEXT)
    for i, ((_, start, end), row) in enumerate(zip(spans, lay.span_row, strict=True)):
        x0, x1 = lay.box_x(start, end)
        y0 = top + row * _LAYER_ROW_H
        # neighbours alternate fills so adjacent layers stay apart when boxes are thin
        paint_box(img, (x0, x1, y0, y0 + _LAYER_ROW_H - 1), _LAYER_FILL[i % 2], _LAYER_EDGE,
                  lay.labels[i])


def paint_box(img: np.ndarray, box: tuple[int, int, int, int], fill: RGB, edge: RGB | None,
              label: str) -> None:
    """A box over columns [x0, x1) and rows [y0, y1) (``box``), with a one-pixel
    ``edge`` unless None, and ``label`` at its left, centred vertically, clipped to it."""
    x0, x1, y0, y1 = box
    img[y0:y1, x0:x1] = fill
    if edge is not None:
        img[y0, x0:x1] = img[y1 - 1, x0:x1] = edge
        img[y0:y1, x0] = img[y0:y1, x1 - 1] = edge
    draw_text(img, x0 + 2, y0 + (y1 - y0 - GLYPH_H + 1) // 2, label, _TEXT, clip_x=x1 - 1)


def _paint_tracks(img: np.ndarray, lay: _Layout, events: Sequence[TraceEvent]) -> None:
    """Every track's bars, from the events gathered into arrays once."""
    track_id = {t: i for i, t in enumerate(lay.tracks)}
    kind_index = {k: i for i, k in enumerate(lay.legend)}
    # a name's kind is looked up once, not per event
    kid_of = {n: kind_index[instruction_kind(n)] for n in {e.name for e in events}}
    tid = np.array([track_id[e.track] for e in events], np.int64)
    kid = np.array([kid_of[e.name] for e in events], np.int64)
    start = np.array([e.start for e in events], np.float64)
    end = np.maximum(start, np.array([e.end for e in events], np.float64))
    for t, i in track_id.items():
        sel = tid == i
        if sel.any():
            _paint_lane(img, lay, lay.bar_rows[t], lay.legend, kid[sel], start[sel], end[sel])


def render_timeline_png(events: Sequence[TraceEvent], path: str | Path, *,
                        spans: Sequence[Span] = (), title: str = "",
                        width: int | None = None) -> Path:
    """Draw ``events`` (a :class:`~tessera.sim.SimResult` ``trace``) as a PNG timeline.

    One lane per track, in the order of :data:`tessera.config.MODULES` with compute-unit
    sub-tracks after their module; a bar per instruction coloured by
    :func:`instruction_kind` (see :data:`PALETTE`); with ``spans`` (``(layer, start
    cycle, end cycle)``) a top lane of layer boxes, overlapping spans on extra rows, each
    labelled with its name where it fits and otherwise with a number listed with the
    full name in a key below the legend (:func:`box_labels`); a cycle axis from 0 with
    1/2/5 ticks; a legend. ``width`` is the image width in pixels; None sizes it to the
    number of layers (:data:`AUTO_WIDTH`). The height follows from the lanes and the key.

    An empty ``events`` gives a valid picture with empty lanes; ``None`` (no trace
    recorded), a span ending before it starts, or a width too small for the labels
    raise :class:`TimelineError`. Returns ``path`` as a :class:`~pathlib.Path`.
    """
    events = _check_events(events)
    spans = _check_spans(spans)
    lay = _layout(events, spans, title, width)
    img = blank_chart(lay, title, lay.lane_rows, _LANE_H)
    # grid and ticks first, so bars cover the grid and idle stretches show it
    step = max(1, round(nice_step(lay.t_max, lay.plot_w)))
    paint_axis(img, lay, lay.lane_rows[lay.tracks[0]][0], lay.axis_y, step, "cycles",
               _cycle_label)
    if events:
        _paint_tracks(img, lay, events)
    if lay.layer_rows is not None:
        _paint_layers(img, lay, spans)
    paint_legend(img, {k: [_colour(k)] for k in lay.legend}, lay.plot_x0, lay.legend_y)
    if not events:
        draw_text(img, lay.plot_x0, lay.legend_y + 1, "no instructions traced", _TEXT)
    paint_key(img, lay.key, lay.plot_x0, lay.key_y)
    return write_png(img, path)


# --------------------------------------------------------------------------- Perfetto

def perfetto_trace(events: Sequence[TraceEvent], config: HwConfig, *,
                   spans: Sequence[Span] = ()) -> dict[str, Any]:
    """:func:`tessera.sim.stats.chrome_trace` of ``events`` plus a ``layers`` track with
    one slice per span, timestamps converted the same way (microseconds at
    ``config.clock_mhz``).

    The layers track sorts first. Perfetto needs the slices of one track to nest, so
    overlapping spans (pipelined layers) go on extra tracks ``layers 2``, ``layers 3``...
    Each slice's ``args`` keep the exact cycles.
    """
    events = _check_events(events)
    spans = _check_spans(spans)
    trace = chrome_trace(list(events), config)
    if not spans:
        return trace
    out = trace["traceEvents"]
    us = 1.0 / config.clock_mhz
    first = 1 + max((ev["tid"] for ev in out), default=-1)
    rows = _span_rows(spans, max_rows=len(spans))
    for row in range(max(rows) + 1):
        out += track_metadata(first + row, "layers" if row == 0 else f"layers {row + 1}",
                              -100 + row)
    for (name, start, end), row in zip(spans, rows, strict=True):
        out.append({"name": name, "cat": "layer", "ph": "X", "pid": 0, "tid": first + row,
                    "ts": start * us, "dur": (end - start) * us,
                    "args": {"start_cycle": start, "end_cycle": end, "cycles": end - start}})
    return trace


def track_metadata(tid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    """The Perfetto metadata events naming track ``tid`` (of process 0) and placing it."""
    return [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}},
            {"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid,
             "args": {"sort_index": sort_index}}]


def write_perfetto_trace(events: Sequence[TraceEvent], config: HwConfig, path: str | Path, *,
                         spans: Sequence[Span] = ()) -> Path:
    """Write :func:`perfetto_trace` as JSON (open it at https://ui.perfetto.dev);
    returns ``path`` as a :class:`~pathlib.Path`."""
    path = Path(path)
    path.write_text(json.dumps(perfetto_trace(events, config, spans=spans)))
    return path
