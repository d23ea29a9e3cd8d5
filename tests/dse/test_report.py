"""The results file (durable rows, a cut last line, a foreign file), the Pareto set, and the
table, CSV, JSON and plot a sweep writes -- on sweeps built by hand, no Ray."""
from __future__ import annotations

import csv
import json
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.dse.plot import write_plot
from tessera.dse.report import records, table, write_csv, write_json
from tessera.dse.results import ResultsFile
from tessera.dse.space import Space
from tessera.dse.sweep import PARETO_RESOURCES, PointResult, Sweep
from tessera.errors import CLI, DseError


def _row(key: str) -> dict:
    return {"key": key, "point": "p", "job": "lenet", "values": [], "label": "x",
            "result": {"latency_ms": 1.0}}


def test_rows_survive_a_reopen_and_a_cut_last_line_runs_again(tmp_path):
    path = tmp_path / "r.jsonl"
    store = ResultsFile(path)
    store.append(_row("a"))
    store.append(_row("b"))
    with path.open("a") as f:
        f.write('{"key": "c", "resu')                 # a crash mid-write
    again = ResultsFile(path)
    assert set(again.rows) == {"a", "b"} and "c" not in again
    again.append(_row("c"))                           # on a line of its own
    assert set(ResultsFile(path).rows) == {"a", "b", "c"}


def test_a_file_that_is_not_a_results_file_is_refused(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("not json\n" + json.dumps(_row("a")) + "\n")
    with pytest.raises(DseError, match="r.jsonl:1 is not a results row") as info:
        ResultsFile(path)
    assert "--results" in info.value.describe(CLI)
    with pytest.raises(DseError, match="is a folder"):
        ResultsFile(tmp_path)


def _sweep(figures: list[tuple[float, float, float, float, bool]]) -> Sweep:
    """A sweep of len(figures) points of tiny: (latency, LUT, DSP, BRAM, fits) each."""
    space = Space.of("tiny", {"wgt_depth": [2 ** (i + 4) for i in range(len(figures))]})
    results = []
    for point, (lat, lut, dsp, bram, fits) in zip(space.points(), figures):
        used = {"LUT": lut, "DSP": dsp, "BRAM": bram, "FF": 1000, "LUTRAM": 10}
        results.append(PointResult(point, {"used": used, "fits": fits, "available": {
            "LUT": 53200, "DSP": 220, "BRAM": 140, "FF": 106400, "LUTRAM": 17400}},
            {"lenet": {"latency_ms": lat, "cycles": int(lat * 1e5), "floor_ratio": 1.1,
                       "gemm_utilisation": 0.8, "accel_mac_share": 0.6 if lat > 2.9 else 1.0}}))
    return Sweep(space, results, [], ["lenet"], True)


def test_the_pareto_set_and_the_table_mark_the_same_points():
    sweep = _sweep([(3.0, 20000, 50, 10, True), (2.0, 30000, 50, 10, True),
                    (2.5, 30000, 60, 10, True), (1.0, 90000, 300, 10, False)])
    front = sweep.pareto()
    assert [r.point.config.wgt_depth for r in front] == [32, 16]   # by latency
    text = table(sweep)
    starred = [line.split()[0] for line in text.splitlines() if line.rstrip().endswith("*")]
    assert starred == ["wgt_depth=32", "wgt_depth=16"]
    assert "NO" in text and "2 on the Pareto front" in text
    # the slowest point runs 40% of its MACs on the CPU: its row says so
    assert [line for line in text.splitlines() if "of MACs on the CPU" in line] == [
        line for line in text.splitlines() if line.startswith("wgt_depth=16 ")]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5),
                          st.integers(1, 5), st.booleans()), min_size=1, max_size=8))
def test_no_front_point_is_beaten_and_every_other_fitting_point_is(figures):
    sweep = _sweep([(float(a), float(b), float(c), float(d), f) for a, b, c, d, f in figures])
    front = sweep.pareto()
    objectives = {id(r): r.objectives(sweep.models) for r in sweep.results}
    fitting = [r for r in sweep.results if r.fits]
    beats = (lambda a, b: all(x <= y for x, y in zip(a, b)) and a != b)
    for r in fitting:
        beaten = any(beats(objectives[id(o)], objectives[id(r)]) for o in fitting)
        assert (r in front) == (not beaten)
    assert all(r.fits for r in front)


def test_csv_json_and_plot_hold_every_point(tmp_path):
    sweep = _sweep([(3.0, 20000, 50, 10, True), (2.0, 30000, 50, 10, True),
                    (1.0, 90000, 300, 10, False)])
    rows = list(csv.DictReader(write_csv(sweep, tmp_path / "s.csv").open()))
    assert [r["wgt_depth"] for r in rows] == ["16", "32", "64"]
    assert [r["pareto"] for r in rows] == ["True", "True", "False"]
    assert rows[2]["fits"] == "False" and rows[0]["lenet.latency_ms"] == "3.0"
    data = json.loads(write_json(sweep, tmp_path / "s.json").read_text())
    assert data["axes"] == {"wgt_depth": [16, 32, 64]} and data["points"] == json.loads(
        json.dumps(records(sweep)))
    png = write_plot(sweep, tmp_path / "s.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width > 3 * 320 and height > 220         # a panel per resource, a row per model
    pixels = zlib.decompress(png[png.index(b"IDAT") + 4:])
    assert bytes((200, 40, 40)) in pixels           # the front is drawn in red
    assert len(PARETO_RESOURCES) == 3


def test_a_job_keeps_its_input_errors_and_raises_a_failed_synthesis(monkeypatch):
    from tessera.config import PRESETS
    from tessera.dse import evaluate
    from tessera.errors import ConfigError, SynthesisError

    def refuse(config, part):
        raise ConfigError("unknown part 'xc9'")
    monkeypatch.setattr(evaluate, "evaluate_resources", refuse)
    row = evaluate.run_job(evaluate.RESOURCES, PRESETS["tiny"], "xc9", None, None)
    assert row == {"error": "unknown part 'xc9'"}        # a result: the next run keeps it

    def killed(config, part):
        raise SynthesisError("yosys did not finish within 3600 s")
    monkeypatch.setattr(evaluate, "evaluate_resources", killed)
    with pytest.raises(SynthesisError):                   # not a result: Ray reports it
        evaluate.run_job(evaluate.RESOURCES, PRESETS["tiny"], "xc7z020", None, None)


@pytest.mark.parametrize("lo, hi", [(33.71, 33.76), (0.9, 3.2), (2e4, 9e4), (0.0011, 0.0013)])
def test_plot_ticks_are_distinct_round_labels(lo, hi):
    from tessera.dse.plot import _label, _ticks
    ticks, decimals = _ticks(lo, hi)
    labels = [_label(t, decimals) for t in ticks]
    assert len(ticks) >= 2 and len(set(labels)) == len(labels)
    assert all(lo <= t <= hi for t in ticks)
