"""The scheduling side of the CLI: --host/--placement/--parallel, tessera stream, the
board timeline, and their errors in the CLI's own terms."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tessera.cli import main

from tests.runtime.test_parallel import recurrent_branchy_model


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "rnn.onnx"
    onnx.save(recurrent_branchy_model(), path)
    return path


def test_stream_prints_throughput_and_writes_the_board_schedule(model_file, tmp_path,
                                                                capsys) -> None:
    png, trace = tmp_path / "board.png", tmp_path / "board.json"
    assert main(["stream", str(model_file), "--config", "tiny", "--random-calibration", "4",
                 "--frames", "3", "--board-timeline", str(png), "--board-trace",
                 str(trace)]) == 0
    out = capsys.readouterr().out
    assert "3 frames, pipelined" in out and "frames/s" in out and "cortex-a9" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    events = json.loads(trace.read_text())["traceEvents"]
    frames = {e["args"]["frame"] for e in events if e["ph"] == "X"}
    assert frames == {0, 1, 2}


def test_stream_takes_frames_stacked_in_an_npz(model_file, tmp_path, capsys) -> None:
    x = np.random.default_rng(0).standard_normal((2, 1, 32)).astype(np.float32)
    np.savez(tmp_path / "frames.npz", x=x)
    assert main(["stream", str(model_file), "--config", "tiny", "--random-calibration", "4",
                 "--inputs", str(tmp_path / "frames.npz"), "--sequential"]) == 0
    assert "2 frames, one frame at a time" in capsys.readouterr().out


def test_profile_projects_on_the_host_chosen(model_file, capsys) -> None:
    assert main(["profile", str(model_file), "--config", "tiny", "--random-calibration", "4",
                 "--host", "cortex-a53", "--placement", "greedy", "--parallel"]) == 0
    out = capsys.readouterr().out
    assert "host model 'cortex-a53'" in out and "(in parallel)" in out
    assert "board CPU" in out and "launch/transfer" in out


def test_a_bad_host_is_an_error_naming_the_flag(model_file, capsys) -> None:
    assert main(["run", str(model_file), "--config", "tiny", "--random-calibration", "2",
                 "--host", "pentium"]) == 2
    err = capsys.readouterr().err
    assert "unknown host model 'pentium'" in err and "--host" in err


def test_calibrate_host_writes_a_model_the_host_flag_reads(model_file, tmp_path,
                                                             capsys) -> None:
    path = tmp_path / "host.json"
    assert main(["calibrate-host", "--quick", "-o", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {path}" in out and "gemm_int8" in out
    assert main(["profile", str(model_file), "--config", "tiny", "--random-calibration", "2",
                 "--host", str(path)]) == 0
    assert "host model" in capsys.readouterr().out
