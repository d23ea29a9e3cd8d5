"""uint8 activations stored as int8 (``shift_uint8_to_int8``): what moves, what stays,
and the kernels that are not shift-invariant (QLinearAdd) against onnxruntime's uint8
arithmetic on every pair of operands."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qdq import DOMAIN, fuse_qdq
from tessera.compiler.frontend.qshift import shift_uint8_to_int8
from tessera.compiler.golden.quantized import run_reference
from tests.compiler.qdq_models import session

Params = tuple[float, int]


def _model(name: str, nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, list]],
           outputs: dict[str, int], consts: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(k, t, s) for k, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(k, t, list("nchw")) for k, t in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def add_model(dtype: str, a: Params, b: Params, y: Params, relu: bool = False,
              shape: tuple[int, ...] = (1, 1, 256, 256)) -> onnx.ModelProto:
    """Stored a, b -> DQ -> Add [-> Relu] -> Q -> stored y (onnxruntime: QLinearAdd)."""
    elem = TensorProto.INT8 if dtype == "int8" else TensorProto.UINT8
    consts = {}
    for name, (scale, zp) in (("a", a), ("b", b), ("y", y)):
        consts[f"{name}_scale"], consts[f"{name}_zp"] = np.float32(scale), np.array(zp, dtype)
    make = helper.make_node
    nodes = [make("DequantizeLinear", ["a", "a_scale", "a_zp"], ["af"]),
             make("DequantizeLinear", ["b", "b_scale", "b_zp"], ["bf"]),
             make("Add", ["af", "bf"], ["sum"], name="add")]
    if relu:
        nodes.append(make("Relu", ["sum"], ["act"]))
    nodes.append(make("QuantizeLinear", ["act" if relu else "sum", "y_scale", "y_zp"], ["y"]))
    return _model("qadd", nodes, {"a": (elem, list(shape)), "b": (elem, list(shape))},
                  {"y": elem}, consts)


def every_pair(dtype: str) -> dict[str, np.ndarray]:
    """Feeds a, b of shape (1, 1, 256, 256) holding every pair of 8-bit values."""
    values = np.arange(256) + np.iinfo(dtype).min
    a, b = np.meshgrid(values, values, indexing="ij")
    return {"a": a.reshape(1, 1, 256, 256).astype(dtype),
            "b": b.reshape(1, 1, 256, 256).astype(dtype)}


def _fused(model: onnx.ModelProto) -> Graph:
    graph = import_onnx(model)
    fuse_qdq(graph)
    return graph


@pytest.mark.parametrize("params, relu", [
    (((0.031, 140), (0.027, 101), (0.045, 122)), False),
    (((0.05, 128), (0.05, 128), (0.05, 128)), False),
    (((0.0213, 0), (0.0397, 0), (0.047, 0)), True),
    (((0.0132, 87), (0.0119, 160), (0.0133, 130)), True),
    (((0.0743, 8), (0.0217, 5), (0.087, 138)), False),
], ids=["asymmetric", "symmetric", "relu-outputs", "residual", "not-shift-invariant"])
def test_qadd_from_uint8_matches_onnxruntime_on_every_pair(params, relu) -> None:
    model = add_model("uint8", *params, relu=relu)
    graph = _fused(model)
    (add,) = [n for n in graph.nodes if n.domain == DOMAIN]
    assert add.op == "QAdd" and add.attrs["from_uint8"] == 1
    assert add.attrs["a_zero_point"] == params[0][1] - 128
    feed = every_pair("uint8")
    expected = session(model).run(None, feed)[0]
    np.testing.assert_array_equal(run_reference(graph, feed)["y"], expected)


def test_shift_invariant_arithmetic_would_not_do_for_qadd() -> None:
    """The int8 formula on the shifted values differs from onnxruntime's uint8 result
    (it adds the zero point in float32 before rounding): the from_uint8 attribute is
    needed, and the test above would catch its absence. (About one parameter set in
    four differs somewhere; this one on 8 pairs.)"""
    model = add_model("uint8", (0.0743, 8), (0.0217, 5), (0.087, 138))
    graph = _fused(model)
    (add,) = [n for n in graph.nodes if n.domain == DOMAIN]
    del add.attrs["from_uint8"]
    feed = every_pair("uint8")
    assert np.count_nonzero(run_reference(graph, feed)["y"]
                            != session(model).run(None, feed)[0]) > 0


def test_movers_carry_the_shift_and_zero_points_get_new_constants() -> None:
    """x -> Q(uint8) -> Concat(q, q) -> Transpose -> DQ -> y: the stored tensors turn
    int8; the Q and DQ, which shared one zero point constant, share its int8 copy; the
    original constant stays for the DQ that reads a tensor outside the set."""
    make = helper.make_node
    consts = {"s": np.float32(0.02), "zp": np.uint8(131)}
    nodes = [make("QuantizeLinear", ["x", "s", "zp"], ["q"]),
             make("Concat", ["q", "q"], ["qq"], axis=1),
             make("Transpose", ["qq"], ["qt"], perm=[0, 1, 3, 2]),
             make("DequantizeLinear", ["qt", "s", "zp"], ["y"]),
             make("Cast", ["x"], ["xi"], to=TensorProto.UINT8),
             make("DequantizeLinear", ["xi", "s", "zp"], ["z"])]
    model = _model("movers", nodes, {"x": (TensorProto.FLOAT, [1, 2, 4, 4])},
                   {"y": TensorProto.FLOAT, "z": TensorProto.FLOAT}, consts)
    graph = _fused(model)
    for name in ("q", "qq", "qt"):
        assert graph.values[name].dtype == "int8", name
    # The Cast's uint8 output is not a mover's: that set stays uint8, zero point and all.
    assert graph.values["xi"].dtype == "uint8"
    q, dq_y, dq_z = (graph.producer(t) for t in ("q", "y", "z"))
    assert q.inputs[2] == dq_y.inputs[2] != dq_z.inputs[2] == "zp"
    assert int(graph.const(q.inputs[2])) == 3
    feed = {"x": np.random.default_rng(1).uniform(0, 5, (1, 2, 4, 4)).astype(np.float32)}
    expected = session(model).run(None, feed)
    ref = run_reference(graph, feed)
    for name, want in zip(("y", "z"), expected):
        np.testing.assert_array_equal(ref[name], want)


def test_int8_graphs_are_left_alone() -> None:
    graph = _fused(add_model("int8", (0.031, 12), (0.027, -27), (0.045, -6)))
    before = {n: v.dtype for n, v in graph.values.items()}
    assert shift_uint8_to_int8(graph) == 0
    assert {n: v.dtype for n, v in graph.values.items()} == before
