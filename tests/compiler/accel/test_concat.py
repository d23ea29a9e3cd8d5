"""Concat along channels without a copy: the producers of its inputs store side by side
into the concat's DRAM buffer (compiler/accel/dram.py concat_parts), the concat itself
has no instructions. A QDQ Concat whose inputs share the output's quantization is a
Concat of the stored values (compiler/frontend/qdq_concat.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.compiler import Conv2d, compile_ops, requantize
from tessera.compiler.accel.ops import Concat
from tessera.compiler.golden.check import reference_outputs
from tessera.errors import CompileError

from tests.compiler.accel.test_conv1d import SLOW_HOST
from tests.compiler.helpers import PYNQ, TINY, compile_and_run
from tests.compiler.qdq_models import feeds, ort_quantize


def _branches(rng, widths=(16, 32, 5)):
    convs = [Conv2d(f"c{i}", "x", f"p{i}", rng.integers(-128, 128, (o, 8, 3, 3), dtype=np.int8),
                    padding=1, epilogue=requantize(np.float32(1e-3)))
             for i, o in enumerate(widths)]
    return convs, Concat("cat", tuple(c.output for c in convs), "y", tuple(widths))


@pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])
@pytest.mark.parametrize("read_back", [True, False], ids=["output", "arena"])
def test_producers_store_side_by_side(config, read_back) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (1, 8, 6, 7), dtype=np.int8)
    convs, cat = _branches(rng)
    after = Conv2d("after", "y", "z", rng.integers(-128, 128, (8, 53, 1, 1), dtype=np.int8),
                   epilogue=requantize(np.float32(1e-3)))
    outputs, _, compiled = compile_and_run([*convs, cat, after], {"x": x}, config,
                                           outputs=["y", "z"] if read_back else ["z"])
    alone = [compile_ops([c], {"x": x.shape}, config).run({"x": x})[0][c.output] for c in convs]
    expected = np.concatenate(alone, axis=1)
    z = compile_ops([after], {"y": expected.shape}, config).run({"y": expected})[0]["z"]
    np.testing.assert_array_equal(outputs["z"], z)
    if read_back:
        np.testing.assert_array_equal(outputs["y"], expected)
    places = compiled.dram.places
    assert {places[c.output].segment for c in convs} == {places["y"].segment}
    assert [places[c.output].offset - places["y"].offset for c in convs[:2]] == [
        0, 16 * 6 * 7 * config.out_width // 8]
    assert "cat" not in [name for name, _, _ in compiled.op_bounds]     # no instructions


def test_a_part_off_the_block_grid_is_refused_with_the_reason() -> None:
    rng = np.random.default_rng(0)
    convs, cat = _branches(rng, (5, 16))
    with pytest.raises(CompileError, match="'cat'.*'p1'.*multiple of 16"):
        compile_ops([*convs, cat], {"x": (1, 8, 6, 7)}, PYNQ)


def inception_like(first: int = 16, seed: int = 0) -> onnx.ModelProto:
    """Three convolution branches of one input concatenated, then a 1x1 convolution."""
    rng = np.random.default_rng(seed)
    inits = {"w1": (first, 8, 3, 3), "w2": (32, 8, 1, 1), "w3": (5, 8, 3, 3),
             "w4": (8, first + 37, 1, 1)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="branch1"),
             helper.make_node("Conv", ["x", "w2"], ["b"], name="branch2"),
             helper.make_node("Conv", ["x", "w3"], ["c"], pads=[1, 1, 1, 1], name="branch3"),
             helper.make_node("Concat", ["a", "b", "c"], ["cat"], axis=1, name="cat"),
             helper.make_node("Conv", ["cat", "w4"], ["y"], name="mix")]
    graph = helper.make_graph(
        nodes, "inception_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), k)
         for k, s in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _share_concat_parameters(qdq: onnx.ModelProto) -> onnx.ModelProto:
    """The QDQ model with the concat's inputs quantized as its output (a model as given by
    a quantizer that shares them; onnxruntime's default gives each input its own)."""
    nodes = list(qdq.graph.node)
    cat = next(n for n in nodes if n.op_type == "Concat")
    q_out = next(n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] == cat.output[0])
    for name in cat.input:
        dq = next(n for n in nodes if n.output[0] == name)
        q = next(n for n in nodes if n.output[0] == dq.input[0])
        for node in (dq, q):
            node.input[1], node.input[2] = q_out.input[1], q_out.input[2]
    return qdq


@pytest.mark.parametrize("first,shared,target", [(16, True, "accelerator"),
                                                 (5, True, "cpu"), (16, False, "accelerator")],
                         ids=["in-place", "off-grid", "own-parameters"])
def test_quantized_concat_matches_onnxruntime(first, shared, target) -> None:
    """Shared parameters and inputs on the block grid: the concat joins the convolutions'
    program. Off the grid: an int8 Concat on the CPU. Parameters of their own
    (onnxruntime's default): each input requantized to the output's parameters by a table
    (a QLookup in its convolution's epilogue), then the same in-place concat."""
    model = inception_like(first)
    calibration = feeds(model, 4)
    qdq = ort_quantize(model, calibration)
    if shared:
        qdq = _share_concat_parameters(qdq)
    compiled = tessera.compile(qdq, "pynq", host=SLOW_HOST)
    placed = {p.op: p for p in compiled.compiled.placements}
    assert placed["Concat"].target == target, placed["Concat"].reason
    if not shared:
        lookups = [p for p in compiled.compiled.placements if p.op == "QLookup"]
        assert lookups and all(p.target == "accelerator" for p in lookups)
    if target == "cpu":
        assert "whole blocks of 16 channels" in placed["Concat"].reason
    if target == "accelerator":
        assert len(compiled.compiled.accel_steps) == 1
    for feed in calibration[:2]:
        outputs, _ = compiled.run(feed, backend="sim")
        np.testing.assert_array_equal(outputs["y"], reference_outputs(qdq, feed)["y"])
