"""Copies of strided views of one tensor: Slice, Expand, Tile, DepthToSpace and
SpaceToDepth with ONNX semantics.

Each of these ops is an affine view of its input: output element ``i`` (C order over
the view's shape) is input element ``offset + sum(i[k] * strides[k])``, the strides in
elements, negative for a reversed slice, 0 for a broadcast or repeated axis. The view
is simplified (axes of size 1 dropped, neighbouring axes that stay contiguous merged)
and copied in one pass over memory, the innermost move chosen by the strides:

- input stride 1 innermost: one ``llvm.memcpy`` of constant length per run (Slice,
  Expand and Tile of rows);
- stride 0 innermost: one load and a fill (broadcast of a value);
- the input's contiguous axis elsewhere: the cache-blocked tile transposes of
  :mod:`.layout_ops` (SpaceToDepth, DepthToSpace with large blocks), or for fewer
  rows than a tile, the rows read side by side and interleaved (DepthToSpace with
  blocks of 2 or 4: 5-20x faster than element moves);
- otherwise element moves in a loop nest LLVM vectorises (steps other than 1,
  reversal).

The view is computed and checked in bounds at build time from the op's parameters,
so a kernel never reads outside its input.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from math import prod
from typing import Iterator, Sequence

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module, range_function
from .layout_ops import emit_copy, emit_fill, emit_transpose_2d, transpose_tile_edge

__all__ = ["StridedView", "build_depth_to_space", "build_expand", "build_slice",
           "build_space_to_depth", "build_tile", "build_view_copy", "depth_to_space_view",
           "expand_view", "slice_view", "space_to_depth_view", "tile_view"]


# ---------------------------------------------------------------------------------
# Views

@dataclass(frozen=True)
class StridedView:
    """Output element ``i`` (C order over ``shape``) is input element
    ``offset + sum(i[k] * strides[k])``."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def size(self) -> int:
        return prod(self.shape)

    def simplified(self) -> "StridedView":
        """The same view with axes of size 1 dropped and each axis merged into the one
        before it where that one's stride is its stride times its size."""
        dims: list[int] = []
        strides: list[int] = []
        for n, s in zip(self.shape, self.strides):
            if n == 1:
                continue
            if dims and strides[-1] == s * n:
                dims[-1] *= n
                strides[-1] = s
            else:
                dims.append(n)
                strides.append(s)
        return StridedView(tuple(dims), tuple(strides), self.offset)

    def bounds(self) -> tuple[int, int]:
        """The lowest and highest input element read (a non-empty view)."""
        lo = hi = self.offset
        for n, s in zip(self.shape, self.strides):
            lo += min(0, (n - 1) * s)
            hi += max(0, (n - 1) * s)
        return lo, hi


def _axis(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < rank:
        raise CpuKernelError(f"{op}: axis {axis} is out of range for rank {rank}")
    return axis % rank


def slice_view(shape: Sequence[int], starts: Sequence[int], ends: Sequence[int],
               axes: Sequence[int] | None = None,
               steps: Sequence[int] | None = None) -> StridedView:
    """ONNX Slice of a tensor of ``shape``: per axis of ``axes`` (default 0, 1, ...;
    negative counts from the end), elements ``start, start + step, ...`` before
    ``end``. Negative starts and ends count from the end of the axis; out-of-range
    ones are clamped as ONNX says (to ``[0, n]`` for positive steps, ``[-1, n - 1]``
    for negative ones)."""
    shape = [int(n) for n in shape]
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise CpuKernelError(f"Slice: starts {list(starts)}, ends {list(ends)}, axes {axes} "
                             f"and steps {steps} must have one value per sliced axis")
    begin, count, step = [0] * rank, list(shape), [1] * rank
    seen: set[int] = set()
    for a, start, end, st in zip(axes, starts, ends, steps):
        a = _axis(a, rank, "Slice")
        if a in seen:
            raise CpuKernelError(f"Slice: axis {a} is sliced twice (axes {axes})")
        if st == 0:
            raise CpuKernelError(f"Slice: step 0 on axis {a}")
        seen.add(a)
        begin[a], count[a], step[a] = *_slice_axis(shape[a], int(start), int(end), st), st
    strides = U.c_strides(shape)
    return StridedView(tuple(count), tuple(st * s for st, s in zip(step, strides)),
                       sum(b * s for b, s in zip(begin, strides)))


def _slice_axis(n: int, start: int, end: int, step: int) -> tuple[int, int]:
    """First index and element count of ``start:end:step`` on an axis of ``n``."""
    start += n if start < 0 else 0
    end += n if end < 0 else 0
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
    else:
        start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
    return start, max(0, -((start - end) // step))


def expand_view(shape: Sequence[int], target: Sequence[int]) -> StridedView:
    """ONNX Expand of a tensor of ``shape`` to ``target`` (numpy broadcasting both
    ways: the output shape is the broadcast of the two)."""
    shape, target = [int(n) for n in shape], [int(n) for n in target]
    rank = max(len(shape), len(target))
    a = [1] * (rank - len(shape)) + shape
    t = [1] * (rank - len(target)) + target
    if any(x != y and 1 not in (x, y) for x, y in zip(a, t)):
        raise CpuKernelError(f"Expand: shape {shape} does not broadcast to {target}")
    out = tuple(y if x == 1 else x for x, y in zip(a, t))
    return StridedView(out, U.broadcast_strides(shape, out))


def tile_view(shape: Sequence[int], repeats: Sequence[int]) -> tuple[StridedView,
                                                                       tuple[int, ...]]:
    """ONNX Tile: axis ``k`` repeated ``repeats[k]`` times. Returns the view (each axis
    as a repeat axis of stride 0 before the data axis) and the output shape."""
    shape, repeats = [int(n) for n in shape], [int(r) for r in repeats]
    if len(repeats) != len(shape) or min(repeats, default=0) < 0:
        raise CpuKernelError(f"Tile: repeats {repeats} must be one non-negative value per "
                             f"axis of shape {shape}")
    dims, strides = [], []
    for n, r, s in zip(shape, repeats, U.c_strides(shape)):
        dims += [r, n]
        strides += [0, s]
    return StridedView(tuple(dims), tuple(strides)), tuple(n * r for n, r in
                                                           zip(shape, repeats))


def _permuted(split_shape: Sequence[int], perm: Sequence[int]) -> StridedView:
    """The view reading a contiguous tensor of ``split_shape`` transposed by ``perm``."""
    strides = U.c_strides(split_shape)
    return StridedView(tuple(split_shape[p] for p in perm), tuple(strides[p] for p in perm))


def depth_to_space_view(shape: Sequence[int], blocksize: int, mode: str = "DCR"
                        ) -> tuple[StridedView, tuple[int, ...]]:
    """ONNX DepthToSpace of an NCHW tensor (``mode`` "DCR" or "CRD"): the view and the
    output shape ``(N, C / b**2, H * b, W * b)``."""
    n, c, h, w, b = *_nchw(shape, "DepthToSpace"), int(blocksize)
    if b < 1 or c % (b * b):
        raise CpuKernelError(f"DepthToSpace: blocksize {b} must be positive with its "
                             f"square dividing the {c} channels")
    if mode not in ("DCR", "CRD"):
        raise CpuKernelError(f"DepthToSpace: mode {mode!r} is not DCR or CRD")
    cc = c // (b * b)
    if mode == "DCR":
        view = _permuted((n, b, b, cc, h, w), (0, 3, 4, 1, 5, 2))
    else:
        view = _permuted((n, cc, b, b, h, w), (0, 1, 4, 2, 5, 3))
    return view, (n, cc, h * b, w * b)


def space_to_depth_view(shape: Sequence[int], blocksize: int
                        ) -> tuple[StridedView, tuple[int, ...]]:
    """ONNX SpaceToDepth of an NCHW tensor: the view and the output shape
    ``(N, C * b**2, H / b, W / b)``."""
    n, c, h, w, b = *_nchw(shape, "SpaceToDepth"), int(blocksize)
    if b < 1 or h % b or w % b:
        raise CpuKernelError(f"SpaceToDepth: blocksize {b} must be positive and divide "
                             f"H {h} and W {w}")
    view = _permuted((n, c, h // b, b, w // b, b), (0, 3, 5, 1, 2, 4))
    return view, (n, c * b * b, h // b, w // b)


def _nchw(shape: Sequence[int], op: str) -> tuple[int, int, int, int]:
    if len(shape) != 4:
        raise CpuKernelError(f"{op}: input must be NCHW (rank 4), not shape {list(shape)}")
    n, c, h, w = (int(d) for d in shape)
    return n, c, h, w


# ---------------------------------------------------------------------------------
# Builders

def build_slice(spec: TensorSpec, starts: Sequence[int], ends: Sequence[int],
                axes: Sequence[int] | None = None, steps: Sequence[int] | None = None,
                name: str = "slice") -> CpuKernel:
    """ONNX Slice (see :func:`slice_view`)."""
    view = slice_view(spec.shape, starts, ends, axes, steps)
    return build_view_copy(spec, view, view.shape, name)


def build_expand(spec: TensorSpec, target: Sequence[int], name: str = "expand") -> CpuKernel:
    """ONNX Expand (see :func:`expand_view`)."""
    view = expand_view(spec.shape, target)
    return build_view_copy(spec, view, view.shape, name)


def build_tile(spec: TensorSpec, repeats: Sequence[int], name: str = "tile") -> CpuKernel:
    """ONNX Tile (see :func:`tile_view`)."""
    return build_view_copy(spec, *tile_view(spec.shape, repeats), name)


def build_depth_to_space(spec: TensorSpec, blocksize: int, mode: str = "DCR",
                         name: str = "depth_to_space") -> CpuKernel:
    """ONNX DepthToSpace (see :func:`depth_to_space_view`)."""
    return build_view_copy(spec, *depth_to_space_view(spec.shape, blocksize, mode), name)


def build_space_to_depth(spec: TensorSpec, blocksize: int,
                         name: str = "space_to_depth") -> CpuKernel:
    """ONNX SpaceToDepth (see :func:`space_to_depth_view`)."""
    return build_view_copy(spec, *space_to_depth_view(spec.shape, blocksize), name)


def build_view_copy(spec: TensorSpec, view: StridedView, out_shape: Sequence[int],
                    name: str = "view_copy") -> CpuKernel:
    """The kernel writing ``view`` of a ``spec`` input, in C order, into an output of
    ``out_shape`` (as many elements as the view). The parallel form splits the
    outermost loop of the copy."""
    out = TensorSpec(tuple(out_shape), spec.dtype)
    if view.size != out.size or len(view.shape) != len(view.strides):
        raise CpuKernelError(f"{name}: view {view} does not fill an output of shape "
                             f"{list(out.shape)}")
    if view.size:
        lo, hi = view.bounds()
        if lo < 0 or hi >= spec.size:
            raise CpuKernelError(f"{name}: view {view} reads elements {lo}..{hi} of an "
                                 f"input of {spec.size}")
    copy = _ViewCopy(view.simplified(), transpose_tile_edge(spec.llvm_type))
    module = new_module(name)
    fn, b = kernel_function(module, "entry", (spec,), (out,))
    if out.size:
        copy.emit(b, *fn.args)
    b.ret_void()
    parallel = copy.parallel if out.size else 0
    if parallel:
        fn, b, begin, end = range_function(module, "entry", (spec,), (out,))
        copy.emit(b, *fn.args[:2], (begin, end))
        b.ret_void()
    return CpuKernel(name, str(module), "entry", (spec,), (out,), parallel=parallel)


# ---------------------------------------------------------------------------------
# Emission

#: Up to this many rows of elements without a transpose tile are interleaved.
_INTERLEAVE_ROWS = 16


class _ViewCopy:
    """How a simplified view is copied: loops over ``loops`` (axes of the view) around
    one innermost move of kind ``copy`` (memcpy of the last axis), ``fill`` (the last
    axis is one value), ``transpose`` (the last axis against input-contiguous axis
    ``q``, in tiles of ``tile_edge``), ``interleave`` (the same with fewer rows than a
    tile) or ``move`` (one element)."""

    def __init__(self, view: StridedView, tile_edge: int | None) -> None:
        self.view = view
        dims, strides = view.shape, view.strides
        r = len(dims)
        self.out_strides = U.c_strides(dims)
        self.q = next((k for k in range(r - 1) if strides[k] == 1), None)
        if r and strides[-1] in (0, 1):
            self.kind = "copy" if strides[-1] else "fill"
            self.loops = list(range(r - 1))
        elif r and self.q is not None and strides[-1] > 0:
            # Fewer rows than a tile: the tile transpose would move single elements;
            # reading the rows side by side lets LLVM interleave them in registers.
            few = dims[-1] < (tile_edge or _INTERLEAVE_ROWS)
            self.kind = "interleave" if few else "transpose"
            self.loops = [k for k in range(r - 1) if k != self.q]
        else:
            self.kind = "move"
            self.loops = list(range(r))

    @property
    def parallel(self) -> int:
        """Extent of the outermost loop when it can be split across threads, else 0."""
        extent = self.view.shape[self.loops[0]] if self.loops else 0
        return extent if extent > 1 else 0

    def emit(self, b: ir.IRBuilder, src: ir.Value, dst: ir.Value,
             first: tuple[ir.Value, ir.Value] | None = None) -> None:
        """The copy; with ``first`` (begin, end) only those iterations of the outermost
        loop."""
        v = self.view
        extents = [v.shape[k] for k in self.loops]
        with _loop_nest(b, extents, first) as idx:
            src_off = _offset(b, idx, [v.strides[k] for k in self.loops], v.offset)
            dst_off = _offset(b, idx, [self.out_strides[k] for k in self.loops], 0)
            self._move(b, src, src_off, dst, dst_off)

    def _move(self, b: ir.IRBuilder, src: ir.Value, src_off: ir.Value, dst: ir.Value,
              dst_off: ir.Value) -> None:
        dims, strides = self.view.shape, self.view.strides
        if self.kind == "copy":
            emit_copy(b, dst, dst_off, src, src_off, dims[-1])
        elif self.kind == "fill":
            emit_fill(b, dst, dst_off, dims[-1], U.load(b, src, src_off))
        elif self.kind == "interleave":
            with U.for_range(b, dims[self.q], name="il") as j:
                at = b.add(dst_off, b.mul(j, U.i64(self.out_strides[self.q])))
                for i in range(dims[-1]):
                    v = U.load(b, src, b.add(src_off, b.add(j, U.i64(i * strides[-1]))))
                    U.store(b, v, dst, b.add(at, U.i64(i)))
        elif self.kind == "transpose":
            emit_transpose_2d(b, src, src_off, strides[-1], dst, dst_off,
                              self.out_strides[self.q], rows=dims[-1], cols=dims[self.q])
        else:
            U.store(b, U.load(b, src, src_off), dst, dst_off)


def _offset(b: ir.IRBuilder, idx: Sequence[ir.Value], strides: Sequence[int],
            base: int) -> ir.Value:
    """``base + sum(idx[k] * strides[k])`` as i64. Strides may be negative, so the
    arithmetic is only ``nsw`` (irutil's linear_index also promises ``nuw``)."""
    acc: ir.Value = U.i64(base)
    for i, s in zip(idx, strides):
        if s:
            acc = b.add(acc, i if s == 1 else b.mul(i, U.i64(s), flags=["nsw"]),
                        flags=["nsw"])
    return acc


@contextmanager
def _loop_nest(b: ir.IRBuilder, extents: Sequence[int],
               first: tuple[ir.Value, ir.Value] | None) -> Iterator[list[ir.Value]]:
    """Loops over ``extents`` (outermost first), the outermost over ``first`` (begin,
    end) if given; yields the indices."""
    if not extents:
        yield []
        return
    begin, end = first if first is not None else (U.i64(0), U.i64(extents[0]))
    with U.for_range(b, end, begin, name="vo") as i, \
            U.nested_range(b, extents[1:], name="v") as rest:
        yield [i, *rest]
