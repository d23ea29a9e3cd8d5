"""Mapping a loop nest onto one GEMM or ALU instruction: two hardware loops and a uop kernel.

A nest is a list of :class:`Dim` s. Each dimension has, per index, an offset
into the destination (accumulator), source (input buffer for GEMM,
accumulator for ALU) and weight index spaces; most dimensions are *affine*
(offsets are ``k * stride``), some are explicit lists (e.g. the block pattern
of a grouped convolution). The instruction computes the sum of one offset per
dimension, for every combination.

:func:`map_nest` picks up to two affine dimensions for the hardware loops
(``iter_out``, ``iter_in`` with their factors) and enumerates the rest in the
uop kernel, choosing the assignment with the fewest uops that

* fits the ISA's fields (loop extents, factors, uop index widths), and
* respects the pipeline's read-after-write distance on accumulator rows
  (:func:`tessera.timing.gemm_hazard_distance`, or the ALU op's
  :meth:`~tessera.isa.AluTiming.hazard_distance`).

The uop order puts dimensions that do not move the destination outermost,
so consecutive operations write different rows whenever possible.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from functools import reduce

import numpy as np

from tessera.isa import Isa, Opcode, Uop

from tessera.errors import CompileError


@dataclass(frozen=True, eq=False)
class Dim:
    """One loop dimension: per-index offsets into the dst, src and wgt index spaces."""

    name: str
    dst: np.ndarray
    src: np.ndarray
    wgt: np.ndarray

    @property
    def extent(self) -> int:
        return int(self.dst.size)

    def stride(self) -> tuple[int, int, int] | None:
        """``(dst, src, wgt)`` strides if every offset array is an arithmetic progression from 0."""
        out = []
        for a in (self.dst, self.src, self.wgt):
            if a[0] != 0:
                return None
            s = int(a[1] - a[0]) if a.size > 1 else 0
            if a.size > 1 and not np.array_equal(a, s * np.arange(a.size)):
                return None
            out.append(s)
        return tuple(out)  # type: ignore[return-value]

    def key(self) -> tuple:
        return (self.dst.tobytes(), self.src.tobytes(), self.wgt.tobytes())


def dim(name: str, extent: int, dst: int = 0, src: int = 0, wgt: int = 0) -> Dim:
    """An affine dimension: index ``k`` adds ``k * dst`` / ``k * src`` / ``k * wgt``."""
    k = np.arange(extent, dtype=np.int64)
    return Dim(name, k * dst, k * src, k * wgt)


def explicit_dim(name: str, dst, src, wgt) -> Dim:
    """A dimension with arbitrary offset lists (equal lengths)."""
    a = [np.asarray(v, dtype=np.int64).reshape(-1) for v in (dst, src, wgt)]
    return Dim(name, *a)


@dataclass(frozen=True)
class Nest:
    """A lowered nest: the uop kernel (absolute indices) and the loop fields."""

    uops: tuple[Uop, ...]
    iter_out: int = 1
    iter_in: int = 1
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0
    wgt_factor_out: int = 0
    wgt_factor_in: int = 0

    @property
    def ops(self) -> int:
        return len(self.uops) * self.iter_out * self.iter_in

    def fields(self, kind: str) -> dict[str, int]:
        """Loop fields for a GEMM (``kind='gemm'``) or an ALU (no weight factors)."""
        f = dict(iter_out=self.iter_out, iter_in=self.iter_in,
                 dst_factor_out=self.dst_factor_out, dst_factor_in=self.dst_factor_in,
                 src_factor_out=self.src_factor_out, src_factor_in=self.src_factor_in)
        if kind == "gemm":
            f.update(wgt_factor_out=self.wgt_factor_out, wgt_factor_in=self.wgt_factor_in)
        return f


def _cartesian(arrays: list[np.ndarray]) -> np.ndarray:
    """Sum of one element from each array, first array outermost."""
    if not arrays:
        return np.zeros(1, dtype=np.int64)
    return reduce(lambda acc, a: (acc[:, None] + a[None, :]).ravel(), arrays)


def hazard_free(dst_u: np.ndarray, read_u: list[np.ndarray], iter_out: int, iter_in: int,
                f_out: tuple[int, list[int]], f_in: tuple[int, list[int]], distance: int) -> bool:
    """True if no op reads a row fewer than ``distance`` ops after an op wrote it.

    ``f_out``/``f_in``: (dst factor, [factor of each read array]). Affine loops
    make every window of ops a translate of one in a few short sequences, so
    only those are built: the first iterations, and the crossings of the outer
    loop's boundary.
    """
    if distance <= 1:
        return True
    u = dst_u.size
    k = -(-(distance - 1) // u) + 1  # iterations a window of `distance` ops can span

    def seq(iters: list[tuple[int, int]]):
        o = np.array([a for a, _ in iters], dtype=np.int64)[:, None]
        i = np.array([b for _, b in iters], dtype=np.int64)[:, None]
        w = (dst_u[None, :] + o * f_out[0] + i * f_in[0]).ravel()
        rs = [(r[None, :] + o * fo + i * fi).ravel()
              for r, fo, fi in zip(read_u, f_out[1], f_in[1])]
        return w, rs

    total = iter_out * iter_in
    if iter_in > 2 * k:
        spans = [[(0, i) for i in range(k)]]
        cross = [(0, i) for i in range(iter_in - k, iter_in)]
        if iter_out > 1:
            cross += [(1, i) for i in range(k)]
        spans.append(cross)
    else:
        spans = [[divmod(t, iter_in) for t in range(min(total, iter_in + k))]]
    for iters in spans:
        w, rs = seq(iters)
        for d in range(1, distance):
            if w.size <= d:
                break
            for r in rs:
                if np.any(w[:-d] == r[d:]):
                    return False
    return True


@dataclass(frozen=True)
class _Limits:
    loop_max: int
    dst_f: int
    src_f: int
    wgt_f: int


def _limits(isa: Isa, kind: str) -> _Limits:
    lay = isa.layouts[Opcode.GEMM if kind == "gemm" else Opcode.ALU]
    wgt_f = lay.field("wgt_factor_out").hi if kind == "gemm" else 0
    return _Limits(lay.field("iter_out").hi, lay.field("dst_factor_out").hi,
                   lay.field("src_factor_out").hi, wgt_f)


_CACHE: dict[tuple, Nest | str] = {}


def map_nest(dims: list[Dim], base: tuple[int, int, int], *, kind: str, isa: Isa,
             distance: int, src_is_acc_read: bool = False, max_uops: int | None = None,
             where: str = "") -> Nest:
    """Lower ``dims`` (plus the ``base`` indices) to loops and a uop kernel.

    ``kind`` is ``"gemm"`` or ``"alu"``; ``src_is_acc_read``: the source
    reads the accumulator (ALU tensor operand) and takes part in the hazard
    check. Raises :class:`CompileError` if no assignment respects the rules.
    Results are cached by shape (the hazard rule only depends on the bases
    through the distance between the dst and an accumulator src).
    """
    rel = base[1] - base[0] if src_is_acc_read else 0
    key = (tuple((d.extent, d.key()) for d in dims), kind, distance, src_is_acc_read, rel,
           max_uops, isa.config)
    hit = _CACHE.get(key)
    if hit is None:
        try:
            hit = _map_nest(dims, (0, rel, 0), kind=kind, isa=isa, distance=distance,
                            src_is_acc_read=src_is_acc_read, max_uops=max_uops, where="")
        except CompileError as exc:
            hit = str(exc)
        if len(_CACHE) > 50000:
            _CACHE.clear()
        _CACHE[key] = hit
    if isinstance(hit, str):
        raise CompileError(f"{where}{hit}")
    d0, s0, w0 = base[0], base[1] - rel, base[2]
    uops = tuple(Uop(u.dst + d0, u.src + s0, u.wgt + w0) for u in hit.uops)
    return replace(hit, uops=uops)


def _map_nest(dims: list[Dim], base: tuple[int, int, int], *, kind: str, isa: Isa,
              distance: int, src_is_acc_read: bool = False, max_uops: int | None = None,
              where: str = "") -> Nest:
    # A dimension of one index is a constant offset (an explicit one may be non-zero).
    base = tuple(b + sum(int(getattr(d, f)[0]) for d in dims if d.extent == 1)
                 for b, f in zip(base, ("dst", "src", "wgt")))  # type: ignore[assignment]
    dims = [d for d in dims if d.extent > 1] or [dim("unit", 1)]
    lim = _limits(isa, kind)
    strides = {id(d): d.stride() for d in dims}
    loopable = [d for d in dims if strides[id(d)] is not None and d.extent <= lim.loop_max
                and strides[id(d)][0] <= lim.dst_f and strides[id(d)][1] <= lim.src_f
                and (kind != "gemm" or strides[id(d)][2] <= lim.wgt_f)]
    options = [(None, None)] + [(None, d) for d in loopable] + list(
        itertools.permutations(loopable, 2))
    sized = []
    for lo, li in options:
        rest = [d for d in dims if d is not lo and d is not li]
        sized.append((int(np.prod([d.extent for d in rest])) if rest else 1, lo, li, rest))
    sized.sort(key=lambda t: (t[0], -(t[2].extent if t[2] is not None else 0)))
    for n_uops, lo, li, rest in sized:
        if max_uops is not None and n_uops > max_uops:
            break
        so = strides[id(lo)] if lo is not None else (0, 0, 0)
        si = strides[id(li)] if li is not None else (0, 0, 0)
        n_out = lo.extent if lo is not None else 1
        n_in = li.extent if li is not None else 1
        # Uop order: dims that leave dst unchanged outermost, then the dst-moving ones (every
        # order of those is tried, largest innermost first: which one is innermost decides
        # how far apart writes to a row are).
        fixed = [d for d in rest if not np.any(d.dst != d.dst[0])]
        moving = sorted((d for d in rest if np.any(d.dst != d.dst[0])), key=lambda d: d.extent)
        orders = itertools.islice(itertools.permutations(moving), 24)
        for order in orders:
            seq = fixed + list(order)
            dst_u = _cartesian([d.dst for d in seq]) + base[0]
            src_u = _cartesian([d.src for d in seq]) + base[1]
            wgt_u = _cartesian([d.wgt for d in seq]) + base[2]
            reads = [dst_u] + ([src_u] if src_is_acc_read else [])
            rf_out = [so[0]] + ([so[1]] if src_is_acc_read else [])
            rf_in = [si[0]] + ([si[1]] if src_is_acc_read else [])
            if not hazard_free(dst_u, reads, n_out, n_in, (so[0], rf_out), (si[0], rf_in),
                               distance):
                continue
            uops = tuple(Uop(int(a), int(b), int(c)) for a, b, c in zip(dst_u, src_u, wgt_u))
            return Nest(uops, n_out, n_in, so[0], si[0], so[1], si[1], so[2], si[2])
    names = ", ".join(f"{d.name}={d.extent}" for d in dims)
    raise CompileError(f"{where}: no loop/uop assignment of the nest ({names}) keeps writes to "
                       f"an accumulator row {distance} operations apart"
                       + (f" within {max_uops} uops" if max_uops is not None else ""))
