"""The onnx package's 9 classic CNNs (``onnx/backend/test/data/light``) compiled from the
files as shipped and with random weights, quantized by Tessera and by onnxruntime, run
on ``sim`` and compared with onnxruntime: every conv and dense layer on the accelerator,
int8 outputs identical on >= 99.9% of elements, at most 1 step apart.

The whole models are ``@pytest.mark.models`` (``python -m pytest -m models``): the 9 as
shipped (Tessera's quantization) and ``light_zoo.ACCEPTANCE`` with random weights. The
default run checks the builders, the frontend rules the models needed (weights folded
whatever their size; Sum as a chain of Adds; a quantized Softmax as onnxruntime's
QLinearSoftmax) and SqueezeNet with random weights at 64x64.
``benchmarks/light_zoo.py`` runs every quantizer on every model.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import tessera
from tessera.compiler.frontend import onnx_import, shapes
from tessera.compiler.frontend.onnx_import import import_onnx, to_onnx
from tessera.compiler.frontend.passes import chain_sums
from tessera.compiler.frontend.qsoftmax import qlinear_softmax, qlinear_softmax_table
from tessera.compiler.golden.check import int8_agreement, output_scales, reference_outputs

from tests.compiler import light_zoo
from tests.compiler.frontend.onnx_models import make_model, run_ort
from tests.compiler.qdq_models import session


def _float_outputs(model: onnx.ModelProto, feed) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feed)


def _resized(model: onnx.ModelProto, height: int, width: int) -> onnx.ModelProto:
    """A fully convolutional model with its input declared ``height x width``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    name = light_zoo.input_name(out)
    dims = next(i for i in out.graph.input if i.name == name).type.tensor_type.shape.dim
    dims[2].dim_value, dims[3].dim_value = height, width
    return out


# ------------------------------------------------------------------ the builders
def test_random_weights_keep_every_shape_and_vary():
    model = light_zoo.shipped("shufflenet")
    random = light_zoo.with_random_weights(model, seed=3)
    shipped_consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = {n.output[0]: tuple(shipped_consts[n.input[0]]) for n in model.graph.node
               if n.op_type == "ConstantOfShape"}
    consts = {t.name: numpy_helper.to_array(t) for t in random.graph.initializer}
    assert "ConstantOfShape" not in [n.op_type for n in random.graph.node]
    assert {k: consts[k].shape for k in weights} == weights
    for node in random.graph.node:
        if node.op_type == "Conv":
            weight = consts[node.input[1]]
            assert np.unique(weight).size > weight.size // 2  # not ConstantOfShape(0.02)
        if node.op_type == "BatchNormalization":
            assert (consts[node.input[4]] > 0).all()  # variances
    # Deterministic: the same seed gives the same model; the logits are an output.
    assert light_zoo.with_random_weights(model, seed=3) == random
    assert [o.name for o in random.graph.output] == ["gpu_0/softmax_1",
                                                     random.graph.node[-1].input[0]]


def test_random_weights_make_a_model_with_spread_logits():
    model = light_zoo.with_random_weights(light_zoo.shipped("squeezenet"))
    feed = light_zoo.samples(model, 2, seed=5)[1]
    prob, logits = _float_outputs(model, feed)
    assert prob.shape == (1, 1000, 1, 1) and np.isclose(prob.sum(), 1, atol=1e-4)
    assert np.isfinite(logits).all() and logits.std() > 0.05 * np.abs(logits).max()


# ------------------------------------------------------------ weights always fold
def test_weights_fold_whatever_their_size(monkeypatch):
    """A ConstantOfShape over the fold limit folds when it is a layer's weight (through
    a Reshape), and stays a node when it is an activation operand."""
    monkeypatch.setattr(shapes, "FOLD_LIMIT_BYTES", 1000)
    monkeypatch.setattr(onnx_import, "FOLD_LIMIT_BYTES", 1000)
    make = helper.make_node
    nodes = [make("ConstantOfShape", ["wshape"], ["w_flat"], name="weight",
                  value=numpy_helper.from_array(np.array([0.5], np.float32))),
             make("Reshape", ["w_flat", "w2d"], ["w"], name="reshape"),
             make("Gemm", ["x", "w"], ["y"], name="fc", transB=1),
             make("ConstantOfShape", ["bshape"], ["big"], name="activation_operand",
                  value=numpy_helper.from_array(np.array([1.0], np.float32))),
             make("Add", ["y", "big"], ["z"], name="add")]
    model = make_model(nodes, [("x", [1, 64])], [("z", [64, 64])],
                       {"wshape": np.array([64 * 64], np.int64),
                        "w2d": np.array([64, 64], np.int64),
                        "bshape": np.array([64, 64], np.int64)}, opset=11)
    graph = import_onnx(model)
    assert graph.ops() == ["Gemm", "ConstantOfShape", "Add"]
    assert graph.const(graph.nodes[0].inputs[1]).shape == (64, 64)
    feed = {"x": np.ones((1, 64), np.float32)}
    np.testing.assert_array_equal(run_ort(to_onnx(graph), feed)[0], run_ort(model, feed)[0])


def test_shipped_fc_weights_over_the_fold_limit_are_constants():
    """AlexNet's fc6 weight (9216 x 4096 floats, 151 MB) is a ConstantOfShape."""
    graph = import_onnx(str(light_zoo.LIGHT / "light_bvlc_alexnet.onnx"))
    assert "ConstantOfShape" not in graph.ops()
    gemms = [n for n in graph.nodes if n.op == "Gemm"]
    assert len(gemms) == 3 and all(graph.values[n.inputs[1]].is_const for n in gemms)
    assert graph.values[gemms[0].inputs[1]].size * 4 > shapes.FOLD_LIMIT_BYTES


# ------------------------------------------------------------- Sum as Adds
def test_chain_sums_computes_the_same_with_adds():
    make = helper.make_node
    nodes = [make("Relu", ["a"], ["ra"], name="relu"),
             make("Sum", ["ra", "b", "c"], ["s"], name="sum3"),
             make("Sum", ["s", "b"], ["t"], name="sum2"),
             make("Sum", ["t"], ["y"], name="sum1")]
    model = make_model(nodes, [("a", [2, 3, 4]), ("b", [3, 4]), ("c", [2, 1, 4])],
                       [("y", [2, 3, 4])])
    graph = import_onnx(model)
    assert chain_sums(graph) == 2
    graph.verify()
    assert graph.ops() == ["Relu", "Add", "Add", "Add", "Sum"]
    # The user's node names stay on the Adds that write the Sums' outputs.
    assert [n.name for n in graph.nodes if n.outputs[0] in ("s", "t")] == ["sum3", "sum2"]
    rng = np.random.default_rng(0)
    feed = {"a": rng.standard_normal((2, 3, 4), np.float32),
            "b": rng.standard_normal((3, 4), np.float32),
            "c": rng.standard_normal((2, 1, 4), np.float32)}
    np.testing.assert_array_equal(run_ort(to_onnx(graph), feed)[0], run_ort(model, feed)[0])


def test_a_residual_sum_runs_on_the_accelerator_as_qadd():
    """ResNet-50's residual ``Sum`` of a float model: quantized as an Add, fused to QAdd."""
    rng = np.random.default_rng(0)
    make = helper.make_node
    weights = {"w1": rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.1,
               "w2": rng.standard_normal((32, 32, 1, 1)).astype(np.float32) * 0.2}
    nodes = [make("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             make("Conv", ["x", "w2"], ["c2"], name="conv2"),
             make("Sum", ["c1", "c2"], ["s"], name="residual"),
             make("Relu", ["s"], ["y"], name="relu")]
    model = make_model(nodes, [("x", [1, 32, 28, 28])], [("y", [1, 32, 28, 28])], weights)
    calibration = [{"x": rng.standard_normal((1, 32, 28, 28), np.float32)} for _ in range(4)]
    compiled = tessera.compile(model, "pynq", calibration=calibration)
    ops = Counter((p.op, p.target) for p in compiled.compiled.placements)
    assert ops[("QAdd", "accelerator")] == 1 and ops[("QConv", "accelerator")] == 2, ops
    assert not any(op == "Sum" for op, _ in ops)


# --------------------------------------------------------- Softmax as onnxruntime's
def test_quantized_softmax_is_onnxruntimes_qlinear_softmax():
    """onnxruntime runs DQ -> Softmax -> Q as QLinearSoftmax (an exp table, a float32 sum
    in order): the fused QSoftmax gives its int8 values exactly (a float softmax then
    quantized differed on ~1 value in 1000, the light models' only mismatches)."""
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((1000, 64)) * 0.6).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w"], ["logits"], transB=1, name="fc"),
             helper.make_node("Softmax", ["logits"], ["prob"], axis=1, name="softmax")]
    model = make_model(nodes, [("x", [1, 64])], [("prob", [1, 1000])], {"w": weight})
    feeds = [{"x": rng.standard_normal((1, 64), dtype=np.float32)} for _ in range(24)]
    compiled = tessera.compile(model, "pynq", calibration=feeds[:4])
    assert "QSoftmax" in [p.op for p in compiled.compiled.placements]
    reference = compiled.compiled.reference
    scale = output_scales(reference)["prob"]
    for feed in feeds[4:]:
        ours, _ = compiled.run(feed, backend="sim")
        agreement = int8_agreement(ours["prob"], reference_outputs(reference, feed)["prob"],
                                   scale)
        assert agreement.identical == agreement.elements, agreement


@pytest.mark.parametrize("shape,axis,x_scale,y_scale,y_zero", [
    ((6, 10), -1, 0.3, 1 / 256, -128), ((6, 1000), 1, 0.05, 1 / 256, -128),
    ((3, 100, 1, 1), 1, 0.011, 0.0031, -120)])
def test_qlinear_softmax_golden_matches_onnxruntime(shape, axis, x_scale, y_scale, y_zero):
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, shape).astype(np.int8)
    x[:2] //= 8  # near ties: many equal values
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs"], ["xf"]),
             helper.make_node("Softmax", ["xf"], ["y"], axis=axis),
             helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["q"])]
    graph = helper.make_graph(
        nodes, "qsoftmax", [helper.make_tensor_value_info("x", onnx.TensorProto.INT8, shape)],
        [helper.make_tensor_value_info("q", onnx.TensorProto.INT8, shape)],
        [numpy_helper.from_array(np.array(x_scale, np.float32), "xs"),
         numpy_helper.from_array(np.array(y_scale, np.float32), "ys"),
         numpy_helper.from_array(np.array(y_zero, np.int8), "yz")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (expected,) = session(model).run(None, {"x": x})
    table = qlinear_softmax_table(x_scale, shape[1])
    np.testing.assert_array_equal(qlinear_softmax(x, table, y_scale, y_zero, axis), expected)


# --------------------------------------------------------- a small model, run
@pytest.mark.parametrize("quantizer", ["tessera", "ort-default"])
def test_squeezenet_with_random_weights_at_64x64(quantizer):
    model = _resized(light_zoo.with_random_weights(light_zoo.shipped("squeezenet")), 64, 64)
    shape = (1, 3, 64, 64)
    calibration = light_zoo.samples(model, 4, seed=0, shape=shape)
    feed = light_zoo.samples(model, 2, seed=1, shape=shape)[1]
    result = light_zoo.compile_and_compare("squeezenet", model, quantizer, calibration, feed)
    assert result.layers == 26 and result.layers_on_accelerator == 26, result.layers_on_cpu
    assert result.accepted, result


# ------------------------------------------------------------- the whole models
def _check(result: light_zoo.Result) -> None:
    print(f"\n{result.HEADER}\n{result.row()}")  # the benchmark's row, in CI's log (-s)
    assert result.identical >= 0.999 and result.max_steps <= 1, result
    assert not result.layers_on_cpu, "\n".join(result.layers_on_cpu)
    assert result.layers_on_accelerator == result.layers, result


@pytest.mark.models
@pytest.mark.parametrize("name", light_zoo.MODELS)
def test_light_model_as_shipped(name):
    _check(light_zoo.run(name, "tessera", random_weights=False))


@pytest.mark.models
@pytest.mark.parametrize("name,quantizer", light_zoo.ACCEPTANCE)
def test_light_model_with_random_weights(name, quantizer):
    _check(light_zoo.run(name, quantizer, random_weights=True))
