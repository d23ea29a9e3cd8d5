"""Shapes computed in the graph fold once ``input_shapes`` fixes the inputs; ``If`` on them
is inlined; run-time control flow and dynamic dims are refused with clear errors."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.errors import CLI, CompileError
from tests.compiler.frontend.onnx_models import F, make_model, round_trip, weights

N = helper.make_node
I64 = np.int64


def _flatten_by_shape_model():
    """Reshape to (batch, C*H*W) with the target computed from the input's shape, as
    exporters write a flatten of a dynamic-batch input (Shape, Gather, Mul, Concat)."""
    nodes = [N("Shape", ["x"], ["shape"], name="shape"),
             N("Gather", ["shape", "i0"], ["n"], name="n", axis=0),
             N("Gather", ["shape", "i1"], ["c"], name="c", axis=0),
             N("Gather", ["shape", "i2"], ["h"], name="h", axis=0),
             N("Gather", ["shape", "i3"], ["w"], name="w", axis=0),
             N("Mul", ["c", "h"], ["ch"], name="ch"),
             N("Mul", ["ch", "w"], ["chw"], name="chw"),
             N("Unsqueeze", ["n", "axes"], ["n1"], name="n1"),
             N("Unsqueeze", ["chw", "axes"], ["chw1"], name="chw1"),
             N("Concat", ["n1", "chw1"], ["target"], name="target", axis=0),
             N("Reshape", ["x", "target"], ["flat"], name="flatten"),
             N("MatMul", ["flat", "fc"], ["y"], name="fc")]
    constants = {"i0": np.array(0), "i1": np.array(1), "i2": np.array(2), "i3": np.array(3),
                 "axes": np.array([0]), "fc": weights(1, 24, 5)}
    return make_model(nodes, [("x", ["batch", 2, 3, 4])], [("y", ["batch", 5])], constants)


def test_reshape_target_from_the_input_shape_folds():
    graph = round_trip(_flatten_by_shape_model(), {"x": (3, 2, 3, 4)})
    assert graph.ops() == ["Reshape", "MatMul"]
    np.testing.assert_array_equal(graph.const(graph.node("flatten").inputs[1]), [3, 24])
    assert graph.values["y"].shape == (3, 5)


def _grid_model():
    """A detector head's grid, YOLO-style: x + (column, row) indices of every cell, built at
    run time from the input's shape with Range, Slice, Expand and ConstantOfShape."""
    one = numpy_helper.from_array(np.array([1.0], np.float32), "one")
    nodes = [N("Shape", ["x"], ["shape"], name="shape"),
             N("Gather", ["shape", "i2"], ["h"], name="h", axis=0),
             N("Gather", ["shape", "i3"], ["w"], name="w", axis=0),
             N("Range", ["i0", "h", "i1"], ["ys"], name="range_y"),
             N("Range", ["i0", "w", "i1"], ["xs"], name="range_x"),
             N("Cast", ["ys"], ["ysf"], name="cast_y", to=F),
             N("Cast", ["xs"], ["xsf"], name="cast_x", to=F),
             N("Unsqueeze", ["ysf", "ax1"], ["ycol"], name="ycol"),
             N("Slice", ["shape", "s2", "s4"], ["hw"], name="hw"),
             N("Expand", ["ycol", "hw"], ["rows"], name="expand_rows"),
             N("ConstantOfShape", ["hw"], ["ones"], name="ones", value=one),
             N("Mul", ["ones", "xsf"], ["cols"], name="cols"),
             N("Unsqueeze", ["cols", "ax0"], ["cols1"], name="cols1"),
             N("Unsqueeze", ["rows", "ax0"], ["rows1"], name="rows1"),
             N("Concat", ["cols1", "rows1"], ["cells"], name="cells", axis=0),
             N("Unsqueeze", ["cells", "ax0"], ["grid"], name="grid"),
             N("Add", ["x", "grid"], ["y"], name="add_grid")]
    constants = {"i0": np.array(0), "i1": np.array(1), "i2": np.array(2), "i3": np.array(3),
                 "ax0": np.array([0]), "ax1": np.array([1]), "s2": np.array([2]),
                 "s4": np.array([4])}
    return make_model(nodes, [("x", [1, 2, "H", "W"])], [("y", [1, 2, "H", "W"])], constants,
                      opset=13)


def test_detector_grid_folds_to_a_constant():
    graph = round_trip(_grid_model(), {"x": (1, 2, 6, 8)})
    assert graph.ops() == ["Add"]
    rows, cols = np.mgrid[0:6, 0:8]
    np.testing.assert_array_equal(graph.const(graph.node("add_grid").inputs[1]),
                                  np.stack([cols, rows])[None].astype(np.float32))


def test_dynamic_dims_without_input_shapes_say_how_to_give_them():
    with pytest.raises(CompileError) as info:
        import_onnx(_grid_model())
    message = str(info.value)  # from Python: the argument, and the command line's flag
    for text in ("input 'x'", "dim 2 ('H')", "[1, 2, '?', '?']",
                 "input_shapes={'x': (1, 2, 1, 1)}", "--input-shape x=1,2,1,1"):
        assert text in message, message
    on_the_command_line = info.value.describe(CLI)
    assert "--input-shape x=1,2,1,1" in on_the_command_line
    assert "input_shapes" not in on_the_command_line


def test_an_input_without_shape_says_how_to_give_it():
    model = make_model([N("Relu", ["x"], ["y"], name="relu")], [("x", None)], [("y", [2, 3])])
    with pytest.raises(CompileError) as info:
        import_onnx(model)
    message = str(info.value)
    assert "'x' has no shape" in message and "--input-shape x=D0,D1,..." in message, message
    assert "input_shapes={'x': (D0, D1, ...)}" in message, message
    assert round_trip(model, {"x": (2, 3)}).values["y"].shape == (2, 3)


def test_huge_constants_made_from_shapes_stay_nodes():
    # 2048 x 4096 float32 = 32 MB, over the fold limit: the shape folds, the tensor does not.
    nodes = [N("Shape", ["x"], ["shape"], name="shape"),
             N("ConstantOfShape", ["shape"], ["zeros"], name="zeros"),
             N("Add", ["x", "zeros"], ["y"], name="add")]
    model = make_model(nodes, [("x", ["N", 4096])], [("y", ["N", 4096])])
    graph = import_onnx(model, {"x": (2048, 4096)})
    assert graph.ops() == ["ConstantOfShape", "Add"]
    np.testing.assert_array_equal(graph.const(graph.node("zeros").inputs[0]), [2048, 4096])


# -------------------------------------------------------------------------------- If
def _branch(name, nodes, output, initializers=()):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, F, None)],
                             list(initializers))


def _if_on_batch_model():
    """Two Ifs on ``batch == 1`` with the same branches (so the same names inside, which
    sibling scopes may reuse). The then branch has an initializer of its own; the else
    branch holds a nested If (on a Constant) whose branch reads a tensor of the else
    branch."""
    scale = numpy_helper.from_array(np.array(3.0, np.float32), "k")
    then = _branch("then", [N("Relu", ["x"], ["t"], name="relu"),
                            N("Mul", ["t", "k"], ["then_out"], name="scale")], "then_out",
                   [scale])
    inner = _branch("inner", [N("Neg", ["t"], ["inner_out"], name="neg")], "inner_out")
    other = _branch("other", [N("Abs", ["t"], ["other_out"], name="abs")], "other_out")
    otherwise = _branch("else", [
        N("Tanh", ["x"], ["t"], name="tanh"),
        N("Constant", [], ["yes"], name="yes", value=numpy_helper.from_array(np.array(True))),
        N("If", ["yes"], ["else_out"], name="nested", then_branch=inner, else_branch=other)],
        "else_out")
    nodes = [N("Sigmoid", ["x"], ["s"], name="sigmoid"),
             N("Shape", ["x"], ["shape"], name="shape"),
             N("Gather", ["shape", "i0"], ["batch"], name="batch", axis=0),
             N("Equal", ["batch", "i1"], ["cond"], name="is_one"),
             N("If", ["cond"], ["chosen"], name="choose", then_branch=then,
               else_branch=otherwise),
             N("If", ["cond"], ["again"], name="again", then_branch=then,
               else_branch=otherwise),
             N("Add", ["chosen", "again"], ["both"], name="add_both"),
             N("Add", ["both", "s"], ["y"], name="add")]
    return make_model(nodes, [("x", ["N", 4])], [("y", ["N", 4])],
                      {"i0": np.array(0), "i1": np.array(1)})


@pytest.mark.parametrize("batch, ops", [(1, ["Relu", "Mul"]), (2, ["Tanh", "Neg"])])
def test_if_on_a_shape_is_inlined(batch, ops):
    graph = round_trip(_if_on_batch_model(), {"x": (batch, 4)})
    assert graph.ops() == ["Sigmoid", *ops, *ops, "Add", "Add"]
    names = [n.name for n in graph.nodes]
    if batch == 1:
        assert names[1:5] == ["choose/relu", "choose/scale", "again/relu", "again/scale"]
        assert graph.const(graph.node("again/scale").inputs[1]) == 3.0
    else:
        assert names[1:5] == ["choose/tanh", "choose/nested/neg", "again/tanh",
                              "again/nested/neg"]
    assert graph.values["chosen"].shape == (batch, 4)


def test_if_on_data_is_refused():
    model = _if_on_batch_model()
    graph = model.graph
    equal = next(n for n in graph.node if n.name == "is_one")
    equal.CopyFrom(N("Greater", ["x_sum", "zero"], ["cond"], name="positive"))
    graph.node.insert(0, N("ReduceSum", ["x"], ["x_sum"], name="sum", keepdims=0))
    graph.initializer.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
    with pytest.raises(CompileError) as info:
        import_onnx(model, {"x": (1, 4)})
    message = str(info.value)
    assert "If node 'choose' is not supported" in message
    assert "condition 'cond' depends on the input data" in message
    assert info.value.op == "choose"


def _loop_model():
    body = helper.make_graph(
        [N("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
         N("Add", ["acc_in", "x"], ["acc_out"], name="accumulate")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [1, 4])])
    loop = N("Loop", ["trips", "", "x"], ["y"], name="repeat", body=body)
    return make_model([loop], [("x", [1, 4])], [("y", [1, 4])], {"trips": np.array(3, I64)})


def _scan_model():
    body = helper.make_graph(
        [N("Add", ["state_in", "row"], ["state_out"], name="accumulate"),
         N("Identity", ["state_out"], ["out"], name="emit")], "body",
        [helper.make_tensor_value_info("state_in", F, [4]),
         helper.make_tensor_value_info("row", F, [4])],
        [helper.make_tensor_value_info("state_out", F, [4]),
         helper.make_tensor_value_info("out", F, [4])])
    scan = N("Scan", ["init", "x"], ["last", "y"], name="cumulate", body=body,
             num_scan_inputs=1)
    return make_model([scan], [("x", [3, 4])], [("last", [4]), ("y", [3, 4])],
                      {"init": np.zeros(4, np.float32)})


@pytest.mark.parametrize("build, op, name, why", [
    (_loop_model, "Loop", "repeat", "unrolled"),
    (_scan_model, "Scan", "cumulate", "LSTM, GRU or RNN")])
def test_loop_and_scan_are_refused(build, op, name, why):
    model = build()
    onnx.checker.check_model(model, full_check=True)  # valid models, just not supported
    with pytest.raises(CompileError) as info:
        import_onnx(model)
    message = str(info.value)
    assert f"{op} node {name!r} is not supported" in message and why in message, message
    assert info.value.op == name
