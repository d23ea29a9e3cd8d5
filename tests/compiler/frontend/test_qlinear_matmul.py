"""A QDQ MatMul of two int8/uint8 activations (attention's ``Q @ K.T``), which
onnxruntime runs as QLinearMatMul, fused into ``QMatMul`` and run by its CPU kernels:
onnxruntime's results exactly. With one reduced element (``K = 1``) every output is one
product, so a ``256 x 1 @ 1 x 256`` product covers all 65,536 operand pairs.

The arithmetic (exact int32 sums, then one float32 multiply, clamp and round to even)
has no FMA and no CPU-specific rounding: AVX2, AVX-512 and NEON compute the same.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.cpu.lower import lower_node_to_cpu
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qdq import fuse_qdq
from tessera.compiler.frontend.qlinear import qlinear_matmul_reference
from tessera.runtime.cpu import run_cpu_steps

DTYPES = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8}


def _qdq_matmul_model(params, a_shape, b_shape, y_shape, dtypes, relu=False):
    sa, za, sb, zb, sy, zy = params
    da, db, dy = dtypes
    inits = [numpy_helper.from_array(np.array(v, t), n) for n, v, t in [
        ("sa", sa, np.float32), ("za", za, da), ("sb", sb, np.float32), ("zb", zb, db),
        ("sy", sy, np.float32), ("zy", zy, dy)]]
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["fb"]),
             helper.make_node("MatMul", ["fa", "fb"], ["p"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
    nodes.append(helper.make_node("QuantizeLinear", ["r" if relu else "p", "sy", "zy"], ["y"]))
    graph = helper.make_graph(
        nodes, "qdq_matmul", [helper.make_tensor_value_info("a", DTYPES[da], a_shape),
                              helper.make_tensor_value_info("b", DTYPES[db], b_shape)],
        [helper.make_tensor_value_info("y", DTYPES[dy], y_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _onnxruntime(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0].astype(np.int64)


def _fused_on_cpu(model, feeds):
    graph = import_onnx(model)
    assert fuse_qdq(graph) == 1 and graph.ops().count("QMatMul") == 1, graph.ops()
    assert "MatMul" not in graph.ops(), graph.ops()
    steps = [s for node in graph.nodes for s in lower_node_to_cpu(graph, node)]
    env = {name: feeds[name] for name in graph.inputs}
    run_cpu_steps(steps, env)
    return env[graph.outputs[0]].astype(np.int64)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_every_operand_pair(dtype):
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1).astype(dtype)
    a, b = values.reshape(256, 1).copy(), values.reshape(1, 256).copy()
    rng = np.random.default_rng(0)
    for _ in range(3):
        params = (float(np.float32(rng.uniform(0.01, 0.1))), int(rng.integers(info.min, 128)),
                  float(np.float32(rng.uniform(0.01, 0.1))), int(rng.integers(info.min, 128)),
                  float(np.float32(rng.uniform(0.05, 0.5))), int(rng.integers(info.min, 128)))
        model = _qdq_matmul_model(params, [256, 1], [1, 256], [256, 256], (dtype,) * 3)
        want = _onnxruntime(model, {"a": a, "b": b})
        got = _fused_on_cpu(model, {"a": a, "b": b})
        assert np.array_equal(got, want), int((got != want).sum())
        assert np.array_equal(qlinear_matmul_reference(a, b, *params, info.min, info.max),
                              want)


@pytest.mark.parametrize("dtypes,relu", [((np.int8,) * 3, False), ((np.uint8,) * 3, True),
                                         ((np.uint8, np.int8, np.uint8), False)],
                         ids=["int8", "uint8-relu", "uint8xint8"])
def test_batched_attention_product(dtypes, relu):
    """``[2, 3, 9, K] @ [2, 1, K, 11]``: batches broadcast, sums of up to 64 products."""
    rng = np.random.default_rng(1)
    ia, ib = np.iinfo(dtypes[0]), np.iinfo(dtypes[1])
    a = rng.integers(ia.min, ia.max + 1, (2, 3, 9, 64)).astype(dtypes[0])
    b = rng.integers(ib.min, ib.max + 1, (2, 1, 64, 11)).astype(dtypes[1])
    params = (0.02, int(ia.min) + 100, 0.03, int(ib.min) + 120, 0.9, int(ia.min) + 90)
    model = _qdq_matmul_model(params, list(a.shape), list(b.shape), [2, 3, 9, 11], dtypes,
                              relu)
    want = _onnxruntime(model, {"a": a, "b": b})
    got = _fused_on_cpu(model, {"a": a, "b": b})
    assert np.array_equal(got, want), int((got != want).sum())
