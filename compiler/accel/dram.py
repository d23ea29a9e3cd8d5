"""``plan_dram``: where every tensor of a compiled program lives in DRAM.

Program inputs and outputs each get a named segment (the runtime writes and
reads those by name). Intermediate tensors share one ``arena`` segment:
each is live from the operator that writes it to the last operator that reads
it, and a first-fit allocator reuses the space of dead tensors. Reuse is safe
with overlapping execution because the token pass orders the later
operator's stores after the earlier operator's loads of the same bytes
(a DRAM write-after-read hazard like any other).

Offsets are aligned to :data:`ALIGN` bytes, a multiple of every activation
element size and of the bus width, so DMA rows start on a beat.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from tessera.config import HwConfig

from .emit import Emitter, Place
from tessera.errors import CompileError
from .layout import ActLayout
from .ops import Concat, Op

ALIGN = 64


@dataclass
class DramPlan:
    """Segment and offset of each tensor, and the arena's size and reuse."""

    places: dict[str, Place]
    arena_bytes: int = 0
    intermediate_bytes: int = 0
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict)


def tensor_bytes(shape: tuple[int, ...], config: HwConfig, layout: ActLayout | None = None) -> int:
    """DRAM bytes of an activation tensor in its packed layout (default: ``block_out``
    channel blocks, as operators store them)."""
    layout = layout or ActLayout.of(shape, config, config.block_out)
    return layout.values * config.out_width // 8


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_dram(ops: Sequence[Op], shapes: Mapping[str, tuple[int, int, int, int]],
              inputs: Sequence[str], outputs: Sequence[str], config: HwConfig,
              em: Emitter, layouts: Mapping[str, ActLayout] | None = None) -> DramPlan:
    """Place every tensor; adds the input, output and arena segments to ``em``."""
    layouts = layouts or {}

    def nbytes(name: str) -> int:
        return tensor_bytes(shapes[name], config, layouts.get(name))
    parts = concat_parts(ops, shapes, inputs, outputs, config)
    root = {name: parts.get(name, (name, 0))[0] for name in shapes}
    places: dict[str, Place] = {}
    for name in inputs:
        places[name] = Place(em.add_segment(name, nbytes(name)))
    for name in outputs:
        if name not in places and name not in parts:
            places[name] = Place(em.add_segment(name, nbytes(name)))
    # Lifetimes in operator indices: [producer, last consumer]; a concat's buffer lives
    # from its first part's producer.
    life: dict[str, list[int]] = {}
    for k, op in enumerate(ops):
        if root[op.output] not in places:
            life.setdefault(root[op.output], [k, k])
        for t in op.inputs:
            if root[t] in life:
                life[root[t]][1] = max(life[root[t]][1], k)
    free: list[tuple[int, int]] = []   # (offset, size) holes
    active: dict[str, tuple[int, int]] = {}
    top = 0
    offsets: dict[str, int] = {}
    total = 0
    for k, op in enumerate(ops):
        # Tensors whose last reader ran before operator k are dead: their space is free.
        for name, (off, size) in list(active.items()):
            if life[name][1] < k:
                del active[name]
                free.append((off, size))
        free.sort()
        merged: list[tuple[int, int]] = []
        for off, size in free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((off, size))
        free = merged
        name = root[op.output]
        if name not in life or name in offsets:
            continue
        need = _align(nbytes(name))
        total += need
        for i, (off, size) in enumerate(free):
            if size >= need:
                offsets[name] = off
                free[i] = (off + need, size - need)
                break
        else:
            offsets[name] = top
            top += need
        active[name] = (offsets[name], need)
    if offsets:
        arena = em.add_segment("arena", top)
        for name, off in offsets.items():
            places[name] = Place(arena, off)
    for name, (whole, offset) in parts.items():
        places[name] = Place(places[whole].segment, places[whole].offset + offset)
    missing = [n for n in shapes if n not in places]
    if missing:
        raise CompileError(f"tensors {missing} were never placed")
    return DramPlan(places, top, total, {k: tuple(v) for k, v in life.items()})


def concat_parts(ops: Sequence[Op], shapes: Mapping[str, tuple[int, int, int, int]],
                 inputs: Sequence[str], outputs: Sequence[str],
                 config: HwConfig) -> dict[str, tuple[str, int]]:
    """``{part: (concat output, byte offset)}`` for the parts of every :class:`~.ops.Concat`
    in ``ops``: each lives inside the concat's buffer at its channel offset. Raises
    :class:`CompileError` for a part the layout cannot place there (not produced by an
    operator of the program, a program output of its own, read twice by concats, on a
    channel offset inside a block, in several image blocks, or of another image size)."""
    produced = {op.output for op in ops}
    out: dict[str, tuple[str, int]] = {}
    for op in ops:
        if not isinstance(op, Concat):
            continue
        if config.block_in > config.block_out:
            # the GEMM's input is stored in blocks of block_in, a part's stores write
            # sub-blocks of block_out of its own layout: the parts would not line up
            raise CompileError(f"concat {op.name!r}: a core whose GEMM reads wider blocks "
                               f"({config.block_in} channels) than it stores "
                               f"({config.block_out}) cannot store a concat's inputs in "
                               "place", op=op.name)
        channels = 0
        for part in op.parts:
            n, c, h, w = shapes[part]
            whole = shapes[op.output]
            bad = (part not in produced or part in inputs or part in outputs or part in out
                   or channels % config.block_out or n > config.batch
                   or (n, h, w) != (whole[0], whole[2], whole[3]))
            if bad:
                raise CompileError(f"concat {op.name!r}: its input {part!r} cannot be stored "
                                   "in place (it must be written by an operator of the "
                                   "program, once, at a channel offset that is a multiple of "
                                   f"{config.block_out}, with one image block)", op=op.name)
            out[part] = (op.output, channels // config.block_out * h * w * config.batch
                         * config.block_out * config.out_width // 8)
            channels += c
    for part, (whole, offset) in list(out.items()):
        while whole in out:                     # a concat of concats: the outermost buffer
            whole, outer = out[whole]
            offset += outer
        out[part] = (whole, offset)
    return out


def verify_dram_plan(plan: DramPlan, shapes: Mapping[str, tuple[int, int, int, int]],
                     config: HwConfig) -> None:
    """Check ``plan``: every arena tensor inside the arena, aligned, and no two tensors
    that are live at the same time (lifetimes overlap) share a byte."""
    arena = [(n, p) for n, p in plan.places.items() if n in plan.lifetimes]
    for name, place in arena:
        size = tensor_bytes(shapes[name], config)
        if place.offset % ALIGN or place.offset + size > plan.arena_bytes:
            raise CompileError(f"plan_dram: tensor {name!r} at offset {place.offset} "
                               f"({size} bytes) is misaligned or outside the "
                               f"{plan.arena_bytes}-byte arena")
    for i, (a, pa) in enumerate(arena):
        la, sa = plan.lifetimes[a], tensor_bytes(shapes[a], config)
        for b, pb in arena[i + 1:]:
            lb, sb = plan.lifetimes[b], tensor_bytes(shapes[b], config)
            live_together = la[0] <= lb[1] and lb[0] <= la[1]
            overlap = pa.offset < pb.offset + sb and pb.offset < pa.offset + sa
            if live_together and overlap:
                raise CompileError(f"plan_dram: tensors {a!r} (operators {la[0]}..{la[1]}) and "
                                   f"{b!r} (operators {lb[0]}..{lb[1]}) are live together but "
                                   "share arena bytes")
