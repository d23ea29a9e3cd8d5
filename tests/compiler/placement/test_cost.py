"""The cost model's view of pruned weights: the accelerator's roofline counts the non-zero
weight blocks, the CPU's work the kept MACs of an N:M weight."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.placement.cost import node_weight, node_work, weight_density
from tessera.config import get_config
from tessera.compress.patterns import prune_blocks, prune_nm

PYNQ = get_config("pynq")


def conv_graph(w: np.ndarray):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w.shape[1], 14, 14])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx(onnx.shape_inference.infer_shapes(model))
    return g, g.nodes[0]


@pytest.fixture
def weight():
    return np.random.default_rng(0).standard_normal((64, 64, 3, 3)).astype(np.float32)


def test_nm_weights_count_their_kept_macs(weight):
    dense = node_work(*conv_graph(weight))
    half = node_work(*conv_graph(prune_nm(weight, 2, 4)))
    quarter = node_work(*conv_graph(prune_nm(weight, 1, 4)))
    assert half.ops * 2 == dense.ops and quarter.ops * 4 == dense.ops
    assert half.kind == dense.kind == "gemm_float"


def test_block_sparse_weights_shrink_the_accelerator_estimate(weight):
    g, node = conv_graph(weight)
    pruned = prune_blocks(weight, 0.75, 16, 16)
    gp, nodep = conv_graph(pruned)
    assert weight_density(g, node, PYNQ) == 1.0
    assert weight_density(gp, nodep, PYNQ) == pytest.approx(0.25)
    assert np.array_equal(node_weight(gp, nodep), pruned)
    assert node_work(gp, nodep).ops == node_work(g, node).ops    # not an N:M pattern
