"""Lowering epilogue stages to tensor-ALU steps over an accumulator tile.

:func:`plan_epilogue` turns the stages of :mod:`.ops` into a list of
:class:`EpStep` (one ALU instruction each over a tile, or a residual load and
add) plus the parameter rows they read (per-channel vectors or broadcast
values, loaded once per operator into the top of the accumulator).

It picks the cheapest form of each stage:

* a leading bias of an operator that initialises its accumulator rows
  (a convolution) becomes that initialisation: ALU MOV of a per-channel
  parameter row (one row per cycle, the tensor form of MOV reads only its
  operand) instead of a zero reset and a tensor ADD;
* an operand that fits the ALU immediate is an immediate (one row per cycle)
  rather than a parameter row (the tensor form reads two rows);
* trailing clamps the store's saturation already performs are dropped, and a
  clamp followed by a zero point becomes the zero point followed by a clamp
  when that cannot overflow (so an int8 output with a zero point of -128 and
  a ReLU needs only the ADD: the store saturates at -128);
* REQUANT with a per-tensor scale uses the immediate when the immediate field
  holds the packed 32-bit parameter word;
* an :class:`~.ops.Apply` of an intrinsic that reads the ALU table memory adds its table
  to the plan's ``tables``; the emitter loads it once per program
  (:meth:`~.emit.Emitter.table_base`) and the step's immediate becomes the table's
  first entry plus the stage's value.

Every step is exact: the result equals applying the stages in order with
int32 arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tessera.config import HwConfig
from tessera.isa import ALU_OPS, Opcode, clip_imm, get_isa
from tessera.isa import Alu, Load, MemType, requant as rq

from tessera.errors import CompileError
from .ops import (INT32_MAX, INT32_MIN, AddConst, Apply, Bias, Clip, Mul, Requant, Residual, Shift,
                  Stage)
from .relu_sum import ReluSum, alu_program
from .emit import Emitter, Place
from .nest import dim, map_nest


@dataclass(frozen=True)
class EpStep:
    """One step of a lowered epilogue.

    ``kind`` is ``"alu"`` (an ALU op with ``imm`` or the parameter vector
    ``param``) or ``"residual"`` (load ``tensor`` into scratch rows and add
    it; with ``op`` ``"MUL"`` the loaded rows are first multiplied by ``imm``
    or ``param``). ``table``: the index of the plan's table the op reads; ``imm`` is
    then an offset from that table's first entry.
    """

    kind: str
    op: str = ""
    imm: int | None = None
    param: int | None = None
    tensor: str = ""
    table: int | None = None
    #: The rows the step writes, and the rows its tensor operand reads (``None``: the
    #: immediate or ``param``): ``"acc"`` (the tile's own rows) or a scratch group of the
    #: tile's shape (``"S"``, ``"T"``: a sum of shifted ReLUs builds its terms there).
    dst: str = "acc"
    src: str | None = None


@dataclass
class EpiloguePlan:
    """Lowered stages: ALU steps, their parameter vectors and the accumulator initialisation.

    ``params[k]`` is an int64 array of one lane value per output channel
    (length ``channels``), or of length 1 for a value broadcast to every lane.
    ``init`` (with ``init_bias``): the MOV step (immediate or parameter row)
    that initialises the accumulator rows with the bias; ``None``: they start
    at zero.
    """

    steps: list[EpStep] = field(default_factory=list)
    params: list[np.ndarray] = field(default_factory=list)
    init: EpStep | None = None
    #: Tables (int8 entries) the steps look values up in, and where each is resident in
    #: the ALU table memory (its first entry; filled when the operator is emitted).
    tables: list[np.ndarray] = field(default_factory=list)
    table_bases: list[int] = field(default_factory=list)
    #: Whether a step's values may leave int32 and wrap (the steps are then not all
    #: non-decreasing functions of the accumulator, which :mod:`.poolfuse` relies on).
    may_wrap: bool = False

    @property
    def residuals(self) -> list[str]:
        return [s.tensor for s in self.steps if s.kind == "residual"]

    @property
    def scratch_groups(self) -> list[str]:
        """The scratch row groups the steps use, each as many rows as the tile, in the
        order they lie after ``scratch_base``: ``"R"`` (residual loads) first."""
        groups = ["R"] if self.residuals else []
        for st in self.steps:
            for g in (st.dst, st.src):
                if g not in (None, "acc") and g not in groups:
                    groups.append(g)
        return groups

    def param_rows(self, ob_count: int) -> int:
        """Accumulator rows the parameter vectors take (per-channel vectors: one per block)."""
        return sum(ob_count if p.size > 1 else 1 for p in self.params)


def _fits(value: int, lo: int, hi: int) -> bool:
    return lo <= value <= hi


class _StageLowering:
    """Per-call state of :func:`plan_epilogue`: the plan so far and the bounds ``[lo, hi]``
    of the values after the stages lowered so far (``wrapped``: they may have wrapped)."""

    def __init__(self, *, channels: int, config: HwConfig, acc_range: tuple[int, int],
                 init_bias: bool, where: str) -> None:
        self.imm_f = get_isa(config).layouts[Opcode.ALU].field("imm")
        self.imm_bits = self.imm_f.width
        self.out_lo = -(1 << (config.out_width - 1))
        self.out_hi = (1 << (config.out_width - 1)) - 1
        self.out_width = config.out_width
        self.channels = channels
        self.init_bias = init_bias
        self.where = where
        self.plan = EpiloguePlan()
        self.lo, self.hi = acc_range
        self.wrapped = False

    # ------------------------------------------------------------ helpers
    def set_range(self, lo: int, hi: int) -> None:
        """The values' new bounds; beyond int32 they wrap, so any int32 is possible."""
        self.lo, self.hi = lo, hi
        if lo < INT32_MIN or hi > INT32_MAX:
            self.wrapped = self.plan.may_wrap = True
            self.lo, self.hi = INT32_MIN, INT32_MAX

    def param(self, values: np.ndarray) -> int:
        """Add a parameter vector; its index."""
        self.plan.params.append(np.asarray(values, dtype=np.int64))
        return len(self.plan.params) - 1

    def alu_step(self, op: str, value: int | np.ndarray) -> EpStep:
        """ALU ``op`` with ``value``: an immediate when one value fits, else a parameter."""
        v = np.asarray(value, dtype=np.int64)
        if v.ndim == 0 or np.all(v == v.flat[0]):
            scalar = int(v.flat[0])
            operand = ALU_OPS.by_name(op).imm_to_operand(scalar, self.imm_bits)
            if _fits(scalar, self.imm_f.lo, self.imm_f.hi) and operand == scalar:
                return EpStep("alu", op, imm=scalar)
            return EpStep("alu", op, param=self.param(np.array([scalar])))
        return EpStep("alu", op, param=self.param(v))

    def alu(self, op: str, value: int | np.ndarray) -> None:
        """Append the ALU step ``op`` with ``value``."""
        self.plan.steps.append(self.alu_step(op, value))

    def channel_vector(self, values, name: str) -> np.ndarray:
        """``values`` as a scalar or one value per output channel (else an error)."""
        v = np.asarray(values)
        if v.ndim == 0:
            return v
        if v.shape != (self.channels,):
            raise CompileError(f"{self.where}: {name} has shape {v.shape}, expected a scalar "
                               f"or ({self.channels},) for the {self.channels} output channels")
        return v

    # ------------------------------------------------------------ stages
    def lower(self, stages: tuple[Stage, ...]) -> EpiloguePlan:
        """Lower every stage in order (a clamp may absorb the zero point after it)."""
        stages = list(stages)
        k = 0
        while k < len(stages):
            st = stages[k]
            k += 1
            if isinstance(st, Bias):
                self.bias(st, first=k == 1)
            elif isinstance(st, Requant):
                self.requant(st)
            elif isinstance(st, Shift):
                self.shift(st)
            elif isinstance(st, Residual):
                self.residual(st)
            elif isinstance(st, Mul):
                self.mul(st)
            elif isinstance(st, AddConst):
                self.add_const(st)
            elif isinstance(st, Apply):
                self.apply(st)
            elif isinstance(st, ReluSum):
                self.relu_sum(st)
            elif isinstance(st, Clip):
                k += self.clip(st, stages[k:])
            else:
                raise CompileError(f"{self.where}: unknown epilogue stage {st!r}")
        return self.plan

    def bias(self, st: Bias, *, first: bool) -> None:
        """A bias: an ADD, or (leading, with ``init_bias``) the rows' initial MOV."""
        b = self.channel_vector(st.values, "bias").astype(np.int64)
        if np.any(b < INT32_MIN) or np.any(b > INT32_MAX):
            raise CompileError(f"{self.where}: bias values must fit int32")
        if first and self.init_bias:
            # The rows start at the bias: acc = 0 + b, exact for any int32 bias.
            self.plan.init = self.alu_step("MOV", b)
        else:
            self.alu("ADD", b)
        self.set_range(self.lo + int(b.min()), self.hi + int(b.max()))

    def requant(self, st: Requant) -> None:
        """A REQUANT by the packed multiplier/shift word(s) of the scale."""
        scale = self.channel_vector(np.asarray(st.scale, dtype=np.float32), "requant scale")
        try:
            m, sh = rq.scale_to_params(scale)
            word = rq.pack_params(m, sh).astype(np.int64)
        except ValueError as exc:
            raise CompileError(f"{self.where}: {exc}") from None
        self.alu("REQUANT", word)
        smax = float(np.max(scale))
        self.set_range(max(INT32_MIN, int(np.floor(self.lo * smax)) - 1),
                       min(INT32_MAX, int(np.ceil(self.hi * smax)) + 1))
        self.wrapped = False  # REQUANT saturates

    def shift(self, st: Shift) -> None:
        """An arithmetic right shift (after adding half, when rounding)."""
        n = int(st.amount)
        if not 0 <= n <= 31:
            raise CompileError(f"{self.where}: shift amount must be in [0, 31], not {n}")
        if n == 0:
            return
        if st.rounding:
            self.alu("ADD", 1 << (n - 1))
            self.set_range(self.lo + (1 << (n - 1)), self.hi + (1 << (n - 1)))
        self.alu("SHR", n)
        self.set_range(self.lo >> n, self.hi >> n)

    def residual(self, st: Residual) -> None:
        """A residual add of an int8 tensor (multiplied first unless its scale is 1)."""
        r = (1 << (self.out_width - 1)) * abs(int(st.scale))
        if st.scale == 1:
            self.plan.steps.append(EpStep("residual", tensor=st.tensor))
        else:
            mul = self.alu_step("MUL", int(st.scale))
            self.plan.steps.append(EpStep("residual", "MUL", mul.imm, mul.param, st.tensor))
        self.set_range(self.lo - r, self.hi + r)

    def mul(self, st: Mul) -> None:
        """A scalar or per-channel multiply."""
        v = self.channel_vector(st.value, "multiplier").astype(np.int64)
        self.alu("MUL", v)
        ends = [self.lo * int(v.min()), self.lo * int(v.max()),
                self.hi * int(v.min()), self.hi * int(v.max())]
        self.set_range(min(ends), max(ends))

    def add_const(self, st: AddConst) -> None:
        """An added constant (a zero point, say)."""
        self.alu("ADD", int(st.value))
        self.set_range(self.lo + int(st.value), self.hi + int(st.value))

    def apply(self, st: Apply) -> None:
        """A registered intrinsic: an immediate or parameter operand, or a table lookup."""
        if st.op not in ALU_OPS:
            raise CompileError(f"{self.where}: ALU op {st.op} is not registered "
                               f"(registered: {', '.join(ALU_OPS.names())})")
        if st.table is None:
            self.alu(st.op, st.value)
        else:
            self.plan.tables.append(np.asarray(st.table, dtype=np.int8))
            self.plan.steps.append(EpStep("alu", st.op, imm=int(st.value),
                                          table=len(self.plan.tables) - 1))
        lo, hi = st.out_range if st.out_range is not None else (INT32_MIN, INT32_MAX)
        self.set_range(lo, hi)
        self.wrapped = st.out_range is None

    def relu_sum(self, rs: ReluSum) -> None:
        """A sum of shifted ReLUs over the int8 values: :func:`~.relu_sum.alu_program`'s
        row passes, its terms built in scratch groups S and T."""
        if self.lo < -128 or self.hi > 127:
            raise CompileError(f"{self.where}: a sum of shifted ReLUs needs int8 values; clamp "
                               "them first")
        for step in alu_program(rs, imm_bits=self.imm_bits):
            if step.src == "param":
                self.plan.steps.append(EpStep("alu", step.op, param=self.param(
                    np.array([step.value])), dst=step.dst))
            else:
                self.plan.steps.append(EpStep("alu", step.op, imm=step.value, dst=step.dst,
                                              src=step.src))
        self.set_range(INT32_MIN, INT32_MAX)
        self.wrapped = False    # the fit keeps every partial sum inside int32

    def saturation(self, rest: list[Stage]) -> tuple[int, int] | None:
        """The clamp the step after a clamp performs anyway: the store's saturation to the
        output width when nothing follows, an op that saturates its input
        (:attr:`~.ops.Apply.saturates`), else none."""
        if not rest:
            return self.out_lo, self.out_hi
        if isinstance(rest[0], Apply):
            return rest[0].saturates
        return None

    def clip(self, st: Clip, rest: list[Stage]) -> int:
        """Lower a clamp; returns 1 when it also lowered the zero point ``rest[0]``."""
        c_lo = st.lo if st.lo is not None else INT32_MIN
        c_hi = st.hi if st.hi is not None else INT32_MAX
        # Clip then a zero point before a saturating step: add first, then clip the
        # shifted bounds (no overflow), which the saturation may make unnecessary.
        if (rest and isinstance(rest[0], AddConst) and not self.wrapped
                and self.saturation(rest[1:]) is not None):
            z = int(rest[0].value)
            if INT32_MIN <= self.lo + z and self.hi + z <= INT32_MAX:
                self.alu("ADD", z)
                self.set_range(self.lo + z, self.hi + z)
                self.clamp(c_lo + z if st.lo is not None else None,
                           c_hi + z if st.hi is not None else None,
                           self.saturation(rest[1:]))
                self.set_range(max(self.lo, c_lo + z), min(self.hi, c_hi + z))
                return 1
        self.clamp(st.lo, st.hi, self.saturation(rest))
        self.set_range(max(self.lo, c_lo), min(self.hi, c_hi))
        return 0

    def clamp(self, lo: int | None, hi: int | None, saturation: tuple[int, int] | None
              ) -> None:
        """Emit the cheapest clamp to ``[lo, hi]`` of the values.

        Bounds the next step's ``saturation`` enforces anyway (the store's, as the last
        step) are dropped; bounds outside the value range never act.
        """
        sat_lo, sat_hi = saturation if saturation is not None else (None, None)
        if lo is not None and (lo <= self.lo or (sat_lo is not None and lo <= sat_lo)):
            lo = None
        if hi is not None and (hi >= self.hi or (sat_hi is not None and hi >= sat_hi)):
            hi = None
        if lo is None and hi is None:
            return
        if lo is not None and hi is not None:
            half = self.imm_bits // 2
            h_lo, h_hi = -(1 << (half - 1)), (1 << (half - 1)) - 1
            if h_lo <= lo <= h_hi and h_lo <= hi <= h_hi:
                self.plan.steps.append(EpStep("alu", "CLIP", imm=clip_imm(lo, hi, self.imm_bits)))
                return
        if lo is not None:
            self.alu("MAX", lo)
        if hi is not None:
            self.alu("MIN", hi)


def plan_epilogue(stages: tuple[Stage, ...], *, channels: int, config: HwConfig,
                  acc_range: tuple[int, int], init_bias: bool = False,
                  where: str) -> EpiloguePlan:
    """Lower ``stages`` for an operator with ``channels`` output channels.

    ``acc_range``: bounds of the accumulator before the stages (used to prove
    the zero-point rewrite cannot overflow and to drop clamps that never act).
    ``init_bias``: the operator initialises its accumulator rows from
    :attr:`EpiloguePlan.init` (a leading bias becomes a MOV, see the module doc).
    """
    return _StageLowering(channels=channels, config=config, acc_range=acc_range,
                          init_bias=init_bias, where=where).lower(stages)


def reference_stages(acc: np.ndarray, stages: tuple[Stage, ...], channel_axis: int,
                     residuals: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Apply ``stages`` to int64 ``acc`` values as the documented semantics say (numpy).

    ``channel_axis`` is the axis of output channels (for per-channel vectors).
    Returns int64 values (not yet saturated to the output width).
    """
    def wrap(v):
        return ((v + (1 << 31)) % (1 << 32)) - (1 << 31)

    def per_channel(v):
        v = np.asarray(v)
        if v.ndim == 0:
            return v
        shape = [1] * acc.ndim
        shape[channel_axis] = v.size
        return v.reshape(shape)

    a = wrap(np.asarray(acc, dtype=np.int64))
    for st in stages:
        if isinstance(st, Bias):
            a = wrap(a + per_channel(np.asarray(st.values, dtype=np.int64)))
        elif isinstance(st, Requant):
            s = per_channel(np.asarray(st.scale, dtype=np.float32))
            y = np.rint(a.astype(np.float32) * s).astype(np.float64)
            a = np.clip(y, INT32_MIN, INT32_MAX).astype(np.int64)
        elif isinstance(st, Shift):
            if st.amount:
                if st.rounding:
                    a = wrap(a + (1 << (st.amount - 1)))
                a = a >> st.amount
        elif isinstance(st, Residual):
            a = wrap(a + wrap(int(st.scale) * residuals[st.tensor].astype(np.int64)))
        elif isinstance(st, Mul):
            a = wrap(a * per_channel(np.asarray(st.value, dtype=np.int64)))
        elif isinstance(st, Clip):
            a = np.clip(a, st.lo if st.lo is not None else INT32_MIN,
                        st.hi if st.hi is not None else INT32_MAX)
        elif isinstance(st, AddConst):
            a = wrap(a + int(st.value))
        elif isinstance(st, ReluSum):
            a = st.evaluate(a).astype(np.int64)
        elif isinstance(st, Apply):
            table = None if st.table is None else np.asarray(st.table, dtype=np.int64)
            a = ALU_OPS.by_name(st.op).apply(a, np.full(a.shape, st.value, np.int64),
                                             table=table)
    return a


# ------------------------------------------------------------------ emission
def param_rows_data(ep: EpiloguePlan, ob_count: int,
                    config: HwConfig) -> tuple[np.ndarray, list[int]]:
    """The parameter rows (int32 accumulator entries) and each vector's first row."""
    bo, n = config.block_out, config.batch
    rows, starts = [], []
    for p in ep.params:
        starts.append(sum(r.shape[0] for r in rows))
        if p.size == 1:
            rows.append(np.full((1, n, bo), p[0], dtype=np.int64))
        else:
            lanes = np.zeros(ob_count * bo, dtype=np.int64)
            lanes[:p.size] = p
            rows.append(np.broadcast_to(lanes.reshape(ob_count, 1, bo), (ob_count, n, bo)))
    data = (np.concatenate(rows) if rows else np.zeros((0, n, bo), np.int64))
    return wrap_int32(data), starts


def wrap_int32(a: np.ndarray) -> np.ndarray:
    """``a`` wrapped to int32 (two's complement), as the accumulator holds it."""
    return ((np.asarray(a, dtype=np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def emit_param_prologue(em: Emitter, op_name: str, ep: EpiloguePlan, ob_count: int,
                        banked: bool = False) -> tuple[list[int], list[int]]:
    """Load the epilogue's parameter rows into the top of the accumulator (a compute-module
    LOAD, emitted here); with ``banked`` into the top of each bank (an ALU instruction that
    runs beside the GEMM unit reads its operands from its own bank): the second copy is an
    ALU MOV of the first (one row per cycle, far faster than a second DRAM read).

    Returns the first parameter row of each copy and each vector's row offset.
    """
    c = em.config
    ep.table_bases = [em.table_base(t) for t in ep.tables]
    data, starts = param_rows_data(ep, ob_count, c)
    n = data.shape[0]
    tops = [(b + 1) * c.acc_bank_rows for b in range(2)] if banked else [c.acc_depth]
    bases = [top - n for top in tops]
    if n:
        seg = em.add_segment(f"{op_name}.params", data)
        em.emit(Load(mem=MemType.ACC, sram_base=bases[0],
                     dram_base=em.elem(Place(seg), MemType.ACC), y_size=1, x_size=n,
                     x_stride=n))
        mov = ALU_OPS.by_name("MOV")
        for base in bases[1:]:
            nest = map_nest([dim("rows", n, dst=1, src=1)], (base, bases[0], 0), kind="alu",
                            isa=em.isa, distance=mov.timing.hazard_distance(False),
                            src_is_acc_read=True, where=f"{op_name!r} parameters")
            b, e = em.kernel(nest.uops)
            em.emit(Alu(alu_op=mov.opcode, uop_begin=b, uop_end=e, **nest.fields("alu")))
    return bases, starts


def tile_alu(em: Emitter, ep: EpiloguePlan, st: EpStep, *, acc_base: int, nb_n: int, ob_n: int,
             pixels: int, ob0: int, param_base: int, param_starts: list[int], where: str,
             pix_dims: tuple[tuple[int, int], ...] | None = None) -> Alu:
    """One ALU step (an immediate or a parameter vector) over tile rows ``[nb][ob][pix]``;
    ``pix_dims``: only some rows of each plane, as ``(count, stride)`` loops (a fused pool's
    pooled rows), else all ``pixels``."""
    op = ALU_OPS.by_name(st.op)
    use_imm = st.imm is not None
    if st.table is not None:
        st = replace(st, imm=ep.table_bases[st.table] + st.imm)
    rows = nb_n * ob_n * pixels
    pix = [dim(f"pix{k}", n, dst=d) for k, (n, d) in enumerate(pix_dims or ((pixels, 1),))]
    if use_imm:
        dims = [dim("rows", rows, dst=1)] if pix_dims is None else \
            [dim("nb", nb_n, dst=ob_n * pixels), dim("ob", ob_n, dst=pixels), *pix]
        base = (acc_base, 0, 0)
    else:
        vec = ep.params[st.param]
        s = 1 if vec.size > 1 else 0
        dims = [dim("nb", nb_n, dst=ob_n * pixels), dim("ob", ob_n, dst=pixels, src=s), *pix]
        base = (acc_base, param_base + param_starts[st.param] + ob0 * s, 0)
    nest = map_nest(dims, base, kind="alu", isa=em.isa,
                    distance=op.timing.hazard_distance(use_imm),
                    src_is_acc_read=not use_imm, where=where)
    b, e = em.kernel(nest.uops)
    return Alu(alu_op=op.opcode, use_imm=use_imm, imm=st.imm or 0, uop_begin=b, uop_end=e,
               **nest.fields("alu"))


def emit_epilogue(em: Emitter, ep: EpiloguePlan, *, acc_base: int, nb_n: int, ob_n: int,
                  pixels: int, ob0: int, param_base: int, param_starts: list[int],
                  scratch_base: int, residual_loads, where: str,
                  scratch_stride: int = 0,
                  pix_dims: tuple[tuple[int, int], ...] | None = None) -> None:
    """The tile's epilogue ALU steps (and residual loads/adds) over rows ``[nb][ob][pix]``.
    The scratch groups (:attr:`EpiloguePlan.scratch_groups`) lie ``scratch_stride`` rows
    apart from ``scratch_base``. ``pix_dims``: only those rows of each plane (plain ALU
    steps only, see :func:`tile_alu`)."""
    rows = nb_n * ob_n * pixels
    groups = {"acc": acc_base, **{g: scratch_base + k * scratch_stride
                                  for k, g in enumerate(ep.scratch_groups)}}
    for st in ep.steps:
        if st.kind == "residual":
            em.emit(*residual_loads(st.tensor, groups["R"]))
            if st.op:
                em.emit(tile_alu(em, ep, replace(st, kind="alu"), acc_base=groups["R"],
                                 nb_n=nb_n, ob_n=ob_n, pixels=pixels, ob0=ob0,
                                 param_base=param_base, param_starts=param_starts, where=where))
            em.emit(_rows_alu(em, "ADD", groups["acc"], groups["R"], rows, where))
        elif st.src is not None:
            em.emit(_rows_alu(em, st.op, groups[st.dst], groups[st.src], rows, where))
        else:
            em.emit(tile_alu(em, ep, st, acc_base=groups[st.dst], nb_n=nb_n, ob_n=ob_n,
                             pixels=pixels, ob0=ob0, param_base=param_base,
                             param_starts=param_starts, where=where, pix_dims=pix_dims))


def _rows_alu(em: Emitter, op_name: str, dst: int, src: int, rows: int, where: str) -> Alu:
    """``op`` of ``rows`` rows from ``dst`` with the tensor operand ``rows`` rows from ``src``."""
    op = ALU_OPS.by_name(op_name)
    nest = map_nest([dim("rows", rows, dst=1, src=1)], (dst, src, 0), kind="alu", isa=em.isa,
                    distance=op.timing.hazard_distance(False), src_is_acc_read=True,
                    where=where)
    b, e = em.kernel(nest.uops)
    return Alu(alu_op=op.opcode, uop_begin=b, uop_end=e, **nest.fields("alu"))
