"""numpy golden models of the operators of :mod:`..accel.ops` (their documented integer semantics).

The benchmarks check compiled programs against these; the tests use their own,
independently written references.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..accel.epilogue import reference_stages
from ..accel.ops import Conv2d, Dense, Eltwise, Op, Pool2d


def conv2d(x: np.ndarray, op: Conv2d) -> np.ndarray:
    """The int64 accumulator of a convolution (before the epilogue), by im2col."""
    x = np.asarray(x, dtype=np.int64)
    n, c, h, w = x.shape
    o, icg, kh, kw = op.weight.shape
    (sy, sx), (dy, dx), (t, l, b, r) = op.stride, op.dilation, op.padding
    xp = np.full((n, c, h + t + b, w + l + r), op.pad_value, dtype=np.int64)
    xp[:, :, t:t + h, l:l + w] = x
    _, _, oh, ow = op.output_shape((n, c, h, w))
    g = op.groups
    out = np.zeros((n, o, oh, ow), dtype=np.int64)
    wt = op.weight.astype(np.int64)
    for gi in range(g):
        cols = []
        for ky in range(kh):
            for kx in range(kw):
                cols.append(xp[:, gi * icg:(gi + 1) * icg, ky * dy:ky * dy + sy * (oh - 1) + 1:sy,
                               kx * dx:kx * dx + sx * (ow - 1) + 1:sx])
        patches = np.stack(cols, axis=2)                     # n, icg, kh*kw, oh, ow
        wg = wt[gi * (o // g):(gi + 1) * (o // g)].reshape(o // g, icg, kh * kw)
        out[:, gi * (o // g):(gi + 1) * (o // g)] = np.einsum("nckhw,ock->nohw", patches, wg)
    return out


def pool2d(x: np.ndarray, op: Pool2d) -> np.ndarray:
    """The int64 accumulator of a pooling operator (max, sum, or rescaled average)."""
    x = np.asarray(x, dtype=np.int64)
    n, c, h, w = x.shape
    (kh, kw), (sy, sx), (t, l, _, _) = op.kernel, op.stride, op.padding
    _, _, oh, ow = op.output_shape((n, c, h, w))
    out = np.zeros((n, c, oh, ow), dtype=np.int64)
    for oy in range(oh):
        ys = [y for y in range(oy * sy - t, oy * sy - t + kh) if 0 <= y < h]
        for ox in range(ow):
            xs = [v for v in range(ox * sx - l, ox * sx - l + kw) if 0 <= v < w]
            win = x[:, :, ys][:, :, :, xs]
            if op.kind == "max":
                out[:, :, oy, ox] = win.max(axis=(2, 3))
            elif op.kind == "sum":
                out[:, :, oy, ox] = win.sum(axis=(2, 3))
            else:
                count = kh * kw if op.count_include_pad else len(ys) * len(xs)
                s = np.float32(np.float32(op.scale) / np.float32(count))
                out[:, :, oy, ox] = np.rint(win.sum(axis=(2, 3)).astype(np.float32) * s)
    return out


def run_reference(ops: Sequence[Op], inputs: Mapping[str, np.ndarray],
                  out_bits: int = 8) -> dict[str, np.ndarray]:
    """Every tensor of an operator sequence, computed with numpy (outputs saturated)."""
    vals = {k: np.asarray(v, dtype=np.int64) for k, v in inputs.items()}
    lo, hi = -(1 << (out_bits - 1)), (1 << (out_bits - 1)) - 1
    for op in ops:
        if isinstance(op, (Conv2d, Dense)):
            conv = op.as_conv() if isinstance(op, Dense) else op
            x = vals[op.input]
            if x.ndim == 2:
                x = x[:, :, None, None]
            acc = conv2d(x, conv)
        elif isinstance(op, Pool2d):
            acc = pool2d(vals[op.input], op)
        elif isinstance(op, Eltwise):
            a = vals[op.a]
            if op.b is None:
                acc = a
            else:
                b = vals[op.b] if isinstance(op.b, str) else np.asarray(op.b, dtype=np.int64)
                f = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "min": np.minimum,
                     "max": np.maximum}[op.op]
                acc = f(a, b)
        else:
            raise TypeError(op)
        acc = reference_stages(acc, op.epilogue, 1, vals)
        vals[op.output] = np.clip(acc, lo, hi)
    return vals
