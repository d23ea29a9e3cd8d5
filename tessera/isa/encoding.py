"""Binary layouts of instructions and uops, computed from an :class:`HwConfig`.

This module is the single source of truth for field names, widths and bit
positions. The simulator's decoder, the assembler, the compiler's encoder and
the hardware's ``lib.data`` layouts are all built from :func:`get_isa`.

Fields are packed from bit 0 upwards in the order listed; instructions are
128-bit little-endian words, uops the smallest of 32/64 bits that fits.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict
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
#: Decoded instruction streams an :class:`Isa` keeps: a stream is decoded by the runtime's
#: launch check and again by the simulator it launches (instructions are immutable).
KEPT_DECODED = 2


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
        self._decoded: OrderedDict[bytes, tuple[Instruction, ...]] = OrderedDict()
        self._decoded_lock = threading.Lock()
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

    @functools.cached_property
    def _elem_bytes(self) -> dict[MemType, int]:
        c = self.config
        return {MemType.UOP: self.uop_bytes, MemType.INP: c.inp_entry_bytes,
                MemType.WGT: c.wgt_entry_bytes, MemType.ACC: c.acc_entry_bytes,
                MemType.ACC8: c.batch * c.block_out, MemType.OUT: c.out_entry_bytes,
                MemType.TBL: c.batch * c.block_out}

    def elem_bytes(self, mem: MemType) -> int:
        """Bytes of one DRAM element (= one SRAM entry) of memory type ``mem``."""
        return self._elem_bytes[MemType(mem)]

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
        bool_fields = _bool_fields(cls)
        return cls(**{k: (bool(v) if k in bool_fields else v) for k, v in values.items()})

    def encode_program(self, insns: Iterable[Instruction]) -> bytes:
        """The instruction stream as little-endian bytes, 16 per instruction.

        Equal to :meth:`encode` of each instruction, with the fields of all the
        instructions of one kind packed at once (numpy); the first instruction with a
        field out of range is encoded alone, which raises its :class:`EncodingError`."""
        insns = list(insns)
        words = np.zeros((len(insns), 2), dtype=np.uint64)      # low, high 64 bits
        bad = len(insns)
        for opcode, (rows, members) in _by_opcode(insns).items():
            layout = self.layouts[opcode]
            for f in layout.fields:
                values = _column(members, f.name, int(opcode))
                if values is None:                               # beyond int64
                    bad = min(bad, rows[0])
                    continue
                out = np.flatnonzero((values < f.lo) | (values > f.hi))
                if out.size:
                    bad = min(bad, rows[out[0]])
                _place(words, rows, values.astype(np.uint64) & np.uint64(f.mask), f.offset)
        if bad < len(insns):
            for i in range(bad, len(insns)):
                self.encode(insns[i], index=i)
        return words.astype("<u8").tobytes()

    def decode_program(self, data: bytes) -> list[Instruction]:
        """The instructions of a stream of 128-bit little-endian words.

        Equal to :meth:`decode` of each word, with the fields of all the words of one
        kind extracted at once (numpy); the first malformed word (reserved opcode or
        memory type, nonzero unused bits) is decoded alone, which raises its error. The
        last :data:`KEPT_DECODED` streams' instructions are kept (a new list each call)."""
        data = bytes(data)
        with self._decoded_lock:
            kept = self._decoded.get(data)
            if kept is not None:
                self._decoded.move_to_end(data)
                return list(kept)
        insns = self._decode_stream(data)
        with self._decoded_lock:
            self._decoded[data] = tuple(insns)
            if len(self._decoded) > KEPT_DECODED:
                self._decoded.popitem(last=False)
        return insns

    def _decode_stream(self, data: bytes) -> list[Instruction]:
        if len(data) % INSN_BYTES:
            raise EncodingError(f"instruction stream length {len(data)} is not a multiple "
                                f"of {INSN_BYTES} bytes")
        words = np.frombuffer(data, dtype="<u8").reshape(-1, 2).astype(np.uint64)
        codes = _extract(words, Field("opcode", 0, OPCODE_BITS))
        first_bad = self._first_malformed(words, codes)
        if first_bad is not None:
            word = int.from_bytes(data[first_bad * INSN_BYTES:(first_bad + 1) * INSN_BYTES],
                                  "little")
            self.decode(word, index=first_bad)
            raise AssertionError(f"word {first_bad} is malformed but decodes")  # unreachable
        insns: list[Instruction | None] = [None] * len(words)
        for opcode in Opcode:
            rows = np.flatnonzero(codes == opcode)
            if rows.size:
                for i, insn in zip(rows.tolist(), self._decode_kind(opcode, words[rows])):
                    insns[i] = insn
        return insns  # type: ignore[return-value]

    def _first_malformed(self, words: np.ndarray, codes: np.ndarray) -> int | None:
        """The index of the first word :meth:`decode` rejects, or None."""
        bad = ~np.isin(codes, [int(o) for o in Opcode])
        for opcode, layout in self.layouts.items():
            rows = codes == opcode
            unused = _bits_from(words, layout.used_bits) != 0
            bad |= rows & unused
            if "mem" in layout.names:
                mem = _extract(words, layout.field("mem"))
                bad |= rows & ~np.isin(mem, [int(m) for m in MemType])
        hits = np.flatnonzero(bad)
        return int(hits[0]) if hits.size else None

    def _decode_kind(self, opcode: Opcode, words: np.ndarray) -> list[Instruction]:
        """Instructions of kind ``opcode`` from their (well-formed) words."""
        cls = INSTRUCTION_CLASSES[opcode]
        bools = _bool_fields(cls)
        fields = [f for f in self.layouts[opcode].fields if f.name != "opcode"]
        columns = []
        for f in fields:
            values = _extract(words, f)
            columns.append((values != 0).tolist() if f.name in bools else
                           [MemType(v) for v in values.tolist()] if f.name == "mem" else
                           values.tolist())
        names = [f.name for f in fields]
        return [cls(**dict(zip(names, row))) for row in zip(*columns)]

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


@lru_cache(maxsize=None)
def _bool_fields(cls: type) -> frozenset[str]:
    """The fields of instruction class ``cls`` that hold flags."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.type in ("bool", bool))


def _by_opcode(insns: list[Instruction]) -> dict[Opcode, tuple[np.ndarray, list[Instruction]]]:
    """The positions and instructions of each kind in ``insns``."""
    groups: dict[Opcode, tuple[list[int], list[Instruction]]] = {}
    for i, insn in enumerate(insns):
        rows, members = groups.setdefault(insn.opcode, ([], []))
        rows.append(i)
        members.append(insn)
    return {op: (np.array(rows), members) for op, (rows, members) in groups.items()}


def _column(members: list[Instruction], name: str, opcode: int) -> np.ndarray | None:
    """Field ``name`` of every instruction as int64 (the opcode for ``"opcode"``, 0 for a
    field the instruction lacks, as :meth:`Layout.encode` takes it); None when a value
    does not fit in int64 (surely out of range)."""
    if name == "opcode":
        return np.full(len(members), opcode, dtype=np.int64)
    try:
        return np.array([int(getattr(i, name, 0)) for i in members], dtype=np.int64)
    except OverflowError:
        return None


def _place(words: np.ndarray, rows: np.ndarray, values: np.ndarray, offset: int) -> None:
    """OR masked uint64 ``values`` into bits ``offset``.. of 128-bit ``words[rows]``."""
    if offset >= 64:
        words[rows, 1] |= values << np.uint64(offset - 64)
        return
    words[rows, 0] |= values << np.uint64(offset)
    if offset:                            # the bits shifted out of the low word
        words[rows, 1] |= values >> np.uint64(64 - offset)


def _bits_from(words: np.ndarray, offset: int) -> np.ndarray:
    """Bits ``offset``..127 of 128-bit words (``words``: low, high uint64 columns) as
    uint64; only compared with zero, so the low word's part is OR-ed in."""
    if offset >= 64:
        return words[:, 1] >> np.uint64(offset - 64) if offset < 128 else \
            np.zeros(len(words), dtype=np.uint64)
    return (words[:, 0] >> np.uint64(offset)) | words[:, 1]


def _extract(words: np.ndarray, f: Field) -> np.ndarray:
    """Field ``f`` of 128-bit words as int64 (sign-extended when signed)."""
    lo, hi = words[:, 0], words[:, 1]
    if f.offset >= 64:
        raw = hi >> np.uint64(f.offset - 64)
    elif f.offset + f.width <= 64:
        raw = lo >> np.uint64(f.offset)
    else:
        raw = (lo >> np.uint64(f.offset)) | (hi << np.uint64(64 - f.offset))
    value = (raw & np.uint64(f.mask)).astype(np.int64)
    if f.signed:
        value -= (value >> (f.width - 1)) << f.width
    return value


@lru_cache(maxsize=64)
def get_isa(config: HwConfig) -> Isa:
    """The (cached) :class:`Isa` of ``config``."""
    return Isa(config)
