"""1-D convolutions on the accelerator: a QDQ ``Conv`` over ``N x C x L`` runs as a 2-D one of
height 1 between views (compiler/frontend/qdq_views.py), bit-exact with onnxruntime's int8
kernels, in the plain, strided, dilated, depthwise and grouped forms."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.compiler.golden.check import reference_outputs
from tessera.hostmodel import get_host_model

from tests.compiler.qdq_models import FORMS, feeds, ort_quantize

#: A host so slow that every integer node goes to the accelerator (small test shapes).
SLOW_HOST = get_host_model("cortex-a9").scaled(1e4)


def conv1d_net(layers: list[dict], channels: int = 8, length: int = 24,
               seed: int = 0) -> onnx.ModelProto:
    """Float ``Conv -> Relu`` layers over an ``1 x channels x length`` input; each dict gives
    a layer's ``out``, ``k``, ``stride``, ``pads``, ``dilation`` and ``group``."""
    rng = np.random.default_rng(seed)
    nodes, inits, x, c = [], [], "x", channels
    for i, layer in enumerate(layers):
        o, k, group = layer.get("out", 16), layer.get("k", 3), layer.get("group", 1)
        inits += [numpy_helper.from_array(
                      (rng.standard_normal((o, c // group, k)) * 0.3).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(o) * 0.1).astype(np.float32),
                                          f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"],
                                   pads=list(layer.get("pads", [1, 1])),
                                   strides=[layer.get("stride", 1)],
                                   dilations=[layer.get("dilation", 1)], group=group,
                                   name=f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        x, c = f"r{i}", o
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    graph = helper.make_graph(
        nodes, "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                        [1, channels, length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _compile_and_compare(model: onnx.ModelProto, form: str = "default"):
    calibration = feeds(model, 4)
    qdq = ort_quantize(model, calibration, **FORMS[form])
    compiled = tessera.compile(qdq, "pynq", host=SLOW_HOST)
    for feed in calibration[:2]:
        outputs, profile = compiled.run(feed, backend="sim")
        np.testing.assert_array_equal(outputs["y"], reference_outputs(qdq, feed)["y"])
    return compiled, profile


GEOMETRIES = {
    "plain": {},
    "strided-k5": {"k": 5, "stride": 2, "pads": [2, 1]},
    "dilated": {"dilation": 2, "pads": [2, 2]},
    "pointwise": {"k": 1, "pads": [0, 0]},
    "depthwise": {"out": 8, "group": 8},
    "grouped": {"out": 16, "group": 2, "pads": [0, 2]},
}


@pytest.mark.parametrize("form", ["default", "u8-activations-per-channel"])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_conv1d_runs_on_the_accelerator_like_onnxruntime(geometry, form) -> None:
    compiled, _ = _compile_and_compare(conv1d_net([GEOMETRIES[geometry]]), form)
    placed = {p.op: p.target for p in compiled.compiled.placements}
    assert placed["QConv"] == "accelerator" and placed["Reshape"] == "view"
    assert "Conv" not in placed


def test_conv1d_chain_stays_in_one_program() -> None:
    """Between two lifted 1-D convolutions the tensor keeps its height-1 shape: no view
    between them, both convolutions in one accelerator program."""
    compiled, profile = _compile_and_compare(conv1d_net([{}, {"k": 5, "pads": [2, 2]}]))
    ops = [(p.op, p.target) for p in compiled.compiled.placements]
    convs = [i for i, (op, _) in enumerate(ops) if op == "QConv"]
    assert len(convs) == 2 and convs[1] == convs[0] + 1
    assert len(compiled.compiled.accel_steps) == 1
    assert sum(layer.cycles for layer in profile.layers
               if layer.placement == "accelerator") == profile.accel_cycles
