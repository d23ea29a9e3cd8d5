"""Local response normalisation across channels (ONNX LRN), float32, (N, C, D1, ...).

``y[c] = x[c] * (bias + alpha / size * sum(x[c']**2)) ** -beta`` with c' over the
window ``[c - floor((size-1)/2), c + ceil((size-1)/2)]`` clipped to the channels.

The order of operations is onnxruntime's CPU kernel (``nn/lrn.cc``), so that the sums are
bit-identical to it: the scale of channel 0 is ``bias`` plus ``alpha/size * x**2`` of each
channel of its window in order (each product rounded, no fused multiply-add); the scale
of channel c is that of channel c - 1 plus the square entering the window, then minus the
one leaving it (a running sum). ``** -beta`` is :func:`.fmath.pow_f32` (correctly rounded
but for rare ties), onnxruntime's Eigen ``pow`` is within an ulp of that: results agree
to a few ulp.

The spatial positions are taken ``_TILE`` at a time, the running scale of the tile in a
stack buffer; each output plane of a tile is one vectorised pass that updates the scale
and writes the output (the planes read are in cache).
"""
from __future__ import annotations

from math import prod

import llvmlite.ir as ir
import numpy as np

from tessera.errors import CpuKernelError

from . import irutil as U
from .fmath import pow_f32
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module

_TILE = 1024     # spatial positions per tile: the scale buffer and ~3 planes stay in L1/L2


def lrn_window(size: int) -> tuple[int, int]:
    """(channels before, channels after) c in the window of ``size`` channels."""
    before = (size - 1) // 2
    return before, size - 1 - before


def build_lrn(x: TensorSpec, size: int, alpha: float = 1e-4, beta: float = 0.75,
              bias: float = 1.0) -> CpuKernel:
    """ONNX LRN of ``x`` (float32, rank >= 3, channels on axis 1) over ``size`` channels;
    ``alpha``, ``beta`` and ``bias`` are rounded to float32, as ONNX attributes are."""
    if x.dtype != "float32":
        raise CpuKernelError(f"lrn needs float32 input, not {x.dtype}")
    if x.ndim < 3:
        raise CpuKernelError(f"lrn needs an (N, C, D1, ...) input, not rank {x.ndim}")
    if int(size) != size or size < 1:
        raise CpuKernelError(f"lrn size must be a positive integer, not {size!r}")
    name = f"lrn(size={size}, alpha={alpha:g}, beta={beta:g}, bias={bias:g})"
    module = new_module("lrn")
    fn, b = kernel_function(module, "entry", [x], [x])
    if x.size:
        _LrnBuilder(b, *fn.args, x, int(size), alpha, bias).emit(beta)
    b.ret_void()
    return CpuKernel(name, str(module), "entry", (x,), (x,))


class _LrnBuilder:
    """Emits the kernel's loops: images, spatial tiles, then channels."""

    def __init__(self, b: ir.IRBuilder, xp: ir.Value, yp: ir.Value, x: TensorSpec,
                 size: int, alpha: float, bias: float) -> None:
        self.b, self.xp, self.yp = b, xp, yp
        self.batch, self.channels = x.shape[0], x.shape[1]
        self.plane = prod(x.shape[2:])
        self.before, self.after = lrn_window(size)
        # onnxruntime's alpha_ / size_: float32 divided by an int, in float32.
        self.scale = float(np.float32(alpha) / np.float32(size))
        self.bias = float(np.float32(bias))
        self.tile = min(self.plane, _TILE)
        self.buf = U.alloca_array(b, U.F32, self.tile, name="scale")

    def emit(self, beta: float) -> None:
        b = self.b
        exponent = U.f32(float(-np.float32(beta)))
        with U.for_range(b, self.batch, name="n") as n:
            image = b.mul(n, U.i64(self.channels * self.plane))
            with U.for_range(b, self.plane, step=self.tile, name="t") as t0:
                count = b.sub(U.i64(self.plane), t0)
                count = b.select(b.icmp_signed("<", count, U.i64(self.tile)), count,
                                 U.i64(self.tile))
                self._tile(b.add(image, t0), count, exponent)

    def _tile(self, base: ir.Value, count: ir.Value, exponent: ir.Value) -> None:
        """The channels of the ``count`` positions from element ``base`` (channel 0)."""
        b = self.b
        with U.for_range(b, count, name="init") as i:
            U.store(b, U.f32(self.bias), self.buf, i)
        for k in range(min(self.after, self.channels - 1) + 1):
            self._plane_pass(base, count, exponent, head=k, tail=None, out=None)
        self._plane_pass(base, count, exponent, head=None, tail=None, out=0)
        for lo, hi, head, tail in self._segments():
            with U.for_range(b, hi, start=lo, name="c") as c:
                self._plane_pass(base, count, exponent,
                                 head=b.add(c, U.i64(self.after)) if head else None,
                                 tail=b.sub(c, U.i64(self.before + 1)) if tail else None,
                                 out=c)

    def _segments(self) -> list[tuple[int, int, bool, bool]]:
        """Channels 1..C-1 as runs ``(lo, hi, head, tail)``: in [lo, hi) a channel enters
        the window iff ``head``, one leaves it iff ``tail`` (fixed per run, so the inner
        loop has no branches)."""
        cuts = {1, self.channels, self.channels - self.after, self.before + 1}
        cuts = sorted(c for c in cuts if 1 <= c <= self.channels)
        return [(lo, hi, lo + self.after < self.channels, lo - self.before - 1 >= 0)
                for lo, hi in zip(cuts, cuts[1:])]

    def _plane_pass(self, base: ir.Value, count: ir.Value, exponent: ir.Value, head, tail,
                    out) -> None:
        """One pass over the tile: scale += alpha/size * x[head]**2, then scale +=
        -alpha/size * x[tail]**2 (each where given), then y[out] = x[out] * scale**-beta."""
        b, plane = self.b, U.i64(self.plane)

        def at(channel):
            return b.add(base, b.mul(U.as_value(channel), plane))
        with U.for_range(b, count, name="p") as i:
            s = U.load(b, self.buf, i)
            for channel, factor in ((head, self.scale), (tail, -self.scale)):
                if channel is not None:
                    v = U.load(b, self.xp, b.add(at(channel), i))
                    s = b.fadd(s, b.fmul(U.f32(factor), b.fmul(v, v)))
            if head is not None or tail is not None:
                U.store(b, s, self.buf, i)
            if out is not None:
                j = b.add(at(out), i)
                U.store(b, b.fmul(pow_f32(b, s, exponent), U.load(b, self.xp, j)), self.yp, j)
