"""Layouts derive from the config; encode/decode checks ranges and reserved values."""
import pytest

from tessera.config import PRESETS
from tessera.errors import EncodingError, MalformedInstructionError
from tessera.isa import (INSN_BITS, Alu, Finish, Gemm, Load, MemType, Opcode, Store, Uop,
                         get_isa)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_layouts_fit_and_do_not_overlap(name):
    isa = get_isa(PRESETS[name])
    for layout in set(isa.layouts.values()) | {isa.uop_layout}:
        used = 0
        for f in layout.fields:
            mask = f.mask << f.offset
            assert not used & mask, f"{f.name} overlaps"
            used |= mask
        assert used < 1 << layout.bits
    assert isa.layouts[Opcode.LOAD] is isa.layouts[Opcode.STORE]


def test_widths_follow_the_config():
    small, big = get_isa(PRESETS["tiny"]), get_isa(PRESETS["pynq"])
    for isa, c in ((small, PRESETS["tiny"]), (big, PRESETS["pynq"])):
        gemm = isa.layouts[Opcode.GEMM]
        assert gemm.field("uop_begin").width == c.uop_index_bits
        assert gemm.field("uop_end").width == c.uop_index_bits + 1
        assert gemm.field("dst_factor_out").width == c.acc_index_bits
        assert gemm.field("src_factor_in").width == c.inp_index_bits
        assert gemm.field("wgt_factor_in").width == c.wgt_index_bits
        assert gemm.field("iter_out").width == c.loop_bits
        assert isa.uop_layout.field("wgt").width == c.wgt_index_bits
    # Narrow buffers leave room for a full 32-bit immediate; the pynq ALU word is full.
    assert small.imm_bits == 32 and big.imm_bits == 17
    assert big.layouts[Opcode.ALU].used_bits == INSN_BITS


def test_encoding_positions_on_pynq():
    isa = get_isa(PRESETS["pynq"])
    word = isa.encode(Load(mem=MemType.WGT, sram_base=5, dram_base=7, y_size=1, x_size=2,
                           x_stride=3, pop_next=True))
    assert word & 0b111 == Opcode.LOAD
    assert (word >> 4) & 1 == 1                      # pop_next is bit 4
    assert (word >> 7) & 0b111 == MemType.WGT
    assert (word >> 10) & 0x1FFF == 5
    # pad_value: signed inp_width bits right after x_pad_1 (bits 115..118 on pynq).
    pad = isa.layouts[Opcode.LOAD].field("pad_value")
    assert (pad.offset, pad.width, pad.lo, pad.hi) == (119, 8, -128, 127)
    assert isa.encode(Load(pad_value=-1)) >> 119 == 0xFF
    assert isa.decode(isa.encode(Load(pad_value=-128, x_pad_1=1))).pad_value == -128
    with pytest.raises(EncodingError, match=r"pad_value must be in \[-128, 127\]"):
        isa.encode(Load(pad_value=128))
    assert isa.encode(Finish(push_prev=True)) == 0b0100011
    assert isa.encode_uop(Uop(dst=1, src=2, wgt=3)) == 1 | 2 << 11 | 3 << 22


def test_range_errors_name_field_and_instruction():
    isa = get_isa(PRESETS["pynq"])
    with pytest.raises(EncodingError, match=r"x_pad_0 must be in \[0, 15\], not 17 "
                                            r"\(instruction 12, LOAD inp\)"):
        isa.encode(Load(mem=MemType.INP, x_pad_0=17), index=12)
    with pytest.raises(EncodingError, match=r"imm must be in \[-65536, 65535\]"):
        isa.encode(Alu(alu_op=0, use_imm=True, imm=70000))
    with pytest.raises(EncodingError, match=r"dst must be in \[0, 2047\].*uop"):
        isa.encode_uop(Uop(dst=2048))


def test_decode_rejects_reserved_values():
    isa = get_isa(PRESETS["pynq"])
    with pytest.raises(MalformedInstructionError, match="opcode 6 is reserved"):
        isa.decode(6, index=3)
    with pytest.raises(MalformedInstructionError, match="reserved memory type"):
        isa.decode(Opcode.LOAD | 7 << 7)
    with pytest.raises(MalformedInstructionError, match="unused by FINISH"):
        isa.decode(Opcode.FINISH | 1 << 100)


def test_program_stream_round_trip():
    isa = get_isa(PRESETS["tiny"])
    insns = [Load(mem=MemType.ACC8, y_size=3, x_size=2, x_stride=5, y_pad_1=1, pad_value=-128),
             Load(mem=MemType.INP, x_pad_0=2, pad_value=127),
             Gemm(reset=True, uop_end=4, iter_out=2, dst_factor_out=4),
             Alu(alu_op=6, use_imm=True, imm=-(1 << 31), uop_end=1),
             Store(x_size=1, pop_prev=True, push_prev=True), Finish(pop_next=True)]
    data = isa.encode_program(insns)
    assert len(data) == 16 * len(insns)
    assert isa.decode_program(data) == insns
