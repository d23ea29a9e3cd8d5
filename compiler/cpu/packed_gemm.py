"""The blocked, packed float32 GEMM shared by :mod:`.matmul` (MatMul, Gemm) and
:mod:`.conv_float` (Conv as an implicit-im2col GEMM): BLIS's scheme in portable IR.

``out[i, j] = sum_k P[i, k] * Q[k, j]``: Q is copied panel by panel (up to
:data:`DEPTH_BLOCK` values of k by 4 vectors of columns) into a contiguous scratch
buffer by a caller-supplied :data:`Pack` (a strided copy, :func:`strided_pack`, or the
conv's gather from the padded image), and a register tile of 6 rows x 4 vectors
(AVX-512; narrower for 256- and 128-bit hosts, :func:`.vector_width.host_vector_bits`)
accumulates broadcast P elements times panel vectors with ``llvm.fmuladd`` on generic
vectors (fused where the target has FMA, a multiply and an add elsewhere), P read in
place. Sums over k are added block by block into the output.

The parallel form splits P's rows into blocks of :data:`ROW_BLOCK` (a whole number of
register tiles at every vector width, so one split serves each width's IR variant);
each range packs Q's panels itself (a copy of Q per thread, against its share of the
multiply-adds: ~1% for the benchmark's conv and GEMM) and writes only its rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import lcm
from typing import Callable

import llvmlite.ir as ir

from . import irutil as U
from .irutil import F32
from .vector_width import VECTOR_WIDTHS, host_vector_bits

__all__ = ["DEPTH_BLOCK", "PACKED_MIN_MACS", "ROW_BLOCK", "Pack", "PackedGemm", "Rows",
           "declare", "emit_groups", "emit_packed_gemm", "item_span", "share",
           "strided_pack"]


#: Register tile of :func:`emit_packed_gemm` by the host's vector bits: (rows of P
#: broadcast, vectors of Q). AVX-512: 6 x 4 = 24 accumulators, 4 Q vectors and a
#: broadcast in its 32 registers (BLIS's shape); AVX2 and 128-bit NEON have 16.
_TILES = {512: (6, 4), 256: (6, 2), 128: (4, 2)}
assert set(_TILES) == set(VECTOR_WIDTHS), "a register tile per vector width"
#: Rows of P per unit of the parallel form's range: whole register tiles at every width.
ROW_BLOCK = lcm(*(rows for rows, _ in _TILES.values()))
#: Values of k packed at a time: a panel block of up to 1024 x 64 floats (256 KiB) stays
#: in L2. Each block is one more pass over P, so blocks are few: on the Zen 5 dev host
#: 64x768 @ 768x3072 ran at 90 GFLOP/s in one block, 35 in blocks of 256 and 19 in
#: blocks of 128 (P, 9 MiB, streamed from memory once per block).
DEPTH_BLOCK = 1024
#: Below this many multiply-adds the loop nest's lack of packing costs less than packing.
PACKED_MIN_MACS = 1 << 15

#: ``pack(b, panel, j0, cols, k0, depth)`` fills ``panel[kk * V + jj] = Q[k0 + kk, j0 +
#: jj]`` for ``kk < depth`` and ``jj < cols`` and zeroes ``cols <= jj < V`` (``V`` the
#: panel width; ``j0`` and ``k0`` i64 values).
Pack = Callable[[ir.IRBuilder, ir.Value, ir.Value, int, ir.Value, int], None]
#: ``[begin, end)`` of P's row blocks (i64 values, the parallel form's range), or None
#: for all of them.
Rows = tuple[ir.Value, ir.Value] | None


@dataclass(frozen=True)
class PackedGemm:
    """``out[i * ci + j * cj] = sum_k P[i * si + k * sk] * Q[k, j]`` for ``i < rows,
    j < cols, k < depth``: Q is packed panel by panel (``panel`` columns at a time,
    each ``depth x panel`` floats, contiguous along j), P read in place."""

    rows: int
    cols: int
    depth: int
    p_strides: tuple[int, int]
    out_strides: tuple[int, int]

    @property
    def lanes(self) -> int:
        return host_vector_bits() // 32

    @property
    def tile(self) -> tuple[int, int]:
        return _TILES[host_vector_bits()]

    @property
    def panel(self) -> int:
        """Columns of Q per packed panel."""
        return self.tile[1] * self.lanes

    @property
    def depth_block(self) -> int:
        """Values of k per packed block: the depth split evenly into blocks of at most
        :data:`DEPTH_BLOCK`."""
        blocks = -(-self.depth // DEPTH_BLOCK)
        return -(-self.depth // blocks)

    @property
    def panel_floats(self) -> int:
        return self.depth_block * self.panel

    @property
    def row_blocks(self) -> int:
        """Blocks of :data:`ROW_BLOCK` rows of P: the extent of the parallel form."""
        return -(-self.rows // ROW_BLOCK)

    def row_span(self, b: ir.IRBuilder, blocks: Rows) -> tuple[ir.Value, ir.Value]:
        """First row of P in ``blocks`` and the row after its last."""
        return item_span(b, blocks, ROW_BLOCK, self.rows)


def item_span(b: ir.IRBuilder, blocks: Rows, unit: int, total: int
              ) -> tuple[ir.Value, ir.Value]:
    """``[start, stop)`` of the items in ``blocks`` (None: all ``total``) of ``unit``
    items each, the last one possibly short."""
    if blocks is None:
        return U.i64(0), U.i64(total)
    end = b.mul(blocks[1], U.i64(unit))
    return (b.mul(blocks[0], U.i64(unit)),
            b.select(b.icmp_unsigned("<", end, U.i64(total)), end, U.i64(total)))


def emit_packed_gemm(b: ir.IRBuilder, g: PackedGemm, p: ir.Value, pack: Pack,
                     out: ir.Value, panel: ir.Value, blocks: Rows = None) -> None:
    """The loops of ``g`` (``p`` and ``out`` point at element 0 of P and the output;
    ``panel`` at :meth:`PackedGemm.panel_floats` of scratch, allocated by the caller
    outside its loops): per panel of Q and block of k, pack it, then run the register
    tile over every row group of P in ``blocks``, adding to the previous blocks' sums."""
    width, kc = g.panel, g.depth_block
    full, tail = divmod(g.cols, width)
    full_k, tail_k = divmod(g.depth, kc)

    def k_block(j0: ir.Value, cols: int, k0: ir.Value, depth: int) -> None:
        pack(b, panel, j0, cols, k0, depth)
        first = b.icmp_signed("==", k0, U.i64(0))
        pk = U.element_ptr(b, p, b.mul(k0, U.i64(g.p_strides[1])))
        tile = _Tile(g, pk, panel, out, j0, cols, depth, first)
        rows = g.tile[0]
        emit_groups(b, g.rows // rows, rows, g.rows % rows, blocks, ROW_BLOCK // rows,
                    lambda i0, n: tile.emit(b, i0, n), "ib")

    def one_panel(j0: ir.Value, cols: int) -> None:
        if full_k:
            with U.for_range(b, full_k, name="kb") as kb:
                k_block(j0, cols, b.mul(kb, U.i64(kc)), kc)
        if tail_k:
            k_block(j0, cols, U.i64(full_k * kc), tail_k)

    if full:
        with U.for_range(b, full, name="jp") as jp:
            one_panel(b.mul(jp, U.i64(width)), width)
    if tail:
        one_panel(U.i64(full * width), tail)


def emit_groups(b: ir.IRBuilder, count: int, size: int, rest: int, blocks: Rows,
                per: int, body: Callable[[ir.Value, int], None], name: str) -> None:
    """``body(start, n)`` for ``count`` groups of ``size`` items then one of ``rest``
    items (if any), of those in ``blocks``: ``[begin, end)`` in units of ``per`` groups,
    the last unit holding the partial group (None: all of them). The register tile's
    row groups here, the dot products' groups of B rows in :mod:`.matmul`."""
    lo, hi = U.i64(0), U.i64(count)
    if blocks is not None:
        lo, hi = b.mul(blocks[0], U.i64(per)), b.mul(blocks[1], U.i64(per))
        hi = b.select(b.icmp_unsigned("<", hi, U.i64(count)), hi, U.i64(count))
    if count:
        with U.for_range(b, hi, start=lo, name=name) as i:
            body(b.mul(i, U.i64(size)), size)
    if not rest:
        return
    if blocks is None:
        body(U.i64(count * size), rest)
        return
    units = -(-(count * size + rest) // (per * size))
    with b.if_then(b.icmp_unsigned("==", blocks[1], U.i64(units))):
        body(U.i64(count * size), rest)


@dataclass(frozen=True)
class _Tile:
    """The register tile over one packed panel block: ``cols`` columns from ``j0``,
    ``depth`` values of k (``p`` and the panel start at the block's first); ``first``
    (i1) says the block is k's first (its sums are stored, later ones added)."""

    g: PackedGemm
    p: ir.Value
    panel: ir.Value
    out: ir.Value
    j0: ir.Value
    cols: int
    depth: int
    first: ir.Value

    def emit(self, b: ir.IRBuilder, i0: ir.Value, rows: int) -> None:
        """``rows`` x ``cols`` outputs from row ``i0``: vector accumulators carried
        through the k loop, each product a multiply-add of a broadcast P element and a
        panel vector."""
        g = self.g
        lanes, nv = g.lanes, -(-self.cols // g.lanes)
        vt = ir.VectorType(F32, lanes)
        si, sk = g.p_strides
        vpanel = b.bitcast(self.panel, vt.as_pointer())
        prow = [b.mul(b.add(i0, U.i64(r)), U.i64(si)) for r in range(rows)]
        splat_mask = ir.Constant(ir.VectorType(U.I32, lanes), [0] * lanes)
        fmuladd = declare(b, f"llvm.fmuladd.v{lanes}f32", vt, [vt] * 3)

        def step(b: ir.IRBuilder, k: ir.Value, accs):
            kv = b.mul(k, U.i64(g.tile[1]))
            qv = [b.load(b.gep(vpanel, [b.add(kv, U.i64(v))]), align=4) for v in range(nv)]
            koff = b.mul(k, U.i64(sk))
            new = []
            for r in range(rows):
                a = U.load(b, self.p, b.add(prow[r], koff))
                s = b.shuffle_vector(b.insert_element(ir.Constant(vt, ir.Undefined), a,
                                                      ir.Constant(U.I32, 0)),
                                     ir.Constant(vt, ir.Undefined), splat_mask)
                new += [b.call(fmuladd, [s, q, accs[r * nv + v]]) for v, q in enumerate(qv)]
            return tuple(new)

        zero = ir.Constant(vt, [0.0] * lanes)
        accs = U.reduce_range(b, self.depth, (zero,) * (rows * nv), step, name="k")
        _store_tile(b, g, self.out, accs, i0, self.j0, rows, self.cols, self.first)


def _store_tile(b: ir.IRBuilder, g: PackedGemm, out: ir.Value, accs, i0: ir.Value,
                j0: ir.Value, rows: int, cols: int, first: ir.Value) -> None:
    """Whole vectors where the output is contiguous along j, else lane by lane; each
    added to the output unless ``first``."""
    lanes, nv = g.lanes, -(-cols // g.lanes)
    ci, cj = g.out_strides
    vt = ir.VectorType(F32, lanes)
    for r in range(rows):
        row = b.add(b.mul(b.add(i0, U.i64(r)), U.i64(ci)), b.mul(j0, U.i64(cj)))
        for v in range(nv):
            acc, live = accs[r * nv + v], min(lanes, cols - v * lanes)
            if cj == 1 and live == lanes:
                ptr = b.bitcast(U.element_ptr(b, out, b.add(row, U.i64(v * lanes))),
                                vt.as_pointer())
                old = b.load(ptr, align=4)
                b.store(b.select(first, acc, b.fadd(old, acc)), ptr, align=4)
                continue
            for lane in range(live):
                ptr = U.element_ptr(b, out, b.add(row, U.i64((v * lanes + lane) * cj)))
                value = b.extract_element(acc, ir.Constant(U.I32, lane))
                b.store(b.select(first, value, b.fadd(b.load(ptr), value)), ptr)


def share(b: ir.IRBuilder, span: tuple[ir.Value, ir.Value], extent: int, units: int) -> Rows:
    """``span``, a ``[begin, end)`` of a parallel range of ``extent``, as the same share
    of ``units`` (row blocks, groups of rows): ``x * units // extent`` at both ends, so
    consecutive spans map to consecutive ones that together cover every unit once. (For
    a parallel extent that must not depend on the vector width when ``units`` does.)"""
    if extent == units:
        return span
    return tuple(b.udiv(b.mul(x, U.i64(units)), U.i64(extent)) for x in span)


def strided_pack(src: ir.Value, strides: tuple[int, int], width: int) -> Pack:
    """The :data:`Pack` of a matrix ``Q[k, j] = src[k * qk + j * qj]``."""
    qk, qj = strides

    def pack(b: ir.IRBuilder, panel: ir.Value, j0: ir.Value, cols: int, k0: ir.Value,
             depth: int) -> None:
        with U.for_range(b, depth, name="pk") as k:
            src_row = b.add(b.mul(b.add(k0, k), U.i64(qk)), b.mul(j0, U.i64(qj)))
            dst_row = b.mul(k, U.i64(width))
            with U.for_range(b, cols, name="pj") as jj:
                U.store(b, U.load(b, src, b.add(src_row, b.mul(jj, U.i64(qj)))), panel,
                        b.add(dst_row, jj))
            if cols < width:
                with U.for_range(b, width, start=cols, name="pz") as jj:
                    U.store(b, U.f32(0.0), panel, b.add(dst_row, jj))
    return pack


def declare(b: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The module's declaration of ``name`` (added on first use): for vector intrinsics,
    whose llvmlite types have no ``intrinsic_name`` for :func:`.irutil.call_intrinsic`."""
    return b.module.globals.get(name) or ir.Function(b.module, ir.FunctionType(ret, args),
                                                     name)
