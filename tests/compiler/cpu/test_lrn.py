"""The LRN CPU kernel (compiler/cpu/lrn.py) against onnxruntime, against its own order of
operations emulated in numpy (the sums bit for bit), and against the float64 formula
for what onnxruntime refuses (even sizes, ranks other than 4); and its refusals."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tessera.compiler.cpu import TensorSpec, build_lrn
from tessera.compiler.cpu.lower import cpu_unsupported_reason, lower_node_to_cpu
from tessera.compiler.cpu.lrn import lrn_window
from tessera.compiler.frontend.graph import Graph
from tessera.errors import CompileError, CpuKernelError
from tessera.runtime.cpu import load_kernel

# (shape, size, alpha, beta, bias): AlexNet's and GoogLeNet's LRN (5, 1e-4, 0.75, 1) on
# their shapes, planes of several tiles (the last partial), windows wider than C.
CASES = [
    ((1, 96, 27, 27), 5, 1e-4, 0.75, 1.0),
    ((2, 7, 5, 6), 3, 1e-4, 0.75, 1.0),
    ((1, 8, 45, 50), 5, 0.5, 0.6, 2.0),
    ((2, 16, 3, 4), 1, 0.3, 0.75, 1.0),
    ((1, 4, 2, 3), 11, 1.0, 0.75, 1.0),
    ((1, 9, 4, 4), 7, 2.0, 1.3, 0.5),
]


def run_lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    kernel = load_kernel(build_lrn(TensorSpec(x.shape, "float32"), size, alpha, beta, bias))
    (y,) = kernel(x)
    return y


def ort_lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, x.shape) for n in "xy"]
    model = helper.make_model(helper.make_graph([node], "lrn", io[:1], io[1:]),
                              opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def ort_order_scale(x: np.ndarray, size: int, alpha: float, bias: float) -> np.ndarray:
    """bias + alpha/size * (window sum of squares) in float32, summed in onnxruntime's
    order: channel 0's window in order, then a running sum (add the entering square,
    then the leaving one times -alpha/size)."""
    before, after = lrn_window(size)
    a = np.float32(alpha) / np.float32(size)
    sq, scale = x * x, np.empty_like(x)
    run = np.full(x[:, 0].shape, np.float32(bias), np.float32)
    for k in range(min(after, x.shape[1] - 1) + 1):
        run = run + a * sq[:, k]
    scale[:, 0] = run
    for c in range(1, x.shape[1]):
        if c + after < x.shape[1]:
            run = run + a * sq[:, c + after]
        if c - before - 1 >= 0:
            run = run + -a * sq[:, c - before - 1]
        scale[:, c] = run
    return scale


def lrn64(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """The ONNX formula in float64, each window summed directly."""
    before, after = lrn_window(size)
    x64 = x.astype(np.float64)
    total = np.zeros_like(x64)
    for c in range(x.shape[1]):
        total[:, c] = (x64[:, max(0, c - before):c + after + 1] ** 2).sum(axis=1)
    return x64 / (bias + alpha / size * total) ** beta


@pytest.mark.parametrize("shape, size, alpha, beta, bias", CASES)
def test_lrn_matches_onnxruntime(shape, size, alpha, beta, bias):
    x = (np.random.default_rng(size).standard_normal(shape) * 3).astype(np.float32)
    got = run_lrn(x, size, alpha, beta, bias)
    np.testing.assert_allclose(got, ort_lrn(x, size, alpha, beta, bias), rtol=1e-5, atol=0)


@pytest.mark.parametrize("shape, size, alpha, beta, bias", CASES)
def test_lrn_sums_in_onnxruntime_order(shape, size, alpha, beta, bias):
    """The scale is bit-identical to onnxruntime's running sum, the power within an ulp
    of the correctly rounded one (float64 pow rounded): the results are within 1 ulp."""
    x = (np.random.default_rng(size + 1).standard_normal(shape) * 3).astype(np.float32)
    scale = ort_order_scale(x, size, alpha, bias)
    power = np.power(scale.astype(np.float64), -np.float64(np.float32(beta)))
    want = x * power.astype(np.float32)
    got = run_lrn(x, size, alpha, beta, bias)
    np.testing.assert_array_max_ulp(got, want, maxulp=1)
    assert np.mean(got == want) > 0.999


@pytest.mark.parametrize("shape, size", [((2, 6, 3, 3), 2), ((1, 10, 7, 5), 4),
                                         ((2, 5, 9), 3), ((1, 9, 2, 3, 4), 6)])
def test_lrn_even_sizes_and_other_ranks_match_float64(shape, size):
    """What onnxruntime refuses (even sizes, rank != 4): the window is [c - floor((size-1)
    / 2), c + ceil((size-1)/2)], as the ONNX spec says."""
    x = (np.random.default_rng(size).standard_normal(shape) * 2).astype(np.float32)
    got = run_lrn(x, size, 0.7, 0.75, 1.5)
    np.testing.assert_allclose(got, lrn64(x, size, 0.7, 0.75, 1.5), rtol=1e-5, atol=0)


def test_lrn_window_is_the_spec_one():
    assert [lrn_window(s) for s in (1, 2, 3, 4, 5)] == [(0, 0), (0, 1), (1, 1), (1, 2), (2, 2)]


def test_lrn_kernel_rejects_bad_arguments():
    with pytest.raises(CpuKernelError, match="float32"):
        build_lrn(TensorSpec((1, 4, 2, 2), "int8"), 3)
    with pytest.raises(CpuKernelError, match="rank 2"):
        build_lrn(TensorSpec((4, 2), "float32"), 3)
    with pytest.raises(CpuKernelError, match="positive integer"):
        build_lrn(TensorSpec((1, 4, 2, 2), "float32"), 0)


def test_lrn_lowering_names_the_node_it_refuses():
    g = Graph("lrn")
    g.add_input("x", (4, 8), "float32")
    g.add_value("y", (4, 8), "float32")
    node = g.add_node("LRN", ["x"], ["y"], name="norm1", size=5)
    assert "rank 2" in cpu_unsupported_reason(g, node)
    with pytest.raises(CompileError, match="norm1"):
        lower_node_to_cpu(g, node)
