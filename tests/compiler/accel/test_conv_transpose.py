"""ConvTranspose on the accelerator by sub-pixel decomposition (compiler/accel/convtranspose.py):
one stride-1 convolution per output phase, storing its pixels in place through strided
DMAs. Exact against an int64 reference of ONNX's definition and against onnxruntime
running onnxruntime's own QDQ quantization of the layer (which it computes in float)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, strategies as st
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.compiler import compile_ops, requantize
from tessera.compiler.accel.convtranspose import conv_transpose_phases
from tessera.compiler.accel.ops import ConvTranspose2d
from tessera.compiler.golden.check import reference_outputs
from tessera.errors import CompileError

from tests.compiler.accel.test_conv1d import SLOW_HOST
from tests.compiler.helpers import FEW, PYNQ, TINY, compile_and_run
from tests.compiler.qdq_models import FORMS, feeds, ort_quantize


def conv_transpose_reference(x: np.ndarray, w: np.ndarray, stride: tuple[int, int],
                             pads: tuple[int, int, int, int], output_padding=(0, 0),
                             group: int = 1) -> np.ndarray:
    """ONNX ConvTranspose in int64 (no dilation): every input pixel scatters ``x * w``."""
    n, c, h, wd = x.shape
    og, kh, kw = w.shape[1:]
    (sy, sx), (t, l, b, r) = stride, pads
    full = np.zeros((n, og * group, (h - 1) * sy + kh + output_padding[0],
                     (wd - 1) * sx + kw + output_padding[1]), np.int64)
    cg = c // group
    for g in range(group):
        xs, ws = x[:, g * cg:(g + 1) * cg].astype(np.int64), w[g * cg:(g + 1) * cg]
        for ky in range(kh):
            for kx in range(kw):
                full[:, g * og:(g + 1) * og, ky:ky + (h - 1) * sy + 1:sy,
                     kx:kx + (wd - 1) * sx + 1:sx] += np.einsum(
                         "nchw,co->nohw", xs, ws[:, :, ky, kx].astype(np.int64))
    return full[:, :, t:full.shape[2] - b, l:full.shape[3] - r]


def _operator_case(c, o, hw, k, stride, pads, output_padding=0, group=1, zp=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, c, *hw), dtype=np.int8)
    w = rng.integers(-128, 128, (c, o // group, k, k), dtype=np.int8)
    bias = rng.integers(-3000, 3000, o)
    scale = np.float32(3e-4)
    op = ConvTranspose2d("up", "x", "y", w, stride=stride, padding=pads, groups=group,
                         output_padding=output_padding, pad_value=zp,
                         epilogue=requantize(scale, bias=bias))
    acc = conv_transpose_reference(x.astype(np.int64) - zp, w, (stride, stride), pads,
                                   (output_padding, output_padding), group)
    acc += bias[None, :, None, None]
    expected = np.clip(np.rint(acc.astype(np.float32) * scale), -128, 127).astype(np.int8)
    return op, x, expected


OPERATOR_CASES = {
    "k3s2-output-padding": dict(c=8, o=8, hw=(5, 6), k=3, stride=2, pads=(1, 1, 1, 1),
                                output_padding=1),
    "k3s2": dict(c=8, o=8, hw=(5, 6), k=3, stride=2, pads=(1, 1, 1, 1)),
    "k4s2": dict(c=16, o=16, hw=(4, 4), k=4, stride=2, pads=(1, 1, 1, 1)),
    "k2s2-no-overlap": dict(c=16, o=8, hw=(4, 5), k=2, stride=2, pads=(0, 0, 0, 0)),
    "stride-1": dict(c=16, o=16, hw=(4, 5), k=3, stride=1, pads=(1, 1, 1, 1)),
    "k3s3-output-padding-2": dict(c=16, o=16, hw=(4, 5), k=3, stride=3, pads=(0, 0, 0, 0),
                                  output_padding=2),
    "depthwise": dict(c=16, o=16, hw=(4, 5), k=3, stride=2, pads=(1, 1, 1, 1),
                      output_padding=1, group=16),
    "grouped": dict(c=32, o=16, hw=(4, 5), k=3, stride=2, pads=(1, 0, 1, 1), group=2),
}


@pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])
@pytest.mark.parametrize("case", OPERATOR_CASES)
def test_conv_transpose_operator_is_exact(case, config) -> None:
    op, x, expected = _operator_case(**OPERATOR_CASES[case])
    outputs, _, compiled = compile_and_run([op], {"x": x}, config)
    np.testing.assert_array_equal(outputs["y"], expected)
    # One operator in the program's bounds (its phases merged), for the per-layer profile.
    assert [name for name, _, _ in compiled.op_bounds] == ["up"]


@FEW
@given(st.data())
def test_random_conv_transposes_are_exact(data) -> None:
    """Random geometries on tiny (4-channel blocks): kernels smaller or larger than the
    stride, crops, output padding, groups; those without stride-1 phases raise."""
    stride = data.draw(st.integers(1, 3), "stride")
    k = data.draw(st.integers(1, 5), "k")
    group = data.draw(st.sampled_from([1, 2, 4]), "group")
    case = dict(c=4 * group * data.draw(st.integers(1, 2)),
                o=group * data.draw(st.integers(1, 5)), hw=(data.draw(st.integers(1, 5)),
                                                           data.draw(st.integers(1, 5))),
                k=k, stride=stride, pads=tuple(data.draw(st.integers(0, k - 1))
                                               for _ in range(4)),
                output_padding=data.draw(st.integers(0, stride - 1)), group=group,
                zp=data.draw(st.integers(-128, 127)), seed=data.draw(st.integers(0, 99)))
    op, x, expected = _operator_case(**case)
    assume(min(expected.shape[2:]) >= 1)
    try:
        conv_transpose_phases(op, x.shape)
    except CompileError as exc:
        assert "phase" in str(exc) and "'up'" in str(exc)
        return
    outputs, _, _ = compile_and_run([op], {"x": x}, TINY)
    np.testing.assert_array_equal(outputs["y"], expected)


def test_phases_cover_the_output_once() -> None:
    """Every output pixel is written by exactly one phase's view."""
    op, x, _ = _operator_case(**OPERATOR_CASES["k3s3-output-padding-2"])
    _, _, oh, ow = op.output_shape(x.shape)
    hits = np.zeros((oh, ow), int)
    for phase in conv_transpose_phases(op, x.shape):
        sy, sx, ay, ax = phase.view
        _, _, qh, qw = phase.conv.output_shape(x.shape)
        hits[ay:ay + sy * qh:sy, ax:ax + sx * qw:sx] += 1
    assert (hits == 1).all()


def test_a_phase_starting_inside_the_input_is_refused_with_the_reason() -> None:
    op = ConvTranspose2d("up", "x", "y", np.ones((8, 8, 2, 2), np.int8), stride=2,
                         padding=(1, 1, 1, 1))
    with pytest.raises(CompileError, match="'up'.*phase start or end inside the input"):
        conv_transpose_phases(op, (1, 8, 4, 4))


def test_realistic_upsampling_runs_near_its_mac_floor() -> None:
    """A decoder's 4x4 stride-2 upsampling, 64 -> 64 channels, 16x16 -> 32x32: within 1.15x
    of the layer's MACs / 256 on pynq (measured 1.07x)."""
    op, x, expected = _operator_case(c=64, o=64, hw=(16, 16), k=4, stride=2, pads=(1, 1, 1, 1))
    program = compile_ops([op], {"x": x.shape}, PYNQ)
    outputs, result = program.run({"x": x})
    np.testing.assert_array_equal(outputs["y"], expected)
    macs = 64 * 16 * 16 * 64 * 4 * 4
    assert result.stats.cycles <= 1.15 * macs / 256


def conv_transpose_net(c=8, o=8, hw=(8, 8), k=3, stride=2, pads=(1, 1, 1, 1),
                       output_padding=(1, 1), group=1, skip=False, seed=0) -> onnx.ModelProto:
    """A float ConvTranspose (+ bias), with ``skip`` plus a second input added to it."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(
                 (rng.standard_normal((c, o // group, k, k)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(o) * 0.1).astype(np.float32), "b")]
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], pads=list(pads),
                              strides=[stride, stride], output_padding=list(output_padding),
                              group=group, name="up")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, *hw])]
    out_hw = [(hw[i] - 1) * stride + k + output_padding[i] - pads[i] - pads[i + 2]
              for i in range(2)]
    if skip:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, o, *out_hw]))
        nodes.append(helper.make_node("Add", ["t", "z"], ["y"], name="skip"))
    else:
        nodes.append(helper.make_node("Identity", ["t"], ["y"], name="out"))
    graph = helper.make_graph(nodes, "upsample", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("form", ["default", "u8-activations-per-channel"])
@pytest.mark.parametrize("geometry", [{}, {"k": 4, "output_padding": (0, 0)},
                                      {"group": 8}, {"skip": True}],
                         ids=["k3s2", "k4s2", "depthwise", "residual-add"])
def test_quantized_conv_transpose_matches_onnxruntime(geometry, form) -> None:
    model = conv_transpose_net(**geometry)
    calibration = feeds(model, 4)
    qdq = ort_quantize(model, calibration, **FORMS[form])
    compiled = tessera.compile(qdq, "pynq", host=SLOW_HOST)
    placed = {p.op: p.target for p in compiled.compiled.placements}
    assert placed["QConvTranspose"] == "accelerator" and "ConvTranspose" not in placed
    for feed in calibration[:2]:
        outputs, profile = compiled.run(feed, backend="sim")
        np.testing.assert_array_equal(outputs["y"], reference_outputs(qdq, feed)["y"])
    layer = next(x for x in profile.layers if x.name.startswith("up"))
    assert layer.placement == "accelerator" and layer.cycles > 0 and layer.macs > 0


@pytest.mark.slow
def test_conv_transpose_on_the_rtl_matches_the_simulator() -> None:
    """The strided phase stores on the RTL (Verilator, tiny): the same output as the
    simulator's, in the same cycles (within the suite's tolerance when the DRAM ports
    contend, where the simulator's arbitration is a model)."""
    from tessera.hw.harness.rtlsim import run_program
    from tests.programs import CONTENTION_TOLERANCE
    from tests.rtl import rtl_sim

    op, x, expected = _operator_case(**OPERATOR_CASES["k3s2-output-padding"])
    program = compile_ops([op], {"x": x.shape}, TINY)
    outputs, sim = program.run({"x": x})
    rtl = run_program(program.bind({"x": x}), rtl_sim(TINY))
    np.testing.assert_array_equal(program.read(rtl, "y"), expected)
    np.testing.assert_array_equal(outputs["y"], expected)
    tolerance = CONTENTION_TOLERANCE * sim.stats.cycles if sim.stats.dram_contended else 0
    assert abs(rtl.cycles - sim.stats.cycles) <= tolerance


def test_a_layer_without_stride_1_phases_stays_a_float_cpu_kernel() -> None:
    """A crop as large as the kernel makes a phase start inside the input: the QDQ pattern
    is not fused and runs as onnxruntime runs it (float ConvTranspose between DQ and Q)."""
    model = conv_transpose_net(pads=(2, 2, 2, 2), output_padding=(0, 0))
    calibration = feeds(model, 2)
    qdq = ort_quantize(model, calibration)
    compiled = tessera.compile(qdq, "pynq", host=SLOW_HOST)
    assert {p.op: p.target for p in compiled.compiled.placements}["ConvTranspose"] == "cpu"
    outputs, _ = compiled.run(calibration[0], backend="sim")
    np.testing.assert_array_equal(outputs["y"], reference_outputs(qdq, calibration[0])["y"])
