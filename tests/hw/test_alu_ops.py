"""The hardware hooks of the ALU intrinsics against their numpy semantics.

Every hook runs alone in Amaranth's simulator through ``check_hardware``
(pipelined, one (a, b) pair per cycle); hypothesis draws int32 operands with
the edge values mixed in. User ops are registered only inside
``ALU_OPS.temporarily`` so the global registry is left as it was.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from amaranth.hdl import Module, Mux, Signal, Value
from hypothesis import HealthCheck, given, settings, strategies as st

from tessera.errors import RegistryError
from tessera.hw.alu_ops import (AluHardware, attach_builtin_hardware, check_hardware,
                                check_imm_operand, hardware_of, hook_stages)
from tessera.isa import ALU_OPS, AluTiming, Intrinsic, requant

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
EDGES = [I32_MIN, I32_MIN + 1, -(1 << 24) - 1, -(1 << 24), -65536, -32768, -129, -128, -33, -32,
         -31, -1, 0, 1, 31, 32, 33, 127, 128, 32767, 65535, 1 << 24, (1 << 24) + 1,
         (1 << 25) - 1, I32_MAX - 1, I32_MAX]
SIMPLE_OPS = ["MIN", "MAX", "ADD", "SUB", "SHR", "MUL", "CLIP", "MOV"]
# One simulation per example (a list of pairs): few examples, many pairs each.
SIM = settings(max_examples=12, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

int32 = st.one_of(st.integers(I32_MIN, I32_MAX), st.sampled_from(EDGES))
# Shift amounts around the saturation points (31 right, 32 left) and far beyond.
shift_amount = st.one_of(st.integers(-40, 40), st.sampled_from([-33, -32, -31, 31, 32, 33]),
                         st.integers(I32_MIN, I32_MAX), st.sampled_from([I32_MIN, I32_MAX]))
# CLIP operands: lanes lo | hi << 16, including empty ranges (lo > hi).
clip_bounds = st.builds(lambda lo, hi: (lo & 0xFFFF) | (hi & 0xFFFF) << 16,
                        st.integers(-(1 << 15), (1 << 15) - 1),
                        st.integers(-(1 << 15), (1 << 15) - 1)).map(
    lambda w: w - (1 << 32) if w >> 31 else w)


def _pairs(b_strategy=int32, max_size: int = 40):
    return st.lists(st.tuples(int32, b_strategy), min_size=1, max_size=max_size)


def test_every_builtin_has_hardware():
    for op in ALU_OPS:
        if op.name in SIMPLE_OPS + ["REQUANT"]:
            assert isinstance(hardware_of(op), AluHardware)
    assert hook_stages(ALU_OPS.by_name("MUL")) == 1
    assert hook_stages(ALU_OPS.by_name("REQUANT")) == 3
    assert hook_stages(ALU_OPS.by_name("ADD")) == 0
    assert hook_stages(ALU_OPS.by_name("MOV")) == 0


@pytest.mark.parametrize("name", SIMPLE_OPS)
def test_edge_values_all_pairs(name):
    """Every pair of edge values, in one pipelined run."""
    op = ALU_OPS.by_name(name)
    bs = EDGES + ([(7 | -3 << 16), (-5 & 0xFFFF) | 9 << 16] if name == "CLIP" else [])
    check_hardware(op, [(a, b) for a in EDGES for b in bs])


@pytest.mark.parametrize("name", ["MIN", "MAX", "ADD", "SUB", "MUL"])
@SIM
@given(data=st.data())
def test_arithmetic_hooks(name, data):
    check_hardware(ALU_OPS.by_name(name), data.draw(_pairs()))


@SIM
@given(pairs=_pairs(shift_amount))
def test_shr_hook(pairs):
    check_hardware(ALU_OPS.by_name("SHR"), pairs)


@SIM
@given(pairs=_pairs(st.one_of(clip_bounds, int32)))
def test_clip_hook(pairs):
    check_hardware(ALU_OPS.by_name("CLIP"), pairs)


# ---------------------------------------------------------------- REQUANT
def _param(m: int, shift: int) -> int:
    return int(requant.pack_params(np.array([m]), np.array([shift]))[0])


scale_params = st.floats(min_value=0.0, max_value=float(np.nextafter(np.float32(1 << 24),
                                                                       np.float32(0))),
                         width=32, allow_subnormal=True).map(
    lambda s: _param(*(int(np.ravel(v)[0]) for v in requant.scale_to_params(np.float32(s)))))
raw_params = st.builds(_param, st.integers(0, (1 << 24) - 1), st.integers(0, 255))
small_shift_params = st.builds(_param, st.integers(0, (1 << 24) - 1), st.integers(0, 40))


@st.composite
def final_ties(draw):
    """acc * M / 2**shift = odd / 2 exactly: a tie of the final rounding."""
    k = draw(st.integers(0, (1 << 22) - 1))
    j = draw(st.integers(0, 31 - (2 * k + 1).bit_length()))
    acc = (2 * k + 1) << j
    i = draw(st.integers(0, 23))
    acc = -acc if draw(st.booleans()) else acc
    return max(acc, I32_MIN), _param(1 << i, min(i + j + 1, 255))


@st.composite
def product_ties(draw):
    """round24(acc * M) with the dropped bits exactly half: a tie of the second rounding.

    acc = q * 2**(d-1) (q odd, < 2**24 so the first rounding is exact) and
    M = 2**p + 1: the product's low d bits are acc's, i.e. 2**(d-1).
    """
    d = draw(st.integers(1, 23))
    p = draw(st.integers(d, 23))
    q_bits = 25 - p
    q = draw(st.integers(1 << (q_bits - 2), (1 << (q_bits - 1)) - 1)) * 2 + 1 if q_bits > 1 else 1
    acc = q << (d - 1)
    acc = -acc if draw(st.booleans()) else acc
    return acc, _param((1 << p) + 1, draw(st.integers(0, 60)))


@st.composite
def input_ties(draw):
    """|acc| of 25..31 bits whose dropped bits are exactly half: a tie of the first rounding."""
    drop = draw(st.integers(1, 7))
    mant = draw(st.integers(1 << 23, (1 << 24) - 1))
    acc = (mant << drop) | (1 << (drop - 1))
    acc = -acc if draw(st.booleans()) else acc
    return acc, draw(st.one_of(scale_params, small_shift_params))


requant_pairs = st.lists(st.one_of(
    st.tuples(int32, st.one_of(scale_params, raw_params, small_shift_params)),
    final_ties(), product_ties(), input_ties()), min_size=1, max_size=60)


def test_requant_edges():
    """Saturation boundaries, zero scale/accumulator, largest shifts and M values."""
    params = [_param(0, 0), _param(1, 0), _param((1 << 24) - 1, 0), _param(1 << 23, 23),
              _param(1 << 23, 24), _param((1 << 24) - 1, 255), _param(1, 255),
              _param((1 << 24) - 1, 24), _param((1 << 24) - 1, 47), _param(3, 1)]
    pairs = [(a, p) for a in EDGES for p in params]
    # exactly -2**31 (no saturation) and 2**31 (saturates) after the first rounding
    pairs += [(I32_MIN, _param(1 << 23, 23)), (I32_MAX, _param(1 << 23, 23)),
              (I32_MAX, _param((1 << 24) - 1, 24)), (-(1 << 30), _param(1 << 23, 22)),
              ((1 << 30), _param(1 << 23, 22)), (-(1 << 30) - 64, _param(1 << 23, 22))]
    check_hardware(ALU_OPS.by_name("REQUANT"), pairs)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(pairs=requant_pairs)
def test_requant_hook(pairs):
    check_hardware(ALU_OPS.by_name("REQUANT"), pairs)


def test_requant_random_bulk():
    """A few thousand random operands in one run (cheap per sample once built)."""
    rng = np.random.default_rng(2024)
    n = 3000
    bits = rng.integers(0, 32, n)
    acc = rng.integers(0, 1 << 31, n) >> (31 - bits)
    acc = np.where(rng.random(n) < 0.5, -acc, acc)
    scales = (rng.random(n) * 2.0 ** rng.integers(-30, 8, n)).astype(np.float32)
    m, s = requant.scale_to_params(scales)
    words = requant.pack_params(m, s)
    check_hardware(ALU_OPS.by_name("REQUANT"), zip(acc.tolist(), words.tolist()))


# ---------------------------------------------------------------- immediates
@pytest.mark.parametrize("imm_bits", [16, 32])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_immediate_decoders(imm_bits, data):
    lo, hi = -(1 << (imm_bits - 1)), (1 << (imm_bits - 1)) - 1
    imms = data.draw(st.lists(st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, -1])),
                              min_size=1, max_size=50))
    for op in ALU_OPS:
        if op.name in SIMPLE_OPS + ["REQUANT"]:
            check_imm_operand(op, imm_bits, imms)


def test_clip_immediate_decoder_refuses_wide_immediates():
    with pytest.raises(RegistryError, match="imm_bits"):
        hardware_of(ALU_OPS.by_name("CLIP")).imm_operand(Signal(40), 40)


def test_clip_immediate_feeds_the_hook():
    """clip_imm(lo, hi) through the decoder and the hook clamps like numpy."""
    from tessera.isa import clip_imm
    op = ALU_OPS.by_name("CLIP")
    for imm_bits in (16, 32):
        imm = clip_imm(-5, 100, imm_bits)
        operand = op.imm_to_operand(imm, imm_bits)
        check_imm_operand(op, imm_bits, [imm])
        check_hardware(op, [(a, operand) for a in (-1000, -5, -4, 0, 99, 100, 101, I32_MAX)])


# ---------------------------------------------------------------- user ops
def _absdiff(m: Module, a: Value, b: Value) -> Value:
    return Mux(a > b, a - b, b - a)


def _avg_pipelined(m: Module, a: Value, b: Value) -> Value:
    """(a + b) >> 1 over two register stages (latency 5)."""
    s1 = Signal(a.shape().width + 1, name="avg_s1")
    s2 = Signal(a.shape().width, name="avg_s2")
    m.d.sync += [s1.eq(a + b), s2.eq(s1.as_signed() >> 1)]
    return s2.as_signed()


def _avg(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a + b) >> 1


@SIM
@given(pairs=_pairs())
def test_user_op_with_own_hardware(pairs):
    absdiff = Intrinsic("ABSDIFF", ALU_OPS.free_opcodes()[0], lambda a, b: np.abs(a - b),
                        hardware=AluHardware(_absdiff))
    with ALU_OPS.temporarily(absdiff):
        check_hardware(ALU_OPS.by_name("ABSDIFF"), pairs)
    assert "ABSDIFF" not in ALU_OPS


def test_user_op_pipelined_and_immediate():
    # Immediate decoder: the immediate counts in units of 4.
    avg = Intrinsic("AVG", ALU_OPS.free_opcodes()[0], _avg,
                    AluTiming(ii_imm=1, ii_tensor=2, latency=5),
                    imm_to_operand=lambda imm, bits: imm * 4,
                    hardware=AluHardware(_avg_pipelined, lambda imm, bits: imm * 4))
    with ALU_OPS.temporarily(avg):
        op = ALU_OPS.by_name("AVG")
        assert hook_stages(op) == 2
        check_hardware(op, [(a, b) for a in EDGES[::3] for b in EDGES[::2]])
        check_imm_operand(op, 16, [-32768, -1, 0, 1, 32767])


def test_op_without_hardware_is_refused():
    bare = Intrinsic("BARE", ALU_OPS.free_opcodes()[0], np.add)
    with ALU_OPS.temporarily(bare):
        with pytest.raises(RegistryError, match="op BARE has no hardware hook: pass "
                                                r"hardware=AluHardware\(\.\.\.\)"):
            hardware_of(ALU_OPS.by_name("BARE"))
        with pytest.raises(RegistryError, match="no hardware hook"):
            check_hardware(bare, [(1, 2)])
    with pytest.raises(RegistryError, match="not an AluHardware"):
        hardware_of(dataclasses.replace(bare, hardware=lambda m, a, b: a))


def test_mismatching_hook_is_caught():
    wrong = Intrinsic("WRONG", 20, np.add, hardware=AluHardware(lambda m, a, b: a - b))
    with pytest.raises(AssertionError, match=r"WRONG hardware mismatch at sample 1: a=5, b=3 "
                                             r".*expected 8, hardware gave 2"):
        check_hardware(wrong, [(1, 0), (5, 3)])


def test_wrong_stage_count_is_caught():
    # MUL's latency 4 asks for one stage; a combinational multiplier is early.
    comb_mul = dataclasses.replace(ALU_OPS.by_name("MUL"),
                                   hardware=AluHardware(lambda m, a, b: a * b))
    with pytest.raises(AssertionError, match="match with 0 pipeline stage"):
        check_hardware(comb_mul, [(3, 4), (5, 6), (-7, 8)])


def test_attach_is_idempotent_and_respects_user_redefinitions():
    before = {op.name: op.hardware for op in ALU_OPS}
    attach_builtin_hardware()
    attach_builtin_hardware()
    assert {op.name: op.hardware for op in ALU_OPS} == before
    original = ALU_OPS.by_name("MIN")
    # A user redefinition of MIN with other semantics gets no built-in hardware.
    ALU_OPS.register(dataclasses.replace(original, semantics=np.maximum, hardware=None),
                     replace=True)
    try:
        attach_builtin_hardware()
        assert ALU_OPS.by_name("MIN").hardware is None
        # ... while the unchanged built-in gets it back.
        ALU_OPS.register(dataclasses.replace(original, hardware=None), replace=True)
        attach_builtin_hardware()
        assert ALU_OPS.by_name("MIN").hardware is original.hardware
    finally:
        ALU_OPS.register(original, replace=True)


def test_mov_hardware_only_for_the_builtin_semantics():
    """MOV's built-in semantics is an unnamed lambda: a redefinition with another lambda
    (same name, opcode and timing) gets no hardware; the built-in gets it back."""
    original = ALU_OPS.by_name("MOV")
    assert isinstance(hardware_of(original), AluHardware)
    ALU_OPS.register(dataclasses.replace(original, semantics=lambda a, b: a, hardware=None),
                     replace=True)
    try:
        attach_builtin_hardware()
        assert ALU_OPS.by_name("MOV").hardware is None
        ALU_OPS.register(dataclasses.replace(original, hardware=None), replace=True)
        attach_builtin_hardware()
        assert ALU_OPS.by_name("MOV").hardware is original.hardware
    finally:
        ALU_OPS.register(original, replace=True)


# ------------------------------------------------------------------ table-reading hooks
def _lut_samples(rng: np.random.Generator, entries: int) -> list[tuple[int, int]]:
    """Every int8 value through a table at a random base, then int32 edges and random
    lanes with random (also negative and out-of-range) bases."""
    base = int(rng.integers(0, entries // 256)) * 256
    pairs = [(a, base) for a in range(-128, 128)]
    pairs += [(a, int(b)) for a in EDGES for b in rng.integers(-3 * entries, 3 * entries, 2)]
    pairs += [(int(a), int(b)) for a, b in zip(rng.integers(I32_MIN, I32_MAX, 60),
                                               rng.integers(I32_MIN, I32_MAX, 60))]
    return pairs


@pytest.mark.parametrize("entries, row_entries", [(1024, 16), (256, 4), (512, 1)])
def test_lut_hook(entries, row_entries):
    """The LUT plug-in's hook (a reference resolved on use) against its numpy semantics,
    with the table in words of ``row_entries`` entries as the tensor ALU holds it."""
    from tessera.plugins.lut.hardware import LUT_HARDWARE

    lut = ALU_OPS.by_name("LUT")
    assert isinstance(lut.hardware, str) and hardware_of(lut) is LUT_HARDWARE
    assert hook_stages(lut) == 1
    rng = np.random.default_rng(entries)
    table = rng.integers(-128, 128, entries)
    check_hardware(lut, _lut_samples(rng, entries), table=table, row_entries=row_entries)


def _table_plus_a(m, a, b, table):
    """A user's table op: ``table[b] + a`` (the read is its one stage; ``a`` waits)."""
    a1 = Signal.like(a)
    m.d.sync += a1.eq(a)
    return a1 + table.read(m, b)


def test_user_table_op_with_own_hardware():
    """The hook API in general form: any op declaring reads_table gets the lane's table."""
    op = Intrinsic("TADD", ALU_OPS.free_opcodes()[0],
                   lambda a, b, table: a + table[b & (table.size - 1)],
                   AluTiming(ii_imm=1, ii_tensor=2, latency=4), reads_table=True,
                   hardware=AluHardware(_table_plus_a))
    table = np.arange(256) - 128
    check_hardware(op, [(a, b) for a in EDGES[::4] for b in (0, 5, 255, 256, -1)], table=table)
    wrong = dataclasses.replace(op, semantics=lambda a, b, table: a - table[b & 255])
    with pytest.raises(AssertionError, match="TADD hardware mismatch at sample 0: a=1, b=3 "
                                             ".*expected 126, hardware gave -124"):
        check_hardware(wrong, [(1, 3), (2, 4)], table=table)
    with pytest.raises(ValueError, match="reads the table memory: pass table="):
        check_hardware(op, [(1, 2)])
    with pytest.raises(ValueError, match="does not read the table memory"):
        check_hardware(ALU_OPS.by_name("ADD"), [(1, 2)], table=table)
    fast = dataclasses.replace(op, timing=AluTiming(latency=3))
    with pytest.raises(RegistryError, match="latency 3.*at least 4 .its table read"):
        hook_stages(fast)


def test_unresolvable_hardware_reference_is_refused():
    broken = Intrinsic("BROKEN", ALU_OPS.free_opcodes()[0], np.add,
                       hardware="tessera.plugins.lut.hardware:NO_SUCH_HOOK")
    with pytest.raises(RegistryError, match="cannot resolve the hook reference"):
        hardware_of(broken)


@pytest.mark.parametrize("width, base, shift_bits", [(9, 3, 4), (6, 0, 3), (2, 1, 2)])
def test_requant_helpers_against_python_on_every_input(width, base, shift_bits):
    """REQUANT's leading-bit search and round-half-even shift, every ``x`` and shift amount of
    small widths (the shift amount wrapping past the width included)."""
    from amaranth.sim import Simulator

    from tessera.hw.alu_ops import _bits_above, _rne_shift_right
    m = Module()
    x, s = Signal(width), Signal(shift_bits)
    above, shifted = _bits_above(m, x, base, "above"), Signal(width)
    m.d.comb += shifted.eq(_rne_shift_right(x, s))
    bad = []

    def rne(v: int, k: int) -> int:
        if k == 0:
            return v
        q, rem, half = v >> k, v & ((1 << k) - 1), 1 << (k - 1)
        return q + (rem > half or (rem == half and q & 1))

    async def bench(ctx):
        for v in range(1 << width):
            ctx.set(x, v)
            if ctx.get(above) != max(v.bit_length() - base, 0):
                bad.append(("above", v, ctx.get(above)))
            for k in range(1 << shift_bits):
                ctx.set(s, k)
                if ctx.get(shifted) != rne(v, k):
                    bad.append(("rne", v, k, ctx.get(shifted)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert not bad, bad[:5]
