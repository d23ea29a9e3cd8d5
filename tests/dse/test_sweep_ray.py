"""Sweeps on Ray, started on this machine as a user's would be: rows stream into the
results file, a re-run runs nothing, a killed worker's job is retried, an interrupted
sweep resumes where it stopped, and without Ray the error names the extra.

Synthesis is the one part not run for real (yosys takes minutes per config): the resource
cache is filled for the points' designs first, so each resources job takes the path a
cached synthesis takes (`tests/core/test_cli_hw.py` and `tests/hw/synth` cover yosys).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from tessera.dse import explore  # noqa: E402
from tessera.dse import sweep as sweep_module  # noqa: E402
from tessera.dse.evaluate import RESOURCES, design_key  # noqa: E402
from tessera.dse.report import table  # noqa: E402
from tessera.dse.space import Space  # noqa: E402
from tessera.errors import CLI  # noqa: E402
from tessera.extras import MissingExtraError  # noqa: E402

AXES = {"wgt_depth": [256, 512, 3], "clock_mhz": [100.0, 150.0]}


@pytest.fixture(scope="module")
def ray_here(tmp_path_factory):
    """Ray on this machine, its workers and this process sharing a fresh Tessera cache."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TESSERA_CACHE", str(cache))
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 runtime_env={"env_vars": {"TESSERA_CACHE": str(cache)}})
        try:
            yield cache
        finally:
            ray.shutdown()


def _cache_resources(space: Space) -> None:
    """A cached report for each legal point's design: more LUTs for a deeper weight buffer."""
    from tessera.hw.synth import export, resource_cache
    from tessera.hw.synth.resources import count_resources
    for p in space.points():
        if p.legal:
            cells = {"LUT6": 20 * p.config.wgt_depth, "FDRE": 900, "DSP48E1": 40,
                     "RAMB36E1": p.config.wgt_depth // 128}
            report = count_resources(cells, export.TOP_NAME, space.part, ())
            resource_cache.store(design_key(p.config, space.part), report)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_sweep_streams_its_rows_and_a_rerun_runs_nothing(ray_here, tmp_path, monkeypatch):
    _cache_resources(Space.of("tiny", AXES))
    results = tmp_path / "sweep.jsonl"
    seen = []
    sweep = explore("tiny", AXES, ["lenet"], results=results,
                    on_row=lambda row: seen.append(len(_rows(results))))
    assert seen == list(range(1, 9))        # each row on disk before the next came in
    assert sweep.ran == 8 and not sweep.failures and len(sweep.illegal) == 2
    rows = _rows(results)
    assert sorted(r["job"] for r in rows) == ["lenet"] * 4 + [RESOURCES] * 4
    for r in sweep.results:
        assert r.resources["cached"] and r.resources["used"]["LUT"] == 20 * r.point.config.wgt_depth
        fig = r.models["lenet"]
        assert fig["cycles"] > 0 and 0 < fig["gemm_utilisation"] <= 1 and fig["floor_ratio"] >= 1
        assert 0 < fig["accel_mac_share"] <= 1
    # the clock changes the latency, not the cycles
    by = {dict(r.point.values)["clock_mhz"]: r.models["lenet"] for r in sweep.results
          if dict(r.point.values)["wgt_depth"] == 256}
    assert by[100.0]["cycles"] == by[150.0]["cycles"]
    assert by[150.0]["accel_ms"] == pytest.approx(by[100.0]["accel_ms"] / 1.5)
    front = {r.point.label for r in sweep.pareto()}
    assert front == {"wgt_depth=256 clock_mhz=150"}      # fastest and smallest
    assert "wgt_depth=3" in table(sweep)

    def no_ray(*args, **kwargs):
        raise AssertionError("a complete results file ran jobs")
    monkeypatch.setattr(sweep_module, "run_jobs", no_ray)
    again = explore("tiny", AXES, ["lenet"], results=results)
    assert again.ran == 0 and table(again) == table(sweep)


def _running_job_pid(timeout: float = 20.0) -> int | None:
    """A Ray worker process running a sweep job now (its title is ``ray::run_job``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (entry / "cmdline").read_bytes().startswith(b"ray::run_job"):
                        return int(entry.name)
                except OSError:
                    continue
        time.sleep(0.05)
    return None


@pytest.mark.skipif(sys.platform != "linux", reason="finds the worker through /proc")
def test_a_worker_killed_mid_job_is_retried(ray_here, tmp_path):
    results = tmp_path / "sweep.jsonl"
    killed = []

    def kill_one(row):
        if not killed:
            pid = _running_job_pid()
            assert pid is not None, "no job running to kill"
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    axes = {"wgt_depth": [128, 256, 512, 1024]}
    sweep = explore("tiny", axes, ["lenet"], results=results, synthesize=False,
                    on_row=kill_one)
    assert killed and not sweep.failures and sweep.ran == 4
    keys = [r["key"] for r in _rows(results)]
    assert len(keys) == len(set(keys)) == 4
    assert all("cycles" in r.models["lenet"] for r in sweep.results)


def test_an_interrupted_sweep_resumes_with_the_jobs_it_had_not_finished(ray_here, tmp_path):
    results = tmp_path / "sweep.jsonl"
    axes = {"wgt_depth": [128, 256, 512]}

    def stop(row):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        explore("tiny", axes, ["lenet"], results=results, synthesize=False, on_row=stop)
    assert len(_rows(results)) == 1
    rest = []
    sweep = explore("tiny", axes, ["lenet"], results=results, synthesize=False,
                    on_row=rest.append)
    assert sweep.ran == len(rest) == 2 and len(_rows(results)) == 3
    assert all("cycles" in r.models["lenet"] for r in sweep.results)


def test_without_ray_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingExtraError) as info:
        explore("tiny", {"wgt_depth": [256]}, ["lenet"], results=tmp_path / "r.jsonl",
                synthesize=False)
    assert "'dse'" in str(info.value) and "tessera[dse]" in info.value.describe(CLI)
