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
  holds the packed 32-bit parameter word.

Every step is exact: the result equals applying the stages in order with
int32 arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tessera.config import HwConfig
from tessera.isa import ALU_OPS, Opcode, clip_imm, get_isa
from tessera.isa import requant as rq

from tessera.errors import CompileError
from .ops import INT32_MAX, INT32_MIN, AddConst, Bias, Clip, Mul, Requant, Residual, Shift, Stage


@dataclass(frozen=True)
class EpStep:
    """One step of a lowered epilogue.

    ``kind`` is ``"alu"`` (an ALU op with ``imm`` or the parameter vector
    ``param``) or ``"residual"`` (load ``tensor`` into scratch rows and add
    it; with ``op`` ``"MUL"`` the loaded rows are first multiplied by ``imm``
    or ``param``).
    """

    kind: str
    op: str = ""
    imm: int | None = None
    param: int | None = None
    tensor: str = ""


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

    @property
    def residuals(self) -> list[str]:
        return [s.tensor for s in self.steps if s.kind == "residual"]

    def param_rows(self, ob_count: int) -> int:
        """Accumulator rows the parameter vectors take (per-channel vectors: one per block)."""
        return sum(ob_count if p.size > 1 else 1 for p in self.params)


def _fits(value: int, lo: int, hi: int) -> bool:
    return lo <= value <= hi


def plan_epilogue(stages: tuple[Stage, ...], *, channels: int, config: HwConfig,
                  acc_range: tuple[int, int], init_bias: bool = False,
                  where: str) -> EpiloguePlan:
    """Lower ``stages`` for an operator with ``channels`` output channels.

    ``acc_range``: bounds of the accumulator before the stages (used to prove
    the zero-point rewrite cannot overflow and to drop clamps that never act).
    ``init_bias``: the operator initialises its accumulator rows from
    :attr:`EpiloguePlan.init` (a leading bias becomes a MOV, see the module doc).
    """
    isa = get_isa(config)
    imm_f = isa.layouts[Opcode.ALU].field("imm")
    imm_bits = imm_f.width
    out_lo, out_hi = -(1 << (config.out_width - 1)), (1 << (config.out_width - 1)) - 1
    plan = EpiloguePlan()
    lo, hi = acc_range
    wrapped = False

    def rng(a: int, b: int) -> None:
        nonlocal lo, hi, wrapped
        lo, hi = a, b
        if lo < INT32_MIN or hi > INT32_MAX:
            wrapped = True
            lo, hi = INT32_MIN, INT32_MAX

    def param(values: np.ndarray) -> int:
        plan.params.append(np.asarray(values, dtype=np.int64))
        return len(plan.params) - 1

    def alu_step(op: str, value: int | np.ndarray) -> EpStep:
        v = np.asarray(value, dtype=np.int64)
        if v.ndim == 0 or np.all(v == v.flat[0]):
            scalar = int(v.flat[0])
            operand = ALU_OPS.by_name(op).imm_to_operand(scalar, imm_bits)
            if _fits(scalar, imm_f.lo, imm_f.hi) and operand == scalar:
                return EpStep("alu", op, imm=scalar)
            return EpStep("alu", op, param=param(np.array([scalar])))
        return EpStep("alu", op, param=param(v))

    def alu(op: str, value: int | np.ndarray) -> None:
        plan.steps.append(alu_step(op, value))

    def channel_vector(values, name: str) -> np.ndarray:
        v = np.asarray(values)
        if v.ndim == 0:
            return v
        if v.shape != (channels,):
            raise CompileError(f"{where}: {name} has shape {v.shape}, expected a scalar or "
                               f"({channels},) for the {channels} output channels")
        return v

    stages = list(stages)
    # Peephole on the tail: clamp + zero point -> zero point + clamp (when safe), merge clamps.
    for k, st in enumerate(stages):
        if isinstance(st, Bias):
            b = channel_vector(st.values, "bias").astype(np.int64)
            if np.any(b < INT32_MIN) or np.any(b > INT32_MAX):
                raise CompileError(f"{where}: bias values must fit int32")
            if k == 0 and init_bias:
                # The rows start at the bias: acc = 0 + b, exact for any int32 bias.
                plan.init = alu_step("MOV", b)
            else:
                alu("ADD", b)
            rng(lo + int(b.min()), hi + int(b.max()))
        elif isinstance(st, Requant):
            scale = channel_vector(np.asarray(st.scale, dtype=np.float32), "requant scale")
            try:
                m, sh = rq.scale_to_params(scale)
                word = rq.pack_params(m, sh).astype(np.int64)
            except ValueError as exc:
                raise CompileError(f"{where}: {exc}") from None
            alu("REQUANT", word)
            smax = float(np.max(scale))
            rng(max(INT32_MIN, int(np.floor(lo * smax)) - 1),
                min(INT32_MAX, int(np.ceil(hi * smax)) + 1))
            wrapped = False  # REQUANT saturates
        elif isinstance(st, Shift):
            n = int(st.amount)
            if not 0 <= n <= 31:
                raise CompileError(f"{where}: shift amount must be in [0, 31], not {n}")
            if n == 0:
                continue
            if st.rounding:
                alu("ADD", 1 << (n - 1))
                rng(lo + (1 << (n - 1)), hi + (1 << (n - 1)))
            alu("SHR", n)
            rng(lo >> n, hi >> n)
        elif isinstance(st, Residual):
            r = (1 << (config.out_width - 1)) * abs(int(st.scale))
            if st.scale == 1:
                plan.steps.append(EpStep("residual", tensor=st.tensor))
            else:
                mul = alu_step("MUL", int(st.scale))
                plan.steps.append(EpStep("residual", "MUL", mul.imm, mul.param, st.tensor))
            rng(lo - r, hi + r)
        elif isinstance(st, Mul):
            v = channel_vector(st.value, "multiplier").astype(np.int64)
            alu("MUL", v)
            ends = [lo * int(v.min()), lo * int(v.max()), hi * int(v.min()), hi * int(v.max())]
            rng(min(ends), max(ends))
        elif isinstance(st, AddConst):
            alu("ADD", int(st.value))
            rng(lo + int(st.value), hi + int(st.value))
        elif isinstance(st, Clip):
            c_lo = st.lo if st.lo is not None else INT32_MIN
            c_hi = st.hi if st.hi is not None else INT32_MAX
            rest = stages[k + 1:]
            # Clip then a trailing zero point: add first, clip shifted bounds (no overflow).
            if len(rest) == 1 and isinstance(rest[0], AddConst) and not wrapped:
                z = int(rest[0].value)
                if INT32_MIN <= lo + z and hi + z <= INT32_MAX:
                    alu("ADD", z)
                    rng(lo + z, hi + z)
                    _emit_clip(plan, alu, c_lo + z if st.lo is not None else None,
                               c_hi + z if st.hi is not None else None, lo, hi, out_lo, out_hi,
                               last=True, imm_bits=imm_bits)
                    break
            _emit_clip(plan, alu, st.lo, st.hi, lo, hi, out_lo, out_hi, last=not rest,
                       imm_bits=imm_bits)
            rng(max(lo, c_lo), min(hi, c_hi))
        else:
            raise CompileError(f"{where}: unknown epilogue stage {st!r}")
    return plan


def _emit_clip(plan: EpiloguePlan, alu, lo: int | None, hi: int | None, vlo: int, vhi: int,
               out_lo: int, out_hi: int, *, last: bool, imm_bits: int) -> None:
    """Emit the cheapest clamp to ``[lo, hi]`` of values in ``[vlo, vhi]``.

    As the last step, bounds the store's saturation to ``[out_lo, out_hi]``
    enforces anyway are dropped; bounds outside the value range never act.
    """
    if lo is not None and (lo <= vlo or (last and lo <= out_lo)):
        lo = None
    if hi is not None and (hi >= vhi or (last and hi >= out_hi)):
        hi = None
    if lo is None and hi is None:
        return
    if lo is not None and hi is not None:
        half = imm_bits // 2
        h_lo, h_hi = -(1 << (half - 1)), (1 << (half - 1)) - 1
        if h_lo <= lo <= h_hi and h_lo <= hi <= h_hi:
            plan.steps.append(EpStep("alu", "CLIP", imm=clip_imm(lo, hi, imm_bits)))
            return
    if lo is not None:
        alu("MAX", lo)
    if hi is not None:
        alu("MIN", hi)


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
    return a
