"""Int8 activations as sums of shifted ReLUs (the IIS method) for configs without a table unit.

An int8 activation of a quantized model maps the stored input ``v`` in [-128, 127] to a
stored output; it is given as a 256-entry int8 table indexed by the byte of ``v``
(``y = table[np.int8(v).view(np.uint8)]``: entry 0 is ``v = 0``, entry 255 is ``v = -1``).
Without the lookup-table unit the accelerator approximates it with ALU ops as::

    y = clip((A + C*v + sum_k W_k * max(v, b_k)) >> s, -128, 127)

(:class:`ReluSum`; ``relu(v - b) = max(v, b) - b``, the ``-W_k*b_k`` folded into ``A``, which
also holds the rounding half ``2**(s-1)``; the clip is the store's saturation).
:func:`fit_relu_sum` fits it by weighted least squares (weights: the calibration
distribution of ``v``), choosing the integer breakpoints ``b_k`` by coordinate search (from the
weighted quantiles and from a greedy pick; the better result, without breakpoints that add
nothing), then quantises to the largest ``s`` for which every intermediate value
fits int32 for every ``v`` in [-128, 127] (the ALU's lanes wrap; the fit never relies on
it). :func:`relu_sum_error` and :func:`accuracy_table` report the error in output LSBs.

The lowering (:func:`alu_program`; the lead's epilogue lowering emits exactly these steps)
works on three row groups of the same shape: ``acc`` (the accumulator rows holding ``v``,
which end holding ``y``), and scratch groups ``S`` and ``T``. Terms with ``W_k = 0`` are
skipped. With terms ``1..K`` left (ascending ``b_k``)::

    S = MOV acc ; S = MUL C ; S = ADD A        linear part (C = 0: S = MOV A; C = 1: no MUL;
                                               A = 0: no ADD; C = A = 0: S starts empty)
    for k < K:  T = MOV acc ; T = MAX b_k ; T = MUL W_k ; S = ADD T
                (W_k = 1: no MUL; W_k = -1: no MUL and S = SUB T; S empty: the term is
                 built in S itself: S = MOV acc ; S = MAX b_k ; S = MUL W_k)
    term K:     acc = MAX b_K ; acc = MUL W_K ; acc = ADD S    (in place: v is not needed
                                               after it; W_K = 1: no MUL; S empty: no ADD)
    acc = SHR s                                (s = 0: none)

and with no terms: ``acc = MUL C ; acc = ADD A ; acc = SHR s`` (C = 0: ``acc = MOV A``).
Each pass covers the whole tile before the next reads its result (the emitter keeps the
registry's hazard distances, as for any epilogue).
``MAX b_k`` always takes the immediate; ``C``, ``A`` and ``W_k`` take it when they fit the
config's immediate field (``imm_bits``), otherwise a parameter row holding the value (the
tensor form, ``src="param"``). So a general K-term fit takes ``4K + 3`` passes and, with
immediates, ``5K + 3`` cycles per row (:func:`alu_cycles_per_row`, from the registry's
timing). :func:`fit_relu_sum` with ``imm_bits`` caps ``s`` so that ``C`` and every ``W_k``
fit the immediate (a little extra rounding error: on the tests' tables the same max error).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.errors import PYTHON, CompileError
from tessera.isa import ALU_OPS

INT32_MIN, INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)
#: The stored input values, in the order the fit works in (the tables are in byte order).
V = np.arange(-128, 128, dtype=np.int64)
#: Most pieces a fit may take (beyond this the lookup-table unit is the answer).
MAX_PIECES = 32
#: Largest fixed-point shift tried (the rounding half ``2**(s-1)`` stays well inside int32).
MAX_SHIFT = 30
#: Coordinate-search sweeps over the breakpoints (each sweep moves every breakpoint once).
MAX_SWEEPS = 12
_PIECES_FIX = "pass pieces=K (an int, 0..%d) or tolerance=T (max error in output LSBs)" % MAX_PIECES


@dataclass(frozen=True)
class ReluSum:
    """``y = clip((offset + slope*v + sum W*max(v, b) over terms) >> shift, -128, 127)``.

    ``terms``: ``(b_k, W_k)`` pairs, breakpoints in [-128, 127] strictly ascending.
    """

    offset: int
    slope: int
    terms: tuple[tuple[int, int], ...]
    shift: int

    def __post_init__(self) -> None:
        breaks = [b for b, _ in self.terms]
        if any(not -128 <= b <= 127 for b in breaks) or breaks != sorted(set(breaks)):
            raise CompileError(f"ReluSum breakpoints {breaks} must be distinct, ascending and in "
                               "[-128, 127]")
        if not 0 <= self.shift <= 31:
            raise CompileError(f"ReluSum shift {self.shift} must be in 0..31 (ALU SHR amount)")

    @property
    def pieces(self) -> int:
        """The number of ReLU terms K."""
        return len(self.terms)

    def evaluate(self, v: np.ndarray) -> np.ndarray:
        """The int8 results the ALU sequence computes for stored inputs ``v`` (in [-128, 127]):
        ``accumulate(v) >> shift`` saturated by the store."""
        return np.clip(self.accumulate(v) >> self.shift, -128, 127).astype(np.int8)

    def accumulate(self, v: np.ndarray) -> np.ndarray:
        """``offset + slope*v + sum W_k*max(v, b_k)`` (int64), the sum before the shift.

        Checks every value the ALU sequence holds (``C*v``, ``C*v + A``, each
        ``W_k*max(v, b_k)`` and each partial sum) against int32; raises
        :class:`CompileError` if one would leave it (the lanes would wrap).
        """
        v = np.asarray(v)
        if v.size and (v.min() < -128 or v.max() > 127):
            raise CompileError("ReluSum: inputs must be stored int8 values in [-128, 127]")
        v = v.astype(np.int64)
        total = _int32_checked(self.slope * v, "slope*v")
        total = _int32_checked(total + self.offset, "slope*v + offset")
        for k, (b, w) in enumerate(self.terms):
            term = _int32_checked(w * np.maximum(v, b), f"term {k}: W*max(v, {b})")
            total = _int32_checked(total + term, f"partial sum through term {k}")
        return total


def _int32_checked(values: np.ndarray, what: str) -> np.ndarray:
    if values.size and (values.min() < INT32_MIN or values.max() > INT32_MAX):
        raise CompileError(f"ReluSum: {what} leaves int32 (range {values.min()}..{values.max()}); "
                           "refit with fit_relu_sum, which picks a shift that fits")
    return values


@dataclass(frozen=True)
class AluStep:
    """One ALU row pass of the lowering: ``dst = op(dst, operand)``.

    ``src``: the tensor operand's row group (``"acc"``, ``"S"``, ``"T"``, or ``"param"``: a
    parameter row every lane of which holds ``value``); ``None``: the immediate ``value``.
    """

    op: str
    dst: str
    src: str | None = None
    value: int | None = None

    @property
    def use_imm(self) -> bool:
        return self.src is None


def _constant_step(op: str, dst: str, value: int, imm_bits: int | None) -> AluStep:
    """``dst = op(dst, value)`` with the immediate if it fits, else a parameter row."""
    if _fits_signed(value, imm_bits):
        return AluStep(op, dst, value=value)
    return AluStep(op, dst, src="param", value=value)


def _fits_signed(value: int, bits: int | None) -> bool:
    return bits is None or -(1 << (bits - 1)) <= value < (1 << (bits - 1))


def _linear_steps(rs: ReluSum, dst: str, imm_bits: int | None) -> list[AluStep]:
    """``dst = C*v + A`` (``dst`` is ``acc`` itself or a scratch group; a zero scratch
    group is left empty, [])."""
    if rs.slope == 0:
        empty = rs.offset == 0 and dst != "acc"
        return [] if empty else [_constant_step("MOV", dst, rs.offset, imm_bits)]
    steps = [] if dst == "acc" else [AluStep("MOV", dst, src="acc")]
    if rs.slope != 1:
        steps.append(_constant_step("MUL", dst, rs.slope, imm_bits))
    if rs.offset:
        steps.append(_constant_step("ADD", dst, rs.offset, imm_bits))
    return steps


def _term_steps(b: int, w: int, s_empty: bool, imm_bits: int | None) -> list[AluStep]:
    """A term other than the last, accumulated into ``S`` (or started there if it is empty)."""
    dst = "S" if s_empty else "T"
    steps = [AluStep("MOV", dst, src="acc"), AluStep("MAX", dst, value=b)]
    if s_empty:
        return steps + ([_constant_step("MUL", dst, w, imm_bits)] if w != 1 else [])
    if w == -1:
        return steps + [AluStep("SUB", "S", src="T")]
    if w != 1:
        steps.append(_constant_step("MUL", "T", w, imm_bits))
    return steps + [AluStep("ADD", "S", src="T")]


def alu_program(rs: ReluSum, *, imm_bits: int | None = None) -> list[AluStep]:
    """The ALU row passes that compute ``rs`` (the lowering of the module doc).

    ``imm_bits``: the config's ALU immediate width (``get_isa(config).imm_bits``); a constant
    that does not fit it reads a parameter row. ``None``: every constant is an immediate.
    """
    terms = [(b, w) for b, w in rs.terms if w != 0]
    if not terms:
        steps = _linear_steps(rs, "acc", imm_bits)
    else:
        steps = _linear_steps(rs, "S", imm_bits)
        s_empty = not steps
        for b, w in terms[:-1]:
            steps += _term_steps(b, w, s_empty, imm_bits)
            s_empty = False
        b, w = terms[-1]
        steps.append(AluStep("MAX", "acc", value=b))
        if w != 1:
            steps.append(_constant_step("MUL", "acc", w, imm_bits))
        if not s_empty:
            steps.append(AluStep("ADD", "acc", src="S"))
    if rs.shift:
        steps.append(AluStep("SHR", "acc", value=rs.shift))
    return steps


def alu_steps(rs: ReluSum, *, imm_bits: int | None = None) -> int:
    """The number of ALU row passes the lowering takes (:func:`alu_program`)."""
    return len(alu_program(rs, imm_bits=imm_bits))


def alu_cycles_per_row(rs: ReluSum, *, imm_bits: int | None = None) -> int:
    """ALU issue cycles per accumulator row of the lowering, from the registry's timing
    (``ii_imm`` for an immediate operand, ``ii_tensor`` for a row operand)."""
    return sum(ALU_OPS.by_name(step.op).timing.ii(step.use_imm)
               for step in alu_program(rs, imm_bits=imm_bits))


# --- the fit ----------------------------------------------------------------------------

def _table_values(table: np.ndarray) -> np.ndarray:
    """The table (byte order) as floats in ``v`` order (``v = -128..127``)."""
    t = np.asarray(table)
    if t.shape != (256,) or not np.issubdtype(t.dtype, np.integer) \
            or t.min() < -128 or t.max() > 127:
        raise CompileError(f"table must be 256 int8 values indexed by the input's byte, got "
                           f"shape {t.shape} dtype {t.dtype}",
                           fix={PYTHON: "pass np.int8 table[256] with y = "
                                          "table[np.int8(v).view(np.uint8)]"})
    return np.roll(t.astype(np.float64), 128)


def _weight_values(weights: np.ndarray | None) -> np.ndarray:
    """The weights (byte order; ``None``: uniform) as floats in ``v`` order, summing to 1."""
    if weights is None:
        return np.full(256, 1 / 256)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (256,) or not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
        raise CompileError(f"weights must be 256 finite non-negative numbers, not all zero "
                           f"(the calibration distribution of v in byte order), got shape "
                           f"{w.shape}", fix={PYTHON: "pass weights=np.bincount("
                                              "v.view(np.uint8).ravel(), minlength=256) or None"})
    return np.roll(w / w.sum(), 128)


@dataclass(frozen=True)
class _Problem:
    """The weighted least-squares problem over the support (``v`` with weight > 0).

    Columns: 1, v, then relu(v - b) for each candidate breakpoint ``b`` (the integers
    strictly inside the support's range: elsewhere a ReLU is linear or zero on it), each
    weighted and scaled to unit norm; ``gram`` and ``moment`` are their inner products
    with each other and with the weighted function, so scoring a candidate costs no pass
    over the data.
    """

    v: np.ndarray           # support values of v
    sw: np.ndarray          # sqrt of their weights
    fw: np.ndarray          # sw * f(v)
    candidates: np.ndarray  # candidate breakpoints, ascending
    gram: np.ndarray        # (2 + M) x (2 + M) inner products of the unit columns
    moment: np.ndarray      # their inner products with fw

    @classmethod
    def build(cls, f: np.ndarray, w: np.ndarray) -> "_Problem":
        keep = w > 0
        v, sw = V[keep], np.sqrt(w[keep])
        candidates = np.arange(v.min() + 1, v.max(), dtype=np.int64)
        cols = np.concatenate([np.ones((len(v), 1)), v[:, None],
                               np.maximum(v[:, None] - candidates[None, :], 0)], axis=1)
        cols = sw[:, None] * cols
        cols /= np.maximum(np.linalg.norm(cols, axis=0), 1e-300)
        fw = sw * f[keep]
        return cls(v, sw, fw, candidates, cols.T @ cols, cols.T @ fw)

    def basis(self, breaks: list[int]) -> np.ndarray:
        """Weighted columns 1, v, relu(v - b) for ``breaks``."""
        cols = [np.ones_like(self.v), self.v] + [np.maximum(self.v - b, 0) for b in breaks]
        return self.sw[:, None] * np.stack(cols, axis=1).astype(np.float64)

    @property
    def negligible(self) -> float:
        """A change of the weighted squared error below the arithmetic's noise."""
        return 1e-9 * (float(self.fw @ self.fw) + 1.0)

    def coefficients(self, breaks: list[int]) -> np.ndarray:
        """(a, c, w_1..w_K) of the weighted least-squares fit ``a + c*v + sum w_k relu(v - b_k)``
        (minimum norm)."""
        coef, *_ = np.linalg.lstsq(self.basis(breaks), self.fw, rcond=None)
        return coef

    def squared_error(self, breaks: list[int]) -> float:
        """The weighted squared error of the least-squares fit with ``breaks``."""
        return float(np.sum((self.fw - self.basis(breaks) @ self.coefficients(breaks)) ** 2))

    def gains(self, breaks: list[int]) -> np.ndarray:
        """For each candidate, how much adding it to the fit with ``breaks`` lowers the
        weighted squared error (its part orthogonal to the fit's columns, from the Gram
        matrix; a tiny ridge keeps a rank-deficient set solvable)."""
        chosen = np.concatenate([[0, 1], 2 + np.searchsorted(self.candidates, breaks)])
        g_ss = self.gram[np.ix_(chosen, chosen)] + 1e-10 * np.eye(len(chosen))
        g_sc = self.gram[chosen, 2:]
        solved = np.linalg.solve(g_ss, np.concatenate([self.moment[chosen, None], g_sc], axis=1))
        num = self.moment[2:] - g_sc.T @ solved[:, 0]
        den = 1.0 - np.einsum("ij,ij->j", g_sc, solved[:, 1:])
        return np.where(den > 1e-9, num ** 2 / np.maximum(den, 1e-9), 0.0)


def _quantile_breakpoints(prob: _Problem, k: int) -> list[int]:
    """``k`` breakpoints at the weighted quantiles of v (collisions filled greedily)."""
    cdf = np.cumsum(prob.sw ** 2)
    targets = np.arange(1, k + 1) / (k + 1) * cdf[-1]
    at = prob.v[np.minimum(np.searchsorted(cdf, targets), len(prob.v) - 1)]
    lo, hi = prob.candidates[0], prob.candidates[-1]
    return _greedy_breakpoints(prob, sorted({int(b) for b in np.clip(at, lo, hi)}), k)


def _greedy_breakpoints(prob: _Problem, breaks: list[int], k: int) -> list[int]:
    """``breaks`` completed to ``k`` by adding, one at a time, the best candidate (stopping
    early when none lowers the error)."""
    while len(breaks) < k:
        gain = prob.gains(breaks)
        gain[np.searchsorted(prob.candidates, breaks)] = -1.0
        if gain.max() <= prob.negligible:
            break
        breaks = sorted(breaks + [int(prob.candidates[int(np.argmax(gain))])])
    return breaks


def _pruned(prob: _Problem, breaks: list[int]) -> list[int]:
    """``breaks`` without those whose removal would not raise the error (a support with
    few distinct inputs has fewer useful breakpoints than asked for)."""
    while breaks:
        loss = [prob.gains(breaks[:k] + breaks[k + 1:])[np.searchsorted(prob.candidates, b)]
                for k, b in enumerate(breaks)]
        k = int(np.argmin(loss))
        if loss[k] > prob.negligible:
            break
        breaks = breaks[:k] + breaks[k + 1:]
    return breaks


def _search_breakpoints(prob: _Problem, breaks: list[int]) -> list[int]:
    """Coordinate search: move each breakpoint in turn to the candidate that lowers the
    weighted squared error most, until a sweep moves none."""
    breaks = list(breaks)
    for _ in range(MAX_SWEEPS):
        moved = False
        for k in range(len(breaks)):
            others = breaks[:k] + breaks[k + 1:]
            gain = prob.gains(others)
            gain[np.searchsorted(prob.candidates, others)] = -1.0
            best = int(np.argmax(gain))
            current = gain[np.searchsorted(prob.candidates, breaks[k])]
            if gain[best] > current * (1 + 1e-9) + 1e-15:
                breaks[k] = int(prob.candidates[best])
                moved = True
        breaks.sort()
        if not moved:
            break
    return breaks


def _fixed_point(coef: np.ndarray, breaks: list[int], shift: int) -> ReluSum | None:
    """The coefficients at ``shift`` fraction bits, or None if they would not fit int32."""
    scale = float(1 << shift)
    if np.max(np.abs(coef)) * scale * 256 >= 2.0 ** 62:
        return None
    slope = int(round(coef[1] * scale))
    weights = [int(round(w * scale)) for w in coef[2:]]
    offset = int(round(coef[0] * scale)) - sum(w * b for w, b in zip(weights, breaks))
    rs = _normalised(offset, slope, [(b, w) for b, w in zip(breaks, weights) if w], shift)
    try:
        rs.accumulate(V)
    except CompileError:
        return None
    return rs


def _normalised(offset: int, slope: int, terms: list[tuple[int, int]], shift: int) -> ReluSum:
    """The ReluSum computing the same results with the smallest shift (drop common factors
    of two: ReLU itself becomes a lone MAX); ``offset`` here excludes the rounding half."""
    while shift and all(x % 2 == 0 for x in [offset, slope] + [w for _, w in terms]):
        offset, slope, shift = offset // 2, slope // 2, shift - 1
        terms = [(b, w // 2) for b, w in terms]
    half = 1 << (shift - 1) if shift else 0
    return ReluSum(offset + half, slope, tuple(terms), shift)


def _quantised(coef: np.ndarray, breaks: list[int], imm_bits: int | None) -> ReluSum:
    """The fit at the largest shift that keeps every value in int32 (and, with ``imm_bits``,
    C and every W_k in the immediate field, if any shift does)."""
    largest = None
    for shift in range(MAX_SHIFT, -1, -1):
        rs = _fixed_point(coef, breaks, shift)
        if rs is None:
            continue
        if largest is None:
            largest = rs
        if all(_fits_signed(x, imm_bits) for x in [rs.slope] + [w for _, w in rs.terms]):
            return rs
    if largest is None:
        raise CompileError(f"ReluSum coefficients {coef.tolist()} do not fit int32 at any shift")
    return largest


def _fit_pieces(prob: _Problem, pieces: int, imm_bits: int | None) -> ReluSum:
    k = min(pieces, len(prob.candidates))
    breaks = []
    if k:  # two starts (quantiles, greedy), the better local optimum of the two
        starts = [_quantile_breakpoints(prob, k), _greedy_breakpoints(prob, [], k)]
        breaks = min((_pruned(prob, _search_breakpoints(prob, b)) for b in starts),
                     key=lambda b: (prob.squared_error(b), len(b)))
    return _quantised(prob.coefficients(breaks), breaks, imm_bits)


def _check_mode(pieces: object, tolerance: object) -> None:
    if (pieces is None) == (tolerance is None):
        raise CompileError("fit_relu_sum takes exactly one of pieces= and tolerance=, got "
                           f"pieces={pieces!r}, tolerance={tolerance!r}", fix={PYTHON: _PIECES_FIX})
    if pieces is not None and (isinstance(pieces, bool) or not isinstance(pieces, (int, np.integer))
                               or not 0 <= pieces <= MAX_PIECES):
        raise CompileError(f"fit_relu_sum: pieces={pieces!r} is not an int in 0..{MAX_PIECES}",
                           fix={PYTHON: _PIECES_FIX})
    if tolerance is not None and (isinstance(tolerance, bool)
                                  or not isinstance(tolerance, (int, float, np.number))
                                  or not np.isfinite(tolerance) or tolerance < 0):
        raise CompileError(f"fit_relu_sum: tolerance={tolerance!r} is not a finite number >= 0 "
                           "(the max error in output LSBs)", fix={PYTHON: _PIECES_FIX})


def fit_relu_sum(table: np.ndarray, weights: np.ndarray | None = None, *,
                 pieces: int | None = None, tolerance: float | None = None,
                 imm_bits: int | None = None) -> ReluSum:
    """Fit ``table`` (256 int8, byte order) by a sum of shifted ReLUs (module doc).

    ``weights``: 256 non-negative numbers in byte order, the calibration distribution of
    the input (``None``: uniform); the fit minimises the weighted squared error, and only
    inputs of positive weight count. ``pieces=K``: K terms (fewer when the support has
    fewer useful breakpoints or a term's weight rounds to zero). ``tolerance=t``: the
    smallest K (up to :data:`MAX_PIECES`) whose max error over the support is <= t output
    LSBs. ``imm_bits``: the config's ALU immediate width, to keep C and W_k immediates.
    """
    _check_mode(pieces, tolerance)
    prob = _Problem.build(_table_values(table), _weight_values(weights))
    if pieces is not None:
        return _fit_pieces(prob, int(pieces), imm_bits)
    best: tuple[int, int] | None = None
    for k in range(min(MAX_PIECES, len(prob.candidates)) + 1):
        rs = _fit_pieces(prob, k, imm_bits)
        worst, _ = relu_sum_error(table, rs, weights)
        if worst <= tolerance:
            return rs
        best = (worst, k) if best is None or worst < best[0] else best
    raise CompileError(f"fit_relu_sum: no fit of up to {k} pieces reaches tolerance={tolerance} "
                       f"LSB (the best, K={best[1]}, has max error {best[0]} LSB)",
                       fix={PYTHON: f"pass tolerance>={best[0]} or pieces=K, or use a config "
                                      "with the lookup-table unit"})


def relu_sum_error(table: np.ndarray, rs: ReluSum,
                   weights: np.ndarray | None = None) -> tuple[int, float]:
    """Max and weighted mean ``|rs(v) - table(v)|`` in output LSBs over the v of positive
    weight (``weights`` in byte order; ``None``: all 256, uniformly)."""
    f, w = _table_values(table), _weight_values(weights)
    err = np.abs(rs.evaluate(V).astype(np.float64) - f)
    keep = w > 0
    return int(err[keep].max()), float(np.sum(w[keep] * err[keep]))


def accuracy_table(table: np.ndarray, weights: np.ndarray | None,
                   ks: tuple[int, ...] = (2, 4, 8, 16), *,
                   imm_bits: int | None = None) -> list[dict]:
    """For each K in ``ks``: the fit's max and mean error (output LSBs, over the weighted
    support) and its ALU cycles per accumulator row, as rows for a benchmark to print."""
    rows = []
    for k in ks:
        rs = fit_relu_sum(table, weights, pieces=k, imm_bits=imm_bits)
        worst, mean = relu_sum_error(table, rs, weights)
        rows.append({"K": k, "max_lsb": worst, "mean_lsb": mean,
                     "alu_cycles_per_row": alu_cycles_per_row(rs, imm_bits=imm_bits)})
    return rows
