"""Data-movement CPU kernels with ONNX semantics: Pad, Transpose, Concat, Split.

These ops are memory-bound, so the kernels do one pass over memory with the widest
moves available: contiguous runs become ``llvm.memcpy`` with a constant length (inlined
vector moves for short runs, libc's memcpy for long ones), fills become ``memset`` or
vector stores, and transposes move 8x8 (32-bit) or 16x16 (8-bit) tiles through vector
registers, inside 64x64 cache blocks so every cache line read or written is used whole
while it is in L1.

Shapes are simplified before code generation (axes of size 1 dropped, axes that stay
adjacent merged), so e.g. NCHW -> NHWC is a batch of 2-D transposes ``C x HW``.

The emitters :func:`emit_copy`, :func:`emit_fill`, :func:`emit_transpose_2d` (with
:func:`transpose_tile_edge`) and the :class:`Scratch` allocator are shared with the
other CPU kernel modules (the strided views of :mod:`.strided` and the gathers of
:mod:`.gather` among them).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module, range_function

#: Edge of the square cache block a transpose works through (elements).
_BLOCK = 64
_PAD_MODES = ("constant", "edge", "reflect")


# ---------------------------------------------------------------------------------
# Shared emitters

def emit_copy(b: ir.IRBuilder, dst: ir.Value, dst_off: int | ir.Value, src: ir.Value,
              src_off: int | ir.Value, n: int) -> None:
    """``dst[dst_off:dst_off+n] = src[src_off:src_off+n]`` as one ``llvm.memcpy`` of
    constant length (the buffers must not overlap)."""
    if n <= 0:
        return
    elem_bytes = _elem_bytes(src.type.pointee)
    _memcpy(b, U.element_ptr(b, dst, dst_off), U.element_ptr(b, src, src_off),
            U.i64(n * elem_bytes))


def emit_copy_n(b: ir.IRBuilder, dst: ir.Value, dst_off: ir.Value, src: ir.Value,
                src_off: ir.Value, n: ir.Value) -> None:
    """Like :func:`emit_copy` with a run-time element count ``n`` (an i64)."""
    elem_bytes = _elem_bytes(src.type.pointee)
    d, s = U.element_ptr(b, dst, dst_off), U.element_ptr(b, src, src_off)
    nbytes = n if elem_bytes == 1 else b.mul(n, U.i64(elem_bytes))
    _memcpy(b, d, s, nbytes)


def _memcpy(b: ir.IRBuilder, d: ir.Value, s: ir.Value, nbytes: ir.Value) -> None:
    i8p = U.I8.as_pointer()
    name = "llvm.memcpy.p0.p0.i64"
    fn = b.module.globals.get(name) or ir.Function(
        b.module, ir.FunctionType(ir.VoidType(), [i8p, i8p, U.I64, U.I1]), name=name)
    b.call(fn, [b.bitcast(d, i8p), b.bitcast(s, i8p), nbytes, ir.Constant(U.I1, 0)])


def emit_fill(b: ir.IRBuilder, dst: ir.Value, off: int | ir.Value, n: int,
              value: ir.Value) -> None:
    """``dst[off:off+n] = value`` (LLVM makes it a memset or vector stores)."""
    if n > 0:
        U.fill(b, U.element_ptr(b, dst, off), n, value)


class Scratch:
    """Temporary buffers for one kernel call: on the stack while they total at most
    ``stack_limit`` bytes (the kernel may run on a thread with a small stack), from
    libc's ``malloc`` beyond that (the JIT resolves it in the process; a failed
    allocation crashes rather than computing garbage). Call :meth:`release` before the
    function returns (it emits the ``free`` calls)."""

    def __init__(self, b: ir.IRBuilder, stack_limit: int = 128 * 1024) -> None:
        self.b = b
        self.stack_left = stack_limit
        self._heap: list[ir.Value] = []

    def alloc(self, ty: ir.Type, n: int, name: str = "scratch") -> ir.Value:
        """A buffer of ``n`` elements of ``ty`` (at least 16-byte aligned), as a ``ty*``."""
        nbytes = n * _elem_bytes(ty)
        if nbytes <= self.stack_left:
            self.stack_left -= nbytes
            return U.alloca_array(self.b, ty, max(n, 1), name=name)
        raw = self.b.call(self._libc("malloc", U.I8.as_pointer(), [U.I64]), [U.i64(nbytes)],
                          name=name)
        self._heap.append(raw)
        return self.b.bitcast(raw, ty.as_pointer())

    def release(self) -> None:
        """Free the heap buffers (emitted at the builder's position)."""
        free = self._libc("free", ir.VoidType(), [U.I8.as_pointer()])
        for raw in self._heap:
            self.b.call(free, [raw])

    def _libc(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        module = self.b.module
        return module.globals.get(name) or ir.Function(module, ir.FunctionType(ret, args), name)


def emit_transpose_2d(b: ir.IRBuilder, src: ir.Value, src_off: int | ir.Value,
                      src_stride: int, dst: ir.Value, dst_off: int | ir.Value,
                      dst_stride: int, rows: int, cols: int) -> None:
    """``dst[j*dst_stride + i] = src[i*src_stride + j]`` for ``i < rows, j < cols``
    (offsets added), for 8-bit and 32-bit elements.

    Full vector tiles run inside 64x64 cache blocks; the ragged right and bottom
    strips (fewer than a tile) are plain loops, and so is all of it for element sizes
    without a tile."""
    g = _Strided(src, src_off, src_stride, dst, dst_off, dst_stride)
    t = transpose_tile_edge(src.type.pointee)
    if t is None:
        _emit_scalar_block(b, g, 0, rows, 0, cols)
        return
    r_full, c_full = rows - rows % t, cols - cols % t
    if r_full and c_full:
        _emit_tiled(b, g, r_full, c_full, t)
    # The ragged strips: the reads walk rows contiguously (inner j).
    if c_full < cols:
        _emit_scalar_block(b, g, 0, r_full, c_full, cols)
    if r_full < rows:
        _emit_scalar_block(b, g, r_full, rows, 0, cols)


@dataclass(frozen=True)
class _Strided:
    """A source matrix and its transposed destination (element pointers, i64 offsets)."""

    src: ir.Value
    src_off: int | ir.Value
    src_stride: int
    dst: ir.Value
    dst_off: int | ir.Value
    dst_stride: int

    def src_index(self, b: ir.IRBuilder, i: ir.Value, j: ir.Value) -> ir.Value:
        return U.linear_index(b, [i, j], [self.src_stride, 1], self.src_off)

    def dst_index(self, b: ir.IRBuilder, i: ir.Value, j: ir.Value) -> ir.Value:
        return U.linear_index(b, [j, i], [self.dst_stride, 1], self.dst_off)


def _elem_bytes(ty: ir.Type) -> int:
    return 4 if isinstance(ty, ir.FloatType) else ty.width // 8


def transpose_tile_edge(ty: ir.Type) -> int | None:
    """Edge of the square vector tile :func:`emit_transpose_2d` moves elements of
    ``ty`` in (None: no tile, element moves only)."""
    return {1: 16, 4: 8}.get(_elem_bytes(ty))


def _emit_tiled(b: ir.IRBuilder, g: _Strided, rows: int, cols: int, t: int) -> None:
    bi, bj = min(_BLOCK, rows), min(_BLOCK, cols)
    # Blocks are whole multiples of the tile; the last block in each direction may be
    # shorter, so it gets its own loop with its own constant trip count.
    for i_lo, i_hi, i_size in _block_runs(rows, bi):
        for j_lo, j_hi, j_size in _block_runs(cols, bj):
            with U.for_range(b, i_hi, i_lo, step=i_size, name="tbi") as ib, \
                    U.for_range(b, j_hi, j_lo, step=j_size, name="tbj") as jb, \
                    U.for_range(b, i_size, step=t, name="tti") as ti, \
                    U.for_range(b, j_size, step=t, name="ttj") as tj:
                _emit_tile(b, g, b.add(ib, ti), b.add(jb, tj), t)


def _block_runs(n: int, block: int) -> list[tuple[int, int, int]]:
    """``[(lo, hi, size)]``: loops ``for x in range(lo, hi, size)`` covering ``n``
    (a multiple of the tile) with blocks of ``block`` and a shorter last block."""
    full = n - n % block
    runs = [(0, full, block)] if full else []
    if full < n:
        runs.append((full, n, n - full))
    return runs


def _emit_tile(b: ir.IRBuilder, g: _Strided, i0: ir.Value, j0: ir.Value, t: int) -> None:
    ety = g.src.type.pointee
    vty = ir.VectorType(ety, t)
    rows = [b.load(b.bitcast(U.element_ptr(b, g.src, g.src_index(b, b.add(i0, U.i64(i)), j0)),
                             vty.as_pointer()), align=1) for i in range(t)]
    cols = _transpose_8x8(b, rows) if t == 8 else _transpose_16x16(b, rows)
    for j, v in enumerate(cols):
        p = U.element_ptr(b, g.dst, g.dst_index(b, i0, b.add(j0, U.i64(j))))
        b.store(v, b.bitcast(p, vty.as_pointer()), align=1)


def _shuffle(b: ir.IRBuilder, x: ir.Value, y: ir.Value, mask: Sequence[int]) -> ir.Value:
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(U.I32, len(mask)), list(mask)))


def _transpose_8x8(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """8x8 transpose of 32-bit lanes in three shuffle stages whose masks are AVX's
    unpcklps/unpckhps, shufps and vperm2f128 (one instruction each)."""
    t = []
    for i in range(0, 8, 2):
        t += [_shuffle(b, rows[i], rows[i + 1], [0, 8, 1, 9, 4, 12, 5, 13]),
              _shuffle(b, rows[i], rows[i + 1], [2, 10, 3, 11, 6, 14, 7, 15])]
    s = []
    for base in (0, 4):
        for x, y in ((t[base], t[base + 2]), (t[base + 1], t[base + 3])):
            s += [_shuffle(b, x, y, [0, 1, 8, 9, 4, 5, 12, 13]),
                  _shuffle(b, x, y, [2, 3, 10, 11, 6, 7, 14, 15])]
    lo = [_shuffle(b, s[k], s[k + 4], [0, 1, 2, 3, 8, 9, 10, 11]) for k in range(4)]
    hi = [_shuffle(b, s[k], s[k + 4], [4, 5, 6, 7, 12, 13, 14, 15]) for k in range(4)]
    return lo + hi


def _transpose_16x16(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """16x16 transpose of bytes: four perfect-shuffle stages, each row pair (i, i+8)
    interleaved into rows 2i, 2i+1 (punpcklbw / punpckhbw)."""
    lo = [x for i in range(8) for x in (i, i + 16)]
    hi = [x for i in range(8, 16) for x in (i, i + 16)]
    for _ in range(4):
        nxt = []
        for i in range(8):
            nxt += [_shuffle(b, rows[i], rows[i + 8], lo), _shuffle(b, rows[i], rows[i + 8], hi)]
        rows = nxt
    return rows


def _emit_scalar_block(b: ir.IRBuilder, g: _Strided, i_lo: int, i_hi: int,
                       j_lo: int, j_hi: int) -> None:
    if i_lo >= i_hi or j_lo >= j_hi:
        return
    with U.for_range(b, i_hi, i_lo, name="sti") as i, U.for_range(b, j_hi, j_lo, name="stj") as j:
        v = U.load(b, g.src, g.src_index(b, i, j))
        U.store(b, v, g.dst, g.dst_index(b, i, j))


# ---------------------------------------------------------------------------------
# Concat and Split: one tensor is the parts side by side along an axis, so each outer
# row of the whole is every part's contiguous chunk in turn. Concat copies the chunks
# into the whole, Split out of it; both are one memcpy per chunk and row.

def build_concat(inputs: Sequence[TensorSpec], axis: int, name: str = "concat") -> CpuKernel:
    """ONNX Concat of ``inputs`` (same dtype and rank, equal except along ``axis``;
    negative ``axis`` counts from the end). One output, the inputs' dtype."""
    inputs = tuple(inputs)
    if not inputs:
        raise CpuKernelError("Concat: needs at least one input")
    first = inputs[0]
    rank = first.ndim
    if not -rank <= axis < rank:
        raise CpuKernelError(f"Concat: axis {axis} is out of range for rank {rank}")
    axis %= rank
    for i, s in enumerate(inputs):
        if s.dtype != first.dtype or s.ndim != rank or any(
                d != e for k, (d, e) in enumerate(zip(s.shape, first.shape)) if k != axis):
            raise CpuKernelError(
                f"Concat: input {i} {s} does not match input 0 {first} outside axis {axis}")
    out_shape = list(first.shape)
    out_shape[axis] = sum(s.shape[axis] for s in inputs)
    out = TensorSpec(tuple(out_shape), first.dtype)
    return _build_parts(name, inputs, (out,), out, inputs, axis, split=False)


def build_split(spec: TensorSpec, axis: int, sizes: Sequence[int],
                name: str = "split") -> CpuKernel:
    """ONNX Split of ``spec`` along ``axis`` (negative counts from the end) into parts
    of ``sizes`` elements (non-negative, summing to the axis' size). One output per
    part, the input's dtype."""
    rank = spec.ndim
    if not -rank <= axis < rank:
        raise CpuKernelError(f"Split: axis {axis} is out of range for rank {rank}")
    axis %= rank
    sizes = [int(s) for s in sizes]
    if not sizes or min(sizes) < 0 or sum(sizes) != spec.shape[axis]:
        raise CpuKernelError(f"Split: sizes {sizes} must be non-negative and sum to the "
                             f"size {spec.shape[axis]} of axis {axis}")
    outs = tuple(TensorSpec(spec.shape[:axis] + (s,) + spec.shape[axis + 1:], spec.dtype)
                 for s in sizes)
    return _build_parts(name, (spec,), outs, spec, outs, axis, split=True)


def _build_parts(name: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
                 whole: TensorSpec, parts: tuple[TensorSpec, ...], axis: int,
                 split: bool) -> CpuKernel:
    """The kernel copying ``parts`` into ``whole`` (Concat) or out of it (``split``);
    the arguments are the inputs then the outputs, as always."""
    module = new_module(name)
    fn, b = kernel_function(module, "entry", inputs, outputs)
    outer = prod(whole.shape[:axis])
    chunks = [prod(s.shape[axis:]) for s in parts]
    _emit_parts_serial(b, *_whole_and_parts(fn.args, split), outer, chunks, split)
    b.ret_void()
    pieces = _concat_pieces(outer, chunks) if whole.size else 1
    parallel = outer * pieces if whole.size and outer * pieces > 1 else 0
    if parallel:
        fn, b, begin, end = range_function(module, "entry", inputs, outputs)
        whole_arg, part_args = _whole_and_parts(fn.args[:-2], split)
        _emit_parts_range(b, whole_arg, part_args, chunks, pieces, begin, end, split)
        b.ret_void()
    return CpuKernel(name, str(module), "entry", inputs, outputs, parallel=parallel)


def _whole_and_parts(args: Sequence[ir.Value], split: bool
                     ) -> tuple[ir.Value, Sequence[ir.Value]]:
    """The whole tensor's pointer and the parts' among a kernel's pointer arguments."""
    return (args[0], args[1:]) if split else (args[-1], args[:-1])


def _move_chunk(b: ir.IRBuilder, whole: ir.Value, whole_at: int | ir.Value, part: ir.Value,
                part_at: int | ir.Value, n: int | ir.Value, split: bool) -> None:
    """Copy ``n`` elements between ``part`` and ``whole`` (a run-time ``n`` if it is an
    IR value), in the direction of the op."""
    copy = emit_copy if isinstance(n, int) else emit_copy_n
    if split:
        copy(b, part, part_at, whole, whole_at, n)
    else:
        copy(b, whole, whole_at, part, part_at, n)


def _emit_parts_serial(b: ir.IRBuilder, whole: ir.Value, parts: Sequence[ir.Value],
                       outer: int, chunks: list[int], split: bool) -> None:
    row = sum(chunks)
    offset = 0
    for part, chunk in zip(parts, chunks):
        if outer == 1:
            _move_chunk(b, whole, offset, part, 0, chunk, split)
        elif chunk:
            with U.for_range(b, outer, name="cat") as o:
                _move_chunk(b, whole, U.linear_index(b, [o], [row], offset),
                            part, U.linear_index(b, [o], [chunk]), chunk, split)
        offset += chunk


#: The parallel form of a concat or split splits each part's contiguous chunk into
#: pieces so that there are at least this many units of work (for up to that many
#: threads)...
_CONCAT_UNITS = 64
#: ...but no piece is shorter than this many elements (a memcpy call each).
_CONCAT_MIN_PIECE = 1024


def _concat_pieces(outer: int, chunks: list[int]) -> int:
    """Pieces per part's chunk in the parallel form (1: split only the outer loop)."""
    if outer >= _CONCAT_UNITS:
        return 1
    want = -(-_CONCAT_UNITS // outer)
    return max(1, min(want, min(c for c in chunks if c) // _CONCAT_MIN_PIECE))


def _emit_parts_range(b: ir.IRBuilder, whole: ir.Value, parts: Sequence[ir.Value],
                      chunks: list[int], pieces: int, begin: ir.Value, end: ir.Value,
                      split: bool) -> None:
    """Units ``[begin, end)`` of ``outer * pieces``: unit ``u`` moves piece
    ``u % pieces`` of every part's chunk in outer row ``u // pieces``."""
    row = sum(chunks)
    with U.for_range(b, end, begin, name="catu") as u:
        o = b.udiv(u, U.i64(pieces)) if pieces > 1 else u
        k = b.urem(u, U.i64(pieces)) if pieces > 1 else None
        offset = 0
        for part, chunk in zip(parts, chunks):
            whole_row = U.linear_index(b, [o], [row], offset)
            part_row = U.linear_index(b, [o], [chunk])
            if k is None:
                _move_chunk(b, whole, whole_row, part, part_row, chunk, split)
            elif chunk:
                lo = b.udiv(b.mul(k, U.i64(chunk)), U.i64(pieces))
                hi = b.udiv(b.mul(b.add(k, U.i64(1)), U.i64(chunk)), U.i64(pieces))
                _move_chunk(b, whole, b.add(whole_row, lo), part, b.add(part_row, lo),
                            b.sub(hi, lo), split)
            offset += chunk


# ---------------------------------------------------------------------------------
# Pad

@dataclass(frozen=True)
class _Segment:
    """Output indices ``[lo, hi)`` of one axis: read input index ``scale*o + shift``
    (``scale`` 1 or -1, or 0 for one repeated index), or the constant if ``const``."""

    lo: int
    hi: int
    const: bool = False
    scale: int = 1
    shift: int = 0

    def source(self, b: ir.IRBuilder, o: ir.Value) -> ir.Value:
        if self.scale == 0:
            return U.i64(self.shift)
        term = o if self.scale == 1 else b.sub(U.i64(0), o)
        return b.add(term, U.i64(self.shift))


def _pad_segments(n: int, begin: int, end: int, mode: str) -> list[_Segment]:
    """How the output of one axis (``begin + n + end``) maps to the input."""
    mid = _Segment(begin, begin + n, shift=-begin)
    stop = begin + n + end
    if mode == "constant":
        before, after = _Segment(0, begin, const=True), _Segment(begin + n, stop, const=True)
    elif mode == "edge":
        before = _Segment(0, begin, scale=0, shift=0)
        after = _Segment(begin + n, stop, scale=0, shift=n - 1)
    else:  # reflect: out begin-1 reads 1, out begin+n reads n-2 (edge not repeated)
        before = _Segment(0, begin, scale=-1, shift=begin)
        after = _Segment(begin + n, stop, scale=-1, shift=2 * n + begin - 2)
    return [s for s in (before, mid, after) if s.hi > s.lo]


def _check_pad(spec: TensorSpec, pads: Sequence[int], mode: str) -> list[tuple[int, int]]:
    rank = spec.ndim
    if mode not in _PAD_MODES:
        raise CpuKernelError(f"Pad: mode {mode!r} is not one of {_PAD_MODES}")
    if len(pads) != 2 * rank:
        raise CpuKernelError(f"Pad: pads needs {2 * rank} values (begins then ends) for "
                             f"rank {rank}, got {len(pads)}")
    pairs = [(int(pads[k]), int(pads[k + rank])) for k in range(rank)]
    for k, (lo, hi) in enumerate(pairs):
        if lo < 0 or hi < 0:
            raise CpuKernelError(f"Pad: pads for axis {k} ({lo}, {hi}) are negative; "
                                 "cropping is not supported")
        n = spec.shape[k]
        if mode == "edge" and n == 0 and lo + hi:
            raise CpuKernelError(f"Pad: edge mode cannot pad empty axis {k}")
        if mode == "reflect" and max(lo, hi) > n - 1 and lo + hi:
            raise CpuKernelError(f"Pad: reflect pads ({lo}, {hi}) of axis {k} must be "
                                 f"below its size {n}")
    return pairs


def _merge_pad_axes(shape: Sequence[int], pairs: Sequence[tuple[int, int]],
                    scale_pads: bool) -> tuple[list[int], list[tuple[int, int]]]:
    """Fold each unpadded axis into the axis before it, so runs of contiguous data
    become one long copy. Into an unpadded axis this is a plain product; into a padded
    one (``scale_pads``, constant mode only) its pads scale by the folded size: ``p``
    padded rows of ``n`` elements are ``p*n`` padded elements."""
    dims: list[int] = []
    prs: list[tuple[int, int]] = []
    for n, p in zip(shape, pairs):
        if dims and p == (0, 0) and (scale_pads or prs[-1] == (0, 0)):
            dims[-1] *= n
            prs[-1] = (prs[-1][0] * n, prs[-1][1] * n)
        else:
            dims.append(n)
            prs.append(p)
    return dims, prs


def build_pad(spec: TensorSpec, pads: Sequence[int], mode: str = "constant",
              value: float = 0, name: str = "pad") -> CpuKernel:
    """ONNX Pad of one tensor. ``pads`` is ONNX's ``[x1_begin, x2_begin, ...,
    x1_end, x2_end, ...]`` (non-negative); ``mode`` is ``"constant"`` (``value``,
    cast to the dtype), ``"edge"`` or ``"reflect"`` (pads below the axis size)."""
    pairs = _check_pad(spec, pads, mode)
    out = TensorSpec(tuple(n + lo + hi for n, (lo, hi) in zip(spec.shape, pairs)), spec.dtype)
    module = new_module(name)
    fn, b = kernel_function(module, "entry", (spec,), (out,))
    # Edge and reflect pads repeat whole blocks of the next axis, so an unpadded axis
    # can only fold into another unpadded one there.
    dims, prs = _merge_pad_axes(spec.shape, pairs, scale_pads=mode == "constant")
    fill = U.const(spec.dtype, value)
    if out.size:
        _Padder(b, fn.args[0], fn.args[1], dims, prs, mode, fill).emit(0, U.i64(0), U.i64(0))
    b.ret_void()
    # An unpadded outer axis (batch, channels) splits: each index is one whole block.
    splits = out.size and len(dims) > 1 and prs[0] == (0, 0) and dims[0] > 1
    parallel = dims[0] if splits else 0
    if parallel:
        fn, b, begin, end = range_function(module, "entry", (spec,), (out,))
        padder = _Padder(b, fn.args[0], fn.args[1], dims, prs, mode, fill)
        with U.for_range(b, end, begin, name="padp") as o:
            padder.emit(1, b.mul(o, U.i64(padder.in_block[0])),
                        b.mul(o, U.i64(padder.out_block[0])))
        b.ret_void()
    return CpuKernel(name, str(module), "entry", (spec,), (out,), parallel=parallel)


class _Padder:
    """Emits the pad recursively: per axis, each output segment is a fill, a loop that
    recurses into the next axis, or (innermost) a copy."""

    def __init__(self, b: ir.IRBuilder, src: ir.Value, dst: ir.Value, dims: list[int],
                 pairs: list[tuple[int, int]], mode: str, fill: ir.Value) -> None:
        self.b, self.src, self.dst, self.fill = b, src, dst, fill
        self.segments = [_pad_segments(n, lo, hi, mode) for n, (lo, hi) in zip(dims, pairs)]
        out_dims = [n + lo + hi for n, (lo, hi) in zip(dims, pairs)]
        self.in_block = [prod(dims[k + 1:]) for k in range(len(dims))]
        self.out_block = [prod(out_dims[k + 1:]) for k in range(len(dims))]

    def emit(self, axis: int, in_off: ir.Value, out_off: ir.Value) -> None:
        b = self.b
        last = axis == len(self.segments) - 1
        ib, ob = self.in_block[axis], self.out_block[axis]
        for seg in self.segments[axis]:
            start = b.add(out_off, U.i64(seg.lo * ob))
            if seg.const:
                emit_fill(b, self.dst, start, (seg.hi - seg.lo) * ob, self.fill)
            elif last and seg.scale == 1:
                emit_copy(b, self.dst, start, self.src,
                          b.add(in_off, U.i64(seg.lo + seg.shift)), seg.hi - seg.lo)
            else:
                with U.for_range(b, seg.hi, seg.lo, name=f"pad{axis}") as o:
                    src = b.add(in_off, b.mul(seg.source(b, o), U.i64(ib)))
                    dst = b.add(out_off, b.mul(o, U.i64(ob)))
                    if last:
                        U.store(b, U.load(b, self.src, src), self.dst, dst)
                    else:
                        self.emit(axis + 1, src, dst)


# ---------------------------------------------------------------------------------
# Transpose

def _simplify_perm(shape: Sequence[int], perm: Sequence[int]
                   ) -> tuple[list[int], list[int]]:
    """Drop size-1 axes and merge input axes that stay adjacent (and in order) in the
    output. Returns the reduced input shape and permutation."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    rank = {a: k for k, a in enumerate(keep)}
    dims = [shape[a] for a in keep]
    p = [rank[a] for a in perm if a in rank]
    # Group runs a, a+1, ... that appear consecutively in p.
    groups: list[list[int]] = []
    for a in p:
        if groups and groups[-1][-1] + 1 == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])
    new_dims = [prod(dims[a] for a in groups[g]) for g in order]
    pos = {g: k for k, g in enumerate(order)}
    return new_dims, [pos[g] for g in range(len(groups))]


def build_transpose(spec: TensorSpec, perm: Sequence[int] | None = None,
                    name: str = "transpose") -> CpuKernel:
    """ONNX Transpose: output axis ``k`` is input axis ``perm[k]`` (default: reversed).
    NCHW -> NHWC and other 2-D/4-D cases run as cache-blocked tile transposes."""
    rank = spec.ndim
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(rank)):
        raise CpuKernelError(f"Transpose: perm {perm} is not a permutation of "
                             f"0..{rank - 1}")
    out = TensorSpec(tuple(spec.shape[p] for p in perm), spec.dtype)
    module = new_module(name)
    fn, b = kernel_function(module, "entry", (spec,), (out,))
    if spec.size:
        dims, p = _simplify_perm(spec.shape, perm)
        _emit_transpose(b, fn.args[0], fn.args[1], dims, p)
    b.ret_void()
    return CpuKernel(name, str(module), "entry", (spec,), (out,))


def _emit_transpose(b: ir.IRBuilder, src: ir.Value, dst: ir.Value, dims: list[int],
                    perm: list[int]) -> None:
    r = len(dims)
    if r <= 1:
        emit_copy(b, dst, 0, src, 0, prod(dims))
        return
    in_strides = U.c_strides(dims)
    out_dims = [dims[a] for a in perm]
    out_strides = U.c_strides(out_dims)
    if perm[-1] == r - 1:
        # Rows stay contiguous: one copy per output row.
        with U.nested_range(b, out_dims[:-1], name="tr") as idx:
            emit_copy(b, dst, U.linear_index(b, idx, out_strides[:-1]), src,
                      U.linear_index(b, idx, [in_strides[a] for a in perm[:-1]]), dims[-1])
        return
    # The input's last axis (contiguous reads) lands at output position q; the output's
    # last axis (contiguous writes) is input axis a. Simplification made them differ.
    q = perm.index(r - 1)
    a = perm[-1]
    outer = [k for k in range(r) if k not in (q, r - 1)]
    with U.nested_range(b, [out_dims[k] for k in outer], name="tr") as idx:
        src_off = U.linear_index(b, idx, [in_strides[perm[k]] for k in outer])
        dst_off = U.linear_index(b, idx, [out_strides[k] for k in outer])
        emit_transpose_2d(b, src, src_off, in_strides[a], dst, dst_off, out_strides[q],
                          rows=dims[a], cols=dims[r - 1])
