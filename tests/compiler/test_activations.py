"""Activations on the accelerator, end to end: a QDQ model's unary int8 activations become
one QLookup each, run by the LUT plug-in in the producing convolution's epilogue
(bit-identical to onnxruntime), fall back to the CPU on a config without the table memory
or with the LUT unregistered, and run as sums of shifted ReLUs when asked to."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.config import PRESETS
from tessera.errors import CompileError
from tessera.isa import ALU_OPS

PYNQ = PRESETS["pynq"]
NO_LUT = PYNQ.replace(name="pynq-nolut", table_entries=0)


def conv_act_conv(act: str, channels: int = 16, size: int = 16, seed: int = 0):
    """A float Conv -> activation -> Conv model and its calibration feeds."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.normal(0, 0.3, (channels, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.1, (channels, channels, 3, 3))
                                 .astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1])]
    if act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["h"], ["s"]),
                  helper.make_node("Mul", ["h", "s"], ["a"])]
    else:
        nodes.append(helper.make_node(act, ["h"], ["a"]))
    nodes.append(helper.make_node("Conv", ["a", "w2"], ["y"], pads=[1, 1, 1, 1]))
    shape = [1, 3, size, size]
    graph = helper.make_graph(
        nodes, f"conv_{act}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])],
        [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(4)]
    return model, feeds


def reference(net, feed):
    session = ort.InferenceSession(net.compiled.reference.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def lookups(net):
    return [p for p in net.compiled.placements if p.op == "QLookup"]


@pytest.mark.parametrize("act", ["SiLU", "HardSwish", "Tanh", "Elu"])
def test_activation_runs_in_the_conv_epilogue_bit_exact(act):
    model, feeds = conv_act_conv(act)
    net = tessera.compile(model, PYNQ, calibration=feeds)
    (lookup,) = lookups(net)
    assert lookup.target == "accelerator" and "LUT pattern" in lookup.reason
    assert net.compiled.stats["segments"] == 1
    layers = [layer for step in net.compiled.steps if hasattr(step, "layers")
              for layer in step.layers]
    assert any(lookup.node in layer.nodes and len(layer.nodes) == 2 for layer in layers)
    out, _ = net.run(feeds[1], backend="sim")
    np.testing.assert_array_equal(out["y"], reference(net, feeds[1]))


def test_without_the_table_memory_the_lookup_runs_on_the_cpu():
    model, feeds = conv_act_conv("SiLU")
    net = tessera.compile(model, NO_LUT, calibration=feeds)
    (lookup,) = lookups(net)
    assert lookup.target == "cpu" and "activations='approximate'" in lookup.reason
    assert net.compiled.stats["segments"] == 2
    out, _ = net.run(feeds[1], backend="sim")
    np.testing.assert_array_equal(out["y"], reference(net, feeds[1]))


def test_unregistering_the_lut_falls_back_to_the_cpu():
    model, feeds = conv_act_conv("Tanh")
    lut = ALU_OPS.by_name("LUT")
    ALU_OPS.unregister("LUT")
    try:
        net = tessera.compile(model, PYNQ, calibration=feeds)
    finally:
        ALU_OPS.register(lut)
    assert lookups(net)[0].target == "cpu"
    assert tessera.compile(model, PYNQ, calibration=feeds).compiled.stats["segments"] == 1


def test_approximate_activations_stay_on_the_accelerator():
    model, feeds = conv_act_conv("Tanh")
    net = tessera.compile(model, NO_LUT, calibration=feeds, activations="approximate",
                          pieces=8)
    (lookup,) = lookups(net)
    assert lookup.target == "accelerator" and "approximated: a sum of" in lookup.reason
    assert net.compiled.stats["segments"] == 1
    out, _ = net.run(feeds[1], backend="sim")
    ref = reference(net, feeds[1])
    assert not np.array_equal(out["y"], ref)            # it is an approximation ...
    assert np.abs(out["y"] - ref).mean() < 0.05 * np.abs(ref).mean()   # ... a close one


def test_approximation_needs_pieces_or_tolerance():
    model, feeds = conv_act_conv("Tanh")
    with pytest.raises(CompileError, match="pieces=K or tolerance=T"):
        tessera.compile(model, NO_LUT, calibration=feeds, activations="approximate")
    with pytest.raises(CompileError, match="'exact' or 'approximate'"):
        tessera.compile(model, NO_LUT, calibration=feeds, activations="fast")


def concat_of_branches(seed: int = 3):
    """Two Conv -> SiLU branches of different ranges, concatenated, then a Conv: the
    quantizer gives each Concat input its own scale (a float Concat between Q/DQ)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    for k, spread in enumerate((0.2, 0.9)):
        inits.append(numpy_helper.from_array(
            rng.normal(0, spread, (16, 3, 3, 3)).astype(np.float32), f"w{k}"))
        nodes += [helper.make_node("Conv", ["x", f"w{k}"], [f"h{k}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Sigmoid", [f"h{k}"], [f"s{k}"]),
                  helper.make_node("Mul", [f"h{k}", f"s{k}"], [f"a{k}"])]
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, (16, 32, 1, 1))
                                         .astype(np.float32), "w2"))
    nodes += [helper.make_node("Concat", ["a0", "a1"], ["c"], axis=1),
              helper.make_node("Conv", ["c", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, [{"x": rng.normal(0, 1, (1, 3, 32, 32)).astype(np.float32)} for _ in range(4)]


def test_requantizing_concat_merges_into_the_activation_tables():
    """Each input's requantization to the Concat's scale is a table, merged into the SiLU
    table before it: the Concat becomes an int8 concat stored in place, one segment."""
    model, feeds = concat_of_branches()
    net = tessera.compile(model, PYNQ, calibration=feeds)
    by_op = {}
    for p in net.compiled.placements:
        by_op.setdefault(p.op, []).append(p)
    assert len(by_op["QLookup"]) == 2 and all(p.target == "accelerator"
                                               for p in by_op["QLookup"])
    assert [p.target for p in by_op["Concat"]] == ["accelerator"]
    assert net.compiled.stats["segments"] == 1
    out, _ = net.run(feeds[1], backend="sim")
    np.testing.assert_array_equal(out["y"], reference(net, feeds[1]))
