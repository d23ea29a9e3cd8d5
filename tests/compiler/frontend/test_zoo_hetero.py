"""The zoo's workloads for heterogeneous scheduling (issue 17): the video-captioning frame
(CNN encoder + one LSTM decoder step with state carried across frames) and the branchy
Inception CNN. Structure, determinism, a numpy reference of the decoder, the recurrent
state's metadata, and the compiled models against onnxruntime.
"""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import tessera
from tessera.compiler import zoo
from tessera.compiler.golden.check import output_scales, reference_outputs
from tessera.errors import CompileError
from tessera.runtime.executor import Model
from tests.compiler.qdq_models import exposed, session

#: Small sizes of both models, for the default suite.
SMALL_CAPTIONING = dict(image=96, width=0.25, head=64, embed=32, hidden=24, vocab=50)
SMALL_INCEPTION = dict(image=96, width=0.25, stages=(1, 1, 1), classes=10)


@pytest.fixture(scope="module")
def captioning() -> onnx.ModelProto:
    return zoo.captioning()


@pytest.fixture(scope="module")
def inception() -> onnx.ModelProto:
    return zoo.inception()


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _shapes(values) -> dict[str, tuple[int, ...]]:
    return {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in values}


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def test_both_models_are_registered():
    assert zoo.ZOO["captioning"] is zoo.captioning and zoo.ZOO["inception"] is zoo.inception


# ------------------------------------------------------------------------- captioning
def test_captioning_inputs_outputs_and_state(captioning):
    onnx.checker.check_model(captioning, full_check=True)
    assert captioning.ir_version == zoo.IR_VERSION
    assert _shapes(captioning.graph.input) == {
        "input": (1, 3, 224, 224), "h": (1, 1, 256), "c": (1, 1, 256)}
    assert _shapes(captioning.graph.output) == {
        "logits": (1, 1000), "h_out": (1, 1, 256), "c_out": (1, 1, 256)}
    (entry,) = [p for p in captioning.metadata_props if p.key == zoo.RECURRENT_STATE]
    assert json.loads(entry.value) == {"h": "h_out", "c": "c_out"}
    assert zoo.recurrent_state(captioning) == {"h": "h_out", "c": "c_out"}
    (lstm,) = [n for n in captioning.graph.node if n.op_type == "LSTM"]
    assert list(lstm.input[5:]) == ["h", "c"] and list(lstm.output) == ["", "h_out", "c_out"]
    assert _attrs(lstm) == {"hidden_size": 256}
    embedded = _shapes(onnx.shape_inference.infer_shapes(captioning).graph.value_info)
    assert embedded[lstm.input[0]] == (1, 1, 256)      # a sequence of one step


def test_captioning_encoder_is_dense_and_dominates(captioning):
    ops = Counter(n.op_type for n in captioning.graph.node)
    assert ops == {"Conv": 28, "BatchNormalization": 28, "Relu": 15, "Add": 7,
                   "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 2, "Unsqueeze": 1,
                   "LSTM": 1, "Squeeze": 1, "Constant": 1}
    assert all(_attrs(n)["group"] == 1 for n in captioning.graph.node if n.op_type == "Conv")
    decoder = 4 * 256 * (256 + 256) + 256 * 1000          # LSTM gates and word scores
    assert zoo.mac_count(captioning) == 727_459_840
    assert 500e6 < zoo.mac_count(captioning) - decoder
    assert decoder < 0.002 * zoo.mac_count(captioning)
    w = _weights(captioning)
    assert w["lstm.W"].shape == (1, 1024, 256) and w["lstm.R"].shape == (1, 1024, 256)
    assert w["lstm.B"].shape == (1, 2048)
    lstm_params = w["lstm.W"].size + w["lstm.R"].size + w["lstm.B"].size
    without_lstm = sum(v.size for k, v in w.items() if k.endswith((".weight", ".bias")))
    assert zoo.parameter_count(captioning) == lstm_params + without_lstm
    residual = [n.output[0] for n in captioning.graph.node if n.op_type == "Add"]
    assert residual == [f"blocks.{i}.out" for i in (2, 4, 5, 7, 8, 10, 12)]


def _lstm_step(w: dict, x: np.ndarray, h: np.ndarray, c: np.ndarray):
    """ONNX's LSTM (gates i, o, f, c; sigmoid, tanh, tanh) for one step, in float64."""
    sigmoid = lambda v: 1 / (1 + np.exp(-v))     # noqa: E731
    gates = x @ w["lstm.W"][0].T + h @ w["lstm.R"][0].T + w["lstm.B"][0].reshape(2, -1).sum(0)
    i, o, f, g = np.split(gates, 4, axis=-1)
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    return sigmoid(o) * np.tanh(c), c


def test_captioning_decoder_matches_a_numpy_lstm():
    model = zoo.captioning(**SMALL_CAPTIONING)
    feed = zoo.calibration_data(model, n=1, seed=2)[0]
    embed, logits, h_out, c_out = session(exposed(model, ["embed"])).run(
        ["embed", "logits", "h_out", "c_out"], feed)
    w = {k: v.astype(np.float64) for k, v in _weights(model).items()}
    h, c = _lstm_step(w, embed.astype(np.float64), feed["h"][0], feed["c"][0])
    np.testing.assert_allclose(h_out[0], h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c_out[0], c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logits, h @ w["fc.weight"].T + w["fc.bias"], rtol=1e-4,
                               atol=1e-5)
    assert np.abs(h - feed["h"][0]).max() > 0.05      # the step moves the state


def test_captioning_calibration_feeds_every_input():
    model = zoo.captioning(**SMALL_CAPTIONING)
    feeds = zoo.calibration_data(model, n=4, seed=1)
    for feed in feeds:
        assert list(feed) == ["input", "h", "c"]
        assert all(v.dtype == np.float32 for v in feed.values())
        assert feed["h"].shape == feed["c"].shape == (1, 1, 24)
        assert np.abs(feed["h"]).max() < 1 and np.abs(feed["c"]).max() < 1
        assert np.abs(feed["input"]).max() > 2      # the image stays standard normal
    assert not np.array_equal(feeds[0]["h"], feeds[0]["c"])


def test_captioning_batch_is_the_lstm_batch():
    """Batch b: the state is (1, b, hidden), ONNX LSTM's layout, and each row of the
    batch is the model run on that row alone."""
    single = zoo.captioning(**SMALL_CAPTIONING)
    batched = zoo.captioning(batch=3, **SMALL_CAPTIONING)
    assert batched.graph.initializer == single.graph.initializer
    feeds = zoo.calibration_data(single, n=3, seed=5)
    stacked = {"input": np.concatenate([f["input"] for f in feeds]),
               **{k: np.concatenate([f[k] for f in feeds], axis=1) for k in ("h", "c")}}
    logits, h_out, c_out = session(batched).run(["logits", "h_out", "c_out"], stacked)
    for row, feed in enumerate(feeds):
        want = session(single).run(["logits", "h_out", "c_out"], feed)
        np.testing.assert_allclose(logits[row:row + 1], want[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(h_out[:, row:row + 1], want[1], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(c_out[:, row:row + 1], want[2], rtol=1e-4, atol=1e-5)


def test_recurrent_state_metadata_survives_to_qdq():
    model = zoo.captioning(**SMALL_CAPTIONING)
    qdq = zoo.to_qdq(model, zoo.calibration_data(model, n=2))
    assert zoo.recurrent_state(qdq) == {"h": "h_out", "c": "c_out"}
    assert {o.name for o in qdq.graph.output} >= {"logits", "h_out", "c_out"}
    assert zoo.recurrent_state(zoo.lenet()) == {}


@pytest.mark.parametrize("entry", ['{"h": "missing"}', '["h"]', "not json"])
def test_malformed_recurrent_state_is_a_clear_error(entry):
    model = zoo.captioning(**SMALL_CAPTIONING)
    helper.set_model_props(model, {zoo.RECURRENT_STATE: entry})
    with pytest.raises(CompileError, match="not a JSON object mapping state inputs"):
        zoo.calibration_data(model)


# -------------------------------------------------------------------------- inception
def test_inception_has_googlenet_blocks(inception):
    onnx.checker.check_model(inception, full_check=True)
    assert _shapes(inception.graph.input) == {"input": (1, 3, 96, 96)}
    assert _shapes(inception.graph.output) == {"logits": (1, 100)}
    blocks = [n.name[:-len(".concat")] for n in inception.graph.node if n.op_type == "Concat"]
    assert blocks == ["inception3a", "inception3b", "inception4a", "inception4b",
                      "inception5a"]
    w = _weights(inception)
    for block in blocks:
        concat = _node(inception, f"{block}.concat")
        assert list(concat.output) == [f"{block}.out"] and _attrs(concat) == {"axis": 1}
        assert list(concat.input) == [f"{block}.branch{b}.relu" for b in
                                      ("1", "2.1", "3.1", "4.1")]
        kernels = {b: w[f"{block}.branch{b}.conv.weight"].shape[2:]
                   for b in ("1", "2.0", "2.1", "3.0", "3.1", "4.1")}
        assert kernels == {"1": (1, 1), "2.0": (1, 1), "2.1": (3, 3), "3.0": (1, 1),
                           "3.1": (5, 5), "4.1": (1, 1)}
        pool = _node(inception, f"{block}.branch4.0")
        assert _attrs(pool) == {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1] * 4}
        # all four branches read the block's input
        sources = {_node(inception, f"{block}.branch{b}.conv").input[0]
                   for b in ("1", "2.0", "3.0")}
        assert sources == {pool.input[0]}
    # torchvision's widths: inception3a's branches give 64 + 128 + 32 + 32 channels
    assert w["inception3b.branch1.conv.weight"].shape == (128, 256, 1, 1)
    pools = [n.name for n in inception.graph.node
             if n.op_type == "MaxPool" and _attrs(n)["strides"] == [2, 2]]
    assert pools == ["maxpool1", "maxpool2", "maxpool3", "maxpool4"]
    assert zoo.mac_count(inception) == 204_613_888


def test_inception_stages_and_width():
    model = zoo.inception(image=64, width=0.5, stages=(2, 5, 2), classes=10)
    blocks = [n.name for n in model.graph.node if n.op_type == "Concat"]
    assert len(blocks) == 9 and blocks[-1] == "inception5b.concat"
    assert _weights(model)["inception5b.branch1.conv.weight"].shape == (192, 416, 1, 1)


@pytest.mark.parametrize("name", ["captioning", "inception"])
def test_activations_keep_their_scale(name):
    """Every block's output has a std within 10x of the input's; the logits differ."""
    model = zoo.ZOO[name]()
    blocks = [n.output[0] for n in model.graph.node if n.output[0].endswith(".out")]
    feed = zoo.calibration_data(model, n=1, seed=3)[0]
    logits, *outputs = session(exposed(model, blocks)).run(["logits", *blocks], feed)
    ratios = np.array([y.std() for y in outputs]) / feed[zoo.INPUT].std()
    assert ((ratios > 0.1) & (ratios < 10)).all(), dict(zip(blocks, ratios))
    assert np.isfinite(logits).all() and logits.std() > 0.05


@pytest.mark.parametrize("build", [zoo.captioning, zoo.inception])
def test_deterministic_by_seed(build):
    options = SMALL_CAPTIONING if build is zoo.captioning else SMALL_INCEPTION
    first = build(seed=0, **options)
    assert build(seed=0, **options).SerializeToString() == first.SerializeToString()
    other = _weights(build(seed=1, **options))
    for key, value in _weights(first).items():
        if value.ndim > 1:
            assert not np.array_equal(value, other[key]), key


# --------------------------------------------------------- compiled vs onnxruntime
def _assert_compiles_and_matches(model: onnx.ModelProto, frames: int = 1) -> Model:
    """Compile for pynq, run ``frames`` frames on the simulator (each frame's state
    inputs the previous frame's state outputs) and compare every frame with onnxruntime
    on the same QDQ model: int8 outputs identical, float outputs (the LSTM's state, run
    by a float CPU kernel) to float32 rounding."""
    compiled = tessera.compile(model, "pynq", calibration=zoo.calibration_data(model))
    reference = compiled.compiled.reference
    scales = output_scales(reference)
    state = zoo.recurrent_state(reference)
    assert state == zoo.recurrent_state(model)
    feeds = zoo.calibration_data(model, n=frames, seed=7)
    outputs: dict = {}
    for feed in feeds:
        feed = {**feed, **{i: outputs[o] for i, o in state.items() if outputs}}
        outputs, _ = compiled.run(feed, backend="sim")
        expected = reference_outputs(reference, feed)
        assert outputs.keys() == expected.keys()
        for name, ours in outputs.items():
            if name in scales:
                steps = np.rint(np.abs(ours - expected[name]) / scales[name])
                assert not steps.any(), (name, int(steps.max()))
            else:
                np.testing.assert_allclose(ours, expected[name], rtol=1e-5, atol=1e-6)
    assert "logits" in scales
    return compiled


def test_small_captioning_compiles_and_carries_its_state():
    compiled = _assert_compiles_and_matches(zoo.captioning(**SMALL_CAPTIONING), frames=2)
    targets = {p.node: p.target for p in compiled.placements}
    assert targets["lstm"] == "cpu"
    assert any(p.target == "accelerator" and p.op == "QConv" for p in compiled.placements)


def test_small_inception_compiles():
    compiled = _assert_compiles_and_matches(zoo.inception(**SMALL_INCEPTION))
    assert any(p.target == "accelerator" and p.op == "QConv" for p in compiled.placements)


@pytest.mark.models
@pytest.mark.parametrize("name", ["captioning", "inception"])
def test_zoo_model_matches_onnxruntime(name):
    _assert_compiles_and_matches(zoo.ZOO[name](), frames=2 if name == "captioning" else 1)
