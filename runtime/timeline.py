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

An empty event list is not an error: it gives a valid image with empty lanes (and the
layer boxes, if any), because a run that executed nothing is still a run worth
showing next to others. ``events=None`` (a run simulated without ``trace=True``)
raises :class:`TimelineError`.
"""
from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tessera.config import MODULES, HwConfig
from tessera.errors import TimelineError
from tessera.sim.stats import TraceEvent, chrome_trace

__all__ = ["MIN_ALPHA", "PALETTE", "Span", "instruction_kind", "perfetto_trace",
           "render_timeline_png", "write_perfetto_trace", "write_png"]

#: ``(layer name, start cycle, end cycle)``.
Span = tuple[str, int, int]


# --------------------------------------------------------------------------- colours

RGB = tuple[int, int, int]

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


# --------------------------------------------------------------------------- font

# 5x7 glyphs of ASCII 32..126, five column bytes each (bit 0 = top row), the classic
# HD44780-style character-LCD font.
_FONT_HEX = (
    "0000000000 00005F0000 0007000700 147F147F14 242A7F2A12 2313086462 3649552250 0005030000 "
    "001C224100 0041221C00 14083E0814 08083E0808 0050300000 0808080808 0060600000 2010080402 "
    "3E5149453E 00427F4000 4261514946 2141454B31 1814127F10 2745454539 3C4A494930 0171090503 "
    "3649494936 064949291E 0036360000 0056360000 0814224100 1414141414 0041221408 0201510906 "
    "324979413E 7E1111117E 7F49494936 3E41414122 7F4141221C 7F49494941 7F09090901 3E4149497A "
    "7F0808087F 00417F4100 2040413F01 7F08142241 7F40404040 7F020C027F 7F0408107F 3E4141413E "
    "7F09090906 3E4151215E 7F09192946 4649494931 01017F0101 3F4040403F 1F2040201F 3F4038403F "
    "6314081463 0708700807 6151494543 007F414100 0204081020 0041417F00 0402010204 4040404040 "
    "0001020400 2054545478 7F48444438 3844444420 384444487F 3854545418 087E090102 0C5252523E "
    "7F08040478 00447D4000 2040443D00 7F10284400 00417F4000 7C04180478 7C08040478 3844444438 "
    "7C14141408 081414187C 7C08040408 4854545420 043F444020 3C4040207C 1C2040201C 3C4030403C "
    "4428102844 0C5050503C 4464544C44 0008364100 00007F0000 0041360800 0804081008"
)
_GLYPH_W, _GLYPH_H, _ADVANCE = 5, 7, 6


def _build_font() -> np.ndarray:
    cols = np.frombuffer(bytes.fromhex(_FONT_HEX.replace(" ", "")), np.uint8).reshape(95, 5)
    rows = np.arange(_GLYPH_H, dtype=np.uint8)
    # (glyph, row, column) booleans, one blank spacing column appended
    glyphs = ((cols[:, None, :] >> rows[None, :, None]) & 1).astype(bool)
    return np.concatenate([glyphs, np.zeros((95, _GLYPH_H, 1), bool)], axis=2)


_FONT = _build_font()


def _text_width(text: str, scale: int = 1) -> int:
    return max(0, len(text) * _ADVANCE - 1) * scale


def _draw_text(img: np.ndarray, x: int, y: int, text: str, colour: RGB, *, scale: int = 1,
               clip_x: int | None = None) -> None:
    """Paint ``text`` with its top-left corner at (x, y), clipped to the image and to
    columns < ``clip_x``; characters outside printable ASCII show as ``?``."""
    if not text:
        return
    codes = np.frombuffer(text.encode("ascii", "replace"), np.uint8).astype(np.int64)
    codes = np.where((codes < 32) | (codes > 126), ord("?"), codes) - 32
    mask = _FONT[codes].transpose(1, 0, 2).reshape(_GLYPH_H, -1)[:, :-1]
    if scale > 1:
        mask = mask.repeat(scale, axis=0).repeat(scale, axis=1)
    h, w = mask.shape
    right = min(img.shape[1], x + w, clip_x if clip_x is not None else img.shape[1])
    x0, y0, y1 = max(x, 0), max(y, 0), min(img.shape[0], y + h)
    if right <= x0 or y1 <= y0:
        return
    sub = mask[y0 - y:y1 - y, x0 - x:right - x]
    img[y0:y1, x0:right][sub] = colour


def _truncate(text: str, width_px: int) -> str:
    fits = (width_px + 1) // _ADVANCE
    return text if len(text) <= fits else text[:max(0, fits)]


# --------------------------------------------------------------------------- PNG

def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def write_png(rgb: np.ndarray, path: str | Path) -> Path:
    """Write an (height, width, 3) uint8 array as an 8-bit RGB PNG; returns the path.

    Every scanline uses filter 0 (none): the picture is flat colour runs that zlib
    already shrinks well, and it keeps the encoder to a few vectorised lines.
    """
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or 0 in rgb.shape:
        raise TimelineError(f"write_png needs a non-empty (height, width, 3) array, "
                            f"not shape {rgb.shape}")
    h, w, _ = rgb.shape
    raw = np.zeros((h, 1 + 3 * w), np.uint8)
    raw[:, 1:] = rgb.reshape(h, 3 * w)
    png = (b"\x89PNG\r\n\x1a\n"
           + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + _chunk(b"IDAT", zlib.compress(raw.tobytes(), 6))
           + _chunk(b"IEND", b""))
    path = Path(path)
    path.write_bytes(png)
    return path


# --------------------------------------------------------------------------- layout

_PAD = 8
_LANE_H = 16          # one track lane
_BAR_INSET = 2        # blank rows above and below the bars inside a lane
_LANE_GAP = 3
_LAYER_ROW_H = 13     # one row of layer boxes (7-px text + margins)
_MAX_LAYER_ROWS = 4
_LINE_H = _GLYPH_H + 4
_TITLE_SCALE = 2


@dataclass
class _Layout:
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

    def x_of(self, cycle: float) -> int:
        """The pixel column holding ``cycle``."""
        return self.plot_x0 + min(self.plot_w - 1, int(cycle * self.plot_w / self.t_max))


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


def _layout(events: Sequence[TraceEvent], spans: Sequence[Span], title: str,
            width: int) -> _Layout:
    tracks = _tracks(events)
    label_w = max(_text_width(t) for t in [*tracks, "layers", "cycles"]) + 2 * _PAD
    if width < label_w + 64 + _PAD:
        raise TimelineError(f"a timeline needs width >= {label_w + 64 + _PAD} pixels "
                            f"(the labels take {label_w}), not {width}")
    t_max = max([1, *(e.end for e in events), *(s[2] for s in spans)])
    y = _PAD
    if title:
        y += _GLYPH_H * _TITLE_SCALE + _PAD
    layer_rows, span_row = None, []
    if spans:
        span_row = _span_rows(spans, _MAX_LAYER_ROWS)
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
    legend_y = y
    legend_lines = _legend_lines(kinds, label_w, width)
    y += max(1, legend_lines) * _LINE_H + _PAD
    return _Layout(width=width, height=y, plot_x0=label_w, plot_w=width - label_w - _PAD,
                   t_max=t_max, tracks=tracks, bar_rows=bar_rows, lane_rows=lane_rows,
                   layer_rows=layer_rows, span_row=span_row, axis_y=axis_y,
                   legend_y=legend_y, legend=kinds)


def _legend_items(kinds: list[str], x0: int, width: int) -> list[tuple[str, int, int]]:
    """(kind, x, line) of every legend entry, wrapped at the image's right edge."""
    out, x, line = [], x0, 0
    for k in kinds:
        w = 12 + _text_width(k) + 14
        if x + w > width - _PAD and x > x0:
            x, line = x0, line + 1
        out.append((k, x, line))
        x += w
    return out


def _legend_lines(kinds: list[str], x0: int, width: int) -> int:
    items = _legend_items(kinds, x0, width)
    return items[-1][2] + 1 if items else 0


def _nice_step(t_max: int, plot_w: int) -> int:
    """A 1/2/5 x 10^k cycle step giving a tick about every 100 pixels."""
    raw = max(1.0, t_max / max(1, plot_w // 100))
    mag = 10 ** int(np.floor(np.log10(raw)))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return int(m * mag)
    return int(10 * mag)


def _cycle_label(c: int) -> str:
    if c >= 10_000_000:
        return f"{c / 1e6:g}M"
    if c >= 10_000:
        return f"{c / 1e3:g}k"
    return str(c)


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
    for i, ((name, start, end), row) in enumerate(zip(spans, lay.span_row, strict=True)):
        x0 = lay.x_of(start)
        x1 = max(x0 + 1, lay.x_of(end) if end < lay.t_max else lay.plot_x0 + lay.plot_w)
        y0 = top + row * _LAYER_ROW_H
        y1 = y0 + _LAYER_ROW_H - 1
        # neighbours alternate fills so adjacent layers stay apart when boxes are thin
        img[y0:y1, x0:x1] = _LAYER_FILL[i % 2]
        img[y0, x0:x1] = img[y1 - 1, x0:x1] = _LAYER_EDGE
        img[y0:y1, x0] = img[y0:y1, x1 - 1] = _LAYER_EDGE
        label = _truncate(name, x1 - x0 - 4)
        if label:
            _draw_text(img, x0 + 2, y0 + 3, label, _TEXT, clip_x=x1 - 1)


def render_timeline_png(events: Sequence[TraceEvent], path: str | Path, *,
                        spans: Sequence[Span] = (), title: str = "",
                        width: int = 1600) -> Path:
    """Draw ``events`` (a :class:`~tessera.sim.SimResult` ``trace``) as a PNG timeline.

    One lane per track, in the order of :data:`tessera.config.MODULES` with compute-unit
    sub-tracks after their module; a bar per instruction coloured by
    :func:`instruction_kind` (see :data:`PALETTE`); with ``spans`` (``(layer, start
    cycle, end cycle)``) a top lane of labelled layer boxes, overlapping spans on extra
    rows; a cycle axis from 0 with 1/2/5 ticks; a legend. ``width`` is the image width
    in pixels (the height follows from the number of lanes).

    An empty ``events`` gives a valid picture with empty lanes; ``None`` (no trace
    recorded), a span ending before it starts, or a width too small for the labels
    raise :class:`TimelineError`. Returns ``path`` as a :class:`~pathlib.Path`.
    """
    events = _check_events(events)
    spans = _check_spans(spans)
    lay = _layout(events, spans, title, width)
    img = np.full((lay.height, lay.width, 3), 255, np.uint8)
    px0, px1 = lay.plot_x0, lay.plot_x0 + lay.plot_w

    if title:
        _draw_text(img, _PAD, _PAD, title, _TEXT, scale=_TITLE_SCALE, clip_x=width - _PAD)
    if lay.layer_rows is not None:
        _draw_text(img, _PAD, lay.layer_rows[0] + 3, "layers", _TEXT)
    for t in lay.tracks:
        y0, y1 = lay.lane_rows[t]
        img[y0:y1, px0:px1] = _LANE_BG
        _draw_text(img, _PAD, y0 + (_LANE_H - _GLYPH_H) // 2, t, _TEXT)

    # grid and ticks first, so bars cover the grid and idle stretches show it
    step = _nice_step(lay.t_max, lay.plot_w)
    lanes_top = lay.lane_rows[lay.tracks[0]][0]
    ay = lay.axis_y
    img[ay, px0:px1] = _AXIS
    _draw_text(img, _PAD, ay + 5, "cycles", _TEXT)
    for c in range(0, lay.t_max + 1, step):
        x = lay.x_of(c) if c < lay.t_max else px1 - 1
        column = img[lanes_top:ay, x]
        column[(column == _LANE_BG).all(axis=1)] = _GRID
        img[ay:ay + 4, x] = _AXIS
        label = _cycle_label(c)
        lx = min(x - _text_width(label) // 2, width - 2 - _text_width(label))
        _draw_text(img, max(px0, lx), ay + 6, label, _TEXT)

    if events:
        track_id = {t: i for i, t in enumerate(lay.tracks)}
        kind_index = {k: i for i, k in enumerate(lay.legend)}
        n = len(events)
        tid = np.empty(n, np.int64)
        kid = np.empty(n, np.int64)
        start = np.empty(n, np.float64)
        end = np.empty(n, np.float64)
        # the one per-event Python loop; a name's kind is looked up once, not per event
        kid_of = {n: kind_index[instruction_kind(n)] for n in {e.name for e in events}}
        for i, e in enumerate(events):
            tid[i] = track_id[e.track]
            kid[i] = kid_of[e.name]
            start[i] = e.start
            end[i] = max(e.start, e.end)
        for t, i in track_id.items():
            sel = tid == i
            if sel.any():
                _paint_lane(img, lay, lay.bar_rows[t], lay.legend, kid[sel], start[sel], end[sel])

    if lay.layer_rows is not None:
        _paint_layers(img, lay, spans)

    for kind, x, line in _legend_items(lay.legend, px0, width):
        y = lay.legend_y + line * _LINE_H
        img[y:y + _GLYPH_H + 1, x:x + 10] = _colour(kind)
        _draw_text(img, x + 14, y + 1, kind, _TEXT)
    if not events:
        _draw_text(img, px0, lay.legend_y + 1, "no instructions traced", _TEXT)
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
        tid = first + row
        out.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
                    "args": {"name": "layers" if row == 0 else f"layers {row + 1}"}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid,
                    "args": {"sort_index": -100 + row}})
    for (name, start, end), row in zip(spans, rows, strict=True):
        out.append({"name": name, "cat": "layer", "ph": "X", "pid": 0, "tid": first + row,
                    "ts": start * us, "dur": (end - start) * us,
                    "args": {"start_cycle": start, "end_cycle": end, "cycles": end - start}})
    return trace


def write_perfetto_trace(events: Sequence[TraceEvent], config: HwConfig, path: str | Path, *,
                         spans: Sequence[Span] = ()) -> Path:
    """Write :func:`perfetto_trace` as JSON (open it at https://ui.perfetto.dev);
    returns ``path`` as a :class:`~pathlib.Path`."""
    path = Path(path)
    path.write_text(json.dumps(perfetto_trace(events, config, spans=spans)))
    return path
