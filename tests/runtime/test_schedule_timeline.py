"""PNG and Perfetto timelines of a board schedule (tessera.runtime.schedule_timeline).

The PNG is decoded with zlib alone (``read_png`` of test_timeline checks every CRC) and
read back at the pixels the layout puts each box, label and key line in.
"""
from __future__ import annotations

import json

import pytest

from tessera.errors import TesseraError, TimelineError
from tessera.runtime import schedule_timeline as st
from tessera.runtime import timeline
from tessera.runtime.schedule_timeline import (kind_colour, lane_order, render_schedule_png,
                                               schedule_perfetto, write_schedule_perfetto)
from tessera.schedule import ScheduledTask, Task, list_schedule
from tests.runtime.test_timeline import assert_key_drawn, read_png

MS = 1e-3
LONG = "encoder/densenet_block_3/conv_2x2_transition_layer_with_a_long_name"


def pipelined() -> list[ScheduledTask]:
    """Three frames on 2 cores and the accelerator, stage k of frame f beside stage k+1
    of frame f-1: the CNN segment of frame f+1 runs while the CPU decodes frame f."""
    out = []
    for f in range(3):
        t = f * 2 * MS
        out += [ScheduledTask(f"preprocess frame {f}", "CPU 1", t, t + 0.3 * MS, "cpu op", f),
                ScheduledTask("launch", "accelerator", t + 0.3 * MS, t + 0.35 * MS, "launch", f),
                ScheduledTask("cnn", "accelerator", t + 0.35 * MS, t + 2.3 * MS, "segment", f),
                ScheduledTask("copy out", "CPU 0", t + 2.3 * MS, t + 2.4 * MS, "transfer", f),
                ScheduledTask(LONG, "CPU 0", t + 2.4 * MS, t + 2.45 * MS, "cpu op", f),
                ScheduledTask("lstm decoder", "CPU 0", t + 2.45 * MS, t + 4.2 * MS, "cpu op", f)]
    return out


# --------------------------------------------------------------------------- PNG

def test_pipelined_schedule_png(tmp_path):
    tasks = pipelined()
    path = render_schedule_png(tasks, tmp_path / "s.png", title="3 frames")
    assert path == tmp_path / "s.png"
    img = read_png(path)
    lay = st._layout(tasks, "3 frames", None, None)
    assert img.shape == (lay.height, lay.width, 3) and lay.width == 1600
    assert lay.lanes == ["CPU 0", "CPU 1", "accelerator"]
    assert lay.unit == ("ms", 1e3) and lay.frames == [0, 1, 2]
    # lanes top to bottom in that order, each box inside its lane
    tops = [lay.lane_rows[ln][0] for ln in lay.lanes]
    assert tops == sorted(tops)
    for t, (x0, x1, y0, y1) in zip(tasks, lay.boxes, strict=True):
        ly0, ly1 = lay.lane_rows[t.lane]
        assert ly0 <= y0 < y1 <= ly1
        assert (x0, x1) == lay.box_x(t.start, t.end)
        # above the label, inside the edge: the kind's colour in this frame's shade
        if x1 - x0 >= 6:
            assert tuple(img[y0 + 2, (x0 + x1) // 2]) == kind_colour(t.kind, t.frame)
    # frames alternate shades, so the overlap of two frames shows
    assert kind_colour("segment", 0) != kind_colour("segment", 1)
    assert kind_colour("segment", 0) == kind_colour("segment", 2) == st.SCHEDULE_PALETTE["segment"]
    # the legend shows each kind in both shades, in the palette's order
    items = timeline._legend_items(list(st._legend(lay)), lay.plot_x0, lay.width)
    assert [text for text, _, _ in items][:4] == ["segment", "cpu op", "transfer", "launch"]
    for text, x, line in items[:4]:
        y = lay.legend_y + line * timeline._LINE_H + 3
        assert tuple(img[y, x + 2]) == kind_colour(text, 0)
        assert tuple(img[y, x + 7]) == kind_colour(text, 1)
    # every lane's rows hold the colours of the kinds run on it, and no others
    for lane in lay.lanes:
        y0, y1 = lay.lane_rows[lane]
        band = {tuple(p) for p in img[y0:y1, lay.plot_x0:lay.plot_x0 + lay.plot_w].reshape(-1, 3)}
        mine = {kind_colour(t.kind, t.frame) for t in tasks if t.lane == lane}
        others = {kind_colour(t.kind, t.frame) for t in tasks} - mine
        assert mine <= band and not others & band, lane


def test_labels_are_whole_names_or_key_numbers(tmp_path):
    tasks = pipelined()
    img = read_png(render_schedule_png(tasks, tmp_path / "s.png"))
    lay = st._layout(tasks, "", None, None)
    number = {name: n for n, name in lay.key}
    assert LONG in number and "cnn" not in number   # cnn's 2 ms boxes are wide
    for t, label in zip(tasks, lay.labels, strict=True):
        suffix = f" f{t.frame}"
        if label != t.name + suffix:
            assert label in {f"{number[t.name]}{suffix}", str(number[t.name]), ""}
    assert {"cnn f0", "cnn f1", "cnn f2"} <= set(lay.labels)
    # numbered left to right, and the key is drawn letter for letter
    assert [n for n, _ in lay.key] == list(range(1, len(lay.key) + 1))
    firsts = [min(t.start for t in tasks if t.name == name) for _, name in lay.key]
    assert firsts == sorted(firsts)
    assert_key_drawn(img, lay)


def test_image_grows_with_tasks_and_lanes(tmp_path):
    many = [ScheduledTask(f"op{i}", "CPU 0", i * 1e-6, (i + 1) * 1e-6, "cpu op")
            for i in range(400)]
    lay = st._layout(many, "", None, None)
    assert lay.width == timeline.AUTO_WIDTH[1] and lay.unit == ("us", 1e6)
    assert len(lay.key) == 400            # 20-px boxes: each name in the key
    img = read_png(render_schedule_png(many, tmp_path / "m.png"))
    assert img.shape[:2] == (lay.height, lay.width)
    assert_key_drawn(img, lay)
    mid = st._layout(many[:60], "", None, None)
    assert timeline.AUTO_WIDTH[0] < mid.width < timeline.AUTO_WIDTH[1]
    two = st._layout(many[:3], "", None, 2)
    four = st._layout(many[:3], "", None, 4)
    assert four.lanes == ["CPU 0", "CPU 1", "CPU 2", "CPU 3", "accelerator"]
    assert four.height - two.height == 2 * (st._ROW_H + timeline._LANE_GAP)
    assert st._layout(many[:3], "", 900, None).width == 900


def test_overlap_on_a_lane_gets_a_row(tmp_path):
    tasks = [ScheduledTask("a", "accelerator", 0, 2.0, "segment"),
             ScheduledTask("b", "accelerator", 1.0, 3.0, "transfer")]
    lay = st._layout(tasks, "", None, None)
    assert lay.unit == ("s", 1.0)
    y0, y1 = lay.lane_rows["accelerator"]
    assert y1 - y0 == 2 * st._ROW_H
    assert lay.boxes[1][2] == lay.boxes[0][2] + st._ROW_H
    read_png(render_schedule_png(tasks, tmp_path / "o.png"))
    tids = {e["name"]: e["tid"] for e in schedule_perfetto(tasks)["traceEvents"] if e["ph"] == "X"}
    assert tids["a"] != tids["b"]


def test_empty_schedule_and_list_schedule_output(tmp_path):
    lay = st._layout([], "", None, None)
    assert lay.lanes == ["CPU 0", "accelerator"]
    read_png(render_schedule_png([], tmp_path / "e.png"))
    work = [Task("a", "cpu", 1e-3), Task("b", "cpu", 1e-3), Task("seg", "accelerator", 2e-3),
            Task("join", "cpu", 1e-3, (0, 1, 2))]
    schedule = list_schedule(work, cores=2)
    assert {s.lane for s in schedule} == {"CPU 0", "CPU 1", "accelerator"}
    img = read_png(render_schedule_png(schedule, tmp_path / "l.png", cores=2))
    assert img.shape[1] == 1600
    assert lane_order(["accelerator"], cores=2) == ["CPU 0", "CPU 1", "accelerator"]
    assert lane_order(["CPU 3"]) == ["CPU 0", "CPU 1", "CPU 2", "CPU 3", "accelerator"]


def test_a_lone_odd_frame():
    """No frame suffix in a one-frame schedule, and the legend shows the shade drawn."""
    one = [ScheduledTask("seg", "accelerator", 0.0, 1.0, "segment", 1)]
    lay = st._layout(one, "", None, None)
    assert lay.labels == ["seg"] and st._legend(lay) == {"segment": [kind_colour("segment", 1)]}


# --------------------------------------------------------------------------- Perfetto

def test_perfetto_has_a_track_per_lane_and_an_event_per_task(tmp_path):
    tasks = pipelined()
    trace = schedule_perfetto(tasks)
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {0: "CPU 0", 1: "CPU 1", 2: "accelerator"}
    order = {e["tid"]: e["args"]["sort_index"] for e in events
             if e["name"] == "thread_sort_index"}
    assert sorted(order, key=order.get) == [0, 1, 2]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(tasks)
    tid = {v: k for k, v in names.items()}
    for e, t in zip(slices, tasks, strict=True):
        assert e["name"] == t.name and e["tid"] == tid[t.lane]
        assert e["ts"] == pytest.approx(t.start * 1e6)
        assert e["dur"] == pytest.approx((t.end - t.start) * 1e6)
        assert e["args"] == {"kind": t.kind, "frame": t.frame, "lane": t.lane}
    # the pipelining shows: frame 1's segment overlaps frame 0's decoder
    seg1 = next(e for e in slices if e["name"] == "cnn" and e["args"]["frame"] == 1)
    dec0 = next(e for e in slices if e["name"] == "lstm decoder" and e["args"]["frame"] == 0)
    assert seg1["ts"] < dec0["ts"] + dec0["dur"] and dec0["ts"] < seg1["ts"] + seg1["dur"]
    path = write_schedule_perfetto(tasks, tmp_path / "s.json")
    assert json.loads(path.read_text()) == json.loads(json.dumps(trace))


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("bad, match", [
    (ScheduledTask("x", "CPU 0", 2.0, 1.0), "start <= end"),
    (ScheduledTask("x", "CPU 0", -1.0, 1.0), "start <= end"),
    (ScheduledTask("x", "CPU 0", 0.0, float("nan")), "finite"),
    (ScheduledTask("x", "GPU 0", 0.0, 1.0), "lane 'GPU 0'"),
    (ScheduledTask("x", "cpu", 0.0, 1.0), "lane 'cpu'"),
    (ScheduledTask("x", "CPU 0", 0.0, 1.0, "cpu op", -1), "frame -1"),
    (("x", "CPU 0", 0.0, 1.0), "ScheduledTask"),
])
def test_bad_tasks_raise_timeline_errors(tmp_path, bad, match):
    tasks = [ScheduledTask("ok", "CPU 0", 0.0, 1.0), bad]
    with pytest.raises(TimelineError, match=match) as err:
        render_schedule_png(tasks, tmp_path / "x.png")
    assert isinstance(err.value, TesseraError) and "task 1" in str(err.value)
    with pytest.raises(TimelineError, match=match):
        schedule_perfetto(tasks)
    assert not (tmp_path / "x.png").exists()


def test_other_errors(tmp_path):
    with pytest.raises(TimelineError, match="list of tessera.schedule.ScheduledTask"):
        render_schedule_png(None, tmp_path / "x.png")
    with pytest.raises(TimelineError, match="width"):
        render_schedule_png(pipelined(), tmp_path / "x.png", width=60)
    assert not (tmp_path / "x.png").exists()
