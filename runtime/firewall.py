"""The DMA firewall and program relocation.

On a board, a LOAD or STORE with a wrong ``dram_base`` reads or overwrites
Linux's memory. So before any launch, on every backend, :func:`check_launch`
checks the instruction fetch and every LOAD/STORE range against the buffers
allocated for that run, and every instruction against the rules the hardware
relies on; a violation is a :class:`~tessera.errors.FirewallError` (or the
instruction check's :class:`~tessera.errors.MalformedInstructionError`) naming
the instruction, and nothing is launched.

A :class:`~tessera.isa.Program` addresses its own segments from address 0;
:func:`relocate` moves its LOAD/STOREs to the device buffers holding the
segments (the same rule the simulator applies: a transfer's whole range lies
inside one segment).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from tessera.config import HwConfig
from tessera.errors import FirewallError, MissingFinishError
from tessera.isa import INSN_BYTES, Finish, Instruction, Load, Program, Store, check_instruction
from tessera.isa.encoding import Isa
from tessera.regmap import AXI_BOUNDARY_BYTES

__all__ = ["Region", "check_launch", "relocate"]


@dataclass(frozen=True)
class Region:
    """A named byte range ``[lo, hi)`` of device memory a run may touch."""

    name: str
    lo: int
    hi: int

    def holds(self, lo: int, hi: int) -> bool:
        return self.lo <= lo and hi <= self.hi

    def __str__(self) -> str:
        return f"{self.name} [{self.lo:#x}, {self.hi:#x})"


def _describe(regions: Sequence[Region]) -> str:
    shown = ", ".join(str(r) for r in regions[:8])
    more = f" and {len(regions) - 8} more" if len(regions) > 8 else ""
    return (shown + more) if regions else "none"


def _dma_verb(insn: Load | Store) -> str:
    return "reads" if isinstance(insn, Load) else "writes"


def check_launch(instructions: Sequence[Instruction], isa: Isa, *, stream: Region,
                 regions: Sequence[Region]) -> None:
    """Refuse a launch unless it is safe.

    ``stream`` is where the instruction stream is fetched from (INSN_ADDR and
    INSN_COUNT); ``regions`` are the buffers of the run. Checks, in order: the
    stream is page-aligned, every instruction passes
    :func:`tessera.isa.check_instruction`, every LOAD/STORE's DRAM range lies
    inside one region, and a FINISH ends the run (without one the hardware
    would never signal done).
    """
    config: HwConfig = isa.config
    if stream.lo % AXI_BOUNDARY_BYTES:
        raise FirewallError(f"the instruction stream must start on a {AXI_BOUNDARY_BYTES}-byte "
                            f"boundary (INSN_ADDR), "
                            f"not at {stream.lo:#x}")
    fetch_end = stream.lo + len(instructions) * INSN_BYTES
    if fetch_end > stream.hi:
        raise FirewallError(f"fetching {len(instructions)} instructions reads [{stream.lo:#x}, "
                            f"{fetch_end:#x}), past the end of {stream}")
    for index, insn in enumerate(instructions):
        check_instruction(insn, config, index)
        if isinstance(insn, (Load, Store)):
            span = isa.dram_span(insn)
            if span is not None and not any(r.holds(*span) for r in regions):
                raise FirewallError(
                    f"{insn.label} {_dma_verb(insn)} DRAM bytes [{span[0]:#x}, {span[1]:#x}) "
                    f"(dram_base {insn.dram_base}, y_size {insn.y_size}, x_size {insn.x_size}, "
                    f"x_stride {insn.x_stride}), which are not inside one buffer of this run; buffers: "
                    f"{_describe(regions)}. Nothing was launched: fix the address or allocate "
                    "the buffer and pass it to launch()", index=index, where=insn.label)
    if not any(isinstance(i, Finish) for i in instructions):
        raise MissingFinishError(f"the stream of {len(instructions)} instructions has no FINISH, "
                                 "so the accelerator would never signal done: end it with FINISH")


def relocate(program: Program, addresses: Mapping[str, int]) -> list[Instruction]:
    """``program``'s instructions with every LOAD/STORE moved from its segment's address in the
    program to ``addresses[segment name]`` (page-aligned device addresses)."""
    isa = program.isa
    segments = [Region(s.name, s.addr, s.end) for s in program.segments]
    moved: list[Instruction] = []
    for index, insn in enumerate(program.instructions):
        if isinstance(insn, (Load, Store)):
            span = isa.dram_span(insn)
            if span is not None:
                seg = next((s for s in segments if s.holds(*span)), None)
                if seg is None:
                    raise FirewallError(
                        f"{insn.label} {_dma_verb(insn)} DRAM bytes [{span[0]:#x}, {span[1]:#x}), "
                        f"which are not inside one segment of the program; segments: "
                        f"{_describe(segments)}", index=index, where=insn.label)
                delta, rest = divmod(addresses[seg.name] - seg.lo, isa.elem_bytes(insn.mem))
                assert rest == 0, "device buffers are page-aligned"
                insn = insn.replace(dram_base=insn.dram_base + delta)
        moved.append(insn)
    return moved
