"""Program templates: a chunk of ``n`` nodes of one variant, lowered once per model.

A template is a standalone program with its dependency tokens (the compiler's own pass,
:func:`~tessera.compiler.accel.sync.insert_dependency_tokens`) whose DRAM addresses
point at *placeholder* segments: ``gather:<source>:<slot>`` (the rows a chunk reads:
node inputs or children's states, one row per node), ``out:<state>`` (the rows it
writes) and ``scratch``. :mod:`.program` instantiates it per chunk by rewriting those
addresses from the linearizer's index arrays -- a placeholder gather becomes one DMA per
run of evenly spaced rows -- so a new structure costs no compilation.

The chunk's data path, per :class:`~.specialize.Value` in order:

* gathers: ``LOAD inp`` for rows a GEMM reads, ``LOAD acc8`` for rows the ALU reads;
* a linear map: its rows start at the bias (ALU MOV), one GEMM per term (weights
  resident, or streamed through the buffer when they do not fit: :class:`WeightPlan`),
  then REQUANT and either the fused LUT or a clamp;
* an ALU operation: in place of its first operand when nothing else reads that (else a
  MOV of it), the op with the second (rescaled into scratch rows for ``+``/``-`` unless
  it shares the sum's scale), REQUANT, clamp; sigmoid/tanh: MOV and LUT;
* matrix values (MV-RNN): :mod:`.matrix`;
* a computed value a GEMM reads is stored to ``scratch`` and loaded into the input
  buffer (there is no on-chip path from the accumulator to the GEMM's input);
* each state's rows are stored at the end.

Accumulator rows are allocated with liveness (a value's rows are reused once its last
reader is emitted); the epilogue parameters of every value sit at the top.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tessera import timing
from tessera.config import HwConfig
from tessera.errors import CompileError
from tessera.isa import Gemm, Instruction, Load, MemType, Store, clip_imm
from tessera.compiler.accel.acctile import alu_insn
from tessera.compiler.accel.emit import Emitter, Place
from tessera.compiler.accel.epilogue import (EpiloguePlan, EpStep, param_rows_data,
                                             plan_epilogue, tile_alu, emit_epilogue)
from tessera.compiler.accel.layout import ceil_div
from tessera.compiler.accel.nest import dim, map_nest
from tessera.compiler.accel.ops import Apply, Bias, Clip, Requant
from tessera.compiler.accel.sync import insert_dependency_tokens

from .matrix import T, MatrixLowering
from .specialize import Specialized, Value, Variant

INT32 = (-(1 << 31), (1 << 31) - 1)
#: The REQUANT multiplier that leaves values unchanged (its step is skipped).
UNIT = 1.0


@dataclass
class WeightPlan:
    """Where every int8 matrix lives: its tiles in the ``weights`` segment and its first
    entry in the weight buffer (per variant: the variants' sets are loaded in turn when
    they do not fit together)."""

    data: np.ndarray                       # every matrix's tiles, concatenated
    offsets: dict[bytes, int]              # matrix key -> first tile in ``data``
    tiles: dict[bytes, int]                # matrix key -> tile count
    bases: dict[str, dict[bytes, int]]     # variant key -> matrix key -> weight-buffer entry
    shared: bool                           # one set for all variants (loaded once)
    #: Variants whose matrices do not fit the buffer: each chunk streams them through
    #: two alternating regions, a piece (a term's rows of output blocks) at a time.
    streamed: set[str] = field(default_factory=set)


def matrix_key(w: np.ndarray) -> bytes:
    return w.shape[0].to_bytes(4, "little") + w.tobytes()


@dataclass
class Reloc:
    """How instantiation rewrites one DMA of a template (see the module doc)."""

    kind: str          # "model" | "gather" | "rows" | "scratch"
    segment: str       # model: run segment name; gather: "input" or a state; rows: state
    offset: int = 0    # element offset inside the segment (model, scratch); gather: slot


@dataclass(frozen=True)
class Footprint:
    """On-chip space a template takes: accumulator rows for values (they scale with the
    chunk's node count), rows of epilogue parameters (they do not), input-buffer entries
    (they scale)."""

    acc_rows: int
    param_rows: int
    inp_entries: int


@dataclass
class Template:
    """One variant's chunk program for ``n`` nodes, with its relocations."""

    variant: Variant
    n: int
    instructions: list[Instruction]
    relocs: dict[int, Reloc]
    #: Model-level segment data the template reads (its uops, parameters, tables).
    segments: dict[str, np.ndarray] = field(default_factory=dict)
    footprint: "Footprint | None" = None
    #: Bytes of the ``scratch`` area its spills use.
    scratch: int = 0
    #: Loads a chunk may skip when the chunk before it ran the same template: its uop
    #: kernels, epilogue parameters, lookup tables and constant rows are still on chip
    #: (nothing the template runs overwrites them; tables only when they all fit the
    #: table memory at once).
    resident: frozenset[int] = frozenset()


class _Acc:
    """First-fit allocation of accumulator rows below ``limit``."""

    def __init__(self, limit: int) -> None:
        self.free: list[tuple[int, int]] = [(0, limit)]
        self.peak = 0

    def take(self, rows: int, what: str) -> int:
        for k, (base, size) in enumerate(self.free):
            if size >= rows:
                self.free[k] = (base + rows, size - rows)
                self.peak = max(self.peak, base + rows)
                return base
        raise CompileError(f"{what}: the accumulator has no {rows} free rows left")

    def give(self, base: int, rows: int) -> None:
        self.free.append((base, rows))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for b, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == b:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            elif s:
                merged.append((b, s))
        self.free = merged


def wrap_rows(rows: np.ndarray, config: HwConfig) -> np.ndarray:
    """Tile-blocked int rows as accumulator parameter rows ``(rows, batch, lanes)``."""
    return np.asarray(rows, dtype=np.int32).reshape(-1, config.batch, config.block_out)


def blocks(config: HwConfig, width: int) -> int:
    """Elements (accumulator rows, buffer entries) of one node's ``width``-vector."""
    return ceil_div(width, config.block_out)


class TemplateBuilder(MatrixLowering):
    """Lowers one :class:`~.specialize.Specialized` cell for a chunk of ``n`` nodes."""

    def __init__(self, spec: Specialized, variant: Variant, n: int, config: HwConfig,
                 weights: WeightPlan, name: str) -> None:
        self.spec, self.variant, self.n, self.c = spec, variant, n, config
        self.weights = weights
        self.name = name
        self.em = Emitter(config)
        self.imm_bits = self.em.isa.imm_bits
        self.plans: dict[int, list[EpiloguePlan]] = {}
        self.param_at: dict[int, tuple[int, list[int]]] = {}   # id(plan) -> base, starts
        self.acc_of: dict[int, int] = {}                        # id(value) -> first row
        self.inp_of: dict[int, int] = {}                        # id(value) -> first entry
        #: Matrix values: the accumulator rows of the M^T orientation, the weight-buffer
        #: regions of gathered matrices (by orientation), the composition weights' rows in
        #: the input buffer, the parameter rows each orientation starts from.
        self.acc_t: dict[int, int] = {}
        self.wgt_of: dict[tuple[int, str], int] = {}
        self.const_inp: dict[tuple[int, int], int] = {}
        self.matrix_rows_at: dict[int, list[int]] = {}
        bases = weights.bases["all" if weights.shared else variant.key]
        self.wgt_top = max((b + weights.tiles[k] for k, b in bases.items()), default=0)
        self.pieces = 0             # streamed weight pieces so far (they alternate halves)
        self.readers = self._readers()
        self._segments()

    # ----------------------------------------------------------------- setup
    def _readers(self) -> dict[int, list[Value]]:
        readers: dict[int, list[Value]] = {id(v): [] for v in self.spec.values}
        for v in self.spec.values:
            for a in v.args:
                readers[id(a)].append(v)
        return readers

    def _segments(self) -> None:
        em, n = self.em, self.n
        em.add_segment("weights", self.weights.data)
        for v in self.spec.values:
            if v.kind == "gather" and v.rows > 1:
                self.matrix_segments(v)
            elif v.kind == "gather":
                em.add_segment(f"gather:{v.source}:{v.slot}", self.rows(v) * self.c.block_out)
        for s, v in self.spec.states.items():
            for form in ("", T) if v.rows > 1 else ("",):
                em.add_segment(f"out:{s}{form}", self.rows(v) * self.c.block_out)
        spill = sum(n * blocks(self.c, v.width) * self.c.block_out
                    for v in self.spec.values if self._spilled(v))
        if spill:
            em.add_segment("scratch", spill)

    def rows(self, v: Value) -> int:
        """Accumulator rows (buffer entries) of ``v`` over the chunk."""
        return self.n * v.rows * blocks(self.c, v.width)

    def _gemm_read(self, v: Value) -> bool:
        return any(r.kind in ("linear", "matvec") for r in self.readers[id(v)])

    def _alu_read(self, v: Value) -> bool:
        return any(r.kind == "alu" for r in self.readers[id(v)]) or (
            v in self.spec.states.values())

    def _spilled(self, v: Value) -> bool:
        return v.kind != "gather" and self._gemm_read(v)

    def _needs_clamp(self, v: Value) -> bool:
        """Whether ``v``'s rows must be clamped to int8 in the accumulator: an ALU reader
        other than a table lookup (which saturates its input itself) would see them."""
        return any(r.kind == "alu" and r.op not in ("sigmoid", "tanh")
                   for r in self.readers[id(v)])

    # -------------------------------------------------------------- planning
    def _clamp_step(self) -> EpStep:
        return EpStep("alu", "CLIP", imm=clip_imm(-128, 127, self.imm_bits))

    def _plan(self, stages: tuple, v: Value, *, init: bool = False,
              acc_range: tuple[int, int] = INT32) -> EpiloguePlan:
        return plan_epilogue(stages, channels=v.width, config=self.c, acc_range=acc_range,
                             init_bias=init, where=f"{self.name}: {v.label}")

    def _lut(self, table: np.ndarray) -> Apply:
        return Apply("LUT", table=table, out_range=(int(table.min()), int(table.max())),
                     saturates=(-128, 127))

    def _requant(self, m: float) -> tuple:
        return () if m == UNIT else (Requant(m),)

    def _gemm_range(self, v: Value) -> tuple[int, int]:
        """Bounds of a linear map's int32 sum (int8 operands, its bias)."""
        reach = sum(w.shape[1] * 128 * 128 for w in v.terms)
        return (int(v.bias.min()) - reach, int(v.bias.max()) + reach)

    def plans_of(self, v: Value) -> list[EpiloguePlan]:
        """The epilogue plans of ``v``: one, or for ``+``/``-`` the two operands' rescales
        and the result's clamp. The last plan clamps to int8 when a reader needs it."""
        if v.rows > 1:               # a matrix: only stored (its start rows: matrix_params)
            return [self._plan(self._requant(v.multipliers[0]) if v.multipliers else (), v)]
        if v.kind == "const":
            return [self._plan((Bias(v.const),), v, init=True, acc_range=(0, 0))]
        if v.kind == "matvec":
            plans = [self._plan((Bias(np.zeros(v.width, np.int64)),)
                                + self._requant(v.multipliers[0]), v, init=True)]
            if self._needs_clamp(v):
                plans[-1].steps.append(self._clamp_step())
            return plans
        if v.kind == "linear":
            stages = (Bias(v.bias),) + self._requant(v.multipliers[0]) + (
                (self._lut(v.table),) if v.table is not None else ())
            plans = [self._plan(stages, v, init=True, acc_range=self._gemm_range(v))]
        elif v.op in ("sigmoid", "tanh"):
            plans = [self._plan((self._lut(v.table),), v)]
        elif v.op in ("add", "sub"):
            plans = [self._plan(self._requant(m), v) for m in v.multipliers] + [EpiloguePlan()]
        elif v.op == "relu":
            plans = [self._plan((Clip(0, None),) + self._requant(v.multipliers[0]), v)]
        else:                                   # mul, rescale
            plans = [self._plan(self._requant(v.multipliers[0]), v)]
        if v.table is None and self._needs_clamp(v):
            plans[-1].steps.append(self._clamp_step())
        return plans

    def _load_params(self) -> int:
        """Plan every value, load all their parameter rows at the top of the accumulator
        (one LOAD); returns the first parameter row."""
        chunks, at = [], 0
        for v in self.spec.values:
            if v.kind == "gather":
                continue
            self.plans[id(v)] = self.plans_of(v)
            for p in self.plans[id(v)]:
                data, starts = param_rows_data(p, blocks(self.c, v.width), self.c)
                self.param_at[id(p)] = (at, starts)
                chunks.append(data)
                at += data.shape[0]
            if v.rows > 1:
                self.check_matrix(v)
                self.matrix_rows_at[id(v)] = []
                for rows in self.matrix_params(v):
                    self.matrix_rows_at[id(v)].append(at)
                    chunks.append(wrap_rows(rows, self.c))
                    at += rows.shape[0]
        top = self.c.acc_depth - at
        self.param_at = {k: (top + b, s) for k, (b, s) in self.param_at.items()}
        self.matrix_rows_at = {k: [top + b for b in v] for k, v in self.matrix_rows_at.items()}
        if at:
            seg = self.em.add_segment("params", np.concatenate(chunks))
            self.em.emit(Load(mem=MemType.ACC, sram_base=top, dram_base=self.em.elem(
                Place(seg), MemType.ACC), y_size=1, x_size=at, x_stride=at))
        return top

    # -------------------------------------------------------------- emission
    def _apply_plan(self, p: EpiloguePlan, v: Value, base: int, *, init: bool = False) -> None:
        """The plan's steps (or its initialising MOV) over ``v``-shaped rows at ``base``."""
        pbase, starts = self.param_at[id(p)]
        p.table_bases = [self.em.table_base(t) for t in p.tables]
        # A matrix's rows count as "pixels" of the tile: its plans are per tensor.
        args = dict(acc_base=base, nb_n=self.n, ob_n=blocks(self.c, v.width), pixels=v.rows, ob0=0,
                    param_base=pbase, param_starts=starts, where=f"{self.name}: {v.label}")
        if init:
            self.em.emit(tile_alu(self.em, p, p.init, **args))
        else:
            emit_epilogue(self.em, p, scratch_base=0, residual_loads=None, **args)

    def _rows_op(self, op: str, dst: int, src: int, rows: int, v: Value) -> None:
        self.em.emit(alu_insn(self.em, op, [dim("rows", rows, dst=1, src=1)], (dst, src),
                              use_imm=False, where=f"{self.name}: {v.label}"))

    def _gather_dma(self, v: Value, mem: MemType, sram_base: int) -> Load:
        seg = f"gather:{v.source}:{v.slot}"
        r = self.rows(v)
        return Load(mem=mem, sram_base=sram_base, dram_base=self.em.elem(Place(seg), mem),
                    y_size=1, x_size=r, x_stride=r)

    def _emit_gathers(self, acc: _Acc, inp: list[int]) -> None:
        for v in self.spec.values:
            if v.kind != "gather":
                continue
            if v.rows > 1:
                self.matrix_gather(v, inp)
                continue
            if self._gemm_read(v):
                self.inp_of[id(v)] = self._take_inp(inp, v)
                self.em.emit(self._gather_dma(v, MemType.INP, self.inp_of[id(v)]))
            if self._alu_read(v):
                self.acc_of[id(v)] = acc.take(self.rows(v), f"{self.name}: {v.label}")
                self.em.emit(self._gather_dma(v, MemType.ACC8, self.acc_of[id(v)]))

    def _take_inp(self, inp: list[int], v: Value) -> int:
        base = inp[0]
        inp[0] += self.rows(v)
        if inp[0] > self.c.inp_depth:
            raise CompileError(f"{self.name}: the chunk's GEMM inputs need {inp[0]} input-buffer "
                               f"entries; config {self.c.name!r} has {self.c.inp_depth}")
        return base

    def _emit_linear(self, v: Value, base: int) -> None:
        (plan,) = self.plans[id(v)]
        self._apply_plan(plan, v, base, init=True)
        ob = blocks(self.c, v.width)
        wbases = self.weights.bases[self.variant.key]
        for w, a in zip(v.terms, v.args):
            ib = blocks(self.c, a.width)
            if self.variant.key in self.weights.streamed:
                self._stream_term(v, w, ob, ib, (base, self.inp_of[id(a)]))
            else:
                self._emit_gemm(v, ob, ib, (base, self.inp_of[id(a)], wbases[matrix_key(w)]))
        self._apply_plan(plan, v, base)

    def _stream_term(self, v: Value, w: np.ndarray, ob: int, ib: int,
                     base: tuple[int, int]) -> None:
        """A term whose matrix is not resident: pieces of output blocks loaded into two
        alternating halves of the free weight buffer, each followed by its GEMM (the
        dependency tokens let a piece's load overlap the GEMM of the piece before)."""
        half = (self.c.wgt_depth - self.wgt_top) // 2
        per = half // ib
        if per < 1:
            raise CompileError(f"{self.name}: {v.label} streams its weights through "
                               f"{half}-tile halves of the weight buffer; a row of {ib} tiles "
                               f"does not fit (config {self.c.name!r})")
        key, tile_bytes = matrix_key(w), self.c.block_out * self.c.block_in
        for ob0 in range(0, ob, per):
            ob1 = min(ob, ob0 + per)
            region = self.wgt_top + (self.pieces % 2) * half
            self.pieces += 1
            count = (ob1 - ob0) * ib
            place = Place("weights", (self.weights.offsets[key] + ob0 * ib) * tile_bytes)
            self.em.emit(Load(mem=MemType.WGT, sram_base=region, dram_base=self.em.elem(
                place, MemType.WGT), y_size=1, x_size=count, x_stride=count))
            self._emit_gemm(v, ob, ib, (base[0] + ob0, base[1], region), extent=ob1 - ob0)

    def _emit_gemm(self, v: Value, ob: int, ib: int, base: tuple[int, int, int],
                   node_wgt: int = 0, extent: int | None = None) -> None:
        """``acc[node][ob] += inp[node][ib] . wgt[ob][ib]`` over the chunk: one GEMM, or,
        when the chunk has fewer rows than the pipeline's write-to-read distance (the
        sum's steps would follow each other too closely on one row), one GEMM per input
        block (an instruction drains its pipeline before the next starts)."""
        extent = ob if extent is None else extent
        rows = [dim("node", self.n, dst=ob, src=ib, wgt=node_wgt),
                dim("ob", extent, dst=1, wgt=ib)]
        distance = timing.gemm_hazard_distance()
        if self.n * extent >= distance:
            nests = [(rows + [dim("ib", ib, src=1, wgt=1)], base)]
        else:
            nests = [(rows, (base[0], base[1] + k, base[2] + k)) for k in range(ib)]
        for dims, b0 in nests:
            self.gemm(dims, b0, v)

    def gemm(self, dims: list, base: tuple[int, int, int], v: Value) -> None:
        """One GEMM instruction over ``dims`` from ``base`` (dst, src, wgt)."""
        nest = map_nest(dims, base, kind="gemm", isa=self.em.isa,
                        distance=timing.gemm_hazard_distance(), where=f"{self.name}: {v.label}")
        b, e = self.em.kernel(nest.uops)
        self.em.emit(Gemm(uop_begin=b, uop_end=e, **nest.fields("gemm")))

    _key = staticmethod(matrix_key)

    def _emit_alu(self, v: Value, base: int, acc: _Acc, *, in_place: bool) -> None:
        """``v`` on the ALU into ``base``; ``in_place``: ``base`` already holds the first
        operand (its rows, which nothing else reads, became ``v``'s)."""
        rows, plans = self.rows(v), self.plans[id(v)]
        if not in_place:
            self._rows_op("MOV", base, self.acc_of[id(v.args[0])], rows, v)
        if v.op in ("add", "sub"):
            self._apply_plan(plans[0], v, base)
            other = self.acc_of[id(v.args[1])]
            if plans[1].steps:           # the second operand rescaled in scratch rows
                tmp = acc.take(rows, f"{self.name}: {v.label}")
                self._rows_op("MOV", tmp, other, rows, v)
                self._apply_plan(plans[1], v, tmp)
                self._rows_op(v.op.upper(), base, tmp, rows, v)
                acc.give(tmp, rows)
            else:
                self._rows_op(v.op.upper(), base, other, rows, v)
        elif v.op == "mul":
            self._rows_op("MUL", base, self.acc_of[id(v.args[1])], rows, v)
        self._apply_plan(plans[-1], v, base)

    def _spill(self, v: Value, scratch: list[int], inp: list[int]) -> None:
        """Store ``v``'s rows and load them into the input buffer for the GEMMs that read it."""
        r = self.rows(v)
        place = Place("scratch", scratch[0] * self.c.block_out)
        scratch[0] += r
        self.em.emit(Store(mem=MemType.OUT, sram_base=self.acc_of[id(v)],
                           dram_base=self.em.elem(place, MemType.OUT), y_size=1, x_size=r,
                           x_stride=r))
        self.inp_of[id(v)] = self._take_inp(inp, v)
        self.em.emit(Load(mem=MemType.INP, sram_base=self.inp_of[id(v)],
                          dram_base=self.em.elem(place, MemType.INP), y_size=1, x_size=r,
                          x_stride=r))

    def _emit_values(self, acc: _Acc, inp: list[int]) -> None:
        pending = {id(v): len(self.readers[id(v)]) for v in self.spec.values}
        stored = {id(v) for v in self.spec.states.values()}
        scratch = [0]
        for v in self.spec.values:
            if v.rows > 1 and v.kind != "gather":
                self._emit_matrix(v, acc, inp)
            elif v.kind != "gather":
                in_place = self._takes_over(v, stored)
                base = self.acc_of[id(v)] = (
                    self.acc_of.pop(id(v.args[0])) if in_place
                    else acc.take(self.rows(v), f"{self.name}: {v.label}"))
                if v.kind == "matvec":
                    self.emit_matvec(v, base)
                elif v.kind == "const":
                    self._apply_plan(self.plans[id(v)][0], v, base, init=True)
                elif v.kind == "linear":
                    self._emit_linear(v, base)
                else:
                    self._emit_alu(v, base, acc, in_place=in_place)
                if self._spilled(v):
                    self._spill(v, scratch, inp)
            for a in v.args:
                pending[id(a)] -= 1
                if not pending[id(a)] and id(a) not in stored:
                    for regions in (self.acc_of, self.acc_t):
                        if id(a) in regions:
                            acc.give(regions[id(a)], self.rows(a))

    def _takes_over(self, v: Value, stored: set[int]) -> bool:
        """Whether ALU value ``v`` can compute in its first operand's rows: ``v`` is that
        operand's only reader (so its rows are free after) and the operand is no state."""
        if v.kind != "alu" or not v.args:
            return False
        a = v.args[0]
        return (id(a) in self.acc_of and id(a) not in stored and a.rows == 1
                and all(r is v for r in self.readers[id(a)]) and not self._gemm_read(a)
                and all(b is not a for b in v.args[1:]))

    def _emit_matrix(self, v: Value, acc: _Acc, inp: list[int]) -> None:
        """A matrix value: both orientations' rows, from its composition or constant."""
        what = f"{self.name}: {v.label}"
        bases = [acc.take(self.rows(v), what), acc.take(self.rows(v), what)]
        self.acc_of[id(v)], self.acc_t[id(v)] = bases
        if v.kind == "mlinear":
            self.const_rows(v, inp)
            self.emit_composition(v, bases)
        else:
            self.check_matrix(v)
            self.init_matrix(v, bases)

    def _emit_state_stores(self) -> None:
        for s, v in self.spec.states.items():
            if v.rows > 1:
                self.store_matrix(s, v, [self.acc_of[id(v)], self.acc_t[id(v)]])
                continue
            r = self.rows(v)
            self.em.emit(Store(mem=MemType.OUT, sram_base=self.acc_of[id(v)],
                               dram_base=self.em.elem(Place(f"out:{s}"), MemType.OUT),
                               y_size=1, x_size=r, x_stride=r))

    def build(self) -> Template:
        """Emit, insert the dependency tokens, and record the relocations."""
        self.em.begin_op(self.name)
        top = self._load_params()
        acc, inp = _Acc(top), [0]
        self._emit_gathers(acc, inp)
        self._emit_values(acc, inp)
        self._emit_state_stores()
        self.em.end_op()
        program = insert_dependency_tokens(self.em.finish())
        relocs, segments = relocations(program, self.name)
        scratch = sum(s.size for s in program.segments if s.name == "scratch")
        return Template(self.variant, self.n, program.instructions, relocs, segments,
                        Footprint(acc.peak, self.c.acc_depth - top, inp[0]), scratch,
                        self._resident(program.instructions, relocs))

    def _resident(self, insns: list[Instruction], relocs: dict[int, Reloc]) -> frozenset[int]:
        tables = [i for i, x in enumerate(insns) if isinstance(x, Load) and x.mem == MemType.TBL]
        keep_tables = len(tables) * 256 <= self.c.table_entries
        return frozenset(i for i, r in relocs.items() if r.kind == "model"
                         and r.segment != "weights" and (keep_tables or i not in tables))


def relocations(program, name: str) -> tuple[dict[int, Reloc], dict[str, np.ndarray]]:
    """How each DMA of a template is rewritten at instantiation, by the segment it
    addresses; and the model-level segments (renamed ``<name>:<segment>``) it needs."""
    isa = program.isa
    relocs: dict[int, Reloc] = {}
    segments: dict[str, np.ndarray] = {}
    for i, insn in enumerate(program.instructions):
        if not isinstance(insn, (Load, Store)) or insn.is_nop:
            continue
        lo, hi = isa.dram_span(insn)
        seg = next(s for s in program.segments if s.addr <= lo and hi <= s.end)
        offset = insn.dram_base - seg.addr // isa.elem_bytes(insn.mem)
        kind, _, rest = seg.name.partition(":")
        if kind == "gather":
            source, slot = rest.rsplit(":", 1)
            relocs[i] = Reloc("gather", source, int(slot))
        elif kind == "out":
            relocs[i] = Reloc("rows", rest)
        elif seg.name in ("weights", "scratch"):
            relocs[i] = Reloc("scratch" if seg.name == "scratch" else "model", seg.name, offset)
        else:
            segments[f"{name}:{seg.name}"] = seg.data
            relocs[i] = Reloc("model", f"{name}:{seg.name}", offset)
    return relocs, segments
