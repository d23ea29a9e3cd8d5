"""Independent numpy references for the compiler tests.

Written here from the operator definitions (docs/compiler.md), not from the
compiler's code: convolution as a sum over kernel taps of strided slices of
the zero-padded input, pooling as an explicit loop over windows, the
requantization as onnxruntime's float32 formula
(:func:`tessera.isa.requant.onnxruntime_reference`).
"""
from __future__ import annotations

import numpy as np

from tessera.isa.requant import onnxruntime_reference

I32 = (-(2**31), 2**31 - 1)


def wrap32(v):
    return ((np.asarray(v, dtype=np.int64) + 2**31) % 2**32) - 2**31


def conv(x, w, stride=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1):
    """int64 convolution of x (N, C, H, W) with w (O, C/groups, kh, kw); pads are
    (top, left, bottom, right)."""
    x = np.asarray(x, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sy, sx), (dy, dx), (t, l, b, r) = stride, dil, pads
    xp = np.zeros((n, c, h + t + b, wd + l + r), dtype=np.int64)
    xp[:, :, t:t + h, l:l + wd] = x
    oh = (h + t + b - dy * (kh - 1) - 1) // sy + 1
    ow = (wd + l + r - dx * (kw - 1) - 1) // sx + 1
    out = np.zeros((n, o, oh, ow), dtype=np.int64)
    og = o // groups
    for oc in range(o):
        g = oc // og
        for ky in range(kh):
            for kx in range(kw):
                window = xp[:, g * cg:(g + 1) * cg,
                            ky * dy: ky * dy + sy * (oh - 1) + 1: sy,
                            kx * dx: kx * dx + sx * (ow - 1) + 1: sx]
                out[:, oc] += np.tensordot(w[oc, :, ky, kx], window, axes=([0], [1]))
    return out


def per_channel(v, ndim=4):
    v = np.asarray(v)
    return v.reshape((1, -1) + (1,) * (ndim - 2)) if v.ndim else v


def ort_requant(acc, scale, zp=0, relu=False, ndim=4):
    """onnxruntime's QLinear output: clip(rint(f32(acc) * scale), qmin - zp, 127 - zp) + zp."""
    qmin = max(-128, zp) if relu else -128
    return onnxruntime_reference(acc, per_channel(np.asarray(scale, np.float32), ndim), zp,
                                 qmin=qmin, qmax=127)


def rint_scale(acc, scale, ndim=4):
    """rint(f32(acc) * f32 scale), saturated to int32 (REQUANT alone)."""
    y = np.rint(np.asarray(acc).astype(np.float32) * per_channel(np.asarray(scale, np.float32),
                                                                 ndim)).astype(np.float64)
    return np.clip(y, *I32).astype(np.int64)


def pool(x, kind, kernel, stride, pads, count_include_pad=False, scale=1.0):
    """Max / rescaled-average pooling over the valid positions of each window."""
    x = np.asarray(x, dtype=np.int64)
    n, c, h, w = x.shape
    (kh, kw), (sy, sx), (t, l, b, r) = kernel, stride, pads
    oh, ow = (h + t + b - kh) // sy + 1, (w + l + r - kw) // sx + 1
    out = np.zeros((n, c, oh, ow), dtype=np.int64)
    for oy in range(oh):
        for ox in range(ow):
            vals = [x[:, :, y, v] for y in range(oy * sy - t, oy * sy - t + kh)
                    for v in range(ox * sx - l, ox * sx - l + kw) if 0 <= y < h and 0 <= v < w]
            stack = np.stack(vals, axis=-1)
            if kind == "max":
                out[:, :, oy, ox] = stack.max(axis=-1)
            else:
                count = kh * kw if count_include_pad else len(vals)
                s = np.float32(np.float32(scale) / np.float32(count))
                out[:, :, oy, ox] = np.rint(stack.sum(axis=-1).astype(np.float32) * s)
    return out


def sat8(v):
    return np.clip(np.asarray(v, dtype=np.int64), -128, 127)
