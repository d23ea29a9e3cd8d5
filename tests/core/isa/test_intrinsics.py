"""The ALU intrinsic registry: built-ins, user ops, clashes, immediates and timing.

Expected values are written out here with numpy / Python ints; user ops are
registered only inside ``ALU_OPS.temporarily`` so the global registry is left
as it was.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numpy.testing import assert_array_equal

from tessera.config import PRESETS
from tessera.errors import HazardError, MalformedInstructionError, RegistryError
from tessera.isa import (ALU_OPS, Alu, AluTiming, Intrinsic, IntrinsicRegistry, Uop, clip_imm,
                         clip_operand, get_isa, register_alu_op)

from tests.programs import I32_MAX, I32_MIN, run_on_acc, sat8, wrap32

TINY = PRESETS["tiny"]
BUILTINS = [("MIN", 0), ("MAX", 1), ("ADD", 2), ("SUB", 3), ("SHR", 4), ("MUL", 5),
            ("CLIP", 6), ("REQUANT", 7), ("MOV", 8)]
FEW = settings(max_examples=30, deadline=None)


def absdiff(a, b):
    return np.abs(a - b)


def user_opcode() -> int:
    free = [o for o in ALU_OPS.free_opcodes() if o >= 8]
    assert free, "no free ALU opcode left"
    return free[0]


# ==================================================================== built-ins
def test_builtin_names_and_opcodes():
    ops = {op.name: op.opcode for op in ALU_OPS}
    for name, code in BUILTINS:
        assert ops[name] == code
        assert ALU_OPS.get(code).name == name
        assert ALU_OPS.by_name(name).opcode == code
        assert ALU_OPS.by_name(name.lower()).opcode == code       # lookup ignores case
        assert name in ALU_OPS and name.lower() in ALU_OPS
    assert [op.opcode for op in ALU_OPS] == sorted(op.opcode for op in ALU_OPS)
    free = ALU_OPS.free_opcodes()
    assert not set(free) & set(range(8))
    assert free == [c for c in range(16) if ALU_OPS.get(c) is None]


def test_fresh_interpreter_registry_is_the_builtins_and_the_plugins():
    """In a clean process (no test module registering anything): the built-ins, then the
    plug-ins of the tessera.intrinsics entry points (Tessera's own: LUT at 15); 9..14 free."""
    code = ("from tessera.isa import ALU_OPS; "
            "print([(o.name, o.opcode) for o in ALU_OPS]); print(ALU_OPS.free_opcodes())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == [repr(BUILTINS + [("LUT", 15)]), repr(list(range(9, 15)))]


def test_unknown_name_lookup():
    with pytest.raises(KeyError, match="no ALU op named 'NOPE'.*MIN"):
        ALU_OPS.by_name("NOPE")
    assert ALU_OPS.by_name("NOPE", default=None) is None
    assert "NOPE" not in ALU_OPS
    assert ALU_OPS.get(15 if ALU_OPS.get(15) is None else 16) is None


def test_alu_label_names_the_op():
    assert Alu(alu_op=1).label == "ALU MAX"
    assert Alu(alu_op=7).label == "ALU REQUANT"
    free = user_opcode()
    assert Alu(alu_op=free).label == f"ALU op{free}"


# ==================================================================== user ops
def test_user_op_runs_in_the_simulator_and_goes_away():
    code = user_opcode()
    n = 6
    rng = np.random.default_rng(1)
    a = rng.integers(-10**6, 10**6, (n, 1, 4))
    b = rng.integers(-10**6, 10**6, (n, 1, 4))
    a[0, 0], b[0, 0] = [I32_MAX, I32_MIN, 5, -5], [I32_MIN, I32_MAX, 5, 5]   # |a-b| wraps
    insn = Alu(alu_op=code, uop_begin=0, uop_end=1, iter_out=n, dst_factor_out=1,
               src_factor_out=1)
    acc0 = np.concatenate([a, b])
    op = Intrinsic("ABSDIFF", code, absdiff, doc="|a - b|")
    with ALU_OPS.temporarily(op) as registered:
        assert registered is op
        assert ALU_OPS.by_name("absdiff") is op and ALU_OPS.get(code) is op
        assert code not in ALU_OPS.free_opcodes()
        assert insn.label == "ALU ABSDIFF"
        _, final, out = run_on_acc(TINY, acc0, [insn], uops=[Uop(dst=0, src=n)])
    # semantics written out: |a - b| in exact integers, then wrapped to int32
    expected = wrap32(np.abs(a - b))
    assert expected[0, 0, 0] == -1 and expected[0, 0, 1] == -1     # 2**32 - 1 wraps to -1
    assert_array_equal(final[:n], expected)
    assert_array_equal(final[n:], b)
    assert_array_equal(out, sat8(final))
    # gone afterwards: registry, label and simulator all reject it
    assert "ABSDIFF" not in ALU_OPS
    assert ALU_OPS.get(code) is None and code in ALU_OPS.free_opcodes()
    assert insn.label == f"ALU op{code}"
    with pytest.raises(MalformedInstructionError, match=f"alu_op {code} is not a registered"):
        run_on_acc(TINY, acc0, [insn], uops=[Uop(dst=0, src=n)])


def test_user_op_immediate_decoding_and_timing():
    """A user op's imm_to_operand and hazard distance are what the simulator uses."""
    code = user_opcode()
    # operand = imm << 8; latency 8: imm distance 8, tensor distance ceil((8 + 1) / 2) = 5
    op = Intrinsic("ADDSHIFTED", code, lambda a, b: a + b,
                   timing=AluTiming(ii_imm=1, ii_tensor=2, latency=8),
                   imm_to_operand=lambda imm, bits: imm << 8)
    acc0 = np.arange(16 * 4).reshape(16, 1, 4) - 20
    with ALU_OPS.temporarily(op):
        uops = [Uop(dst=r) for r in range(8)]
        insn = Alu(alu_op=code, use_imm=True, imm=-3, uop_begin=0, uop_end=8, iter_out=2)
        _, final, _ = run_on_acc(TINY, acc0, [insn], uops=uops)
        expected = acc0.copy()
        expected[:8] += 2 * (-3 * 256)
        assert_array_equal(final, expected)
        with pytest.raises(HazardError, match="ALU ADDSHIFTED.*needs 8"):
            run_on_acc(TINY, acc0, [insn.replace(uop_end=7)], uops=uops)
        tensor = Alu(alu_op=code, uop_begin=0, uop_end=4, iter_out=2)
        with pytest.raises(HazardError, match="needs 5"):
            run_on_acc(TINY, acc0, [tensor], uops=[Uop(dst=r, src=8 + r) for r in range(4)])
    assert "ADDSHIFTED" not in ALU_OPS


def test_temporarily_unregisters_on_exception():
    code = user_opcode()
    with pytest.raises(ZeroDivisionError):
        with ALU_OPS.temporarily(Intrinsic("BOOM", code, absdiff)):
            assert "BOOM" in ALU_OPS
            1 / 0
    assert "BOOM" not in ALU_OPS and ALU_OPS.get(code) is None


def test_register_alu_op_is_the_global_registry():
    code = user_opcode()
    op = register_alu_op(Intrinsic("ABSDIFF", code, absdiff))
    try:
        assert ALU_OPS.get(code) is op
    finally:
        ALU_OPS.unregister("ABSDIFF")
    assert ALU_OPS.get(code) is None


# ====================================================================== clashes
def test_opcode_clash_names_the_owner_and_free_opcodes():
    before = list(ALU_OPS)
    with pytest.raises(RegistryError) as info:
        register_alu_op(Intrinsic("MAX2", 1, np.maximum))
    msg = str(info.value)
    assert "opcode 1 is taken by MAX" in msg
    assert f"free opcodes: {ALU_OPS.free_opcodes()}" in msg
    assert list(ALU_OPS) == before


def test_name_clash_suggests_replace():
    before = list(ALU_OPS)
    with pytest.raises(RegistryError, match=r"ALU op MAX is already registered \(opcode 1\); "
                                            r"pass replace=True"):
        register_alu_op(Intrinsic("MAX", user_opcode(), np.maximum))
    assert list(ALU_OPS) == before


def test_temporarily_with_a_clash_leaves_the_registry_alone():
    before = list(ALU_OPS)
    with pytest.raises(RegistryError, match="taken by ADD"):
        with ALU_OPS.temporarily(Intrinsic("PLUS", 2, np.add)):
            pass
    assert list(ALU_OPS) == before and ALU_OPS.by_name("ADD").opcode == 2


@pytest.mark.parametrize("opcode", [16, -1, 100])
def test_opcode_out_of_range(opcode):
    with pytest.raises(RegistryError, match=rf"ALU opcode of ABSDIFF must be in \[0, 15\], "
                                            rf"not {opcode}"):
        register_alu_op(Intrinsic("ABSDIFF", opcode, absdiff))


@pytest.mark.parametrize("name", ["absdiff", "AbsDiff", "ABS DIFF", "ABS-DIFF", "1ABS", ""])
def test_bad_names(name):
    with pytest.raises(RegistryError, match="upper-case identifier"):
        register_alu_op(Intrinsic(name, user_opcode(), absdiff))
    assert ALU_OPS.get(user_opcode()) is None


def test_replace_in_a_private_registry():
    reg = IntrinsicRegistry("TEST", 2)
    a = reg.register(Intrinsic("A", 0, np.add))
    b = reg.register(Intrinsic("B", 1, np.subtract))
    assert reg.free_opcodes() == [2, 3]
    with pytest.raises(RegistryError, match=r"TEST opcode of C must be in \[0, 3\], not 4"):
        reg.register(Intrinsic("C", 4, np.add))
    # redefine A at a new opcode: its old opcode is freed
    a2 = reg.register(Intrinsic("A", 3, np.multiply), replace=True)
    assert reg.get(0) is None and reg.get(3) is a2 and reg.by_name("A") is a2
    # a new op replacing B's opcode evicts B
    c = reg.register(Intrinsic("C", 1, np.maximum), replace=True)
    assert "B" not in reg and reg.get(1) is c
    assert reg.names() == ["C", "A"]
    reg.unregister("a")
    assert reg.names() == ["C"]
    with pytest.raises(KeyError):
        reg.unregister("A")
    del a, b


# =========================================================== Intrinsic.apply
def test_apply_wraps_to_32_bits():
    add, sub, mul = (ALU_OPS.by_name(n) for n in ("ADD", "SUB", "MUL"))
    a32 = np.array([I32_MAX, I32_MIN, 65536, -7], dtype=np.int32)   # int32 inputs do not overflow
    assert_array_equal(add.apply(a32, np.array([1, -1, 65536, 7], np.int32)),
                       [I32_MIN, I32_MAX, 131072, 0])
    assert_array_equal(sub.apply(a32, np.array([-1, 1, 0, 0], np.int32)), [I32_MIN, I32_MAX, 65536, -7])
    assert_array_equal(mul.apply(a32, np.array([2, 2, 65536, -3], np.int32)), [-2, 0, 0, 21])
    out = add.apply(a32, a32)
    assert out.dtype == np.int64
    assert_array_equal(out, [wrap32(2 * int(v)) for v in a32])


def test_apply_wraps_user_semantics_and_other_widths():
    op = Intrinsic("BIG", 9, lambda a, b: a * (2**33) + b)
    assert_array_equal(op.apply(np.array([3, -3]), np.array([5, -5])), [5, -5])
    add = ALU_OPS.by_name("ADD")
    assert_array_equal(add.apply(np.array([32767, -32768]), np.array([1, -1]), acc_bits=16),
                       [-32768, 32767])


def test_apply_shr_documented_edges():
    shr = ALU_OPS.by_name("SHR")
    a = np.array([-8, -8, 1, 1, -1, 5, -5, 3, 1 << 30])
    b = np.array([1, -1, -31, -32, 100, I32_MAX, 1, I32_MIN, -1])
    assert_array_equal(shr.apply(a, b), [-4, -16, I32_MIN, 0, -1, 0, -3, 0, I32_MIN])


# ======================================================== CLIP immediates
def decode_halves(word: int, half: int) -> tuple[int, int]:
    mask = (1 << half) - 1
    lo, hi = word & mask, (word >> half) & mask
    sign = 1 << (half - 1)
    return (lo ^ sign) - sign, (hi ^ sign) - sign


@FEW
@given(data=st.data(), imm_bits=st.sampled_from([8, 16, 17, 24, 32]))
def test_clip_imm_round_trip(data, imm_bits):
    half = imm_bits // 2
    bound = st.integers(-(1 << (half - 1)), (1 << (half - 1)) - 1)
    lo, hi = data.draw(bound), data.draw(bound)
    imm = clip_imm(lo, hi, imm_bits)
    assert -(1 << (imm_bits - 1)) <= imm < 1 << (imm_bits - 1)      # fits the signed field
    assert decode_halves(imm & ((1 << imm_bits) - 1), half) == (lo, hi)
    operand = ALU_OPS.by_name("CLIP").imm_to_operand(imm, imm_bits)
    assert operand == clip_operand(lo, hi)
    assert I32_MIN <= operand <= I32_MAX
    assert decode_halves(operand & 0xFFFFFFFF, 16) == (lo, hi)
    a = np.array([I32_MIN, lo - 1, lo, 0, hi, hi + 1, I32_MAX])
    got = ALU_OPS.by_name("CLIP").apply(a, np.full(a.shape, operand))
    assert_array_equal(got, np.minimum(np.maximum(a, lo), hi))


@FEW
@given(lo=st.integers(-(2**15), 2**15 - 1), hi=st.integers(-(2**15), 2**15 - 1))
def test_clip_operand_layout(lo, hi):
    word = (lo & 0xFFFF) | ((hi & 0xFFFF) << 16)
    assert clip_operand(lo, hi) == (word - 2**32 if word >= 2**31 else word)
    # the 32-bit immediate form of the same bounds is the same lane value
    assert clip_imm(lo, hi, 32) == clip_operand(lo, hi)


@pytest.mark.parametrize("config", [PRESETS["pynq"], TINY], ids=["pynq", "tiny"])
def test_clip_imm_fits_the_config_immediate(config):
    bits = get_isa(config).imm_bits
    top = 1 << (bits // 2 - 1)
    for lo, hi in [(-top, top - 1), (0, 6), (-1, -1)]:
        get_isa(config).encode(Alu(alu_op=6, use_imm=True, imm=clip_imm(lo, hi, bits)))


@pytest.mark.parametrize("lo, hi, bits, which", [
    (128, 0, 16, "lo"), (-129, 0, 16, "lo"), (0, 128, 16, "hi"), (0, -129, 16, "hi"),
    (2**15, 0, 32, "lo"), (0, -(2**15) - 1, 32, "hi"), (8, 0, 8, "lo")])
def test_clip_imm_out_of_range(lo, hi, bits, which):
    half = bits // 2
    bad = lo if which == "lo" else hi
    with pytest.raises(RegistryError, match=rf"CLIP {which} bound must fit {half} signed bits "
                                            rf"with a {bits}-bit immediate, not {bad}; "
                                            "use a tensor operand"):
        clip_imm(lo, hi, bits)


@pytest.mark.parametrize("lo, hi, which", [(2**15, 0, "lo"), (-(2**15) - 1, 0, "lo"),
                                           (0, 2**15, "hi"), (0, -(2**15) - 1, "hi")])
def test_clip_operand_out_of_range(lo, hi, which):
    bad = lo if which == "lo" else hi
    with pytest.raises(RegistryError, match=f"CLIP {which} bound must fit 16 signed bits, not {bad}"):
        clip_operand(lo, hi)


# ====================================================================== timing
@pytest.mark.parametrize("timing, imm, tensor", [
    (AluTiming(), 3, 2),
    (AluTiming(ii_imm=1, ii_tensor=2, latency=4), 4, 3),
    (AluTiming(ii_imm=1, ii_tensor=2, latency=6), 6, 4),
    (AluTiming(ii_imm=2, ii_tensor=3, latency=7), 4, 3),
    (AluTiming(ii_imm=1, ii_tensor=1, latency=1), 1, 2),
    (AluTiming(ii_imm=4, ii_tensor=4, latency=3), 1, 1),
    (AluTiming(ii_imm=3, ii_tensor=5, latency=9), 3, 2),
])
def test_hazard_distance(timing, imm, tensor):
    assert timing.hazard_distance(True) == imm
    assert timing.hazard_distance(False) == tensor
    assert timing.write_latency(False) == timing.write_latency(True) + 1
    assert timing.ii(True) == timing.ii_imm and timing.ii(False) == timing.ii_tensor


@pytest.mark.parametrize("name, imm, tensor", [
    ("MIN", 3, 2), ("MAX", 3, 2), ("ADD", 3, 2), ("SUB", 3, 2), ("SHR", 3, 2),
    ("MUL", 4, 3), ("CLIP", 3, 2), ("REQUANT", 6, 4)])
def test_builtin_hazard_distances(name, imm, tensor):
    t = ALU_OPS.by_name(name).timing
    assert (t.hazard_distance(True), t.hazard_distance(False)) == (imm, tensor)


def test_membership_by_name_and_opcode():
    from tessera.isa import ALU_OPS
    assert "MAX" in ALU_OPS and "max" in ALU_OPS and 1 in ALU_OPS
    assert 14 not in ALU_OPS and "NOPE" not in ALU_OPS
