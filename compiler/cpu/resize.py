"""ONNX Resize on NCHW tensors (H and W only; N and C keep their size).

Supported: ``mode="nearest"`` for float32, int8, uint8 and int32, and
``mode="linear"`` (bilinear) for float32; ``coordinate_transformation_mode``
``half_pixel``, ``asymmetric``, ``align_corners``, ``pytorch_half_pixel``;
``nearest_mode`` ``round_prefer_floor``, ``round_prefer_ceil``, ``floor``, ``ceil``;
``scales`` or ``sizes`` (4 values, N and C at 1 / unchanged). Not supported: cubic,
``tf_crop_and_resize`` (roi), antialias, ``keep_aspect_ratio_policy``, ``axes``.

The source coordinates are computed at build time exactly as onnxruntime computes them
(float32 arithmetic, scales from sizes as ``float(out) / float(in)``), so nearest
indices and linear weights match it; they become constant tables in the kernel.

Rows are built from a column map (per output column: one source column for nearest,
two with weights for linear). Where the map is periodic (``p`` output columns per ``q``
source columns: integer upscales, strided downscales, rational scales) the row is a
loop over periods whose loads and stores have constant offsets, which LLVM vectorises
as interleaved groups; the few columns outside the period, and maps without one, are
written from constant tables.

Nearest: each distinct source row is mapped once; output rows repeating the previous
source row are copies of the previous output row. Linear: every source row that is
used is interpolated along W into scratch, then each output row is the weighted sum of
two scratch rows, a contiguous vectorised loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import llvmlite.ir as ir
import numpy as np

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module
from .layout_ops import Scratch, emit_copy

_F = np.float32
_COORD_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# ---------------------------------------------------------------------------------
# Coordinates (onnxruntime's float32 arithmetic)

def _source_coords(n_out: int, n_in: int, scale: np.float32, mode: str) -> np.ndarray:
    """Source coordinate (float32) of every output index along one axis."""
    x = np.arange(n_out, dtype=_F)
    if mode == "asymmetric":
        return x / scale
    if mode == "half_pixel":
        return (x + _F(0.5)) / scale - _F(0.5)
    if mode == "pytorch_half_pixel":
        if n_out <= 1:
            return np.zeros(n_out, _F)
        return (x + _F(0.5)) / scale - _F(0.5)
    if n_out == 1:  # align_corners
        return np.zeros(1, _F)
    return x * _F(n_in - 1) / _F(n_out - 1)


def _nearest_index(c: np.ndarray, n_in: int, mode: str) -> np.ndarray:
    if mode == "floor":
        idx = np.floor(c)
    elif mode == "ceil":
        idx = np.ceil(c)
    else:
        # C's round() (half away from zero), except ties go down for prefer_floor.
        # In float64 the + 0.5 is exact, as C's roundf is.
        c64 = c.astype(np.float64)
        away = np.sign(c64) * np.floor(np.abs(c64) + 0.5)
        tie = c == np.trunc(c) + _F(0.5)
        idx = np.where(tie, np.floor(c), away) if mode == "round_prefer_floor" else away
    return np.clip(idx, 0, n_in - 1).astype(np.int64)


@dataclass(frozen=True)
class _Linear:
    """Per output index: the two source indices and their weights (``w0`` for ``i0``,
    ``w1`` for ``i1``), as onnxruntime's bilinear kernel computes them."""

    i0: np.ndarray
    i1: np.ndarray
    w0: np.ndarray
    w1: np.ndarray


def _linear_taps(c: np.ndarray, n_in: int) -> _Linear:
    c = np.clip(c, _F(0), _F(n_in - 1))
    i0 = np.minimum(c.astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    d0 = np.abs(c - i0.astype(_F)).astype(_F)   # distance to i0: the weight of i1
    d1 = np.abs(c - i1.astype(_F)).astype(_F)
    same = i0 == i1
    d0[same] = _F(0.5)
    d1[same] = _F(0.5)
    return _Linear(i0, i1, d1, d0)


def _out_sizes(spec: TensorSpec, scales: Sequence[float] | None, sizes: Sequence[int] | None
               ) -> tuple[tuple[int, int], tuple[np.float32, np.float32]]:
    """Output H, W and the float32 scales used for coordinates."""
    if (scales is None) == (sizes is None):
        raise CpuKernelError("Resize: give exactly one of scales and sizes")
    n, c, h, w = spec.shape
    if sizes is not None:
        sizes = [int(s) for s in sizes]
        if len(sizes) != 4 or sizes[:2] != [n, c] or min(sizes) < 1:
            raise CpuKernelError(f"Resize: sizes {sizes} must be 4 positive values keeping "
                                 f"N and C ({n}, {c})")
        oh, ow = sizes[2:]
        return (oh, ow), (_F(oh) / _F(h), _F(ow) / _F(w))
    scales = [float(s) for s in scales]
    if len(scales) != 4 or scales[:2] != [1.0, 1.0] or min(scales) <= 0:
        raise CpuKernelError(f"Resize: scales {scales} must be 4 positive values with "
                             "N and C at 1")
    sh, sw = _F(scales[2]), _F(scales[3])
    oh, ow = int(sh * _F(h)), int(sw * _F(w))
    if oh < 1 or ow < 1:
        raise CpuKernelError(f"Resize: scales {scales} give an empty output {oh}x{ow}")
    return (oh, ow), (sh, sw)


# ---------------------------------------------------------------------------------
# Builder

def build_resize(spec: TensorSpec, scales: Sequence[float] | None = None,
                 sizes: Sequence[int] | None = None, mode: str = "nearest",
                 coordinate_transformation_mode: str = "half_pixel",
                 nearest_mode: str = "round_prefer_floor",
                 name: str = "resize") -> CpuKernel:
    """ONNX Resize of an NCHW ``spec`` over H and W. ``scales`` or ``sizes`` has 4
    values as in ONNX (N and C unchanged). Defaults are ONNX's."""
    if spec.ndim != 4:
        raise CpuKernelError(f"Resize: input must be NCHW (rank 4), got {spec}")
    if mode not in ("nearest", "linear"):
        raise CpuKernelError(f"Resize: mode {mode!r} is not supported (nearest, linear)")
    if coordinate_transformation_mode not in _COORD_MODES:
        raise CpuKernelError(f"Resize: coordinate_transformation_mode "
                             f"{coordinate_transformation_mode!r} is not one of {_COORD_MODES}")
    if nearest_mode not in _NEAREST_MODES:
        raise CpuKernelError(f"Resize: nearest_mode {nearest_mode!r} is not one of "
                             f"{_NEAREST_MODES}")
    if mode == "linear" and spec.dtype != "float32":
        raise CpuKernelError(f"Resize: linear mode needs float32, got {spec.dtype}")
    n, c, h, w = spec.shape
    (oh, ow), (sh, sw) = _out_sizes(spec, scales, sizes)
    cy = _source_coords(oh, h, sh, coordinate_transformation_mode)
    cx = _source_coords(ow, w, sw, coordinate_transformation_mode)
    out = TensorSpec((n, c, oh, ow), spec.dtype)
    module = new_module(name)
    fn, b = kernel_function(module, "entry", (spec,), (out,))
    src, dst = fn.args
    if mode == "nearest":
        _emit_nearest(b, src, dst, n * c, (h, w), _nearest_index(cy, h, nearest_mode),
                      _nearest_index(cx, w, nearest_mode))
    else:
        _emit_bilinear(b, src, dst, n * c, (h, w), _linear_taps(cy, h), _linear_taps(cx, w))
    b.ret_void()
    return CpuKernel(name, str(module), "entry", (spec,), (out,))


# ---------------------------------------------------------------------------------
# Tables

def _table(b: ir.IRBuilder, values: Sequence, ty: ir.Type, name: str) -> ir.GlobalVariable:
    """A constant global array (internal) holding ``values``."""
    module = b.module
    arr_ty = ir.ArrayType(ty, len(values))
    g = ir.GlobalVariable(module, arr_ty, module.get_unique_name(name))
    g.linkage = "internal"
    g.global_constant = True
    conv = float if isinstance(ty, ir.FloatType) else int
    g.initializer = ir.Constant(arr_ty, [conv(v) for v in values])
    return g


def _lookup(b: ir.IRBuilder, table: ir.GlobalVariable, i: ir.Value) -> ir.Value:
    return b.load(b.gep(table, [U.i64(0), i], inbounds=True))


# ---------------------------------------------------------------------------------
# Nearest

def _emit_nearest(b: ir.IRBuilder, src: ir.Value, dst: ir.Value, planes: int,
                  in_hw: tuple[int, int], iy: np.ndarray, ix: np.ndarray) -> None:
    h, w = in_hw
    oh, ow = len(iy), len(ix)
    # Row oy is gathered when its source row differs from row oy-1's, else copied.
    fresh = np.ones(oh, dtype=bool)
    fresh[1:] = iy[1:] != iy[:-1]
    row_src = _table(b, iy * w, U.I64, "row_src")
    row_fresh = _table(b, fresh.astype(int), U.I8, "row_fresh")
    emit_row = _row_emitter(b, _RowMap(ix[:, None]))
    with U.for_range(b, planes, name="plane") as p, U.for_range(b, oh, name="oy") as oy:
        out_row = b.add(b.mul(p, U.i64(oh * ow)), b.mul(oy, U.i64(ow)))
        gather = b.icmp_unsigned("!=", _lookup(b, row_fresh, oy), ir.Constant(U.I8, 0))
        with b.if_else(gather) as (then, otherwise):
            with then:
                in_row = b.add(b.mul(p, U.i64(h * w)), _lookup(b, row_src, oy))
                emit_row(src, in_row, dst, out_row)
            with otherwise:
                emit_copy(b, dst, out_row, dst, b.sub(out_row, U.i64(ow)), ow)


RowEmitter = Callable[[ir.Value, ir.Value, ir.Value, ir.Value], None]


@dataclass(frozen=True)
class _RowMap:
    """Output column ``x`` of a row is ``sum_t weight[x, t] * src[index[x, t]]`` (one
    tap with no weights for nearest, two weighted taps for linear)."""

    index: np.ndarray                 # (out_w, taps) int64
    weight: np.ndarray | None = None  # (out_w, taps) float32, None for nearest

    def column(self, b: ir.IRBuilder, load: Callable[[int, ir.Value], ir.Value],
               x: int, shift: ir.Value | None = None) -> ir.Value:
        """Value of column ``x`` with every tap index moved by ``shift`` (i64)."""
        vals = []
        for t, i in enumerate(self.index[x]):
            idx = U.i64(int(i)) if shift is None else b.add(shift, U.i64(int(i)))
            vals.append(load(t, idx))
        if self.weight is None:
            return vals[0]
        acc = b.fmul(U.f32(self.weight[x, 0]), vals[0])
        for t in range(1, len(vals)):
            acc = b.fadd(acc, b.fmul(U.f32(self.weight[x, t]), vals[t]))
        return acc


def _periodic(m: _RowMap, max_period: int = 8) -> tuple[int, int, int, int] | None:
    """The longest stretch where the map repeats with period ``p`` columns while its
    source indices advance by ``q``: ``(p, q, x0, n)``, columns ``x0 + k*p + r``
    (``k < n``) being column ``x0 + r`` shifted by ``k*q``. Integer upscales (p=f,
    q=1), strided downscales (p=1, q=s) and rational scales all qualify. None when no
    stretch covers half of the row."""
    width = len(m.index)
    best = None
    for p in range(1, min(max_period, width - 1) + 1):
        step = m.index[p:] - m.index[:-p]
        q = int(np.bincount(np.clip(step[:, 0], 0, None)).argmax())
        ok = (step == q).all(axis=1)
        if m.weight is not None:
            ok &= (m.weight[p:] == m.weight[:-p]).all(axis=1)
        start, length = _longest_true_run(ok)
        n = length // p + 1 if length else 0
        if n >= 2 and (best is None or n * p > best[3] * best[0]):
            best = (p, q, start, n)
    if best is None or best[0] * best[3] * 2 < width:
        return None
    return best


def _longest_true_run(ok: np.ndarray) -> tuple[int, int]:
    best, cur = (0, 0), 0
    for k, v in enumerate(ok):
        cur = cur + 1 if v else 0
        if cur > best[1]:
            best = (k - cur + 1, cur)
    return best


def _row_emitter(b: ir.IRBuilder, m: _RowMap) -> RowEmitter:
    """An emitter of one output row, ``dst[out_off + x] = m`` applied to
    ``src[in_off:]``: a vectorisable loop over the periodic stretch (its loads and
    stores are interleaved groups with constant offsets) plus the few other columns
    one by one; a table-driven loop when the map has no period."""
    width = len(m.index)
    per = _periodic(m)
    if per is None:
        return _table_row(b, m)
    p, q, x0, n = per

    def emit(src, in_off, dst, out_off):
        def load(t, idx):
            return U.load(b, src, b.add(in_off, idx))
        for x in [*range(x0), *range(x0 + n * p, width)]:
            U.store(b, m.column(b, load, x), dst, b.add(out_off, U.i64(x)))
        with U.for_range(b, n, name="per") as k:
            shift = b.mul(k, U.i64(q))
            base = b.add(out_off, b.add(b.mul(k, U.i64(p)), U.i64(x0)))
            for r in range(p):
                U.store(b, m.column(b, load, x0 + r, shift), dst, b.add(base, U.i64(r)))
    return emit


def _table_row(b: ir.IRBuilder, m: _RowMap) -> RowEmitter:
    width, taps = m.index.shape
    idx = [_table(b, m.index[:, t], U.I64, "col_src") for t in range(taps)]
    wts = None if m.weight is None else [_table(b, m.weight[:, t], U.F32, "col_w")
                                         for t in range(taps)]

    def emit(src, in_off, dst, out_off):
        with U.for_range(b, width, name="ox") as x:
            vals = [U.load(b, src, b.add(in_off, _lookup(b, t, x))) for t in idx]
            if wts is None:
                v = vals[0]
            else:
                v = b.fmul(_lookup(b, wts[0], x), vals[0])
                for t in range(1, taps):
                    v = b.fadd(v, b.fmul(_lookup(b, wts[t], x), vals[t]))
            U.store(b, v, dst, b.add(out_off, x))
    return emit


# ---------------------------------------------------------------------------------
# Bilinear

def _emit_bilinear(b: ir.IRBuilder, src: ir.Value, dst: ir.Value, planes: int,
                   in_hw: tuple[int, int], ty: _Linear, tx: _Linear) -> None:
    h, w = in_hw
    oh, ow = len(ty.i0), len(tx.i0)
    used = np.unique(np.r_[ty.i0, ty.i1])          # source rows read at all
    slot = {int(r): k for k, r in enumerate(used)}
    scratch = Scratch(b)
    rows = scratch.alloc(U.F32, len(used) * ow, name="hrows")
    used_t = _table(b, used * w, U.I64, "used_rows")
    s0 = _table(b, [slot[int(r)] * ow for r in ty.i0], U.I64, "s0")
    s1 = _table(b, [slot[int(r)] * ow for r in ty.i1], U.I64, "s1")
    wy0, wy1 = _table(b, ty.w0, U.F32, "wy0"), _table(b, ty.w1, U.F32, "wy1")
    emit_row = _row_emitter(b, _RowMap(np.stack([tx.i0, tx.i1], axis=1),
                                       np.stack([tx.w0, tx.w1], axis=1)))
    with U.for_range(b, planes, name="plane") as p:
        plane_in = b.mul(p, U.i64(h * w))
        with U.for_range(b, len(used), name="hr") as r:
            emit_row(src, b.add(plane_in, _lookup(b, used_t, r)), rows,
                     b.mul(r, U.i64(ow)))
        plane_out = b.mul(p, U.i64(oh * ow))
        with U.for_range(b, oh, name="vy") as y:
            r0, r1 = _lookup(b, s0, y), _lookup(b, s1, y)
            k0, k1 = _lookup(b, wy0, y), _lookup(b, wy1, y)
            out_row = b.add(plane_out, b.mul(y, U.i64(ow)))
            with U.for_range(b, ow, name="vx") as x:
                a = U.load(b, rows, b.add(r0, x))
                c = U.load(b, rows, b.add(r1, x))
                U.store(b, b.fadd(b.fmul(k0, a), b.fmul(k1, c)), dst, b.add(out_row, x))
    scratch.release()
