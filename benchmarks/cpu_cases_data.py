"""Benchmark cases for the data-movement, pooling, resize and conv/matmul CPU kernels
(run by ``cpu_kernels.py``).

Each numpy baseline is what a user would write for the op (``np.pad``,
``np.ascontiguousarray(x.transpose(...))`` since a transposed view alone is free,
``np.concatenate``, pooling through ``sliding_window_view``, resize by fancy indexing,
int8 conv as im2col plus an int32 matmul, depthwise as one int32 multiply-add of
shifted planes per tap, float conv as im2col plus ``np.matmul`` -- faster here than
``sliding_window_view`` with ``np.einsum`` or ``np.tensordot`` (1.05-1.5x) --, float Gemm
as ``x @ w.T``), on the same data as the kernel, and returns the same array. numpy's
matmul is OpenBLAS on its default threads (2 on the dev host); the kernels run on one.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cpu_case import Case, KernelCall
from tessera.compiler.cpu.conv import build_conv_int8, build_matmul_int8
from tessera.compiler.cpu.conv_float import build_conv_float
from tessera.compiler.cpu.kernel import TensorSpec
from tessera.compiler.cpu.layout_ops import build_concat, build_pad, build_transpose
from tessera.compiler.cpu.matmul import build_gemm
from tessera.compiler.cpu.pool import (build_average_pool, build_global_average_pool,
                                       build_global_max_pool, build_max_pool)
from tessera.compiler.cpu.resize import build_resize
from tessera.runtime.cpu import load_kernel

Fns = tuple[Callable[[], object], Callable[[], object]]
_RNG = np.random.default_rng(0)


def _data(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "float32":
        return _RNG.standard_normal(shape, dtype=np.float32)
    return _RNG.integers(-128, 128, shape, dtype=np.int8)


def _single(kernel, *args: np.ndarray) -> Callable[[], np.ndarray]:
    return KernelCall(load_kernel(kernel), *args)


# --- layout ------------------------------------------------------------------------

def _pad(shape: tuple[int, ...], dtype: str, pad: int) -> Fns:
    x = _data(shape, dtype)
    pads = [0, 0, pad, pad] * 2
    width = ((0, 0), (0, 0), (pad, pad), (pad, pad))
    return (lambda: np.pad(x, width),
            _single(build_pad(TensorSpec(shape, dtype), pads), x))


def _transpose(shape: tuple[int, ...], dtype: str, perm: tuple[int, ...]) -> Fns:
    x = _data(shape, dtype)
    return (lambda: np.ascontiguousarray(x.transpose(perm)),
            _single(build_transpose(TensorSpec(shape, dtype), perm), x))


def _concat(shape: tuple[int, ...], dtype: str, n: int, axis: int) -> Fns:
    xs = [_data(shape, dtype) for _ in range(n)]
    spec = TensorSpec(shape, dtype)
    return (lambda: np.concatenate(xs, axis=axis),
            _single(build_concat([spec] * n, axis), *xs))


_LAYOUT = [
    Case("pad", "1x64x56x56 +1 HW", "int8", 1.0, lambda: _pad((1, 64, 56, 56), "int8", 1)),
    Case("pad", "1x64x56x56 +1 HW", "float32", 1.0,
         lambda: _pad((1, 64, 56, 56), "float32", 1)),
    Case("transpose", "1x64x56x56 NCHW->NHWC", "int8", 1.0,
         lambda: _transpose((1, 64, 56, 56), "int8", (0, 2, 3, 1))),
    Case("transpose", "1x64x56x56 NCHW->NHWC", "float32", 1.0,
         lambda: _transpose((1, 64, 56, 56), "float32", (0, 2, 3, 1))),
    Case("transpose", "1x56x56x64 NHWC->NCHW", "float32", 1.0,
         lambda: _transpose((1, 56, 56, 64), "float32", (0, 3, 1, 2))),
    # Along channels of a batch-1 NCHW tensor both sides are two memcpy calls of the
    # same size, so this case measures call overhead (numpy's vs LoadedKernel's).
    Case("concat", "2 x 1x64x56x56 axis 1", "int8", 1.0,
         lambda: _concat((1, 64, 56, 56), "int8", 2, 1)),
    Case("concat", "2 x 1x64x56x56 axis 1", "float32", 1.0,
         lambda: _concat((1, 64, 56, 56), "float32", 2, 1)),
    Case("concat", "2 x 1x56x56x64 axis 3 (NHWC)", "int8", 1.0,
         lambda: _concat((1, 56, 56, 64), "int8", 2, 3)),
]


# --- pooling -----------------------------------------------------------------------

def _padded(x: np.ndarray, pad: int, value) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=value)


def _max_pool(shape: tuple[int, ...], dtype: str, k: int, stride: int, pad: int) -> Fns:
    x = _data(shape, dtype)
    low = -np.inf if dtype == "float32" else np.iinfo(dtype).min

    def numpy_fn():
        win = sliding_window_view(_padded(x, pad, low), (k, k), axis=(2, 3))
        return win[:, :, ::stride, ::stride].max(axis=(-2, -1))
    kernel = build_max_pool(TensorSpec(shape, dtype), (k, k), (stride, stride), (pad,) * 4)
    return numpy_fn, _single(kernel, x)


def _avg_pool(shape: tuple[int, ...], k: int, stride: int, pad: int) -> Fns:
    # count_include_pad=1: the divisor numpy's mean over the zero-padded window uses.
    x = _data(shape, "float32")

    def numpy_fn():
        win = sliding_window_view(_padded(x, pad, 0), (k, k), axis=(2, 3))
        return win[:, :, ::stride, ::stride].mean(axis=(-2, -1))
    kernel = build_average_pool(TensorSpec(shape, "float32"), (k, k), (stride, stride),
                                (pad,) * 4, count_include_pad=1)
    return numpy_fn, _single(kernel, x)


def _global_avg(shape: tuple[int, ...], dtype: str) -> Fns:
    x = _data(shape, dtype)
    if dtype == "float32":
        def numpy_fn():
            return x.mean(axis=(2, 3), keepdims=True)
    else:
        n = shape[2] * shape[3]

        def numpy_fn():   # exact int32 sum, mean rounded half to even
            total = x.sum(axis=(2, 3), keepdims=True, dtype=np.int32)
            return np.rint(total / n).astype(np.int8)
    return numpy_fn, _single(build_global_average_pool(TensorSpec(shape, dtype)), x)


def _global_max(shape: tuple[int, ...], dtype: str) -> Fns:
    x = _data(shape, dtype)
    return (lambda: x.max(axis=(2, 3), keepdims=True),
            _single(build_global_max_pool(TensorSpec(shape, dtype)), x))


_POOL = [
    Case("max_pool 3x3/2 pad 1", "1x64x112x112", "int8", 1.0,
         lambda: _max_pool((1, 64, 112, 112), "int8", 3, 2, 1)),
    Case("max_pool 3x3/2 pad 1", "1x64x112x112", "float32", 1.0,
         lambda: _max_pool((1, 64, 112, 112), "float32", 3, 2, 1)),
    Case("avg_pool 3x3/1 pad 1", "1x64x56x56", "float32", 1.0,
         lambda: _avg_pool((1, 64, 56, 56), 3, 1, 1)),
    Case("global_avg_pool", "1x512x7x7", "float32", 1.0,
         lambda: _global_avg((1, 512, 7, 7), "float32")),
    Case("global_avg_pool", "1x512x7x7", "int8", 1.0,
         lambda: _global_avg((1, 512, 7, 7), "int8")),
    Case("global_max_pool", "1x512x7x7", "float32", 1.0,
         lambda: _global_max((1, 512, 7, 7), "float32")),
]


# --- resize ------------------------------------------------------------------------

def _resize_nearest(shape: tuple[int, ...], dtype: str) -> Fns:
    # asymmetric + floor at scale 2: source index = out // 2 (the usual upsample).
    x = _data(shape, dtype)
    iy = np.arange(2 * shape[2]) // 2
    ix = np.arange(2 * shape[3]) // 2
    kernel = build_resize(TensorSpec(shape, dtype), scales=[1, 1, 2, 2],
                          coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    return lambda: x[:, :, iy[:, None], ix], _single(kernel, x)


def _linear_taps(n_in: int, n_out: int):
    """half_pixel source indices and weights (float32), as onnxruntime computes them."""
    scale = np.float32(n_out) / np.float32(n_in)
    c = (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) / scale - np.float32(0.5)
    c = np.clip(c, np.float32(0), np.float32(n_in - 1))
    i0 = np.minimum(c.astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = np.abs(c - i0.astype(np.float32))
    w0 = np.abs(c - i1.astype(np.float32))
    same = i0 == i1
    w0[same] = w1[same] = np.float32(0.5)
    return i0, i1, w0, w1


def _resize_linear(shape: tuple[int, ...]) -> Fns:
    x = _data(shape, "float32")
    y0, y1, wy0, wy1 = _linear_taps(shape[2], 2 * shape[2])
    x0, x1, wx0, wx1 = _linear_taps(shape[3], 2 * shape[3])

    def numpy_fn():   # separable: along W, then along H
        h = x[..., x0] * wx0 + x[..., x1] * wx1
        return h[:, :, y0] * wy0[:, None] + h[:, :, y1] * wy1[:, None]
    kernel = build_resize(TensorSpec(shape, "float32"), scales=[1, 1, 2, 2], mode="linear")
    return numpy_fn, _single(kernel, x)


_RESIZE = [
    Case("resize nearest x2", "1x64x56x56", "float32", 1.0,
         lambda: _resize_nearest((1, 64, 56, 56), "float32")),
    Case("resize nearest x2", "1x64x56x56", "int8", 1.0,
         lambda: _resize_nearest((1, 64, 56, 56), "int8")),
    Case("resize linear x2", "1x64x56x56", "float32", 1.0,
         lambda: _resize_linear((1, 64, 56, 56))),
]


# --- int8 conv / matmul ------------------------------------------------------------

def _conv(shape: tuple[int, ...], m: int, k: int, pad: int) -> Fns:
    x = _data(shape, "int8")
    w = _data((m, shape[1], k, k), "int8")
    bias = _RNG.integers(-1000, 1000, m, dtype=np.int32)
    c = shape[1]

    def numpy_fn():   # im2col, then one int32 matmul
        win = sliding_window_view(_padded(x, pad, 0), (k, k), axis=(2, 3))
        cols = win[0].transpose(0, 3, 4, 1, 2).reshape(c * k * k, -1).astype(np.int32)
        out = w.reshape(m, -1).astype(np.int32) @ cols + bias[:, None]
        return out.reshape(1, m, *win.shape[2:4])
    kernel = build_conv_int8(TensorSpec(shape, "int8"), TensorSpec(w.shape, "int8"),
                             bias=True, pads=(pad,) * 4)
    return numpy_fn, _single(kernel, x, w, bias)


def _depthwise(shape: tuple[int, ...], k: int, pad: int) -> Fns:
    x = _data(shape, "int8")
    c = shape[1]
    w = _data((c, 1, k, k), "int8")
    oh, ow = shape[2] + 2 * pad - k + 1, shape[3] + 2 * pad - k + 1

    def numpy_fn():   # one int32 multiply-add of shifted planes per tap
        xp = _padded(x, pad, 0).astype(np.int32)
        out = np.zeros((1, c, oh, ow), np.int32)
        for ky in range(k):
            for kx in range(k):
                out += xp[:, :, ky:ky + oh, kx:kx + ow] * w[None, :, 0, ky, kx, None, None]
        return out
    kernel = build_conv_int8(TensorSpec(shape, "int8"), TensorSpec(w.shape, "int8"),
                             pads=(pad,) * 4, group=c)
    return numpy_fn, _single(kernel, x, w)


def _matmul(m: int, k: int, n: int) -> Fns:
    a, b = _data((m, k), "int8"), _data((k, n), "int8")
    kernel = build_matmul_int8(TensorSpec(a.shape, "int8"), TensorSpec(b.shape, "int8"))
    return lambda: a.astype(np.int32) @ b.astype(np.int32), _single(kernel, a, b)


def _conv_float(shape: tuple[int, ...], m: int, k: int, pad: int) -> Fns:
    c = shape[1]
    x = _data(shape, "float32")
    w = _data((m, c, k, k), "float32") * np.float32((2 / (c * k * k)) ** 0.5)   # He init
    bias = _data((m,), "float32")

    def numpy_fn():   # im2col, then one float32 matmul
        win = sliding_window_view(_padded(x, pad, 0), (k, k), axis=(2, 3))
        cols = win[0].transpose(0, 3, 4, 1, 2).reshape(c * k * k, -1)
        out = w.reshape(m, -1) @ cols + bias[:, None]
        return out.reshape(1, m, *win.shape[2:4])
    kernel = build_conv_float(TensorSpec(shape, "float32"), TensorSpec(w.shape, "float32"),
                              TensorSpec(bias.shape, "float32"), pads=(pad,) * 4)
    return numpy_fn, _single(kernel, x, w, bias)


def _gemm_float(m: int, k: int, n: int) -> Fns:
    """A dense layer ``x @ w.T`` (ONNX Gemm, transB=1: the weight stored [N, K])."""
    x = _data((m, k), "float32")
    w = _data((n, k), "float32") * np.float32(k ** -0.5)
    kernel = build_gemm(TensorSpec(x.shape, "float32"), TensorSpec(w.shape, "float32"),
                        trans_b=True)
    return lambda: x @ w.T, _single(kernel, x, w)


_CONV = [
    Case("conv float 3x3 pad 1 +bias", "1x128x28x28 -> 128", "float32", 1.0,
         lambda: _conv_float((1, 128, 28, 28), 128, 3, 1)),
    Case("conv float 3x3 pad 1 +bias", "1x256x14x14 -> 256", "float32", 1.0,
         lambda: _conv_float((1, 256, 14, 14), 256, 3, 1)),
    Case("gemm float x @ w.T", "64x768 @ 768x3072", "float32", 1.0,
         lambda: _gemm_float(64, 768, 3072)),
    Case("conv int8 3x3 pad 1 +bias", "1x64x28x28 -> 64", "int8", 1.0,
         lambda: _conv((1, 64, 28, 28), 64, 3, 1)),
    Case("depthwise int8 3x3 pad 1", "1x128x56x56", "int8", 1.0,
         lambda: _depthwise((1, 128, 56, 56), 3, 1)),
    Case("matmul int8", "256x256x256", "int8", 1.0, lambda: _matmul(256, 256, 256)),
]

CASES: list[Case] = [*_LAYOUT, *_POOL, *_RESIZE, *_CONV]
