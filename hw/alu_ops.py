"""Hardware hooks of the tensor-ALU intrinsics: one :class:`AluHardware` per op.

The tensor ALU instantiates, for every lane, the ``hardware`` slot of each
registered :class:`~tessera.isa.Intrinsic`. A hook is a pure datapath:

* ``build(m, a, b)`` gets the accumulator lane ``a`` and the operand lane ``b``
  (both ``signed(32)``, valid in cycle *t*) and returns a Value of at least 32
  bits valid in cycle *t + d*, where ``d = op.timing.latency - ALU_BASE_LATENCY``.
  It adds exactly ``d`` register stages with ``m.d.sync`` (``d = 0``: purely
  combinational) and accepts a new ``a``/``b`` every cycle: no stalls, no
  valid bits. The ALU keeps the low 32 bits as an int32, i.e. the numpy
  semantics wrapped to 32 bits (:meth:`Intrinsic.apply`). The tensor ALU clocks a
  hook's registers only in the cycles its pipeline runs that op (an enable on each
  ``sync`` statement), which a hook keeping to this contract cannot tell from every cycle.
* ``imm_operand(imm, imm_bits)`` is the hardware image of
  ``Intrinsic.imm_to_operand``: it turns the ``signed(imm_bits)`` immediate into
  the ``signed(32)`` lane operand. ``None`` means sign extension (the default
  ``immediate_as_is``).

An op that ``reads_table`` (its semantics take the ALU table memory, ``HwConfig.
table_entries`` int8 entries loaded by ``LOAD tbl``) is built as ``build(m, a, b,
table)``: ``table`` is the lane's :class:`TableMemory`, and ``table.read(m, entry)``
returns ``table[entry mod table.entries]`` as a ``signed(8)`` Value valid one cycle
after ``entry``: a synchronous read, which counts as one of the hook's ``latency - 3``
register stages (so such an op has latency 4 or more). ``entry`` may be any Value; its
low ``table.index_bits`` bits are used. Each call adds a read port; every lane has its
own copy of the table, so the lanes read independently. ``table.entries`` and
``table.index_bits`` are plain ints, for building the index.

A ``hardware`` slot may also hold a ``"module:attribute"`` reference to the hook
(:func:`tessera.isa.resolve`), so registering an op imports no Amaranth.

This module fills the hooks of the built-ins at import
(:func:`attach_builtin_hardware`). A user op brings its own::

    from tessera.hw.alu_ops import AluHardware, check_hardware
    ABSDIFF = register_alu_op(Intrinsic(
        "ABSDIFF", 8, lambda a, b: np.abs(a - b),
        hardware=AluHardware(lambda m, a, b: Mux(a > b, a - b, b - a))))
    check_hardware(ABSDIFF, [(1, 5), (-7, 3)])

A table-reading hook is checked with a table: ``check_hardware(op, samples,
table=np.arange(256) - 128)``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
from amaranth.hdl import Cat, ClockDomain, Const, Module, Mux, Signal, Value, signed
from amaranth.sim import Simulator

from tessera.errors import RegistryError
from tessera.isa import ALU_OPS, Intrinsic, resolve
from tessera.isa import intrinsics as _intrinsics
from tessera.isa import requant as _rq

from .table import TableMemory

__all__ = [
    "ALU_BASE_LATENCY", "AluHardware", "TableMemory", "attach_builtin_hardware",
    "hardware_of", "hook_stages", "check_hardware", "check_imm_operand",
]

#: Latency of an ALU op whose hook is purely combinational (docs/timing.md: the
#: fast ops have latency 3). A hook of an op with latency L adds L - 3 stages.
ALU_BASE_LATENCY = 3
#: Width of an accumulator lane.
LANE_BITS = 32

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class AluHardware:
    """The hardware of one ALU op, instantiated once per lane by the tensor ALU.

    Attributes:
        build: ``build(m, a, b) -> Value`` (``build(m, a, b, table)`` for an op that
            ``reads_table``, ``table`` a :class:`TableMemory`); see the module
            docstring for the timing contract (``op.timing.latency - 3`` register
            stages, a table read counting as one).
        imm_operand: ``imm_operand(imm, imm_bits) -> Value``, the ``signed(32)``
            lane operand of a ``signed(imm_bits)`` immediate; ``None`` = sign
            extension.
    """

    build: Callable[..., Value]
    imm_operand: Callable[[Value, int], Value] | None = None

    def operand_of_imm(self, imm: Value, imm_bits: int) -> Value:
        """The ``signed(32)`` lane operand of an immediate (the hook or sign extension)."""
        if self.imm_operand is None:
            return _sext(imm.as_signed(), LANE_BITS).as_signed()
        return self.imm_operand(imm, imm_bits)


def hook_stages(op: Intrinsic) -> int:
    """Register stages the hook of ``op`` must add: ``latency - 3`` (>= 0; >= 1 for an op
    that ``reads_table``, whose table read is a register stage)."""
    stages = op.timing.latency - ALU_BASE_LATENCY
    least = ALU_BASE_LATENCY + (1 if op.reads_table else 0)
    if op.timing.latency < least:
        why = " (its table read takes a cycle)" if op.reads_table else ""
        raise RegistryError(f"ALU op {op.name} has latency {op.timing.latency}; the tensor ALU "
                            f"needs at least {least}{why}")
    return stages


def hardware_of(op: Intrinsic) -> AluHardware:
    """The :class:`AluHardware` of ``op`` (a ``"module:attribute"`` reference resolved).

    Raises:
        RegistryError: ``op`` has no hook (or something else than an AluHardware), or
            its reference does not resolve.
    """
    hw = resolve(op.hardware)
    if hw is None:
        raise RegistryError(f"op {op.name} has no hardware hook: pass "
                            f"hardware=AluHardware(...) when registering it")
    if not isinstance(hw, AluHardware):
        raise RegistryError(f"op {op.name} has hardware={hw!r}, not an AluHardware: pass "
                            f"hardware=AluHardware(build, imm_operand) when registering it")
    return hw


# ------------------------------------------------------------------ helpers
def _reg(m: Module, value: Value, name: str, shape=None) -> Signal:
    """A pipeline register loaded with ``value`` every cycle.

    reset_less: a datapath stage needs no reset (its contents are only read
    once valid), and a reset would keep yosys/Vivado from folding the stage
    into a DSP48 register as readily.
    """
    reg = Signal(shape if shape is not None else value.shape(), name=name, reset_less=True)
    m.d.sync += reg.eq(value)
    return reg


def _bits_above(m: Module, x: Value, base: int, name: str) -> Signal:
    """``max(bit_length(x) - base, 0)`` of an unsigned ``x``: ``bit_length(x >> base)``, by
    a binary search for the highest set bit (a zero test and a mux per halving), which is
    a few operations per lane in a simulator where a chain of one test per bit is as many
    branches as bits."""
    y = x[base:]
    res = Signal(range(len(y) + 1), name=name)
    # y zero-extended to 2 * half bits (the least power of two >= len(y))
    half = 1 << ((len(y) - 1).bit_length() - 1) if len(y) > 1 else 0
    v, top = Value.cast(y), []
    while half >= 1:
        upper = v[half:2 * half]      # the top half, its unused high bits cut off
        nonzero = Signal(name=f"{name}_nz{half}")
        m.d.comb += nonzero.eq(upper.any())
        top.append(nonzero)
        v = Mux(nonzero, upper, v[:half])
        half //= 2
    # v is now the highest set bit (1 unless y is 0); the tests, msb first, its position.
    m.d.comb += res.eq(Mux(v[0], Cat(*reversed(top)) + 1, 0))
    return res


def _rne_shift_right(x: Value, s: Value) -> Value:
    """``x / 2**s`` rounded half to even, for unsigned ``x`` and unsigned ``s``.

    Returns a Value of ``len(x)`` bits: with ``s >= 1`` the quotient is below
    ``2**(len(x) - 1)``, so the round-up carry never overflows; ``s = 0`` has
    nothing to round. Any ``s`` is allowed (``s > len(x)`` gives 0).
    """
    width = len(x)
    q = x >> s
    sm1 = (s - 1)[:len(s)]  # wraps for s = 0, where the guard is masked anyway
    guard = (s != 0) & (x >> sm1)[0]
    # Sticky bit: any of the bits below the guard, i.e. bit i with i + 1 < s: a mask of
    # the low s - 1 bits. A thermometer code, each bit a function of s alone (a LUT), made
    # by shifting 2**k - 1 ones right by ~(s - 1) = 2**k - 1 - (s - 1) (k = len(s)): one
    # shift of a constant in a simulator rather than a comparison per bit, and no
    # variable-width `1 << s`.
    ones = (1 << (2 ** len(s) - 1)) - 1
    thermometer = Const(ones, 2 ** len(s) - 1) >> ~sm1
    mask = Cat(thermometer, Const(0, max(width - len(thermometer), 0)))[:width]
    sticky = (x & mask).any()
    up = guard & (sticky | q[0])
    return (q + up)[:width]


def _renormalize(mant: Value, exp: Value, mant_bits: int) -> tuple[Value, Value]:
    """``(mant, exp)`` with a rounded mantissa of ``mant_bits + 1`` bits brought back to
    ``mant_bits`` bits: rounding up can only carry into ``2**mant_bits`` exactly,
    which is ``2**(mant_bits - 1) << 1``. Keeping mantissas at 24 bits makes the
    multiply a 24 x 24 one (two DSP48E1s rather than four)."""
    carry = mant[mant_bits]
    # On a carry the low bits are all zero, so OR-ing the carry into the top bit
    # gives 2**(mant_bits - 1).
    top = mant[mant_bits - 1] | carry
    return Cat(mant[:mant_bits - 1], top), exp + carry


def _sat_signed32(mag: Value, neg: Value) -> Value:
    """``-mag`` or ``mag`` (unsigned magnitude) saturated to int32."""
    pos_val = Mux(mag > INT32_MAX, INT32_MAX, mag[:LANE_BITS])
    neg_val = Mux(mag > -INT32_MIN, INT32_MIN, -(mag[:LANE_BITS + 1]))
    return Mux(neg, neg_val, pos_val)[:LANE_BITS].as_signed()


def _sext(v: Value, bits: int) -> Value:
    """``v`` (read as signed) sign-extended or truncated to exactly ``bits`` bits (unsigned)."""
    if len(v) >= bits:
        return v[:bits]
    return Cat(v, v[-1].replicate(bits - len(v)))


# ------------------------------------------------------------------ built-in hooks
def _min_hw(m: Module, a: Value, b: Value) -> Value:
    return Mux(a < b, a, b)


def _max_hw(m: Module, a: Value, b: Value) -> Value:
    return Mux(a > b, a, b)


def _add_hw(m: Module, a: Value, b: Value) -> Value:
    return a + b  # 33 bits; the ALU keeps the low 32 (wrapping)


def _sub_hw(m: Module, a: Value, b: Value) -> Value:
    return a - b


def _shr_hw(m: Module, a: Value, b: Value) -> Value:
    # One shared shifter for both directions (half the LUTs of two): a left
    # shift is a right shift of the bit-reversed value, filling with zeros
    # instead of copies of the sign bit.
    right = b >= 0
    # b >= 0: arithmetic right shift, the amount saturating at 31 (all sign bits).
    # b < 0: left shift by -b, saturating at 32 (everything shifted out -> 0);
    # -b is 33 bits wide, so INT32_MIN does not overflow.
    neg_b = -b
    amount = Mux(right, Mux(b > 31, 31, b[:5]), Mux(neg_b > 32, 32, neg_b[:6]))
    x = Mux(right, a, a[::-1])[:LANE_BITS]  # Mux of signed and unsigned widens: trim
    # The fill bits as one mux of constants: ``(right & a[-1]).replicate(32)`` would be
    # exported as 32 AND gates, each evaluated by a simulator (synthesis gives the same).
    fill = Mux(right & a[-1], (1 << LANE_BITS) - 1, 0)
    shifted = (Cat(x, fill) >> amount)[:LANE_BITS]
    return Mux(right, shifted, shifted[::-1]).as_signed()


def _mul_hw(m: Module, a: Value, b: Value) -> Value:
    # Only the low 32 bits are kept, so the product is truncated before the
    # register: the register then holds 32 bits, and yosys/Vivado can place it
    # in the DSP48's P register.
    return _reg(m, (a * b)[:LANE_BITS].as_signed(), "mul_p")


def _clip_hw(m: Module, a: Value, b: Value) -> Value:
    lo = b[:16].as_signed()
    hi = b[16:32].as_signed()
    low_clamped = Mux(a < lo, lo, a)
    return Mux(low_clamped > hi, hi, low_clamped)


def _mov_hw(m: Module, a: Value, b: Value) -> Value:
    # The operand as is: the tensor ALU reads only src for MOV (AluTiming.reads_dst).
    return b


def _clip_imm_operand(imm: Value, imm_bits: int) -> Value:
    """CLIP's immediate: two signed halves ``lo | hi << imm_bits//2``, each sign-extended
    to 16 bits into ``lo | hi << 16`` (hardware image of ``_clip_imm_to_operand``)."""
    if not 2 <= imm_bits <= 2 * _intrinsics.CLIP_HALF_BITS:
        # Wider halves would not fit CLIP's 16-bit lanes (clip_operand refuses them).
        raise RegistryError(f"CLIP's immediate decoder supports imm_bits 2..32, not {imm_bits}")
    half = imm_bits // 2
    lo = imm[:half].as_signed()
    hi = imm[half:2 * half].as_signed()
    return Cat(_sext(lo, 16), _sext(hi, 16)).as_signed()


def _requant_hw(m: Module, a: Value, b: Value) -> Value:
    """REQUANT, bit-exact with :func:`tessera.isa.requant.requantize_packed`.

    ``rne_shift_right(round24(round24(a) * M), shift)`` saturated to int32 with
    ``b = M | shift << 24``. Magnitudes are handled in floating-point form
    (24-bit mantissa, exponent kept aside): rounding to 24 significant bits
    commutes with multiplying by a power of two, so the multiplier is only
    24 x 24 bits (two DSP48E1s) instead of 32 x 24.

    Stages (4 combinational slots around 3 registers):

    * t: |a| and its rounding to 24 significant bits -> mantissa m1 < 2**24,
      exponent e1 (0..8).
    * t+1: m1 * M (< 2**48).
    * t+2: rounding of the product to 24 significant bits -> m2 < 2**24,
      total exponent E (0..34); net = shift - E.
    * t+3: RNE right shift of m2 by net (or left shift by -net), sign, int32
      saturation; combinational from the last register, like the one-cycle
      ops, so the ALU's own output register follows it.
    """
    mant_bits = _rq.MANTISSA_BITS
    # --- cycle t: magnitude and first rounding
    neg = a < 0
    mag = Mux(neg, -a, a)[:LANE_BITS]  # unsigned; INT32_MIN -> 2**31
    drop1 = _bits_above(m, mag, mant_bits, "rq_drop1")  # 0..8
    m1, e1 = _renormalize(_rne_shift_right(mag, drop1)[:mant_bits + 1], drop1, mant_bits)
    mant = b[:mant_bits]
    shift = b[mant_bits:LANE_BITS]
    s1_neg = _reg(m, neg, "rq_s1_neg")
    s1_m1 = _reg(m, m1, "rq_s1_m1")
    s1_e1 = _reg(m, e1, "rq_s1_e1")
    s1_mant = _reg(m, mant, "rq_s1_M")
    s1_shift = _reg(m, shift, "rq_s1_shift")
    # --- cycle t+1: the multiply; m1 < 2**24 and M < 2**24 so the product < 2**48
    prod_bits = 2 * mant_bits
    s2_prod = _reg(m, (s1_m1 * s1_mant)[:prod_bits], "rq_s2_prod")
    s2_neg = _reg(m, s1_neg, "rq_s2_neg")
    s2_e1 = _reg(m, s1_e1, "rq_s2_e1")
    s2_shift = _reg(m, s1_shift, "rq_s2_shift")
    # --- cycle t+2: second rounding and the net shift
    drop2 = _bits_above(m, s2_prod, mant_bits, "rq_drop2")  # 0..24
    m2, exp = _renormalize(_rne_shift_right(s2_prod, drop2)[:mant_bits + 1],
                           s2_e1 + drop2, mant_bits)  # exp: 0..34
    net = s2_shift - exp  # -34..255 (signed)
    s3_m2 = _reg(m, m2, "rq_s3_m2")
    s3_net = _reg(m, net, "rq_s3_net", signed(10))
    s3_neg = _reg(m, s2_neg, "rq_s3_neg")
    # --- cycle t+3: final shift, sign and saturation
    # m2 < 2**24, so right shifts of 25 or more give 0: clamping at 31 is exact.
    right_amt = Mux(s3_net > 31, 31, s3_net[:5])
    right = _rne_shift_right(s3_m2, right_amt)
    # Left shifts: a shift L = E - shift >= 9 needs E >= 9, which needs drop2 > 0
    # (E = e1 <= 8 otherwise), and then m2 >= 2**23, so m2 << 9 >= 2**32
    # saturates whatever the sign. Clamping L at 9 is therefore exact, and keeps
    # the shifter at 33 bits instead of 56.
    neg_net = -s3_net
    left_amt = Mux(neg_net > 9, 9, neg_net[:4])
    left = (s3_m2 << left_amt)[:mant_bits + 9]
    mag_y = Mux(s3_net >= 0, right, left)
    return _sat_signed32(mag_y, s3_neg)


def _is(semantics: Callable) -> Callable[[Callable], bool]:
    return lambda registered: registered is semantics


#: name -> (is the built-in semantics?, latency, hook). A built-in gets its hook only
#: while its registered semantics and latency are still the built-in ones, so a user's
#: redefinition of e.g. MIN is never paired with the wrong hardware.
_BUILTIN_HARDWARE: dict[str, tuple[Callable[[Callable], bool], int, AluHardware]] = {
    "MIN": (_is(np.minimum), 3, AluHardware(_min_hw)),
    "MAX": (_is(np.maximum), 3, AluHardware(_max_hw)),
    "ADD": (_is(np.add), 3, AluHardware(_add_hw)),
    "SUB": (_is(np.subtract), 3, AluHardware(_sub_hw)),
    "SHR": (_is(_intrinsics._shr), 3, AluHardware(_shr_hw)),
    "MUL": (_is(np.multiply), 4, AluHardware(_mul_hw)),
    "CLIP": (_is(_intrinsics._clip), 3, AluHardware(_clip_hw, _clip_imm_operand)),
    "MOV": (_is(_intrinsics._mov), 3, AluHardware(_mov_hw)),
    "REQUANT": (_is(_rq.requantize_packed), 6, AluHardware(_requant_hw)),
}


def attach_builtin_hardware() -> None:
    """Fill the ``hardware`` slot of the built-in ALU ops in ``ALU_OPS``.

    Idempotent. An op is left alone when it already has hardware, or when a
    user re-registered the name with other semantics or another latency.
    """
    for name, (is_builtin, latency, hw) in _BUILTIN_HARDWARE.items():
        op = ALU_OPS.by_name(name, default=None)
        if op is None or op.hardware is not None:
            continue
        if not is_builtin(op.semantics) or op.timing.latency != latency:
            continue
        ALU_OPS.register(dataclasses.replace(op, hardware=hw), replace=True)


# ------------------------------------------------------------------ simulation checks
def _wrap32(v: int) -> int:
    return ((int(v) + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def _run_pipelined(build: Callable[..., Value], pairs: Sequence[tuple[int, int]],
                   cycles_after: int, table: TableMemory | None = None) -> list[int]:
    """Simulate ``build`` (given ``table`` too, if any) with one (a, b) pair per cycle;
    return the int32 output of every cycle (``len(pairs) + cycles_after`` values)."""
    m = Module()
    # Declared explicitly so that a purely combinational hook still has a clock.
    m.domains.sync = ClockDomain()
    a = Signal(signed(LANE_BITS), name="a")
    b = Signal(signed(LANE_BITS), name="b")
    extra = ()
    if table is not None:
        m.submodules.table = table
        extra = (table,)
    out = build(m, a, b, *extra)
    if not isinstance(out, Value):
        out = Value.cast(out)
    if len(out) < LANE_BITS:
        raise AssertionError(f"the hook returned {len(out)} bits; it must return at least "
                             f"{LANE_BITS}")
    y = Signal(signed(LANE_BITS), name="y")
    m.d.comb += y.eq(out[:LANE_BITS].as_signed())
    seen: list[int] = []

    async def bench(ctx):
        for i in range(len(pairs) + cycles_after):
            if i < len(pairs):
                ctx.set(a, pairs[i][0])
                ctx.set(b, pairs[i][1])
            seen.append(ctx.get(y))
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return seen


def _as_pairs(samples: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    pairs = []
    for i, (a, b) in enumerate(samples):
        a, b = int(a), int(b)
        for name, v in (("a", a), ("b", b)):
            if not INT32_MIN <= v <= INT32_MAX:
                raise ValueError(f"sample {i}: {name} = {v} is not an int32")
        pairs.append((a, b))
    return pairs


def _table_of(op: Intrinsic, table, row_entries: int) -> TableMemory | None:
    """The :class:`TableMemory` holding ``table`` for a hook of an op that reads one."""
    if not op.reads_table:
        if table is not None:
            raise ValueError(f"ALU op {op.name} does not read the table memory: pass no table")
        return None
    if table is None:
        raise ValueError(f"ALU op {op.name} reads the table memory: pass table=")
    values = np.asarray(table).reshape(-1)
    if values.min(initial=0) < -128 or values.max(initial=0) > 127:
        raise ValueError("table entries must be int8 values")
    return TableMemory(values.size, min(row_entries, values.size), values.tolist())


def check_hardware(op: Intrinsic, samples: Iterable[tuple[int, int]], *,
                   table=None, row_entries: int = 16) -> None:
    """Check the hook of ``op`` against ``op.apply`` in Amaranth's simulator.

    The hook runs alone, fully pipelined: one ``(a, b)`` pair per cycle, the
    result of pair *i* read ``latency - 3`` cycles later.

    Args:
        op: a registered (or not) Intrinsic with ``hardware=AluHardware(...)``.
        samples: ``(a, b)`` int32 pairs.
        table: for an op that ``reads_table``, the table memory's int8 entries (a
            power of two of them), held by a :class:`TableMemory` of ``row_entries``
            entries a word (the lanes of a config) and given to ``op.apply`` as
            ``table=``.

    Raises:
        AssertionError: at the first mismatch (with a, b, expected, got; and a
            hint when the outputs match another number of pipeline stages).
        RegistryError: ``op`` has no hardware hook.
        ValueError: a table missing for an op that reads one, or given to one that
            does not.
    """
    hw = hardware_of(op)
    stages = hook_stages(op)
    memory = _table_of(op, table, row_entries)
    pairs = _as_pairs(samples)
    if not pairs:
        return
    a_arr = np.array([p[0] for p in pairs], dtype=np.int64)
    b_arr = np.array([p[1] for p in pairs], dtype=np.int64)
    flat = None if table is None else np.asarray(table, dtype=np.int64).reshape(-1)
    expected = [int(v) for v in op.apply(a_arr, b_arr, LANE_BITS, table=flat)]
    slack = 3  # extra cycles, to recognise a hook with too many stages
    seen = _run_pipelined(hw.build, pairs, stages + slack, memory)
    for i, want in enumerate(expected):
        got = seen[i + stages]
        if got != want:
            hint = ""
            for d in range(0, stages + slack + 1):
                if d != stages and seen[d:d + len(expected)] == expected:
                    hint = (f"; the outputs match with {d} pipeline stage(s), but latency "
                            f"{op.timing.latency} needs {stages}")
                    break
            a, b = pairs[i]
            raise AssertionError(
                f"{op.name} hardware mismatch at sample {i}: a={a}, b={b} "
                f"(0x{b & 0xFFFFFFFF:08x}): expected {want}, hardware gave {got}{hint}")


def check_imm_operand(op: Intrinsic, imm_bits: int, imms: Iterable[int]) -> None:
    """Check the hardware immediate decoder of ``op`` against ``op.imm_to_operand``.

    Args:
        op: an Intrinsic with an :class:`AluHardware`.
        imm_bits: immediate width (a signed field).
        imms: immediates, each in the signed range of ``imm_bits``.

    Raises:
        AssertionError: at the first mismatch (expected = ``imm_to_operand``
            wrapped to int32).
    """
    hw = hardware_of(op)
    values = [int(v) for v in imms]
    for v in values:
        if not -(1 << (imm_bits - 1)) <= v < 1 << (imm_bits - 1):
            raise ValueError(f"immediate {v} does not fit {imm_bits} signed bits")
    m = Module()
    imm = Signal(signed(imm_bits), name="imm")
    y = Signal(signed(LANE_BITS), name="operand")
    m.d.comb += y.eq(hw.operand_of_imm(imm, imm_bits))
    seen: list[int] = []

    async def bench(ctx):
        for v in values:
            ctx.set(imm, v)
            seen.append(ctx.get(y))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    for v, got in zip(values, seen):
        want = _wrap32(op.imm_to_operand(v, imm_bits))
        if got != want:
            raise AssertionError(f"{op.name} immediate decoder mismatch at imm={v} "
                                 f"(imm_bits={imm_bits}): expected {want}, hardware gave {got}")


attach_builtin_hardware()
