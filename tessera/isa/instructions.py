"""Instruction kinds, memory types and the Python form of instructions and uops.

Field names here are the field names of the binary layouts in
:mod:`tessera.isa.encoding`; encoder, decoder, assembler and simulator all go
by these names.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from .intrinsics import ALU_OPS


class Opcode(IntEnum):
    """Instruction kinds. Codes 5..7 are reserved for new kinds."""

    LOAD = 0
    STORE = 1
    GEMM = 2
    FINISH = 3
    ALU = 4


class MemType(IntEnum):
    """On-chip memories a LOAD or STORE moves data to or from.

    ``ACC8`` loads int8 data sign-extended into the accumulator (residual
    adds, biases of narrow width). ``TBL`` loads int8 entries into the tensor
    ALU's table memory (``HwConfig.table_entries``), a row of ``batch x
    block_out`` entries per element, every lane getting a copy: the tables ALU
    ops with ``reads_table`` look values up in. Code 7 is reserved.
    """

    UOP = 0
    WGT = 1
    INP = 2
    ACC = 3
    OUT = 4
    ACC8 = 5
    TBL = 6

    @property
    def label(self) -> str:
        return self.name.lower()


#: Dependency flags every instruction carries, in encoding order.
DEP_FLAGS: tuple[str, ...] = ("pop_prev", "pop_next", "push_prev", "push_next")

#: Which module executes a LOAD of each memory type (VTA's split: the load
#: module feeds the GEMM operands, compute loads its own uops and accumulators).
LOAD_MODULE: dict[MemType, str] = {
    MemType.INP: "load", MemType.WGT: "load",
    MemType.UOP: "compute", MemType.ACC: "compute", MemType.ACC8: "compute",
    MemType.TBL: "compute",
}


@dataclass(frozen=True, kw_only=True)
class Instruction:
    """Base of all instructions: the four dependency-token flags.

    ``pop_*`` waits for (and consumes) a token from the previous/next module
    before the instruction runs; ``push_*`` sends one after it completes.
    Load's next module is compute; compute's previous is load and next is
    store; store's previous is compute.
    """

    opcode: ClassVar[Opcode]
    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False

    def replace(self, **changes: object) -> "Instruction":
        return dataclasses.replace(self, **changes)

    @property
    def label(self) -> str:
        """Short description used in messages: ``LOAD inp``, ``ALU MAX``..."""
        return self.opcode.name


@dataclass(frozen=True, kw_only=True)
class _MemInsn(Instruction):
    mem: MemType = MemType.INP
    sram_base: int = 0
    dram_base: int = 0
    y_size: int = 1
    x_size: int = 1
    x_stride: int = 1
    y_pad_0: int = 0
    y_pad_1: int = 0
    x_pad_0: int = 0
    x_pad_1: int = 0
    #: The value every lane of a padded entry gets (signed, 8 bits, sign-extended to
    #: each lane); STORE: 0.
    pad_value: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mem", MemType(self.mem))

    @property
    def label(self) -> str:
        return f"{self.opcode.name} {self.mem.label}"

    @property
    def is_nop(self) -> bool:
        """``x_size == 0`` makes a LOAD/STORE a no-op that only carries flags."""
        return self.x_size == 0


@dataclass(frozen=True, kw_only=True)
class Load(_MemInsn):
    """2-D strided DMA from DRAM into an on-chip buffer, with padding.

    Reads ``y_size`` rows of ``x_size`` elements, row ``y`` starting at DRAM
    element ``dram_base + y * x_stride``, and writes them as a
    ``(y_pad_0 + y_size + y_pad_1) x (x_pad_0 + x_size + x_pad_1)`` block of
    consecutive SRAM entries from ``sram_base``. Every lane of a pad entry is
    ``pad_value`` converted like a DRAM element's lane: wrapped to the lane's
    width in DRAM (8 bits for acc8), then sign-extended to the buffer's lane
    (so an acc pad of -1 is int32 -1). A quantized input's zero point makes
    the padding equal to the real 0. DRAM addresses count elements of the
    memory type.
    """

    opcode: ClassVar[Opcode] = Opcode.LOAD


@dataclass(frozen=True, kw_only=True)
class Store(_MemInsn):
    """2-D strided DMA from the output buffer to DRAM (pads and ``pad_value`` must be zero)."""

    opcode: ClassVar[Opcode] = Opcode.STORE
    mem: MemType = MemType.OUT


@dataclass(frozen=True, kw_only=True)
class _LoopInsn(Instruction):
    """The loop nest GEMM and ALU share::

        for o in range(iter_out):
            for i in range(iter_in):
                for u in uops[uop_begin:uop_end]:
                    dst = u.dst + o * dst_factor_out + i * dst_factor_in
                    src = u.src + o * src_factor_out + i * src_factor_in

    ``overlap`` lets the instruction start while the compute module's other
    unit (the ALU for a GEMM, the GEMM core for an ALU) still runs an earlier
    instruction; the program promises that the two use different accumulator
    banks and push into different token queues (docs/timing.md, "Compute
    units").
    """

    reset: bool = False
    overlap: bool = False
    uop_begin: int = 0
    uop_end: int = 1
    iter_out: int = 1
    iter_in: int = 1
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0

    @property
    def op_count(self) -> int:
        """Tensor operations (one accumulator row each) the loop nest performs."""
        return max(0, self.uop_end - self.uop_begin) * self.iter_out * self.iter_in


@dataclass(frozen=True, kw_only=True)
class Gemm(_LoopInsn):
    """``acc[dst] += inp[src] @ wgt[w].T`` over the loop nest (``reset``: ``acc[dst] = 0``).

    ``w = u.wgt + o * wgt_factor_out + i * wgt_factor_in``.
    """

    opcode: ClassVar[Opcode] = Opcode.GEMM
    wgt_factor_out: int = 0
    wgt_factor_in: int = 0


@dataclass(frozen=True, kw_only=True)
class Alu(_LoopInsn):
    """``acc[dst] = op(acc[dst], operand)`` over the loop nest.

    The operand is ``acc[src]`` (tensor form) or the immediate (``use_imm``).
    ``alu_op`` is an opcode of the intrinsic registry. ``reset`` zeroes
    ``acc[dst]`` instead, like GEMM's reset.
    """

    opcode: ClassVar[Opcode] = Opcode.ALU
    alu_op: int = 0
    use_imm: bool = False
    imm: int = 0

    @property
    def label(self) -> str:
        op = ALU_OPS.get(self.alu_op)
        return f"ALU {op.name if op else f'op{self.alu_op}'}"


@dataclass(frozen=True, kw_only=True)
class Finish(Instruction):
    """Ends the program: the accelerator reports done when FINISH retires."""

    opcode: ClassVar[Opcode] = Opcode.FINISH


INSTRUCTION_CLASSES: dict[Opcode, type[Instruction]] = {
    Opcode.LOAD: Load, Opcode.STORE: Store, Opcode.GEMM: Gemm,
    Opcode.FINISH: Finish, Opcode.ALU: Alu,
}


@dataclass(frozen=True)
class Uop:
    """A micro-op: accumulator index, input (GEMM) or accumulator (ALU) index, weight index."""

    dst: int = 0
    src: int = 0
    wgt: int = 0


def module_of(insn: Instruction) -> str:
    """The module that executes ``insn``: ``load``, ``compute`` or ``store``."""
    if isinstance(insn, Load):
        return LOAD_MODULE[insn.mem]
    if isinstance(insn, Store):
        return "store"
    return "compute"
