"""int8 quantization of a cell, calibrated on sample structures.

Symmetric per-tensor int8 for every expression (zero point 0), scales from the largest
magnitude each expression reaches on the calibration structures (float reference).
A state has one scale: its producing expression's, which is also the scale every
:func:`~.cell.child` read of it sees. Activations map int8 to int8 through a 256-entry
table (exact on the accelerator's LUT intrinsic); sigmoid and tanh outputs use
``1/127`` unless they are a state. A linear map's terms share one accumulator: each
matrix gets the scale ``s_acc / s_x`` with ``s_acc`` the largest ``s_x max|W| / 127``
of its terms, so every product lands in the same int32 sum (one GEMM accumulation) and
no matrix exceeds [-127, 127].

The int8 meaning of every operation is :mod:`.reference`'s docstring; the multipliers
of its REQUANT steps are float32, computed once here and used by both the reference and
the compiled program.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tessera.errors import CompileError

from .cell import Cell, Expr
from .reference import ACTIVATIONS, clip8, evaluate, requant

#: Output scale of sigmoid and tanh when they are not a state: the range (-1, 1) in int8.
UNIT_SCALE = 1.0 / 127


def f32(x: float) -> float:
    """``x`` rounded to float32 (the precision REQUANT multipliers have)."""
    return float(np.float32(x))


@dataclass
class QuantizedCell:
    """A cell with int8 scales, weights and tables: the exact int8 model."""

    cell: Cell
    input_scale: float
    #: Output scale of every expression, by uid.
    scales: dict[int, float]
    #: Per linear (uid): int8 matrices, int32 bias and the REQUANT multiplier.
    weights: dict[int, tuple[np.ndarray, ...]] = field(default_factory=dict)
    bias: dict[int, np.ndarray] = field(default_factory=dict)
    #: REQUANT multipliers per expression uid: ``[m]`` (linear, mul, rescale, relu) or
    #: ``[m_a, m_b]`` (add, sub).
    multipliers: dict[int, list[float]] = field(default_factory=dict)
    #: 256-entry int8 tables of sigmoid and tanh, indexed by the input's byte.
    tables: dict[int, np.ndarray] = field(default_factory=dict)

    def state_scale(self, state: str) -> float:
        return self.scales[self.cell.states[state].uid]

    def quantize_inputs(self, inputs: np.ndarray) -> np.ndarray:
        """The float input matrix as int8 at :attr:`input_scale`."""
        return clip8(np.rint(np.asarray(inputs, dtype=np.float64) / self.input_scale)
                     ).astype(np.int8)

    def dequantize(self, state: str, q: np.ndarray) -> np.ndarray:
        return np.asarray(q, dtype=np.float64) * self.state_scale(state)

    def int_op(self, e: Expr, args: list[np.ndarray]) -> np.ndarray:
        """The int8 value of ``e`` from its arguments' int8 values (int64 arrays)."""
        m = self.multipliers.get(e.uid)
        if e.op == "linear":
            acc = sum(a @ w.astype(np.int64).T for w, a in zip(self.weights[e.uid], args))
            return clip8(requant(acc + self.bias[e.uid], m[0]))
        if e.op == "mlinear":
            acc = sum(np.einsum("oi,nic->noc", w.astype(np.int64), a)
                      for w, a in zip(self.weights[e.uid], args))
            return clip8(requant(acc + self.bias[e.uid], m[0]))
        if e.op == "matvec":
            return clip8(requant(np.einsum("noi,ni->no", args[0], args[1]), m[0]))
        if e.op in ("sigmoid", "tanh"):
            return self.tables[e.uid][args[0] & 0xFF].astype(np.int64)
        if e.op == "relu":
            return clip8(requant(np.maximum(args[0], 0), m[0]))
        if e.op in ("add", "sub"):
            b = requant(args[1], m[1])
            return clip8(requant(args[0], m[0]) + (b if e.op == "add" else -b))
        if e.op == "mul":
            return clip8(requant(args[0] * args[1], m[0]))
        if e.op == "rescale":
            return clip8(requant(args[0], m[0]))
        raise CompileError(f"no int8 meaning for {e.label}")


def calibrate(cell: Cell, samples: Sequence[tuple[object, np.ndarray | None]]
              ) -> tuple[dict[int, float], float]:
    """Largest magnitude of every expression over ``samples`` (``(linearized, inputs)``
    pairs) in the float model, and of the inputs the nodes read."""
    if not samples:
        raise CompileError(f"quantizing {cell.name}: give at least one calibration "
                           "structure batch", fix={"python": "pass calibration=[(structures, "
                                                             "inputs), ...]"})
    record: dict[int, list[np.ndarray]] = {}
    peak_in = 0.0
    for lin, inputs in samples:
        evaluate(cell, lin, inputs, record=record)
        used = lin.inputs[lin.inputs >= 0]
        if inputs is not None and used.size:
            peak_in = max(peak_in, float(np.max(np.abs(np.asarray(inputs)[used]))))
    peaks = {uid: max((float(np.max(np.abs(v))) if v.size else 0.0) for v in vals)
             for uid, vals in record.items()}
    return peaks, peak_in


def _scale(peak: float) -> float:
    return f32(peak / 127) if peak > 0 else UNIT_SCALE


def assign_scales(cell: Cell, peaks: dict[int, float], input_scale: float) -> dict[int, float]:
    """Every expression's output scale (see the module doc)."""
    state_of = {e.uid: s for s, e in cell.states.items()}
    state_scale = {s: _scale(peaks.get(e.uid, 0.0)) for s, e in cell.states.items()}
    scales: dict[int, float] = {}
    for e in cell.exprs:
        if e.uid in state_of:
            scales[e.uid] = state_scale[state_of[e.uid]]
        elif e.op == "input":
            scales[e.uid] = input_scale
        elif e.op == "child":
            scales[e.uid] = state_scale[e.state]
        elif e.op in ("sigmoid", "tanh"):
            scales[e.uid] = UNIT_SCALE
        elif e.op == "relu":
            scales[e.uid] = scales[e.args[0].uid]
        else:
            scales[e.uid] = _scale(peaks.get(e.uid, 0.0))
    _share_sum_scales(cell, scales, set(state_of))
    return scales


#: Operations whose output scale is free (it only sets their final REQUANT).
_FREE_SCALE = ("linear", "mul", "add", "sub", "rescale", "matvec")


def _share_sum_scales(cell: Cell, scales: dict[int, float], states: set[int]) -> None:
    """An operand of ``+``/``-`` read by nothing else, with a free scale no coarser than
    the sum's, takes the sum's scale: its REQUANT then lands on the sum's grid at once
    (one rounding instead of two) and the sum's own rescale of it is the identity, which
    the accelerator skips. Consumers first, so a chain of sums shares one scale."""
    readers: dict[int, int] = {}
    for e in cell.exprs:
        for a in e.args:
            readers[a.uid] = readers.get(a.uid, 0) + 1
    for e in reversed(cell.exprs):
        if e.op not in ("add", "sub"):
            continue
        for a in e.args:
            if (a.op in _FREE_SCALE and readers[a.uid] == 1 and a.uid not in states
                    and scales[a.uid] <= scales[e.uid]):
                scales[a.uid] = scales[e.uid]


def _quantize_linear(q: QuantizedCell, e: Expr) -> None:
    s_x = [q.scales[a.uid] for a in e.args]
    s_acc = max(sx * float(np.max(np.abs(w))) / 127 for sx, w in zip(s_x, e.weights))
    s_acc = s_acc if s_acc > 0 else min(s_x) / 127
    q.weights[e.uid] = tuple(clip8(np.rint(w / (s_acc / sx))).astype(np.int8)
                             for sx, w in zip(s_x, e.weights))
    bias = np.rint(e.bias / s_acc)
    if np.any(np.abs(bias) >= 2 ** 31):
        raise CompileError(f"{q.cell.name}: the bias of {e.label} does not fit int32 at the "
                           f"accumulator scale {s_acc:g}")
    q.bias[e.uid] = bias.astype(np.int64)
    q.multipliers[e.uid] = [f32(s_acc / q.scales[e.uid])]


def _table(fn, s_in: float, s_out: float) -> np.ndarray:
    """``fn`` as 256 int8 entries indexed by the input's byte (two's complement)."""
    codes = np.arange(256)
    values = np.where(codes < 128, codes, codes - 256) * s_in
    return clip8(np.rint(fn(values) / s_out)).astype(np.int8)


def quantize_cell(cell: Cell, samples: Sequence[tuple[object, np.ndarray | None]]
                  ) -> QuantizedCell:
    """The int8 cell, calibrated on ``samples`` (``(linearized batch, float inputs)``)."""
    peaks, peak_in = calibrate(cell, samples)
    input_scale = _scale(peak_in)
    q = QuantizedCell(cell, input_scale, assign_scales(cell, peaks, input_scale))
    for e in cell.exprs:
        s_y = q.scales[e.uid]
        ins = [q.scales[a.uid] for a in e.args]
        if e.op in ("linear", "mlinear"):
            _quantize_linear(q, e)
        elif e.op in ("sigmoid", "tanh"):
            q.tables[e.uid] = _table(ACTIVATIONS[e.op], ins[0], s_y)
        elif e.op in ("add", "sub"):
            q.multipliers[e.uid] = [f32(ins[0] / s_y), f32(ins[1] / s_y)]
        elif e.op in ("mul", "matvec"):
            q.multipliers[e.uid] = [f32(ins[0] * ins[1] / s_y)]
        elif e.op in ("rescale", "relu"):
            q.multipliers[e.uid] = [f32(ins[0] / s_y)]
    return q
