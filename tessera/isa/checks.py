"""Semantic checks of single instructions (what the field ranges alone do not catch)."""
from __future__ import annotations

from ..config import HwConfig
from ..errors import MalformedInstructionError
from ..regmap import ErrorCode
from .instructions import Alu, Instruction, Load, MemType, Store, module_of
from .intrinsics import ALU_OPS, alu_op_available

#: Token flags each module may use: load has no previous module, store no next one.
_ALLOWED_FLAGS = {
    "load": ("pop_next", "push_next"),
    "compute": ("pop_prev", "pop_next", "push_prev", "push_next"),
    "store": ("pop_prev", "push_prev"),
}


def check_instruction(insn: Instruction, config: HwConfig, index: int | None = None) -> None:
    """Raise :class:`MalformedInstructionError` if ``insn`` cannot execute on ``config``."""

    def fail(msg: str, code: ErrorCode | None = None) -> None:
        raise MalformedInstructionError(msg, index=index, where=insn.label, code=code)

    if isinstance(insn, Load) and insn.mem == MemType.OUT:
        fail("LOAD cannot write the output buffer (it mirrors the accumulator): "
             "load into acc or acc8 instead", ErrorCode.MEM_TYPE)
    if isinstance(insn, Load) and insn.mem == MemType.TBL and not config.table_entries:
        fail(f"config {config.name!r} has no ALU table memory (table_entries = 0): "
             "LOAD tbl cannot run on it", ErrorCode.MEM_TYPE)
    if isinstance(insn, Store):
        if insn.mem != MemType.OUT:
            fail(f"STORE reads the output buffer only: mem must be out, not {insn.mem.label}",
                 ErrorCode.MEM_TYPE)
        pads = {k: getattr(insn, k) for k in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1",
                                                 "pad_value")}
        nonzero = {k: v for k, v in pads.items() if v}
        if nonzero:
            fail(f"STORE has no zero padding: {', '.join(f'{k} must be 0, not {v}' for k, v in nonzero.items())}")
    module = module_of(insn)
    for flag in ("pop_prev", "pop_next", "push_prev", "push_next"):
        if getattr(insn, flag) and flag not in _ALLOWED_FLAGS[module]:
            fail(f"{flag} is not allowed on a {module}-module instruction "
                 f"(allowed: {', '.join(_ALLOWED_FLAGS[module])})")
    if isinstance(insn, Alu) and not insn.reset and ALU_OPS.get(insn.alu_op) is None:
        fail(f"alu_op {insn.alu_op} is not a registered ALU op "
             f"(registered: {', '.join(f'{o.name}={o.opcode}' for o in ALU_OPS)})", ErrorCode.ALU_OP)
    if isinstance(insn, Alu) and not insn.reset and not alu_op_available(
            ALU_OPS.get(insn.alu_op), config):
        fail(f"ALU op {ALU_OPS.get(insn.alu_op).name} reads the ALU table memory, which "
             f"config {config.name!r} leaves out (table_entries = 0)", ErrorCode.ALU_OP)
    if hasattr(insn, "uop_end") and insn.uop_end < insn.uop_begin:
        fail(f"uop_end must be at least uop_begin ({insn.uop_begin}), not {insn.uop_end}")
