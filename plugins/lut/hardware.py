"""The Amaranth hook of the LUT op, written against the public hook API of
:mod:`tessera.hw.alu_ops` only.

Per lane: ``a`` saturated to int8 (two comparisons and a mux), then the entry index
``(b + byte) mod table.entries`` (an adder of ``table.index_bits`` bits: the low bits of
``b`` plus the byte, the carry out dropped), then the lane's table read, which is the op's one register stage (latency 4 =
the tensor ALU's 3 + 1), sign-extended to the 32-bit lane.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Value

from tessera.hw.alu_ops import AluHardware, TableMemory

from . import ENTRIES

__all__ = ["LUT_HARDWARE"]

#: Bits of the looked-up value inside ``a`` (one table of ENTRIES entries).
_VALUE_BITS = ENTRIES.bit_length() - 1


def _lut_hw(m: Module, a: Value, b: Value, table: TableMemory) -> Value:
    bits = table.index_bits
    byte = Mux(a < -128, Const(0x80, 8), Mux(a > 127, Const(0x7F, 8), a[:_VALUE_BITS]))
    entry = (b[:bits] + byte[:min(_VALUE_BITS, bits)])[:bits]
    y = table.read(m, entry)
    return Cat(y, y[-1].replicate(32 - len(y))).as_signed()


#: The LUT op's hardware (``LUT.hardware`` names it by reference).
LUT_HARDWARE = AluHardware(_lut_hw)
