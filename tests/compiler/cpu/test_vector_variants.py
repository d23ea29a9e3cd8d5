"""Kernels tiled by vector width carry their IR built for every other width too
(``CpuKernel.variants``): a board's objects are compiled from IR whose register tiles fit
its 128-bit NEON, a portable ``x86-64-v3`` object from AVX2 tiles, not from the compiling
host's AVX-512 tiles (which LLVM would split into two to four times the registers those
CPUs have)."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.boards import BOARD_CPUS
from tessera.compiler.cpu.kernel import CpuKernel
from tessera.compiler.cpu.lower import lower_node_to_cpu
from tessera.compiler.cpu.vector_width import (VECTOR_WIDTHS, building_for_vector_bits,
                                               host_vector_bits, vector_bits_of)
from tessera.compiler.frontend.onnx_import import import_onnx
from tessera.config import PRESETS
from tessera.errors import CpuKernelError
from tessera.runtime import aot
from tessera.runtime.cpu import load_kernel, run_cpu_steps
from tessera.runtime.jit import Jit, cpu_target, host_target


def _matmul_graph(m=64, k=256, n=512):
    """One float MatMul big enough for the packed GEMM (its tiles depend on the width)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((m, k)).astype(np.float32)
    return model, x


def _lowered(model, widths):
    graph = import_onnx(model)
    return graph, [s for node in graph.nodes for s in lower_node_to_cpu(graph, node, widths)]


def _packed_kernel():
    """The packed GEMM's steps lowered with a variant for every other width, and its
    kernel."""
    _, steps = _lowered(_matmul_graph()[0], VECTOR_WIDTHS)
    return steps, next(s.kernel for s in steps if s.kernel is not None)


def test_a_packed_gemm_gets_a_variant_per_other_width_and_each_computes_the_matmul():
    model, x = _matmul_graph()
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    graph, steps = _lowered(model, VECTOR_WIDTHS)
    kernel = next(s.kernel for s in steps if s.kernel is not None)
    # Kept although the parallel form packs another operand at some widths: the
    # variants split the same extent (tests/compiler/cpu/test_parallel.py).
    assert kernel.parallel > 1
    assert {b for b, _ in kernel.variants} == set(VECTOR_WIDTHS) - {host_vector_bits()}
    assert len({kernel.ir, *(ir for _, ir in kernel.variants)}) == 1 + len(kernel.variants)
    for bits, ir in ((host_vector_bits(), kernel.ir), *kernel.variants):
        assert kernel.ir_for(bits) == ir
        # Any x86-64 host here runs every width's IR (LLVM splits the wider vectors).
        only = replace(kernel, ir=ir, variants=())
        env = {"x": x}
        run_cpu_steps([replace(s, kernel=only) if s.kernel is kernel else s for s in steps],
                      env)
        np.testing.assert_allclose(env[graph.outputs[0]], want, rtol=1e-4, atol=1e-4)


def test_kernels_whose_ir_does_not_depend_on_the_width_get_no_variant():
    model, x = _matmul_graph(m=1, k=16, n=8)      # a small matmul: no packed tiles
    _, steps = _lowered(model, VECTOR_WIDTHS)
    assert all(s.kernel.variants == () for s in steps if s.kernel is not None)


def test_a_lowering_whose_constants_depend_on_the_width_gets_no_variant(monkeypatch):
    # A variant must read the constants the host's lowering packed: when the other
    # width's lowering packs them differently (an N:M sparse layout does), none is kept.
    from tessera.compiler.cpu import lower
    model, _ = _matmul_graph()
    real = lower._lower

    def packed_by_width(graph, node):
        steps = real(graph, node)
        return [replace(s, constants={"packed": np.full(4, host_vector_bits())})
                for s in steps]
    monkeypatch.setattr(lower, "_lower", packed_by_width)
    _, steps = _lowered(model, VECTOR_WIDTHS)
    assert all(s.kernel.variants == () for s in steps if s.kernel is not None)


def test_variants_survive_the_kernel_record():
    _, kernel = _packed_kernel()
    assert kernel.variants
    assert CpuKernel.from_dict(kernel.to_dict()) == kernel
    plain = replace(kernel, variants=())
    assert "variants" not in plain.to_dict()       # records of kernels without: as before
    with pytest.raises(CpuKernelError, match="malformed"):
        CpuKernel.from_dict({**kernel.to_dict(), "variants": {"wide": "..."}})


def test_each_cpu_target_has_a_width_kernels_are_tiled_for():
    assert {vector_bits_of(requires) for _, _, requires in BOARD_CPUS.values()} == {128}
    for config in PRESETS.values():
        assert [t.vector_bits for t in cpu_target("board", config)] == [128]
    assert [t.vector_bits for t in cpu_target("x86-64-v3", PRESETS["pynq"])] == [256]
    assert host_target().vector_bits in VECTOR_WIDTHS
    assert host_target().vector_bits == host_vector_bits()
    with building_for_vector_bits(128):
        assert host_vector_bits() == 128
    with pytest.raises(CpuKernelError, match="not one of"):
        with building_for_vector_bits(64):
            host_vector_bits()


def test_prebuild_compiles_each_target_from_its_widths_ir(monkeypatch, tmp_path):
    steps, kernel = _packed_kernel()
    seen = {}
    jit = Jit(tmp_path)

    def object_for(ir, target):
        seen[target.name] = ir
        return b"\x7fELF-not-loaded"
    monkeypatch.setattr(jit, "object_for", object_for)
    monkeypatch.setattr(aot, "get_jit", lambda: jit)
    compiled = SimpleNamespace(steps=steps, config=PRESETS["pynq"])
    aot.prebuild(compiled, ("host", "board", "x86-64-v3"))
    board, = cpu_target("board", PRESETS["pynq"])
    portable, = cpu_target("x86-64-v3", PRESETS["pynq"])
    assert seen[board.name].startswith(kernel.ir_for(128))
    assert seen[portable.name].startswith(kernel.ir_for(256))
    assert seen[host_target().name].startswith(kernel.ir_for(host_vector_bits()))
    # One object per width, each from that width's IR.
    assert len(set(seen.values())) == len({128, 256, host_vector_bits()})


def test_the_jit_on_this_host_compiles_its_own_widths_ir(monkeypatch):
    _, kernel = _packed_kernel()
    # A model compiled on a host of another width: its main IR is that host's, ours a variant.
    other = next(bits for bits in VECTOR_WIDTHS if bits != host_vector_bits())
    foreign = replace(kernel, ir=kernel.ir_for(other),
                      variants=((host_vector_bits(), kernel.ir),))
    assert foreign.ir != kernel.ir
    compiled = []
    real = Jit.compile
    monkeypatch.setattr(Jit, "compile", lambda self, ir: compiled.append(ir) or real(self, ir))
    load_kernel(foreign)
    assert compiled and compiled[0].startswith(kernel.ir)


def test_a_compiled_model_file_keeps_the_variants():
    import tessera
    from tessera.compiler import zoo
    from tessera.compiler.model import CompiledModel
    net = zoo.ZOO["mlp"]()
    compiled = tessera.compile(net, "tiny", calibration=zoo.calibration_data(net)).compiled
    k = next(i for i, s in enumerate(compiled.steps) if getattr(s, "kernel", None) is not None)
    step = compiled.steps[k]
    variant = step.kernel.ir + "\n; the 128-bit variant\n"
    compiled.steps[k] = replace(step, kernel=replace(step.kernel, variants=((128, variant),)))
    loaded = CompiledModel.from_modelfile(compiled.to_modelfile())
    assert loaded.steps[k].kernel.variants == ((128, variant),)
    assert loaded.steps[k].kernel == compiled.steps[k].kernel


def test_only_lowerings_that_read_the_width_are_repeated(monkeypatch):
    from tessera.compiler.cpu import lower
    calls = []
    real = lower._lower
    monkeypatch.setattr(lower, "_lower", lambda g, n: calls.append(n.name) or real(g, n))
    model, _ = _matmul_graph()
    _lowered(model, VECTOR_WIDTHS)
    assert len(calls) == 1 + len(set(VECTOR_WIDTHS) - {host_vector_bits()})
    calls.clear()
    add = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1024])]),
        opset_imports=[helper.make_opsetid("", 17)])
    _lowered(add, VECTOR_WIDTHS)
    assert calls == ["add"]


def test_the_compile_asks_for_every_width(monkeypatch):
    # Which CPUs a .tsr's objects are for is decided after the compile (--cpu-targets):
    # the compile builds a variant for every width a target can have.
    import tessera
    from tessera.compiler import zoo
    from tessera.compiler.cpu import lower
    asked = []
    real = lower.lower_node_to_cpu
    monkeypatch.setattr(lower, "lower_node_to_cpu",
                        lambda g, n, widths=(): asked.append(tuple(widths)) or real(g, n, widths))
    net = zoo.ZOO["mlp"]()
    tessera.compile(net, "tiny", calibration=zoo.calibration_data(net), placement="cpu")
    assert asked and set(asked) == {VECTOR_WIDTHS}
