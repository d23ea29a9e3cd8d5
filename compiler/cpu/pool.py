"""Pooling CPU kernels with ONNX semantics (NCHW): MaxPool, AveragePool,
GlobalMaxPool, GlobalAveragePool.

What is implemented:

* MaxPool: int8, uint8, int32, float32; kernel, strides, pads, dilations. Padding never
  wins (it is not a value). NaN propagates like ``np.max``.
* AveragePool: float32, int8, uint8; kernel, strides, pads, dilations,
  ``count_include_pad`` 0 or 1. float32 divides the float32 sum by the count. int8 and
  uint8 sum in int32 and return the exact mean rounded half to even
  (``np.rint(sum / count)``); this is not onnxruntime's QLinearAveragePool, which works
  on dequantised floats.
* GlobalMaxPool and GlobalAveragePool: the same dtypes and rules over all of H x W
  (the int8 mean again in int32 with round-half-to-even division).
* ``ceil_mode=1`` and ``auto_pad`` are not supported (CpuKernelError): pass explicit pads.
  Pads that put a whole window in the padding (possible with pads >= kernel size or
  dilation) are rejected too: such an output has no defined maximum or mean.

Border handling is static: output rows (and columns) are grouped into runs whose window
taps are all inside the input for the same tap range, so each run is a plain loop over
its valid taps, with no per-pixel bounds checks; the interior run's inner loop over
output columns is the one LLVM vectorises. :class:`Window` and :func:`emit_window_plane`
are shared with the direct (depthwise) int8 convolution in ``conv.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module

#: Limit on unrolled tap loads per plane (window taps summed over the border runs);
#: beyond it the generated code would be huge.
_TAP_BUDGET = 20000
_AVG_DTYPES = ("float32", "int8", "uint8")


# ---------------------------------------------------------------------------------
# Window geometry

@dataclass(frozen=True)
class Run:
    """Output indices ``[lo, hi)`` of one axis whose valid window taps are exactly
    ``[k_lo, k_hi)``."""

    lo: int
    hi: int
    k_lo: int
    k_hi: int


@dataclass(frozen=True)
class Window:
    """A 2-D sliding window over an ``h x w`` plane: kernel, strides, dilations and
    pads ``(top, left, bottom, right)``, as in ONNX pooling and Conv."""

    h: int
    w: int
    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    dilations: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def out_h(self) -> int:
        return self._out(0)

    @property
    def out_w(self) -> int:
        return self._out(1)

    def _out(self, axis: int) -> int:
        size = (self.h, self.w)[axis] + self.pads[axis] + self.pads[axis + 2]
        span = (self.kernel[axis] - 1) * self.dilations[axis] + 1
        return (size - span) // self.strides[axis] + 1

    def check(self, op: str) -> None:
        """CpuKernelError (naming ``op``) for non-positive sizes, negative pads or a
        window larger than the padded input."""
        for name, vals, lo in (("kernel_shape", self.kernel, 1), ("strides", self.strides, 1),
                               ("dilations", self.dilations, 1), ("pads", self.pads, 0)):
            if len(vals) != (4 if name == "pads" else 2) or any(v < lo for v in vals):
                raise CpuKernelError(f"{op}: {name} {list(vals)} must be "
                                     f"{'non-negative' if lo == 0 else 'positive'} "
                                     f"({4 if name == 'pads' else 2} values)")
        for axis, dim in enumerate(("height", "width")):
            size = (self.h, self.w)[axis] + self.pads[axis] + self.pads[axis + 2]
            span = (self.kernel[axis] - 1) * self.dilations[axis] + 1
            if span > size:
                raise CpuKernelError(
                    f"{op}: kernel_shape {list(self.kernel)} (dilated {span}) is larger "
                    f"than the padded input {dim} {size}")

    def runs(self, axis: int) -> list[Run]:
        """Maximal runs of output indices along ``axis`` (0 rows, 1 columns) with the
        same valid tap range."""
        n_in = (self.h, self.w)[axis]
        k, s, d, p = self.kernel[axis], self.strides[axis], self.dilations[axis], self.pads[axis]
        runs: list[Run] = []
        for o in range((self.out_h, self.out_w)[axis]):
            taps = [t for t in range(k) if 0 <= o * s - p + t * d < n_in]
            lo, hi = (taps[0], taps[-1] + 1) if taps else (0, 0)
            if runs and (runs[-1].k_lo, runs[-1].k_hi) == (lo, hi):
                runs[-1] = Run(runs[-1].lo, o + 1, lo, hi)
            else:
                runs.append(Run(o, o + 1, lo, hi))
        return runs

    def tap_count(self) -> int:
        """Unrolled taps the plane emitter generates (see ``_TAP_BUDGET``)."""
        return sum((r.k_hi - r.k_lo) * (c.k_hi - c.k_lo)
                   for r in self.runs(0) for c in self.runs(1))


class WindowFold(Protocol):
    """What a window op does per output pixel: ``init``, then ``tap`` for every valid
    tap (``index`` is the tap's input element index relative to the plane), then
    ``finish`` with the number of valid taps, whose result is stored. The accumulator
    is whatever the fold chooses (an IR value, a tuple of them, None before the first
    tap)."""

    def init(self, b: ir.IRBuilder) -> object: ...

    def tap(self, b: ir.IRBuilder, acc: object, index: ir.Value, ky: int,
            kx: int) -> object: ...

    def finish(self, b: ir.IRBuilder, acc: object, count: int) -> ir.Value: ...


def emit_window_plane(b: ir.IRBuilder, win: Window, fold: WindowFold, dst: ir.Value,
                      dst_off: ir.Value) -> None:
    """Emit one output plane (``out_h x out_w`` at ``dst[dst_off:]``) of a window op:
    for every pair of row and column runs, a loop nest over the run's pixels with the
    run's valid taps unrolled."""
    (sh, sw), (dh, dw) = win.strides, win.dilations
    pt, pl = win.pads[0], win.pads[1]
    for r in win.runs(0):
        with _span(b, r, "oy") as oy:
            # Input index of tap (0, 0) for output column 0 (negative in the padding;
            # only valid taps are ever added to it). No nuw: it may be negative.
            row = b.add(b.mul(oy, U.i64(sh * win.w)), U.i64(-pt * win.w - pl))
            out_row = b.add(dst_off, b.mul(oy, U.i64(win.out_w)))
            for c in win.runs(1):
                count = (r.k_hi - r.k_lo) * (c.k_hi - c.k_lo)
                with _span(b, c, "ox") as ox:
                    base = b.add(row, b.mul(ox, U.i64(sw)))
                    acc = fold.init(b)
                    for ky in range(r.k_lo, r.k_hi):
                        for kx in range(c.k_lo, c.k_hi):
                            tap = b.add(base, U.i64(ky * dh * win.w + kx * dw))
                            acc = fold.tap(b, acc, tap, ky, kx)
                    U.store(b, fold.finish(b, acc, count), dst, b.add(out_row, ox))


class _span:
    """A loop over a run's output indices, or just the constant for a single index."""

    def __init__(self, b: ir.IRBuilder, run: Run, name: str) -> None:
        self.b, self.run, self.name = b, run, name
        self._loop = None

    def __enter__(self) -> ir.Value:
        if self.run.hi - self.run.lo == 1:
            return U.i64(self.run.lo)
        self._loop = U.for_range(self.b, self.run.hi, self.run.lo, name=self.name)
        return self._loop.__enter__()

    def __exit__(self, *exc) -> None:
        if self._loop is not None:
            self._loop.__exit__(*exc)


# ---------------------------------------------------------------------------------
# Folds

class _MaxFold:
    """Running maximum. For float32 the NaN test is kept apart from the comparison
    (an or-ed ``x != x`` flag, NaN substituted at the end): each tap is then a plain
    ``vmaxps`` plus a compare, about 4x faster than a NaN-propagating select per tap."""

    def __init__(self, src: ir.Value, plane: ir.Value, dtype: str) -> None:
        self.src, self.plane, self.dtype = src, plane, dtype

    def init(self, b):
        return None

    def tap(self, b, acc, index, ky, kx):
        x = U.load(b, self.src, b.add(self.plane, index))
        if not U.is_float(self.dtype):
            return x if acc is None else U.maximum(b, acc, x, self.dtype)
        nan = b.fcmp_unordered("uno", x, x)
        if acc is None:
            return x, nan
        m, any_nan = acc
        # nnan: a NaN here may give any value, which the flag then overrides.
        bigger = b.fcmp_ordered(">", m, x, flags=("nnan",))
        return b.select(bigger, m, x), b.or_(any_nan, nan)

    def finish(self, b, acc, count):
        if not U.is_float(self.dtype):
            return acc
        m, any_nan = acc
        return b.select(any_nan, U.f32(float("nan")), m)


class _AvgFold:
    """Sum in float32 (float input) or int32 (8-bit input), then divide by the count
    (the window size if ``include_pad``); 8-bit means round half to even."""

    def __init__(self, src: ir.Value, plane: ir.Value, dtype: str, window_size: int,
                 include_pad: bool) -> None:
        self.src, self.plane, self.dtype = src, plane, dtype
        self.window_size, self.include_pad = window_size, include_pad

    def init(self, b):
        return U.f32(0.0) if U.is_float(self.dtype) else ir.Constant(U.I32, 0)

    def tap(self, b, acc, index, ky, kx):
        x = U.load(b, self.src, b.add(self.plane, index))
        if U.is_float(self.dtype):
            return b.fadd(acc, x)
        return b.add(acc, U.widen(b, x, self.dtype))

    def finish(self, b, acc, count):
        n = self.window_size if self.include_pad else count
        if U.is_float(self.dtype):
            return b.fdiv(acc, U.f32(n))
        return _round_div(b, acc, n)


def _round_div(b: ir.IRBuilder, total: ir.Value, n: int) -> ir.Value:
    """``rint(total / n)`` narrowed to 8 bits (int8 or uint8), for an int32 ``total``
    of at most ``n`` 8-bit values. Done in float32, which is exact here: a quotient
    that is not a tie is at least 1/(2n) away from one, far above float32's rounding
    error for |quotient| <= 255 (n < 2**15), so rounding the rounded quotient half to
    even gives the exact answer; it vectorises (integer division does not)."""
    q = b.fdiv(U.to_float(b, total, "int32"), U.f32(n))
    return b.trunc(b.fptosi(U.round_half_even(b, q), U.I32), U.I8)


# ---------------------------------------------------------------------------------
# Builders

def _window(spec: TensorSpec, op: str, kernel_shape: Sequence[int],
            strides: Sequence[int] | None, pads: Sequence[int] | None,
            dilations: Sequence[int] | None, ceil_mode: int) -> Window:
    if spec.ndim != 4:
        raise CpuKernelError(f"{op}: input must be NCHW (rank 4), got {spec}")
    if ceil_mode:
        raise CpuKernelError(f"{op}: ceil_mode=1 is not supported (only ceil_mode=0)")
    win = Window(spec.shape[2], spec.shape[3], tuple(int(k) for k in kernel_shape),
                 tuple(int(s) for s in (strides or (1, 1))),
                 tuple(int(d) for d in (dilations or (1, 1))),
                 tuple(int(p) for p in (pads or (0, 0, 0, 0))))
    win.check(op)
    for axis, dim in enumerate(("row", "column")):
        empty = [r.lo for r in win.runs(axis) if r.k_hi == r.k_lo]
        if empty:
            raise CpuKernelError(f"{op}: pads {list(win.pads)} put the whole window of "
                                 f"output {dim} {empty[0]} in the padding")
    if win.tap_count() > _TAP_BUDGET:
        raise CpuKernelError(f"{op}: window {list(win.kernel)} with pads "
                             f"{list(win.pads)} is too large to unroll")
    return win


def _build_pool(op: str, name: str, spec: TensorSpec, win: Window, make_fold) -> CpuKernel:
    n, c = spec.shape[:2]
    out = TensorSpec((n, c, win.out_h, win.out_w), spec.dtype)
    module = new_module(name)
    fn, b = kernel_function(module, "entry", (spec,), (out,))
    src, dst = fn.args
    if out.size:
        with U.for_range(b, n * c, name="plane") as p:
            fold = make_fold(src, b.mul(p, U.i64(win.h * win.w)))
            emit_window_plane(b, win, fold, dst, b.mul(p, U.i64(win.out_h * win.out_w)))
    b.ret_void()
    return CpuKernel(name, str(module), "entry", (spec,), (out,))


def build_max_pool(spec: TensorSpec, kernel_shape: Sequence[int],
                   strides: Sequence[int] | None = None, pads: Sequence[int] | None = None,
                   dilations: Sequence[int] | None = None, ceil_mode: int = 0,
                   name: str = "maxpool") -> CpuKernel:
    """ONNX MaxPool (2-D, NCHW) of int8, uint8, int32 or float32 ``spec``. ``pads`` is
    ``[top, left, bottom, right]``; defaults are stride 1, no pads, no dilation."""
    win = _window(spec, "MaxPool", kernel_shape, strides, pads, dilations, ceil_mode)
    return _build_pool("MaxPool", name, spec, win,
                       lambda src, plane: _MaxFold(src, plane, spec.dtype))


def build_average_pool(spec: TensorSpec, kernel_shape: Sequence[int],
                       strides: Sequence[int] | None = None,
                       pads: Sequence[int] | None = None,
                       dilations: Sequence[int] | None = None, count_include_pad: int = 0,
                       ceil_mode: int = 0, name: str = "avgpool") -> CpuKernel:
    """ONNX AveragePool (2-D, NCHW) of float32, int8 or uint8 ``spec`` (8-bit: exact
    mean rounded half to even). ``count_include_pad=1`` divides by the window size
    everywhere, 0 by the number of taps inside the input."""
    if spec.dtype not in _AVG_DTYPES:
        raise CpuKernelError(f"AveragePool: dtype {spec.dtype} is not one of {_AVG_DTYPES}")
    win = _window(spec, "AveragePool", kernel_shape, strides, pads, dilations, ceil_mode)
    size = win.kernel[0] * win.kernel[1]
    return _build_pool("AveragePool", name, spec, win,
                       lambda src, plane: _AvgFold(src, plane, spec.dtype, size,
                                                   bool(count_include_pad)))


def _build_global(op: str, spec: TensorSpec, name: str, dtypes: Sequence[str],
                  emit_plane) -> CpuKernel:
    if spec.ndim != 4:
        raise CpuKernelError(f"{op}: input must be NCHW (rank 4), got {spec}")
    if spec.dtype not in dtypes:
        raise CpuKernelError(f"{op}: dtype {spec.dtype} is not one of {tuple(dtypes)}")
    n, c, h, w = spec.shape
    if h * w == 0:
        raise CpuKernelError(f"{op}: empty spatial extent {h}x{w}")
    out = TensorSpec((n, c, 1, 1), spec.dtype)
    module = new_module(name)
    fn, b = kernel_function(module, "entry", (spec,), (out,))
    src, dst = fn.args
    with U.for_range(b, n * c, name="plane") as p:
        U.store(b, emit_plane(b, src, b.mul(p, U.i64(h * w)), h * w), dst, p)
    b.ret_void()
    return CpuKernel(name, str(module), "entry", (spec,), (out,))


def build_global_max_pool(spec: TensorSpec, name: str = "globalmaxpool") -> CpuKernel:
    """ONNX GlobalMaxPool (NCHW -> NC11) of int8, uint8, int32 or float32 ``spec``."""
    return _build_global("GlobalMaxPool", spec, name, ("int8", "uint8", "int32", "float32"),
                         lambda b, src, off, n: _reduce_max(b, src, off, n, spec.dtype))


def build_global_average_pool(spec: TensorSpec,
                              name: str = "globalavgpool") -> CpuKernel:
    """ONNX GlobalAveragePool (NCHW -> NC11) of float32, int8 or uint8 ``spec``; 8-bit
    inputs sum in int32 and round the exact mean half to even."""
    def plane(b, src, off, n):
        total = _reduce_sum(b, src, off, n, spec.dtype)
        if U.is_float(spec.dtype):
            return b.fdiv(total, U.f32(n))
        return _int_round_div(b, total, n)

    return _build_global("GlobalAveragePool", spec, name, _AVG_DTYPES, plane)


# ---------------------------------------------------------------------------------
# Row reductions (global pools)

def _reduce_sum(b: ir.IRBuilder, src: ir.Value, off: ir.Value, n: int,
                dtype: str) -> ir.Value:
    """Sum of ``src[off:off+n]``: float32 with reassociation allowed (several vector
    partial sums), 8-bit widened to int32 (exact)."""
    flt = U.is_float(dtype)
    acc = _accumulate(b, U.f32(0.0) if flt else ir.Constant(U.I32, 0), n,
                      lambda acc, i: (b.fadd(acc, U.load(b, src, b.add(off, i)),
                                             flags=U.REASSOC) if flt else
                                      b.add(acc, U.widen(b, U.load(b, src, b.add(off, i)),
                                                         dtype))))
    return acc


def _reduce_max(b: ir.IRBuilder, src: ir.Value, off: ir.Value, n: int,
                dtype: str) -> ir.Value:
    """Maximum of ``src[off:off+n]`` (n >= 1); NaN propagates for float32."""
    if not U.is_float(dtype):
        return _accumulate(b, U.load(b, src, off), n,
                           lambda acc, i: U.maximum(b, acc, U.load(b, src, b.add(off, i)),
                                                    dtype))
    # The NaN-propagating float max is no reduction LLVM knows, so reduce explicitly
    # in 8-lane vectors (np.maximum semantics per lane), then across lanes and the tail.
    return _reduce_max_f32(b, src, off, n)


def _accumulate(b: ir.IRBuilder, init: ir.Value, n: int, step) -> ir.Value:
    """``acc = init; for i in range(n): acc = step(acc, i)`` as a phi loop (the form
    LLVM's reduction vectoriser recognises)."""
    pre = b.block
    head = b.append_basic_block("red.head")
    body = b.append_basic_block("red.body")
    done = b.append_basic_block("red.end")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(U.I64, name="i")
    acc = b.phi(init.type, name="acc")
    i.add_incoming(U.i64(0), pre)
    acc.add_incoming(init, pre)
    b.cbranch(b.icmp_signed("<", i, U.i64(n)), body, done)
    b.position_at_end(body)
    nxt = step(acc, i)
    i.add_incoming(b.add(i, U.i64(1), flags=["nuw", "nsw"]), b.block)
    acc.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(done)
    return acc


_LANES = 8


def _reduce_max_f32(b: ir.IRBuilder, src: ir.Value, off: ir.Value, n: int) -> ir.Value:
    vty = ir.VectorType(U.F32, _LANES)
    full = n - n % _LANES
    if full:
        def vload(i):
            p = b.bitcast(U.element_ptr(b, src, b.add(off, i)), vty.as_pointer())
            return b.load(p, align=4)
        vacc = _accumulate(b, vload(U.i64(0)), full // _LANES,
                           lambda acc, i: U.maximum(b, acc, vload(b.mul(i, U.i64(_LANES))),
                                                    "float32"))
        lanes = [b.extract_element(vacc, ir.Constant(U.I32, k)) for k in range(_LANES)]
        result, tail = lanes[0], lanes[1:]
    else:
        result, tail = U.load(b, src, off), []
    tail += [U.load(b, src, b.add(off, U.i64(i))) for i in range(max(full, 1), n)]
    for x in tail:
        result = U.maximum(b, result, x, "float32")
    return result


def _int_round_div(b: ir.IRBuilder, total: ir.Value, n: int) -> ir.Value:
    """``rint(total / n)`` exactly in integers (any n; once per plane, so speed does
    not matter): floor division, then up when the remainder is over half, or exactly
    half and the floor is odd."""
    nn = ir.Constant(U.I32, n)
    q = b.sdiv(total, nn)
    r = b.srem(total, nn)
    neg = b.icmp_signed("<", r, ir.Constant(U.I32, 0))
    q = b.select(neg, b.sub(q, ir.Constant(U.I32, 1)), q)
    r = b.select(neg, b.add(r, nn), r)
    twice = b.shl(r, ir.Constant(U.I32, 1))
    odd = b.trunc(q, U.I1)
    up = b.or_(b.icmp_signed(">", twice, nn),
               b.and_(b.icmp_signed("==", twice, nn), odd))
    q = b.add(q, b.zext(up, U.I32))
    return b.trunc(q, U.I8)
