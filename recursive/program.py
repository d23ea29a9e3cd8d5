"""One accelerator program per batch of structures: templates instantiated and joined.

:func:`plan_chunks` cuts every batch of the linearization into chunks of at most the
variant's node count; :func:`assemble` lays out the run's DRAM (the model's segments,
the input matrix, one array per state, a scratch area), instantiates the chunks'
templates there and joins them into one instruction stream.

Joining two standalone programs: the first one's FINISH (a compute-module instruction
that waits until every load and store of its program is done) becomes a *carrier* (a
GEMM over no uops, same waits) that also pushes a token to the load module, and a
``LOAD`` no-op popping that token starts the next program. Every module has then
finished the first program before it starts the second (the compute and store modules
in order behind the carrier, the load module behind the no-op), so each template's own
tokens, placed by the compiler for it alone, stay correct. The barrier also orders a
batch's loads of its children's states after the stores of the batch that wrote them.

Instantiation is linear in the number of nodes: each template instruction is copied,
the DMAs re-addressed (:class:`~.template.Reloc`), and each gather placeholder
expanded into one DMA per run of evenly spaced rows (a node's absent child or input
reads one of the zero rows past the end of its array: the chunk's row ``r`` reads zero
row ``r``, so runs stay long).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.config import HwConfig
from tessera.isa import Finish, Gemm, Instruction, Load, MemType, Program, module_of
from tessera.compiler.accel.emit import Emitter, Place
from tessera.compiler.accel.sync import insert_dependency_tokens

from .specialize import Variant
from .template import Template, WeightPlan, relocations

#: Elements of the DRAM arrays a chunk reads and writes, by memory type (one row of
#: ``block`` int8 lanes each: the configs recursive models run on have batch 1).
ROW_TYPES = (MemType.INP, MemType.ACC8, MemType.OUT)


@dataclass(frozen=True)
class Chunk:
    """Nodes ``[start, end)`` of one batch, run by one template of ``variant``."""

    variant: Variant
    start: int
    end: int

    @property
    def n(self) -> int:
        return self.end - self.start


def batch_variant(lin, start: int, end: int) -> Variant:
    return Variant(bool(np.any(lin.children[start:end] >= 0)),
                   bool(np.any(lin.inputs[start:end] >= 0)))


def plan_chunks(lin, sizes) -> list[Chunk]:
    """Every batch cut into chunks of the sizes ``sizes(variant)`` offers (ascending, the
    largest the variant's capacity): full chunks first -- consecutive chunks of one
    template keep its tables, parameters and uops on chip (``Template.resident``) --
    then the rest in the largest sizes that fit."""
    chunks = []
    for start, end in lin.batches:
        variant = batch_variant(lin, start, end)
        offered = sizes(variant)
        at = start
        while at < end:
            n = max(s for s in offered if s <= end - at)
            chunks.append(Chunk(variant, at, at + n))
            at += n
    return chunks


def weight_block(config: HwConfig, weights: WeightPlan, key: str) -> Template:
    """The standalone program loading the matrices of variant ``key`` into the weight
    buffer (every variant's, when they share it)."""
    em = Emitter(config)
    em.add_segment("weights", weights.data)
    tile_bytes = config.block_out * config.block_in
    for mkey, base in weights.bases[key].items():
        t = weights.tiles[mkey]
        place = Place("weights", weights.offsets[mkey] * tile_bytes)
        em.emit(Load(mem=MemType.WGT, sram_base=base, dram_base=em.elem(place, MemType.WGT),
                     y_size=1, x_size=t, x_stride=t))
    program = insert_dependency_tokens(em.finish())
    relocs, segments = relocations(program, f"weights.{key}")
    return Template(Variant(False, False), 0, program.instructions, relocs, segments)


@dataclass
class Layout:
    """Where a run's arrays live: segment element bases and row counts."""

    program: Program
    rows: dict[str, int]          # array ("input", "state:<s>") -> rows before the zeros
    row_bytes: dict[str, int]     # array -> bytes per row (one node's vector or matrix)

    def base(self, segment: str, mem: MemType) -> int:
        return self.program.elem_addr(segment, mem)

    def row_elems(self, array: str, mem: MemType) -> int:
        """Elements of ``mem`` in one row of ``array``."""
        return self.row_bytes[array] // self.program.isa.elem_bytes(mem)


def _runs(index: np.ndarray) -> list[tuple[int, int, int]]:
    """``(first position, length, stride)`` of the maximal runs of evenly spaced values
    (stride >= 1) that cover ``index`` in order."""
    runs, r, n = [], 0, index.size
    while r < n:
        length, stride = 1, 1
        if r + 1 < n and index[r + 1] > index[r]:
            stride = int(index[r + 1] - index[r])
            d = np.diff(index[r:])
            same = np.flatnonzero(d != stride)
            length = int(same[0]) + 1 if same.size else n - r
        runs.append((r, length, stride))
        r += length
    return runs


def _gather(insn: Load, index: np.ndarray, base: int, row_elems: int) -> list[Load]:
    """A gather placeholder as DMAs of rows ``index`` (flags: pops on the first, pushes
    on the last, so the group waits and signals as the placeholder did)."""
    out = []
    for r, length, stride in _runs(index):
        out.append(Load(mem=insn.mem, sram_base=insn.sram_base + r * row_elems,
                        dram_base=base + int(index[r]) * row_elems, y_size=length,
                        x_size=row_elems, x_stride=stride * row_elems))
    out[0] = out[0].replace(pop_prev=insn.pop_prev, pop_next=insn.pop_next)
    out[-1] = out[-1].replace(push_prev=insn.push_prev, push_next=insn.push_next)
    return out


def _gather_index(lin, layout: Layout, chunk: Chunk, array: str, slot: int) -> np.ndarray:
    """The rows of ``array`` a chunk's gather reads (a zero row where there is none)."""
    if array == "input":
        index = lin.inputs[chunk.start:chunk.end]
    else:
        index = lin.children[chunk.start:chunk.end, slot]
    return np.where(index >= 0, index, layout.rows[array] + np.arange(chunk.n))


def instantiate(t: Template, chunk: Chunk | None, lin, layout: Layout, *,
                warm: bool = False) -> list[Instruction]:
    """Template ``t``'s instructions for ``chunk`` (its FINISH last). ``warm``: the chunk
    before ran ``t`` too, so ``t.resident`` loads become no-ops (keeping their tokens)."""
    out: list[Instruction] = []
    for i, insn in enumerate(t.instructions):
        r = t.relocs.get(i)
        if warm and i in t.resident:
            out.append(Load(mem=insn.mem, x_size=0, pop_prev=insn.pop_prev,
                            pop_next=insn.pop_next, push_prev=insn.push_prev,
                            push_next=insn.push_next))
        elif r is None:
            out.append(insn)
        elif r.kind in ("model", "scratch"):
            out.append(insn.replace(dram_base=layout.base(r.segment, insn.mem) + r.offset))
        elif r.kind == "rows":
            array = f"state:{r.segment}"
            out.append(insn.replace(dram_base=layout.base(array, insn.mem)
                                    + chunk.start * layout.row_elems(array, insn.mem)))
        else:
            array = "input" if r.segment == "input" else f"state:{r.segment}"
            index = _gather_index(lin, layout, chunk, array, r.offset)
            out += _gather(insn, index, layout.base(array, insn.mem),
                           layout.row_elems(array, insn.mem))
    return out


def join(blocks_: list[list[Instruction]]) -> list[Instruction]:
    """Standalone programs (each ending with its FINISH) as one, behind barriers. A
    program with no load-module instruction needs no load-side half: nothing of it
    could run ahead of the program before (and a later program's barrier covers it)."""
    out: list[Instruction] = []
    for k, block in enumerate(blocks_):
        *body, finish = block
        out += body
        if k + 1 < len(blocks_):
            loads = any(module_of(i) == "load" for i in blocks_[k + 1])
            out.append(Gemm(uop_begin=0, uop_end=0, pop_prev=finish.pop_prev,
                            pop_next=finish.pop_next, push_prev=loads))
            if loads:
                out.append(Load(mem=MemType.INP, x_size=0, pop_next=True))
        else:
            out.append(finish)
    assert isinstance(out[-1], Finish)
    return out


def layout_run(config: HwConfig, templates: list[Template], weights: WeightPlan,
               arrays: dict[str, tuple[np.ndarray, int, int]], scratch: int) -> Layout:
    """The run's program without instructions: ``weights``, the templates' segments,
    then each array (``name -> (packed bytes, bytes per row, rows before the zero
    rows)``) and ``scratch`` bytes."""
    prog = Program(config)
    prog.add_segment("weights", weights.data)
    seen: set[str] = set()
    for t in templates:
        for name, data in t.segments.items():
            if name not in seen:
                seen.add(name)
                prog.add_segment(name, data)
    rows, elems = {}, {}
    for name, (data, row_bytes, count) in arrays.items():
        prog.add_segment(name, data)
        rows[name], elems[name] = count, row_bytes
    if scratch:
        prog.add_segment("scratch", scratch)
    return Layout(prog, rows, elems)

