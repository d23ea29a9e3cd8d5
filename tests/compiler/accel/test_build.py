"""Several operators in one program: DRAM planning with reuse, one FINISH, bit-exact."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler import (Bias, Clip, CompileError, Conv2d, ConvPlan, Dense, Eltwise,
                              Pool2d, Requant, Residual, compile_ops, requantize)
from tessera.isa import Finish

from tests.compiler.helpers import PYNQ, TINY, compile_and_run
from tests.compiler.reference import conv, ort_requant, pool, rint_scale, sat8


def _resnet_block(rng, c_in=3, c=8, classes=10):
    def w(o, i, k):
        return rng.integers(-20, 20, (o, i, k, k), dtype=np.int8)
    p = {"w1": w(c, c_in, 3), "w2": w(c, c, 3), "w3": w(c, c, 3),
         "wd": rng.integers(-20, 20, (classes, c), dtype=np.int8)}
    for k, o in (("1", c), ("2", c), ("3", c), ("d", classes)):
        p["s" + k] = rng.uniform(1e-3, 5e-3, o).astype(np.float32)
        p["b" + k] = rng.integers(-2000, 2000, o)
    ops = [Conv2d("c1", "x", "t1", p["w1"], stride=2, padding=1,
                  epilogue=requantize(p["s1"], relu=True, bias=p["b1"])),
           Pool2d("mp", "t1", "t2", "max", 3, 2, 1),
           Conv2d("c2", "t2", "t3", p["w2"], padding=1,
                  epilogue=requantize(p["s2"], relu=True, bias=p["b2"])),
           Conv2d("c3", "t3", "t4", p["w3"], padding=1,
                  epilogue=(Bias(p["b3"]), Requant(p["s3"]), Residual("t2"), Clip(0, 127))),
           Pool2d("gap", "t4", "t5", "avg", 4, 4),
           Dense("fc", "t5", "y", p["wd"], epilogue=requantize(p["sd"], -5, bias=p["bd"]))]
    return ops, p


def _reference(x, p):
    def bias(v):
        return v[None, :, None, None]
    t1 = ort_requant(conv(x, p["w1"], (2, 2), (1,) * 4) + bias(p["b1"]), p["s1"], relu=True)
    t2 = pool(t1, "max", (3, 3), (2, 2), (1,) * 4)
    t3 = ort_requant(conv(t2, p["w2"], pads=(1,) * 4) + bias(p["b2"]), p["s2"], relu=True)
    t4 = np.clip(rint_scale(conv(t3, p["w3"], pads=(1,) * 4) + bias(p["b3"]), p["s3"]) + t2,
                 0, 127)
    t5 = sat8(pool(t4, "avg", (4, 4), (4, 4), (0,) * 4))
    acc = t5[:, :, 0, 0] @ p["wd"].astype(np.int64).T + p["bd"]
    return ort_requant(acc, p["sd"], -5, ndim=2)


@pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])
@pytest.mark.parametrize("threads", [1, 2])
def test_resnet_block_as_one_program(config, threads):
    rng = np.random.default_rng(21)
    ops, p = _resnet_block(rng)
    x = rng.integers(-128, 128, (1, 3, 16, 16), dtype=np.int8)
    out, result, compiled = compile_and_run(ops, {"x": x}, config, threads=threads)
    np.testing.assert_array_equal(out["y"][:, :, 0, 0], _reference(x, p))
    insns = compiled.program.instructions
    assert sum(isinstance(i, Finish) for i in insns) == 1 and isinstance(insns[-1], Finish)
    # Intermediates share the arena: t1 is dead once the pool ran, so a later tensor reuses it.
    dram = compiled.dram
    assert dram.arena_bytes < dram.intermediate_bytes
    assert compiled.outputs == ["y"] and set(compiled.inputs) == {"x"}
    assert result.stats.gemm_ops > 0


def test_operators_overlap_across_the_boundary():
    """The next layer's first loads wait only for the stores of what they read."""
    rng = np.random.default_rng(5)
    w1 = rng.integers(-128, 128, (16, 16, 3, 3), dtype=np.int8)
    w2 = rng.integers(-128, 128, (16, 16, 1, 1), dtype=np.int8)
    s = rng.uniform(1e-4, 1e-3, 16).astype(np.float32)
    ops = [Conv2d("a", "x", "t", w1, padding=1, epilogue=requantize(s)),
           Conv2d("b", "t", "y", w2, epilogue=requantize(s * 20))]
    x = rng.integers(-128, 128, (1, 16, 24, 24), dtype=np.int8)
    # Layer b in 4-row tiles: its first tile reads only the first rows layer a stored.
    compiled = compile_ops(ops, {"x": x.shape}, PYNQ, plans={"b": ConvPlan(1, 1, 4, 24, 1)})
    out, result = compiled.run({"x": x}, trace=True)
    t = ort_requant(conv(x, w1, pads=(1,) * 4), s)
    np.testing.assert_array_equal(out["y"], ort_requant(conv(t, w2), s * 20))
    # Layer b's first loads run while layer a still computes, and the compute module never
    # idles at the boundary (b's first tile does not wait for a's last store either).
    program = compiled.program
    b_start = max(i for i, insn in enumerate(program.instructions) if insn.label == "LOAD uop")
    compute = sorted((e for e in result.trace if e.module == "compute"), key=lambda e: e.start)
    a_end = max(e.end for e in compute if e.index < b_start)
    b_loads = min(e.start for e in result.trace if e.index > b_start and e.module == "load")
    assert b_loads < a_end
    b_gemm = min(e.start for e in compute if e.index > b_start and e.name == "GEMM")
    window = [e for e in compute if a_end <= e.start < b_gemm]
    assert sum(e.end - e.start for e in window) == b_gemm - a_end


def test_eltwise_residual_graph_on_tiny():
    rng = np.random.default_rng(8)
    a = rng.integers(-128, 128, (2, 5, 4, 4), dtype=np.int8)
    w = rng.integers(-128, 128, (5, 5, 1, 1), dtype=np.int8)
    s = rng.uniform(1e-4, 2e-3, 5).astype(np.float32)
    ops = [Conv2d("c", "a", "t", w, epilogue=requantize(s)),
           Eltwise("add", "add", "t", "u", "a"),
           Eltwise("relu", "max", "u", "y", 0)]
    out, _, _ = compile_and_run(ops, {"a": a}, TINY)
    t = ort_requant(conv(a, w), s)
    np.testing.assert_array_equal(out["y"], np.maximum(sat8(t + a), 0))


def test_graph_errors_name_the_operator_and_tensor():
    w = np.zeros((4, 4, 1, 1), np.int8)
    with pytest.raises(CompileError, match="operator 'c' reads tensor 'nope'"):
        compile_ops([Conv2d("c", "nope", "y", w)], {"x": (1, 4, 2, 2)}, TINY)
    with pytest.raises(CompileError, match="writes tensor 'x', which already exists"):
        compile_ops([Conv2d("c", "x", "x", w)], {"x": (1, 4, 2, 2)}, TINY)
    with pytest.raises(CompileError, match="input 'x' has 3 channels but the weight expects 4"):
        compile_ops([Conv2d("c", "x", "y", w)], {"x": (1, 3, 2, 2)}, TINY)


def test_dram_planner_reuses_dead_space_and_its_verifier_catches_overlap():
    from dataclasses import replace
    from tessera.compiler import verify_dram_plan
    from tessera.compiler.accel.emit import Place
    w = np.zeros((8, 8, 1, 1), np.int8)
    ops = [Conv2d(f"c{k}", f"t{k}", f"t{k + 1}", w) for k in range(4)]
    compiled = compile_ops(ops, {"t0": (1, 8, 6, 6)}, TINY)
    dram = compiled.dram
    shapes = {k: t.layout.shape for k, t in compiled.tensors.items()}
    verify_dram_plan(dram, shapes, TINY)
    # t1..t3 are intermediates; t1 is dead when c2 writes t3, so t3 takes t1's space.
    assert dram.places["t3"] == dram.places["t1"]
    assert dram.arena_bytes == 2 * dram.intermediate_bytes // 3
    bad = replace(dram, places={**dram.places, "t2": dram.places["t1"]})
    with pytest.raises(CompileError, match="'t1' .* and 't2' .* are live together"):
        verify_dram_plan(bad, shapes, TINY)
    assert isinstance(bad.places["t2"], Place)
