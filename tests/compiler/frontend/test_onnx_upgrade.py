"""Models of any opset from 7 and of old IR versions: converted, repaired, or refused with
the node to blame; the classic CNNs that ship with onnx import as shipped."""
from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tessera.compiler.frontend.onnx_import import import_onnx, to_onnx
from tessera.errors import CompileError
from tests.compiler.frontend.onnx_models import F, make_model, round_trip, run_ort, weights

N = helper.make_node
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
NODE_TESTS = LIGHT.parent / "node"


def _small_cnn(opset: int) -> onnx.ModelProto:
    """Conv, Relu, MaxPool, Flatten, Gemm: ops whose versions changed between 7 and 27."""
    nodes = [N("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             N("Relu", ["c"], ["r"], name="relu"),
             N("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             N("Flatten", ["p"], ["f"], name="flatten"),
             N("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1)]
    constants = {"w": weights(1, 4, 3, 3, 3), "b": weights(2, 4), "fw": weights(3, 5, 64),
                 "fb": weights(4, 5)}
    # onnx 1.22 knows no IR version for opsets 26 and 27 (find_min_ir_version_for fails).
    return make_model(nodes, [("x", [1, 3, 8, 8])], [("y", [1, 5])], constants, opset=opset,
                      ir_version=13 if opset > 25 else None)


@pytest.mark.parametrize("opset", [7, 9, 11, 12, 13, 17, 21, 27])
def test_opsets_7_to_27_are_converted_and_logged(opset, caplog):
    with caplog.at_level(logging.INFO, logger="tessera.compiler"):
        graph = import_onnx(_small_cnn(opset))
    assert graph.ops() == ["Conv", "Relu", "MaxPool", "Flatten", "Gemm"]
    # onnxruntime 1.31 runs opsets up to 26; these ops are the same at 26 and 27.
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8), np.float32)
    np.testing.assert_array_equal(run_ort(to_onnx(graph), {"x": x})[0],
                                  run_ort(_small_cnn(min(opset, 26)), {"x": x})[0])
    converted = [r.getMessage() for r in caplog.records if "converted" in r.getMessage()]
    assert converted == ([] if opset == 17 else
                         [f"converted model 'test' from opset {opset} to 17"])


def test_converter_failure_names_the_node():
    # BatchNormalization's spatial=0 (per-element statistics) has no opset-9 form.
    stats = {k: np.ones((3, 4, 4), np.float32) for k in ("s", "b", "mean", "var")}
    nodes = [N("Relu", ["x"], ["r"], name="relu"),
             N("BatchNormalization", ["r", "s", "b", "mean", "var"], ["y"], name="bn1",
               spatial=0)]
    model = make_model(nodes, [("x", [1, 3, 4, 4])], [("y", [1, 3, 4, 4])], stats, opset=8)
    with pytest.raises(CompileError) as info:
        import_onnx(model)
    message = str(info.value)
    assert "BatchNormalization node 'bn1'" in message, message
    assert "from opset 8 to opset 17" in message and "spatial must have value 1" in message
    assert "/project/" not in message  # the converter's C++ file and line are left out
    assert info.value.op == "bn1"


def test_constants_of_old_op_versions_fold_after_conversion():
    # onnx.reference has no Upsample-7: the constant folds once converted (to a Resize).
    nodes = [N("Upsample", ["small"], ["big"], name="upsample", scales=[1.0, 2.0, 2.0]),
             N("Add", ["x", "big"], ["y"], name="add")]
    model = make_model(nodes, [("x", [1, 4, 6])], [("y", [1, 4, 6])],
                       {"small": weights(6, 1, 2, 3)}, opset=7)
    graph = round_trip(model)
    assert graph.ops() == ["Add"]
    assert graph.values[graph.node("add").inputs[1]].shape == (1, 4, 6)


def _newer_op(op, opset, constants=None, **attrs):
    """One node of an op that opset 17 does not have, on a (2, 4, 3, 3) input."""
    node = N(op, ["x", *(constants or {})], ["y"], name="user_node", **attrs)
    shape = [2, 4, 3, 3]
    return make_model([node], [("x", shape)], [("y", shape)], constants or {}, opset=opset,
                      ir_version=10)


NEWER_OPS = {
    "gelu": lambda: _newer_op("Gelu", 20),
    "gelu_tanh": lambda: _newer_op("Gelu", 20, approximate="tanh"),
    "mish": lambda: _newer_op("Mish", 22),
    "swish": lambda: _newer_op("Swish", 24),  # alpha left to its default
    "group_norm": lambda: _newer_op("GroupNormalization", 21,
                                    {"scale": weights(1, 4), "bias": weights(2, 4)},
                                    num_groups=2),
}


@pytest.mark.parametrize("case", NEWER_OPS, ids=list(NEWER_OPS))
def test_ops_newer_than_the_ir_opset_expand_to_their_onnx_functions(case):
    model = NEWER_OPS[case]()
    graph = import_onnx(model)
    assert model.graph.node[0].op_type not in graph.ops() and len(graph.nodes) > 1
    assert all(n.name.startswith("user_node/") for n in graph.nodes)
    x = np.random.default_rng(3).standard_normal((2, 4, 3, 3), np.float32)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(run_ort(to_onnx(graph), {"x": x})[0], expected, rtol=1e-5,
                               atol=1e-6)


def test_constant_axes_of_opset_18_reductions_convert():
    # onnx's own expanded MeanVarianceNormalization: ReduceMean-18's axes come from a
    # Constant node (value_ints), which the converter reads only as an initializer.
    model = onnx.load(NODE_TESTS / "test_mvn_expanded_ver18" / "model.onnx")
    graph = round_trip(model)
    reductions = [n for n in graph.nodes if n.op == "ReduceMean"]
    assert len(reductions) == 2 and all(n.attr("axes") == [0, 2, 3] for n in reductions)


# ------------------------------------------------------------------------ old IR
def _ir3_model(opset=9):
    """An IR-3 export: its weights listed as graph inputs too, as IR 3 requires."""
    model = _small_cnn(opset)
    model.ir_version = 3
    for tensor in model.graph.initializer:
        model.graph.input.append(helper.make_tensor_value_info(tensor.name, F, tensor.dims))
    return model


def test_weights_listed_as_inputs_are_constants():
    model = _ir3_model()
    onnx.checker.check_model(model)
    graph = round_trip(model)
    assert graph.inputs == ["x"]
    assert all(graph.values[k].is_const for k in ("w", "b", "fw", "fb"))


def test_ir3_model_quantized_by_onnxruntime_is_repaired(tmp_path):
    """onnxruntime's quantizer keeps IR 3 but adds scales that are not graph inputs: the
    checker refuses the result, onnxruntime runs it, and so does import."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Samples(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.samples = iter([{"x": rng.standard_normal((1, 3, 8, 8), np.float32)}
                                 for _ in range(2)])

        def get_next(self):
            return next(self.samples, None)

    onnx.save(_ir3_model(), tmp_path / "float.onnx")
    quantize_static(tmp_path / "float.onnx", tmp_path / "qdq.onnx", Samples(),
                    quant_format=QuantFormat.QDQ)
    qdq = onnx.load(tmp_path / "qdq.onnx")
    assert qdq.ir_version == 3
    with pytest.raises(onnx.checker.ValidationError, match="not in graph input"):
        onnx.checker.check_model(qdq)
    graph = round_trip(qdq)
    assert graph.inputs == ["x"]
    assert Counter(graph.ops())["DequantizeLinear"] >= 3


# ------------------------------------------------------------- the light model zoo
CLASSIC_CNNS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512"]


def test_onnx_ships_the_nine_classic_cnns():
    assert sorted(p.stem[len("light_"):] for p in LIGHT.glob("light_*.onnx")) == CLASSIC_CNNS


@pytest.mark.parametrize("name", CLASSIC_CNNS)
def test_classic_cnns_import_as_shipped(name):
    """Opset 9 (or so), IR 3, weights as ConstantOfShape(0.02): import converts, repairs
    and folds them: every conv and dense weight becomes a constant, whatever its size."""
    model = onnx.load(LIGHT / f"light_{name}.onnx")
    assert model.ir_version == 3 and model.opset_import[0].version < 13
    graph = import_onnx(model)
    expected = numpy_helper.to_array(onnx.load_tensor(LIGHT / f"light_{name}_output_0.pb"))
    assert len(graph.inputs) == 1 and graph.values[graph.inputs[0]].shape == (1, 3, 224, 224)
    assert [graph.values[o].shape for o in graph.outputs] == [expected.shape]
    ops = Counter(graph.ops())
    assert ops["Conv"] == Counter(n.op_type for n in model.graph.node)["Conv"] > 0
    convs = [n for n in graph.nodes if n.op == "Conv"]
    assert all(graph.values[n.inputs[1]].is_const for n in graph.nodes
               if n.op in ("Conv", "Gemm", "MatMul"))
    np.testing.assert_array_equal(np.unique(graph.const(convs[0].inputs[1])), [np.float32(0.02)])
