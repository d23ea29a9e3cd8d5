"""``tessera prune`` end to end on a small zoo model."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tessera.cli import main
from tessera.compiler.frontend import zoo
from tessera.sparsity import is_nm_sparse, nonzero_blocks


@pytest.fixture(scope="module")
def lenet_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prune")
    model = zoo.lenet()
    path = folder / "lenet.onnx"
    onnx.save(model, str(path))
    cal = folder / "cal.npz"
    np.savez(cal, input=np.stack([s["input"] for s in zoo.calibration_data(model, 2)]))
    return path, cal


def _weights(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def test_prune_writes_the_model_and_prints_the_table(lenet_file, tmp_path, capsys):
    path, cal = lenet_file
    out = tmp_path / "out.onnx"
    # the model written last, after a list option, is still the model
    assert main(["prune", "-o", str(out), "--sparsity", "0.5", "--config", "tiny",
                 "--calibration", str(cal), str(path)]) == 0
    captured = capsys.readouterr()
    assert "conv2" in captured.out and "fc1" in captured.out
    assert "block pruning (dp)" in captured.out and "2 calibration samples" in captured.out
    assert f"wrote {out}" in captured.out
    assert "measuring layers" in captured.err and "done in" in captured.err
    w = _weights(out)["conv2.weight"]
    assert not nonzero_blocks(w, 4, 4).all() or not nonzero_blocks(
        _weights(out)["fc1.weight"], 4, 4).all()


def test_prune_nm_uniform_with_skip_and_default_output(lenet_file, capsys):
    path, _ = lenet_file
    assert main(["prune", str(path), "--pattern", "2:4", "--strategy", "uniform",
                 "--skip", "fc2"]) == 0
    captured = capsys.readouterr()
    assert "random normal" in captured.err and "skip" in captured.out
    weights = _weights(path.with_name("lenet-pruned.onnx"))
    assert is_nm_sparse(weights["conv2.weight"], 2, 4)
    assert not is_nm_sparse(weights["fc2.weight"], 2, 4)       # skipped
    assert not is_nm_sparse(weights["conv1.weight"], 2, 4)     # 1 input channel: dense


@pytest.mark.parametrize("flags, advice", [
    (["--sparsity", "1.5"], "give --sparsity a number in [0, 1)"),
    (["--error-budget", "-2"], "give --error-budget a number >= 0"),
    (["--pattern", "3:4", "--sparsity", "0.5"], "give --pattern one of block, 1:4"),
    ([], "give --sparsity 0.75"),
    (["--sparsity", "0.5", "--skip", "nope"], "give --skip names of Conv/Gemm/MatMul"),
    (["--strategy", "uniform", "--error-budget", "0.1"], "drop --error-budget"),
])
def test_bad_flags_get_flag_advice(lenet_file, tmp_path, capsys, flags, advice):
    path, _ = lenet_file
    assert main(["prune", str(path), "-o", str(tmp_path / "x.onnx"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tessera prune: error: ") and advice in err
    assert not re.search(r"\w=", err.split(";")[1])     # no Python keyword advice
    assert not (tmp_path / "x.onnx").exists()


def test_bad_files(lenet_file, tmp_path, capsys):
    path, _ = lenet_file
    assert main(["prune", str(tmp_path / "none.onnx"), "--sparsity", "0.5"]) == 2
    assert "there is no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    np.savez(bad, other=np.zeros((1, 1, 28, 28), np.float32))
    assert main(["prune", str(path), "--sparsity", "0.5", "--calibration", str(bad)]) == 2
    assert "'other', which is not an input of the model" in capsys.readouterr().err
