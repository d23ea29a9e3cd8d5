"""Binary layouts of instructions and uops, computed from an :class:`HwConfig`.

This module is the single source of truth for field names, widths and bit
positions. The simulator's decoder, the assembler, the compiler's encoder and
the hardware's ``lib.data`` layouts are all built from :func:`get_isa`.

Fields are packed from bit 0 upwards in the order listed; instructions are
128-bit little-endian words, uops the smallest of 32/64 bits that fits.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Mapping

import numpy as np

from ..config import HwConfig
from ..errors import ConfigError, EncodingError, MalformedInstructionError
from ..regmap import ErrorCode
from .intrinsics import ALU_OP_BITS
from .instructions import (DEP_FLAGS, INSTRUCTION_CLASSES, Instruction, Load, MemType, Opcode, Store,
                           Uop)

INSN_BITS = 128
INSN_BYTES = INSN_BITS // 8
OPCODE_BITS = 3
MEM_BITS = 3
#: DRAM addresses count elements of the memory type.
DRAM_ADDR_BITS = 32
#: y_size, x_size and x_stride of LOAD/STORE.
DMA_SIZE_BITS = 16
#: Each of the four padding amounts.
PAD_BITS = 4
#: The LOAD's ``pad_value``, the fill of the pads (signed, sign-extended to each lane):
#: an 8-bit quantization zero point, whatever the buffers' widths.
PAD_VALUE_BITS = 8
#: The ALU immediate takes the bits left in the word, at most this many.
IMM_MAX_BITS = 32
#: Below this the immediate is too narrow to be useful: the config is rejected.
IMM_MIN_BITS = 8


@dataclass(frozen=True)
class Field:
    """One bit field: ``width`` bits from bit ``offset``; ``signed`` is two's complement."""

    name: str
    offset: int
    width: int
    signed: bool = False

    @property
    def lo(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def hi(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1

    @property
    def mask(self) -> int:
        return (1 << self.width) - 1

    def extract(self, word: int) -> int:
        value = (word >> self.offset) & self.mask
        if self.signed and value >> (self.width - 1):
            value -= 1 << self.width
        return value


@dataclass(frozen=True)
class Layout:
    """An ordered set of fields packed from bit 0."""

    name: str
    fields: tuple[Field, ...]
    bits: int

    @classmethod
    def pack(cls, name: str, spec: Iterable[tuple[str, int] | tuple[str, int, bool]],
             bits: int) -> "Layout":
        fields, offset = [], 0
        for entry in spec:
            fname, width, *signed = entry
            fields.append(Field(fname, offset, width, bool(signed and signed[0])))
            offset += width
        if offset > bits:
            raise ConfigError(f"{name} needs {offset} bits but the word has {bits}; "
                              "reduce buffer depths or loop_bits")
        return cls(name, tuple(fields), bits)

    @property
    def used_bits(self) -> int:
        return sum(f.width for f in self.fields)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def encode(self, values: Mapping[str, int], *, index: int | None = None,
               where: str | None = None) -> int:
        """Pack ``values`` (every field but missing ones default to 0), checking ranges."""
        word = 0
        for f in self.fields:
            value = int(values.get(f.name, 0))
            if not f.lo <= value <= f.hi:
                raise EncodingError(f"{f.name} must be in [{f.lo}, {f.hi}], not {value}",
                                    field=f.name, index=index, where=where or self.name)
            word |= (value & f.mask) << f.offset
        return word

    def decode(self, word: int) -> dict[str, int]:
        return {f.name: f.extract(word) for f in self.fields}


class Isa:
    """Every layout of one configuration, plus encode/decode of instructions and uops."""

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        c = config
        head = [("opcode", OPCODE_BITS)] + [(flag, 1) for flag in DEP_FLAGS]
        # Every buffer a LOAD can write must be addressable, the table memory's rows too.
        sram_bits = max(c.uop_index_bits, c.inp_index_bits, c.wgt_index_bits, c.acc_index_bits,
                        c.table_index_bits)
        loop = [("reset", 1), ("overlap", 1), ("uop_begin", c.uop_index_bits), ("uop_end", c.uop_index_bits + 1),
                ("iter_out", c.loop_bits), ("iter_in", c.loop_bits),
                ("dst_factor_out", c.acc_index_bits), ("dst_factor_in", c.acc_index_bits)]
        mem = Layout.pack("LOAD/STORE", head + [
            ("mem", MEM_BITS), ("sram_base", sram_bits), ("dram_base", DRAM_ADDR_BITS),
            ("y_size", DMA_SIZE_BITS), ("x_size", DMA_SIZE_BITS), ("x_stride", DMA_SIZE_BITS),
            ("y_pad_0", PAD_BITS), ("y_pad_1", PAD_BITS), ("x_pad_0", PAD_BITS),
            ("x_pad_1", PAD_BITS), ("pad_value", PAD_VALUE_BITS, True)], INSN_BITS)
        gemm = Layout.pack("GEMM", head + loop + [
            ("src_factor_out", c.inp_index_bits), ("src_factor_in", c.inp_index_bits),
            ("wgt_factor_out", c.wgt_index_bits), ("wgt_factor_in", c.wgt_index_bits)], INSN_BITS)
        alu_fixed = head + loop + [("src_factor_out", c.acc_index_bits),
                                   ("src_factor_in", c.acc_index_bits),
                                   ("alu_op", ALU_OP_BITS), ("use_imm", 1)]
        imm_bits = min(IMM_MAX_BITS, INSN_BITS - sum(w for _, w in alu_fixed))
        if imm_bits < IMM_MIN_BITS:
            raise ConfigError(f"the ALU immediate would be only {imm_bits} bits wide with config "
                              f"{c.name!r}; reduce buffer depths or loop_bits")
        alu = Layout.pack("ALU", alu_fixed + [("imm", imm_bits, True)], INSN_BITS)
        finish = Layout.pack("FINISH", head, INSN_BITS)
        self.layouts: dict[Opcode, Layout] = {
            Opcode.LOAD: mem, Opcode.STORE: mem, Opcode.GEMM: gemm,
            Opcode.FINISH: finish, Opcode.ALU: alu}
        uop_src_bits = max(c.inp_index_bits, c.acc_index_bits)
        uop_used = c.acc_index_bits + uop_src_bits + c.wgt_index_bits
        self.uop_layout = Layout.pack("uop", [("dst", c.acc_index_bits), ("src", uop_src_bits),
                                              ("wgt", c.wgt_index_bits)],
                                      32 if uop_used <= 32 else 64)

    # -------------------------------------------------------------- sizes
    @property
    def imm_bits(self) -> int:
        return self.layouts[Opcode.ALU].field("imm").width

    @property
    def uop_bytes(self) -> int:
        return self.uop_layout.bits // 8

    def elem_bytes(self, mem: MemType) -> int:
        """Bytes of one DRAM element (= one SRAM entry) of memory type ``mem``."""
        c = self.config
        return {MemType.UOP: self.uop_bytes, MemType.INP: c.inp_entry_bytes,
                MemType.WGT: c.wgt_entry_bytes, MemType.ACC: c.acc_entry_bytes,
                MemType.ACC8: c.batch * c.block_out, MemType.OUT: c.out_entry_bytes,
                MemType.TBL: c.batch * c.block_out}[MemType(mem)]

    def dram_span(self, insn: Load | Store) -> tuple[int, int] | None:
        """The DRAM bytes ``[lo, hi)`` a LOAD or STORE reads or writes: ``y_size`` rows of
        ``x_size`` elements, ``x_stride`` elements apart from ``dram_base``. ``None`` when it
        moves nothing (``x_size`` or ``y_size`` 0). The simulator's bounds check and the
        runtime's DMA firewall both use it."""
        if insn.x_size == 0 or insn.y_size == 0:
            return None
        eb = self.elem_bytes(insn.mem)
        last_row = insn.dram_base + (insn.y_size - 1) * insn.x_stride
        return insn.dram_base * eb, (last_row + insn.x_size) * eb

    def depth(self, mem: MemType) -> int:
        """Entries of the on-chip buffer that memory type ``mem`` lands in."""
        c = self.config
        return {MemType.UOP: c.uop_depth, MemType.INP: c.inp_depth, MemType.WGT: c.wgt_depth,
                MemType.ACC: c.acc_depth, MemType.ACC8: c.acc_depth,
                MemType.OUT: c.out_depth, MemType.TBL: c.table_rows}[MemType(mem)]

    # ------------------------------------------------------- instructions
    def encode(self, insn: Instruction, *, index: int | None = None) -> int:
        """The 128-bit word of ``insn``; range errors name the field and ``index``."""
        values = {f.name: getattr(insn, f.name) for f in dataclasses.fields(insn)}
        values["opcode"] = int(insn.opcode)
        return self.layouts[insn.opcode].encode(values, index=index, where=insn.label)

    def decode(self, word: int, *, index: int | None = None) -> Instruction:
        """The instruction of a 128-bit word; reserved opcodes or memory types raise."""
        if not 0 <= word < 1 << INSN_BITS:
            raise EncodingError(f"instruction word must be {INSN_BITS} bits, not {word:#x}",
                                index=index)
        code = word & ((1 << OPCODE_BITS) - 1)
        try:
            opcode = Opcode(code)
        except ValueError:
            raise MalformedInstructionError(
                f"opcode {code} is reserved (known: "
                f"{', '.join(f'{o.name}={o.value}' for o in Opcode)})", index=index,
                code=ErrorCode.OPCODE) from None
        layout = self.layouts[opcode]
        values = layout.decode(word)
        unused = word >> layout.used_bits
        if unused:
            raise MalformedInstructionError(
                f"bits {layout.used_bits}..{INSN_BITS - 1} are unused by {opcode.name} "
                f"and must be zero, not {unused:#x}", index=index)
        del values["opcode"]
        if "mem" in values:
            try:
                values["mem"] = MemType(values["mem"])
            except ValueError:
                raise MalformedInstructionError(
                    f"mem must be one of {[m.value for m in MemType]}, not {values['mem']} "
                    "(reserved memory type)", index=index, where=opcode.name,
                    code=ErrorCode.MEM_TYPE) from None
        cls = INSTRUCTION_CLASSES[opcode]
        bool_fields = {f.name for f in dataclasses.fields(cls) if f.type in ("bool", bool)}
        return cls(**{k: (bool(v) if k in bool_fields else v) for k, v in values.items()})

    def encode_program(self, insns: Iterable[Instruction]) -> bytes:
        """The instruction stream as little-endian bytes, 16 per instruction."""
        return b"".join(self.encode(insn, index=i).to_bytes(INSN_BYTES, "little")
                        for i, insn in enumerate(insns))

    def decode_program(self, data: bytes) -> list[Instruction]:
        if len(data) % INSN_BYTES:
            raise EncodingError(f"instruction stream length {len(data)} is not a multiple "
                                f"of {INSN_BYTES} bytes")
        return [self.decode(int.from_bytes(data[i:i + INSN_BYTES], "little"), index=i // INSN_BYTES)
                for i in range(0, len(data), INSN_BYTES)]

    # ---------------------------------------------------------------- uops
    def encode_uop(self, uop: Uop, *, index: int | None = None) -> int:
        return self.uop_layout.encode(dataclasses.asdict(uop), index=index, where="uop")

    def decode_uop(self, word: int) -> Uop:
        return Uop(**self.uop_layout.decode(word))

    def encode_uops(self, uops: Iterable[Uop]) -> np.ndarray:
        """Uops as a uint8 array ready for a DRAM segment."""
        dtype = np.dtype(f"<u{self.uop_bytes}")
        words = np.array([self.encode_uop(u, index=i) for i, u in enumerate(uops)], dtype=dtype)
        return words.view(np.uint8)

    def decode_uop_fields(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised (dst, src, wgt) index arrays from an array of uop words."""
        w = words.astype(np.int64)
        return tuple((w >> f.offset) & f.mask for f in self.uop_layout.fields)  # type: ignore

    # ---------------------------------------------------------------- table
    def field_table(self) -> str:
        """The encoding table: every layout's fields with bit ranges."""
        c = self.config
        lines = [f"Tessera ISA for config {c.name!r}: {INSN_BITS}-bit instructions, "
                 f"{self.uop_layout.bits}-bit uops, {self.imm_bits}-bit ALU immediate",
                 "opcodes: " + ", ".join(f"{o.name}={o.value}" for o in Opcode)
                 + f" ({(1 << OPCODE_BITS) - len(Opcode)} reserved)",
                 "memory types: " + ", ".join(f"{m.label}={m.value}" for m in MemType)
                 + " (" + ", ".join(f"{m.label} {self.elem_bytes(m)} B" for m in MemType) + ")"]
        seen = set()
        for layout in list(self.layouts.values()) + [self.uop_layout]:
            if layout.name in seen:
                continue
            seen.add(layout.name)
            lines.append("")
            lines.append(f"{layout.name}  ({layout.used_bits} of {layout.bits} bits used)")
            lines.append(f"  {'field':<16}{'bits':>10}{'width':>7}  range")
            for f in layout.fields:
                bits = f"{f.offset + f.width - 1}:{f.offset}" if f.width > 1 else f"{f.offset}"
                lines.append(f"  {f.name:<16}{bits:>10}{f.width:>7}  [{f.lo}, {f.hi}]")
        return "\n".join(lines)


@lru_cache(maxsize=64)
def get_isa(config: HwConfig) -> Isa:
    """The (cached) :class:`Isa` of ``config``."""
    return Isa(config)
