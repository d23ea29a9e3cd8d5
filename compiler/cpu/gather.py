"""ONNX Gather and GatherElements as CPU kernels.

Gather copies whole slices: with ``outer`` the product of the axes before ``axis`` and
``inner`` of those after it, output row ``(o, j)`` is the ``inner`` contiguous elements
of input row ``(o, indices[j])``. Constant indices (the common case: a class token, a
channel subset, a fixed permutation) can be compiled into the kernel: consecutive
indices merge into one run (:func:`index_runs`), each run one ``llvm.memcpy`` of
constant offsets and length, unrolled. Indices given at run time (or constant ones with
too many runs to unroll, passed as an array) are read from an int32 input, one copy of
``inner`` elements each.

GatherElements picks single elements: output element ``i`` is input element ``i`` with
its ``axis`` coordinate replaced by ``indices[i]``; the indices are always an int32
input (constant ones are normalised and passed as an array).

Negative indices count from the end of the axis, as in ONNX. Run-time indices outside
``[-n, n)``, an error in onnxruntime, are clamped into the axis so a kernel never reads
outside its input; constant ones are refused at build time.
"""
from __future__ import annotations

from math import prod
from typing import Sequence

import llvmlite.ir as ir
import numpy as np

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module, range_function
from .layout_ops import emit_copy

__all__ = ["INDEX_DTYPES", "build_gather", "build_gather_elements", "check_gather_elements",
           "index_runs", "normalized_indices"]

#: Element types of run-time index inputs.
INDEX_DTYPES = ("int32",)


def normalized_indices(indices: np.ndarray, n: int, op: str) -> np.ndarray:
    """Constant ``indices`` into an axis of ``n``, negative ones counted from the end,
    as int64; raises CpuKernelError for an index outside ``[-n, n)``."""
    idx = np.asarray(indices).astype(np.int64)
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        raise CpuKernelError(f"{op}: index {int(idx[bad].flat[0])} is out of range for an "
                             f"axis of size {n}")
    return np.where(idx < 0, idx + n, idx)


def _check_index_input(op: str, indices: TensorSpec, n: int) -> None:
    """Run-time indices must be of :data:`INDEX_DTYPES`, and into a non-empty axis
    (where clamping has nothing to clamp to)."""
    if indices.dtype not in INDEX_DTYPES:
        raise CpuKernelError(f"{op}: indices are {indices.dtype}; the kernel takes "
                             f"{' or '.join(INDEX_DTYPES)}")
    if indices.size and not n:
        raise CpuKernelError(f"{op}: indices {indices} index an axis of size 0")


def _axis(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < rank:
        raise CpuKernelError(f"{op}: axis {axis} is out of range for rank {rank}")
    return axis % rank


# ---------------------------------------------------------------------------------
# Gather

def build_gather(data: TensorSpec, indices: np.ndarray | TensorSpec, axis: int = 0,
                 name: str = "gather") -> CpuKernel:
    """ONNX Gather of ``data`` along ``axis``. ``indices`` is a constant array (compiled
    into the kernel, whose only input is then ``data``) or the spec of a run-time int32
    input (inputs ``data, indices``)."""
    axis = _axis(axis, data.ndim, "Gather")
    n = data.shape[axis]
    outer, inner = prod(data.shape[:axis]), prod(data.shape[axis + 1:])
    if isinstance(indices, TensorSpec):
        _check_index_input("Gather", indices, n)
        inputs, index_shape, runs = (data, indices), indices.shape, None
    else:
        idx = normalized_indices(indices, n, "Gather")
        inputs, index_shape, runs = (data,), idx.shape, index_runs(idx)
    out = TensorSpec(data.shape[:axis] + index_shape + data.shape[axis + 1:], data.dtype)
    module = new_module(name)
    rows = _GatherRows(n, prod(index_shape), inner, runs)
    fn, b = kernel_function(module, "entry", inputs, (out,))
    if out.size:
        rows.emit(b, fn.args, U.i64(0), U.i64(outer))
    b.ret_void()
    parallel = outer if out.size and outer > 1 else 0
    if parallel:
        fn, b, begin, end = range_function(module, "entry", inputs, (out,))
        rows.emit(b, fn.args[:-2], begin, end)
        b.ret_void()
    return CpuKernel(name, str(module), "entry", inputs, (out,), parallel=parallel)


def index_runs(indices: np.ndarray) -> list[tuple[int, int, int]]:
    """``(first output row, first input row, rows)`` of each run of consecutive
    (normalised) ``indices``, in C order: one copy each in a Gather kernel."""
    runs: list[tuple[int, int, int]] = []
    for j, i in enumerate(np.asarray(indices).reshape(-1).tolist()):
        if runs and runs[-1][1] + runs[-1][2] == i:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((j, i, 1))
    return runs


class _GatherRows:
    """Emits the copies of outer rows ``[begin, end)``: per outer row, ``count`` rows of
    ``inner`` elements out of ``n``, from constant ``runs`` or run-time indices."""

    def __init__(self, n: int, count: int, inner: int,
                 runs: list[tuple[int, int, int]] | None) -> None:
        self.n, self.count, self.inner, self.runs = n, count, inner, runs

    def emit(self, b: ir.IRBuilder, args: Sequence[ir.Value], begin: ir.Value,
             end: ir.Value) -> None:
        src, dst = args[0], args[-1]
        with U.for_range(b, end, begin, name="outer") as o:
            src_row = b.mul(o, U.i64(self.n * self.inner))
            dst_row = b.mul(o, U.i64(self.count * self.inner))
            if self.runs is None:
                self._emit_dynamic(b, src, src_row, args[1], dst, dst_row)
            else:
                for j, i, rows in self.runs:
                    emit_copy(b, dst, b.add(dst_row, U.i64(j * self.inner)), src,
                              b.add(src_row, U.i64(i * self.inner)), rows * self.inner)

    def _emit_dynamic(self, b: ir.IRBuilder, src: ir.Value, src_row: ir.Value,
                      indices: ir.Value, dst: ir.Value, dst_row: ir.Value) -> None:
        with U.for_range(b, self.count, name="j") as j:
            i = _clamped_index(b, U.load(b, indices, j), self.n)
            emit_copy(b, dst, b.add(dst_row, b.mul(j, U.i64(self.inner))), src,
                      b.add(src_row, b.mul(i, U.i64(self.inner))), self.inner)


def _clamped_index(b: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    """A run-time index ``v`` (int32) into an axis of ``n`` as an i64 in ``[0, n)``:
    negative ones count from the end, and what is still outside is clamped."""
    i = U.widen(b, v, "int32", U.I64)
    i = b.select(b.icmp_signed("<", i, U.i64(0)), b.add(i, U.i64(n)), i)
    i = U.call_intrinsic(b, "llvm.smax", [i, U.i64(0)])
    return U.call_intrinsic(b, "llvm.smin", [i, U.i64(n - 1)])


# ---------------------------------------------------------------------------------
# GatherElements

def check_gather_elements(data: TensorSpec, indices: TensorSpec, axis: int) -> int:
    """Raise CpuKernelError unless :func:`build_gather_elements` takes these arguments;
    returns the axis counted from the start."""
    axis = _axis(axis, data.ndim, "GatherElements")
    _check_index_input("GatherElements", indices, data.shape[axis])
    if indices.ndim != data.ndim or any(
            m > d for k, (m, d) in enumerate(zip(indices.shape, data.shape)) if k != axis):
        raise CpuKernelError(f"GatherElements: indices {indices} must have the rank of "
                             f"data {data} and be no larger off axis {axis}")
    return axis


def build_gather_elements(data: TensorSpec, indices: TensorSpec, axis: int = 0,
                          name: str = "gather_elements") -> CpuKernel:
    """ONNX GatherElements of ``data`` along ``axis`` by int32 ``indices`` (same rank,
    no larger than ``data`` off the axis). Inputs ``data, indices``; the output has the
    indices' shape."""
    axis = check_gather_elements(data, indices, axis)
    out = TensorSpec(indices.shape, data.dtype)
    module = new_module(name)
    fn, b = kernel_function(module, "entry", (data, indices), (out,))
    src, idx, dst = fn.args
    data_strides = U.c_strides(data.shape)
    n = data.shape[axis]
    if out.size:
        with U.nested_range(b, indices.shape, name="e") as pos:
            at = U.linear_index(b, pos, U.c_strides(indices.shape))
            i = _clamped_index(b, U.load(b, idx, at), n)
            off = U.linear_index(b, [p for k, p in enumerate(pos) if k != axis],
                                 [s for k, s in enumerate(data_strides) if k != axis],
                                 b.mul(i, U.i64(data_strides[axis])))
            U.store(b, U.load(b, src, off), dst, at)
    b.ret_void()
    return CpuKernel(name, str(module), "entry", (data, indices), (out,))
