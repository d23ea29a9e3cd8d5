"""The in-memory quantization pipeline (compiler/frontend/ort_quantize.py) against
onnxruntime's own file-based quant_pre_process + quantize_static: byte for byte the same
QDQ model, with almost nothing written to disk."""
from __future__ import annotations

import onnx
import pytest
from onnx import helper

from tessera.compiler import zoo
from tessera.compiler.frontend import quantize as q

PINNED = {"ActivationSymmetric": False, "WeightSymmetric": True}


def _bytes_written() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


def _through_files(model: onnx.ModelProto, calibration, **options) -> onnx.ModelProto:
    pinned = dict(PINNED, ActivationSymmetric=options.get("symmetric_activations", False))
    return q.quantize_through_files(model, calibration, pinned,
                                    per_channel=options.get("per_channel", True))


@pytest.mark.parametrize("build, options", [
    (zoo.small_resnet, {}),
    (lambda: zoo.mobilenet(image=32, width=0.25), {}),
    (zoo.lenet, {"per_channel": False}),
    (zoo.mlp, {"symmetric_activations": True}),
], ids=["small_resnet", "mobilenet", "lenet-per-tensor", "mlp-symmetric"])
def test_in_memory_quantization_is_onnxruntimes_byte_for_byte(build, options):
    model = build()
    calibration = zoo.calibration_data(model, 3)
    got = q.quantize_static(model, calibration, **options)
    assert got.SerializeToString() == _through_files(model, calibration,
                                                     **options).SerializeToString()


def test_a_gemm_with_a_row_bias_is_flattened_in_memory_too():
    # quant_pre_process fuses MatMul + Add([1, N]) into a Gemm with a 2-D bias, which
    # onnxruntime's quantizer rejects (magika's head): flattened before quantizing.
    import numpy as np
    w = helper.make_tensor("w", onnx.TensorProto.FLOAT, [8, 4],
                           np.linspace(-1, 1, 32, dtype=np.float32))
    b = helper.make_tensor("b", onnx.TensorProto.FLOAT, [1, 4], [0.1, -0.2, 0.3, 0.0])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        "head", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    calibration = [{"x": np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)}]
    got = q.quantize_static(model, calibration)
    assert any(n.op_type == "Gemm" for n in got.graph.node)
    assert got.SerializeToString() == _through_files(model, calibration).SerializeToString()


def test_quantizing_resnet18_writes_one_model_copy_not_seven():
    # Every write() of the process counts (/proc/self/io wchar): the file-based pipeline
    # writes the 46 MB model about seven times; in memory only onnxruntime's optimizer
    # output remains.
    model = zoo.resnet18(image=64, classes=10)
    weights = sum(len(t.raw_data) or 4 * len(t.float_data) for t in model.graph.initializer)
    calibration = zoo.calibration_data(model, 2)
    before = _bytes_written()
    q.quantize_static(model, calibration)
    assert _bytes_written() - before < 1.5 * weights
