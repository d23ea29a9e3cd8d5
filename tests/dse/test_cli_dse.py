"""``tessera dse``: bad arguments refused before any work, with CLI advice; a sweep run
from the command line (its tilings checked on the simulator) prints its table, how often
the simulator overruled the cost model, and writes its CSV, JSON and plot."""
from __future__ import annotations

import importlib.util

import pytest

from tessera.cli import main


@pytest.mark.parametrize("argv, words", [
    (["dse", "--base", "tiny"], "--vary FIELD=V1,V2"),
    (["dse", "--base", "tiny", "--vary", "wgt_depth"], "is not FIELD=V1,V2"),
    (["dse", "--base", "tiny", "--vary", "bogus=1,2"], "is not one of the numeric"),
    (["dse", "--base", "tiny", "--vary", "wgt_depth=512", "--model", "nope", "--no-synth"],
     "--model NAME or --model FILE.onnx"),
    (["dse", "--base", "nope.json", "--vary", "wgt_depth=512"], "nope.json"),
])
def test_bad_arguments_are_refused_before_any_work(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) != 0
    assert words in capsys.readouterr().err
    assert not list(tmp_path.iterdir())          # no results file, nothing written


def test_without_the_hw_extra_synthesis_is_refused_with_the_alternative(capsys, monkeypatch,
                                                                        tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "amaranth" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    assert main(["dse", "--base", "tiny", "--vary", "wgt_depth=512"]) != 0
    err = capsys.readouterr().err
    assert "tessera[hw]" in err and "--no-synth" in err


def test_a_sweep_from_the_command_line_writes_its_outputs_and_reruns_from_its_file(
        capsys, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path / "cache"))
    results = tmp_path / "out" / "sweep.jsonl"
    argv = ["dse", "--base", "tiny", "--vary", "wgt_depth=256,512", "--model", "lenet",
            "--no-synth", "--tune", "sim", "--results", str(results)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "lenet ms (x floor)" in out and "2 legal points" in out
    assert "lenet: the cost model's tiling was off by > 2% on" in out
    for suffix in (".csv", ".json", ".png"):
        assert results.with_suffix(suffix).is_file() and f"sweep{suffix}" in out
    assert "2 job(s) run now" in err
    assert main(argv) == 0
    out2, err2 = capsys.readouterr()
    assert out2 == out and "every job read from the results file" in err2
