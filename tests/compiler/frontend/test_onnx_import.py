"""ONNX import, constant folding and export: round trips through onnxruntime, bad models."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler import zoo
from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import fold_constants, import_onnx, to_onnx
from tessera.errors import CompileError
from tests.compiler.frontend.onnx_models import F, make_model, round_trip, run_ort, weights


# ---------------------------------------------------------------- hand-built models
def _conv_model():
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["y"], name="gap")]
    return make_model(nodes, [("x", [1, 3, 16, 16])], [("y", [1, 8, 1, 1])],
                      {"w": weights(1, 8, 3, 3, 3), "b": weights(2, 8)})


def _attribute_model():
    """String, float, int-list and tensor attributes, Constant nodes, a multi-output Split."""
    nodes = [helper.make_node("Constant", [], ["alpha"], name="k_alpha", value_float=0.5),
             helper.make_node("Constant", [], ["split"], name="k_split", value_ints=[1, 3]),
             helper.make_node("Constant", [], ["pads"], name="k_pads",
                              value=numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1]))),
             helper.make_node("Pad", ["x", "pads"], ["xp"], name="pad", mode="reflect"),
             helper.make_node("Split", ["xp", "split"], ["s0", "s1"], name="split", axis=1),
             helper.make_node("LeakyRelu", ["s1"], ["l"], name="leaky", alpha=0.1),
             helper.make_node("Mul", ["s0", "alpha"], ["m"], name="mul"),
             helper.make_node("Concat", ["m", "l"], ["cat"], name="cat", axis=1),
             helper.make_node("Transpose", ["cat"], ["t"], name="transpose", perm=[0, 2, 3, 1]),
             helper.make_node("Softmax", ["t"], ["y"], name="softmax", axis=-1)]
    return make_model(nodes, [("x", [1, 4, 5, 5])], [("y", [1, 7, 7, 4])])


def _initializer_input_model():
    """An older exporter's model: weights are graph inputs too, stored float64 and cast."""
    nodes = [helper.make_node("Cast", ["w64"], ["w"], name="cast_w", to=F),
             helper.make_node("Identity", ["w"], ["wi"], name="identity"),
             helper.make_node("MatMul", ["x", "wi"], ["y"], name="matmul")]
    model = make_model(nodes, [("x", [2, 6])], [("y", [2, 4])],
                       {"w64": weights(3, 6, 4).astype(np.float64)})
    model.graph.input.append(helper.make_tensor_value_info("w64", TensorProto.DOUBLE, [6, 4]))
    return model


@pytest.mark.parametrize("build", [_conv_model, _attribute_model, _initializer_input_model],
                         ids=["conv", "attributes", "initializer_inputs"])
def test_hand_built_models_round_trip(build):
    model = build()
    graph = round_trip(model)
    assert all(not graph.values[i].is_const for i in graph.inputs)


def test_constants_and_attributes_become_python_values():
    graph = round_trip(_attribute_model())
    assert "Constant" not in graph.ops()
    assert graph.node("pad").attrs == {"mode": "reflect"}
    assert graph.node("leaky").attr("alpha") == pytest.approx(0.1)
    assert graph.node("transpose").attr("perm") == [0, 2, 3, 1]
    np.testing.assert_array_equal(graph.const("split"), [1, 3])
    assert graph.values["s1"].shape == (1, 3, 7, 7) and graph.values["y"].dtype == "float32"


def test_initializer_inputs_are_constants_and_weight_casts_fold():
    graph = round_trip(_initializer_input_model())
    assert graph.inputs == ["x"] and graph.ops() == ["MatMul"]
    assert graph.values[graph.node("matmul").inputs[1]].dtype == "float32"


def _pytorch_flatten_model():
    """x.flatten(1) @ W.T + b as torch.onnx exports it with a dynamic batch."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="/Shape"),
             helper.make_node("Constant", [], ["zero"], name="/Constant",
                              value=numpy_helper.from_array(np.array(0))),
             helper.make_node("Gather", ["shape", "zero"], ["batch"], name="/Gather", axis=0),
             helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"], name="/Unsqueeze"),
             helper.make_node("Concat", ["batch1", "minus1"], ["target"], name="/Concat",
                              axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"], name="/Reshape"),
             helper.make_node("Gemm", ["flat", "w", "b"], ["y"], name="/fc/Gemm", transB=1)]
    return make_model(nodes, [("x", ["N", 4, 3, 3])], [("y", ["N", 5])],
                      {"axes": np.array([0]), "minus1": np.array([-1]), "w": weights(4, 5, 36),
                   "b": weights(5, 5)})


def test_pytorch_flatten_chain_folds_into_one_reshape():
    graph = round_trip(_pytorch_flatten_model(), input_shapes={"x": (2, 4, 3, 3)})
    assert graph.ops() == ["Reshape", "Gemm"]
    np.testing.assert_array_equal(graph.const(graph.node("/Reshape").inputs[1]), [2, -1])
    assert graph.values["flat"].shape == (2, 36) and graph.values["y"].shape == (2, 5)


def test_fold_constants_keeps_dequantize_and_huge_outputs():
    graph = Graph("fold")
    graph.add_input("x", (4,), "float32")
    graph.add_const("q", np.array([1, -2, 3, 4], np.int8))
    graph.add_const("scale", np.array(0.5, np.float32))
    graph.add_const("big_shape", np.array([2048, 4096], np.int64))
    graph.add_const("two", np.array([2.0], np.float32))
    for name, shape, dtype in (("dq", (4,), "float32"), ("big", (2048, 4096), "float32"),
                               ("y", (4,), "float32"), ("twice", (1,), "float32")):
        graph.add_value(name, shape, dtype)
    graph.add_node("DequantizeLinear", ["q", "scale"], ["dq"], name="dq")
    graph.add_node("ConstantOfShape", ["big_shape"], ["big"], name="big")
    graph.add_node("Add", ["two", "two"], ["twice"], name="add_consts")
    graph.add_node("Add", ["x", "dq"], ["y"], name="add")
    graph.outputs = ["y", "big", "twice"]
    assert fold_constants(graph) == 1
    graph.verify()
    assert graph.ops() == ["DequantizeLinear", "ConstantOfShape", "Add"]
    np.testing.assert_array_equal(graph.const("twice"), [4.0])


def test_fold_failure_names_the_node():
    graph = Graph("bad_fold")
    graph.add_const("a", np.arange(4, dtype=np.float32))
    graph.add_const("shape", np.array([3]))
    graph.add_value("b", (3,), "float32")
    graph.add_node("Reshape", ["a", "shape"], ["b"], name="bad_reshape")
    graph.outputs = ["b"]
    with pytest.raises(CompileError, match="Reshape node 'bad_reshape' has constant inputs"):
        fold_constants(graph)


def test_other_opsets_are_converted_to_the_ir_opset():
    # Opset 18 moved ReduceMean's axes to an input; the IR (opset 17) has the attribute.
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], name="mean", keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["y"], name="sub")]
    model = make_model(nodes, [("x", [2, 3, 4])], [("y", [2, 3, 4])], {"axes": np.array([2])},
                       opset=18)
    graph = round_trip(model)
    assert graph.node("mean").attr("axes") == [2]
    old = make_model([helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=1)],
                     [("x", [2, 5])], [("y", [2, 5])], opset=13)
    assert round_trip(old).ops() == ["Softmax"]


def _opset21_model(resize_attrs=None):
    """Ops onnx's converter has no downgrade for, used as opset 17 has them."""
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], name="pad", mode="reflect"),
             helper.make_node("Split", ["p"], ["s0", "s1"], name="split", axis=1, num_outputs=2),
             helper.make_node("Resize", ["s0", "", "scales"], ["r"], name="resize",
                              mode="nearest", **(resize_attrs or {})),
             helper.make_node("ReduceMax", ["s1", "axes"], ["y"], name="max", keepdims=0)]
    return make_model(nodes, [("x", [1, 4, 4, 4])], [("r", [1, 2, 12, 12]), ("y", [1, 2, 6])],
                      {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1]), "axes": np.array([2]),
                   "scales": np.array([1, 1, 2, 2], np.float32)}, opset=21)


def test_newer_opsets_are_converted_down_to_the_ir_opset():
    graph = round_trip(_opset21_model())
    assert graph.ops() == ["Pad", "Split", "Resize", "ReduceMax"]
    assert "num_outputs" not in graph.node("split").attrs
    assert graph.node("max").attr("axes") == [2]
    with pytest.raises(CompileError, match="'resize' uses antialias"):
        import_onnx(_opset21_model({"antialias": 1}))


def test_to_onnx_writes_other_opsets():
    graph = import_onnx(_conv_model())
    model = to_onnx(graph, opset=21)
    assert model.opset_import[0].version == 21
    x = np.ones((1, 3, 16, 16), np.float32)
    np.testing.assert_array_equal(run_ort(model, {"x": x})[0], run_ort(_conv_model(), {"x": x})[0])


def test_model_files_load(tmp_path):
    path = tmp_path / "conv.onnx"
    onnx.save(_conv_model(), path)
    assert import_onnx(path).ops() == import_onnx(str(path)).ops() == import_onnx(
        path.read_bytes()).ops()


# ---------------------------------------------------------------------- zoo models
ZOO_SMALL = ["mlp", "lenet", "small_resnet", "mobilenet"]


@pytest.mark.parametrize("name", ZOO_SMALL)
def test_zoo_float_models_round_trip(name):
    model = zoo.ZOO[name]()
    graph = round_trip(model)
    assert Counter(graph.ops()) == Counter(n.op_type for n in model.graph.node)


@pytest.mark.parametrize("name", ZOO_SMALL)
def test_zoo_qdq_models_round_trip(name):
    model = zoo.ZOO[name]()
    qdq = zoo.to_qdq(model, zoo.calibration_data(model, n=2))
    graph = round_trip(qdq)
    assert Counter(graph.ops()) == Counter(n.op_type for n in qdq.graph.node)
    # Every weight stays int8 behind its DequantizeLinear (nothing folded into float).
    weights = [n for n in graph if n.op in ("Conv", "Gemm", "MatMul")]
    for node in weights:
        dq = graph.producer(node.inputs[1])
        assert dq is not None and dq.op == "DequantizeLinear"
        assert graph.values[dq.inputs[0]].dtype == "int8" and graph.values[dq.inputs[0]].is_const


def test_resnet18_imports():
    # How long import takes is measured in benchmarks/resnet18.py, not asserted here.
    model = zoo.resnet18()
    graph = import_onnx(model)
    graph.verify()
    ops = Counter(graph.ops())
    assert ops == Counter(n.op_type for n in model.graph.node)
    assert ops["Conv"] == 20 and ops["BatchNormalization"] == 20 and ops["Add"] == 8
    assert graph.values["layer4.1.out"].shape == (1, 512, 7, 7)
    assert graph.values["logits"].shape == (1, 1000)
    assert graph.values["conv1.weight"].is_const


# -------------------------------------------------------------------- bad models
def _opset(opset):
    """A Relu at ``opset``: outside the range the compiler takes for 6 and 28."""
    def build():
        return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                          [("x", [1, 4])], [("y", [1, 4])], opset=opset, ir_version=13)
    return build


def _missing_input():
    return make_model([helper.make_node("Add", ["x", "nope"], ["y"], name="adder")],
                      [("x", [1, 4])], [("y", [1, 4])])


def _out_of_order():
    return make_model([helper.make_node("Relu", ["t"], ["y"], name="late_relu"),
                   helper.make_node("Relu", ["x"], ["t"], name="early_relu")],
                  [("x", [1, 4])], [("y", [1, 4])])


def _unknown_op():
    return make_model([helper.make_node("Frobnicate", ["x"], ["y"], name="weird")],
                      [("x", [1, 4])], [("y", [1, 4])])


def _conv(**attrs):
    def build():
        return make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv1", **attrs)],
                          [("x", [1, 3, 8, 8])], [("y", ["n", "c", "h", "w"])],
                          {"w": weights(0, 4, 3, 3, 3)})
    return build


def _dynamic_batch():
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                      [("x", ["N", 3, 4, 4])], [("y", ["N", 3, 4, 4])])


def _contrib_op():
    gelu = helper.make_node("Gelu", ["x"], ["y"], name="gelu", domain="com.microsoft")
    model = make_model([gelu], [("x", [1, 4])], [("y", [1, 4])])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


BAD_MODELS = {
    "not_onnx": (lambda: b"this is not an ONNX model", {}, ["not an ONNX model"]),
    "opset_6": (_opset(6), {}, ["opset 6", "opsets 7 to 27"]),
    "opset_28": (_opset(28), {}, ["opset 28", "opsets 7 to 27"]),
    "missing_input": (_missing_input, {}, ["'adder'", "'nope'", "no graph input"]),
    "out_of_order": (_out_of_order, {}, ["'late_relu'", "'early_relu'", "topological"]),
    "unknown_op": (_unknown_op, {}, ["'weird'", "Frobnicate"]),
    "conv_kernel_shape": (_conv(kernel_shape=[5, 5]), {}, ["'conv1'", "kernel_shape [5, 5]"]),
    "conv_strides": (_conv(strides=[1, 1, 1]), {}, ["'conv1'", "strides"]),
    "conv_group": (_conv(group=2), {}, ["'conv1'", "group 2"]),
    "dynamic_batch": (_dynamic_batch, {}, ["'x'", "dim 0 ('N')", "--input-shape x=1,3,4,4",
                                           "input_shapes={'x': (1, 3, 4, 4)}"]),
    "unknown_input": (_dynamic_batch, {"x": (1, 3, 4, 4), "image": (1, 3)},
                      ["'image'", "not an input", "['x']"]),
    "contradicting_shape": (_dynamic_batch, {"x": (1, 3, 5, 4)},
                            ["'x'", "[1, 3, 5, 4]", "['?', 3, 4, 4]"]),
    "contrib_domain": (_contrib_op, {}, ["'gelu'", "com.microsoft"]),
}


@pytest.mark.parametrize("case", BAD_MODELS, ids=list(BAD_MODELS))
def test_bad_models_give_clear_errors(case):
    build, shapes, expected = BAD_MODELS[case]
    with pytest.raises(CompileError) as info:
        import_onnx(build(), shapes)
    message = str(info.value)
    for text in expected:
        assert text in message, message


def test_truncated_file_names_the_file(tmp_path):
    data = zoo.lenet().SerializeToString()
    path = tmp_path / "lenet.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CompileError, match="lenet.onnx") as info:
        import_onnx(path)
    assert "damaged" in str(info.value) or "truncated" in str(info.value)
    with pytest.raises(CompileError, match="no such file"):
        import_onnx(tmp_path / "missing.onnx")


def test_errors_name_the_node_in_op():
    with pytest.raises(CompileError) as info:
        import_onnx(_conv(strides=[1, 1, 1])())
    assert info.value.op == "conv1"
