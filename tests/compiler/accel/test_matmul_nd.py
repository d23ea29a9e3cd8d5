"""MatMul of an N-D activation by a constant weight on the accelerator: ``[..., M, K] @ [K, N]``
runs as a dense layer over the ``prod(...) * M`` rows between views
(compiler/frontend/qdq_views.py), bit-exact with onnxruntime's int8 kernels; the dense
layer over many rows tiles close to its MAC floor."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.compiler import Dense, compile_ops, requantize
from tessera.compiler.golden.check import reference_outputs
from tessera.config import PRESETS

from tests.compiler.accel.test_conv1d import SLOW_HOST
from tests.compiler.qdq_models import FORMS, feeds, ort_quantize


def matmul_net(shape: tuple[int, ...], widths: list[int], bias: bool = True,
               seed: int = 0) -> onnx.ModelProto:
    """``x [shape] @ W1 (+ b1) -> Relu -> @ W2 ...``: one MatMul (and bias Add) per width."""
    rng = np.random.default_rng(seed)
    nodes, inits, x, k = [], [], "x", shape[-1]
    for i, n in enumerate(widths):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((k, n)) * 0.3).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"matmul{i}"))
        x = f"m{i}"
        if bias:
            inits.append(numpy_helper.from_array(
                (rng.standard_normal(n) * 0.1).astype(np.float32), f"b{i}"))
            nodes.append(helper.make_node("Add", [x, f"b{i}"], [f"a{i}"], name=f"bias{i}"))
            x = f"a{i}"
        if i + 1 < len(widths):
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
        k = n
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    graph = helper.make_graph(
        nodes, "matmul_nd", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _compile_and_compare(model: onnx.ModelProto, form: str = "default", **quantize):
    calibration = feeds(model, 4)
    qdq = ort_quantize(model, calibration, **FORMS[form], **quantize)
    compiled = tessera.compile(qdq, "pynq", host=SLOW_HOST)
    for feed in calibration[:2]:
        outputs, _ = compiled.run(feed, backend="sim")
        np.testing.assert_array_equal(outputs["y"], reference_outputs(qdq, feed)["y"])
    return compiled.compiled


@pytest.mark.parametrize("form", ["default", "u8-activations-per-channel"])
@pytest.mark.parametrize("shape,bias", [((1, 16, 32), True), ((2, 5, 32), False),
                                        ((2, 3, 4, 16), True)])
def test_nd_matmul_runs_on_the_accelerator_like_onnxruntime(shape, bias, form) -> None:
    # Without onnxruntime's pre-processing, which rewrites MatMul + Add as a Gemm itself.
    compiled = _compile_and_compare(matmul_net(shape, [24], bias), form, pre_process=False)
    placed = [(p.op, p.target) for p in compiled.placements]
    assert ("QGemm", "accelerator") in placed and ("MatMul", "cpu") not in placed
    assert {t for op, t in placed if op == "Reshape"} == {"view"}
    assert compiled.outputs[0].shape == (*shape[:-1], 24)


def test_matmul_chain_stays_in_one_program() -> None:
    """The rows of one lifted matmul feed the next without a view between them."""
    compiled = _compile_and_compare(matmul_net((1, 12, 32), [24, 8], bias=False),
                                    pre_process=False)
    gemms = [p.target for p in compiled.placements if p.op == "QGemm"]
    assert gemms == ["accelerator"] * 2 and len(compiled.accel_steps) == 1


def test_dense_over_many_rows_tiles_near_its_mac_floor() -> None:
    """A dense layer over 512 rows (a sequence's positions, as magika's first layer, which
    has 2048) tiles several rows per step with every input block: within 1.25x of
    MACs / 256 on pynq (K = 257 pads to 272: 1.06x of that is the padding)."""
    rng = np.random.default_rng(0)
    rows, k, n = 512, 257, 64
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    x = rng.integers(-128, 128, (rows, k), dtype=np.int8)
    op = Dense("d", "x", "y", w, epilogue=requantize(np.float32(1e-3)))
    program = compile_ops([op], {"x": x.shape}, PRESETS["pynq"])
    outputs, result = program.run({"x": x})
    acc = x.astype(np.int64) @ w.T.astype(np.int64)
    expected = np.clip(np.rint(acc.astype(np.float32) * np.float32(1e-3)), -128, 127)
    np.testing.assert_array_equal(outputs["y"].reshape(rows, n), expected)
    assert result.stats.cycles <= 1.25 * rows * k * n / 256
