"""Epilogue lowering: the cheapest exact ALU sequence for each stage list."""
from __future__ import annotations

import numpy as np

from tessera.compiler import AddConst, Bias, Clip, Requant, Shift, plan_epilogue, requantize

from tests.compiler.helpers import PYNQ, TINY


def _steps(stages, config=PYNQ, acc=(-(2**20), 2**20), init_bias=True):
    ep = plan_epilogue(tuple(stages), channels=4, config=config, acc_range=acc,
                       init_bias=init_bias, where="test")
    return ep, [(s.op, s.imm, s.param is not None) for s in ep.steps]


def test_requantize_relu_lowering_on_pynq():
    scale = np.full(4, 1e-3, np.float32)
    ep, steps = _steps(requantize(scale, relu=True, bias=np.arange(4)))
    # The bias initialises the accumulator (MOV from a per-channel row); REQUANT reads its
    # per-channel row; ReLU is MAX 0 (the upper clamp 127 is the store's saturation).
    assert ep.init is not None and ep.init.op == "MOV" and ep.init.param is not None
    np.testing.assert_array_equal(ep.params[ep.init.param], np.arange(4))
    assert steps == [("REQUANT", None, True), ("MAX", 0, False)]


def test_zero_point_minus_128_relu_needs_only_the_add():
    """QDQ ReLU: zp -128, clamp [0, 255] before the zp == add -128 then saturate."""
    ep, steps = _steps(requantize(np.float32(1e-3), -128, relu=True))
    assert steps[-1] == ("ADD", -128, False) and len(steps) == 2


def test_per_tensor_requant_uses_the_immediate_when_it_holds_32_bits():
    _, tiny = _steps([Requant(0.01)], TINY)
    _, pynq = _steps([Requant(0.01)], PYNQ)
    assert tiny[0][1] is not None and not tiny[0][2]     # 32-bit immediate on tiny
    assert pynq[0][1] is None and pynq[0][2]            # a parameter row on pynq (16 bits)


def test_wide_clamps_and_large_constants_use_rows():
    _, steps = _steps([Clip(-1000, 50000), AddConst(70000)], PYNQ, acc=(-(2**30), 2**30))
    ops = [s[0] for s in steps]
    assert ops.count("MAX") == 1 and "ADD" in ops
    assert any(param for _, _, param in steps)          # 70000 does not fit 16 bits


def test_clamps_that_cannot_act_are_dropped():
    _, steps = _steps([Clip(-500, 500)], PYNQ, acc=(-100, 100))
    assert steps == []
    _, steps = _steps([Shift(4), Clip(-128, 127)], PYNQ)
    assert [s[0] for s in steps] == ["ADD", "SHR"]      # the store saturates to int8 anyway


def test_any_int32_bias_initialises_the_accumulator():
    ep, steps = _steps([Bias(np.array([2**31 - 1, -2**31, 5, 0]))])
    assert ep.init is not None and ep.init.param is not None and steps == []
    ep, steps = _steps([Bias(np.full(4, 7))])                # one value: the immediate
    assert ep.init.imm == 7 and not ep.params


def test_bias_without_accumulator_init_is_an_alu_add():
    """Pooling and elementwise operators load their rows: a bias is an ADD (as is a bias
    that is not the first stage)."""
    ep, steps = _steps([Bias(np.arange(4))], init_bias=False)
    assert ep.init is None and steps == [("ADD", None, True)]
    ep, steps = _steps([Shift(2, rounding=False), Bias(np.arange(4))])
    assert ep.init is None and [s[0] for s in steps] == ["SHR", "ADD"]
