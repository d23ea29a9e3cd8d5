"""Loop-nest plans: what a GEMM or ALU instruction's index arrays imply, computed once.

Which buffer rows a GEMM or ALU instruction reads and writes depends on its fields and
on the uop words it runs, never on the data. :class:`NestPlanner` derives everything
that follows from them once per ``(instruction, uop words)``: the index arrays and their
bounds and hazard checks, the accumulator banks, and for a GEMM how its operations form
dense matrix products. A convolution repeats a few hundred distinct plans thousands of
times (ResNet-18: 901 distinct of 4,992 GEMMs), and the runs of one program all of them.

A GEMM whose accumulator rows each sum the same number K of operations, with the same
weight entries in the same order for every row of a group, is one matrix product per
group: ``(rows x K*block_in) @ (K*block_in x block_out)``, a BLAS call instead of an
operation at a time. Float arithmetic is exact while every partial sum stays below
2**24 (float32) or 2**53 (float64) in magnitude; the plan picks the narrowest exact type
from the operand widths and K.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tessera.config import HwConfig
from tessera.errors import BoundsError, HazardError
from tessera.isa import ALU_OPS, Alu, Gemm, get_isa
from tessera.isa.intrinsics import Intrinsic
from tessera.regmap import ErrorCode
from tessera.timing import gemm_hazard_distance

#: Weight patterns per GEMM above which the dense form (a product per pattern) is given up.
MAX_DENSE_GROUPS = 8
#: Plans kept per config before the cache starts over (ResNet-18: 2,110 plans, 13.5 MB).
MAX_PLANS = 20_000


def exact_float(terms: int, a_bits: int, b_bits: int) -> type:
    """The narrowest type whose arithmetic is exact for sums of ``terms`` products of
    signed ``a_bits`` x ``b_bits`` integers: float32, float64 or int64."""
    bound = terms << (a_bits - 1) << (b_bits - 1)
    return np.float32 if bound < (1 << 24) else np.float64 if bound < (1 << 53) else np.int64


def previous_write(writes: np.ndarray, reads: np.ndarray) -> np.ndarray:
    """For each position j, the last position i < j with ``writes[i] == reads[j]`` (-1: none)."""
    n = writes.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    pos = np.arange(n, dtype=np.int64)
    keys = np.sort(writes.astype(np.int64) * n + pos)
    hit = np.searchsorted(keys, reads.astype(np.int64) * n + pos, side="left") - 1
    found = keys[np.maximum(hit, 0)]
    ok = (hit >= 0) & (found // n == reads)
    return np.where(ok, found % n, -1)


Index = "slice | np.ndarray"


def as_index(entries: np.ndarray) -> slice | np.ndarray:
    """``entries`` as a slice when they are consecutive (a slice reads and writes a buffer
    without the gather of an index array), else unchanged."""
    if entries.size and entries[-1] - entries[0] == entries.size - 1 and \
            np.array_equal(entries, np.arange(entries[0], entries[0] + entries.size)):
        return slice(int(entries[0]), int(entries[0]) + entries.size)
    return entries


@dataclass(frozen=True)
class DenseGroup:
    """Accumulator rows (positions in the plan's ``rows``; None: all) that share weights."""

    select: np.ndarray | None
    weights: np.ndarray          # (K,) weight-buffer entries, in the rows' operation order


@dataclass(frozen=True)
class GemmPlan:
    """A GEMM's operations: ``rows`` (sorted, unique) and how to sum into them."""

    ops: int
    banks: frozenset[int]
    #: The accumulator rows written, sorted (a slice when consecutive).
    rows: slice | np.ndarray
    #: Dense form: (len(rows), K) input entries per row, the weight groups, the exact type.
    src: np.ndarray | None = None
    groups: tuple[DenseGroup, ...] = ()
    kind: type = np.int64
    #: General form: each operation's input and weight entry, sorted by row, and where
    #: each row's operations start.
    wgt: np.ndarray | None = None
    starts: np.ndarray | None = None


@dataclass(frozen=True)
class AluBatch:
    """Operations of an ALU instruction that run as one: their rows and operand rows
    (None: the immediate), each a slice when consecutive."""

    size: int
    dst: slice | np.ndarray
    src: slice | np.ndarray | None


@dataclass(frozen=True)
class AluPlan:
    """An ALU instruction's operations, cut into batches with no row read after it was
    written inside a batch (those must see the new value)."""

    ops: int
    banks: frozenset[int]
    batches: tuple[AluBatch, ...]
    #: The op registered for the opcode when the plan was made (its hazard distance cut the
    #: batches); held so the plan's cache key, which names the op by ``id``, stays unique.
    op: Intrinsic | None = None


class NestPlanner:
    """Builds and keeps the plans of one config's instructions."""

    _shared: dict[HwConfig, dict] = {}

    def __init__(self, config: HwConfig) -> None:
        self.config = config
        self.isa = get_isa(config)
        self._plans = self._shared.setdefault(config, {})

    def _cached(self, key_head: object, uops: np.ndarray,
                build: Callable[[], GemmPlan | AluPlan]) -> GemmPlan | AluPlan:
        key = (key_head, uops.tobytes())
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            plan = self._plans[key] = build()
        return plan

    # ------------------------------------------------------------ indices
    def loop_indices(self, insn: Gemm | Alu, uops: np.ndarray, index: int,
                     with_wgt: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Every operation's (dst, src, wgt) entries, in the nest's order."""
        if insn.uop_end > self.config.uop_depth:
            raise BoundsError(f"uop_end {insn.uop_end} exceeds the uop buffer of "
                              f"{self.config.uop_depth} entries", index=index, where=insn.label,
                              code=ErrorCode.UOP_BOUNDS)
        dst_u, src_u, wgt_u = self.isa.decode_uop_fields(uops)
        o = np.arange(insn.iter_out, dtype=np.int64)[:, None, None]
        i = np.arange(insn.iter_in, dtype=np.int64)[None, :, None]

        def nest(base: np.ndarray, f_out: int, f_in: int) -> np.ndarray:
            return (base[None, None, :] + o * f_out + i * f_in).reshape(-1)

        dst = nest(dst_u, insn.dst_factor_out, insn.dst_factor_in)
        src = nest(src_u, insn.src_factor_out, insn.src_factor_in)
        wgt = nest(wgt_u, insn.wgt_factor_out, insn.wgt_factor_in) if with_wgt else None
        return dst, src, wgt

    def _check_indices(self, insn: Gemm | Alu, index: int, name: str, values: np.ndarray,
                       depth: int) -> None:
        bad = np.nonzero(values >= depth)[0]
        if bad.size:
            raise BoundsError(
                f"{name} index {int(values[bad[0]])} is past the {depth}-entry buffer at "
                f"{op_position(insn, int(bad[0]))}", index=index, where=insn.label,
                code=ErrorCode.INDEX_BOUNDS)

    @staticmethod
    def _check_hazard(insn: Gemm | Alu, index: int, dst: np.ndarray, reads: np.ndarray,
                      distance: int, what: str) -> np.ndarray:
        prev = previous_write(dst, reads)
        gap = np.arange(dst.size) - prev
        bad = np.nonzero((prev >= 0) & (gap < distance))[0]
        if bad.size:
            j = int(bad[0])
            raise HazardError(
                f"{what} reads accumulator row {int(reads[j])} at "
                f"{op_position(insn, j)}, only {int(gap[j])} op(s) after it was written "
                f"at {op_position(insn, int(prev[j]))}; the pipeline needs {distance}: "
                "reorder the uops or loops so writes to a row are further apart",
                index=index, where=insn.label)
        return prev

    def _banks(self, *rows: np.ndarray) -> frozenset[int]:
        """The accumulator banks ``rows`` fall in."""
        return frozenset(int(b) for r in rows for b in np.unique(r // self.config.acc_bank_rows))

    # --------------------------------------------------------------- GEMM
    def gemm(self, insn: Gemm, uops: np.ndarray, index: int) -> GemmPlan:
        """The plan of GEMM ``insn`` over ``uops``; raises its bounds and hazard errors."""
        return self._cached(insn, uops, lambda: self._gemm_plan(insn, uops, index))

    def _gemm_plan(self, insn: Gemm, uops: np.ndarray, index: int) -> GemmPlan:
        c = self.config
        dst, src, wgt = self.loop_indices(insn, uops, index, with_wgt=True)
        self._check_indices(insn, index, "accumulator (dst)", dst, c.acc_depth)
        banks = self._banks(dst)
        if insn.reset:
            return GemmPlan(dst.size, banks, as_index(np.unique(dst)))
        self._check_indices(insn, index, "input (src)", src, c.inp_depth)
        self._check_indices(insn, index, "weight", wgt, c.wgt_depth)
        self._check_hazard(insn, index, dst, dst, gemm_hazard_distance(), "GEMM")
        order = np.argsort(dst, kind="stable")
        rows, starts, counts = np.unique(dst[order], return_index=True, return_counts=True)
        if dst.size and (counts == counts[0]).all():
            k = int(counts[0])
            groups = self._dense_groups(wgt[order].reshape(rows.size, k))
            if groups is not None:
                kind = exact_float(k * c.block_in, c.inp_width, c.wgt_width)
                return GemmPlan(dst.size, banks, as_index(rows),
                                src[order].reshape(rows.size, k), groups, kind)
        return GemmPlan(dst.size, banks, as_index(rows), src=src[order], wgt=wgt[order],
                        starts=starts,
                        kind=exact_float(c.block_in, c.inp_width, c.wgt_width))

    @staticmethod
    def _dense_groups(weights: np.ndarray) -> tuple[DenseGroup, ...] | None:
        """Rows grouped by their weight entries (``weights``: rows x K), or None when
        there are too many patterns for a product each."""
        if (weights == weights[0]).all():
            return (DenseGroup(None, weights[0]),)
        patterns, which = np.unique(weights, axis=0, return_inverse=True)
        if len(patterns) > MAX_DENSE_GROUPS:
            return None
        which = which.reshape(-1)
        return tuple(DenseGroup(np.flatnonzero(which == g), p) for g, p in enumerate(patterns))

    # ---------------------------------------------------------------- ALU
    def alu(self, insn: Alu, uops: np.ndarray, index: int) -> AluPlan:
        """The plan of ALU ``insn`` over ``uops``; raises its bounds and hazard errors."""
        # Per registration of the opcode: a plug-in op registered again may have another
        # latency, hence other batches.
        op = ALU_OPS.get(insn.alu_op)
        return self._cached((insn, id(op)), uops,
                            lambda: self._alu_plan(insn, op, uops, index))

    def _alu_plan(self, insn: Alu, op: Intrinsic | None, uops: np.ndarray,
                  index: int) -> AluPlan:
        c = self.config
        dst, src, _ = self.loop_indices(insn, uops, index, with_wgt=False)
        self._check_indices(insn, index, "accumulator (dst)", dst, c.acc_depth)
        if insn.reset:
            return AluPlan(dst.size, self._banks(dst), (AluBatch(dst.size, as_index(dst), None),),
                           op)
        distance = op.timing.hazard_distance(insn.use_imm)
        prev = np.full(dst.size, -1, dtype=np.int64)
        if op.timing.reads_dst:
            prev = self._check_hazard(insn, index, dst, dst, distance, f"ALU {op.name}")
        banks = self._banks(dst)
        if not insn.use_imm:
            self._check_indices(insn, index, "accumulator (src)", src, c.acc_depth)
            banks |= self._banks(src)
            prev = np.maximum(prev, self._check_hazard(insn, index, dst, src, distance,
                                                       f"ALU {op.name} operand"))
        cuts, start = [], 0
        for j in np.nonzero(prev >= 0)[0]:
            if prev[j] >= start:
                cuts.append(slice(start, int(j)))
                start = int(j)
        cuts.append(slice(start, dst.size))
        return AluPlan(dst.size, banks, tuple(
            AluBatch(s.stop - s.start, as_index(dst[s]),
                     None if insn.use_imm else as_index(src[s]))
            for s in cuts if s.stop > s.start), op)


def op_position(insn: Gemm | Alu, op: int) -> str:
    """Operation ``op`` of ``insn``'s nest as its loop indices and uop."""
    uops = insn.uop_end - insn.uop_begin
    o, rest = divmod(op, insn.iter_in * uops)
    i, u = divmod(rest, uops)
    return f"iteration (o={o}, i={i}, uop={insn.uop_begin + u})"
