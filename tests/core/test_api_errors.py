"""The Python API as a new user meets it (issue 15, item 6): advice by interface
(``TesseraError.fix``), config lookup, ``Model.run``'s arguments, random calibration,
GEMM sizes, and errors that name the user's nodes, not ones the pipeline made up."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.compiler import zoo
from tessera.compiler.model import _name_after_user_nodes, import_quantized
from tessera.config import get_config
from tessera.errors import (CLI, PYTHON, CompileError, ConfigError, ProgramError, RunError,
                            TesseraError, input_shape_fix)
from tessera.kernels.gemm import gemm_program, plan_gemm


def test_fix_is_shown_for_the_interface():
    exc = CompileError("model 'm' is a float model", op="x",
                       fix={PYTHON: "pass calibration=[...]", CLI: "give --calibration F"})
    assert str(exc) == "model 'm' is a float model; pass calibration=[...]"
    assert exc.describe(CLI) == "model 'm' is a float model; give --calibration F"
    assert exc.op == "x" and exc.fix[CLI] == "give --calibration F"
    # No advice of the interface's own: the Python one; no advice at all: the message.
    assert TesseraError("bad", fix={PYTHON: "do y"}).describe(CLI) == "bad; do y"
    assert RunError("bad").describe(CLI) == str(RunError("bad")) == "bad"
    with pytest.raises(ValueError, match="keyed by"):
        TesseraError("bad", fix={"shell": "do y"})
    assert input_shape_fix("x", (1, 3, 8, 8)) == {
        PYTHON: "give its shape, e.g. input_shapes={'x': (1, 3, 8, 8)}",
        CLI: "give its shape, e.g. --input-shape x=1,3,8,8"}
    assert input_shape_fix("t", (5,))[PYTHON].endswith("{'t': (5,)}")


def test_float_model_without_calibration_says_how_in_python():
    with pytest.raises(CompileError) as info:
        tessera.compile(zoo.lenet(), "tiny")
    message = str(info.value)
    assert message == ("model 'lenet' is a float model; pass calibration=[{input name: "
                       "array}, ...] (a few representative inputs) to quantize it to int8, "
                       "or give an int8 QDQ model")
    assert message.count("[") == message.count("]") and "--" not in message


def test_config_lookup_names_the_missing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for given in ("board.json", "configs/board"):
        with pytest.raises(ConfigError, match=f"config file '{tmp_path / given}' does not "
                                              r"exist: give an existing config JSON file or a "
                                              r"preset \(pynq, tiny, zcu104\)"):
            get_config(given)
    with pytest.raises(ConfigError, match=r"unknown config 'pynq2': give a preset \(pynq, "
                                          "tiny, zcu104\\) or the path of a config JSON file"):
        get_config("pynq2")
    with pytest.raises(ConfigError, match="'configs' is a directory"):
        (tmp_path / "configs").mkdir()
        get_config("configs")


@pytest.fixture(scope="module")
def lenet():
    net = zoo.lenet()
    model = tessera.compile(net, "tiny", calibration=zoo.calibration_data(net, 1))
    yield model, zoo.calibration_data(net, 1, seed=1)[0]["input"]
    model.close()


@pytest.mark.parametrize("inputs, words", [
    (lambda x: [x], r"inputs is a list; pass a dict of input name to array, \{'input': "
                    r"array\} \(or the array itself: the model has one input\)"),
    (lambda x: (x,), "inputs is a tuple"),
    (lambda x: {"input": [[1.0], [2.0, 3.0]]}, "input 'input' is not an array"),
    (lambda x: {"image": x}, r"unknown input\(s\) \['image'\]; the model's inputs are "
                             r"\['input'\]"),
    (lambda x: {"input": x[0]}, r"has shape \[1, 28, 28\], the model was compiled for "
                                r"\[1, 1, 28, 28\]"),
], ids=["list", "tuple", "ragged", "unknown-name", "shape"])
def test_run_refuses_inputs_it_cannot_take(lenet, inputs, words):
    model, x = lenet
    with pytest.raises(RunError, match=words):
        model.run(inputs(x))


def test_run_takes_a_dict_or_the_array_and_refuses_a_device_name(lenet):
    model, x = lenet
    by_name, _ = model.run({"input": x})
    alone, _ = model.run(x)
    np.testing.assert_array_equal(by_name["logits"], alone["logits"])
    with pytest.raises(RunError, match="device is a str, not a Device"):
        model.run(x, device="sim")


def _dynamic_model(dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """Two inputs, one with a dynamic batch and width; ``x`` an old-IR-style weight input."""
    x = helper.make_tensor_value_info("a", dtype, ["N", 3, 4, "W"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3, 4, 5])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "dyn", [x, b, w],
                              [y], [numpy_helper.from_array(np.ones(1, np.float32), "w")])
    return helper.make_model(graph)


def test_random_calibration_uses_the_shapes_given():
    feeds = zoo.calibration_data(_dynamic_model(), 3, input_shapes={"a": (1, 3, 4, 5)})
    assert len(feeds) == 3 and all(set(f) == {"a", "b"} for f in feeds)
    assert {f["a"].shape for f in feeds} == {(1, 3, 4, 5)} and feeds[0]["b"].shape == (1, 3, 4, 5)
    assert feeds[0]["a"].dtype == np.float32 and not np.array_equal(feeds[0]["a"],
                                                                     feeds[1]["a"])
    with pytest.raises(CompileError) as info:
        zoo.calibration_data(_dynamic_model(), 3)
    assert str(info.value).startswith("input 'a' has dynamic dims (shape ['?', 3, 4, '?'])")
    assert info.value.describe(CLI).endswith("--input-shape a=1,3,4,1")
    with pytest.raises(CompileError, match="input 'a' is int64: random calibration makes "
                                           "float samples only"):
        zoo.calibration_data(_dynamic_model(TensorProto.INT64), 1, input_shapes={"a": (1,) * 4})
    with pytest.raises(CompileError, match="has no inputs to make samples for: the file is "
                                           "empty, truncated or not an ONNX model"):
        zoo.calibration_data(onnx.ModelProto())


def test_gemm_sizes_are_checked():
    tiny = get_config("tiny")
    with pytest.raises(ProgramError, match="GEMM M=-5 must be positive"):    # batch 1
        plan_gemm(tiny, -5, 8, 8)
    with pytest.raises(ProgramError, match=r"GEMM K=6 must be a multiple of 4 for "
                                           r"config 'tiny' \(its 1x4x4 core\)"):
        gemm_program(tiny, np.zeros((4, 6), np.int8), np.zeros((4, 6), np.int8))
    with pytest.raises(ProgramError, match=r"A and B must be matrices; A has shape \[16\]"):
        gemm_program(tiny, np.zeros(16, np.int8), np.zeros((4, 4), np.int8))


def _conv_hardswish(rng) -> onnx.ModelProto:
    weights = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
               for n, s in (("w1", (8, 8, 3, 3)), ("w2", (8, 8, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="stem_conv", pads=[1] * 4),
             helper.make_node("HardSwish", ["c1"], ["h"], name="stem_hswish"),
             helper.make_node("Conv", ["h", "w2"], ["y"], name="head_conv")]
    graph = helper.make_graph(
        nodes, "hs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nodes_the_quantizer_writes_are_named_after_the_user_s():
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((1, 8, 8, 8)).astype(np.float32)} for _ in range(2)]
    graph, _ = import_quantized(_conv_hardswish(rng), None, samples, lambda *a: None)
    user = {"stem_conv", "stem_hswish", "head_conv"}
    # onnxruntime's pre-processing writes the HardSwish as two unnamed nodes today; named
    # or not, every float node carries the name of the user's node it computes.
    for node in graph.nodes:
        if node.op not in ("QuantizeLinear", "DequantizeLinear"):
            assert node.name.split("/")[0] in user, node.name


def test_unnamed_nodes_take_the_user_node_downstream():
    from tessera.compiler.frontend.onnx_import import import_onnx
    user = import_onnx(_conv_hardswish(np.random.default_rng(0)))
    # As onnxruntime writes it: HardSwish inlined, its parts unnamed, a Q/DQ pair between.
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="stem_conv"),
             helper.make_node("HardSigmoid", ["c1"], ["hs"]),
             helper.make_node("QuantizeLinear", ["hs", "s", "z"], ["hs_q"], name="hs_Q"),
             helper.make_node("DequantizeLinear", ["hs_q", "s", "z"], ["hs_d"], name="hs_DQ"),
             helper.make_node("Mul", ["c1", "hs_d"], ["h"]),
             helper.make_node("Relu", ["h"], ["extra"]),
             helper.make_node("Conv", ["extra", "w2"], ["y"], name="head_conv")]
    quantized = helper.make_model(helper.make_graph(nodes, "hs", [], []))
    _name_after_user_nodes(quantized, user)
    assert [n.name for n in quantized.graph.node] == [
        "stem_conv", "stem_hswish/HardSigmoid", "hs_Q", "hs_DQ", "stem_hswish/Mul",
        "head_conv/Relu", "head_conv"]


def test_a_float_conv_left_by_quantization_runs_on_the_cpu():
    """It once failed with advice to quantize the model although calibration was given;
    a float convolution now has a CPU kernel (compiler/cpu/conv_float.py)."""
    from tessera.compiler.cpu.lower import cpu_unsupported_reason
    from tessera.compiler.frontend.onnx_import import import_onnx
    graph = import_onnx(_conv_hardswish(np.random.default_rng(0)))
    assert graph.nodes[0].op == "Conv"
    assert cpu_unsupported_reason(graph, graph.nodes[0]) is None
