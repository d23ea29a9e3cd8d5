"""QLinearAdd as onnxruntime computes it, on every operand pair.

The path: MLAS's x86 kernel (``qladd_avx2.cpp``), which onnxruntime runs on AVX2 and
AVX-512 CPUs alike. On ARM onnxruntime computes QLinearAdd in fixed point (NEON), which
the golden model does not emulate: the comparison is skipped there, saying so.
"""
from __future__ import annotations

import platform

import numpy as np
import onnxruntime as ort
import pytest

from tessera.compiler import zoo
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qdq import fuse_qdq
from tessera.compiler.frontend.qlinear import qlinear_add_reference

from tests.compiler.qdq_models import every_pair, qlinear_binary_model, random_binary_params

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="onnxruntime's QLinearAdd on this CPU is MLAS's NEON fixed-point kernel; the "
           "golden model emulates the x86 (AVX2/AVX-512) float kernel")

def _onnxruntime_qlinear_add(a, b, params, dtype):
    """onnxruntime's com.microsoft QLinearAdd of ``a`` and ``b``."""
    model = qlinear_binary_model("QLinearAdd", params, dtype, list(a.shape), list(a.shape))
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"a": a, "b": b})[0].astype(np.int64)


def _assert_every_pair_agrees(params, dtype):
    a, b = every_pair(dtype)
    info = np.iinfo(dtype)
    want = _onnxruntime_qlinear_add(a, b, params, dtype)
    got = qlinear_add_reference(a, b, *params, info.min, info.max)
    wrong = np.nonzero(got != want)[1]
    assert not wrong.size, (
        f"{wrong.size} of {a.size} pairs differ for {params}, e.g. a={a[0, wrong[0]]} "
        f"b={b[0, wrong[0]]}: onnxruntime {want[0, wrong[0]]}, ours {got[0, wrong[0]]}")


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_random_parameter_sets_agree_on_every_pair(dtype):
    """150 random parameter sets (the uncontracted form of ``fixed`` fails 6 of them)."""
    rng = np.random.default_rng(0)
    for _ in range(150):
        _assert_every_pair_agrees(random_binary_params(rng, dtype), dtype)


def test_the_zoo_models_adds_agree_on_every_pair():
    """The parameter sets of real adds: small_resnet's residual adds, quantized by
    onnxruntime from calibration data."""
    model = zoo.small_resnet(blocks=(2, 2, 2))
    graph = import_onnx(zoo.to_qdq(model, zoo.calibration_data(model, 4)))
    fuse_qdq(graph)
    adds = [n for n in graph.nodes if n.op == "QAdd"]
    assert len(adds) >= 3
    for node in adds:
        p = node.attrs
        _assert_every_pair_agrees((p["a_scale"], p["a_zero_point"], p["b_scale"],
                                   p["b_zero_point"], p["y_scale"], p["y_zero_point"]),
                                  np.int8)
