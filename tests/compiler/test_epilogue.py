"""Epilogue lowering: the cheapest exact ALU sequence for each stage list."""
from __future__ import annotations

import numpy as np
from hypothesis import given, strategies as st

from tessera.compiler import (AddConst, Bias, Clip, Requant, Shift, decompose_bias,
                              plan_epilogue, requantize)

from .helpers import FEW, PYNQ, TINY


@FEW
@given(st.lists(st.integers(-300000, 300000), min_size=1, max_size=20),
       st.sampled_from([TINY, PYNQ]))
def test_bias_decomposition_is_exact_or_refused(bias, config):
    b = np.array(bias)
    dec = decompose_bias(b, config)
    xmax = 2 ** (config.inp_width - 1) - 1
    limit = xmax * 128 * (config.block_in - 1) - xmax  # well inside the representable range
    if np.abs(b).max() <= limit:
        assert dec is not None
    if dec is not None:
        const, w = dec
        assert np.all((const >= -128) & (const <= 127)) and np.all((w >= -128) & (w <= 127))
        np.testing.assert_array_equal(w @ const, b)   # one GEMM operation gives the bias


def _steps(stages, config=PYNQ, acc=(-(2**20), 2**20), gemm_bias=True):
    ep = plan_epilogue(tuple(stages), channels=4, config=config, acc_range=acc,
                       gemm_bias=gemm_bias, where="test")
    return ep, [(s.op, s.imm, s.param is not None) for s in ep.steps]


def test_requantize_relu_lowering_on_pynq():
    scale = np.full(4, 1e-3, np.float32)
    ep, steps = _steps(requantize(scale, relu=True, bias=np.arange(4)))
    # Bias folds into the GEMM; REQUANT reads its per-channel row; ReLU is MAX 0 (the upper
    # clamp 127 is the store's saturation).
    assert ep.gemm_bias is not None
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


def test_large_bias_falls_back_to_alu_add():
    ep, steps = _steps([Bias(np.full(4, 2**28))])
    assert ep.gemm_bias is None and steps == [("ADD", None, True)]
