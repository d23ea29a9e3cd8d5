"""A max pool fused into its producer convolution's tiles (compiler/accel/poolfuse.py):
bit-identical to the unfused program and the golden model, faster, and the same on the RTL."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera.compiler import Conv2d, Pool2d, compile_ops, requantize
from tessera.compiler.accel.convplan import ConvPlan
from tessera.compiler.accel.poolfuse import fusion_reason
from tessera.compiler.golden.operators import run_reference
from tessera.errors import CompileError

from tests.compiler.helpers import FEW, PYNQ, TINY, compile_and_run


def _pair(rng, n, c, h, w, o, k, s, pool_pads=(1, 1, 1, 1)):
    """A convolution (requantized, its zero point in the padding) and the 3x3/2 max pool of
    its output, with an input."""
    x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
    weight = rng.integers(-40, 40, (o, c, k, k), dtype=np.int8)
    stages = requantize(np.float32(rng.uniform(0.002, 0.01)), int(rng.integers(-128, 0)),
                        bias=rng.integers(-900, 900, o), qmin=-128, qmax=127)
    conv = Conv2d("c", "x", "y", weight, stride=s, padding=k // 2, pad_value=3, epilogue=stages)
    return conv, Pool2d("m", "y", "z", "max", 3, 2, pool_pads), x


def _fused(compiled) -> bool:
    return "y" not in compiled.tensors


@pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])
@settings(FEW, max_examples=min(FEW.max_examples, 15))
@given(data=st.data())
def test_fused_pool_equals_the_unfused_program(config, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    k, s = data.draw(st.sampled_from([(1, 1), (3, 1), (3, 2)]))
    o = data.draw(st.integers(config.block_out + 1, 3 * config.block_out))
    h, w = (data.draw(st.integers(2, 5)) * 2 * s for _ in range(2))
    conv, pool, x = _pair(rng, 1, data.draw(st.integers(1, 6)), h, w, o, k, s,
                          data.draw(st.sampled_from([(1, 1, 1, 1), (1, 1, 0, 0)])))
    fused, sim, program = compile_and_run([conv, pool], {"x": x}, config)
    alone, base, _ = compile_and_run([conv, pool], {"x": x}, config, fuse_pools=False)
    np.testing.assert_array_equal(fused["z"], alone["z"])
    np.testing.assert_array_equal(fused["z"], run_reference([conv, pool], {"x": x})["z"])
    if _fused(program):
        assert sim.stats.cycles < base.stats.cycles


def test_resnet_stem_pool_runs_in_the_convolution_tiles():
    # ResNet-18's conv1 (7x7/2, 64 channels, 224x224) and its 3x3/2 max pool on pynq.
    rng = np.random.default_rng(0)
    conv, pool, x = _pair(rng, 1, 3, 224, 224, 64, 7, 2)
    compiled = compile_ops([conv, pool], {"x": x.shape}, PYNQ)
    assert _fused(compiled)
    plan = compiled.plans["c"]
    assert (plan.ow_t, plan.oh_t % 2, plan.order, plan.ramp) == (112, 0, "spatial", 0)
    assert [name for name, *_ in compiled.op_bounds] == ["c", "m"]
    assert compiled.op_bounds[1][1] == compiled.op_bounds[1][2]   # no instructions of its own


def test_two_pools_in_one_program_both_fuse():
    rng = np.random.default_rng(4)
    c1, m1, x = _pair(rng, 1, 4, 16, 16, 32, 3, 1)
    c2, m2, _ = _pair(rng, 1, 32, 8, 8, 48, 3, 1)
    c2 = Conv2d("c2", "z", "y2", c2.weight, padding=1, epilogue=c2.epilogue)
    m2 = Pool2d("m2", "y2", "z2", "max", 3, 2, 1)
    ops = [c1, m1, c2, m2]
    fused, sim, program = compile_and_run(ops, {"x": x}, PYNQ)
    alone, base, _ = compile_and_run(ops, {"x": x}, PYNQ, fuse_pools=False)
    assert not {"y", "y2"} & set(program.tensors) and sim.stats.cycles < base.stats.cycles
    np.testing.assert_array_equal(fused["z2"], alone["z2"])
    np.testing.assert_array_equal(fused["z2"], run_reference(ops, {"x": x})["z2"])


def test_what_cannot_be_fused_runs_alone():
    rng = np.random.default_rng(1)
    conv, pool, x = _pair(rng, 1, 4, 9, 11, 32, 3, 1)           # odd image: not halved
    assert fusion_reason(conv, pool, (1, 32, 9, 11)) is not None
    assert not _fused(compile_ops([conv, pool], {"x": x.shape}, PYNQ))
    conv, pool, x = _pair(rng, 1, 4, 8, 8, 32, 3, 1)
    # Its output read back by the host, or a forced tiling that cannot carry the pool.
    assert not _fused(compile_ops([conv, pool], {"x": x.shape}, PYNQ, outputs=["y", "z"]))
    plan = ConvPlan(1, 2, 4, 8, 1, order="channel")
    assert not _fused(compile_ops([conv, pool], {"x": x.shape}, PYNQ, plans={"c": plan}))
    avg = Pool2d("m", "y", "z", "avg", 3, 2, 1)
    assert "max pool" in fusion_reason(conv, avg, (1, 32, 8, 8))


def test_a_forced_plan_must_carry_the_pool():
    from tessera.compiler.accel.convplan import ConvGeom
    from tessera.compiler.accel.poolfuse import check_pool_plan
    rng = np.random.default_rng(2)
    conv, _, _ = _pair(rng, 1, 4, 8, 8, 32, 3, 1)
    g = ConvGeom.of(conv, (1, 4, 8, 8), PYNQ)
    check_pool_plan("w", "c", g, ConvPlan(1, 1, 2, 8, 1, order="spatial"), PYNQ)
    with pytest.raises(CompileError, match="whole rows"):
        check_pool_plan("w", "c", g, ConvPlan(1, 1, 2, 4, 1, order="spatial"), PYNQ)


@pytest.mark.slow
def test_fused_pool_on_the_rtl_matches_the_simulator():
    """The fused layer on the RTL (Verilator, tiny): the simulator's output, in its cycles
    (within the suites' tolerance when the DRAM ports contend, where the simulator's
    arbitration is a model)."""
    from tessera.hw.harness.rtlsim import run_program
    from tests.programs import CONTENTION_TOLERANCE
    from tests.rtl import rtl_sim

    rng = np.random.default_rng(3)
    conv, pool, x = _pair(rng, 1, 3, 16, 16, 8, 3, 2)
    program = compile_ops([conv, pool], {"x": x.shape}, TINY)
    assert _fused(program)
    outputs, sim = program.run({"x": x})
    rtl = run_program(program.bind({"x": x}), rtl_sim(TINY))
    expected = run_reference([conv, pool], {"x": x})["z"]
    np.testing.assert_array_equal(program.read(rtl, "z"), expected)
    np.testing.assert_array_equal(outputs["z"], expected)
    tolerance = CONTENTION_TOLERANCE * sim.stats.cycles if sim.stats.dram_contended else 0
    assert abs(rtl.cycles - sim.stats.cycles) <= tolerance


def test_epilogue_after_the_pool_only_when_it_commutes():
    """A requantizing epilogue is non-decreasing in the accumulator, so it runs on the pooled
    entries after the pool; a negative multiply or a wrapping add must run first."""
    from tessera.compiler.accel.epilogue import plan_epilogue
    from tessera.compiler.accel.ops import AddConst, Mul
    from tessera.compiler.accel.poolfuse import epilogue_commutes

    stages = tuple(requantize(np.float32(0.004), -20, bias=np.arange(32) - 16, qmin=-128,
                              qmax=127))

    def plan(st, hi=1 << 20):
        return plan_epilogue(st, channels=32, config=PYNQ, acc_range=(-hi, hi), where="t")
    assert epilogue_commutes(plan(stages))
    assert not epilogue_commutes(plan((Mul(-3),) + stages))
    assert not epilogue_commutes(plan((AddConst(1 << 30),) + stages, hi=1 << 30))


@pytest.mark.parametrize("first", ["mul", "requant"])
def test_fused_pool_equals_the_unfused_program_in_either_order(first):
    rng = np.random.default_rng(5)
    conv, pool, x = _pair(rng, 1, 4, 16, 16, 32, 3, 1)
    if first == "mul":       # a negative scale first: the pool must see the epilogue's values
        from tessera.compiler.accel.ops import Mul
        conv = Conv2d("c", "x", "y", conv.weight, padding=1, pad_value=3,
                      epilogue=(Mul(-1),) + tuple(conv.epilogue))
    fused, sim, program = compile_and_run([conv, pool], {"x": x}, PYNQ)
    alone, _, _ = compile_and_run([conv, pool], {"x": x}, PYNQ, fuse_pools=False)
    assert _fused(program)
    np.testing.assert_array_equal(fused["z"], alone["z"])
    np.testing.assert_array_equal(fused["z"], run_reference([conv, pool], {"x": x})["z"])


def test_a_fused_pool_has_no_profile_cycles_of_its_own():
    """The profile rows of a program whose pools run in their convolutions' tiles: each
    pool gets no cycles (not 0), the convolutions' cycles add up to the run's."""
    from tessera.runtime.profile import layer_profiles
    rng = np.random.default_rng(4)
    c1, m1, x = _pair(rng, 1, 4, 16, 16, 32, 3, 1)
    compiled = compile_ops([c1, m1], {"x": x.shape}, PYNQ)
    assert _fused(compiled)
    _, result = compiled.run({"x": x}, trace=True)
    rows = layer_profiles(compiled.program, compiled.op_bounds, result.trace,
                          result.stats.cycles)
    assert [(name, cycles is None) for name, cycles, *_ in rows] == [("c", False), ("m", True)]
    assert rows[0][1] == result.stats.cycles
