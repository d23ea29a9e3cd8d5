"""Softmax and log-softmax over one axis (ONNX opset 13 semantics: the axis alone is
normalised, default -1), float32, numerically stable (the row maximum is subtracted
before exp).

Row sums are reassociated (vector partial sums), so results differ from numpy's in the
last bits; exp is the vectorised polynomial of ``irutil.exp_f32``. A row containing NaN
or +inf gives NaN, like numpy and onnxruntime; a row of all -inf gives NaN too.

Two code shapes, picked by the layout: when the axis is innermost (the common
``(..., N)`` logits case) each row is three vectorised passes over contiguous memory
(max; exp, store and sum; scale). When elements after the axis exist (e.g. axis=1 of
NCHW) the kernel walks the axis with the trailing elements as vector lanes, keeping
per-lane max and sum in a small stack buffer, ``_LANES`` lanes at a time.
"""
from __future__ import annotations

from math import prod

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module

_LANES = 128     # trailing elements processed together when the axis is not innermost


def _check(x: TensorSpec, axis: int) -> int:
    if x.dtype != "float32":
        raise CpuKernelError(f"softmax needs float32 input, not {x.dtype}")
    if not -x.ndim <= axis < x.ndim:
        raise CpuKernelError(f"softmax axis {axis} out of range for rank {x.ndim}")
    return axis % x.ndim


class _Softmax:
    def __init__(self, b: ir.IRBuilder, x: ir.Value, out: ir.Value, log: bool) -> None:
        self.b, self.x, self.out, self.log = b, x, out, log

    def _at(self, ptr: ir.Value, base: ir.Value, i: ir.Value) -> ir.Value:
        return U.element_ptr(self.b, ptr, self.b.add(base, i))

    def row(self, base: ir.Value, n: int) -> None:
        """Softmax of the contiguous row x[base : base + n]."""
        b = self.b
        m = U.reduce_range(b, n, U.f32(float("-inf")), lambda b, i, a: U.reduce_maximum(
            b, b.load(self._at(self.x, base, i)), a, "float32"), name="max")

        def exp_sum(b, i, s):
            e = U.exp_f32(b, b.fsub(b.load(self._at(self.x, base, i)), m))
            if not self.log:
                b.store(e, self._at(self.out, base, i))
            return b.fadd(s, e, flags=U.REASSOC)
        s = U.reduce_range(b, n, U.f32(0.0), exp_sum, name="sum")
        if self.log:
            # (x - m) - log(s): x - m is exact near the max, m + log(s) would round.
            ls = U.log_f32(b, s)
            with U.for_range(b, n, name="w") as i:
                d = b.fsub(b.load(self._at(self.x, base, i)), m)
                b.store(b.fsub(d, ls), self._at(self.out, base, i))
        else:
            r = b.fdiv(U.f32(1.0), s)
            with U.for_range(b, n, name="w") as i:
                p = self._at(self.out, base, i)
                b.store(b.fmul(b.load(p), r), p)

    def lanes(self, base: ir.Value, n: int, stride: int, width: int,
              mx: ir.Value, sm: ir.Value) -> None:
        """Softmax along k of x[base + k*stride + j] for each lane j < width (n values
        per lane); ``mx`` and ``sm`` are scratch buffers of >= width floats."""
        b = self.b

        def over_lanes(body):
            with U.for_range(b, n, name="k") as k:
                row = b.add(base, b.mul(k, U.i64(stride)))
                with U.for_range(b, width, name="j") as j:
                    body(row, j)

        U.fill(b, mx, width, U.f32(float("-inf")))
        U.fill(b, sm, width, U.f32(0.0))

        def track_max(row, j):
            p = U.element_ptr(b, mx, j)
            b.store(U.reduce_maximum(b, b.load(self._at(self.x, row, j)), b.load(p), "float32"), p)
        over_lanes(track_max)

        def exp_sum(row, j):
            e = U.exp_f32(b, b.fsub(b.load(self._at(self.x, row, j)), U.load(b, mx, j)))
            if not self.log:
                b.store(e, self._at(self.out, row, j))
            p = U.element_ptr(b, sm, j)
            b.store(b.fadd(b.load(p), e), p)
        over_lanes(exp_sum)

        with U.for_range(b, width, name="j") as j:
            s = U.load(b, sm, j)
            # log: sm[j] := log(s), subtracted from x - max; else 1 / s, multiplied.
            U.store(b, U.log_f32(b, s) if self.log else b.fdiv(U.f32(1.0), s), sm, j)

        def finish(row, j):
            if self.log:
                d = b.fsub(b.load(self._at(self.x, row, j)), U.load(b, mx, j))
                v = b.fsub(d, U.load(b, sm, j))
            else:
                v = b.fmul(b.load(self._at(self.out, row, j)), U.load(b, sm, j))
            b.store(v, self._at(self.out, row, j))
        over_lanes(finish)


def _build(x: TensorSpec, axis: int, log: bool) -> CpuKernel:
    ax = _check(x, axis)
    outer, n, inner = prod(x.shape[:ax]), x.shape[ax], prod(x.shape[ax + 1:])
    name = f"{'log_softmax' if log else 'softmax'}(axis={axis})"
    module = new_module(name)
    fn, b = kernel_function(module, "entry", [x], [x])
    sm = _Softmax(b, fn.args[0], fn.args[1], log)
    if x.size and inner == 1:
        with U.for_range(b, outer, name="row") as r:
            sm.row(b.mul(r, U.i64(n)), n)
    elif x.size:
        # One block width for all blocks: the last block overlaps the one before
        # instead of being a narrower copy of the code (lanes are independent, so the
        # overlap just recomputes identical values), which halves compile time.
        width = min(inner, _LANES)
        mx = U.alloca_array(b, U.F32, width, "max")
        acc = U.alloca_array(b, U.F32, width, "sum")
        with U.for_range(b, outer, name="o") as o:
            obase = b.mul(o, U.i64(n * inner))
            with U.for_range(b, -(-inner // width), name="c") as c:
                start = b.mul(c, U.i64(width))
                last = U.i64(inner - width)
                start = b.select(b.icmp_signed("<", start, last), start, last)
                sm.lanes(b.add(obase, start), n, inner, width, mx, acc)
    b.ret_void()
    return CpuKernel(name, str(module), "entry", (x,), (x,))


def softmax(x: TensorSpec, axis: int = -1) -> CpuKernel:
    """ONNX Softmax (opset 13): ``exp(x - max) / sum(exp(x - max))`` along ``axis``."""
    return _build(x, axis, log=False)


def log_softmax(x: TensorSpec, axis: int = -1) -> CpuKernel:
    """ONNX LogSoftmax (opset 13): ``x - max - log(sum(exp(x - max)))`` along ``axis``."""
    return _build(x, axis, log=True)
