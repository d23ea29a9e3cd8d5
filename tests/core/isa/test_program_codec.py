"""The stream codec (``encode_program``/``decode_program``, numpy over the whole stream)
against the per-instruction ``encode``/``decode`` it must equal word for word and error
for error."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tessera.config import PRESETS
from tessera.errors import EncodingError, MalformedInstructionError
from tessera.isa import INSN_BITS, INSN_BYTES, Alu, Finish, Load, MemType, Opcode, get_isa
from tests.core.isa.test_asm import CONFIG_NAMES, instructions

SETTINGS = settings(max_examples=60, deadline=None)


def one_by_one(isa, insns) -> bytes:
    return b"".join(isa.encode(insn, index=i).to_bytes(INSN_BYTES, "little")
                    for i, insn in enumerate(insns))


@pytest.mark.parametrize("config_name", CONFIG_NAMES)
@SETTINGS
@given(data=st.data())
def test_stream_equals_instruction_by_instruction(config_name, data):
    isa = get_isa(PRESETS[config_name])
    insns = data.draw(st.lists(instructions(isa), max_size=40))
    stream = isa.encode_program(insns)
    assert stream == one_by_one(isa, insns)
    decoded = isa.decode_program(stream)
    assert decoded == insns
    assert decoded == [isa.decode(int.from_bytes(stream[i:i + INSN_BYTES], "little"))
                       for i in range(0, len(stream), INSN_BYTES)]
    # Same types as the scalar decoder: flags are bools, mem a MemType, the rest ints.
    for got in decoded:
        for name, value in vars(got).items():
            assert type(value) in (bool, int, MemType), (name, type(value))


def error_of(fn, *args, **kwargs):
    with pytest.raises((EncodingError, MalformedInstructionError)) as info:
        fn(*args, **kwargs)
    return type(info.value), str(info.value)


@pytest.mark.parametrize("config_name", CONFIG_NAMES)
@SETTINGS
@given(data=st.data())
def test_first_out_of_range_field_raises_as_alone(config_name, data):
    isa = get_isa(PRESETS[config_name])
    insns = data.draw(st.lists(instructions(isa), min_size=1, max_size=20))
    # Push fields of a few instructions out of range (below, above, beyond int64).
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(insns) - 1))
        fields = [f for f in isa.layouts[insns[i].opcode].fields
                  if f.name not in ("opcode", "mem") and f.width > 1]
        if not fields:
            continue
        f = data.draw(st.sampled_from(fields))
        value = data.draw(st.sampled_from([f.hi + 1, f.lo - 1, 1 << 70]))
        insns[i] = insns[i].replace(**{f.name: value})
    bad = next((i for i, insn in enumerate(insns)
                if _raises(lambda: isa.encode(insn, index=i))), None)
    if bad is None:
        assert isa.encode_program(insns) == one_by_one(isa, insns)
        return
    assert error_of(isa.encode_program, insns) == error_of(isa.encode, insns[bad], index=bad)


def _raises(fn) -> bool:
    try:
        fn()
    except EncodingError:
        return True
    return False


@pytest.mark.parametrize("config_name", CONFIG_NAMES)
@SETTINGS
@given(data=st.data())
def test_first_malformed_word_raises_as_alone(config_name, data):
    isa = get_isa(PRESETS[config_name])
    insns = data.draw(st.lists(instructions(isa), min_size=1, max_size=20))
    words = [int.from_bytes(isa.encode_program([x]), "little") for x in insns]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(words) - 1))
        if words[i] & 7 not in {int(o) for o in Opcode}:
            continue                                  # its opcode is already reserved
        layout = isa.layouts[Opcode(words[i] & 7)]
        damage = data.draw(st.sampled_from(["opcode", "unused", "mem"]))
        if damage == "opcode":
            reserved = sorted(set(range(8)) - {int(o) for o in Opcode})
            words[i] = words[i] & ~7 | data.draw(st.sampled_from(reserved))
        elif damage == "unused" and layout.used_bits < INSN_BITS:
            words[i] |= 1 << data.draw(st.integers(layout.used_bits, INSN_BITS - 1))
        elif damage == "mem" and "mem" in layout.names:
            mem = layout.field("mem")
            words[i] = words[i] & ~(mem.mask << mem.offset) | 7 << mem.offset
    stream = b"".join(w.to_bytes(INSN_BYTES, "little") for w in words)
    bad = next((i for i, w in enumerate(words)
                if _malformed(lambda: isa.decode(w, index=i))), None)
    if bad is None:
        assert isa.decode_program(stream) == [isa.decode(w) for w in words]
        return
    assert error_of(isa.decode_program, stream) == error_of(isa.decode, words[bad], index=bad)


def _malformed(fn) -> bool:
    try:
        fn()
    except MalformedInstructionError:
        return True
    return False


def test_fields_across_the_64_bit_boundary():
    """pynq's LOAD has dram_base across bits 63/64 and a signed pad_value at the top."""
    isa = get_isa(PRESETS["pynq"])
    layout = isa.layouts[Opcode.LOAD]
    assert any(f.offset < 64 < f.offset + f.width for f in layout.fields)
    insns = [Load(mem=MemType.ACC8, dram_base=(1 << 32) - 1, x_stride=65535, pad_value=-128),
             Load(mem=MemType.INP, dram_base=0x89ABCDEF, x_pad_1=15, pad_value=127),
             Alu(alu_op=6, use_imm=True, imm=-(1 << (isa.imm_bits - 1)), iter_out=3),
             Finish(pop_prev=True, push_next=True)]
    stream = isa.encode_program(insns)
    assert stream == one_by_one(isa, insns)
    assert isa.decode_program(stream) == insns
    assert isa.encode_program([]) == b"" and isa.decode_program(b"") == []
    with pytest.raises(EncodingError, match="not a multiple of 16"):
        isa.decode_program(stream[:-1])
