"""The assembly text form of a whole :class:`~tessera.isa.program.Program`.

The text round-trips exactly with the binary form: for every valid program
``parse_program(format_program(p)) == p``, and ``format_program`` of a parsed
text is stable. ``tessera asm`` / ``tessera disasm``, the tests and debug
dumps use it. Example::

    ; Tessera program for config tiny: 5 instructions, 2 segments
    .config {"name": "tiny", "batch": 1, "block_in": 4, ..., "part": "xc7z020clg400-1"}
    .segment inp 0x0 16
    .data 0x0 0102030405060708090a0b0c0d0e0f10
    .segment out 0x1000 64

    LOAD.inp push_next y_size=1 x_size=4 x_stride=4         ; [0]
    GEMM pop_prev reset uop_end=1 iter_out=4 iter_in=1 dst_factor_out=1  ; [1]
    ALU.MAX push_next uop_end=1 iter_out=4 iter_in=1 dst_factor_out=1 use_imm  ; [2]
    STORE.out pop_prev dram_base=256 y_size=1 x_size=4 x_stride=1  ; [3]
    FINISH                                                  ; [4]

The ``.config`` line holds every HwConfig field (elided above).

Lines
    Blank lines are ignored; a comment runs from ``;`` or ``#`` to the end of
    the line (also after an instruction or a directive), except inside the
    ``.config`` JSON and a quoted segment name.

``.config JSON``
    The full :class:`~tessera.config.HwConfig` as one-line JSON
    (``HwConfig.to_dict``). It must come before any ``.segment`` and any
    instruction. ``parse_program(text, config=c)`` uses ``c`` instead: the
    text may then omit ``.config`` (if present, its JSON must still be
    well-formed but its content is ignored).

``.segment NAME ADDR SIZE``
    A DRAM segment: name, byte address (aligned, see
    :data:`~tessera.isa.program.SEGMENT_ALIGN`), size in bytes. It is
    zero-filled; the ``.data`` lines that follow fill it. ``NAME`` is a bare
    word, or a JSON string when it contains other characters than
    ``A-Za-z0-9_.-/:+@$%``. Segments end up in address order whatever the
    order of the directives.

``.data OFFSET HEX``
    Bytes at byte ``OFFSET`` of the last ``.segment``, as hex digit pairs
    (which may be split by spaces); a later line overwrites an earlier one
    where they overlap. ``format_program`` writes 64 bytes per line and
    leaves out 64-byte chunks that are all zero.

Instructions
    ``MNEMONIC field field=value ...``. The mnemonic is the opcode name, with
    ``.<memory type>`` for LOAD/STORE (``LOAD.inp``, ``LOAD.acc8``,
    ``STORE.out``) and ``.<ALU op name>`` for ALU (``ALU.MAX``; an opcode
    without a registered op is ``ALU.op13``). The other fields follow with
    the names of the binary layout (:mod:`tessera.isa.encoding`); a field
    whose value is zero may be left out, and is left out by the formatter
    (even where the dataclass default is nonzero: ``y_size=1`` is written,
    ``x_pad_0=0`` is not). The 1-bit flags (``pop_prev``, ``pop_next``,
    ``push_prev``, ``push_next``, ``reset``, ``overlap``, ``use_imm``) are bare words
    when set (``reset=1`` / ``reset=0`` is accepted as well); every other
    field is ``name=value``, decimal or ``0x`` hex, negative allowed where
    the field is signed (``imm``, ``pad_value``). The parser is
    case-insensitive, accepts fields in any order and checks every value
    against its field's range.
    ``format_program`` writes the instruction index as a trailing comment.

The ALU op names come from the intrinsic registry at the time of formatting
or parsing: text naming a user op needs that op registered to parse.

Every error is an :class:`~tessera.errors.AsmError` that says what is wrong,
what is allowed, and on which line.
"""
from __future__ import annotations

import dataclasses
import json
import re
from functools import lru_cache
from typing import Callable, NoReturn

import numpy as np

from ..config import HwConfig
from ..errors import AsmError, ConfigError, EncodingError, ProgramError
from .encoding import Field, Isa, get_isa
from .instructions import INSTRUCTION_CLASSES, Instruction, MemType, Opcode
from .intrinsics import ALU_OPS
from .program import Program, Segment

__all__ = ["DATA_BYTES_PER_LINE", "format_instruction", "format_program",
           "parse_instruction", "parse_program"]

#: Bytes per ``.data`` line written by :func:`format_program`.
DATA_BYTES_PER_LINE = 64
#: Column the ``; [index]`` comment of an instruction starts at (at least).
_INDEX_COMMENT_COLUMN = 56

#: Fields carried by the mnemonic suffix rather than written as operands.
_SUFFIX_FIELDS = ("mem", "alu_op")
_MEM_OPCODES = (Opcode.LOAD, Opcode.STORE)
_MEM_BY_LABEL = {m.label: m for m in MemType}
_MEM_LABELS = ", ".join(m.label for m in MemType)

_INT_RE = re.compile(r"([+-]?)(0[xX][0-9a-fA-F]+|[0-9]+)")
_HEX_RE = re.compile(r"[0-9a-fA-F]*")
_OPN_RE = re.compile(r"op([0-9]+)", re.IGNORECASE)
_DIRECTIVE_RE = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)")
#: Segment names printed without JSON quotes.
_BARE_NAME_RE = re.compile(r"[A-Za-z0-9_.\-/:+@$%]+")
_DIRECTIVES = (".config", ".segment", ".data")

Fail = Callable[[str], NoReturn]


def _mnemonic_help() -> str:
    forms = {Opcode.LOAD: "LOAD.<mem>", Opcode.STORE: "STORE.<mem>", Opcode.ALU: "ALU.<op>"}
    return ", ".join(forms.get(o, o.name) for o in Opcode)


@lru_cache(maxsize=None)
def _flag_fields(cls: type[Instruction]) -> frozenset[str]:
    """The bool fields of an instruction class (written as bare words)."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.type in ("bool", bool))


def _operand_fields(isa: Isa, opcode: Opcode) -> tuple[Field, ...]:
    """The layout fields written after the mnemonic, in layout order."""
    return tuple(f for f in isa.layouts[opcode].fields
                 if f.name != "opcode" and f.name not in _SUFFIX_FIELDS)


def _strip_comment(text: str) -> str:
    cut = min((i for i in (text.find(";"), text.find("#")) if i >= 0), default=len(text))
    return text[:cut]


def _parse_int(raw: str) -> int | None:
    """A decimal or ``0x`` hex integer with an optional sign; ``None`` if malformed."""
    m = _INT_RE.fullmatch(raw)
    if m is None:
        return None
    sign, body = m.groups()
    value = int(body, 16) if body[:2].lower() == "0x" else int(body, 10)
    return -value if sign == "-" else value


def _alu_ops_help(alu_op: Field) -> str:
    names = ", ".join(ALU_OPS.names()) or "none"
    return f"registered: {names}; or opN with N in [{alu_op.lo}, {alu_op.hi}]"


# ------------------------------------------------------------- instructions
def format_instruction(insn: Instruction, isa: Isa) -> str:
    """One instruction as a line of assembly (no comment, no newline).

    Fields equal to zero are left out; set flags are bare words. The values
    are not range-checked here (a broken instruction can still be dumped);
    :func:`parse_instruction` checks them.
    """
    opcode = insn.opcode
    mnemonic = opcode.name
    if opcode in _MEM_OPCODES:
        mnemonic += "." + MemType(insn.mem).label
    elif opcode == Opcode.ALU:
        op = ALU_OPS.get(insn.alu_op)  # type: ignore[attr-defined]
        mnemonic += "." + (op.name if op is not None else f"op{int(insn.alu_op)}")  # type: ignore[attr-defined]
    flags = _flag_fields(type(insn))
    parts = [mnemonic]
    for f in _operand_fields(isa, opcode):
        value = int(getattr(insn, f.name))
        if value == 0:
            continue
        parts.append(f.name if f.name in flags and value == 1 else f"{f.name}={value}")
    return " ".join(parts)


def parse_instruction(line: str, isa: Isa, *, line_no: int | None = None) -> Instruction:
    """The instruction of one line of assembly (a trailing comment is ignored).

    Fields left out are zero. Raises :class:`AsmError` (with ``line_no``) for an
    unknown mnemonic, memory type, ALU op or field, a duplicate field, a missing
    or malformed value, or a value outside its field's range.
    """
    def fail(message: str) -> NoReturn:
        raise AsmError(message, line=line_no)

    text = _strip_comment(line).strip()
    if not text:
        fail(f"expected an instruction ({_mnemonic_help()}), found an empty line")
    mnemonic, *tokens = text.split()
    return _parse_instruction(mnemonic, tokens, isa, fail, line_no)


def _parse_instruction(mnemonic: str, tokens: list[str], isa: Isa, fail: Fail,
                       line_no: int | None) -> Instruction:
    head, dot, suffix = mnemonic.partition(".")
    opcode = Opcode.__members__.get(head.upper())
    if opcode is None:
        fail(f"unknown mnemonic {mnemonic!r} (mnemonics: {_mnemonic_help()})")
    layout = isa.layouts[opcode]
    cls = INSTRUCTION_CLASSES[opcode]
    kwargs: dict[str, object] = {}
    if opcode in _MEM_OPCODES:
        if not dot:
            fail(f"{opcode.name} needs a memory type: {opcode.name}.<mem> with mem one of "
                 f"{_MEM_LABELS}")
        mem = _MEM_BY_LABEL.get(suffix.lower())
        if mem is None:
            fail(f"unknown memory type {suffix!r} for {opcode.name} (memory types: {_MEM_LABELS})")
        kwargs["mem"] = mem
    elif opcode == Opcode.ALU:
        alu_field = layout.field("alu_op")
        if not dot:
            fail(f"ALU needs an op: ALU.<op> ({_alu_ops_help(alu_field)})")
        op = ALU_OPS.by_name(suffix, default=None)
        if op is not None:
            code = op.opcode
        else:
            m = _OPN_RE.fullmatch(suffix)
            if m is None or not alu_field.lo <= int(m.group(1)) <= alu_field.hi:
                fail(f"unknown ALU op {suffix!r} ({_alu_ops_help(alu_field)})")
            code = int(m.group(1))
        kwargs["alu_op"] = code
    elif dot:
        fail(f"{opcode.name} takes no '.{suffix}' suffix (mnemonics: {_mnemonic_help()})")

    fields = {f.name: f for f in _operand_fields(isa, opcode)}
    flags = _flag_fields(cls)
    values = dict.fromkeys(fields, 0)  # all zero, not the dataclass defaults
    seen: set[str] = set()

    def allowed(f: Field) -> str:
        if f.name in flags:
            return f"a flag: write {f.name} bare to set it"
        return f"a decimal or 0x-hex integer in [{f.lo}, {f.hi}]"

    for token in tokens:
        name, eq, raw = token.partition("=")
        key = name.lower()
        if not name:
            fail(f"bad operand {token!r} for {opcode.name}: expected field=value or a flag name")
        if key not in fields:
            fail(f"unknown field {name!r} for {opcode.name} (fields: {', '.join(fields)})")
        if key in seen:
            fail(f"duplicate field {key!r} for {opcode.name}")
        seen.add(key)
        f = fields[key]
        if not eq:
            if key in flags:
                values[key] = 1
                continue
            fail(f"field {key!r} of {opcode.name} needs a value: {key}=N with N in "
                 f"[{f.lo}, {f.hi}]")
        if not raw:
            fail(f"missing value for field {key!r} of {opcode.name} (expected {allowed(f)})")
        value = _parse_int(raw)
        if value is None:
            fail(f"bad value {raw!r} for field {key!r} of {opcode.name} (expected {allowed(f)})")
        if not f.lo <= value <= f.hi:
            fail(f"{key}={raw} is out of range for {opcode.name}: {key} must be in "
                 f"[{f.lo}, {f.hi}]")
        values[key] = value

    for key, value in values.items():
        kwargs[key] = bool(value) if key in flags else value
    insn = cls(**kwargs)  # type: ignore[arg-type]
    try:
        isa.encode(insn)
    except EncodingError as exc:
        raise AsmError(str(exc), line=line_no) from None
    return insn


# ----------------------------------------------------------------- programs
def _format_segment_name(name: str) -> str:
    return name if _BARE_NAME_RE.fullmatch(name) else json.dumps(name)


def format_program(program: Program) -> str:
    """The whole program as assembly text: header comment, ``.config``, segments
    with their nonzero data, then the instructions each with an ``; [index]``
    comment. Ends with a newline."""
    config = program.config
    isa = get_isa(config)
    name = config.name if config.name.isprintable() else json.dumps(config.name)
    lines = [f"; Tessera program for config {name}: {len(program.instructions)} instructions, "
             f"{len(program.segments)} segments",
             ".config " + json.dumps(config.to_dict())]
    for seg in program.segments:
        raw = np.ascontiguousarray(seg.data).reshape(-1).view(np.uint8)
        lines.append(f".segment {_format_segment_name(seg.name)} {seg.addr:#x} {raw.size}")
        n = DATA_BYTES_PER_LINE
        padded = np.zeros(-(-raw.size // n) * n, dtype=np.uint8)
        padded[:raw.size] = raw
        for chunk in np.flatnonzero(padded.reshape(-1, n).any(axis=1)):
            offset = int(chunk) * n
            lines.append(f".data {offset:#x} {raw[offset:offset + n].tobytes().hex()}")
    if program.instructions:
        lines.append("")
    for index, insn in enumerate(program.instructions):
        text = format_instruction(insn, isa)
        lines.append(f"{text:<{_INDEX_COMMENT_COLUMN - 2}}  ; [{index}]")
    return "\n".join(lines) + "\n"


def parse_program(text: str, *, config: HwConfig | None = None) -> Program:
    """The program of an assembly text (see the module docstring for the format).

    ``config``, if given, is the program's configuration: it replaces a missing
    ``.config`` directive and overrides a present one. Without it the text must
    have a ``.config`` before any segment or instruction. Raises
    :class:`AsmError` with the line number on any error.
    """
    state = _ProgramParser(config)
    for line_no, line in enumerate(text.splitlines(), 1):
        state.line(line, line_no)
    if state.program is None:
        raise AsmError("missing .config directive: the text must start with "
                       ".config {...} (the HwConfig as one-line JSON), or pass config=")
    return state.program


class _ProgramParser:
    def __init__(self, config: HwConfig | None) -> None:
        self.override = config
        self.program: Program | None = None
        self.have_config = False
        self.segment: Segment | None = None
        self.line_no = 0
        if config is not None:
            self.program = self._new_program(config)

    def fail(self, message: str) -> NoReturn:
        raise AsmError(message, line=self.line_no)

    def _new_program(self, config: HwConfig) -> Program:
        try:
            return Program(config)
        except ConfigError as exc:
            self.fail(f"unusable config: {exc}")

    def _need_program(self, what: str) -> Program:
        if self.program is None:
            self.fail(f"{what} before .config: put .config {{...}} (the HwConfig as one-line "
                      "JSON) first, or pass config=")
        return self.program

    def line(self, line: str, line_no: int) -> None:
        self.line_no = line_no
        text = line.strip()
        if not text or text[0] in ";#":
            return
        m = _DIRECTIVE_RE.match(text)
        if m is not None:
            directive, rest = "." + m.group(1).lower(), text[m.end():]
            if directive == ".config":
                self.config(rest)
            elif directive == ".segment":
                self.segment_directive(rest)
            elif directive == ".data":
                self.data(rest)
            else:
                self.fail(f"unknown directive {'.' + m.group(1)!r} (directives: "
                          f"{', '.join(_DIRECTIVES)})")
            return
        if text[0] == ".":
            self.fail(f"bad directive {text.split()[0]!r} (directives: {', '.join(_DIRECTIVES)})")
        program = self._need_program("instruction")
        program.instructions.append(parse_instruction(text, program.isa, line_no=line_no))

    def _expect_end(self, rest: str, what: str) -> None:
        if _strip_comment(rest).strip():
            self.fail(f"unexpected {_strip_comment(rest).strip()!r} after {what}")

    # .config JSON
    def config(self, rest: str) -> None:
        if self.have_config:
            self.fail("duplicate .config directive: a program has one configuration")
        self.have_config = True
        body = rest.lstrip()
        if not body or body[0] in ";#":
            self.fail(".config needs the HwConfig as one-line JSON: .config {\"name\": ...}")
        try:
            data, end = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError as exc:
            self.fail(f"bad .config JSON: {exc.msg} at column {exc.colno} (expected the "
                      "HwConfig as a one-line JSON object)")
        self._expect_end(body[end:], ".config JSON")
        if not isinstance(data, dict):
            self.fail(f".config must be a JSON object of HwConfig fields, not "
                      f"{type(data).__name__}")
        if self.override is not None:
            return  # the config passed to parse_program wins
        try:
            config = HwConfig.from_dict(data)
        except (ConfigError, TypeError, ValueError) as exc:
            self.fail(f"bad .config: {exc}")
        self.program = self._new_program(config)

    # .segment NAME ADDR SIZE
    def segment_directive(self, rest: str) -> None:
        program = self._need_program(".segment")
        usage = ".segment NAME ADDR SIZE (name, byte address, size in bytes)"
        body = rest.strip()
        if body.startswith('"'):
            try:
                name, end = json.JSONDecoder().raw_decode(body)
            except json.JSONDecodeError as exc:
                self.fail(f"bad quoted segment name: {exc.msg}; usage: {usage}")
            if not isinstance(name, str):
                self.fail(f"segment name must be a word or a JSON string; usage: {usage}")
            tokens = _strip_comment(body[end:]).split()
        else:
            tokens = _strip_comment(body).split()
            if not tokens:
                self.fail(f".segment needs a name, an address and a size; usage: {usage}")
            name, tokens = tokens[0], tokens[1:]
        if not name:
            self.fail(f"segment name must not be empty; usage: {usage}")
        if len(tokens) != 2:
            self.fail(f".segment {name!r} needs an address and a size, got {len(tokens)} "
                      f"value(s); usage: {usage}")
        addr, size = (_parse_int(t) for t in tokens)
        for label, raw, value in (("address", tokens[0], addr), ("size", tokens[1], size)):
            if value is None or value < 0:
                self.fail(f"bad segment {label} {raw!r} for {name!r} (expected a non-negative "
                          "decimal or 0x-hex integer)")
        try:
            seg = Segment(name, addr, np.zeros(size, dtype=np.uint8))  # type: ignore[arg-type]
        except (ValueError, MemoryError):
            self.fail(f"segment {name!r} size {size} is too large")
        try:
            program._place(seg)
        except ProgramError as exc:
            self.fail(str(exc))
        self.segment = seg

    # .data OFFSET HEX
    def data(self, rest: str) -> None:
        usage = ".data OFFSET HEXBYTES (offset in the segment, pairs of hex digits)"
        seg = self.segment
        if seg is None:
            self.fail(f".data before any .segment: data lines fill the last .segment; "
                      f"usage: {usage}")
        tokens = _strip_comment(rest).split()
        if len(tokens) < 2:
            self.fail(f".data needs an offset and hex bytes; usage: {usage}")
        offset = _parse_int(tokens[0])
        if offset is None or offset < 0:
            self.fail(f"bad .data offset {tokens[0]!r} (expected a non-negative decimal or "
                      "0x-hex integer)")
        digits = "".join(tokens[1:])
        if not _HEX_RE.fullmatch(digits):
            bad = next(c for c in digits if c not in "0123456789abcdefABCDEF")
            self.fail(f"bad hex data in .data: {bad!r} is not a hex digit (expected pairs of "
                      "hex digits, e.g. 00ff12)")
        if len(digits) % 2:
            self.fail(f"bad hex data in .data: odd number of hex digits ({len(digits)}); "
                      "each byte is two hex digits")
        payload = np.frombuffer(bytes.fromhex(digits), dtype=np.uint8)
        end = offset + payload.size
        if end > seg.size:
            self.fail(f".data [{offset:#x}, {end:#x}) runs past the end of segment "
                      f"{seg.name!r} ({seg.size} bytes)")
        seg.data[offset:end] = payload
