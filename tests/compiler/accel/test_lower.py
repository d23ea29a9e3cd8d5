"""Lowering fused integer nodes to accelerator operators: every node of the zoo's quantized
models compiled alone, simulated, and compared bit for bit with the integer golden model
(itself bit-identical to onnxruntime, tests/compiler/frontend/test_qdq.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.compiler import compile_ops, zoo
from tessera.compiler.accel.epilogue import reference_stages
from tessera.compiler.accel.lower import (AVERAGE_POOL_REASON, accel_unsupported_reason,
                                          convert_flattened_gemms, fuse_into_producer,
                                          lower_node, qlinear_add)
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.compiler.accel.ops import Conv2d, Eltwise, Pool2d
from tessera.compiler.frontend.qdq import DOMAIN, fuse_qdq
from tessera.compiler.frontend.qlinear import qlinear_add_reference
from tessera.compiler.golden.operators import pool2d
from tessera.compiler.golden.quantized import run_reference
from tessera.config import get_config
from tessera.errors import CompileError


def _fused(name: str):
    model = zoo.ZOO[name]()
    calibration = zoo.calibration_data(model)
    graph = import_onnx(zoo.to_qdq(model, calibration))
    fuse_qdq(graph)
    convert_flattened_gemms(graph)
    graph.remove_unused()
    graph.verify()
    tensors = [v for v in graph.values if not graph.values[v].is_const]
    return graph, run_reference(graph, calibration[0], outputs=tensors)


@pytest.fixture(scope="module", params=["lenet", "small_resnet", "mobilenet"])
def fused(request):
    return (request.param, *_fused(request.param))


def _run_alone(op, env, config):
    inputs = {t: env[t] for t in op.inputs}
    compiled = compile_ops([op], {t: v.shape for t, v in inputs.items()}, config, verify=True)
    out, _ = compiled.run(inputs)
    return out[op.output].reshape(env[op.output].shape)


@pytest.mark.parametrize("config", ["pynq", "tiny"])
def test_every_fused_node_is_bit_exact_on_the_accelerator(fused, config) -> None:
    name, graph, env = fused
    cfg = get_config(config)
    if config == "tiny" and name == "mobilenet":
        pytest.skip("mobilenet's wide layers take a minute on tiny's 16 MAC/cycle core; its "
                    "depthwise and pointwise convolutions run on pynq")
    nodes = [n for n in graph.nodes if n.domain == DOMAIN]
    ran = 0
    for node in nodes:
        assert accel_unsupported_reason(graph, node, cfg) is None, node.name
        op = lower_node(graph, node, cfg)
        try:
            got = _run_alone(op, env, cfg)
        except CompileError as exc:
            # tiny's 128-row accumulator cannot hold a 500-channel layer's parameters
            # (the model compiler then places it on the CPU: test_model.py).
            assert config == "tiny" and "no tiling fits" in str(exc), exc
            continue
        np.testing.assert_array_equal(got, env[node.outputs[0]], err_msg=node.name)
        ran += 1
    assert ran >= len(nodes) - 1


def test_padded_convolutions_pad_with_the_input_zero_point(fused) -> None:
    name, graph, _ = fused
    convs = [n for n in graph.nodes if n.op == "QConv" and max(n.attrs["pads"])]
    assert convs or name == "lenet"                     # LeNet's convolutions are unpadded
    for node in convs:
        op = lower_node(graph, node, get_config("pynq"))
        assert op.pad_value == node.attrs["x_zero_point"]


def test_residual_adds_fuse_into_either_convolution() -> None:
    graph, env = _fused("small_resnet")
    cfg = get_config("pynq")
    adds = [n for n in graph.nodes if n.op == "QAdd"]
    fused = 0
    for add in adds:
        for operand in add.inputs:
            producer = graph.producer(operand)
            if producer is not None and producer.op == "QConv":
                conv = lower_node(graph, producer, cfg)
                k, op = fuse_into_producer(graph, add, cfg, [conv], {operand: [1]})
                assert k == 0 and op.output == add.outputs[0]
                np.testing.assert_array_equal(_run_alone(op, env, cfg), env[add.outputs[0]])
                fused += 1
    assert fused >= len(adds)


def test_flattened_gemm_becomes_a_convolution_over_the_image() -> None:
    graph, env = _fused("lenet")
    convs = [n for n in graph.nodes if n.name.endswith(".conv")]
    assert convs and not [n for n in graph.nodes if n.op == "QGemm"]
    first = convs[0]
    assert graph.value(first.inputs[0]).shape[2:] == (4, 4)
    assert graph.value(first.inputs[1]).shape[2:] == (4, 4)


def test_global_average_pool_sums_on_the_alu_where_its_plane_fits() -> None:
    # small_resnet's 8x8 plane: pynq's accumulator holds it twice over (ALU row adds);
    # tiny's 128 rows cannot hold two 64-row windows beside the parameters, so it stays a
    # depthwise convolution of ones. Both give onnxruntime's result (the golden model).
    graph, env = _fused("small_resnet")
    node = next(n for n in graph.nodes if n.op == "QGlobalAveragePool")
    plane = graph.value(node.inputs[0]).shape[2:]
    pynq, tiny = get_config("pynq"), get_config("tiny")
    op = lower_node(graph, node, pynq)
    assert isinstance(op, Pool2d) and op.kind == "sum" and op.kernel == plane
    conv = lower_node(graph, node, tiny)
    assert isinstance(conv, Conv2d) and conv.groups == conv.weight.shape[0]
    assert np.all(conv.weight == 1)
    for form, cfg in ((op, pynq), (conv, tiny)):
        np.testing.assert_array_equal(_run_alone(form, env, cfg), env[node.outputs[0]])


@settings(max_examples=40, deadline=None)
@given(st.floats(0.002, 0.2), st.integers(-128, 127), st.floats(0.002, 0.2),
       st.integers(-128, 127), st.floats(0.002, 0.2), st.integers(-128, 127),
       st.booleans())
def test_qlinear_add_fixed_point_is_exact_on_every_pair(sa, za, sb, zb, sy, zy, relu) -> None:
    # All 65,536 operand pairs against onnxruntime's float32 FMA formula: one element off
    # by one upstream is enough to change a ResNet's logits.
    y_min = max(-128, zy) if relu else -128
    a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128))
    a, b = a.astype(np.int8), b.astype(np.int8)
    want = qlinear_add_reference(a, b, sa, za, sb, zb, sy, zy, y_min, 127)
    _assert_fixed_point_add_gives(want, a, b, (sa, za, sb, zb, sy, zy, y_min, 127))


def _assert_fixed_point_add_gives(want, a, b, params, **options) -> None:
    """``qlinear_add(*params)``'s fixed-point stages give ``want`` on operands ``a``, ``b``
    (or, about 1 parameter set in 100, it says there is no exact linear form: float32
    noise at ties depends on the operands' parity; such an add runs on the CPU)."""
    try:
        big_a, stages = qlinear_add(*params, **options)
    except CompileError as exc:
        assert "no int32 fixed-point form" in str(exc)
        return
    got = reference_stages(big_a * a.astype(np.int64), stages, 0, {"b": b})
    np.testing.assert_array_equal(np.clip(got, -128, 127), want)


def test_an_add_with_no_exact_fixed_point_form_runs_on_the_cpu() -> None:
    graph, _ = _fused("small_resnet")
    add = next(n for n in graph.nodes if n.op == "QAdd")
    # A parameter set the exhaustive search finds no exact form for.
    add.attrs.update(a_scale=0.13326716325616414, a_zero_point=0, b_scale=0.11952398900925548,
                     b_zero_point=32, y_scale=0.13326716325616414, y_zero_point=0,
                     y_min=-128, y_max=127)
    reason = accel_unsupported_reason(graph, add, get_config("pynq"))
    assert reason and "no int32 fixed-point form" in reason
    from tessera.compiler.placement.partition import place_nodes
    placed = {p.node: p for p in place_nodes(graph, get_config("pynq"))}
    assert placed[add.name].target == "cpu" and "fixed-point" in placed[add.name].reason


def test_qadd_standalone_is_the_add_pattern_multiply_and_scaled_residual() -> None:
    """A QAdd outside a conv's epilogue runs the ADD intrinsic's pattern on its own:
    ``A*a`` then the scaled residual ``b`` (tessera.compiler.accel.builtin_patterns)."""
    graph, env = _fused("small_resnet")
    add = next(n for n in graph.nodes if n.op == "QAdd")
    op = lower_node(graph, add, get_config("pynq"))
    assert isinstance(op, Eltwise) and op.op == "add" and op.b is None
    assert [type(s).__name__ for s in op.epilogue[:2]] == ["Mul", "Residual"]
    np.testing.assert_array_equal(_run_alone(op, env, get_config("pynq")), env[add.outputs[0]])


def test_unsupported_nodes_say_why() -> None:
    graph, _ = _fused("lenet")
    cfg = get_config("pynq")
    q = next(n for n in graph.nodes if n.op == "QuantizeLinear")
    assert "not an integer op" in accel_unsupported_reason(graph, q, cfg)
    with pytest.raises(CompileError, match=q.name):
        lower_node(graph, q, cfg)
    conv = next(n for n in graph.nodes if n.op == "QConv")
    conv.attrs["pads"] = [17, 17, 17, 17]
    assert "exceeds the load DMA" in accel_unsupported_reason(graph, conv, cfg)


# ------------------------------------------------------------ onnxruntime's other forms
def _ort_fused(form: str):
    from tests.compiler.qdq_models import FORMS, feeds, ort_quantize, pool_net
    model = pool_net()
    calibration = feeds(model, 8)
    graph = import_onnx(ort_quantize(model, calibration, pre_process=False, **FORMS[form]))
    fuse_qdq(graph)
    tensors = [v for v in graph.values if not graph.values[v].is_const]
    return graph, run_reference(graph, calibration[0], outputs=tensors)


def test_uint8_nodes_run_shifted_on_the_accelerator_bit_exact() -> None:
    """uint8 activations and uint8 (symmetric) weights, stored as int8 by the 128 shift:
    every fused node but the average pool runs on the accelerator and equals the golden
    model (onnxruntime's uint8 results minus 128, tests/compiler/frontend/test_qdq_forms)."""
    graph, env = _ort_fused("u8-weights-per-channel")
    cfg = get_config("pynq")
    nodes = [n for n in graph.nodes if n.domain == DOMAIN]
    assert all(n.attrs["from_uint8"] for n in nodes)
    ran = set()
    for node in nodes:
        reason = accel_unsupported_reason(graph, node, cfg)
        if node.op == "QAveragePool":
            assert reason == AVERAGE_POOL_REASON
            continue
        assert reason is None, (node.name, reason)
        got = _run_alone(lower_node(graph, node, cfg), env, cfg)
        np.testing.assert_array_equal(got, env[node.outputs[0]], err_msg=node.name)
        ran.add(node.op)
    assert ran == {"QConv", "QGemm", "QAdd", "QMaxPool", "QGlobalAveragePool"}


def test_weights_beyond_int8_stay_on_the_cpu() -> None:
    graph, _ = _ort_fused("u8-weights")
    conv = next(n for n in graph.nodes if n.op == "QConv")
    reason = accel_unsupported_reason(graph, conv, get_config("pynq"))
    assert "beyond the int8 the accelerator multiplies" in reason and "WeightSymmetric" in reason


def test_average_pool_is_not_the_accelerators_integer_average() -> None:
    """Pool2d avg rounds the integer sum (ties to even); onnxruntime's QLinearAveragePool
    rounds float32 values whose ties the inputs' own roundings decide. With the
    quantizer's equal scales and zero points, a 1x2 window over many value pairs."""
    graph, _ = _ort_fused("default")
    node = next(n for n in graph.nodes if n.op == "QAveragePool")
    assert accel_unsupported_reason(graph, node, get_config("pynq")) == AVERAGE_POOL_REASON
    values = np.arange(-128, 128, 3)
    x = np.empty((1, 1, values.size, 2 * values.size), np.int64)
    x[..., 0::2], x[..., 1::2] = values[:, None], values[None, :]
    attrs = dict(node.attrs, kernel_shape=[1, 2], strides=[1, 2], pads=[0, 0, 0, 0],
                 ceil_mode=0, count_include_pad=0, y_scale=node.attrs["x_scale"],
                 y_zero_point=node.attrs["x_zero_point"], y_min=-128, y_max=127)
    from tessera.compiler.frontend.graph import Graph
    g = Graph("pool")
    g.add_input("x", x.shape, "int8")
    g.add_value("y", (1, 1, values.size, values.size), "int8")
    g.add_node("QAveragePool", ["x"], ["y"], name="pool", domain=DOMAIN, **attrs)
    g.outputs = ["y"]
    golden = run_reference(g, {"x": x.astype(np.int8)})["y"]
    accelerator = pool2d(x, Pool2d("pool", "x", "y", "avg", kernel=(1, 2), stride=(1, 2)))
    assert np.count_nonzero(accelerator != golden) > 0
    assert np.abs(accelerator - golden).max() == 1


@settings(max_examples=25, deadline=None)
@given(st.floats(0.002, 0.2), st.integers(0, 255), st.floats(0.002, 0.2),
       st.integers(0, 255), st.floats(0.002, 0.2), st.integers(0, 255), st.booleans())
def test_qlinear_add_from_uint8_is_exact_on_every_pair(sa, za, sb, zb, sy, zy, relu) -> None:
    """The fixed-point QAdd of a node shifted from uint8 against onnxruntime's uint8
    QLinearAdd (on the stored values + 128), on all 65,536 pairs."""
    from tessera.compiler.frontend.qshift import qadd_reference
    attrs = {"a_scale": sa, "a_zero_point": za - 128, "b_scale": sb, "b_zero_point": zb - 128,
             "y_scale": sy, "y_zero_point": zy - 128, "y_min": zy - 128 if relu else -128,
             "y_max": 127, "from_uint8": 1}
    a, b = (v.astype(np.int8) for v in np.meshgrid(np.arange(-128, 128),
                                                   np.arange(-128, 128)))
    want = qadd_reference(a, b, attrs)
    _assert_fixed_point_add_gives(want, a, b, (sa, za - 128, sb, zb - 128, sy, zy - 128,
                                               attrs["y_min"], 127), from_uint8=True)


def test_uint8_model_runs_on_the_accelerator_like_onnxruntime() -> None:
    """A ResNet quantized by onnxruntime with uint8 activations: every convolution, add
    and pool placed on the accelerator, the simulated logits identical to onnxruntime's."""
    import onnx
    import tessera
    from onnxruntime import quantization as ortq
    from tessera.compiler.golden.check import reference_outputs
    from tests.compiler.qdq_models import ort_quantize
    model = zoo.small_resnet()
    calibration = zoo.calibration_data(model)
    qdq = ort_quantize(model, calibration, activation_type=ortq.QuantType.QUInt8,
                       per_channel=True)
    assert any(t.data_type == onnx.TensorProto.UINT8 for t in qdq.graph.initializer)
    compiled = tessera.compile(qdq, "pynq")
    placed = {p.node: p for p in compiled.compiled.placements}
    integer = [p for p in placed.values() if p.op in ("QConv", "QAdd", "QGlobalAveragePool")]
    assert {p.op for p in integer} == {"QConv", "QAdd", "QGlobalAveragePool"}
    assert all(p.target == "accelerator" for p in integer), compiled.compiled.summary()
    for feed in calibration[:2]:
        outputs, _ = compiled.run(feed, backend="sim")
        expected = reference_outputs(qdq, feed)
        np.testing.assert_array_equal(outputs["logits"], expected["logits"])
