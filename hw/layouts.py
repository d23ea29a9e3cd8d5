"""``lib.data`` layouts of instructions and uops, built from :mod:`tessera.isa`.

The ISA's :class:`~tessera.isa.Layout` objects are the single source of field
names, widths and order; here they become Amaranth ``StructLayout`` s so the
RTL reads ``insn.x_size`` instead of bit slices.
"""
from __future__ import annotations

from amaranth.hdl import signed, unsigned
from amaranth.lib import data

from tessera.config import HwConfig
from tessera.isa import Layout, Opcode, get_isa
from tessera.isa.encoding import OPCODE_BITS


def struct_layout(layout: Layout) -> data.StructLayout:
    """The ``StructLayout`` of an ISA layout (fields packed from bit 0, as the ISA packs them)."""
    return data.StructLayout({f.name: signed(f.width) if f.signed else unsigned(f.width)
                              for f in layout.fields})


def insn_layout(config: HwConfig, opcode: Opcode) -> data.StructLayout:
    """The layout of one instruction kind (LOAD and STORE share one)."""
    return struct_layout(get_isa(config).layouts[opcode])


def mem_layout(config: HwConfig) -> data.StructLayout:
    """LOAD/STORE fields."""
    return insn_layout(config, Opcode.LOAD)


def gemm_layout(config: HwConfig) -> data.StructLayout:
    return insn_layout(config, Opcode.GEMM)


def alu_layout(config: HwConfig) -> data.StructLayout:
    return insn_layout(config, Opcode.ALU)


def uop_layout(config: HwConfig) -> data.StructLayout:
    """The uop fields (dst, src, wgt); a uop word is ``get_isa(config).uop_layout.bits`` wide."""
    return struct_layout(get_isa(config).uop_layout)


#: The opcode occupies the low bits of every instruction.
OPCODE_SHAPE = unsigned(OPCODE_BITS)
