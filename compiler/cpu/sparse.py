"""N:M structured-sparse CPU kernels: convolutions and matmuls whose constant weight
keeps at most ``n`` non-zeros in every group of ``m`` along the reduction axis
(:mod:`tessera.sparsity`), in float32 and in int8 with int32 sums.

Both compute ``out[o, p] = bias[o] + sum_s value[o, s] * X[k(o, s), p]`` over the
weight's compressed layout (:mod:`.sparse_layout`: per output row its kept weights and
the rows of ``X`` they read). ``X`` (``K`` rows by the columns: output pixels, or a
matmul's rows) is built one *tile* of columns at a time in a ``K x tile`` scratch block
(each row followed by a little slack) that stays in L2: a convolution's im2col
(``X[c * taps + tap, pixel]``, copied from a zero-padded image so there are no bounds
checks; with stride 1 along the width, one vector copy per output row and ``k``) or a
matmul's ``A`` transposed. Only the kept weights are multiplied: ``n / m`` of the dense
work.

Per tile, the reduction runs chunk by chunk (rows of ``X`` that fit L1), and every
output row (two at a time for float32) keeps its accumulators for the tile's
:data:`~.sparse_layout.TILE_VECTORS` vectors of columns in registers over the chunk's
slots: per slot one broadcast of the weight and one load + multiply-add per vector.

* float32: multiply-adds contracted into FMAs where the host has them; sums run in slot
  order, so results differ from a dense kernel's in the last bits.
* int8, byte dot products (the layout's ``group`` 4; AVX512-VNNI hosts): ``X`` holds
  unsigned bytes ``x + 128``; slots go in fours, their four rows of ``X`` interleaved
  byte by byte within each 128-bit lane (two rounds of ``vpunpck*``), times the four
  broadcast int8 weights, the products summed into int32 (portable IR that the JIT turns
  into ``vpdpbusd`` where the host has it, :mod:`.sparse_dots`: 64 multiply-adds per
  instruction, twice ``vpdpwssd``'s, on half the bytes); each row's
  sum then gets the layout's correction ``-128 * sum(w)``. Elsewhere (``group`` 2):
  ``X`` holds int16; slots go in pairs, the two rows interleaved within each 128-bit
  lane, times the broadcast int16 pair, adjacent products summed into int32 (x86
  ``vpunpck*wd`` + ``vpmaddwd``; NEON ``zip`` + ``smlal``). Either way the accumulators
  hold the columns in that interleaved order; one shuffle per tile restores it. int32
  sums wrap, so results are bit-identical to :func:`.conv.build_conv_int8` /
  :func:`.conv.build_matmul_int8`, whose contract (int8 in, int32 out) they share.

The kernels have a parallel form over output rows (each slice builds its own ``X``).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable, Sequence

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module, range_function
from .layout_ops import Scratch
from .sparse_dots import dot4, shuffle_mask
from .sparse_dots import madd as _madd     # also sparse_pairs' (imported from here)
from .sparse_layout import ROW_BLOCK, NMLayout

__all__ = ["build_conv_nm", "build_matmul_nm", "conv_output_hw"]

_I16 = ir.IntType(16)
#: Bytes of the widest vector copy of a run of X (``_ConvInput.build_tile``), and the slack
#: after each row of X and after the padded image.
_SLACK = 64
#: Products fused into the sums (FMA) where the host has it.
_CONTRACT = ("contract",)


# ---------------------------------------------------------------------------------
# Public builders

def conv_output_hw(hw: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                   pads: Sequence[int], dilations: Sequence[int]) -> tuple[int, int]:
    """Output height and width of a 2-D convolution (``pads`` top, left, bottom, right)."""
    return tuple((hw[i] + pads[i] + pads[i + 2] - (kernel[i] - 1) * dilations[i] - 1)
                 // strides[i] + 1 for i in range(2))


def build_conv_nm(x: TensorSpec, layout: NMLayout, kernel: Sequence[int], bias: bool = False,
                  strides: Sequence[int] = (1, 1), pads: Sequence[int] = (0, 0, 0, 0),
                  dilations: Sequence[int] = (1, 1), name: str = "conv_nm") -> CpuKernel:
    """N:M sparse 2-D convolution (group 1), NCHW: inputs ``x`` ``[N, C, H, W]``, the
    layout's ``values`` and ``offsets`` (:func:`.sparse_layout.nm_layout` of the weight
    with ``taps = kh * kw`` and ``pixels = OH * OW``) and, if ``bias``, ``[O]``; output
    ``[N, O, OH, OW]``. int8 layouts take int8 ``x`` and give int32 (the contract of
    :func:`.conv.build_conv_int8`), float32 ones float32."""
    _check_kind(x, layout, 4)
    n, c, h, w = x.shape
    kh, kw = (int(k) for k in kernel)
    oh, ow = conv_output_hw((h, w), (kh, kw), strides, pads, dilations)
    if c * kh * kw != layout.reduction or oh < 1 or ow < 1:
        raise CpuKernelError(f"N:M conv: x {x} with a {kh}x{kw} kernel does not fit a "
                             f"layout of {layout.reduction} weights per output channel")
    geo = _ConvInput(x.shape, (kh, kw), tuple(strides), tuple(pads), tuple(dilations),
                     (oh, ow))
    out = TensorSpec((n, layout.rows, oh, ow), _out_dtype(layout))
    return _kernel(name, x, layout, bias, out, geo)


def build_matmul_nm(a: TensorSpec, layout: NMLayout, bias: bool = False,
                    name: str = "matmul_nm") -> CpuKernel:
    """N:M sparse ``a [..., K] @ W.T -> [..., O]`` for a weight ``W (O, K)`` (a Gemm's
    ``B`` with transB, a MatMul's ``B`` transposed): inputs ``a``, the layout's
    ``values`` and ``offsets`` (``pixels`` = the rows of ``a``) and, if ``bias``,
    ``[O]``. int8: the contract of :func:`.conv.build_matmul_int8` (int32 out)."""
    _check_kind(a, layout, None)
    if a.ndim < 2 or a.shape[-1] != layout.reduction:
        raise CpuKernelError(f"N:M matmul: A {a} does not fit a layout of "
                             f"{layout.reduction} inputs")
    out = TensorSpec((*a.shape[:-1], layout.rows), _out_dtype(layout))
    return _kernel(name, a, layout, bias, out, _MatmulInput(prod(a.shape[:-1]),
                                                            a.shape[-1]))


def _check_kind(x: TensorSpec, layout: NMLayout, ndim: int | None) -> None:
    if x.dtype != layout.kind or (ndim is not None and x.ndim != ndim):
        raise CpuKernelError(f"N:M kernel: input {x} does not fit a {layout.kind} layout"
                             + (f" (rank {ndim})" if ndim else ""))


def _out_dtype(layout: NMLayout) -> str:
    return "float32" if layout.kind == "float32" else "int32"


def _kernel(name: str, x: TensorSpec, layout: NMLayout, bias: bool, out: TensorSpec,
            source: "_ConvInput | _MatmulInput") -> CpuKernel:
    """The module: ``entry.range`` over output rows ``[begin, end)``, ``entry`` calling
    it on all of them."""
    inputs = [x, TensorSpec(layout.values.shape, str(layout.values.dtype)),
              TensorSpec(layout.offsets.shape, str(layout.offsets.dtype))]
    if bias:
        inputs.append(TensorSpec((layout.rows,), _out_dtype(layout)))
    module = new_module(name)
    rfn, b, begin, end = range_function(module, "entry", inputs, (out,))
    rfn.attributes.add("noinline")
    if out.size:
        args = rfn.args
        _emit(b, layout, source, args[0], args[1], args[2], args[3] if bias else None,
              args[-3], begin, end)
    b.ret_void()
    fn, b = kernel_function(module, "entry", inputs, (out,))
    b.call(rfn, [*fn.args, U.i64(0), U.i64(layout.rows)])
    b.ret_void()
    return CpuKernel(name, str(module), "entry", tuple(inputs), (out,),
                     parallel=layout.rows)


# ---------------------------------------------------------------------------------
# The input matrix X, one tile of columns at a time

@dataclass(frozen=True)
class _ConvInput:
    """im2col of one image at a time: ``X[c * taps + ky * kw + kx, oy * OW + ox]``."""

    shape: tuple[int, int, int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilations: tuple[int, int]
    out_hw: tuple[int, int]

    @property
    def images(self) -> int:
        return self.shape[0]

    @property
    def pixels(self) -> int:
        return self.out_hw[0] * self.out_hw[1]

    def padded(self) -> tuple[int, int]:
        _, _, h, w = self.shape
        return h + self.pads[0] + self.pads[2], w + self.pads[1] + self.pads[3]

    def scratch(self, b: ir.IRBuilder, scratch: Scratch, zero: ir.Constant) -> ir.Value:
        """The padded image buffer (filled with ``zero``, the stored form of an input 0,
        once; only the interior is rewritten)."""
        hp, wp = self.padded()
        size = self.shape[1] * hp * wp + _SLACK // _size(zero.type)
        buf = scratch.alloc(zero.type, size, name="xpad")
        U.fill(b, buf, size, zero)
        return buf

    def copy_image(self, b: ir.IRBuilder, x: ir.Value, img: ir.Value, pad: ir.Value,
                   widen: Callable) -> None:
        """Image ``img`` (widened for int8) into the padded buffer's interior."""
        _, c, h, w = self.shape
        hp, wp = self.padded()
        with U.for_range(b, c, name="cc") as ch, U.for_range(b, h, name="iy") as iy:
            src = b.add(b.mul(b.add(b.mul(img, U.i64(c)), ch), U.i64(h * w)),
                        b.mul(iy, U.i64(w)))
            dst = b.add(b.mul(ch, U.i64(hp * wp)),
                        b.add(b.mul(b.add(iy, U.i64(self.pads[0])), U.i64(wp)),
                              U.i64(self.pads[1])))
            with U.for_range(b, w, name="ix") as ix:
                U.store(b, widen(U.load(b, x, b.add(src, ix))), pad, b.add(dst, ix))

    def build_tile(self, b: ir.IRBuilder, pad: ir.Value, xm: ir.Value, stride: int,
                   p0: ir.Value, valid: int, widen: Callable) -> None:
        """Columns ``[p0, p0 + valid)`` of X (pixels) into ``xm`` (row ``k`` at ``k *
        stride``) from the padded image (already widened): for each output row the tile
        touches, its columns ``[lo, hi)`` for every ``k``. With stride 1 along the
        width they are a contiguous run of the padded image, copied in whole vectors of
        up to :data:`_SLACK` bytes, as few as hold a run (the innermost loop runs over
        ``k``: one load and one store each); the last vector may spill past the run
        into columns the next run rewrites, into the row's slack (:func:`_x_stride`)
        and past the padded image's end into its slack. Otherwise element by
        element."""
        oh, ow = self.out_hw
        ty, sw = pad.type.pointee, self.strides[1]
        vty = ir.VectorType(ty, min(_SLACK, max(8, 1 << (ow * _size(ty) - 1).bit_length()))
                            // _size(ty))
        end = b.add(p0, U.i64(valid))
        oy_lo = b.udiv(p0, U.i64(ow))
        oy_hi = _min(b, U.i64(oh), b.add(b.udiv(b.sub(end, U.i64(1)), U.i64(ow)), U.i64(1)))
        with U.for_range(b, oy_hi, oy_lo, name="oy") as oy:
            first = b.mul(oy, U.i64(ow))
            lo, hi = _max(b, first, p0), _min(b, b.add(first, U.i64(ow)), end)

            def copy_vector(k: ir.Value, src: ir.Value, p: ir.Value) -> None:
                at = U.element_ptr(b, pad, b.add(src, b.sub(p, first)))
                v = b.load(b.bitcast(at, vty.as_pointer()), align=1)
                to = U.element_ptr(b, xm, b.add(b.mul(k, U.i64(stride)), b.sub(p, p0)))
                b.store(v, b.bitcast(to, vty.as_pointer()), align=1)

            def copy_elements(k: ir.Value, src: ir.Value) -> None:
                dst = b.sub(b.mul(k, U.i64(stride)), p0)
                with U.for_range(b, hi, lo, name="px") as p:
                    v = U.load(b, pad, b.add(src, b.mul(b.sub(p, first), U.i64(sw))))
                    U.store(b, v, xm, b.add(dst, p))
            if sw != 1:
                self._taps(b, oy, copy_elements)
            else:
                with U.for_range(b, hi, lo, step=vty.count, name="run") as p:
                    self._taps(b, oy, lambda k, src: copy_vector(k, src, p))

    def _taps(self, b: ir.IRBuilder, oy: ir.Value, body: Callable) -> None:
        """``body(k, src)`` for every ``k = (c, ky, kx)``: ``src``, the padded image's
        element of output row ``oy``'s first column for that ``k``."""
        _, c, _, _ = self.shape
        hp, wp = self.padded()
        (kh, kw), (dh, dw) = self.kernel, self.dilations
        with U.for_range(b, c, name="kc") as ch, U.for_range(b, kh, name="ky") as ky, \
                U.for_range(b, kw, name="kx") as kx:
            k = b.add(b.mul(ch, U.i64(kh * kw)), b.add(b.mul(ky, U.i64(kw)), kx))
            row = b.add(b.mul(oy, U.i64(self.strides[0])), b.mul(ky, U.i64(dh)))
            body(k, b.add(b.mul(ch, U.i64(hp * wp)),
                          b.add(b.mul(row, U.i64(wp)), b.mul(kx, U.i64(dw)))))

    def out_index(self, b: ir.IRBuilder, img: ir.Value, rows: int, o: ir.Value,
                  p: ir.Value) -> ir.Value:
        """Element index of output row ``o``, column ``p`` of image ``img``."""
        return b.add(b.mul(b.add(b.mul(img, U.i64(rows)), o), U.i64(self.pixels)), p)


@dataclass(frozen=True)
class _MatmulInput:
    """``A (M, K)`` transposed: ``X[k, i] = A[i, k]``; one "image"."""

    pixels: int
    k: int
    images: int = 1

    def scratch(self, b: ir.IRBuilder, scratch: Scratch, zero: ir.Constant) -> None:
        return None

    def copy_image(self, b: ir.IRBuilder, a: ir.Value, img: ir.Value, pad: None,
                   widen: Callable) -> None:
        return None

    def build_tile(self, b: ir.IRBuilder, a: ir.Value, xm: ir.Value, stride: int,
                   p0: ir.Value, valid: int, widen: Callable) -> None:
        """Rows ``[p0, p0 + valid)`` of ``a``, transposed, into ``xm`` (row ``k`` at ``k *
        stride``)."""
        with U.for_range(b, valid, name="ti") as q, U.for_range(b, self.k, name="tk") as k:
            v = widen(U.load(b, a, b.add(b.mul(b.add(p0, q), U.i64(self.k)), k)))
            U.store(b, v, xm, b.add(b.mul(k, U.i64(stride)), q))

    def out_index(self, b: ir.IRBuilder, img: ir.Value, rows: int, o: ir.Value,
                  p: ir.Value) -> ir.Value:
        return b.add(b.mul(p, U.i64(rows)), o)


# ---------------------------------------------------------------------------------
# The sparse rows

def _emit(b: ir.IRBuilder, layout: NMLayout, source, x: ir.Value, values: ir.Value,
          offsets: ir.Value, bias: ir.Value | None, out: ir.Value, begin: ir.Value,
          end: ir.Value) -> None:
    """Per image, per tile of columns: the tile's block of X built in scratch (``K``
    rows of :func:`_x_stride`, so it stays in L2), then every reduction chunk over rows
    [begin, end)."""
    scratch, tile, pixels = Scratch(b), layout.tile, source.pixels
    ty, stride = {1: U.F32, 2: _I16, 4: U.I8}[layout.group], _x_stride(layout)
    size = layout.reduction * stride
    xm = _aligned(b, scratch, ty, size, "xmat")
    # A tail tile's columns past the pixels are computed but never stored: zeros.
    U.fill(b, xm, size, ir.Constant(ty, 0))
    # Byte dot products take unsigned bytes: x + 128 (the sign bit flipped).
    flip = ir.Constant(U.I8, -128)
    pad = source.scratch(b, scratch, flip if layout.group == 4 else ir.Constant(ty, 0))
    rows = _Rows(layout, xm, values, offsets, bias, scratch)

    def widen(v: ir.Value) -> ir.Value:
        if layout.group == 2:
            return b.sext(v, _I16)
        return b.xor(v, flip) if layout.group == 4 else v
    contiguous = isinstance(source, _ConvInput)
    with U.for_range(b, source.images, name="img") as img:
        source.copy_image(b, x, img, pad, widen)

        def finish(os: list[ir.Value], p0: ir.Value, accs, valid: int) -> None:
            for o, vecs in zip(os, rows.finish(b, os, accs)):
                _store_tile(b, out, lambda p, o=o: source.out_index(
                    b, img, layout.rows, o, p), p0, vecs, valid, layout.lanes, contiguous)

        def tile_rows(p0: ir.Value, valid: int) -> None:
            source.build_tile(b, pad if contiguous else x, xm, stride, p0, valid, widen)
            nvec = -(-valid // layout.lanes)
            _emit_chunks(b, rows, nvec, begin, end,
                         lambda os, accs: finish(os, p0, accs, valid))
        full = pixels // tile * tile
        if full:
            with U.for_range(b, full, step=tile, name="pt") as p0:
                tile_rows(p0, tile)
        if pixels > full:
            tile_rows(U.i64(full), pixels - full)
    scratch.release()


def _emit_chunks(b: ir.IRBuilder, rows: "_Rows", nvec: int, begin: ir.Value,
                 end: ir.Value, finish: Callable) -> None:
    """One tile: every chunk of the reduction over all rows before the next chunk, the
    partial sums kept in the rows' scratch buffer; the last chunk calls
    ``finish(rows, accs)``."""
    lay = rows.lay
    last = (lay.chunks - 1) * lay.chunk_slots
    # Fewer vectors per row (a narrow tile): more rows at once, as many accumulators.
    size = ROW_BLOCK[lay.kind] * max(1, lay.tile_vectors // nvec)
    if lay.chunks > 1:
        with U.for_range(b, end, begin, name="zr") as o:
            rows.save(b, [o], [rows.zeros(nvec)])
        with U.for_range(b, lay.chunks - 1, name="chunk") as j:
            first = b.mul(j, U.i64(lay.chunk_slots))
            _row_blocks(b, begin, end, size, lambda os: rows.save(b, os, rows.run(
                b, os, nvec, first, lay.chunk_slots, rows.restore(b, os, nvec))))

    def last_chunk(os: list[ir.Value]) -> None:
        inits = rows.restore(b, os, nvec) if lay.chunks > 1 else [rows.zeros(nvec)] * len(os)
        finish(os, rows.run(b, os, nvec, U.i64(last), lay.slots - last, inits))
    _row_blocks(b, begin, end, size, last_chunk)


def _row_blocks(b: ir.IRBuilder, begin: ir.Value, end: ir.Value, size: int,
                block: Callable[[list[ir.Value]], None]) -> None:
    """``block(rows)`` over ``[begin, end)``: ``size`` rows at a time, then the rest one
    by one."""
    with U.for_range(b, b.sub(end, U.i64(size - 1)), begin, step=size, name="row") as o:
        block([b.add(o, U.i64(r)) for r in range(size)])
    if size > 1:
        rest = b.sub(end, b.urem(b.sub(end, begin), U.i64(size)))
        with U.for_range(b, end, rest, name="rowr") as o:
            block([o])


def _store_tile(b: ir.IRBuilder, out: ir.Value, index: Callable, p0: ir.Value,
                vecs: list[ir.Value], valid: int, lanes: int, contiguous: bool) -> None:
    """The tile's vectors at columns ``p0 + t * lanes``; only ``valid`` columns exist.
    Whole vectors of a convolution's output row are one store; otherwise lane by lane."""
    for t, v in enumerate(vecs):
        p = b.add(p0, U.i64(t * lanes))
        count = min(lanes, valid - t * lanes)
        if contiguous and count == lanes:
            ptr = b.bitcast(U.element_ptr(b, out, index(p)), v.type.as_pointer())
            b.store(v, ptr, align=4)
            continue
        for lane in range(count):
            U.store(b, b.extract_element(v, U.I32(lane)), out,
                    index(b.add(p, U.i64(lane))))


class _Rows:
    """A block of output rows over one tile of columns and a range of their slots (every
    row has the same count): each row's accumulators in registers; between reduction
    chunks, in a scratch buffer (``save``/``restore``)."""

    def __init__(self, layout: NMLayout, xm: ir.Value, values: ir.Value,
                 offsets: ir.Value, bias: ir.Value | None, scratch: Scratch) -> None:
        self.lay, self.xm, self.values, self.offsets, self.bias = (
            layout, xm, values, offsets, bias)
        # Accumulators per row: per vector of columns one of float32 or ``group`` of int32.
        self.acc_ty = ir.VectorType(U.F32 if layout.group == 1 else U.I32,
                                    layout.lanes // layout.group)
        self.per_row = layout.tile_vectors * layout.group
        self.buf = None
        if layout.chunks > 1:
            self.buf = _aligned(scratch.b, scratch, self.acc_ty.element,
                                layout.rows * self.per_row * self.acc_ty.count, "accs")

    def zeros(self, nvec: int) -> list[ir.Value]:
        return [ir.Constant(self.acc_ty, None)] * (nvec * self.lay.group)

    def _slot_ptr(self, b: ir.IRBuilder, o: ir.Value, a: int) -> ir.Value:
        at = b.mul(b.add(b.mul(o, U.i64(self.per_row)), U.i64(a)), U.i64(self.acc_ty.count))
        return b.bitcast(U.element_ptr(b, self.buf, at), self.acc_ty.as_pointer())

    def save(self, b: ir.IRBuilder, os: list[ir.Value], accs) -> None:
        for o, row in zip(os, accs):
            for a, v in enumerate(row):
                b.store(v, self._slot_ptr(b, o, a), align=4)

    def restore(self, b: ir.IRBuilder, os: list[ir.Value], nvec: int) -> list[list[ir.Value]]:
        count = len(self.zeros(nvec))
        return [[b.load(self._slot_ptr(b, o, a), align=4) for a in range(count)] for o in os]

    def run(self, b: ir.IRBuilder, os: list[ir.Value], nvec: int, first: ir.Value,
            count: int, inits) -> list[list[ir.Value]]:
        """Per row of ``os``, its accumulators for the tile's columns ``t * lanes`` after its
        slots ``[first, first + count)`` of the reduction (from ``inits``). The weights
        are chunk-major: the chunk starting at slot ``first`` holds ``count`` slots per
        row from ``first * rows``."""
        flat = tuple(v for row in inits for v in row)
        step = self.lay.group
        emit = {1: self._float_slot, 2: self._int8_pair, 4: self._int8_quad}[step]
        starts = [b.add(b.mul(first, U.i64(self.lay.rows)), b.mul(o, U.i64(count)))
                  for o in os]

        def body(b, j, accs):
            per = len(accs) // len(os)
            new = []
            for r, start in enumerate(starts):
                slot = b.add(start, b.mul(j, U.i64(step)))
                new += emit(b, slot, nvec, accs[r * per:(r + 1) * per])
            return tuple(new)
        accs = U.reduce_range(b, count // step, flat, body, name="slot")
        per = len(flat) // len(os)
        return [list(accs[r * per:(r + 1) * per]) for r in range(len(os))]

    def _load(self, b: ir.IRBuilder, at: ir.Value, ty: ir.VectorType) -> ir.Value:
        ptr = b.bitcast(U.element_ptr(b, self.xm, at), ty.as_pointer())
        return b.load(ptr, align=_size(ty.element))

    def _offset(self, b: ir.IRBuilder, slot: ir.Value) -> ir.Value:
        """Element offset in the tile's block of X of the row slot ``slot`` reads."""
        return b.mul(b.sext(U.load(b, self.offsets, slot), U.I64), U.i64(_x_stride(self.lay)))

    def _float_slot(self, b, slot, nvec, accs):
        lanes = self.lay.lanes
        w = _splat(b, U.load(b, self.values, slot), lanes)
        at = self._offset(b, slot)
        return [b.fadd(acc, b.fmul(w, self._load(b, b.add(at, U.i64(t * lanes)), self.acc_ty),
                                   flags=_CONTRACT), flags=_CONTRACT)
                for t, acc in enumerate(accs)]

    def _int8_pair(self, b, slot, nvec, accs):
        lanes, half = self.lay.lanes, self.lay.lanes // 2
        vty = ir.VectorType(_I16, lanes)
        pair = U.load(b, self.values, b.udiv(slot, U.i64(2)))
        w = b.bitcast(_splat(b, pair, half), vty)
        at_a = self._offset(b, slot)
        at_b = self._offset(b, b.add(slot, U.i64(1)))
        new = []
        for t in range(nvec):
            xa = self._load(b, b.add(at_a, U.i64(t * lanes)), vty)
            xb = self._load(b, b.add(at_b, U.i64(t * lanes)), vty)
            for x in _interleave(b, xa, xb):
                new.append(b.add(accs[len(new)], _madd(b, x, w)))
        return new

    def _int8_quad(self, b, slot, nvec, accs):
        """Four slots: their rows of X (bytes) interleaved in two rounds, then one byte
        dot product per accumulator."""
        lanes = self.lay.lanes
        vty = ir.VectorType(U.I8, lanes)
        word = U.load(b, self.values, b.udiv(slot, U.i64(4)))
        w = b.bitcast(_splat(b, word, lanes // 4), vty)
        at = [self._offset(b, b.add(slot, U.i64(i))) for i in range(4)]
        new = []
        for t in range(nvec):
            x = [self._load(b, b.add(a, U.i64(t * lanes)), vty) for a in at]
            ab, cd = _interleave(b, x[0], x[1]), _interleave(b, x[2], x[3])
            for lo, hi in zip(ab, cd):
                for q in _interleave(b, lo, hi, _I16):
                    new.append(dot4(b, accs[len(new)], q, w))
        return new

    def finish(self, b: ir.IRBuilder, os: list[ir.Value], accs) -> list[list[ir.Value]]:
        """The rows' result vectors: int8 sums back in column order; the bias added."""
        result = []
        for o, row in zip(os, accs):
            bias = None if self.bias is None else _splat(b, U.load(b, self.bias, o),
                                                         self.lay.lanes)
            group = self.lay.group
            vecs = row if group == 1 else [_in_column_order(b, row[k:k + group])
                                           for k in range(0, len(row), group)]
            if group == 4:      # the inputs were x + 128
                fix = U.load(b, self.values, b.add(U.i64(self.lay.rows * self.lay.slots // 4), o))
                vecs = [b.add(v, _splat(b, fix, self.lay.lanes)) for v in vecs]
            if bias is not None:
                vecs = [b.fadd(v, bias) if self.lay.kind == "float32" else b.add(v, bias)
                        for v in vecs]
            result.append(vecs)
        return result


def _x_stride(layout: NMLayout) -> int:
    """Elements from one row of a tile's block of X to the next: the tile's columns and
    :data:`_SLACK` bytes, which a run's last vector copy may spill into (a whole number
    of cache lines, so rows stay aligned)."""
    return layout.tile + _SLACK // (4 // layout.group)


def _size(ty: ir.Type) -> int:
    return 1 if ty == U.I8 else 2 if ty == _I16 else 4


def _aligned(b: ir.IRBuilder, scratch: Scratch, ty: ir.Type, n: int, name: str) -> ir.Value:
    """A scratch buffer of ``n`` elements aligned to 64 bytes (a cache line: whole
    vector loads never straddle two)."""
    size = _size(ty)
    raw = scratch.alloc(ty, n + 64 // size, name=name)
    addr = b.ptrtoint(raw, U.I64)
    aligned = b.and_(b.add(addr, U.i64(63)), U.i64(-64))
    return b.gep(raw, [b.udiv(b.sub(aligned, addr), U.i64(size))], inbounds=True)


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _max(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def _splat(b: ir.IRBuilder, v: ir.Value, lanes: int) -> ir.Value:
    one = b.insert_element(ir.Constant(ir.VectorType(v.type, lanes), None), v, U.I32(0))
    return b.shuffle_vector(one, one, shuffle_mask([0] * lanes))


def _interleave(b: ir.IRBuilder, x: ir.Value, y: ir.Value,
                as_ty: ir.Type | None = None) -> tuple[ir.Value, ir.Value]:
    """``lo``, ``hi``: the elements of ``x`` and ``y`` (seen as vectors of ``as_ty``)
    interleaved, ``x[i], y[i]``, for the first and last half of each 128-bit lane (one
    ``punpckl*``/``punpckh*`` each on x86, ``zip1``/``zip2`` on NEON); returned as
    ``x``'s type."""
    ty = x.type
    if as_ty is not None:
        count = ty.count * _size(ty.element) // _size(as_ty)
        x, y = (b.bitcast(v, ir.VectorType(as_ty, count)) for v in (x, y))
    count, per_lane = x.type.count, 16 // _size(x.type.element)
    out = []
    for first in (0, per_lane // 2):
        mask = [i for lane in range(0, count, per_lane) for r in range(per_lane // 2)
                for i in (lane + first + r, count + lane + first + r)]
        out.append(b.bitcast(b.shuffle_vector(x, y, shuffle_mask(mask)), ty))
    return out[0], out[1]


def _in_column_order(b: ir.IRBuilder, accs: list[ir.Value]) -> ir.Value:
    """The ``group`` int32 accumulators of one vector of columns as one vector in column
    order. :func:`_interleave` put column ``16 / (4 / group) * L + r`` (128-bit lane
    ``L``) in accumulator ``r // 4``, lane ``4 * L + r % 4``."""
    group, count = len(accs), accs[0].type.count
    while len(accs) > 1:            # concatenated: accumulator j at j * count
        accs = [b.shuffle_vector(accs[k], accs[k + 1],
                                 shuffle_mask(range(2 * accs[k].type.count)))
                for k in range(0, len(accs), 2)]
    per_lane = 4 * group
    order = [r // 4 * count + 4 * (q // per_lane) + r % 4
             for q in range(count * group) for r in [q % per_lane]]
    return b.shuffle_vector(accs[0], accs[0], shuffle_mask(order))
