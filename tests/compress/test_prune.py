"""tessera.compress.prune end to end: the patterns hold in the written model, the goal
is met, the reported errors are what onnxruntime measures, and the model compiles."""
from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import tessera
from tessera.compiler.frontend import zoo
from tessera.compress import prune
from tessera.compress.layers import find_layers
from tessera.compress.measure import relative_rms
from tessera.config import get_config
from tessera.sparsity import is_nm_sparse, nonzero_blocks

from .models import dense_chain, feeds

ONNX_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def _weights(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _ort(model, samples):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [session.run(None, s) for s in samples]


@pytest.fixture(scope="module")
def lenet():
    model = zoo.lenet()
    return model, zoo.calibration_data(model, 3, seed=2)


def test_uniform_block_pruning_cuts_every_layer_exactly(lenet):
    model, cal = lenet
    config = get_config("tiny")
    result = prune(model, sparsity=0.75, calibration=cal, config="tiny", strategy="uniform")
    weights = _weights(result.model)
    for layer, row in zip(find_layers(model), result.layers):
        w = layer.oriented(weights[layer.weight])
        mask = nonzero_blocks(w, config.block_out, config.block_in)
        assert mask.size - mask.sum() == round(0.75 * mask.size), layer.node
        assert row.sparsity == 0.75 and row.density == mask.mean()
    assert result.mac_sparsity == pytest.approx(0.75, abs=0.01)
    # biases and everything but the pruned weights are untouched
    before = _weights(model)
    assert all(np.array_equal(before[k], v) for k, v in weights.items()
               if k not in {layer.weight for layer in find_layers(model)})


@pytest.mark.parametrize("pattern", ["2:4", "1:4", "4:8", "2:8"])
def test_nm_pruning_holds_along_each_layouts_reduction_axis(pattern):
    model = dense_chain()
    n, m = map(int, pattern.split(":"))
    result = prune(model, pattern=pattern, calibration=feeds(model), strategy="uniform")
    weights = _weights(result.model)
    for layer in find_layers(model):
        assert is_nm_sparse(layer.oriented(weights[layer.weight]), n, m, axis=1), layer.node
    assert result.mac_sparsity == pytest.approx(1 - n / m)


def test_target_sparsity_is_met_and_the_error_is_measured(lenet):
    model, cal = lenet
    result = prune(model, sparsity=0.6, calibration=cal, config="tiny")
    assert result.mac_sparsity >= 0.6
    removed = sum(r.macs * (1 - r.density) for r in result.layers)
    assert removed / sum(r.macs for r in result.layers) == pytest.approx(result.mac_sparsity)
    # the combined error is what onnxruntime gives for the written model
    measured = relative_rms(_ort(result.model, cal), _ort(model, cal))
    assert result.error == pytest.approx(measured, rel=1e-6)
    assert result.estimated_error == pytest.approx(sum(r.error for r in result.layers))
    # each layer's error is its own: prune that one layer alone and measure
    row = max(result.layers, key=lambda r: r.error)
    layer = next(layer for layer in find_layers(model) if layer.node == row.node)
    alone = onnx.ModelProto()
    alone.CopyFrom(model)
    for t in alone.graph.initializer:
        if t.name == layer.weight:
            t.CopyFrom(numpy_helper.from_array(_weights(result.model)[t.name], t.name))
    assert row.error == pytest.approx(relative_rms(_ort(alone, cal), _ort(model, cal)), rel=1e-4)


def test_error_budget_is_respected_by_the_estimate(lenet):
    model, cal = lenet
    loose = prune(model, error_budget=0.5, calibration=cal, config="tiny")
    tight = prune(model, error_budget=0.1, calibration=cal, config="tiny")
    assert tight.estimated_error <= 0.1 and loose.estimated_error <= 0.5
    assert loose.mac_sparsity >= tight.mac_sparsity
    assert prune(model, error_budget=0.0, calibration=cal).mac_sparsity == 0.0
    assert "measured" in str(loose) and "estimated" in str(loose)


def test_both_goals_and_an_unmeetable_target(lenet):
    model, cal = lenet
    both = prune(model, sparsity=0.3, error_budget=0.6, calibration=cal, config="tiny")
    assert both.mac_sparsity >= 0.3 and both.estimated_error <= 0.6
    with pytest.raises(tessera.TesseraError, match=r"cannot be reached within the error "
                                                   r"budget 0\.01: at most 0\.\d+"):
        prune(model, sparsity=0.9, error_budget=0.01, calibration=cal, config="tiny")


def test_skipped_layers_stay_dense(lenet):
    model, cal = lenet
    result = prune(model, sparsity=0.5, calibration=cal, skip=["conv1"], strategy="uniform",
                   config="tiny")
    assert np.array_equal(_weights(result.model)["conv1.weight"], _weights(model)["conv1.weight"])
    row = result.layers[0]
    assert row.node == "conv1" and row.skipped and "skip" in str(result)


def test_pruned_zoo_model_runs_in_onnxruntime_and_compiles():
    model = zoo.small_resnet(width=8)
    cal = zoo.calibration_data(model, 2, seed=3)
    result = prune(model, sparsity=0.5, calibration=cal, config="tiny")
    onnx.checker.check_model(result.model, full_check=True)
    outputs = _ort(result.model, cal)
    assert np.all(np.isfinite(outputs[0][0]))
    compiled = tessera.compile(result.model, "tiny", calibration=cal)
    assert compiled.compiled.stats["nodes"]["accelerator"] > 0
    compiled.close()


def test_random_calibration_is_said(tmp_path):
    model = dense_chain()
    with pytest.warns(UserWarning, match="random normal samples"):
        result = prune(model, sparsity=0.5, strategy="uniform", config="tiny")
    assert result.random_calibration and "random normal" in str(result)
    path = result.save(tmp_path / "p.onnx")
    assert onnx.load(str(path)).graph.initializer


def test_a_dynamic_batch_is_sized_by_the_calibration_samples():
    model = dense_chain()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    result = prune(model, pattern="2:4", calibration=feeds(dense_chain(batch=3)),
                   strategy="uniform")
    assert [r.macs for r in result.layers] == [3 * 32 * 16, 3 * 24 * 32, 3 * 8 * 24]


def test_a_model_from_the_onnx_package():
    """pytorch's conv export (IR 3: the weight an initializer listed as an input too),
    pruned 2:4 on its own test input."""
    folder = os.path.join(ONNX_DATA, "pytorch-operator", "test_operator_conv")
    model = onnx.load(os.path.join(folder, "model.onnx"))
    x = onnx.TensorProto()
    with open(os.path.join(folder, "test_data_set_0", "input_0.pb"), "rb") as f:
        x.ParseFromString(f.read())
    cal = [{"0": numpy_helper.to_array(x)}]
    result = prune(model, pattern="2:4", calibration=cal, strategy="uniform")
    w = _weights(result.model)["1"]
    assert w.shape == (13, 16, 3, 3) and is_nm_sparse(w, 2, 4)
    assert 0 < result.error == pytest.approx(result.estimated_error, rel=1e-4)
    blocks = prune(model, sparsity=0.5, calibration=cal, strategy="uniform", config="tiny")
    assert _ort(blocks.model, cal)[0][0].shape == (20, 13, 48, 38)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield
