"""The float linear CPU kernels (MatMul, Gemm, Einsum, Conv, ConvTranspose) and ArgMax,
ArgMin, ReduceProd, ReduceL2 against onnxruntime, on random data and the forms the
onnx node tests do not cover (float32 Einsum, broadcast batches, 3-D and grouped convs,
an attention-shaped product of two activations)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.cpu.lower import cpu_unsupported_reason, lower_node_to_cpu
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.runtime.cpu import run_cpu_steps

_TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def _model(op, inputs, weights=None, **attrs):
    """One ``op`` node reading ``inputs`` (name -> array, graph inputs) and ``weights``
    (name -> array, initializers), the output's shape left to inference."""
    weights = weights or {}
    node = helper.make_node(op, [*inputs, *weights], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, _TYPES[a.dtype.type], a.shape)
                      for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.INT64 if op.startswith("Arg") else
                                       _TYPES[next(iter(inputs.values())).dtype.type], None)],
        [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model)


def _compare(op, inputs, weights=None, rtol=1e-5, atol=1e-5, **attrs):
    model = _model(op, inputs, weights, **attrs)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    graph = import_onnx(model)
    steps = [s for node in graph.nodes for s in lower_node_to_cpu(graph, node)]
    env = dict(inputs)
    run_cpu_steps(steps, env)
    got = env[graph.outputs[0]]
    assert got.dtype == want.dtype and got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("a_shape,b_shape", [
    ((2, 3, 5, 8), (2, 3, 8, 5)),       # attention-like: activation x activation
    ((3, 1, 4, 6), (1, 2, 6, 3)),       # broadcast batches
    ((7,), (2, 7, 3)), ((2, 4, 6), (6,)), ((5, 9), (9, 1)),
])
def test_matmul_of_two_activations(a_shape, b_shape):
    _compare("MatMul", {"a": _rand(*a_shape), "b": _rand(*b_shape, seed=1)})


@pytest.mark.parametrize("trans_a,trans_b,c_shape", [
    (0, 0, None), (1, 0, (5,)), (0, 1, (4, 1)), (1, 1, ()), (0, 0, (4, 5))])
def test_gemm_transposes_alpha_beta_and_broadcast_c(trans_a, trans_b, c_shape):
    a = _rand(*((6, 4) if trans_a else (4, 6)))
    b = _rand(*((5, 6) if trans_b else (6, 5)), seed=2)
    weights = {} if c_shape is None else {"c": _rand(*c_shape, seed=3) if c_shape
                                          else np.array(1.5, np.float32)}
    _compare("Gemm", {"a": a, "b": b}, weights, transA=trans_a, transB=trans_b,
             alpha=0.75, beta=1.25)


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhid,bhjd->bhij", [(1, 2, 5, 8), (1, 2, 6, 8)]),
    ("ij->ji", [(3, 4)]), ("ij->i", [(3, 4)]), ("i,i", [(6,), (6,)]),
    ("...ii->...i", [(2, 4, 4)]), ("bij,jk", [(2, 3, 4), (4, 2)]),
])
def test_einsum_float32(equation, shapes):
    inputs = {f"x{k}": _rand(*s, seed=k) for k, s in enumerate(shapes)}
    _compare("Einsum", inputs, equation=equation)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 3, 9), (4, 3, 3), {"pads": [1, 2], "strides": [2]}),                     # 1-D
    ((2, 4, 7, 6), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1], "pads": [2, 1, 0, 1]}),
    ((1, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 4, 5, 5), (3, 2, 2, 3, 3), {"pads": [0, 1, 1, 1, 1, 0]}),             # 3-D
])
def test_conv_float(x_shape, w_shape, attrs):
    weights = {"w": _rand(*w_shape, seed=1), "bias": _rand(w_shape[0], seed=2)}
    _compare("Conv", {"x": _rand(*x_shape)}, weights, **attrs)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 2, 5), (2, 3, 3), {"strides": [2], "output_padding": [1]}),
    ((2, 4, 3, 4), (4, 2, 3, 2), {"group": 2, "strides": [2, 3], "pads": [1, 0, 1, 1],
                                  "dilations": [1, 2]}),
    ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
])
def test_conv_transpose_float(x_shape, w_shape, attrs):
    weights = {"w": _rand(*w_shape, seed=1), "bias": _rand(w_shape[1] * attrs.get(
        "group", 1), seed=2)}
    _compare("ConvTranspose", {"x": _rand(*x_shape)}, weights, **attrs)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extreme_with_ties(op, last):
    x = np.round(_rand(3, 5, 4) * 2).astype(np.float32)     # many equal values
    _compare(op, {"x": x}, axis=1, keepdims=0, select_last_index=last)


@pytest.mark.parametrize("op", ["ReduceProd", "ReduceL2", "ReduceL1", "ReduceSumSquare"])
def test_new_reductions(op):
    _compare(op, {"x": _rand(3, 4, 5)}, axes=[0, 2], keepdims=1, rtol=1e-5)


def test_float64_einsum_is_refused_with_what_to_do():
    x = np.ones((2, 2))
    graph = import_onnx(_model("Einsum", {"x": x}, equation="ij->ji"))
    reason = cpu_unsupported_reason(graph, graph.nodes[0])
    assert "float64" in reason and "cast it" in reason, reason
