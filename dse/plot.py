"""The Pareto plot of a sweep: one panel per resource (LUT, DSP, BRAM as a share of the
part, the part's capacity dashed; without synthesis, the core's peak MACs per cycle), each
model's projected latency up the side, the Pareto set's points filled, points that do not
fit crossed. The set is over every objective at once, so a panel shows its projection.

Drawn with the numpy raster toolkit of :mod:`tessera.runtime.png`, like the timelines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from tessera.runtime.png import GLYPH_H, RGB, draw_text, text_width, write_png

from .sweep import PARETO_RESOURCES, PointResult, Sweep

__all__ = ["write_plot"]

PANEL_W, PANEL_H, MARGIN_L, MARGIN_B, GAP, TITLE_H = 320, 220, 64, 40, 24, 36
INK, GRID, MUTED, FRONT, MISS = (30, 30, 30), (225, 225, 225), (150, 150, 150), \
    (200, 40, 40), (120, 120, 220)


@dataclass(frozen=True)
class _Panel:
    """A plot area (pixels) and its data ranges."""

    x0: int
    y0: int
    x_range: tuple[float, float]
    y_range: tuple[float, float]

    def at(self, x: float, y: float) -> tuple[int, int]:
        (xa, xb), (ya, yb) = self.x_range, self.y_range
        px = self.x0 + (x - xa) / (xb - xa) * PANEL_W
        py = self.y0 + PANEL_H - (y - ya) / (yb - ya) * PANEL_H
        return int(round(px)), int(round(py))


def _span(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.1 or 1.0
    return lo - pad, hi + pad


def _ticks(lo: float, hi: float, n: int = 4) -> tuple[list[float], int]:
    """About ``n`` round ticks in ``[lo, hi]``, and the decimals their step needs."""
    raw = (hi - lo) / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    ticks = [float(t) for t in np.arange(math.ceil(lo / step) * step, hi, step)]
    return ticks, max(0, -math.floor(math.log10(step) + 1e-9))


def _label(v: float, decimals: int) -> str:
    return f"{v:,.{decimals}f}"


def _line(img: np.ndarray, a: tuple[int, int], b: tuple[int, int], colour: RGB) -> None:
    n = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1) + 1
    xs = np.linspace(a[0], b[0], n).round().astype(int)
    ys = np.linspace(a[1], b[1], n).round().astype(int)
    ok = (xs >= 0) & (xs < img.shape[1]) & (ys >= 0) & (ys < img.shape[0])
    img[ys[ok], xs[ok]] = colour


def _mark(img: np.ndarray, p: tuple[int, int], colour: RGB, *, filled: bool, cross: bool
          ) -> None:
    x, y = p
    if cross:
        _line(img, (x - 3, y - 3), (x + 3, y + 3), colour)
        _line(img, (x - 3, y + 3), (x + 3, y - 3), colour)
    elif filled:
        img[max(y - 3, 0):y + 4, max(x - 3, 0):x + 4] = colour
    else:
        for a, b in (((-3, -3), (3, -3)), ((3, -3), (3, 3)), ((3, 3), (-3, 3)),
                     ((-3, 3), (-3, -3))):
            _line(img, (x + a[0], y + a[1]), (x + b[0], y + b[1]), colour)


def _axes(img: np.ndarray, panel: _Panel, xlabel: str, ylabel: str) -> None:
    ticks, decimals = _ticks(*panel.x_range)
    for t in ticks:
        x, _ = panel.at(t, panel.y_range[0])
        _line(img, (x, panel.y0), (x, panel.y0 + PANEL_H), GRID)
        text = _label(t, decimals)
        draw_text(img, x - text_width(text) // 2, panel.y0 + PANEL_H + 4, text, INK)
    ticks, decimals = _ticks(*panel.y_range)
    for t in ticks:
        _, y = panel.at(panel.x_range[0], t)
        _line(img, (panel.x0, y), (panel.x0 + PANEL_W, y), GRID)
        text = _label(t, decimals)
        draw_text(img, panel.x0 - text_width(text) - 4, y - GLYPH_H // 2, text, INK)
    box = [(panel.x0, panel.y0), (panel.x0 + PANEL_W, panel.y0),
           (panel.x0 + PANEL_W, panel.y0 + PANEL_H), (panel.x0, panel.y0 + PANEL_H)]
    for a, b in zip(box, box[1:] + box[:1]):
        _line(img, a, b, INK)
    draw_text(img, panel.x0 + (PANEL_W - text_width(xlabel)) // 2,
              panel.y0 + PANEL_H + 18, xlabel, INK)
    draw_text(img, panel.x0, panel.y0 - GLYPH_H - 4, ylabel, INK)


def _x_axes(sweep: Sweep) -> list[tuple[str, Callable[[PointResult], float | None]]]:
    if not sweep.synthesized:
        return [("peak MACs per cycle",
                 lambda r: float(r.point.config.peak_macs_per_cycle))]

    def percent(res: str) -> Callable[[PointResult], float | None]:
        def get(r: PointResult) -> float | None:
            share = r.share(res)
            return None if share is None else 100.0 * share
        return get
    return [(f"{res} used (% of the part)", percent(res)) for res in PARETO_RESOURCES]


def _draw_panel(img: np.ndarray, x0: int, y0: int, sweep: Sweep, model: str,
                x_axis: tuple[str, Callable[[PointResult], float | None]],
                front: set[int]) -> None:
    name, x_of = x_axis
    pts = [(r, x_of(r), r.models.get(model, {}).get("latency_ms")) for r in sweep.results]
    pts = [(r, x, y) for r, x, y in pts if x is not None and y is not None]
    if not pts:
        return
    panel = _Panel(x0, y0, _span([x for _, x, _ in pts]), _span([y for _, _, y in pts]))
    _axes(img, panel, name, f"{model}: projected latency (ms)")
    if sweep.synthesized and panel.x_range[0] < 100.0 < panel.x_range[1]:
        x, _ = panel.at(100.0, 0.0)       # the part's capacity: points right of it do not fit
        for y in range(panel.y0, panel.y0 + PANEL_H, 6):
            _line(img, (x, y), (x, min(y + 3, panel.y0 + PANEL_H)), MISS)
    for r, x, y in pts:
        colour = FRONT if id(r) in front else (MISS if r.fits is False else MUTED)
        _mark(img, panel.at(x, y), colour, filled=id(r) in front, cross=r.fits is False)


def write_plot(sweep: Sweep, path: str | Path) -> Path:
    """The plot as a PNG at ``path``: a row of panels per model."""
    axes = _x_axes(sweep)
    cell_w, cell_h = MARGIN_L + PANEL_W + GAP, PANEL_H + MARGIN_B + GAP
    img = np.full((TITLE_H + cell_h * len(sweep.models), cell_w * len(axes) + GAP, 3), 255,
                  np.uint8)
    draw_text(img, GAP, 6, f"tessera dse: {len(sweep.results)} points of "
              f"{sweep.space.base.name} on {sweep.part}", INK)
    draw_text(img, GAP, 18, "filled red: the Pareto set (latency and all three resources); "
              "grey: other points; blue x: does not fit (dashed: the part's capacity)", INK)
    front = {id(r) for r in sweep.pareto()}
    for row, model in enumerate(sweep.models):
        for col, axis in enumerate(axes):
            _draw_panel(img, col * cell_w + MARGIN_L, TITLE_H + row * cell_h + GAP, sweep,
                        model, axis, front)
    return write_png(img, path)
