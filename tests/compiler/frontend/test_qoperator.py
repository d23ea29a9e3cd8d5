"""QOperator models (onnxruntime's ``quantize_static(..., quant_format=QOperator)``):
``expand_qoperators`` and the compiled models against onnxruntime running the QOperator
model itself.

Op by op: a one-op float model quantized by onnxruntime (int8 and uint8 activations);
onnxruntime must compute the expanded QDQ model bit for bit as the QOperator model (the
rewrite is then exact by construction wherever the compiler reproduces the QDQ
pattern), and the compiled model must equal onnxruntime bit for bit. The lookup-table
ops, QLinearConcat and QLinearMul on every input value (pair); the zoo's models whole.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization as ortq
from onnxruntime.quantization.shape_inference import quant_pre_process

import tessera
from tessera.compiler import zoo
from tessera.compiler.frontend.qoperator import QOPERATOR_OPS, expand_qoperators
from tessera.compiler.golden.check import reference_outputs
from tessera.errors import CompileError
from tests.compiler.qdq_models import session

MS = "com.microsoft"
RNG = np.random.default_rng(15)
IMAGE = (1, 4, 8, 8)


def _weight(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def _float_model(nodes: list, inputs: dict[str, tuple], output: tuple,
                 weights: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "case",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output)],
        [numpy_helper.from_array(a, n) for n, a in (weights or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _one_op(op: str, inputs: dict[str, tuple], output: tuple,
            weights: dict[str, np.ndarray] | None = None, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, [*inputs, *(weights or {})], ["y"], name=op.lower(), **attrs)
    return _float_model([node], inputs, output, weights)


def _conv_then_pool() -> onnx.ModelProto:
    """QLinearGlobalAveragePool needs a quantized producer: the quantizer leaves a lone
    GlobalAveragePool float."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["y"], name="pool")]
    return _float_model(nodes, {"x": IMAGE}, (1, 6, 1, 1), {"w": _weight(6, 4, 3, 3)})


#: float op -> (float model, the QOperator op onnxruntime makes of it, the fused node the
#: compiler makes of its QDQ form, or None when it runs as float ops on the CPU).
CASES = {
    "Conv": (lambda: _one_op("Conv", {"x": IMAGE}, (1, 6, 8, 8),
                             {"w": _weight(6, 4, 3, 3), "b": _weight(6)}, pads=[1, 1, 1, 1]),
             "QLinearConv", "QConv"),
    "MatMul": (lambda: _one_op("MatMul", {"x": (3, 16)}, (3, 8), {"w": _weight(16, 8)}),
               "QLinearMatMul", "QGemm"),
    "Gemm": (lambda: _one_op("Gemm", {"x": (3, 16)}, (3, 8),
                             {"w": _weight(8, 16), "b": _weight(8)}, transB=1),
             "QGemm", "QGemm"),
    "Add": (lambda: _one_op("Add", {"x": IMAGE, "z": IMAGE}, IMAGE), "QLinearAdd", "QAdd"),
    "Mul": (lambda: _one_op("Mul", {"x": IMAGE, "z": IMAGE}, IMAGE), "QLinearMul", None),
    "AveragePool": (lambda: _one_op("AveragePool", {"x": IMAGE}, (1, 4, 4, 4),
                                    kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                    "QLinearAveragePool", "QAveragePool"),
    "GlobalAveragePool": (_conv_then_pool, "QLinearGlobalAveragePool", "QGlobalAveragePool"),
    "Concat": (lambda: _one_op("Concat", {"x": IMAGE, "z": IMAGE}, (1, 8, 8, 8), axis=1),
               "QLinearConcat", None),
    "Sigmoid": (lambda: _one_op("Sigmoid", {"x": IMAGE}, IMAGE), "QLinearSigmoid", "QLookup"),
    "LeakyRelu": (lambda: _one_op("LeakyRelu", {"x": IMAGE}, IMAGE, alpha=0.1),
                  "QLinearLeakyRelu", "QLookup"),
}
ACTIVATIONS = {"int8": ortq.QuantType.QInt8, "uint8": ortq.QuantType.QUInt8}


def _feeds(model: onnx.ModelProto, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Random inputs, each input at its own scale (so operands' scales differ)."""
    rng = np.random.default_rng(seed)
    return [{i.name: (rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
                      * (1 + k)).astype(np.float32)
             for k, i in enumerate(model.graph.input)} for _ in range(count)]


class _Reader(ortq.CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantize(model: onnx.ModelProto, activation: str = "int8",
             quant_format: ortq.QuantFormat = ortq.QuantFormat.QOperator,
             calibration: list[dict[str, np.ndarray]] | None = None) -> onnx.ModelProto:
    """``model`` quantized by onnxruntime (QOperator format unless told; int8 weights
    per channel; MinMax calibration on ``calibration``, else random inputs). Models with
    BatchNormalization get onnxruntime's pre-processing (folding it), as its docs ask."""
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "float.onnx", Path(tmp) / "quantized.onnx"
        onnx.save(model, str(source))
        if any(n.op_type == "BatchNormalization" for n in model.graph.node):
            quant_pre_process(str(source), str(source), skip_symbolic_shape=True)
        ortq.quantize_static(str(source), str(target),
                             _Reader(calibration or _feeds(model, 8, 1)),
                             quant_format=quant_format, per_channel=True,
                             activation_type=ACTIVATIONS[activation],
                             weight_type=ortq.QuantType.QInt8)
        return onnx.load(str(target))


def _expanded(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    expand_qoperators(copy)
    return copy


@pytest.fixture(scope="module", params=[(op, a) for op in CASES for a in ACTIVATIONS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def case(request) -> tuple[str, onnx.ModelProto]:
    op, activation = request.param
    return op, quantize(CASES[op][0](), activation)


def test_onnxruntime_computes_the_expansion_identically(case) -> None:
    op, qoperator = case
    expected = CASES[op][1]
    assert expected in [n.op_type for n in qoperator.graph.node]
    expanded = _expanded(qoperator)
    onnx.checker.check_model(expanded)
    assert not {(n.domain, n.op_type) for n in expanded.graph.node} & QOPERATOR_OPS
    theirs, ours = session(qoperator), session(expanded)
    for feed in _feeds(qoperator, 20, 2):
        # The models end in DequantizeLinear: equal floats are equal int8 values.
        np.testing.assert_array_equal(ours.run(None, feed)[0], theirs.run(None, feed)[0])


def test_compiled_qoperator_model_equals_onnxruntime(case) -> None:
    op, qoperator = case
    model = tessera.compile(qoperator, "pynq")
    fused = CASES[op][2]
    if fused is not None:
        assert fused in [p.op for p in model.compiled.placements]
    for feed in _feeds(qoperator, 5, 3):
        outputs, _ = model.run(feed)
        np.testing.assert_array_equal(outputs["y"], reference_outputs(qoperator, feed)["y"])


# ----------------------------------------------------- every input value, by hand
def _qlinear_model(op: str, dtype: str, params: list[tuple[float, int]], shape: list[int],
                   operands: int = 1, **attrs) -> onnx.ModelProto:
    """A one-node QOperator model on stored values: ``operands`` int8/uint8 inputs
    ``x<i>`` with ``params[i]`` (scale, zero point), output ``y`` with ``params[-1]``."""
    tensor_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = [f"x{i}" for i in range(operands)]
    initializers = []
    for name, (scale, zero_point) in zip([*names, "y"], params):
        initializers += [numpy_helper.from_array(np.float32(scale), f"{name}_scale"),
                         numpy_helper.from_array(np.array(zero_point, dtype), f"{name}_zp")]
    triples = [t for n in names for t in (n, f"{n}_scale", f"{n}_zp")]
    inputs = (["y_scale", "y_zp", *triples] if op == "QLinearConcat"
              else [*triples, "y_scale", "y_zp"])
    out_shape = list(shape)
    if op == "QLinearConcat":
        out_shape[attrs["axis"]] *= operands
    node = helper.make_node(op, inputs, ["y"], name=op.lower(), domain=MS, **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, tensor_type, shape) for n in names],
        [helper.make_tensor_value_info("y", tensor_type, out_shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def _params(dtype: str, count: int, rng: np.random.Generator) -> list[tuple[float, int]]:
    low = np.iinfo(dtype).min
    return [(float(np.float32(10 ** rng.uniform(-3, -0.5))),
             int(rng.integers(low + 20, low + 236))) for _ in range(count)]


def _every_value(dtype: str) -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(dtype)


def _compiled_and_reference(model: onnx.ModelProto, feed: dict[str, np.ndarray]
                            ) -> tuple[np.ndarray, np.ndarray]:
    outputs, _ = tessera.compile(model, "pynq").run(feed)
    return outputs["y"], reference_outputs(model, feed)["y"]


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("op, attrs", [("QLinearSigmoid", {}),
                                       ("QLinearLeakyRelu", {"alpha": 0.1})])
def test_lookup_table_ops_are_exact_on_every_value(op: str, attrs: dict, dtype: str) -> None:
    rng = np.random.default_rng(len(op) + len(dtype))
    for _ in range(3):
        model = _qlinear_model(op, dtype, _params(dtype, 2, rng), [1, 256], **attrs)
        ours, theirs = _compiled_and_reference(model, {"x0": _every_value(dtype)[None]})
        np.testing.assert_array_equal(ours, theirs)


def test_sigmoid_table_and_float_sigmoid_are_onnxruntimes_at_a_tie() -> None:
    """With these parameters (1 set in 3,000 random ones) a sigmoid one ulp from MLAS's
    (the correctly rounded one the CPU backend had before it took MLAS's logistic,
    ``fmath.sigmoid_f32``) quantizes one of the 256 inputs differently. The table, built
    by onnxruntime, and the float path both give onnxruntime's values."""
    from tessera.compiler.cpu import E, TensorSpec, fused_elementwise
    from tessera.runtime.cpu import load_kernel

    (x_scale, x_zp), (y_scale, y_zp) = params = [(0.026281438767910004, 70),
                                                 (0.0013317057164385915, -45)]
    values = _every_value("int8")
    model = _qlinear_model("QLinearSigmoid", "int8", params, [1, 256])
    ours, theirs = _compiled_and_reference(model, {"x0": values[None]})
    np.testing.assert_array_equal(ours, theirs)
    dequantized = ((values.astype(np.int32) - x_zp) * np.float32(x_scale)).astype(np.float32)
    kernel = load_kernel(fused_elementwise(E.input(0).sigmoid(),
                                           [TensorSpec(dequantized.shape, "float32")]))
    [sigmoid] = kernel(dequantized)
    float_path = np.clip(np.rint(sigmoid / np.float32(y_scale)) + y_zp, -128, 127)
    np.testing.assert_array_equal(float_path, theirs[0])


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_concat_is_exact_on_every_value(dtype: str) -> None:
    rng = np.random.default_rng(7)
    values = _every_value(dtype)[None]
    for _ in range(3):
        model = _qlinear_model("QLinearConcat", dtype, _params(dtype, 3, rng), [1, 256],
                               operands=2, axis=1)
        ours, theirs = _compiled_and_reference(model, {"x0": values, "x1": values[:, ::-1]})
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_mul_on_every_pair(dtype: str) -> None:
    """QLinearMul runs as float DQ -> Mul -> Q, onnxruntime's x86 kernel as
    ``rint(f32((a - az)(b - bz)) * f32(as * bs / ys) + yz)``: a numpy search over 200
    random parameter sets found them apart on 1 of 13.1 million pairs (by 1)."""
    rng = np.random.default_rng(11)
    a, b = np.meshgrid(_every_value(dtype), _every_value(dtype), indexing="ij")
    for _ in range(2):
        model = _qlinear_model("QLinearMul", dtype, _params(dtype, 3, rng), [256, 256],
                               operands=2)
        ours, theirs = _compiled_and_reference(model, {"x0": a.copy(), "x1": b.copy()})
        differ = ours != theirs
        assert differ.mean() <= 1e-5
        assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1


# ------------------------------------------------------------------- whole models
@pytest.mark.parametrize("name", ["mlp", "lenet", "small_resnet"])
def test_zoo_qoperator_model_compiles_as_its_qdq_twin_and_exactly(name: str) -> None:
    """The QOperator model and the QDQ model of the same float model and calibration
    compile to the same nodes on the same targets (conv, dense, add and pools on the
    accelerator), and the QOperator model's outputs are onnxruntime's."""
    float_model = zoo.ZOO[name]()
    calibration = zoo.calibration_data(float_model)
    qoperator = quantize(float_model, calibration=calibration)
    qdq = quantize(float_model, quant_format=ortq.QuantFormat.QDQ, calibration=calibration)
    model = tessera.compile(qoperator, "pynq")
    placed = [(p.op, p.target) for p in model.compiled.placements]
    assert placed == [(p.op, p.target) for p in tessera.compile(qdq, "pynq").compiled.placements]
    assert all(target == "accelerator" for op, target in placed if op in ("QConv", "QGemm"))
    for feed in zoo.calibration_data(float_model, 2, seed=7):
        outputs, _ = model.run(feed, backend="sim")
        reference = reference_outputs(qoperator, feed)
        for output, ours in outputs.items():
            np.testing.assert_array_equal(ours, reference[output])


# --------------------------------------------------------------------------- errors
def test_channels_last_pool_is_a_clear_error() -> None:
    model = _qlinear_model("QLinearGlobalAveragePool", "int8", [(0.1, 0), (0.1, 0)],
                           [1, 4, 4, 3], channels_last=1)
    with pytest.raises(CompileError, match="qlinearglobalaveragepool.*channels_last") as info:
        tessera.compile(model, "pynq")
    assert info.value.op == "qlinearglobalaveragepool"


def test_omitted_zero_points_are_zeros_of_the_tensor_type() -> None:
    model = _qlinear_model("QLinearSigmoid", "int8", [(0.05, 0), (1 / 256, 0)], [1, 256])
    node = model.graph.node[0]
    node.input[2] = node.input[4] = ""
    ours, theirs = _compiled_and_reference(model, {"x0": _every_value("int8")[None]})
    np.testing.assert_array_equal(ours, theirs)


def test_a_scale_computed_at_run_time_is_a_clear_error() -> None:
    model = _qlinear_model("QLinearSigmoid", "int8", [(0.05, 0), (1 / 256, 0)], [1, 8])
    scale = next(t for t in model.graph.initializer if t.name == "x0_scale")
    model.graph.initializer.remove(scale)
    model.graph.input.append(helper.make_tensor_value_info("x0_scale", TensorProto.FLOAT, []))
    with pytest.raises(CompileError, match="qlinearsigmoid.*'x0_scale' is not a constant"):
        tessera.compile(model, "pynq")
