"""LUT: an int8 lookup-table ALU op, the activation unit of the accelerator.

``LUT`` maps every lane through a 256-entry table held in the tensor ALU's table memory
(``HwConfig.table_entries`` int8 entries, loaded by ``LOAD tbl``; see docs/timing.md)::

    y = table[(b + byte(clamp(a, -128, 127))) mod table_entries]      (sign-extended int8)

``a`` is the accumulator lane holding the value to look up (the requantized output of a
conv's epilogue, say), saturated to int8 by the op itself, so the epilogue needs no clamp
before it (the store would saturate a result without a lookup alike); ``b`` (the immediate, or a
parameter row: one table per channel) is the first entry of the table, so several
tables stay resident and one segment can use more than one activation. onnxruntime runs
quantized activations as exactly such tables (QLinearSigmoid, QLinearLeakyRelu), so a
table reproduces any unary int8 function of a QDQ model bit for bit.

This package is the ISA part (numpy only, loaded by the simulator); the Amaranth hook is
in :mod:`.hardware`, the compiler patterns in :mod:`.rules`, both named here by reference
so registering the op imports neither. A config with ``table_entries = 0`` leaves the
op out: the compiler then falls back to what it used before (the CPU, or the ReLU-sum
approximation when asked).
"""
from __future__ import annotations

import numpy as np

from tessera.isa import ALU_OPS, AluTiming, Intrinsic, register_alu_op

__all__ = ["ENTRIES", "LUT", "register", "table_index"]

#: Entries of one table: every int8 value.
ENTRIES = 256
#: The top opcode, leaving the low free opcodes to users' own intrinsics.
OPCODE = 15


def table_index(a: np.ndarray, b: np.ndarray, entries: int) -> np.ndarray:
    """The table-memory entry each lane reads: ``(b + byte of a saturated to int8) mod
    entries``."""
    return (b + (np.clip(a, -128, 127) & (ENTRIES - 1))) & (entries - 1)


def _lookup(a: np.ndarray, b: np.ndarray, table: np.ndarray) -> np.ndarray:
    return table[table_index(a, b, table.size)]


#: One more cycle than the fast ops: the table memory's synchronous read.
LUT = Intrinsic(
    "LUT", OPCODE, _lookup, AluTiming(ii_imm=1, ii_tensor=2, latency=4), reads_table=True,
    doc="table[(b + byte(clamp(a, -128, 127))) mod table_entries]: an int8 lookup in the "
        "ALU table memory; b (immediate or per-channel row) is the table's first entry",
    hardware="tessera.plugins.lut.hardware:LUT_HARDWARE",
    patterns="tessera.plugins.lut.rules:PATTERNS")


def register() -> None:
    """Register LUT (the ``tessera.intrinsics`` entry point); a no-op when present."""
    if "LUT" not in ALU_OPS:
        register_alu_op(LUT)
