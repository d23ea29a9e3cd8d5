"""Physical memory allocation for the simulated devices (``sim``, ``rtl``, the simulated PYNQ board).

A board's driver gets physically contiguous, page-aligned buffers from the
kernel's CMA pool (``pynq.allocate``). The simulated devices model that with
:class:`PageAllocator`: first-fit over one region of the simulated DRAM, every
buffer page-aligned (so every DMA element size divides a buffer address, and
an instruction stream can start at a buffer's first byte, as INSN_ADDR
requires).
"""
from __future__ import annotations

from tessera.errors import DeviceError
from tessera.isa.program import SEGMENT_ALIGN, align_up

__all__ = ["PAGE_BYTES", "PageAllocator"]

#: Buffers start on a page boundary: every element size divides it, INSN_ADDR needs it.
PAGE_BYTES = SEGMENT_ALIGN


class PageAllocator:
    """First-fit allocation of page-aligned blocks in ``[base, base + size)``."""

    def __init__(self, base: int, size: int) -> None:
        if base % PAGE_BYTES or size <= 0:
            raise ValueError(f"base must be page-aligned and size positive ({base:#x}, {size})")
        self.base = base
        self.size = size
        self._blocks: dict[int, int] = {}      # address -> rounded size of live blocks

    def allocate(self, nbytes: int) -> int:
        """The address of a new block of at least ``nbytes`` (one page when 0)."""
        if nbytes < 0:
            raise DeviceError(f"cannot allocate {nbytes} bytes: the size must not be negative")
        need = align_up(max(nbytes, 1), PAGE_BYTES)
        addr = self.base
        for start in sorted(self._blocks):
            if start - addr >= need:
                break
            addr = start + self._blocks[start]
        if addr + need > self.base + self.size:
            raise DeviceError(
                f"out of device memory: {nbytes} bytes do not fit in the {self.size:#x}-byte "
                f"region ({self.used:#x} bytes in {len(self._blocks)} live buffers): free "
                "buffers, or open the device with a larger memory_bytes")
        self._blocks[addr] = need
        return addr

    def free(self, addr: int) -> None:
        if self._blocks.pop(addr, None) is None:
            raise DeviceError(f"no live buffer at {addr:#x} (freed twice?)")

    @property
    def used(self) -> int:
        return sum(self._blocks.values())

    @property
    def high_water(self) -> int:
        """One past the last byte of the highest live block (``base`` when empty)."""
        return max((a + n for a, n in self._blocks.items()), default=self.base)
