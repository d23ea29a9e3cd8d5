"""QLinearMul as onnxruntime computes it, on every operand pair, and the QDQ ``Mul``
fusion (``QMul``) whose CPU kernel reproduces it; and a QDQ ``Add`` of a constant
(QLinearAdd with a constant operand in onnxruntime), fused into ``QAdd``.

The path: MLAS's SSE2 kernel (``qlmul.cpp``), the only x86 QLinearMul: onnxruntime runs
it on SSE2, AVX2 and AVX-512 CPUs alike (tests named ``x86``). On ARM, MLAS's NEON
kernel computes the same formula (ARM64) or rounds ties away from zero (ARM32); the
comparison is skipped there, saying so.
"""
from __future__ import annotations

import platform

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.cpu.lower import lower_node_to_cpu
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qdq import fuse_qdq
from tessera.compiler.frontend.qlinear import (_fma, qlinear_add_reference, qlinear_mul_ratio,
                                              qlinear_mul_reference)
from tessera.runtime.cpu import run_cpu_steps

from tests.compiler.qdq_models import every_pair, qlinear_binary_model, random_binary_params

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="onnxruntime's QLinearMul on this CPU is MLAS's NEON kernel; the reference "
           "emulates the x86 (SSE2, run on AVX2 and AVX-512 too) kernel")

DTYPES = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8}

#: Parameter sets (a_scale, a_zp, b_scale, b_zp, y_scale, y_zp) where computing
#: ``product * ratio + y_zp`` with an FMA would change 1 to 6 results: onnxruntime does not.
FMA_SENSITIVE = [
    (0.011793198995292187, 79, 0.050253480672836304, 100, 0.053318049758672714, -126),
    (0.03730784356594086, -126, 0.020168816670775414, -33, 0.050859205424785614, -95),
    (0.0906805545091629, -52, 0.006056637968868017, 104, 0.03255869075655937, 74),
]


def _session(model) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _qlinear_mul_model(params, dtype, a_shape, b_shape):
    """com.microsoft QLinearMul of inputs ``a`` and ``b``."""
    return qlinear_binary_model("QLinearMul", params, dtype, a_shape, b_shape)


def _first_difference(got, want, a, b, params) -> str:
    wrong = np.nonzero(got != want)
    if not wrong[0].size:
        return ""
    i = tuple(w[0] for w in wrong)
    return (f"{wrong[0].size} of {got.size} results differ for {params}, e.g. "
            f"a={a[i]} b={np.broadcast_to(b, a.shape)[i]}: onnxruntime {want[i]}, ours {got[i]}")


# ------------------------------------------------------------------ the reference
@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_x86_qlinear_mul_every_pair_random_parameter_sets(dtype):
    rng = np.random.default_rng(0)
    a, b = every_pair(dtype)
    info = np.iinfo(dtype)
    for _ in range(40):
        params = random_binary_params(rng, dtype)
        want = _session(_qlinear_mul_model(params, dtype, list(a.shape), list(b.shape))).run(
            None, {"a": a, "b": b})[0].astype(np.int64)
        got = qlinear_mul_reference(a, b, *params, info.min, info.max)
        assert not _first_difference(got, want, a, b, params), \
            _first_difference(got, want, a, b, params)


@pytest.mark.parametrize("params", FMA_SENSITIVE)
def test_x86_qlinear_mul_has_no_fma(params):
    """Where an FMA would round differently, onnxruntime agrees with the separate
    multiply and add (so the test can fail: the FMA form differs here)."""
    a, b = every_pair(np.int8)
    want = _session(_qlinear_mul_model(params, np.int8, list(a.shape), list(b.shape))).run(
        None, {"a": a, "b": b})[0].astype(np.int64)
    got = qlinear_mul_reference(a, b, *params, -128, 127)
    assert not _first_difference(got, want, a, b, params)
    product = ((a.astype(np.int32) - params[1]) * (b.astype(np.int32) - params[3]))
    ratio = qlinear_mul_ratio(params[0], params[2], params[4])
    fused = _fma(product.astype(np.float32), ratio,
                 np.full(product.shape, np.float32(params[5]), np.float32))
    assert (np.clip(np.rint(fused), -128, 127).astype(np.int64) != want).any()


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_x86_qlinear_mul_scalar_b_every_pair(dtype):
    """A one-element ``b`` (MLAS's IsScalarB kernel) computes the same."""
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype)
    a = np.arange(info.min, info.max + 1).astype(dtype).reshape(1, -1)
    for params in [random_binary_params(rng, dtype) for _ in range(3)]:
        session = _session(_qlinear_mul_model(params, dtype, list(a.shape), [1]))
        for value in range(info.min, info.max + 1):
            b = np.array([value], dtype)
            want = session.run(None, {"a": a, "b": b})[0].astype(np.int64)
            got = qlinear_mul_reference(a, b, *params, info.min, info.max)
            assert not _first_difference(got, want, a, b, params)


# ----------------------------------------------------- QDQ fusion and the CPU kernel
def _qdq_mul_model(params, dtype, constant_b: np.ndarray | None, shape=(1, 65536)):
    """DQ(a) * DQ(b) -> Q, ``b`` an input or the constant ``constant_b``: what
    onnxruntime's QDQ transformer runs as QLinearMul."""
    sa, za, sb, zb, sy, zy = params
    t = DTYPES[dtype]
    values = [("sa", sa, np.float32), ("za", za, dtype), ("sb", sb, np.float32),
              ("zb", zb, dtype), ("sy", sy, np.float32), ("zy", zy, dtype)]
    inits = [numpy_helper.from_array(np.array(v, ty), n) for n, v, ty in values]
    inputs = [helper.make_tensor_value_info("a", t, list(shape))]
    if constant_b is None:
        inputs.append(helper.make_tensor_value_info("b", t, list(shape)))
    else:
        inits.append(numpy_helper.from_array(constant_b, "b"))
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["fb"]),
             helper.make_node("Mul", ["fa", "fb"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["y"])]
    graph = helper.make_graph(nodes, "qdq_mul", inputs,
                              [helper.make_tensor_value_info("y", t, list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run_fused_on_cpu(model, feeds, op="QMul"):
    graph = import_onnx(model)
    # A uint8 model also gets the conversions to and from its int8 storage (.qshift).
    assert fuse_qdq(graph) == 1 and graph.ops().count(op) == 1, graph.ops()
    assert op[1:] not in graph.ops(), graph.ops()
    steps = [s for node in graph.nodes for s in lower_node_to_cpu(graph, node)]
    env = {name: feeds[name] for name in graph.inputs}
    run_cpu_steps(steps, env)
    return env[graph.outputs[0]].astype(np.int64)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_x86_qdq_mul_of_activations_fuses_to_onnxruntime_results(dtype, which):
    params = list(FMA_SENSITIVE[which])
    if dtype == np.uint8:
        params[1::2] = [v + 128 for v in params[1::2]]
    a, b = every_pair(dtype)
    model = _qdq_mul_model(tuple(params), dtype, None)
    want = _session(model).run(None, {"a": a, "b": b})[0].astype(np.int64)
    got = _run_fused_on_cpu(model, {"a": a, "b": b})
    assert not _first_difference(got, want, a, b, params)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_x86_qdq_mul_by_a_constant_scalar_fuses_to_onnxruntime_results(dtype):
    """``x * 0.5`` as onnxruntime's quantizer writes it: the 0.5 a stored constant behind
    its DequantizeLinear, every stored ``x`` against a few constants."""
    info = np.iinfo(dtype)
    a = np.resize(np.arange(info.min, info.max + 1).astype(dtype), (1, 65536))
    rng = np.random.default_rng(2)
    for _ in range(4):
        params = random_binary_params(rng, dtype)
        b = np.array(rng.integers(info.min, info.max + 1), dtype)
        model = _qdq_mul_model(params, dtype, b)
        want = _session(model).run(None, {"a": a})[0].astype(np.int64)
        got = _run_fused_on_cpu(model, {"a": a})
        assert not _first_difference(got, want, a, b, params)


def _qdq_add_constant_model(params, dtype, constant: np.ndarray, shape):
    """DQ(a) + DQ(constant) -> Q, which onnxruntime runs as QLinearAdd."""
    model = _qdq_mul_model(params, dtype, constant, shape)
    model.graph.node[2].op_type = "Add"
    return model


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_x86_qdq_add_of_a_constant_is_qlinear_add(dtype):
    """``x + c`` with ``c`` a stored constant: onnxruntime computes QLinearAdd's
    arithmetic (:func:`qlinear_add_reference`), every stored ``x`` against every ``c``
    (65,536 pairs, one ``c`` per run) for two parameter sets; the float path (DQ, Add, Q,
    what an unfused graph computes) differed from it in 5 of 4,160 such runs."""
    info = np.iinfo(dtype)
    a = np.arange(info.min, info.max + 1).astype(dtype).reshape(1, -1)
    rng = np.random.default_rng(3)
    for _ in range(2):
        params = random_binary_params(rng, dtype)
        for value in range(info.min, info.max + 1):
            b = np.full(a.shape, value, dtype)
            model = _qdq_add_constant_model(params, dtype, np.array(value, dtype), a.shape)
            want = _session(model).run(None, {"a": a})[0].astype(np.int64)
            got = qlinear_add_reference(a, b, *params, info.min, info.max)
            assert not _first_difference(got, want, a, b, params)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_x86_qdq_add_of_a_constant_fuses_to_onnxruntime_results(dtype):
    """The fused QAdd (the constant broadcast to ``b``) on the CPU, every stored ``x``
    against a few constants."""
    info = np.iinfo(dtype)
    a = np.arange(info.min, info.max + 1).astype(dtype).reshape(1, -1)
    rng = np.random.default_rng(4)
    params = random_binary_params(rng, dtype)
    for value in (info.min, info.max, params[3], int(rng.integers(info.min, info.max + 1))):
        model = _qdq_add_constant_model(params, dtype, np.array(value, dtype), a.shape)
        want = _session(model).run(None, {"a": a})[0].astype(np.int64)
        got = _run_fused_on_cpu(model, {"a": a}, "QAdd")
        assert not _first_difference(got, want, a, np.array(value), params)
