"""``compile_recursive``: a cell quantized and lowered into per-variant templates, and the
:class:`RecursiveModel` that turns a batch of structures into accelerator programs.

Compilation is once per model: quantization from the calibration structures, the
int8 matrices packed into the weight buffer's tiles, and (on first use of each) a
template per variant and chunk size. A batch of structures then costs only host work
linear in its nodes: the linearizer (:mod:`.structure`), the chunk plan and the
instantiation of the templates (:mod:`.program`).

Launch granularities (``launches``): ``"tree"`` -- one program for the whole batch of
structures (ours); ``"batch"`` -- one program per batch of independent nodes (dynamic
batching without fusion); ``"node"`` -- one program per node (a framework calling a
kernel per node). All three compute the same values; only launches and weight reloads
differ.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tessera.config import HwConfig, get_config
from tessera.errors import PYTHON, CompileError
from tessera.isa import Program
from tessera.compiler.accel.layout import pack_weights

from .cell import Cell
from .program import (Chunk, Layout, batch_variant, instantiate, join, layout_run,
                      plan_chunks, weight_block)
from .matrix import T
from .quantize import QuantizedCell, quantize_cell
from .specialize import Specialized, Variant, specialize
from .structure import Linearized, linearize
from .template import Template, TemplateBuilder, WeightPlan, blocks, matrix_key

#: Most nodes one chunk of a template computes (past this the per-chunk cost is
#: negligible and smaller chunks keep the accumulator free for the parameters).
MAX_CHUNK = 64
VARIANTS = tuple(Variant(c, x) for c in (False, True) for x in (False, True))
LAUNCHES = ("tree", "batch", "node")


def _check_config(config: HwConfig) -> None:
    if config.batch != 1 or config.block_in != config.block_out or config.inp_width != 8 \
            or config.out_width != 8:
        raise CompileError(f"recursive models need a config with batch 1, int8 inputs and "
                           f"outputs and block_in == block_out (a node's state is one row "
                           f"the DMA gathers); {config.name!r} has batch {config.batch}, "
                           f"blocks {config.block_in}x{config.block_out}")
    if not config.table_entries:
        raise CompileError(f"recursive models run sigmoid and tanh through the LUT intrinsic; "
                           f"config {config.name!r} has no table memory (table_entries = 0)")


def plan_weights(config: HwConfig, specs: dict[str, Specialized]) -> WeightPlan:
    """Every variant's matrices packed in tiles; one weight-buffer layout for all the
    variants when they fit together, else one per variant (loaded when it starts), and
    a variant whose matrices do not fit the buffer at all streams them per chunk."""
    order: dict[bytes, np.ndarray] = {}
    used: dict[str, list[bytes]] = {}
    for key, spec in specs.items():
        mats = [w for v in spec.values if v.kind in ("linear", "mlinear") for w in v.terms]
        used[key] = list(dict.fromkeys(matrix_key(w) for w in mats))
        for w in mats:
            order.setdefault(matrix_key(w), w)
    packed = {k: pack_weights(w, config).reshape(-1, config.block_out * config.block_in)
              for k, w in order.items()}
    offsets, tiles, at = {}, {}, 0
    for k, p in packed.items():
        offsets[k], tiles[k], at = at, p.shape[0], at + p.shape[0]
    data = (np.concatenate(list(packed.values())) if packed
            else np.zeros((1, config.block_out * config.block_in), np.int8))
    shared = at <= config.wgt_depth
    bases: dict[str, dict[bytes, int]] = {}
    streamed: set[str] = set()
    for key, keys in used.items():
        starts = np.cumsum([0] + [tiles[k] for k in keys])
        if shared:
            bases[key] = {k: offsets[k] for k in keys}
        elif starts[-1] <= config.wgt_depth:
            bases[key] = dict(zip(keys, (int(s) for s in starts[:-1])))
        else:                       # streamed through the buffer by the template
            bases[key] = {}
            streamed.add(key)
    if shared:
        bases["all"] = {k: offsets[k] for k in order}
    return WeightPlan(data.astype(np.int8), offsets, tiles, bases, shared, streamed)


@dataclass
class RecursiveModel:
    """A compiled recursive model for one config: its int8 cell, weights and templates."""

    cell: Cell
    quantized: QuantizedCell
    config: HwConfig
    specs: dict[str, Specialized]
    weights: WeightPlan
    #: The float input matrix the nodes' input indices select rows of when a run gives
    #: none (a vocabulary's embeddings), kept with the model.
    embeddings: np.ndarray | None = None
    _embeddings_q: np.ndarray | None = field(default=None, repr=False)
    _templates: dict[tuple[str, int], Template] = field(default_factory=dict)
    _capacity: dict[str, int] = field(default_factory=dict)
    _blocks: dict[str, Template] = field(default_factory=dict)
    #: Per device: the model's segments already written to it (:func:`.run.run`); a
    #: device that is gone drops out.
    device_buffers: weakref.WeakKeyDictionary = field(
        default_factory=weakref.WeakKeyDictionary, repr=False)

    @property
    def embeddings_q(self) -> np.ndarray | None:
        """The embeddings in int8 (quantized once)."""
        if self._embeddings_q is None and self.embeddings is not None:
            self._embeddings_q = self.quantized.quantize_inputs(self.embeddings)
        return self._embeddings_q

    # ------------------------------------------------------------ templates
    def template(self, variant: Variant, n: int) -> Template:
        """The template of ``variant`` for ``n`` nodes (compiled on first use, then kept)."""
        key = (variant.key, n)
        if key not in self._templates:
            self._templates[key] = TemplateBuilder(
                self.specs[variant.key], variant, n, self.config, self.weights,
                f"{self.cell.name}.{variant.key}.n{n}").build()
        return self._templates[key]

    def capacity(self, variant: Variant) -> int:
        """Most nodes one chunk of ``variant`` computes on this config."""
        if variant.key not in self._capacity:
            try:
                one = self.template(variant, 1).footprint
            except CompileError as exc:
                raise CompileError(
                    f"{self.cell.name} does not fit config {self.config.name!r} even one node "
                    f"per chunk ({variant.key} nodes): {exc}",
                    fix={PYTHON: "use a smaller hidden size, or a config with larger buffers "
                                 "(compile_recursive(cell, config=...))"}) from None
            room = self.config.acc_depth - one.param_rows
            n = min(MAX_CHUNK, room // max(1, one.acc_rows),
                    self.config.inp_depth // max(1, one.inp_entries))
            while n > 1:
                try:
                    self.template(variant, n)
                    break
                except CompileError:
                    n //= 2
            self._capacity[variant.key] = max(1, n)
        return self._capacity[variant.key]

    def sizes(self, variant: Variant) -> list[int]:
        """The chunk sizes of ``variant``: its capacity and the powers of two below, every
        template compiled when the variant is first met -- so a new batch of structures
        compiles nothing, whatever its batches' sizes."""
        cap = self.capacity(variant)
        offered = sorted({cap} | {1 << k for k in range(cap.bit_length()) if 1 << k < cap})
        for n in offered:
            self.template(variant, n)
        return offered

    def weight_block(self, key: str) -> Template:
        if key not in self._blocks:
            self._blocks[key] = weight_block(self.config, self.weights, key)
        return self._blocks[key]

    # ------------------------------------------------------------------ runs
    def linearize(self, structures: Sequence[object]) -> Linearized:
        return linearize(structures, kind=self.cell.kind, max_children=self.cell.max_children)

    def chunks(self, lin: Linearized, launches: str = "tree") -> list[list[Chunk]]:
        """The chunks of each launch, for the launch granularity ``launches``."""
        if launches not in LAUNCHES:
            raise CompileError(f"launches must be one of {', '.join(LAUNCHES)}, not {launches!r}")
        if launches == "node":
            return [[Chunk(batch_variant(lin, i, i + 1), i, i + 1)]
                    for i in range(lin.num_nodes)]
        chunks = plan_chunks(lin, self.sizes)
        if launches == "tree":
            return [chunks]
        groups: dict[int, list[Chunk]] = {}
        starts = [s for s, _ in lin.batches]
        for c in chunks:
            groups.setdefault(int(np.searchsorted(starts, c.start, side="right")), []).append(c)
        return list(groups.values())

    def arrays(self, lin: Linearized, inputs_q: np.ndarray | None) -> dict[str, tuple]:
        """The run's DRAM arrays: the int8 input matrix and a zeroed array per state, each
        followed by a chunk's worth of zero rows (what absent inputs and children read)."""
        zeros = max([MAX_CHUNK] + list(self._capacity.values()))
        out = {}
        if inputs_q is not None:
            out["input"] = self._packed(inputs_q, zeros)
        for s, e in self.cell.states.items():
            row_bytes = e.rows * blocks(self.config, e.width) * self.config.block_out
            for form in ("", T) if e.rows > 1 else ("",):
                out[f"state:{s}{form}"] = (np.zeros((lin.num_nodes + zeros, row_bytes), np.int8),
                                           row_bytes, lin.num_nodes)
        return out

    def _packed(self, rows: np.ndarray, zeros: int) -> tuple[np.ndarray, int, int]:
        row_bytes = blocks(self.config, rows.shape[1]) * self.config.block_out
        data = np.zeros((rows.shape[0] + zeros, row_bytes), np.int8)
        data[:rows.shape[0], :rows.shape[1]] = rows
        return data, row_bytes, rows.shape[0]

    def programs(self, lin: Linearized, inputs_q: np.ndarray | None,
                 launches: str = "tree") -> tuple[list[Program], Layout]:
        """The programs of a run (one for ``"tree"``) sharing one DRAM layout."""
        groups = self.chunks(lin, launches)
        used = {(c.variant.key, c.n): self.template(c.variant, c.n) for g in groups for c in g}
        wkeys = ["all"] if self.weights.shared else sorted({k for k, _ in used})
        wblocks = [self.weight_block(k) for k in wkeys]
        layout = layout_run(self.config, wblocks + list(used.values()), self.weights,
                            self.arrays(lin, inputs_q), max(t.scratch for t in used.values()))
        programs = []
        for group in groups:
            insns = join(self._blocks_of(group, lin, layout))
            programs.append(Program(self.config, insns, layout.program.segments))
        return programs, layout

    def _blocks_of(self, group: list[Chunk], lin: Linearized, layout: Layout) -> list[list]:
        """Each launch loads its weights (a launch keeps nothing on chip from the last)."""
        out, loaded, last = [], None, None
        for c in group:
            key = "all" if self.weights.shared else c.variant.key
            if key != loaded:
                out.append(instantiate(self.weight_block(key), None, lin, layout))
                loaded = key
            t = self.template(c.variant, c.n)
            out.append(instantiate(t, c, lin, layout, warm=t is last))
            last = t
        return out


def check_matrix(cell: Cell, matrix, error: type, where: str) -> np.ndarray:
    """``matrix`` as a float input matrix of ``cell`` (numeric, one row of width
    ``cell.embed`` per input index, finite); else ``error`` naming ``where``."""
    try:
        m = np.asarray(matrix, dtype=np.float64)
    except (TypeError, ValueError):
        raise error(f"{cell.name} ({where}): the input matrix is not numeric") from None
    if m.ndim != 2 or m.shape[1] != cell.embed:
        raise error(f"{cell.name} ({where}): the input matrix has shape {m.shape}; each row "
                    f"must be one node input of width {cell.embed}")
    if not np.all(np.isfinite(m)):
        raise error(f"{cell.name} ({where}): the input matrix holds NaN or infinite values "
                    f"(row {int(np.flatnonzero(~np.isfinite(m).all(axis=1))[0])})")
    return m


def check_rows(cell: Cell, lin: Linearized, rows: int | None, error: type, where: str,
               missing: str = "") -> None:
    """Every input index of ``lin`` selects one of ``rows`` rows (``None``: no matrix, a
    ``missing`` matrix: what to pass)."""
    used = np.flatnonzero(lin.inputs >= 0)
    if not cell.embed or not used.size:
        return
    if rows is None:
        raise error(f"{cell.name} ({where}): the structures' nodes read inputs but there is "
                    "no input matrix", fix={PYTHON: missing or "pass the float input matrix "
                                                               "(one row per input index)"})
    past = used[lin.inputs[used] >= rows]
    if past.size:
        i = int(past[0])
        raise error(f"{cell.name} ({where}): node {int(lin.source_index[i])} of structure "
                    f"{int(lin.structure[i])} reads input row {int(lin.inputs[i])} but the "
                    f"input matrix has {rows} rows")


def input_matrix(cell: Cell, lin: Linearized, matrix, error: type, where: str,
                 missing: str = "") -> np.ndarray | None:
    """``matrix`` checked as the float input matrix the nodes of ``lin`` read rows of
    (``None`` when the cell reads no input: the structures' input indices are ignored);
    problems raise ``error`` (CompileError while calibrating, RunError on a run), naming
    ``where``, the structure and the node."""
    if not cell.embed:
        return None
    m = None if matrix is None else check_matrix(cell, matrix, error, where)
    check_rows(cell, lin, None if m is None else m.shape[0], error, where, missing)
    return m


def compile_recursive(cell: Cell, config: str | HwConfig | None = None, *,
                      calibration: Sequence[tuple[Sequence[object], np.ndarray | None]],
                      embeddings: np.ndarray | None = None) -> RecursiveModel:
    """Quantize ``cell`` on ``calibration`` (``(structures, float input matrix)`` pairs,
    the matrix ``None`` to use ``embeddings``) and prepare it for ``config``."""
    cfg = get_config(config)
    _check_config(cfg)
    if embeddings is not None and cell.embed:
        embeddings = check_matrix(cell, embeddings, CompileError, "embeddings")
    samples = []
    for k, (structures, x) in enumerate(calibration):
        lin = linearize(structures, kind=cell.kind, max_children=cell.max_children)
        samples.append((lin, input_matrix(
            cell, lin, embeddings if x is None else x, CompileError, f"calibration batch {k}",
            "give each calibration batch its input matrix, calibration=[(structures, "
            "matrix)], or the model's embeddings=")))
    q = quantize_cell(cell, samples)
    specs = {v.key: specialize(q, v) for v in VARIANTS}
    return RecursiveModel(cell, q, cfg, specs, plan_weights(cfg, specs), embeddings)
