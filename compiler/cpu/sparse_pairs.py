"""The N:M sparse int8 matmul for a few rows (a small batch through a dense layer):
``a [M, K] @ W.T -> int32 [M, O]`` for a constant ``W (O, K)`` with an even ``n``
(2:4, 2:8, 4:8).

With few rows, :mod:`.sparse`'s column form pays an index load and an interleave per
kept weight for only ``M`` columns. Here each pair of slots lies in one group (``n``
is even), so it multiplies two of the group's ``m`` inputs: one of the ``C(m, 2)``
*combinations* ``(i, j)``. Each call first tabulates, for every group and combination,
the rows' int16 input pairs ``(a[q, g*m+i], a[q, g*m+j])`` (``pairs[g, c, q]``: 1.5x
the input for 2:4, 3.5x for 4:8), so a pair of slots is one load of ``M`` ready-made
pairs and one ``pmaddwd`` (``vpdpwssd``) with the broadcast weight pair: no shuffle,
one index per two weights. Bit-identical to :func:`.conv.build_matmul_int8` (int32
sums wrap).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import llvmlite.ir as ir
import numpy as np

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module
from .layout_ops import Scratch
from .sparse import _madd, _min, _splat
from .sparse_layout import nm_slots
from .vector_width import host_vector_bits

__all__ = ["PairLayout", "build_matmul_nm_pairs", "nm_pair_layout"]

_I16 = ir.IntType(16)
#: Output rows computed together: independent accumulator chains.
_ROWS = 8


@dataclass(frozen=True)
class PairLayout:
    """A weight as pairs of slots: ``offsets[o, j]`` (uint8) the combination ``c`` of
    pair ``j`` (whose group is ``j // (n / 2)``: every group has ``n / 2`` pairs, in
    order), ``values[o, j]`` its two weights as int16 (low half first) in one int32:
    5 bytes per two kept weights. ``lanes`` rows of ``a`` per vector."""

    pattern: tuple[int, int]
    rows: int
    reduction: int
    lanes: int
    values: np.ndarray
    offsets: np.ndarray

    @property
    def combinations(self) -> list[tuple[int, int]]:
        return list(combinations(range(self.pattern[1]), 2))

    @property
    def pairs(self) -> int:
        return self.values.shape[1]


def nm_pair_layout(w: np.ndarray, pattern: tuple[int, int], rows: int,
                   vector_bits: int | None = None) -> PairLayout:
    """The pair layout of the int8 weight ``w (O, K)`` meeting ``pattern`` (``n`` even)
    along K, for ``rows`` rows of ``a`` (the vectors narrow to what they fill)."""
    n, m = pattern
    if n % 2 or w.ndim != 2:
        raise CpuKernelError(f"N:M pair kernel: takes a 2-D weight and an even n, not "
                             f"{n}:{m} on {list(w.shape)}")
    k, vals = nm_slots(np.asarray(w)[:, :, None], n, m)[::-1]
    combo = {c: i for i, c in enumerate(combinations(range(m), 2))}
    pos_a, pos_b = k[:, 0::2] % m, k[:, 1::2] % m
    index = np.vectorize(lambda a, b: combo[a, b], otypes=[np.uint8])(pos_a, pos_b)
    halves = vals.astype(np.int16).view(np.uint16).astype(np.uint32)
    packed = (halves[:, 0::2] | (halves[:, 1::2] << 16)).view(np.int32)
    bits = vector_bits or host_vector_bits()
    while bits > 128 and bits // 32 >= 2 * rows:
        bits //= 2
    return PairLayout((n, m), w.shape[0], w.shape[1], bits // 32,
                      np.ascontiguousarray(packed), np.ascontiguousarray(index, np.uint8))


def build_matmul_nm_pairs(a: TensorSpec, layout: PairLayout,
                          name: str = "matmul_pairs_nm") -> CpuKernel:
    """``a [M, K]`` int8 @ the layout's weight -> int32 ``[M, O]``: inputs ``a``, the
    layout's ``values`` and ``offsets`` (the contract of :func:`.conv.build_matmul_int8`
    with the weight replaced by them)."""
    if a.dtype != "int8" or a.ndim != 2 or a.shape[1] != layout.reduction:
        raise CpuKernelError(f"N:M pair kernel: A {a} does not fit an int8 layout of "
                             f"{layout.reduction} inputs")
    inputs = (a, TensorSpec(layout.values.shape, "int32"),
              TensorSpec(layout.offsets.shape, "uint8"))
    out = TensorSpec((a.shape[0], layout.rows), "int32")
    module = new_module(name)
    fn, b = kernel_function(module, "entry", inputs, (out,))
    if out.size:
        _emit(b, layout, a.shape[0], *fn.args)
    b.ret_void()
    return CpuKernel(name, str(module), "entry", inputs, (out,))


def _emit(b: ir.IRBuilder, lay: PairLayout, m_rows: int, a, values, offsets, out) -> None:
    """Per block of ``lanes`` rows of ``a``: the pair table, then every output row."""
    lanes, combos = lay.lanes, lay.combinations
    groups = lay.reduction // lay.pattern[1]
    scratch = Scratch(b)
    table = scratch.alloc(_I16, groups * len(combos) * lanes * 2, name="pairs")
    U.fill(b, table, groups * len(combos) * lanes * 2, ir.Constant(_I16, 0))
    with U.for_range(b, m_rows, step=lanes, name="mb") as m0:
        valid = _min(b, U.i64(lanes), b.sub(U.i64(m_rows), m0))
        _tabulate(b, lay, a, table, m0, valid)
        _rows(b, lay, table, values, offsets, out, m0, valid)
    scratch.release()


def _tabulate(b, lay: PairLayout, a, table, m0, valid) -> None:
    """``table[g, c, q] = (a[m0 + q, g*m + i], a[m0 + q, g*m + j])`` for combination
    ``c = (i, j)`` and ``q < valid``."""
    m, combos, lanes = lay.pattern[1], lay.combinations, lay.lanes
    with U.for_range(b, lay.reduction // m, name="g") as g, \
            U.for_range(b, valid, name="q") as q:
        src = b.add(b.mul(b.add(m0, q), U.i64(lay.reduction)), b.mul(g, U.i64(m)))
        xs = [b.sext(U.load(b, a, b.add(src, U.i64(i))), _I16) for i in range(m)]
        for c, (i, j) in enumerate(combos):
            at = b.mul(b.add(b.mul(b.add(b.mul(g, U.i64(len(combos))), U.i64(c)),
                                   U.i64(lanes)), q), U.i64(2))
            U.store(b, xs[i], table, at)
            U.store(b, xs[j], table, b.add(at, U.i64(1)))


def _rows(b, lay: PairLayout, table, values, offsets, out, m0, valid) -> None:
    """Every output row (``_ROWS`` at a time, then one by one) over all its pairs."""
    full = lay.rows - lay.rows % _ROWS
    if full:
        with U.for_range(b, full, step=_ROWS, name="o") as o:
            _row_block(b, lay, table, values, offsets, out, m0, valid,
                       [b.add(o, U.i64(r)) for r in range(_ROWS)])
    if lay.rows > full:
        with U.for_range(b, lay.rows, full, name="or") as o:
            _row_block(b, lay, table, values, offsets, out, m0, valid, [o])


def _row_block(b, lay: PairLayout, table, values, offsets, out, m0, valid, os) -> None:
    lanes, pairs = lay.lanes, lay.pairs
    v16, v32 = ir.VectorType(_I16, 2 * lanes), ir.VectorType(U.I32, lanes)
    table_v = b.bitcast(table, v16.as_pointer())

    def body(b, j, accs):
        new = []
        group = b.mul(b.udiv(j, U.i64(lay.pattern[0] // 2)), U.i64(len(lay.combinations)))
        for o, acc in zip(os, accs):
            at = b.add(b.mul(o, U.i64(pairs)), j)
            w = b.bitcast(_splat(b, U.load(b, values, at), lanes), v16)
            row = b.add(group, b.zext(U.load(b, offsets, at), U.I64))
            x = b.load(b.gep(table_v, [row], inbounds=True), align=2)
            new.append(b.add(acc, _madd(b, x, w)))
        return tuple(new)
    accs = U.reduce_range(b, pairs, (ir.Constant(v32, None),) * len(os), body, name="pair")
    for o, acc in zip(os, accs):
        for q in range(lanes):
            with b.if_then(b.icmp_signed("<", U.i64(q), valid)):
                idx = b.add(b.mul(b.add(m0, U.i64(q)), U.i64(lay.rows)), o)
                U.store(b, b.extract_element(acc, U.I32(q)), out, idx)
