"""A new tensor-ALU intrinsic in one user module: LEAKY, an int8 leaky ReLU.

docs/extending.md walks through this file. ``register()`` adds the op to Tessera's
intrinsic registry, and from then on

* the assembler and disassembler know ``ALU.LEAKY``; the encoder puts its opcode in the
  ALU instruction's ``alu_op`` field (the registry owns the opcode space);
* the simulator runs its numpy semantics with its timing;
* the RTL instantiates its Amaranth hook in every lane of the tensor ALU;
* ``tessera.compile`` lowers every quantized activation it reproduces exactly (a QDQ
  LeakyRelu that keeps its input's quantization, with a slope in 1/256ths) into the
  epilogue of the convolution before it, instead of a table lookup or the CPU.

No Tessera file is edited. ``unregister()`` removes the op; the compiler then falls back
to what it used before (the LUT plug-in's table, or the CPU on a config without it).

The op, with ``b`` packing the zero point ``z`` (bits 0-7) and the slope ``m`` (bits
8-31, signed, in 1/256ths)::

    LEAKY(a, b) = a                                   if a >= z
                  z + rne((a - z) * m / 256)          otherwise

``rne`` rounds half to even, as onnxruntime's float32 ``QuantizeLinear`` does, so the
op agrees with onnxruntime wherever ``(a - z) * alpha`` is exact in float32.
"""
from __future__ import annotations

import numpy as np
from amaranth.hdl import Module, Mux, Signal, Value, signed

from tessera.compiler import Apply, Clip, Pattern, PatternContext
from tessera.compiler.accel.patterns import BYTES
from tessera.hw.alu_ops import AluHardware
from tessera.isa import ALU_OPS, AluTiming, Intrinsic, register_alu_op

#: Fraction bits of the slope.
SLOPE_BITS = 8


def pack(zero_point: int, slope: int) -> int:
    """The operand of LEAKY: zero point in bits 0-7, slope (1/256ths) above."""
    return (zero_point & 0xFF) | (slope << SLOPE_BITS)


def leaky(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The semantics (int64 lanes holding int32 values; Tessera wraps the result)."""
    z = ((b & 0xFF) ^ 0x80) - 0x80
    m = b >> SLOPE_BITS
    t = (a - z) * m
    half = 1 << (SLOPE_BITS - 1)
    q = (t + half) >> SLOPE_BITS
    tie = (t & ((1 << SLOPE_BITS) - 1)) == half
    q = np.where(tie & (q & 1 == 1), q - 1, q)   # a tie rounds to the even neighbour
    return np.where(a >= z, a, z + q)


def leaky_hardware(m: Module, a: Value, b: Value) -> Value:
    """One register stage (latency 4 = the fast ops' 3 + 1): the product is registered,
    so synthesis can put it in a DSP48's P register."""
    z = b[:8].as_signed()
    slope = b[SLOPE_BITS:].as_signed()
    keep = Signal(name="leaky_keep")
    a_reg = Signal(signed(32), name="leaky_a")
    z_reg = Signal(signed(8), name="leaky_z")
    product = Signal(signed(58), name="leaky_t")
    m.d.sync += [keep.eq(a >= z), a_reg.eq(a), z_reg.eq(z), product.eq((a - z) * slope)]
    low = product[:SLOPE_BITS]
    q = (product >> SLOPE_BITS) + low[-1]               # + half, carried by bit 7
    tie = low == (1 << (SLOPE_BITS - 1))
    q_even = Mux(tie & q[0], q - 1, q)
    return Mux(keep, a_reg, (z_reg + q_even)[:32])


def _leaky_lookup(ctx: PatternContext):
    """A QLookup LEAKY reproduces exactly: ``table[v] == v`` from a zero point up, and a
    slope in 1/256ths below it that gives every entry (checked on all 256 inputs)."""
    table = ctx.lookup_table().astype(np.int64)
    same = table == BYTES
    z = int(BYTES[same].min()) if same.any() else 128
    if z > 127 or not np.array_equal(same, BYTES >= z):
        return None
    below = BYTES < z
    if not below.any():
        return None
    alpha = np.sum((table[below] - z) * (BYTES[below] - z)) / np.sum((BYTES[below] - z) ** 2)
    nominal = round(alpha * (1 << SLOPE_BITS))
    for slope in (nominal, nominal - 1, nominal + 1):
        operand = pack(z, slope)
        if np.array_equal(leaky(BYTES, np.full(256, operand)), table):
            return (Clip(-128, 127), Apply("LEAKY", value=operand,
                                           out_range=(int(table.min()), int(table.max()))))
    return None


def make_op(opcode: int) -> Intrinsic:
    return Intrinsic(
        "LEAKY", opcode, leaky, AluTiming(ii_imm=1, ii_tensor=2, latency=4),
        doc="a >= z ? a : z + rne((a - z) * m / 256), b = z | m << 8",
        hardware=AluHardware(leaky_hardware),
        patterns=(Pattern("QLookup", _leaky_lookup,
                          doc="an int8 leaky ReLU keeping its input's quantization"),))


def register() -> Intrinsic:
    """Register LEAKY at the first free opcode (a no-op if it is registered)."""
    if "LEAKY" in ALU_OPS:
        return ALU_OPS.by_name("LEAKY")
    return register_alu_op(make_op(ALU_OPS.free_opcodes()[0]))


def unregister() -> None:
    if "LEAKY" in ALU_OPS:
        ALU_OPS.unregister("LEAKY")


__all__ = ["leaky", "leaky_hardware", "make_op", "pack", "register", "unregister"]
