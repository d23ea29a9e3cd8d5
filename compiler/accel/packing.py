"""Kernel-position packing: convolutions with few input channels.

A convolution with 3 input channels on a GEMM core with 16-lane channel
blocks would waste 13/16 of every operation. When its input comes from the
host (a program input), the host can lay the input out with ``gy x gx``
kernel positions side by side in the channel dimension::

    X'[n, (i, j, c), y, x] = Xpad[n, c, y + i*dy, x + j*dx]      i < gy, j < gx

and the layer becomes a convolution over ``gy*gx*C`` channels with a
``ceil(kh/gy) x ceil(kw/gx)`` kernel, dilation ``(gy*dy, gx*dx)``, the same
stride and no padding (the host padded). A packed kernel extent of 1 lets the
host apply the stride too (only every ``s``-th row/column is kept), so the
packed conv has stride 1 there. With ``gy = kh`` and ``gx = kw`` this is
im2col: a 1x1 convolution over ``kh*kw*C`` channels.

:func:`choose_packing` picks the ``(gy, gx)`` with the fewest GEMM operations
per output pixel (ties: the smaller packed input);
:func:`pack_small_channel_convs` rewrites the operator list and returns the
host-side input transforms.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from tessera.config import HwConfig

from .layout import ceil_div
from .ops import Conv2d, Op


@dataclass(frozen=True)
class KernelPacking:
    """``gy x gx`` kernel positions packed into the channels of a convolution's input."""

    gy: int
    gx: int

    def geometry(self, conv: Conv2d, in_shape: tuple[int, int, int, int]):
        """Packed input shape, packed kernel ``(kh', kw')``, strides, dilations and whether
        rows / columns are subsampled by the host."""
        n, c, h, w = in_shape
        kh, kw = conv.weight.shape[2:]
        (sy, sx), (dy, dx) = conv.stride, conv.dilation
        _, _, oh, ow = conv.output_shape(in_shape)
        kh2, kw2 = ceil_div(kh, self.gy), ceil_div(kw, self.gx)
        sub_y, sub_x = kh2 == 1, kw2 == 1
        rows = oh if sub_y else (oh - 1) * sy + (kh2 - 1) * self.gy * dy + 1
        cols = ow if sub_x else (ow - 1) * sx + (kw2 - 1) * self.gx * dx + 1
        shape = (n, self.gy * self.gx * c, rows, cols)
        stride = (1 if sub_y else sy, 1 if sub_x else sx)
        dil = (self.gy * dy, self.gx * dx)
        return shape, (kh2, kw2), stride, dil, (sub_y, sub_x)

    def pack_weight(self, w: np.ndarray) -> np.ndarray:
        """``(O, C, kh, kw)`` -> ``(O, gy*gx*C, kh', kw')`` (positions past the kernel are 0)."""
        o, c, kh, kw = w.shape
        kh2, kw2 = ceil_div(kh, self.gy), ceil_div(kw, self.gx)
        out = np.zeros((o, self.gy, self.gx, c, kh2, kw2), dtype=w.dtype)
        for q in range(kh2):
            for i in range(self.gy):
                ky = q * self.gy + i
                if ky >= kh:
                    continue
                for r in range(kw2):
                    for j in range(self.gx):
                        kx = r * self.gx + j
                        if kx < kw:
                            out[:, i, j, :, q, r] = w[:, :, ky, kx]
        return out.reshape(o, self.gy * self.gx * c, kh2, kw2)

    def input_transform(self, conv: Conv2d, in_shape: tuple[int, int, int, int],
                        source: str = "") -> "PackedInput":
        """The host-side transform from the original input ``source`` to the packed one."""
        shape, _, _, _, (sub_y, sub_x) = self.geometry(conv, in_shape)
        (sy, sx), (dy, dx) = conv.stride, conv.dilation
        return PackedInput(source, self.gy, self.gx, shape[2], shape[3], sy if sub_y else 1,
                           sx if sub_x else 1, dy, dx, tuple(conv.padding), int(conv.pad_value))

    def rewrite(self, conv: Conv2d, in_shape, new_input: str) -> Conv2d:
        _, _, stride, dil, _ = self.geometry(conv, in_shape)
        return Conv2d(conv.name, new_input, conv.output, self.pack_weight(conv.weight),
                      stride=stride, padding=0, dilation=dil, groups=1, epilogue=conv.epilogue,
                      pad_value=conv.pad_value)


def gemm_ops_per_pixel(kh: int, kw: int, c: int, block: int, p: KernelPacking) -> int:
    return ceil_div(kh, p.gy) * ceil_div(kw, p.gx) * ceil_div(p.gy * p.gx * c, block)


def choose_packing(conv: Conv2d, in_shape: tuple[int, int, int, int],
                   config: HwConfig) -> KernelPacking | None:
    """The packing with the fewest GEMM operations per output pixel, or ``None`` if packing
    saves nothing (channels already fill the block, grouped convolutions)."""
    if conv.groups != 1:
        return None
    c = in_shape[1]
    kh, kw = conv.weight.shape[2:]
    block = config.block_in
    base = gemm_ops_per_pixel(kh, kw, c, block, KernelPacking(1, 1))
    best, key = None, None
    for gy in range(1, kh + 1):
        for gx in range(1, kw + 1):
            p = KernelPacking(gy, gx)
            ops = gemm_ops_per_pixel(kh, kw, c, block, p)
            shape = p.geometry(conv, in_shape)[0]
            entries = shape[2] * shape[3] * ceil_div(shape[1], block)
            k = (ops, entries)
            if ops < base and (key is None or k < key):
                best, key = p, k
    return best


def pack_small_channel_convs(ops: list[Op], input_shapes: dict[str, tuple[int, ...]],
                             config: HwConfig):
    """Rewrite convolutions that read a program input with few channels (see module doc).

    Returns the new operator list, the new input shapes (the packed input
    replaces the original when the convolution is its only reader, else it is
    added as ``<input>.packed``) and ``{packed input: transform}`` where the
    transform maps the *original* input to the packed one.
    """
    readers: dict[str, int] = {}
    for op in ops:
        for t in op.inputs:
            readers[t] = readers.get(t, 0) + 1
    new_ops: list[Op] = []
    shapes = dict(input_shapes)
    transforms: dict[str, PackedInput] = {}
    for op in ops:
        # (A transposed convolution's phases read the input as it is.)
        if type(op) is Conv2d and op.input in input_shapes:
            in_shape = tuple(input_shapes[op.input])
            if len(in_shape) == 4 and in_shape[1] < config.block_in:
                p = choose_packing(op, in_shape, config)  # type: ignore[arg-type]
                if p is not None:
                    name = op.input if readers[op.input] == 1 else f"{op.input}.packed"
                    shape = p.geometry(op, in_shape)[0]
                    shapes[name] = shape
                    transforms[name] = p.input_transform(op, in_shape,  # type: ignore[arg-type]
                                                         op.input)
                    new_ops.append(p.rewrite(op, in_shape, name))
                    continue
        new_ops.append(op)
    return new_ops, shapes, transforms


@dataclass(frozen=True)
class PackedInput:
    """The host-side transform of :class:`KernelPacking`: program input ``source`` padded
    (with ``pad_value``) and its ``gy x gx`` shifted windows concatenated on channels::

        X'[n, (i, j, c), y, x] = Xpad[n, c, y*step_y + i*dy, x*step_x + j*dx]

    A plain record (``to_dict``/``from_dict``) so compiled model files can store it.
    """

    source: str
    gy: int
    gx: int
    rows: int
    cols: int
    step_y: int
    step_x: int
    dy: int
    dx: int
    padding: tuple[int, int, int, int]
    pad_value: int = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        n, c, h, w = x.shape
        t, l, b, r = self.padding
        # Enough padding that every shifted window stays inside.
        need_h = (self.rows - 1) * self.step_y + (self.gy - 1) * self.dy + 1
        need_w = (self.cols - 1) * self.step_x + (self.gx - 1) * self.dx + 1
        xp = np.full((n, c, max(need_h, h + t + b), max(need_w, w + l + r)), self.pad_value,
                     dtype=x.dtype)
        xp[:, :, t:t + h, l:l + w] = x
        parts = [xp[:, :, i * self.dy:i * self.dy + (self.rows - 1) * self.step_y + 1:self.step_y,
                    j * self.dx:j * self.dx + (self.cols - 1) * self.step_x + 1:self.step_x]
                 for i in range(self.gy) for j in range(self.gx)]
        return np.concatenate(parts, axis=1)

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> "PackedInput":
        return cls(**{**d, "padding": tuple(d["padding"])})
