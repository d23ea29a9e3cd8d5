"""Reductions over any set of axes: ONNX ReduceSum / ReduceMean / ReduceMax / ReduceMin /
ReduceProd / ReduceL1 / ReduceL2 / ReduceSumSquare.

Dtypes: ``sum`` of int8 / uint8 / int32 gives int32 (wrapping on overflow, like
``np.sum(x, dtype=np.int32)``), of float32 and int64 their own type; ``mean``, ``l1``,
``l2`` and ``sum_square`` are float32 only; ``prod`` takes float32, int32 and int64
(wrapping); ``max`` /
``min`` keep the input dtype and propagate NaN like ``np.max``. ``l2`` is the square root
of the sum of squares, as onnxruntime computes it (no scaling against overflow).

Float sums are reassociated (several vector partial sums, ``irutil.REASSOC``), so they
differ from numpy's pairwise sum in the last bits (products likewise): compare with a
relative tolerance.
Long rows are summed in blocks of ``_BLOCK`` elements whose sums are then added, which
keeps the rounding error near numpy's. max/min of an empty set raises CpuKernelError
(numpy has no identity for them either); the mean of an empty set is NaN, the product 1,
the norms 0.

Code shape: the input's dimensions are collapsed into alternating kept / reduced groups.
If the innermost group is reduced, each output element is one vectorised reduction
loop over a contiguous row; if it is kept, the loop body is ``out[j] = op(out[j],
x[..., j])`` over contiguous ``j``, which vectorises as an elementwise loop.
"""
from __future__ import annotations

from math import prod
from typing import Sequence

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module

REDUCE_OPS = ("sum", "mean", "max", "min", "prod", "l1", "l2", "sum_square")
#: Ops that add (their partial sums blocked on long rows); the rest fold with max, min, *.
_ADDING = ("sum", "mean", "l1", "l2", "sum_square")
_FLOAT_ONLY = ("mean", "l1", "l2", "sum_square")
#: Input dtypes of ArgMax / ArgMin.
ARG_DTYPES = ("float32", "int8", "uint8", "int32", "int64")
_BLOCK = 2048   # float sums: elements per partial sum on long rows


def normalize_axes(axes: Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """Sorted, non-negative, unique axes; ``None`` or empty means all (ONNX default)."""
    if not axes:
        return tuple(range(ndim))
    out = set()
    for a in axes:
        if not -ndim <= a < ndim:
            raise CpuKernelError(f"axis {a} out of range for rank {ndim}")
        out.add(a % ndim)
    return tuple(sorted(out))


def reduced_shape(shape: Sequence[int], axes: Sequence[int], keepdims: bool) -> tuple[int, ...]:
    """Output shape of reducing ``shape`` over normalised ``axes``."""
    if keepdims:
        return tuple(1 if k in axes else d for k, d in enumerate(shape))
    return tuple(d for k, d in enumerate(shape) if k not in axes)


def _out_dtype(op: str, dtype: str) -> str:
    if op == "sum":
        return dtype if dtype in ("float32", "int64") else "int32"
    if op in _FLOAT_ONLY and dtype != "float32":
        raise CpuKernelError(f"{op} needs float32 input, not {dtype}")
    if op == "prod" and dtype not in ("float32", "int32", "int64"):
        raise CpuKernelError(f"prod needs float32, int32 or int64 input, not {dtype}")
    return dtype


def _identity(op: str, dtype: str) -> ir.Constant:
    if op in _ADDING:
        return U.const(dtype, 0)
    if op == "prod":
        return U.const(dtype, 1)
    if dtype == "float32":
        return U.f32(float("-inf") if op == "max" else float("inf"))
    lo, hi = U.int_range(dtype)
    return U.const(dtype, lo if op == "max" else hi)


def _groups(shape: Sequence[int], axes: Sequence[int]) -> list[tuple[int, bool]]:
    """(size, reduced) per group of adjacent same-kind dimensions; size-1 dims dropped."""
    groups: list[tuple[int, bool]] = []
    for k, d in enumerate(shape):
        if d == 1:
            continue
        red = k in axes
        if groups and groups[-1][1] == red:
            groups[-1] = (groups[-1][0] * d, red)
        else:
            groups.append((d, red))
    return groups or [(1, False)]


class _Reducer:
    def __init__(self, b: ir.IRBuilder, op: str, in_dtype: str, acc_dtype: str,
                 x: ir.Value, out: ir.Value) -> None:
        self.b, self.op, self.in_dtype, self.acc_dtype = b, op, in_dtype, acc_dtype
        self.x, self.out = x, out

    def combine(self, a: ir.Value, v: ir.Value) -> ir.Value:
        b, t = self.b, self.acc_dtype
        if self.op in _ADDING:
            return U.add(b, a, v, t, flags=U.REASSOC)
        if self.op == "prod":
            return U.mul(b, a, v, t, flags=U.REASSOC)
        if self.op == "max":
            return U.reduce_maximum(b, a, v, t)
        return U.reduce_minimum(b, a, v, t)

    def element(self, index: ir.Value) -> ir.Value:
        v = U.load(self.b, self.x, index)
        if self.acc_dtype != self.in_dtype:     # int8 / uint8 summed in int32
            v = U.widen(self.b, v, self.in_dtype, U.I32)
        if self.op in ("l2", "sum_square"):
            v = self.b.fmul(v, v)
        elif self.op == "l1":
            v = U.absolute(self.b, v, self.acc_dtype)
        return v

    def row(self, base: ir.Value, n: int) -> ir.Value:
        """op over x[base : base + n] (contiguous)."""
        def chunk(start, stop, init):
            return U.reduce_range(self.b, stop, init, lambda b, i, a: self.combine(
                a, self.element(b.add(base, i))), start=start)

        ident = _identity(self.op, self.acc_dtype)
        if self.acc_dtype != "float32" or self.op not in _ADDING or n <= 2 * _BLOCK:
            return chunk(0, n, ident)
        nblocks = n // _BLOCK

        def block(b, k, total):
            start = b.mul(k, U.i64(_BLOCK))
            part = U.reduce_range(b, _BLOCK, ident, lambda b, i, a: self.combine(
                a, self.element(b.add(base, b.add(start, i)))))
            return b.fadd(total, part)
        total = U.reduce_range(self.b, nblocks, ident, block, name="blk")
        if n % _BLOCK:
            total = self.b.fadd(total, chunk(nblocks * _BLOCK, n, ident))
        return total

    def nest(self, groups: list[tuple[int, bool]], in_off: ir.Value, out_off: ir.Value) -> None:
        (size, reduced), rest = groups[0], groups[1:]
        b = self.b
        if not rest and reduced:
            acc = self.row(in_off, size)
            U.store(b, self.combine(U.load(b, self.out, out_off), acc), self.out, out_off)
            return
        if not rest:
            with U.for_range(b, size, name="j") as j:
                o = b.add(out_off, j)
                # New element first: with the loaded value first LLVM turns "keep out[j]
                # if NaN" into a masked store, which is microcoded (slow) on AMD.
                v = self.combine(self.element(b.add(in_off, j)), U.load(b, self.out, o))
                U.store(b, v, self.out, o)
            return
        in_stride = prod(s for s, _ in rest)
        out_stride = prod(s for s, r in rest if not r)
        with U.for_range(b, size, name="g") as i:
            inner_in = b.add(in_off, b.mul(i, U.i64(in_stride)))
            inner_out = out_off if reduced else b.add(out_off, b.mul(i, U.i64(out_stride)))
            self.nest(rest, inner_in, inner_out)


def reduction(op: str, x: TensorSpec, axes: Sequence[int] | None = None,
              keepdims: bool = True) -> CpuKernel:
    """A kernel reducing ``x`` with ``op`` (one of ``REDUCE_OPS``) over ``axes``
    (``None``/empty: all axes), keeping reduced axes as size 1 if ``keepdims``
    (ONNX ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare, ``noop_with_empty_axes=0``)."""
    if op not in REDUCE_OPS:
        raise CpuKernelError(f"reduction op {op!r} is not one of {REDUCE_OPS}")
    ax = normalize_axes(axes, x.ndim)
    acc_dtype = _out_dtype(op, x.dtype)
    out = TensorSpec(reduced_shape(x.shape, ax, keepdims), acc_dtype)
    count = prod(x.shape[a] for a in ax)
    if count == 0 and op in ("max", "min") and out.size:
        raise CpuKernelError(f"{op} over an empty set has no identity: {x} axes {ax}")
    name = f"reduce_{op}(axes={list(ax)}, keepdims={int(keepdims)})"

    module = new_module("reduce")
    fn, b = kernel_function(module, "entry", [x], [out])
    xp, op_ = fn.args
    U.fill(b, op_, out.size, _identity(op, acc_dtype))
    if x.size:
        _Reducer(b, op, x.dtype, acc_dtype, xp, op_).nest(_groups(x.shape, ax), U.i64(0), U.i64(0))
    if op in ("mean", "l2"):
        with U.for_range(b, out.size, name="m") as i:
            v = U.load(b, op_, i)
            v = b.fdiv(v, U.f32(count)) if op == "mean" else U.sqrt_f32(b, v)
            U.store(b, v, op_, i)
    b.ret_void()
    return CpuKernel(name, str(module), "entry", (x,), (out,))


def reduce_sum(x: TensorSpec, axes: Sequence[int] | None = None,
               keepdims: bool = True) -> CpuKernel:
    """ONNX ReduceSum (int8/uint8/int32 -> int32, float32 -> float32)."""
    return reduction("sum", x, axes, keepdims)


def reduce_mean(x: TensorSpec, axes: Sequence[int] | None = None,
                keepdims: bool = True) -> CpuKernel:
    """ONNX ReduceMean (float32)."""
    return reduction("mean", x, axes, keepdims)


def reduce_max(x: TensorSpec, axes: Sequence[int] | None = None,
               keepdims: bool = True) -> CpuKernel:
    """ONNX ReduceMax (dtype kept; NaN propagates)."""
    return reduction("max", x, axes, keepdims)


def reduce_min(x: TensorSpec, axes: Sequence[int] | None = None,
               keepdims: bool = True) -> CpuKernel:
    """ONNX ReduceMin (dtype kept; NaN propagates)."""
    return reduction("min", x, axes, keepdims)


def arg_extreme(op: str, x: TensorSpec, axis: int = 0, keepdims: bool = True,
                select_last_index: bool = False) -> CpuKernel:
    """ONNX ArgMax (``op`` "max") / ArgMin ("min"): the int64 index of the largest /
    smallest element along ``axis``, the first one of equals (the last with
    ``select_last_index``). Takes the dtypes of :data:`ARG_DTYPES`."""
    if op not in ("max", "min"):
        raise CpuKernelError(f"arg_extreme op {op!r} is not 'max' or 'min'")
    if x.dtype not in ARG_DTYPES:
        raise CpuKernelError(f"Arg{op.capitalize()} takes {', '.join(ARG_DTYPES)}, "
                             f"not {x.dtype}")
    (ax,) = normalize_axes([axis], x.ndim)
    n = x.shape[ax]
    if n == 0:
        raise CpuKernelError(f"Arg{op.capitalize()} over an empty axis {ax} of {x}")
    out = TensorSpec(reduced_shape(x.shape, (ax,), keepdims), "int64")
    outer, inner = prod(x.shape[:ax]), prod(x.shape[ax + 1:])
    module = new_module("arg")
    fn, b = kernel_function(module, "entry", [x], [out])
    xp, dst = fn.args
    pred = (">" if op == "max" else "<") + ("=" if select_last_index else "")
    with U.for_range(b, outer, name="o") as o, U.for_range(b, inner, name="j") as j:
        base = b.add(b.mul(o, U.i64(n * inner)), j)

        def step(b, k, acc):
            best, idx = acc
            v = U.load(b, xp, b.add(base, b.mul(k, U.i64(inner))))
            better = b.trunc(U.compare(b, pred, v, best, x.dtype), U.I1)
            return b.select(better, v, best), b.select(better, k, idx)
        _, idx = U.reduce_range(b, n, (U.load(b, xp, base), U.i64(0)), step, start=1)
        U.store(b, idx, dst, b.add(b.mul(o, U.i64(inner)), j))
    b.ret_void()
    name = f"arg{op}(axis={ax}, keepdims={int(keepdims)}, last={int(select_last_index)})"
    return CpuKernel(name, str(module), "entry", (x,), (out,))
