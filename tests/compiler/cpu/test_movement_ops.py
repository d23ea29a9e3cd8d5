"""The data-movement ops' CPU kernels and lowerings (Slice, Split, Gather,
GatherElements, Expand, Tile, DepthToSpace, SpaceToDepth, Upsample, Concat, views)
against onnxruntime: one-node models built with onnx.helper, imported and lowered as a
user's model is, run on the CPU kernels and compared bit for bit with onnxruntime's CPU
provider (data movement is exact). Shapes, axes and parameters are drawn at random
(seeded) besides the edge cases ONNX defines: negative axes and indices, negative
steps, out-of-range starts and ends, empty slices and parts.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tessera.compiler.cpu import (TensorSpec, build_gather, build_slice, build_split,
                                  build_tile)
from tessera.compiler.cpu.lower import cpu_unsupported_reason, lower_node_to_cpu
from tessera.compiler.frontend.graph import Graph
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.errors import CompileError, CpuKernelError
from tessera.runtime.cpu import load_kernel, run_cpu_steps

RNG = np.random.default_rng(15)
DTYPES = ["float32", "int8", "uint8", "int32", "bool"]


def data(shape, dtype: str = "float32") -> np.ndarray:
    if dtype == "float32":
        return RNG.standard_normal(shape).astype(np.float32)
    if dtype == "bool":
        return RNG.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


# ------------------------------------------------------------------------ harness
def model(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
          inputs: list[str] | None = None, outputs: int = 1, opset: int = 17,
          **attrs: Any) -> onnx.ModelProto:
    """A one-node model: ``feeds`` are graph inputs, ``consts`` initializers, ``inputs``
    the node's input names in order ("" for an omitted optional one)."""
    consts = consts or {}
    inputs = list(feeds) + list(consts) if inputs is None else inputs
    node = helper.make_node(op, inputs, [f"y{i}" for i in range(outputs)],
                            name=f"{op.lower()}_node", **attrs)
    graph = helper.make_graph(
        [node], "case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(outputs)],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in consts.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


def onnxruntime(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def run_graph(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    env = dict(feeds)
    for node in graph.nodes:
        run_cpu_steps(lower_node_to_cpu(graph, node), env)
    return env


def check(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
          inputs: list[str] | None = None, outputs: int = 1, **attrs: Any) -> list[np.ndarray]:
    """The node imported, lowered and run equals onnxruntime's, bit for bit."""
    m = model(op, feeds, consts, inputs, outputs, **attrs)
    graph = import_onnx(m)
    assert [n.op for n in graph.nodes] == [op]          # ran on a kernel, not folded
    env = run_graph(graph, feeds)
    expected = onnxruntime(m, feeds)
    for i, want in enumerate(expected):
        got = env[f"y{i}"]
        assert got.dtype == want.dtype and got.shape == want.shape, (i, got.shape, want.shape)
        np.testing.assert_array_equal(got, want)
    return expected


def hand_graph(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray],
               inputs: list[str], out_shapes: list[tuple[int, ...]], dtype: str,
               **attrs: Any) -> tuple[Graph, Any]:
    """A one-node graph built directly (ops or attributes import converts away)."""
    g = Graph(op)
    for name, a in feeds.items():
        g.add_input(name, a.shape, str(a.dtype))
    for name, a in consts.items():
        g.add_const(name, a)
    outs = [f"y{i}" for i in range(len(out_shapes))]
    for name, shape in zip(outs, out_shapes):
        g.add_value(name, shape, dtype)
    g.outputs = outs
    return g, g.add_node(op, inputs, outs, name=f"my_{op.lower()}", **attrs)


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


# -------------------------------------------------------------------------- Slice
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("starts, ends, axes, steps", [
    ((1, 2), (3, 7), (2, 3), None),                   # a box: contiguous rows
    ((0,), (2,), (-3,), None),                        # negative axis, whole rows
    ((-1, -2), (-100, 0), (3, 2), (-1, -1)),          # reversed, ends clamped below
    ((6, 1), (-9, 5), (-1, 1), (-2, 3)),              # negative and positive steps
    ((-1000,), (1000,), (0,), (1,)),                  # starts and ends clamped
    ((2**63 - 1, -2**63), (-2**63, 2**63 - 1), (1, 2), (-1, 1)),   # INT64 extremes
    ((5,), (2,), (3,), None),                         # empty: start after end
    ((3,), (3,), (1,), (-1,)),                        # empty: reversed, start == end
    ((0, 0, 0, 0), (1, 1, 1, 1), None, None),         # default axes: one element
])
def test_slice(starts, ends, axes, steps, dtype):
    consts = {"s": ints(*starts), "e": ints(*ends)}
    if axes is not None:
        consts["a"] = ints(*axes)
    if steps is not None:
        consts["st"] = ints(*steps)
    check("Slice", {"x": data((2, 4, 6, 9), dtype)}, consts)


def _random_slice(rank: int) -> tuple[tuple[int, ...], dict[str, np.ndarray]]:
    shape = tuple(int(n) for n in RNG.integers(1, 7, rank))
    axes = RNG.permutation(rank)[:RNG.integers(1, rank + 1)]
    starts = [int(RNG.integers(-2 * shape[a], 2 * shape[a] + 1)) for a in axes]
    ends = [int(RNG.integers(-2 * shape[a], 2 * shape[a] + 1)) for a in axes]
    steps = [int(RNG.choice([-3, -2, -1, 1, 2, 3])) for _ in axes]
    axes = [int(a) - rank * int(RNG.integers(0, 2)) for a in axes]    # some negative
    return shape, {"s": ints(*starts), "e": ints(*ends), "a": ints(*axes), "st": ints(*steps)}


@pytest.mark.parametrize("seed", range(16))
def test_slice_random(seed):
    shape, consts = _random_slice(1 + seed % 5)
    check("Slice", {"x": data(shape, DTYPES[seed // 3 % 5])}, consts)


def entry_ir(kernel) -> str:
    """The IR of the kernel's serial entry function."""
    body = kernel.ir.split('define void @"entry"(', 1)[1]
    return body.split("\n}\n", 1)[0]


def memcpys(kernel) -> list[int]:
    """The byte counts of the constant-length memcpy calls of the serial entry."""
    return [int(line.split("i64 ")[-1].split(",")[0]) for line in entry_ir(kernel).split("\n")
            if '@"llvm.memcpy' in line and "call" in line]


def test_slice_of_rows_is_one_memcpy_per_row():
    kernel = build_slice(TensorSpec((8, 16, 32), "float32"), [2], [6], [1])
    assert memcpys(kernel) == [4 * 32 * 4]       # in a loop over 8 rows
    assert kernel.parallel == 8
    x = data((8, 16, 32))
    run = load_kernel(kernel)
    np.testing.assert_array_equal(run(x, threads=2)[0], x[:, 2:6])


def test_slice_with_runtime_starts_says_what_to_do():
    g = Graph("dynamic")
    g.add_input("x", (4, 5), "float32")
    g.add_input("s", (1,), "int64")
    g.add_const("e", ints(3))
    g.add_value("y", (2, 5), "float32")
    node = g.add_node("Slice", ["x", "s", "e"], ["y"], name="crop")
    reason = cpu_unsupported_reason(g, node)
    assert "starts ('s') must be a constant" in reason and "computed while the model runs" in reason


# -------------------------------------------------------------------------- Split
@pytest.mark.parametrize("shape, sizes, axis, dtype", [
    ((4, 10), (3, 0, 7), -1, "float32"),      # a zero-size part
    ((6, 5), None, 0, "int8"),                # equal parts, as many as outputs
    ((2, 3, 4, 6), (1, 2), 1, "uint8"),
    ((2, 3, 4, 6), (2, 2, 2), -1, "int32"),   # short chunks
    ((9,), (4, 5), 0, "float32"),
])
def test_split(shape, sizes, axis, dtype):
    parts = 3 if sizes is None else len(sizes)
    consts = None if sizes is None else {"split": ints(*sizes)}
    check("Split", {"x": data(shape, dtype)}, consts, outputs=parts, axis=axis)


@pytest.mark.parametrize("shape, parts, axis", [((2, 7), 3, 1), ((8, 3), 4, 0),
                                                ((5, 3, 2), 2, -3)])
def test_split_num_outputs_opset18(shape, parts, axis):
    """num_outputs (opset 18): equal parts, the last one smaller."""
    x = data(shape)
    expected = onnxruntime(model("Split", {"x": x}, outputs=parts, opset=18, axis=axis,
                                 num_outputs=parts), {"x": x})
    g, _ = hand_graph("Split", {"x": x}, {}, ["x"], [e.shape for e in expected], "float32",
                      axis=axis, num_outputs=parts)
    env = run_graph(g, {"x": x})
    for i, want in enumerate(expected):
        np.testing.assert_array_equal(env[f"y{i}"], want)


def test_split_parallel_form_equals_serial():
    x = data((3, 6144))
    kernel = build_split(TensorSpec(x.shape, "float32"), 1, [2048, 0, 4096])
    assert memcpys(kernel) == [2048 * 4, 4096 * 4]
    assert kernel.parallel == 6                     # rows split in two pieces each
    outs = load_kernel(kernel)(x, threads=2)
    for got, want in zip(outs, np.split(x, [2048, 2048], axis=1)):
        np.testing.assert_array_equal(got, want)


def test_split_refuses_sizes_that_do_not_add_up():
    g, node = hand_graph("Split", {"x": data((4, 6))}, {"sp": ints(2, 3)}, ["x", "sp"],
                         [(4, 2), (4, 3)], "float32", axis=1)
    assert "sum to the size 6" in cpu_unsupported_reason(g, node)


# ------------------------------------------------------------------------- Gather
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, indices, axis", [
    ((5, 4, 3), [[0, -1], [2, 2]], 0),        # 2-D indices, negative, repeated
    ((5, 4, 3), 2, 1),                        # a scalar index drops the axis
    ((2, 6, 7), [6, 0, -7, 3], -1),           # innermost axis: single elements
    ((3, 8, 5), [2, 3, 4, 5], -2),            # one run: one copy per outer row
    ((1, 10, 4), [], 1),                      # no indices: an empty output
])
def test_gather_constant_indices(shape, indices, axis, dtype):
    check("Gather", {"x": data(shape, dtype)}, {"i": np.array(indices, np.int64)}, axis=axis)


def test_gather_one_run_is_one_memcpy():
    kernel = build_gather(TensorSpec((3, 8, 5), "float32"), np.array([2, 3, 4, 5]), axis=1)
    assert memcpys(kernel) == [4 * 5 * 4] and len(kernel.inputs) == 1


def test_gather_many_runs_pass_the_indices_as_an_array():
    indices = RNG.permutation(40)[:30] - 20          # 30 runs, some negative
    m = model("Gather", {"x": data((2, 40, 3))}, {"i": indices.astype(np.int64)}, axis=1)
    graph = import_onnx(m)
    [step] = lower_node_to_cpu(graph, graph.nodes[0])
    assert step.inputs == ("x", "gather_node:indices")
    assert step.constants["gather_node:indices"].dtype == np.int32
    check("Gather", {"x": data((2, 40, 3))}, {"i": indices.astype(np.int64)}, axis=1)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_runtime_indices(axis):
    x = data((4, 5, 6))
    n = x.shape[axis]
    i = RNG.integers(-n, n, (3, 2)).astype(np.int32)
    check("Gather", {"x": x, "i": i}, axis=axis)


def test_gather_runtime_indices_of_a_constant_table():
    """An embedding lookup: constant data, indices from the model's input."""
    i = RNG.integers(0, 50, (2, 7)).astype(np.int32)
    check("Gather", {"i": i}, {"table": data((50, 16))}, ["table", "i"])


def test_gather_runtime_indices_in_parallel():
    x, i = data((64, 9, 3)), np.array([8, -1, 0, 4], np.int32)
    kernel = build_gather(TensorSpec(x.shape, "float32"), TensorSpec(i.shape, "int32"), 1)
    np.testing.assert_array_equal(load_kernel(kernel)(x, i, threads=2)[0],
                                  np.take(x, i, axis=1))


def test_gather_out_of_range_constant_index_is_refused():
    g, node = hand_graph("Gather", {"x": data((4, 3))}, {"i": ints(1, 4)}, ["x", "i"],
                         [(2, 3)], "float32")
    assert "index 4 is out of range" in cpu_unsupported_reason(g, node)
    with pytest.raises(CompileError, match="my_gather"):
        lower_node_to_cpu(g, node)


# ----------------------------------------------------------------- GatherElements
@pytest.mark.parametrize("shape, index_shape, axis", [
    ((3, 4), (3, 4), 0), ((3, 4), (2, 6), 1), ((2, 5, 4), (2, 3, 4), -2),
    ((2, 3, 6), (1, 2, 5), -1),    # indices smaller than data off the axis
])
@pytest.mark.parametrize("const", [True, False], ids=["const", "runtime"])
def test_gather_elements(shape, index_shape, axis, const):
    x = data(shape, "int8" if const else "float32")
    n = shape[axis]
    i = RNG.integers(-n, n, index_shape)
    if const:
        check("GatherElements", {"x": x}, {"i": i.astype(np.int64)}, axis=axis)
    else:
        check("GatherElements", {"x": x, "i": i.astype(np.int32)}, axis=axis)


# ----------------------------------------------------------------- Expand, Tile
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, target", [
    ((3, 1), (2, 3, 4)),            # new axis, broadcast innermost: fills
    ((1, 4), (3, 1)),               # both ways: (3, 4)
    ((2, 1, 1, 5), (2, 6, 7, 5)),   # broadcast middle axes: row copies
    ((1,), (5,)),
])
def test_expand(shape, target, dtype):
    check("Expand", {"x": data(shape, dtype)}, {"shape": ints(*target)})


def test_expand_to_the_same_shape_is_a_view():
    m = model("Expand", {"x": data((2, 3))}, {"shape": ints(1, 3)})
    graph = import_onnx(m)
    [step] = lower_node_to_cpu(graph, graph.nodes[0])
    assert step.kernel is None and step.shape == (2, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, repeats", [
    ((2, 3, 4), (2, 1, 3)), ((5,), (4,)), ((3, 1), (1, 6)), ((2, 2), (0, 3)),
    ((1, 3, 2, 2), (2, 1, 2, 2)),
])
def test_tile(shape, repeats, dtype):
    check("Tile", {"x": data(shape, dtype)}, {"r": ints(*repeats)})


def test_tile_copies_whole_rows_and_runs_in_parallel():
    x = data((6, 64))
    kernel = build_tile(TensorSpec(x.shape, "float32"), [2, 3])
    assert memcpys(kernel) == [64 * 4] and kernel.parallel == 2
    np.testing.assert_array_equal(load_kernel(kernel)(x, threads=2)[0], np.tile(x, (2, 3)))


# ------------------------------------------------- DepthToSpace, SpaceToDepth
@pytest.mark.parametrize("shape, blocksize, mode, dtype", [
    ((1, 8, 3, 5), 2, "DCR", "float32"),
    ((2, 8, 3, 5), 2, "CRD", "int8"),
    ((1, 18, 4, 4), 3, "DCR", "uint8"),
    ((1, 128, 3, 16), 8, "DCR", "float32"),   # 8 x 16 tiles of the transposes
    ((1, 256, 2, 32), 16, "CRD", "int8"),     # 16 x 16 byte tiles
    ((2, 4, 1, 1), 2, "DCR", "uint8"),
])
def test_depth_to_space(shape, blocksize, mode, dtype):
    check("DepthToSpace", {"x": data(shape, dtype)}, blocksize=blocksize, mode=mode)


@pytest.mark.parametrize("shape, blocksize, dtype", [
    ((1, 3, 4, 6), 2, "float32"), ((2, 4, 9, 9), 3, "int8"), ((1, 2, 16, 64), 8, "float32"),
    ((1, 1, 32, 32), 16, "uint8"),
])
def test_space_to_depth(shape, blocksize, dtype):
    check("SpaceToDepth", {"x": data(shape, dtype)}, blocksize=blocksize)


def test_depth_to_space_refuses_channels_the_block_does_not_divide():
    g, node = hand_graph("DepthToSpace", {"x": data((1, 6, 2, 2))}, {}, ["x"],
                         [(1, 1, 4, 4)], "float32", blocksize=2)
    assert "blocksize 2" in cpu_unsupported_reason(g, node)


# ----------------------------------------------------------------------- Upsample
@pytest.mark.parametrize("mode, scales, dtype", [
    ("nearest", (1, 1, 2, 3), "float32"), ("nearest", (1, 1, 1.5, 2.5), "int8"),
    ("linear", (1, 1, 2, 2), "float32"), ("linear", (1, 1, 1.75, 3), "float32"),
])
def test_upsample_as_resize(mode, scales, dtype):
    """Upsample (opset 9; import converts it to Resize, so the node is built here) runs
    as onnxruntime runs it."""
    x = data((2, 3, 5, 4), dtype)
    s = np.array(scales, np.float32)
    [want] = onnxruntime(model("Upsample", {"x": x}, {"s": s}, opset=9, mode=mode), {"x": x})
    g, _ = hand_graph("Upsample", {"x": x}, {"s": s}, ["x", "s"], [want.shape], dtype,
                      mode=mode)
    got = run_graph(g, {"x": x})["y0"]
    if mode == "nearest":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ Concat, views
@pytest.mark.parametrize("seed", range(8))
def test_concat_any_axis_and_rank(seed):
    rank = 1 + seed % 5
    shape = [int(n) for n in RNG.integers(1, 5, rank)]
    axis = int(RNG.integers(-rank, rank))
    feeds = {}
    for k in range(1 + seed % 4):
        part = list(shape)
        part[axis] = int(RNG.integers(0, 4))         # zero-size parts included
        feeds[f"x{k}"] = data(tuple(part), DTYPES[seed // 3 % 5])
    if all(a.shape[axis] == 0 for a in feeds.values()):
        feeds["x0"] = data(tuple(shape), DTYPES[seed // 3 % 5])
    check("Concat", feeds, axis=axis)


@pytest.mark.parametrize("op, shape, axes", [
    ("Squeeze", (1, 3, 1, 4), (-2, 0)), ("Unsqueeze", (3, 4), (-1, 1)),
])
def test_squeeze_unsqueeze_negative_axes_are_views(op, shape, axes):
    x = data(shape)
    check(op, {"x": x}, {"axes": ints(*axes)})
    graph = import_onnx(model(op, {"x": x}, {"axes": ints(*axes)}))
    assert lower_node_to_cpu(graph, graph.nodes[0])[0].kernel is None


def test_kernel_never_reads_outside_its_input():
    from tessera.compiler.cpu.strided import StridedView, build_view_copy
    with pytest.raises(CpuKernelError, match="reads elements"):
        build_view_copy(TensorSpec((4, 4), "float32"), StridedView((2, 4), (8, 1), 5), (2, 4))


# ---------------------------------------------------------------- bad parameters
@pytest.mark.parametrize("op, consts, attrs, x_shape, y_shape, words", [
    ("Slice", {"s": ints(0), "e": ints(2), "a": ints(1), "st": ints(0)}, {}, (3, 4), (3, 2),
     "step 0"),
    ("Slice", {"s": ints(0, 0), "e": ints(2, 2), "a": ints(1, -1)}, {}, (3, 4), (3, 2),
     "sliced twice"),
    ("Slice", {"s": ints(0), "e": ints(2), "a": ints(5)}, {}, (3, 4), (3, 2), "out of range"),
    ("Expand", {"shape": ints(2, 5)}, {}, (3, 4), (3, 4), "does not broadcast"),
    ("Tile", {"r": ints(2)}, {}, (3, 4), (6, 4), "one non-negative value per axis"),
    ("GatherElements", {"i": np.zeros((4, 4), np.int64)}, {"axis": 1}, (3, 4), (4, 4),
     "no larger off axis 1"),
    ("SpaceToDepth", {}, {"blocksize": 2}, (1, 1, 5, 4), (1, 4, 2, 2), "divide H 5"),
    ("Split", {}, {"num_outputs": 0}, (3, 4), (3, 4), "not positive"),
    ("Tile", {}, {}, (3, 4), (3, 4), "repeats input is missing"),
])
def test_bad_parameters_are_refused_naming_the_node(op, consts, attrs, x_shape, y_shape,
                                                    words):
    g, node = hand_graph(op, {"x": data(x_shape)}, consts, ["x", *consts], [y_shape],
                         "float32", **attrs)
    assert words in cpu_unsupported_reason(g, node)
    with pytest.raises(CompileError, match=node.name):
        lower_node_to_cpu(g, node)
