"""The model zoo: valid, runnable, deterministic models and their onnxruntime QDQ references."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler import zoo
from tests.compiler.qdq_models import session

#: name -> (number of classes, parameters as torch counts them, MACs at the default size).
SIZES = {
    "mlp": (10, 235_146, 234_752),
    "lenet": (10, 431_080, 2_293_000),
    "small_resnet": (10, 78_042, 12_501_632),
    "resnet18": (1000, 11_689_512, 1_814_073_344),
    "mobilenet": (100, 3_309_476, 104_376_832),
    "captioning": (1000, 4_582_424, 727_459_840),
    "inception": (100, 2_448_244, 204_613_888),
}
CONV_NETS = ("small_resnet", "resnet18", "mobilenet")


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    """Every zoo model at its defaults, built once."""
    return {name: build() for name, build in zoo.ZOO.items()}


def _run(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The logits of every feed, stacked along the batch axis."""
    ort_session = session(model)
    return np.concatenate([ort_session.run(None, feed)[0] for feed in feeds])


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(node.op_type for node in model.graph.node)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_zoo_lists_every_model():
    assert set(zoo.ZOO) == set(SIZES)


@pytest.mark.parametrize("name", list(SIZES))
def test_model_is_valid_and_runs(models, name):
    model = models[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == zoo.IR_VERSION
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert all(t.data_type == TensorProto.FLOAT for t in model.graph.initializer)
    classes, params, macs = SIZES[name]
    assert zoo.parameter_count(model) == params
    assert zoo.mac_count(model) == macs
    logits = _run(model, zoo.calibration_data(model, n=2))
    assert logits.shape == (2, classes)
    assert np.isfinite(logits).all()
    assert logits.std(axis=1).min() > 1e-3


@pytest.mark.parametrize("name, shape", [
    ("mlp", (1, 784)), ("lenet", (1, 1, 28, 28)), ("small_resnet", (1, 3, 32, 32)),
    ("resnet18", (1, 3, 224, 224)), ("mobilenet", (1, 3, 96, 96))])
def test_input_shape(models, name, shape):
    assert zoo.input_shape(models[name]) == shape


@pytest.mark.parametrize("name", list(SIZES))
def test_deterministic_by_seed(models, name):
    build = zoo.ZOO[name]
    assert build(seed=0).SerializeToString() == models[name].SerializeToString()
    first, other = _weights(models[name]), _weights(build(seed=1))
    assert first.keys() == other.keys()
    for key, value in first.items():
        if key.endswith(".weight") and value.ndim > 1:
            assert not np.array_equal(value, other[key]), key


@pytest.mark.parametrize("name", ["mlp", "small_resnet"])
def test_batch_changes_only_the_batch(models, name):
    batched = zoo.ZOO[name](batch=3)
    assert zoo.input_shape(batched)[0] == 3
    assert batched.graph.initializer == models[name].graph.initializer
    feeds = zoo.calibration_data(models[name], n=3)
    stacked = {zoo.INPUT: np.concatenate([f[zoo.INPUT] for f in feeds])}
    np.testing.assert_allclose(_run(batched, [stacked]), _run(models[name], feeds),
                               rtol=1e-4, atol=1e-5)


def test_model_options():
    model = zoo.mlp(in_features=32, hidden=(16, 8, 4), classes=3)
    assert _ops(model) == {"Gemm": 4, "Relu": 3}
    assert _run(model, zoo.calibration_data(model, n=1)).shape == (1, 3)
    model = zoo.small_resnet(width=8, blocks=(3, 3, 3), image=16, classes=5)
    assert _ops(model)["Conv"] == 1 + 9 * 2 + 2    # ResNet-20: stem, 9 blocks, 2 projections
    assert _run(model, zoo.calibration_data(model, n=1)).shape == (1, 5)
    model = zoo.mobilenet(width=0.25, image=64, classes=7)
    assert _weights(model)["blocks.12.pw.weight"].shape == (256, 256, 1, 1)
    assert _run(model, zoo.calibration_data(model, n=1)).shape == (1, 7)


def test_resnet18_has_the_torchvision_structure(models):
    model = models["resnet18"]
    assert _ops(model) == {"Conv": 20, "BatchNormalization": 20, "Relu": 17, "Add": 8,
                           "MaxPool": 1, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}
    weights = _weights(model)
    expected = {"conv1.weight": (64, 3, 7, 7), "fc.weight": (1000, 512)}
    cin = 64
    for layer, width in enumerate((64, 128, 256, 512), 1):
        for block in range(2):
            p = f"layer{layer}.{block}"
            expected[f"{p}.conv1.weight"] = (width, cin, 3, 3)
            expected[f"{p}.conv2.weight"] = (width, width, 3, 3)
            if layer > 1 and block == 0:
                expected[f"{p}.downsample.0.weight"] = (width, cin, 1, 1)
            cin = width
    conv_weights = {k: v.shape for k, v in weights.items()
                    if k.endswith(".weight") and v.ndim in (2, 4)}
    assert conv_weights == expected
    strided = {n.name for n in model.graph.node
               if n.op_type == "Conv" and _attrs(n)["strides"] == [2, 2]}
    assert strided == {"conv1"} | {f"layer{i}.0.{c}" for i in (2, 3, 4)
                                   for c in ("conv1", "downsample.0")}
    pool = next(n for n in model.graph.node if n.op_type == "MaxPool")
    assert _attrs(pool) == {
        "kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}


def test_mobilenet_is_depthwise_separable(models):
    model = models["mobilenet"]
    assert _ops(model) == {"Conv": 27, "BatchNormalization": 27, "Clip": 27,
                           "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}
    weights = _weights(model)
    depthwise = [n for n in model.graph.node if n.name.endswith(".dw")]
    assert len(depthwise) == 13
    strided = [n.name for n in model.graph.node
               if n.op_type == "Conv" and _attrs(n)["strides"] == [2, 2]]
    assert strided == ["conv1"] + [f"blocks.{i}.dw" for i in (1, 3, 5, 11)]
    for node in depthwise:
        assert _attrs(node)["group"] == weights[node.input[1]].shape[0] > 1
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    assert {(float(weights[n.input[1]]), float(weights[n.input[2]])) for n in clips} == {(0, 6)}


def test_batchnorm_statistics_are_realistic(models):
    for name in CONV_NETS:
        weights = _weights(models[name])
        bns = [n for n in models[name].graph.node if n.op_type == "BatchNormalization"]
        for node in bns:
            gamma, _, _, var = (weights[i] for i in node.input[1:])
            assert (var > 0).all() and np.all(np.abs(gamma - 1) < 0.6), node.name


@pytest.mark.parametrize("name", CONV_NETS)
def test_activations_keep_their_scale(models, name):
    """Every block's output has a std within 10x of the input's; the logits differ."""
    model = onnx.ModelProto()
    model.CopyFrom(models[name])
    blocks = [n.output[0] for n in model.graph.node if n.output[0].endswith(".out")]
    model.graph.output.extend(helper.make_tensor_value_info(b, TensorProto.FLOAT, None)
                              for b in blocks)
    feed = zoo.calibration_data(model, n=1, seed=3)[0]
    logits, *outputs = session(model).run(None, feed)
    assert len(outputs) == {"small_resnet": 3, "resnet18": 8, "mobilenet": 13}[name]
    ratios = np.array([y.std() for y in outputs]) / feed[zoo.INPUT].std()
    assert ((ratios > 0.1) & (ratios < 10)).all(), dict(zip(blocks, ratios))
    assert np.isfinite(logits).all() and logits.std() > 0.1


def test_calibration_data(models):
    model = models["lenet"]
    feeds = zoo.calibration_data(model, n=5, seed=4)
    assert len(feeds) == 5
    for feed in feeds:
        assert list(feed) == [zoo.INPUT]
        assert feed[zoo.INPUT].shape == (1, 1, 28, 28) and feed[zoo.INPUT].dtype == np.float32
    again = zoo.calibration_data(model, n=5, seed=4)
    assert all(np.array_equal(a[zoo.INPUT], b[zoo.INPUT]) for a, b in zip(feeds, again))
    assert not np.array_equal(feeds[0][zoo.INPUT], zoo.calibration_data(model)[0][zoo.INPUT])


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def _consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    return consumers


def _assert_quantized(qdq: onnx.ModelProto, per_channel: bool) -> None:
    """Every compute node reads dequantized int8 (weights: symmetric int8, biases: int32)
    and writes into a QuantizeLinear."""
    producers, consumers = _producers(qdq), _consumers(qdq)
    weights = _weights(qdq)
    computes = [n for n in qdq.graph.node if n.op_type in ("Conv", "Gemm", "MatMul", "Add")]
    assert computes
    for node in computes:
        dq = [producers[i] for i in node.input]
        assert all(d.op_type == "DequantizeLinear" for d in dq), node.name
        assert [c.op_type for c in consumers[node.output[0]]] == ["QuantizeLinear"], node.name
        if node.op_type in ("Conv", "Gemm"):
            data, weight, bias = (weights.get(d.input[0]) for d in dq)
            assert data is None, node.name   # an activation, not a constant
            assert weight.dtype == np.int8 and bias.dtype == np.int32
            scale, zero_point = weights[dq[1].input[1]], weights[dq[1].input[2]]
            assert scale.size == (weight.shape[0] if per_channel else 1)
            assert not zero_point.any()


@pytest.mark.parametrize("name", ["lenet", "small_resnet"])
def test_to_qdq_quantizes_and_stays_close(models, name):
    model = models[name]
    before = model.SerializeToString()
    qdq = zoo.to_qdq(model, zoo.calibration_data(model))
    assert model.SerializeToString() == before     # the float model is untouched
    onnx.checker.check_model(qdq)
    ops = _ops(qdq)
    assert "BatchNormalization" not in ops     # folded into the convolutions
    assert ops["Conv"] == _ops(model)["Conv"]
    _assert_quantized(qdq, per_channel=True)
    test = zoo.calibration_data(model, n=16, seed=1)
    reference, quantized = _run(model, test), _run(qdq, test)
    error = np.linalg.norm(quantized - reference) / np.linalg.norm(reference)
    assert error < 0.1
    assert (quantized.argmax(axis=1) == reference.argmax(axis=1)).mean() >= 0.8


@pytest.mark.parametrize("name", ["mobilenet", "resnet18"])
def test_to_qdq_quantizes_deep_models(models, name):
    """Depthwise convolutions and residual Adds are quantized too (closeness is not
    checked: random deep nets amplify rounding noise, MobileNet's logits by ~30%)."""
    model = models[name]
    qdq = zoo.to_qdq(model, zoo.calibration_data(model, n=2))
    assert _ops(qdq)["Conv"] == _ops(model)["Conv"] and "BatchNormalization" not in _ops(qdq)
    _assert_quantized(qdq, per_channel=True)


def test_to_qdq_per_tensor(models):
    model = models["mlp"]
    qdq = zoo.to_qdq(model, zoo.calibration_data(model), per_channel=False)
    _assert_quantized(qdq, per_channel=False)
    assert np.isfinite(_run(qdq, zoo.calibration_data(model, n=1))).all()
