"""PNG timelines and Perfetto traces with layer spans (tessera.runtime.timeline).

The PNG is checked by decoding it here with zlib alone: chunk CRCs, IHDR, the
scanlines, then the colour of known bars at the columns the layout puts them in.
"""
from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from tessera.compiler import Conv2d, compile_ops
from tessera.config import MODULES, PRESETS
from tessera.errors import TesseraError
from tessera.runtime import png, timeline
from tessera.errors import TimelineError
from tessera.runtime.timeline import (MIN_ALPHA, PALETTE, instruction_kind,
                                      perfetto_trace, render_timeline_png, write_perfetto_trace,
                                      write_png)
from tessera.sim import simulate
from tessera.sim.stats import TraceEvent, chrome_trace

TINY = PRESETS["tiny"]


def read_png(path) -> np.ndarray:
    """Decode an 8-bit RGB, non-interlaced PNG as written by write_png, checking every CRC."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(tag + body), f"bad CRC in {tag!r}"
        chunks.append((tag, body))
        pos += 12 + length
    assert pos == len(data)
    tags = [t for t, _ in chunks]
    assert tags[0] == b"IHDR" and tags[-1] == b"IEND" and b"IDAT" in tags
    w, h, depth, colour_type, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour_type, comp, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(b for t, b in chunks if t == b"IDAT"))
    assert len(raw) == h * (1 + 3 * w)
    rows = np.frombuffer(raw, np.uint8).reshape(h, 1 + 3 * w)
    assert (rows[:, 0] == 0).all()   # filter "none" on every scanline
    return rows[:, 1:].reshape(h, w, 3)


def assert_key_drawn(img, lay) -> None:
    """Every key line is in the image, glyph for glyph, where the layout puts it."""
    items = timeline._key_items(lay.key, lay.plot_x0, lay.width)
    assert items
    for text, x, line in items:
        y = lay.key_y + 1 + line * timeline._LINE_H
        want = np.zeros((7, png.text_width(text), 3), np.uint8)
        png.draw_text(want, 0, 0, text, (255, 255, 255))
        mask = want[..., 0] == 255
        got = img[y:y + 7, x:x + want.shape[1]]
        assert (got[mask] == timeline._TEXT).all(), text
        assert (got[~mask] != timeline._TEXT).any(-1).all(), text


@pytest.fixture(scope="module")
def sim_run():
    """Two small convolutions on tiny, simulated with a trace; spans split at the
    first instruction of the second layer's stream."""
    rng = np.random.default_rng(7)
    x = rng.integers(-128, 128, (1, 4, 8, 8), dtype=np.int8)
    ops = [Conv2d("c1", "x", "y", rng.integers(-128, 128, (8, 4, 3, 3), dtype=np.int8),
                  padding=1),
           Conv2d("c2", "y", "z", rng.integers(-128, 128, (8, 8, 3, 3), dtype=np.int8),
                  padding=1)]
    compiled = compile_ops(ops, {"x": x.shape}, TINY)
    result = simulate(compiled.bind({"x": x}), trace=True)
    events = result.trace
    assert events
    half = len(compiled.program.instructions) // 2
    mid = max(e.end for e in events if e.index < half)
    spans = [("c1", 0, mid), ("c2", mid, result.stats.cycles)]
    return events, spans, result


def _pixel(img, lay, track, cycle):
    y0, y1 = lay.bar_rows[track]
    return tuple(int(v) for v in img[(y0 + y1) // 2, lay.x_of(cycle)])


# --------------------------------------------------------------------------- PNG

def test_png_of_a_simulated_run(sim_run, tmp_path):
    events, spans, result = sim_run
    path = render_timeline_png(events, tmp_path / "run.png", spans=spans, title="two convs")
    assert path == tmp_path / "run.png"
    img = read_png(path)
    lay = timeline._layout(events, spans, "two convs", 1600)
    assert img.shape == (lay.height, 1600, 3)
    # lanes in MODULES order, compute units right after compute
    assert lay.tracks == ["fetch", "load", "compute", "compute.gemm", "compute.alu", "store"]
    assert lay.t_max == result.stats.cycles
    # the middle of the longest GEMM is a fully busy column: exactly the GEMM colour
    gemm = max((e for e in events if e.name == "GEMM"), key=lambda e: e.end - e.start)
    assert (gemm.end - gemm.start) * lay.plot_w / lay.t_max > 3
    assert _pixel(img, lay, "compute.gemm", (gemm.start + gemm.end) / 2) == PALETTE["GEMM"]
    # and the layer lane has a box over each span
    y0 = lay.layer_rows[0] + 6
    for i, (_, start, end) in enumerate(spans):
        assert tuple(img[y0, lay.x_of((start + end) / 2)]) == timeline._LAYER_FILL[i % 2]


def test_known_bars_have_their_colour_at_their_columns(tmp_path):
    events = [TraceEvent("load", "LOAD inp", 0, 100, 300),
              TraceEvent("load", "LOAD wgt", 1, 300, 400),
              TraceEvent("compute", "GEMM", 2, 300, 700, "gemm"),
              TraceEvent("compute", "ALU MAX", 3, 700, 1000, "alu"),
              TraceEvent("store", "STORE out", 4, 900, 1000)]
    img = read_png(render_timeline_png(events, tmp_path / "t.png", width=1000))
    lay = timeline._layout(events, [], "", 1000)
    assert lay.t_max == 1000 and lay.plot_x0 > 0
    assert _pixel(img, lay, "load", 200) == PALETTE["LOAD inp"]
    assert _pixel(img, lay, "load", 350) == PALETTE["LOAD wgt"]
    assert _pixel(img, lay, "compute.gemm", 500) == PALETTE["GEMM"]
    assert _pixel(img, lay, "compute.alu", 850) == PALETTE["ALU"]
    assert _pixel(img, lay, "store", 950) == PALETTE["STORE"]
    # outside the bars: lane background, no bar colour
    lane_bg = timeline._LANE_BG
    assert _pixel(img, lay, "load", 50) == lane_bg
    assert _pixel(img, lay, "load", 450) == lane_bg
    assert _pixel(img, lay, "compute.gemm", 150) == lane_bg
    # the exact edges: the bar starts in the column holding cycle 100 and the column
    # before it is empty (the first column of a wide bar is a darker shade)
    y = sum(lay.bar_rows["load"]) // 2
    first = lay.x_of(100)
    assert tuple(img[y, first - 1]) == lane_bg
    assert tuple(img[y, first]) != lane_bg
    assert tuple(img[y, first + 2]) == PALETTE["LOAD inp"]
    # bars stay inside their lane's rows
    y0, y1 = lay.lane_rows["fetch"]
    assert (img[y0:y1, lay.plot_x0:lay.plot_x0 + lay.plot_w] != PALETTE["LOAD inp"]).any(-1).all()


def test_sub_pixel_instructions_merge_into_columns(tmp_path):
    """100 one-cycle instructions per pixel column: fully busy columns get the exact colour,
    a lone short instruction in a long column still shows (faded, never invisible)."""
    width = 400
    lay = timeline._layout([TraceEvent("load", "LOAD inp", 0, 0, 1)], [], "", width)
    t_max = lay.plot_w * 100
    events = [TraceEvent("compute", "GEMM", i, i, i + 1, "gemm") for i in range(t_max // 2)]
    events.append(TraceEvent("load", "LOAD inp", len(events), t_max // 2 + 50,
                             t_max // 2 + 51))
    events.append(TraceEvent("store", "STORE out", len(events), t_max - 1, t_max))
    img = read_png(render_timeline_png(events, tmp_path / "m.png", width=width))
    lay = timeline._layout(events, [], "", width)
    assert lay.t_max == t_max
    assert _pixel(img, lay, "compute.gemm", t_max // 4) == PALETTE["GEMM"]
    assert _pixel(img, lay, "compute.gemm", 3 * t_max // 4) == timeline._LANE_BG
    lone = np.array(_pixel(img, lay, "load", t_max // 2 + 50), float)
    bg, col = np.array(timeline._LANE_BG, float), np.array(PALETTE["LOAD inp"], float)
    np.testing.assert_allclose(lone, bg + (col - bg) * MIN_ALPHA, atol=1)


def test_many_events_render(tmp_path):
    rng = np.random.default_rng(0)
    starts = np.cumsum(rng.integers(1, 50, 50_000))
    tracks = [("load", "LOAD inp", ""), ("compute", "GEMM", "gemm"), ("store", "STORE out", "")]
    durations = rng.integers(1, 40, starts.size)
    events = [TraceEvent(*tracks[i % 3][:2], i, int(s), int(s) + int(d), tracks[i % 3][2])
              for i, (s, d) in enumerate(zip(starts, durations, strict=True))]
    img = read_png(render_timeline_png(events, tmp_path / "big.png", width=1200,
                                       spans=[("all", 0, int(starts[-1]))]))
    assert img.shape[1] == 1200


def test_empty_events_give_empty_lanes(tmp_path):
    img = read_png(render_timeline_png([], tmp_path / "e.png", spans=[("l0", 0, 10)]))
    lay = timeline._layout([], [("l0", 0, 10)], "", 1600)
    assert img.shape == (lay.height, 1600, 3)
    assert lay.tracks == list(MODULES)
    for t in MODULES:
        y0, y1 = lay.bar_rows[t]
        lane = img[y0:y1, lay.plot_x0:lay.plot_x0 + lay.plot_w].reshape(-1, 3)
        assert {tuple(p) for p in lane} <= {timeline._LANE_BG, timeline._GRID}


def test_errors(tmp_path):
    with pytest.raises(TimelineError, match="trace=True"):
        render_timeline_png(None, tmp_path / "x.png")
    with pytest.raises(TimelineError, match="start <= end"):
        render_timeline_png([], tmp_path / "x.png", spans=[("bad", 10, 5)])
    with pytest.raises(TimelineError, match="width"):
        render_timeline_png([], tmp_path / "x.png", width=50)
    with pytest.raises(TesseraError):
        perfetto_trace(None, TINY)
    assert issubclass(TimelineError, TesseraError)
    assert not (tmp_path / "x.png").exists()


def test_layer_names_are_never_cut(tmp_path):
    """A model of 200 layers with long names: the image widens, a name too long for its
    box becomes a key number, and the key lists every such name in full."""
    spans = [("backbone/stem_convolution_with_batchnorm_folded", 0, 30_000)]
    spans += [(f"backbone/stage_{i // 10}/block_{i}/conv", 30_000 + 100 * i, 30_100 + 100 * i)
              for i in range(200)]
    img = read_png(render_timeline_png([], tmp_path / "k.png", spans=spans))
    lay = timeline._layout([], spans, "", None)
    assert img.shape[:2] == (lay.height, lay.width)
    assert lay.width == timeline.AUTO_WIDTH[1]
    assert timeline._layout([], spans[:40], "", None).width < lay.width
    number = {name: n for n, name in lay.key}
    assert lay.labels[0] == spans[0][0] and spans[0][0] not in number
    assert len(number) == 200
    for (name, _, _), label in zip(spans, lay.labels, strict=True):
        assert label == name or label in {str(number[name]), ""}
    assert_key_drawn(img, lay)
    # the layer boxes show their numbers where those fit
    x0, x1 = lay.box_x(*spans[1][1:])
    assert x1 - x0 > png.text_width("1") + 4 and lay.labels[1] == "1"


def test_overlapping_spans_get_their_own_rows(tmp_path):
    spans = [("a", 0, 100), ("b", 50, 150), ("c", 100, 200), ("d", 120, 130)]
    assert timeline._span_rows(spans, 4) == [0, 1, 0, 2]
    assert timeline._span_rows(spans, 2) == [0, 1, 0, 1]   # past the cap: the row freed first
    img = read_png(render_timeline_png([], tmp_path / "o.png", spans=spans, width=800))
    lay = timeline._layout([], spans, "", 800)
    assert lay.layer_rows[1] - lay.layer_rows[0] == 3 * timeline._LAYER_ROW_H
    assert img.shape[0] == lay.height


def test_write_png_and_font():
    assert png.FONT.shape == (95, 7, 6)
    assert not png.FONT[0].any()                 # space
    assert png.FONT[ord("|") - 32][:, 2].all()   # a full-height bar
    img = np.zeros((10, 40, 3), np.uint8)
    png.draw_text(img, 1, 1, "Hi\x01", (255, 0, 0))
    assert (img[..., 0] == 255).sum() > 10 and (img[..., 1] == 0).all()
    with pytest.raises(TimelineError):
        write_png(np.zeros((0, 3, 3), np.uint8), "unused.png")


def test_instruction_kind():
    assert instruction_kind("LOAD inp") == "LOAD inp"
    assert instruction_kind("ALU MAX") == "ALU"
    assert instruction_kind("STORE out") == "STORE"
    assert instruction_kind("GEMM") == "GEMM"


# --------------------------------------------------------------------------- Perfetto

def test_perfetto_trace_has_layer_slices(sim_run, tmp_path):
    events, spans, _ = sim_run
    trace = perfetto_trace(events, TINY, spans=spans)
    base = chrome_trace(events, TINY)
    # chrome_trace's events come first, unchanged
    assert trace["traceEvents"][:len(base["traceEvents"])] == base["traceEvents"]
    names = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "layers" in names and set(MODULES) <= set(names)
    assert names["layers"] not in {v for k, v in names.items() if k != "layers"}
    layers = [e for e in trace["traceEvents"] if e.get("cat") == "layer"]
    assert [e["name"] for e in layers] == ["c1", "c2"]
    us = 1.0 / TINY.clock_mhz
    for e, (_, start, end) in zip(layers, spans, strict=True):
        assert e["ph"] == "X" and e["tid"] == names["layers"]
        assert e["ts"] == pytest.approx(start * us)
        assert e["dur"] == pytest.approx((end - start) * us)
        assert (e["args"]["start_cycle"], e["args"]["end_cycle"]) == (start, end)
    # the GEMM slices use the same conversion, so layers line up with instructions
    gemm = next(e for e in trace["traceEvents"] if e["name"] == "GEMM")
    assert gemm["ts"] == pytest.approx(gemm["args"]["start_cycle"] * us)
    assert json.loads(json.dumps(trace)) == trace

    path = write_perfetto_trace(events, TINY, tmp_path / "t.json", spans=spans)
    assert json.loads(path.read_text()) == json.loads(json.dumps(trace))


def test_perfetto_overlapping_spans_and_no_spans():
    events = [TraceEvent("load", "LOAD inp", 0, 0, 10)]
    assert perfetto_trace(events, TINY) == chrome_trace(events, TINY)
    trace = perfetto_trace(events, TINY, spans=[("a", 0, 100), ("b", 50, 150)])
    names = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    slices = {e["name"]: e["tid"] for e in trace["traceEvents"] if e.get("cat") == "layer"}
    assert slices == {"a": names["layers"], "b": names["layers 2"]}
    assert perfetto_trace([], TINY, spans=[("a", 0, 1)])["traceEvents"][-1]["name"] == "a"
