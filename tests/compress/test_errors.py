"""Every bad input to prune is a TesseraError naming what and where, with advice for
the Python argument and the CLI flag."""
from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.frontend import zoo
from tessera.compress import prune
from tessera.errors import CLI, PYTHON, TesseraError

from .models import dense_chain, feeds

MODEL = dense_chain()
CAL = feeds(MODEL)


def _raises(match: str, python: str | None = None, cli: str | None = None, **kwargs):
    kwargs.setdefault("calibration", CAL)
    with pytest.raises(TesseraError, match=match) as info:
        prune(kwargs.pop("model", MODEL), **kwargs)
    if python:
        assert python in info.value.describe(PYTHON)
    if cli:
        assert cli in info.value.describe(CLI)
    return info.value


@pytest.mark.parametrize("kwargs, match, python, cli", [
    (dict(pattern="3:4", sparsity=0.5), r"unknown pruning pattern '3:4'.*block, 1:4",
     "pattern='block'", "--pattern one of"),
    (dict(sparsity=1.0), r"sparsity=1 is not in \[0, 1\)", "sparsity= a number",
     "--sparsity a number"),
    (dict(sparsity=-0.1), r"sparsity=-0.1", "sparsity=", "--sparsity"),
    (dict(sparsity=float("nan")), r"sparsity=nan", None, "--sparsity"),
    (dict(error_budget=-1), r"error_budget=-1 is not >= 0", "error_budget=",
     "--error-budget a number >= 0"),
    (dict(), r"say how much to prune", "sparsity=0.75", "--sparsity 0.75"),
    (dict(strategy="greedy", sparsity=0.5), r"unknown strategy 'greedy'", "strategy='dp'",
     "--strategy dp"),
    (dict(strategy="uniform", error_budget=0.1), r"takes no error budget", "error_budget=",
     "--error-budget"),
    (dict(pattern="2:4", strategy="uniform", sparsity=0.75), r"removes 0.5 of each layer",
     "sparsity=0.5", "--sparsity 0.5"),
    (dict(sparsity=0.5, skip=["nope"]), r"skip names \['nope'\].*gemm_kn", "skip=", "--skip"),
    (dict(sparsity=0.5, skip=["mm", "gemm_kn", "gemm_nk"]), r"no layer to prune", None,
     "--skip"),
    (dict(sparsity=0.99, pattern="2:4"), r"sparsity 0.99 cannot be reached with these "
     r"candidate sparsities: at most 0.5000", "sparsity=", "--sparsity"),
    (dict(sparsity=0.5, config="huge"), r"unknown config 'huge'", None, None),
])
def test_bad_arguments(kwargs, match, python, cli):
    _raises(match, python, cli, **kwargs)


@pytest.mark.parametrize("calibration, match", [
    ({"x": np.zeros((2, 16), np.float32)}, r"list of \{input name: array\} feeds, not a dict"),
    ([], r"empty list"),
    ([{"y": np.zeros((2, 16), np.float32)}], r"sample 0 has inputs \['y'\].*missing \['x'\]"),
    ([CAL[0], {"x": np.zeros((2, 15), np.float32)}],
     r"sample 1: input 'x' has shape \[2, 15\], the model takes \[2, 16\]"),
    ([{"x": np.zeros((2, 16), np.int32)}], r"sample 0: input 'x' is int32"),
    ([[1, 2]], r"sample 0 is a list"),
])
def test_bad_calibration(calibration, match):
    _raises(match, "calibration=[{input name: array}", "--calibration FILE.npz",
            calibration=calibration, sparsity=0.5)


def test_a_model_without_prunable_layers():
    """A grouped conv (from the onnx package's pytorch exports) is not prunable."""
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data",
                        "pytorch-converted", "test_Conv2d_groups", "model.onnx")
    _raises(r"has no layer to prune: none is a Conv \(group 1\)", model=path,
            calibration=None, sparsity=0.5)


def test_a_quantized_model():
    model = zoo.mlp(hidden=(16,), in_features=8)
    qdq = zoo.to_qdq(model, zoo.calibration_data(model, 2))
    _raises(r"is quantized \(it has DequantizeLinear, QuantizeLinear nodes\)",
            "then quantize it", "tessera compile", model=qdq, calibration=None, sparsity=0.5)


def test_an_integer_weight():
    w = numpy_helper.from_array(np.ones((4, 4), np.int8), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    err = _raises(r"layer 'mm' \(MatMul\) has a int8 weight", model=model,
                  calibration=[{"x": np.ones((1, 4), np.int8)}], sparsity=0.5)
    assert err.op == "mm"


def test_a_missing_file_and_a_random_calibration_that_cannot_be_made(tmp_path):
    _raises(r"file .*nope.onnx': there is no such file", model=str(tmp_path / "nope.onnx"),
            sparsity=0.5)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not onnx")
    _raises(r"is (not an ONNX model|empty)", model=str(bad), sparsity=0.5)
    dynamic = dense_chain()
    dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _raises(r"random samples cannot be made: input 'x' has dynamic dims", None,
                "--calibration FILE.npz", model=dynamic, calibration=None, sparsity=0.5)
