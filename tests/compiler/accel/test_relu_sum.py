"""Int8 activations as sums of shifted ReLUs (compiler/accel/relu_sum.py, the IIS method).

Tables are built as onnxruntime builds its int8 activation tables, Q(f(DQ(v))) with
rounding half to even. The ALU lowering is checked by running its steps with numpy int32
(wrapping) lanes, independently of ``ReluSum.evaluate``.
"""
from __future__ import annotations

from math import erf

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tessera.compiler.accel.relu_sum import (
    MAX_PIECES, ReluSum, accuracy_table, alu_cycles_per_row, alu_program, alu_steps,
    fit_relu_sum, relu_sum_error)
from tessera.compiler.accel.relu_sum import (  # the search's steps, tested on their own
    _Problem, _pruned, _search_breakpoints, _table_values, _weight_values)
from tessera.errors import CompileError
from tessera.isa import get_isa

from tests.compiler.helpers import FEW, PYNQ

#: Every stored input value, in byte order (the tables' order).
BYTES = np.arange(256, dtype=np.uint8).view(np.int8)
#: The same values ascending.
VALUES = np.arange(-128, 128)


def quantized_table(f, in_scale: float, in_zp: int, out_scale: float, out_zp: int) -> np.ndarray:
    """The int8 table (byte order) of ``Q(f(DQ(v)))``, rounding half to even."""
    x = (BYTES.astype(np.float64) - in_zp) * in_scale
    return np.clip(np.round(f(x) / out_scale) + out_zp, -128, 127).astype(np.int8)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


ACTIVATIONS = {
    "sigmoid": (_sigmoid, 8 / 128, 0, 1 / 256, -128),
    "tanh": (np.tanh, 3 / 128, 5, 1 / 128, 0),
    "silu": (lambda x: x * _sigmoid(x), 10 / 256, -20, 9 / 256, -100),
    "hardswish": (lambda x: x * np.clip(x + 3, 0, 6) / 6, 8 / 128, 0, 6 / 128, -30),
    "gelu": (lambda x: 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2))), 6 / 128, 0,
             6 / 128, -20),
    "elu": (lambda x: np.where(x > 0, x, np.expm1(x)), 6 / 128, 10, 5 / 128, 0),
}


def table_of(name: str) -> np.ndarray:
    f, *quant = ACTIVATIONS[name]
    return quantized_table(f, *quant)


def simulate_alu(rs: ReluSum, imm_bits: int | None = None, saturate: bool = True) -> np.ndarray:
    """Run ``alu_program(rs)`` on int32 lanes holding every v (byte order), then the store's
    int8 saturation (``saturate``): the accelerator's arithmetic, wrapping included."""
    rows = {"acc": BYTES.astype(np.int32), "S": np.zeros(256, np.int32),
            "T": np.zeros(256, np.int32)}
    ops = {"MOV": lambda a, b: b, "MAX": np.maximum, "ADD": np.add, "SUB": np.subtract,
           "MUL": np.multiply, "SHR": np.right_shift}
    for step in alu_program(rs, imm_bits=imm_bits):
        if step.src in (None, "param"):
            operand = np.full(256, step.value, dtype=np.int32)
        else:
            operand = rows[step.src]
        rows[step.dst] = ops[step.op](rows[step.dst], operand).astype(np.int32)
    return np.clip(rows["acc"], -128, 127).astype(np.int8) if saturate else rows["acc"]


def simulate_formula(rs: ReluSum) -> np.ndarray:
    """The module doc's sequence as written, in int32: S = C*v + A, S += W_k*max(v, b_k)."""
    v = BYTES.astype(np.int32)
    total = v * np.int32(rs.slope) + np.int32(rs.offset)
    for b, w in rs.terms:
        total = total + np.maximum(v, np.int32(b)) * np.int32(w)
    return np.clip(total >> np.int32(rs.shift), -128, 127).astype(np.int8)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_error_falls_as_pieces_grow(name: str) -> None:
    """K = 2, 4, 8, 16: the max and mean errors never rise, the mean falls, and 16 pieces
    are within 2 LSB everywhere (sigmoid 1 LSB, mean 0.11)."""
    table = table_of(name)
    rows = accuracy_table(table, None)
    assert [r["K"] for r in rows] == [2, 4, 8, 16]
    worst, mean = [r["max_lsb"] for r in rows], [r["mean_lsb"] for r in rows]
    assert worst == sorted(worst, reverse=True) and worst[-1] <= 2, rows
    assert all(a > b for a, b in zip(mean, mean[1:]) if a > 0), rows
    assert mean[-1] < 0.25, rows
    assert all(r["alu_cycles_per_row"] <= 5 * r["K"] + 3 for r in rows), rows
    rs = fit_relu_sum(table, pieces=16)  # the row is this fit's
    assert (worst[-1], mean[-1]) == relu_sum_error(table, rs)
    assert rows[-1]["alu_cycles_per_row"] == alu_cycles_per_row(rs)


@pytest.mark.parametrize("name", ["sigmoid", "silu"])
def test_shift_uses_the_int32_headroom(name: str) -> None:
    """The fixed point keeps 20+ fraction bits, and one more would leave int32."""
    rs = fit_relu_sum(table_of(name), pieces=8)
    assert rs.shift >= 20
    doubled = ReluSum(2 * rs.offset, 2 * rs.slope, tuple((b, 2 * w) for b, w in rs.terms),
                      rs.shift + 1)
    with pytest.raises(CompileError, match="int32"):
        doubled.evaluate(VALUES)


def test_weighted_fit_is_better_on_the_weighted_support() -> None:
    """A calibration distribution concentrated on v in [-60, 20]: fitting to it beats the
    uniform fit there, in max and mean error."""
    table = table_of("silu")
    v = BYTES.astype(np.float64)
    weights = np.where((v >= -60) & (v <= 20), np.exp(-((v + 20) / 25) ** 2), 0.0)
    uniform = fit_relu_sum(table, pieces=4)
    weighted = fit_relu_sum(table, weights, pieces=4)
    u_max, u_mean = relu_sum_error(table, uniform, weights)
    w_max, w_mean = relu_sum_error(table, weighted, weights)
    assert w_max <= u_max and w_mean < 0.5 * u_mean, (w_max, w_mean, u_max, u_mean)
    assert all(-60 < b < 20 for b, _ in weighted.terms)


@pytest.mark.parametrize("name,pieces,imm_bits", [
    ("sigmoid", 0, None), ("tanh", 1, None), ("silu", 3, 17), ("hardswish", 16, None),
    ("gelu", 16, 17), ("elu", 8, 8)])
def test_evaluate_equals_the_alu_sequence(name: str, pieces: int, imm_bits: int | None) -> None:
    """``evaluate`` = the lowering's steps on int32 lanes = the formula's sequence in int32."""
    rs = fit_relu_sum(table_of(name), pieces=pieces, imm_bits=imm_bits)
    expected = rs.evaluate(BYTES)
    np.testing.assert_array_equal(simulate_alu(rs, imm_bits), expected)
    np.testing.assert_array_equal(simulate_formula(rs), expected)


def test_lowering_steps_and_cycles() -> None:
    """A general sum: linear part 3 passes, 4 per term (3 for the last, built in place),
    SHR; cycles from the registry (MOV of a row and immediates 1, tensor ADD/SUB 2)."""
    rs = ReluSum(offset=1 << 3, slope=3, terms=((-5, 7), (10, -9), (40, 300)), shift=4)
    assert alu_steps(rs) == 4 * 3 + 3 and alu_cycles_per_row(rs) == 5 * 3 + 3
    # 300 does not fit an 8-bit immediate: MUL reads a parameter row (tensor form, 2 cycles).
    assert [(s.op, s.src) for s in alu_program(rs, imm_bits=8) if s.value == 300] == \
        [("MUL", "param")]
    assert alu_cycles_per_row(rs, imm_bits=8) == 5 * 3 + 3 + 1
    # Unit weights need no MUL, -1 subtracts; a zero linear part starts S with a term.
    unit = ReluSum(offset=0, slope=0, terms=((-5, 1), (0, -1), (7, 0), (9, 1)), shift=0)
    assert [(s.op, s.dst, s.src, s.value) for s in alu_program(unit)] == [
        ("MOV", "S", "acc", None), ("MAX", "S", None, -5),
        ("MOV", "T", "acc", None), ("MAX", "T", None, 0), ("SUB", "S", "T", None),
        ("MAX", "acc", None, 9), ("ADD", "acc", "S", None)]
    np.testing.assert_array_equal(simulate_alu(unit), unit.evaluate(BYTES))
    # A constant (even zero) overwrites v.
    zero = fit_relu_sum(np.zeros(256, np.int8), pieces=2)
    assert [(s.op, s.dst, s.value) for s in alu_program(zero)] == [("MOV", "acc", 0)]
    np.testing.assert_array_equal(simulate_alu(zero), np.zeros(256, np.int8))


_COEFFICIENT = st.one_of(st.sampled_from([-2, -1, 0, 1, 2]), st.integers(-5000, 5000))


@FEW
@given(offset=st.one_of(st.just(0), st.integers(-10 ** 6, 10 ** 6)), slope=_COEFFICIENT,
       breaks=st.lists(st.integers(-128, 127), max_size=5, unique=True),
       weights=st.lists(_COEFFICIENT, min_size=5, max_size=5), shift=st.integers(0, 12),
       imm_bits=st.sampled_from([None, 8, 17]))
def test_lowering_computes_any_relu_sum(offset, slope, breaks, weights, shift, imm_bits) -> None:
    """Every special case of the lowering (zero, unit, -1 coefficients, an empty linear part,
    parameter rows) computes ``evaluate``, and before the store's saturation ``accumulate``."""
    rs = ReluSum(offset, slope, tuple(zip(sorted(breaks), weights)), shift)
    np.testing.assert_array_equal(simulate_alu(rs, imm_bits, saturate=False),
                                  rs.accumulate(BYTES) >> shift)
    np.testing.assert_array_equal(simulate_alu(rs, imm_bits), rs.evaluate(BYTES))
    np.testing.assert_array_equal(simulate_formula(rs), rs.evaluate(BYTES))


def test_coordinate_search_finds_the_kinks() -> None:
    """From breakpoints far off, the search moves them onto the kinks of a piecewise-linear
    table (``_search_breakpoints``: the fit's own starts are often already close)."""
    table = np.clip(BYTES, -40, 60).astype(np.int8)
    prob = _Problem.build(_table_values(table), _weight_values(None))
    assert _search_breakpoints(prob, [-100, 100]) == [-40, 60]
    rs = fit_relu_sum(table, pieces=2)
    assert [b for b, _ in rs.terms] == [-40, 60] and relu_sum_error(table, rs) == (0, 0.0)


@pytest.mark.parametrize("z", [-128, -100, 0, 37])
def test_relu_is_exact_with_one_piece(z: int) -> None:
    """``max(v, z)`` is reproduced exactly, and lowers to a single ALU MAX (z = -128: the
    identity, no step at all)."""
    table = np.maximum(BYTES, z).astype(np.int8)
    rs = fit_relu_sum(table, pieces=1)
    assert relu_sum_error(table, rs) == (0, 0.0)
    expected = [] if z == -128 else [("MAX", "acc", z)]
    assert [(s.op, s.dst, s.value) for s in alu_program(rs)] == expected


def test_breakpoints_that_add_nothing_are_dropped() -> None:
    """``_pruned``: of breakpoints at -50, 0, 50 on a ReLU table only 0 lowers the error."""
    table = np.maximum(BYTES, 0).astype(np.int8)
    prob = _Problem.build(_table_values(table), _weight_values(None))
    assert _pruned(prob, [-50, 0, 50]) == [0]
    assert fit_relu_sum(table, pieces=3).pieces == 1


def test_tolerance_picks_the_smallest_pieces() -> None:
    table = table_of("sigmoid")
    rs = fit_relu_sum(table, tolerance=2)
    k = rs.pieces
    assert rs == fit_relu_sum(table, pieces=k) and relu_sum_error(table, rs)[0] <= 2
    assert relu_sum_error(table, fit_relu_sum(table, pieces=k - 1))[0] > 2
    assert fit_relu_sum(table, tolerance=2.5) == rs


def test_unreachable_tolerance_says_what_is_reachable() -> None:
    """Noise on 40 inputs needs 38 breakpoints to be exact, more than the cap."""
    table = np.random.default_rng(1).integers(-128, 128, 256).astype(np.int8)
    weights = (BYTES >= 0) & (BYTES < 40)
    with pytest.raises(CompileError, match=f"up to {MAX_PIECES} pieces.*tolerance>="):
        fit_relu_sum(table, weights, tolerance=0)


@FEW
@given(st.data())
def test_random_tables_never_overflow_int32(data) -> None:
    """Any table (monotone or not), any weights, any K: the fit's every intermediate value
    fits int32 for all 256 inputs, and the lowering computes exactly ``evaluate``."""
    seed = data.draw(st.integers(0, 2 ** 32 - 1), "seed")
    rng = np.random.default_rng(seed)
    table = rng.integers(-128, 128, 256)
    if data.draw(st.booleans(), "monotone"):
        table = np.roll(np.sort(table) * data.draw(st.sampled_from([1, -1]), "sign"), 128)
        table = np.clip(table, -128, 127)
    weights = None
    if data.draw(st.booleans(), "weighted"):
        weights = rng.exponential(size=256) * (rng.random(256) < data.draw(
            st.floats(0.02, 1.0), "density"))
        weights[rng.integers(256)] = 1.0
    pieces = data.draw(st.integers(0, 16), "pieces")
    imm_bits = data.draw(st.sampled_from([None, 17, 8]), "imm_bits")
    rs = fit_relu_sum(table.astype(np.int8), weights, pieces=pieces, imm_bits=imm_bits)
    assert rs.pieces <= pieces
    np.testing.assert_array_equal(simulate_alu(rs, imm_bits), rs.evaluate(BYTES))


@pytest.mark.parametrize("support", [[7], [-3, 40], [-10, -9, -8, 5]])
def test_narrow_supports_are_fitted_exactly(support: list[int]) -> None:
    """A calibration set with a few distinct inputs: no more pieces than useful breakpoints
    inside its range, the fit exact on it, and still int32-safe on all 256 inputs."""
    table = table_of("tanh")
    weights = np.zeros(256)
    weights[np.array(support, dtype=np.int8).view(np.uint8)] = 1.0
    rs = fit_relu_sum(table, weights, pieces=5)
    assert rs.pieces <= max(0, len(support) - 2)
    assert relu_sum_error(table, rs, weights) == (0, 0.0)
    np.testing.assert_array_equal(simulate_alu(rs), rs.evaluate(BYTES))


def test_immediate_width_keeps_constants_immediate() -> None:
    """With pynq's 17-bit immediate the fit keeps C and W_k immediates at a lower shift,
    costing no accuracy here; without the cap they would need parameter rows."""
    imm_bits = get_isa(PYNQ).imm_bits
    table = table_of("silu")
    capped = fit_relu_sum(table, pieces=8, imm_bits=imm_bits)
    full = fit_relu_sum(table, pieces=8)
    assert capped.shift < full.shift
    assert all(s.src != "param" for s in alu_program(capped, imm_bits=imm_bits) if s.op == "MUL")
    assert alu_cycles_per_row(capped, imm_bits=imm_bits) < \
        alu_cycles_per_row(full, imm_bits=imm_bits)
    assert relu_sum_error(table, capped)[0] <= relu_sum_error(table, full)[0]


@pytest.mark.parametrize("kwargs,match", [
    ({}, "exactly one of pieces= and tolerance="),
    ({"pieces": 2, "tolerance": 1}, "exactly one of pieces= and tolerance="),
    ({"pieces": -1}, "pieces=-1 is not an int in 0..32"),
    ({"pieces": MAX_PIECES + 1}, "pieces=33"),
    ({"pieces": 2.0}, "pieces=2.0"),
    ({"pieces": True}, "pieces=True"),
    ({"tolerance": -0.5}, "tolerance=-0.5 is not a finite number >= 0"),
    ({"tolerance": float("nan")}, "tolerance=nan"),
])
def test_bad_modes_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(CompileError, match=match) as info:
        fit_relu_sum(table_of("sigmoid"), **kwargs)
    assert "pass pieces=K" in str(info.value)


@pytest.mark.parametrize("table,weights,match", [
    (np.zeros(255, np.int8), None, "table must be 256 int8 values.*shape \\(255,\\)"),
    (np.zeros(256), None, "table must be 256 int8 values.*float64"),
    (np.full(256, 200, np.int16), None, "table must be 256 int8 values"),
    (np.zeros(256, np.int8), -np.ones(256), "weights must be 256 finite non-negative"),
    (np.zeros(256, np.int8), np.zeros(256), "not all zero"),
    (np.zeros(256, np.int8), np.ones(3), "weights must be 256.*shape \\(3,\\)"),
])
def test_bad_tables_and_weights_raise(table, weights, match: str) -> None:
    with pytest.raises(CompileError, match=match):
        fit_relu_sum(table, weights, pieces=2)


def test_bad_relu_sums_raise() -> None:
    with pytest.raises(CompileError, match="ascending"):
        ReluSum(0, 0, ((5, 1), (-5, 1)), 0)
    with pytest.raises(CompileError, match="in \\[-128, 127\\]"):
        ReluSum(0, 0, ((200, 1),), 0)
    with pytest.raises(CompileError, match="shift 40"):
        ReluSum(0, 0, (), 40)
    with pytest.raises(CompileError, match="slope\\*v leaves int32"):
        ReluSum(0, 1 << 30, (), 0).evaluate(VALUES)
    with pytest.raises(CompileError, match="term 0: W\\*max\\(v, -3\\) leaves int32"):
        ReluSum(0, 0, ((-3, 1 << 25),), 0).evaluate(VALUES)
    with pytest.raises(CompileError, match="partial sum through term 1 leaves int32"):
        ReluSum(0, 0, ((-3, 1 << 24), (0, 1 << 24)), 0).evaluate(VALUES)
    with pytest.raises(CompileError, match="inputs must be stored int8 values"):
        ReluSum(0, 1, (), 0).evaluate(np.array([128]))
