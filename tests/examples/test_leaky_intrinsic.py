"""docs/extending.md's walkthrough, end to end: the LEAKY intrinsic of
examples/leaky_intrinsic.py, registered from that module alone, runs in the simulator, in
the RTL (Verilator) and in a compiled ONNX model, bit-identical to onnxruntime; without it
the model falls back to the LUT plug-in."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.compiler.frontend.quantize import quantize_static
from tessera.config import PRESETS
from tessera.hw.alu_ops import check_hardware
from tessera.isa import Alu, MemType, Uop
from tessera.isa.asm import format_program, parse_program

from examples import leaky_intrinsic
from tests import programs
from tests.programs import acc_entries, load, out_bytes, read_out, single_shot, store

TINY = PRESETS["tiny"]


@pytest.fixture
def leaky():
    op = leaky_intrinsic.register()
    yield op
    leaky_intrinsic.unregister()


def leaky_program(op, a: np.ndarray, operand: int):
    """LOAD acc, LEAKY with the immediate ``operand`` over every row, STORE."""
    n = a.shape[0]
    insn = Alu(alu_op=op.opcode, use_imm=True, imm=operand, uop_begin=0, uop_end=1,
               iter_out=n, dst_factor_out=1)
    return single_shot(TINY, uops=[Uop(dst=0)],
                       segments={"acc": acc_entries(TINY, a), "out": out_bytes(TINY, n)},
                       compute=[load("acc", MemType.ACC, x_size=n), insn],
                       stores=[store("out", x_size=n)])


def test_semantics_hardware_and_assembly(leaky):
    rng = np.random.default_rng(0)
    pairs = [(int(a), leaky_intrinsic.pack(int(z), int(m))) for a, z, m in
             zip(rng.integers(-400, 400, 300), rng.integers(-128, 128, 300),
                 rng.integers(-400, 400, 300))]
    check_hardware(leaky, pairs + [(-12, leaky_intrinsic.pack(0, 32))])
    program = leaky_program(leaky, np.arange(-32, 32).reshape(-1, 1, 4), 0)
    assert "ALU.LEAKY" in format_program(program)
    assert parse_program(format_program(program)) == program


# rtl builds a Verilator model of its own (the plug-in changes the ALU: ~80 s), so it
# runs in the slow step.
@pytest.mark.parametrize("backend", ["sim", pytest.param("rtl", marks=pytest.mark.slow)])
def test_leaky_program_on_the_simulator_and_the_rtl(leaky, backend):
    a = np.arange(-128, 128).reshape(-1, 1, 4)
    operand = leaky_intrinsic.pack(-7, 77)
    program = leaky_program(leaky, a, operand)
    result = programs.run(program)
    expected = leaky_intrinsic.leaky(a.astype(np.int64), np.int64(operand))
    np.testing.assert_array_equal(read_out(result, "out", TINY, a.shape[0]),
                                  np.clip(expected, -128, 127))
    if backend == "rtl":
        programs.assert_device_agrees(program, result, "rtl")


def leaky_model(alpha: float = 0.125):
    """Conv -> LeakyRelu -> Conv quantized by onnxruntime, then the LeakyRelu's output
    given its input's quantization (as converters that keep activations in place emit)."""
    rng = np.random.default_rng(1)
    w1 = numpy_helper.from_array(rng.normal(0, 0.3, (16, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.1, (16, 16, 3, 3)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]),
         helper.make_node("LeakyRelu", ["h"], ["a"], alpha=alpha),
         helper.make_node("Conv", ["a", "w2"], ["y"], pads=[1, 1, 1, 1])], "leaky",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], [w1, w2])
    feeds = [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    qdq = quantize_static(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                          feeds)
    producer = {o: n for n in qdq.graph.node for o in n.output}
    relu = next(n for n in qdq.graph.node if n.op_type == "LeakyRelu")
    dq_in = producer[relu.input[0]]
    for node in qdq.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and (
                node.input[0] == relu.output[0] or producer.get(node.input[0]) is not None
                and producer[node.input[0]].input[0] == relu.output[0]):
            node.input[1], node.input[2] = dq_in.input[1], dq_in.input[2]
    return qdq, feeds


def test_compiled_model_uses_leaky_and_equals_onnxruntime(leaky):
    qdq, feeds = leaky_model()
    net = tessera.compile(qdq, "pynq")
    (lookup,) = [p for p in net.compiled.placements if p.op == "QLookup"]
    assert lookup.target == "accelerator" and "LEAKY pattern" in lookup.reason
    out, _ = net.run(feeds[0], backend="sim")
    session = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(out["y"], session.run(None, feeds[0])[0])


def test_without_leaky_the_model_falls_back_to_the_lut():
    qdq, _ = leaky_model()
    (lookup,) = [p for p in tessera.compile(qdq, "pynq").compiled.placements
                 if p.op == "QLookup"]
    assert "LUT pattern" in lookup.reason
