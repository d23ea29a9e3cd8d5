"""Tests of tessera.isa.asm: the assembly text form of programs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera.config import PRESETS
from tessera.errors import AsmError
from tessera.isa import (ALU_OPS, Alu, Finish, Gemm, Intrinsic, Load, MemType, Opcode, Program,
                         Segment, Store, get_isa)
from tessera.isa.asm import (format_instruction, format_program, parse_instruction,
                             parse_program)
from tessera.isa.instructions import INSTRUCTION_CLASSES
from tessera.isa.program import SEGMENT_ALIGN

CONFIG_NAMES = ("pynq", "tiny", "zcu104")
PYNQ = PRESETS["pynq"]
TINY = PRESETS["tiny"]
ISA = get_isa(PYNQ)
SETTINGS = settings(max_examples=150, deadline=None)


# ------------------------------------------------------------ strategies
def _flags(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.type in ("bool", bool)}


@st.composite
def instructions(draw: st.DrawFn, isa) -> object:
    """A random instruction of any kind whose every field fits its layout field."""
    opcode = draw(st.sampled_from(list(Opcode)))
    cls = INSTRUCTION_CLASSES[opcode]
    flags = _flags(cls)
    kwargs: dict[str, object] = {}
    for f in isa.layouts[opcode].fields:
        if f.name == "opcode":
            continue
        if f.name == "mem":
            kwargs["mem"] = draw(st.sampled_from(list(MemType)))
        elif f.name == "alu_op":
            registered = [op.opcode for op in ALU_OPS]
            unregistered = ALU_OPS.free_opcodes()[-1:]  # e.g. 15: printed as ALU.op15
            kwargs["alu_op"] = draw(st.sampled_from(registered + unregistered))
        elif f.name in flags:
            kwargs[f.name] = draw(st.booleans())
        else:
            kwargs[f.name] = draw(st.one_of(st.sampled_from([0, f.lo, f.hi, 1]),
                                            st.integers(f.lo, f.hi)))
    return cls(**kwargs)


_NAME = st.one_of(
    st.from_regex(r"[a-z_][a-z0-9_.]{0,7}", fullmatch=True),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=6),
)


@st.composite
def segment_data(draw: st.DrawFn) -> np.ndarray:
    """Bytes made of 64-byte chunks that are all zero, random, or sparse."""
    size = draw(st.integers(0, 300))
    data = np.zeros(size, dtype=np.uint8)
    for start in range(0, size, 64):
        kind = draw(st.sampled_from(["zero", "random", "one"]))
        n = min(64, size - start)
        if kind == "random":
            data[start:start + n] = np.frombuffer(draw(st.binary(min_size=n, max_size=n)),
                                                  dtype=np.uint8)
        elif kind == "one":
            data[start + draw(st.integers(0, n - 1))] = draw(st.integers(1, 255))
    return data


@st.composite
def programs(draw: st.DrawFn) -> Program:
    config = PRESETS[draw(st.sampled_from(CONFIG_NAMES))]
    isa = get_isa(config)
    names = draw(st.lists(_NAME, max_size=4, unique=True))
    segments, addr = [], 0
    for name in names:
        addr += draw(st.integers(0, 2)) * SEGMENT_ALIGN
        data = draw(segment_data())
        segments.append(Segment(name, addr, data))
        addr += -(-max(data.size, 1) // SEGMENT_ALIGN) * SEGMENT_ALIGN
    segments = draw(st.permutations(segments))  # Program keeps them in address order
    insns = draw(st.lists(instructions(isa), max_size=8))
    return Program(config, insns, segments)


# ------------------------------------------------------ instruction round trip
@pytest.mark.parametrize("config_name", CONFIG_NAMES)
@SETTINGS
@given(data=st.data())
def test_instruction_round_trip(config_name: str, data: st.DataObject) -> None:
    isa = get_isa(PRESETS[config_name])
    insn = data.draw(instructions(isa))
    text = format_instruction(insn, isa)
    assert parse_instruction(text, isa) == insn
    assert parse_instruction(text.lower(), isa) == insn
    assert isa.decode(isa.encode(insn)) == insn


def test_format_prints_nonzero_fields_not_dataclass_defaults() -> None:
    assert format_instruction(Load(mem=MemType.INP), ISA) == \
        "LOAD.inp y_size=1 x_size=1 x_stride=1"
    bare = Store(mem=MemType.OUT, y_size=0, x_size=0, x_stride=0, push_prev=True)
    assert format_instruction(bare, ISA) == "STORE.out push_prev"
    assert format_instruction(Finish(), ISA) == "FINISH"
    # Omitted fields parse back as zero, not as the dataclass defaults.
    assert parse_instruction("STORE.out push_prev", ISA) == bare
    assert parse_instruction("GEMM", ISA) == Gemm(uop_end=0, iter_out=0, iter_in=0)
    assert format_instruction(Alu(alu_op=6, imm=-5, use_imm=True, uop_end=0, iter_out=0,
                                  iter_in=0), ISA) == "ALU.CLIP use_imm imm=-5"
    padded = Load(mem=MemType.INP, x_pad_0=1, pad_value=-128)
    assert format_instruction(padded, ISA) == \
        "LOAD.inp y_size=1 x_size=1 x_stride=1 x_pad_0=1 pad_value=-128"
    assert parse_instruction("LOAD.inp y_size=1 x_size=1 x_stride=1 x_pad_0=1 pad_value=-0x80",
                             ISA) == padded


def test_parser_is_lenient_where_it_should_be() -> None:
    expected = Load(mem=MemType.ACC8, sram_base=16, dram_base=0x100, y_size=2, x_size=3,
                    x_stride=0, pop_next=True)
    for line in ("load.ACC8 x_size=3 DRAM_BASE=0x100 pop_next y_size=2 sram_base=0x10",
                 "  LOAD.acc8   pop_next sram_base=16 dram_base=256 y_size=+2 x_size=3  ; [7]",
                 "LOAD.acc8 pop_next=1 sram_base=16 dram_base=256 y_size=2 x_size=3 # c",
                 "LOAD.acc8 pop_next sram_base=016 dram_base=256 y_size=2 x_size=3 x_pad_0=0"):
        assert parse_instruction(line, ISA) == expected, line
    assert parse_instruction("alu.op1 imm=-0x10", ISA) == Alu(
        alu_op=1, imm=-16, uop_end=0, iter_out=0, iter_in=0)
    assert parse_instruction("GEMM reset=0", ISA) == Gemm(uop_end=0, iter_out=0, iter_in=0)


def test_user_registered_alu_op() -> None:
    code = ALU_OPS.free_opcodes()[0]
    insn = Alu(alu_op=code, uop_end=2)
    assert format_instruction(insn, ISA) == f"ALU.op{code} uop_end=2 iter_out=1 iter_in=1"
    with ALU_OPS.temporarily(Intrinsic("ABSDIFF", code, lambda a, b: np.abs(a - b))):
        assert format_instruction(insn, ISA).startswith("ALU.ABSDIFF ")
        assert parse_instruction("alu.absdiff uop_end=2 iter_out=1 iter_in=1", ISA) == insn
    with pytest.raises(AsmError, match=r"unknown ALU op 'ABSDIFF' \(registered: MIN, MAX"):
        parse_instruction("ALU.ABSDIFF", ISA)


# ------------------------------------------------------------ program round trip
@settings(max_examples=60, deadline=None)
@given(programs())
def test_program_round_trip(program: Program) -> None:
    text = format_program(program)
    parsed = parse_program(text)
    assert parsed == program
    assert format_program(parsed) == text
    # Through the binary file format and back to text.
    loaded = Program.from_bytes(program.to_bytes())
    assert format_program(loaded) == text
    assert parse_program(text).to_bytes() == program.to_bytes()
    assert np.array_equal(parsed.dram_image(), program.dram_image())


def test_program_text_layout() -> None:
    program = Program(TINY)
    data = np.zeros(200, dtype=np.uint8)
    data[70] = 0xAB
    data[199] = 1
    program.add_segment("inp", data)
    program.add_segment("out", 64)
    program.emit(Load(mem=MemType.INP, x_size=4), Finish())
    lines = format_program(program).splitlines()
    assert lines[0] == "; Tessera program for config tiny: 2 instructions, 2 segments"
    assert lines[1].startswith('.config {"name": "tiny", ')
    assert lines[2] == ".segment inp 0x0 200"
    assert lines[3] == ".data 0x40 " + "000000000000ab" + "00" * 57  # chunk 0 is all zero
    assert lines[4] == ".data 0xc0 " + "00" * 7 + "01"                 # short last chunk
    assert lines[5] == ".segment out 0x1000 64"
    assert lines[6] == ""
    assert lines[7].startswith("LOAD.inp y_size=1 x_size=4 x_stride=1 ")
    assert lines[7].endswith("  ; [0]")
    assert lines[8].startswith("FINISH ") and lines[8].endswith("; [1]")


def test_odd_names_round_trip() -> None:
    config = TINY.replace(name='we;ird#"name"\n')
    program = Program(config, [Finish()])
    program._place(Segment("a b;c#d\"é\u2028", 0, np.arange(5, dtype=np.uint8)))
    text = format_program(program)
    assert parse_program(text) == program
    assert len(text.splitlines()) == 6  # header, .config, .segment, .data, blank, FINISH


HAND_WRITTEN = """\
; a ReLU'd 1x16 @ 16x16 product
.config {config}
.segment uop 0x0 4096
.data 0x0 00000000
.segment inp 0x1000 4096    # inputs
.data 0x10 0102030405060708 090a0b0c0d0e0f10
.segment out 0x2000 4096

LOAD.inp sram_base=0 dram_base=256 y_size=1 x_size=1 x_stride=1 push_next  ; [0]
  GEMM pop_prev reset uop_end=1 iter_out=1 iter_in=1
GEMM uop_end=1 iter_out=1 iter_in=1 src_factor_in=0x1 wgt_factor_out=3
alu.max use_imm imm=0 uop_end=1 iter_out=1 iter_in=1 push_next
STORE.out pop_prev dram_base=512 y_size=1 x_size=1 x_stride=1
FINISH
"""


def test_hand_written_program() -> None:
    import json
    text = HAND_WRITTEN.replace("{config}", json.dumps(PYNQ.to_dict()))
    program = parse_program(text)
    assert program.config == PYNQ
    assert [(s.name, s.addr, s.size) for s in program.segments] == [
        ("uop", 0, 4096), ("inp", 4096, 4096), ("out", 8192, 4096)]
    inp = program.segment("inp").data
    assert list(inp[0x10:0x20]) == list(range(1, 17)) and not inp[:0x10].any()
    assert not inp[0x20:].any() and not program.segment("out").data.any()
    load, reset, gemm, relu, store, finish = program.instructions
    assert load == Load(mem=MemType.INP, sram_base=0, dram_base=256, y_size=1, x_size=1,
                        x_stride=1, push_next=True)
    assert (load.mem, load.dram_base, load.push_next, load.pop_next, load.y_pad_0) == \
        (MemType.INP, 256, True, False, 0)
    assert reset == Gemm(pop_prev=True, reset=True, uop_end=1, iter_out=1, iter_in=1)
    assert gemm == Gemm(uop_end=1, iter_out=1, iter_in=1, src_factor_in=1, wgt_factor_out=3)
    assert relu == Alu(alu_op=ALU_OPS.by_name("MAX").opcode, use_imm=True, imm=0, uop_end=1,
                       iter_out=1, iter_in=1, push_next=True)
    assert store == Store(mem=MemType.OUT, pop_prev=True, dram_base=512, y_size=1, x_size=1,
                          x_stride=1)
    assert finish == Finish()
    again = format_program(program)
    assert parse_program(again) == program and format_program(parse_program(again)) == again


def test_config_argument() -> None:
    body = ".segment a 0x0 16\nFINISH\n"
    assert parse_program(body, config=TINY) == Program(TINY, [Finish()], [
        Segment("a", 0, np.zeros(16, np.uint8))])
    text = format_program(Program(PYNQ, [Finish()]))
    overridden = parse_program(text, config=TINY)
    assert overridden.config == TINY and overridden.instructions == [Finish()]
    # The override applies even though .config comes later (or not at all).
    assert parse_program("FINISH\n" + text.split("\n", 1)[1], config=TINY).config == TINY


# ------------------------------------------------------------------ errors
def _text(*lines: str, config=PYNQ) -> str:
    import json
    return "\n".join([".config " + json.dumps(config.to_dict()), *lines]) + "\n"


@pytest.mark.parametrize("line, message", [
    ("FOO x=1", r"unknown mnemonic 'FOO' \(mnemonics: LOAD\.<mem>, STORE\.<mem>, GEMM, "
                r"FINISH, ALU\.<op>\)"),
    ("", r"expected an instruction"),
    ("LOAD.inp x_pad_2=1", r"unknown field 'x_pad_2' for LOAD \(fields: pop_prev, .*x_pad_1, pad_value\)"),
    ("FINISH reset", r"unknown field 'reset' for FINISH \(fields: pop_prev, pop_next, "
                     r"push_prev, push_next\)"),
    ("LOAD.inp y_size=70000", r"y_size=70000 is out of range for LOAD: y_size must be in "
                              r"\[0, 65535\]"),
    ("ALU.ADD imm=0x10000", r"imm=0x10000 is out of range for ALU: imm must be in "
                            r"\[-65536, 65535\]"),
    ("GEMM uop_begin=-1", r"uop_begin=-1 is out of range .* \[0, 8191\]"),
    ("GEMM uop_end=16384", r"uop_end must be in \[0, 16383\]"),
    ("GEMM reset=2", r"reset=2 is out of range for GEMM: reset must be in \[0, 1\]"),
    ("LOAD.inp y_size=1 y_size=2", r"duplicate field 'y_size' for LOAD"),
    ("GEMM reset RESET", r"duplicate field 'reset'"),
    ("LOAD.inp y_size=", r"missing value for field 'y_size' of LOAD \(expected a decimal or "
                         r"0x-hex integer in \[0, 65535\]\)"),
    ("LOAD.inp y_size", r"field 'y_size' of LOAD needs a value: y_size=N with N in "
                        r"\[0, 65535\]"),
    ("LOAD.inp y_size=12abc", r"bad value '12abc' for field 'y_size'"),
    ("LOAD.inp y_size=1.5", r"bad value '1.5'"),
    ("LOAD.inp =5", r"bad operand '=5' for LOAD"),
    ("LOAD x_size=1", r"LOAD needs a memory type: LOAD\.<mem> with mem one of uop, wgt, inp, "
                      r"acc, out, acc8"),
    ("STORE.foo", r"unknown memory type 'foo' for STORE \(memory types: uop, wgt, inp"),
    ("ALU uop_end=1", r"ALU needs an op: ALU\.<op> \(registered: MIN, MAX, .*; or opN with N "
                      r"in \[0, 15\]\)"),
    ("ALU.FOO", r"unknown ALU op 'FOO'"),
    ("ALU.op16", r"unknown ALU op 'op16' .* \[0, 15\]"),
    ("GEMM.inp", r"GEMM takes no '\.inp' suffix"),
])
def test_instruction_errors(line: str, message: str) -> None:
    with pytest.raises(AsmError, match=message + r".* \(line 7\)$"):
        parse_instruction(line, ISA, line_no=7)
    if line:  # an empty line is fine in a program
        with pytest.raises(AsmError, match=message + r".* \(line 3\)$"):
            parse_program(_text("FINISH", line))


@pytest.mark.parametrize("text, message", [
    ("FINISH\n", r"instruction before \.config: put \.config \{\.\.\.\} .* or pass config= "
                 r"\(line 1\)"),
    ("; nothing\n\n", r"^missing \.config directive"),
    (".segment a 0x0 16\n", r"\.segment before \.config: .*\(line 1\)"),
    (_text(".config {}"), r"duplicate \.config directive: .*\(line 2\)"),
    (".config {\"name\": \"x\", \n", r"bad \.config JSON: .*\(line 1\)"),
    (".config [1, 2]\n", r"\.config must be a JSON object"),
    (".config {\"nmae\": \"x\"}\n", r"bad \.config: unknown HwConfig fields \['nmae'\]"),
    (".config {\"batch\": 3}\n", r"bad \.config: batch must be a power of two"),
    (".config {} trailing\n", r"unexpected 'trailing' after \.config JSON"),
    (_text(".data 0x0 00"), r"\.data before any \.segment: .*\(line 2\)"),
    (_text(".segment a 0x0 16", ".data 0x8 00112233445566778899"),
     r"\.data \[0x8, 0x12\) runs past the end of segment 'a' \(16 bytes\) \(line 3\)"),
    (_text(".segment a 0x0 16", ".data 0x10 00"), r"runs past the end of segment 'a'"),
    (_text(".segment a 0x0 16", ".data 0x0 00zz"),
     r"bad hex data in \.data: 'z' is not a hex digit .*\(line 3\)"),
    (_text(".segment a 0x0 16", ".data 0x0 0x00"), r"bad hex data in \.data: 'x'"),
    (_text(".segment a 0x0 16", ".data 0x0 001"), r"odd number of hex digits \(3\)"),
    (_text(".segment a 0x0 16", ".data 0x0"), r"\.data needs an offset and hex bytes"),
    (_text(".segment a 0x0 16", ".data -1 00"), r"bad \.data offset '-1'"),
    (_text(".segment a 0x10 16"), r"segment 'a' address 0x10 must be a multiple of 4096 "
                                  r"\(line 2\)"),
    (_text(".segment a 0x0 8192", ".segment b 0x1000 16"), r"segment 'b' .* overlaps 'a'"),
    (_text(".segment a 0x0 16", ".segment a 0x1000 16"), r"segment 'a' is defined twice"),
    (_text(".segment a 0x0"), r"\.segment 'a' needs an address and a size"),
    (_text(".segment a 0x0 big"), r"bad segment size 'big' for 'a'"),
    (_text(".segment \"a 0x0 16"), r"bad quoted segment name"),
    (_text(".segmnet a 0x0 16"), r"unknown directive '\.segmnet' \(directives: \.config, "
                                 r"\.segment, \.data\) \(line 2\)"),
    (_text("FINISH", "LOAD.inp y_size=99999"), r"y_size=99999 is out of range .*\(line 3\)"),
    (_text("MOV r1, r2"), r"unknown mnemonic 'MOV' .*\(line 2\)"),
])
def test_program_errors(text: str, message: str) -> None:
    with pytest.raises(AsmError, match=message):
        parse_program(text)


def test_range_comes_from_the_config() -> None:
    # tiny: 7-bit uop index, so uop_begin <= 127; its ALU immediate is 32 bits wide.
    tiny = get_isa(TINY)
    with pytest.raises(AsmError, match=r"uop_begin must be in \[0, 127\]"):
        parse_instruction("GEMM uop_begin=128", tiny)
    assert parse_instruction("ALU.ADD imm=-2147483648", tiny).imm == -(2 ** 31)
    with pytest.raises(AsmError, match=r"imm must be in \[-2147483648, 2147483647\]"):
        parse_instruction("ALU.ADD imm=0x80000000", tiny)
