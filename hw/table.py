"""One lane's copy of the tensor ALU's table memory (``HwConfig.table_entries``).

The table memory holds ``table_entries`` int8 entries that ALU ops declaring
``reads_table`` look values up in (the LUT plug-in's activation tables). ``LOAD tbl``
writes it a row of ``batch x block_out`` entries per element, one row per cycle (the
acc8 element format and DMA timing). Every lane of the tensor ALU has its own copy, so
the lanes read their entries independently: a copy is ``table_rows`` words of
``batch x block_out`` bytes, written a whole word at a time (every lane's copy gets the
whole row) and read a byte at a time.

Distributed RAM (LUTRAM: an asynchronous read of the word, the byte chosen, an 8-bit
register), not block RAM, because on the xc7z020 of the pynq preset:

* a copy is 64 words of 128 bits (1024 entries, 16 lanes): exactly the depth of a
  SLICEM LUT (RAM64M), where a BRAM36 would hold 512 words of which 64 are used, and
  the 128-bit word needs two BRAM36 (72-bit simple dual port) per lane: 32 BRAM36 for
  the 16 lanes, more than the 24.5 the pynq preset leaves free (docs/benchmarks.md);
* the asynchronous read lets the byte be chosen before the register, so each lane
  registers 8 bits, not the 128-bit word a synchronous read port of LUTRAM registers
  in flip-flops (1,920 fewer on pynq).

The read is still one cycle (registered), the contract of :meth:`TableMemory.read`.
"""
from __future__ import annotations

from typing import Sequence

from amaranth.hdl import Elaboratable, Module, Signal, Value, signed, unsigned
from amaranth.lib import memory

from tessera.errors import ConfigError

__all__ = ["ENTRY_BITS", "TableMemory"]

#: Bits of one table entry (an int8).
ENTRY_BITS = 8


def _log2(n: int, what: str) -> int:
    if n < 1 or n & (n - 1):
        raise ConfigError(f"{what} must be a power of two, not {n}")
    return n.bit_length() - 1


class TableMemory(Elaboratable):
    """One lane's table memory: ``entries`` int8 entries, ``row_entries`` to a word.

    Add it as a submodule, write it with :meth:`write` (one word per cycle) and read it
    with :meth:`read` (the hook API of :mod:`tessera.hw.alu_ops`).

    Attributes:
        entries: int8 entries (a power of two).
        index_bits: bits of an entry index (``log2(entries)``).
        row_entries: entries per word (a power of two: ``batch x block_out``).
        rows: words (``entries / row_entries``).
    """

    def __init__(self, entries: int, row_entries: int, init: Sequence[int] | None = None,
                 name: str = "tbl") -> None:
        self.entries = entries
        self.index_bits = _log2(entries, "table entries")
        self.row_entries = row_entries
        self._lane_bits = _log2(row_entries, "entries per table row")
        if row_entries > entries:
            raise ConfigError(f"a table row of {row_entries} entries does not fit a table "
                              f"of {entries}")
        self.rows = entries // row_entries
        self.name = name
        words = []
        if init is not None:
            values = [int(v) & 0xFF for v in init]
            if len(values) != entries:
                raise ValueError(f"a table of {entries} entries needs {entries} initial "
                                 f"values, not {len(values)}")
            words = [sum(v << (ENTRY_BITS * k) for k, v in
                         enumerate(values[r * row_entries:(r + 1) * row_entries]))
                     for r in range(self.rows)]
        # ram_style: Vivado would otherwise be free to pick block RAM (module doc).
        self.memory = memory.Memory(shape=unsigned(ENTRY_BITS * row_entries), depth=self.rows,
                                    init=words, attrs={"ram_style": "distributed"})

    def write(self, m: Module, row: Value, data: Value, en: Value) -> None:
        """Write ``data`` (``row_entries`` bytes, entry ``row * row_entries + k`` in byte
        ``k``) to word ``row`` in the cycles ``en`` is high."""
        port = self.memory.write_port()
        m.d.comb += [port.addr.eq(row), port.data.eq(data), port.en.eq(en)]

    def read(self, m: Module, entry: Value) -> Value:
        """``table[entry mod entries]`` as a ``signed(8)`` Value valid one cycle after
        ``entry`` (a new read every cycle); a read port of its own."""
        port = self.memory.read_port(domain="comb")
        entry = Value.cast(entry)
        index = entry[:self.index_bits]      # unsigned: the index mod entries
        m.d.comb += port.addr.eq(index[self._lane_bits:])
        value = Signal(signed(ENTRY_BITS), name=f"{self.name}_q", reset_less=True)
        word = port.data if self.row_entries == 1 else \
            port.data.word_select(index[:self._lane_bits], ENTRY_BITS)
        m.d.sync += value.eq(word)
        return value

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.memory = self.memory
        return m
