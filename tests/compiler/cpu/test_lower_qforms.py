"""CPU kernels of the fused nodes in the forms onnxruntime's quantizer writes beyond int8
per-channel: QAveragePool (QLinearAveragePool's float32 arithmetic), weights beyond
int8 (asymmetric uint8 weights), QAdd shifted from uint8. Each whole graph runs on the
CPU and equals the golden model (itself bit-identical to onnxruntime:
tests/compiler/frontend/test_qaverage_pool.py, test_qdq_forms.py, test_qshift.py)."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler.cpu.lower import lower_node_to_cpu
from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.frontend.qdq import DOMAIN, fuse_qdq
from tessera.compiler.golden.quantized import run_reference
from tessera.runtime.cpu import run_cpu_steps
from tests.compiler.frontend.test_qaverage_pool import every_pair_window, pool_model
from tests.compiler.frontend.test_qshift import add_model, every_pair
from tests.compiler.qdq_models import FORMS, feeds, ort_quantize, pool_net


def _on_cpu(graph: Graph, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    env = dict(feed)
    for node in graph.nodes:
        run_cpu_steps(lower_node_to_cpu(graph, node), env)
    return {name: env[name] for name in graph.outputs}


def _fused(model) -> Graph:
    graph = import_onnx(model)
    fuse_qdq(graph)
    return graph


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_average_pool_on_every_pair_of_a_two_tap_window(dtype) -> None:
    zero_point = 3 if dtype == "int8" else 131
    graph = _fused(pool_model(dtype, (1, 1, 256, 512), (0.05, zero_point), (0.05, zero_point),
                              kernel_shape=[1, 2], strides=[1, 2]))
    feed = {"x": every_pair_window(dtype)}
    np.testing.assert_array_equal(_on_cpu(graph, feed)["y"], run_reference(graph, feed)["y"])


POOLS = [  # (dtype, input H x W, attributes): padding, strides, ceil_mode, count_include_pad
    ("int8", (6, 7), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    ("uint8", (7, 6), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1],
                           count_include_pad=1)),
    ("int8", (7, 7), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    ("uint8", (8, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                           ceil_mode=1, count_include_pad=1)),
]


@pytest.mark.parametrize("dtype, size, attrs", POOLS)
def test_average_pools(dtype, size, attrs) -> None:
    rng = np.random.default_rng(23)
    info = np.iinfo(dtype)
    x_params = (float(rng.uniform(0.005, 0.2)), int(rng.integers(info.min, info.max + 1)))
    graph = _fused(pool_model(dtype, (2, 3, *size), x_params, x_params, **attrs))
    assert [n.op for n in graph.nodes if n.domain == DOMAIN] == ["QAveragePool"]
    feed = {"x": rng.integers(info.min, info.max + 1, (2, 3, *size)).astype(dtype)}
    np.testing.assert_array_equal(_on_cpu(graph, feed)["y"], run_reference(graph, feed)["y"])


@pytest.mark.parametrize("form", ["asymmetric-weights", "u8-weights"])
def test_weights_beyond_int8_run_as_two_int8_halves(form) -> None:
    model = pool_net()
    graph = _fused(ort_quantize(model, feeds(model, 8), pre_process=False, **FORMS[form]))
    conv = next(n for n in graph.nodes if n.op == "QConv")
    assert graph.values[conv.inputs[1]].dtype == "int16"
    steps = lower_node_to_cpu(graph, conv)
    assert [s.name.split(":")[-1] for s in steps] == ["conv", "conv1", conv.name]
    for feed in feeds(model, 2, seed=4):
        np.testing.assert_array_equal(_on_cpu(graph, feed)["y"],
                                      run_reference(graph, feed)["y"])


def test_qadd_shifted_from_uint8_on_every_pair() -> None:
    # A parameter set where the int8 formula on the shifted values would differ.
    graph = _fused(add_model("uint8", (0.0743, 8), (0.0217, 5), (0.087, 138)))
    (add,) = [n for n in graph.nodes if n.domain == DOMAIN]
    assert add.attrs["from_uint8"] == 1
    feed = every_pair("uint8")
    np.testing.assert_array_equal(_on_cpu(graph, feed)["y"], run_reference(graph, feed)["y"])
