"""The instruction set: the single source of truth for encodings and intrinsics.

* :mod:`~tessera.isa.instructions`: instruction kinds and their Python form.
* :mod:`~tessera.isa.encoding`: bit layouts computed from an ``HwConfig``.
* :mod:`~tessera.isa.intrinsics`: the registry of ALU operations.
* :mod:`~tessera.isa.program`: the ``Program`` container and file format.
* :mod:`~tessera.isa.asm`: the assembly text form.
"""
from .checks import check_instruction
from .encoding import INSN_BITS, INSN_BYTES, Field, Isa, Layout, get_isa
from .instructions import (DEP_FLAGS, Alu, Finish, Gemm, Instruction, Load, MemType, Opcode,
                           Store, Uop, module_of)
from .intrinsics import (ALU_OPS, AluTiming, Intrinsic, IntrinsicRegistry, alu_op_available,
                         clip_imm, clip_operand, register_alu_op, resolve)
from .program import Program, Segment

__all__ = [
    "ALU_OPS", "Alu", "AluTiming", "alu_op_available", "resolve", "DEP_FLAGS", "Field", "Finish", "Gemm", "INSN_BITS",
    "INSN_BYTES", "Instruction", "Intrinsic", "IntrinsicRegistry", "Isa", "Layout", "Load",
    "MemType", "Opcode", "Program", "Segment", "Store", "Uop", "check_instruction", "clip_imm",
    "clip_operand", "get_isa", "module_of", "register_alu_op",
]
