"""Packed DRAM layouts of activations and weights, and their packing helpers.

Activations (logical ``N x C x H x W``) are stored blocked as
``(N/n, C/c, H, W, n, c)``: ``n`` is the config's ``batch`` and ``c`` its
channel block, so one buffer entry (``n x c`` values) is one pixel of one
channel block of ``n`` images. ``N`` and ``C`` are padded up with zeros to
whole blocks; ``H`` and ``W`` are never padded in DRAM (the load DMA inserts
spatial zero padding on the fly).

Convolution weights (logical ``O x I/groups x kh x kw``) are stored as
``(O/co, J, kh, kw, co, ci)`` where ``J`` counts the input channel blocks an
output block reads: ``I/ci`` for an ordinary convolution, fewer for grouped
ones (a depthwise convolution has ``J = 1``). Output block ``ob`` reads input
blocks ``cb_lo[ob] .. cb_lo[ob] + J - 1`` (:class:`GroupBlocks`). For
``groups == 1`` this is the ``(O/c, I/c, kh, kw, co, ci)`` layout.

The runtime uses :func:`pack_activation` / :func:`unpack_activation` to move
tensors in and out of device memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.config import HwConfig

from tessera.errors import CompileError

_INT = {8: np.int8, 16: np.int16, 32: np.int32}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def int_dtype(bits: int) -> type:
    """The numpy integer type of a ``bits``-wide value."""
    return _INT[bits]


@dataclass(frozen=True)
class ActLayout:
    """The blocked layout of one activation tensor, and how a DMA addresses it.

    ``shape`` is the logical ``(N, C, H, W)``; ``batch`` and ``block`` are the
    ``n`` and ``c`` of the packed ``(N/n, C/c, H, W, n, c)`` layout in DRAM.

    ``unit`` (default ``block``) is the channel block one DMA element holds: the GEMM
    reads ``block_in`` channels per entry, the accumulator and output buffers hold
    ``block_out``. A core with ``block_in != block_out`` stores a tensor in blocks of the
    larger and moves the smaller as sub-blocks (one image per entry): with ``r = block /
    unit``, sub-block ``cb`` of a pixel is element ``r * entry + cb % r`` of its DRAM
    entry, so a pixel's sub-blocks lie ``r`` elements apart (:attr:`pixel_stride`) and a
    DMA moves a row of pixels as single-element rows (:func:`~.emit.plane_dmas`).
    :meth:`view` gives the layout as another unit sees it; sizes and packing depend only
    on ``block``.
    """

    shape: tuple[int, int, int, int]
    batch: int
    block: int
    unit: int | None = None

    @classmethod
    def of(cls, shape: tuple[int, ...], config: HwConfig, block: int | None = None) -> "ActLayout":
        """The layout of ``shape`` (``(N, C, H, W)`` or ``(N, C)``) for ``config``."""
        shape = tuple(int(s) for s in shape)
        if len(shape) == 2:
            shape = shape + (1, 1)
        if len(shape) != 4 or min(shape) < 1:
            raise CompileError(f"activation shape must be (N, C, H, W) or (N, C) with positive "
                               f"sizes, not {shape}")
        return cls(shape, config.batch, config.block_in if block is None else block)

    def view(self, unit: int) -> "ActLayout":
        """This tensor as a DMA of ``unit``-channel elements addresses it."""
        if self.block % unit or (unit != self.block and self.batch > 1):
            # an entry holds ``batch`` images' channels one image after the other, so a
            # sub-block of several images is not contiguous
            raise CompileError(f"a tensor stored in blocks of {self.block} channels cannot be "
                               f"moved in blocks of {unit}"
                               + (f": {unit} does not divide {self.block}" if self.block % unit
                                  else f" with {self.batch} images per entry"))
        return ActLayout(self.shape, self.batch, self.block, unit)

    @property
    def pixel_stride(self) -> int:
        """Elements (of :attr:`unit` channels) between one pixel's sub-block and the next
        pixel's: 1 when a DMA element is a whole DRAM block."""
        return self.block // (self.unit or self.block)

    @property
    def nb(self) -> int:
        return ceil_div(self.shape[0], self.batch)

    @property
    def cb(self) -> int:
        """Channel blocks of :attr:`unit` channels holding the tensor's channels (a
        ``block``'s sub-blocks past the last channel hold only padding)."""
        return ceil_div(self.shape[1], self.unit or self.block)

    @property
    def h(self) -> int:
        return self.shape[2]

    @property
    def w(self) -> int:
        return self.shape[3]

    @property
    def row_stride(self) -> int:
        """Elements between a pixel and the one below it."""
        return self.w * self.pixel_stride

    @property
    def packed_shape(self) -> tuple[int, int, int, int, int, int]:
        return (self.nb, ceil_div(self.shape[1], self.block), self.h, self.w, self.batch,
                self.block)

    @property
    def entries(self) -> int:
        """DRAM entries (``n x block`` values each) the tensor occupies."""
        return self.nb * ceil_div(self.shape[1], self.block) * self.h * self.w

    @property
    def values(self) -> int:
        return self.entries * self.batch * self.block

    def entry(self, nb: int, cb: int, y: int, x: int) -> int:
        """The element index of pixel ``(y, x)`` of channel block ``cb`` (of :attr:`unit`
        channels) of image block ``nb``."""
        r = self.pixel_stride
        blocks = ceil_div(self.shape[1], self.block)
        return (((nb * blocks + cb // r) * self.h + y) * self.w + x) * r + cb % r


def pack_activation(x: np.ndarray, layout: ActLayout, dtype: type = np.int8) -> np.ndarray:
    """``(N, C, H, W)`` (or ``(N, C)``) -> packed ``(N/n, C/c, H, W, n, c)``, zero padded."""
    x = np.asarray(x)
    if x.ndim == 2:
        x = x[:, :, None, None]
    if tuple(x.shape) != layout.shape:
        raise CompileError(f"tensor of shape {tuple(x.shape)} does not match the layout's "
                           f"shape {layout.shape}")
    nb, cb, h, w, batch, block = layout.packed_shape
    n, c = layout.shape[:2]
    full = np.zeros((nb * batch, cb * block, h, w), dtype=dtype)
    full[:n, :c] = x
    return np.ascontiguousarray(
        full.reshape(nb, batch, cb, block, h, w).transpose(0, 2, 4, 5, 1, 3))


def unpack_activation(packed: np.ndarray, layout: ActLayout) -> np.ndarray:
    """Packed ``(N/n, C/c, H, W, n, c)`` (or its flat values) -> ``(N, C, H, W)``."""
    p = np.asarray(packed).reshape(layout.packed_shape)
    nb, cb, h, w, batch, block = layout.packed_shape
    n, c = layout.shape[:2]
    full = p.transpose(0, 4, 1, 5, 2, 3).reshape(nb * batch, cb * block, h, w)
    return np.ascontiguousarray(full[:n, :c])


@dataclass(frozen=True)
class GroupBlocks:
    """Which input channel blocks each output channel block of a grouped convolution reads.

    Output block ``ob`` reads input blocks ``cb_lo[ob] + j`` for ``j < J``
    (blocks past the last one are skipped); ``slope`` is ``d cb_lo / d ob``
    when ``cb_lo`` is an arithmetic progression (``None`` otherwise).
    """

    cb_lo: tuple[int, ...]
    J: int
    slope: int | None

    @classmethod
    def of(cls, in_channels: int, out_channels: int, groups: int, block_in: int,
           block_out: int) -> "GroupBlocks":
        ob_count = ceil_div(out_channels, block_out)
        cb_count = ceil_div(in_channels, block_in)
        if groups == 1:
            return cls(tuple([0] * ob_count), cb_count, 0)
        icg, ocg = in_channels // groups, out_channels // groups
        lo, hi = [], []
        for ob in range(ob_count):
            o0, o1 = ob * block_out, min(out_channels, (ob + 1) * block_out)
            g0, g1 = o0 // ocg, (o1 - 1) // ocg
            lo.append((g0 * icg) // block_in)
            hi.append(ceil_div((g1 + 1) * icg, block_in))
        J = max(h - l for l, h in zip(lo, hi))
        diffs = {b - a for a, b in zip(lo, lo[1:])}
        slope = diffs.pop() if len(diffs) == 1 else (0 if not diffs else None)
        return cls(tuple(lo), J, slope)


@dataclass(frozen=True, eq=False)
class WeightBlocks:
    """Which blocks ``(ob, j, ky, kx)`` of a layer's packed weights hold a non-zero (the
    GEMM core's ``co x ci`` weight blocks per kernel tap, :mod:`tessera.sparsity`).

    The weight segment in DRAM keeps only these blocks, in ``(ob, j, ky, kx)`` order
    (:meth:`pack`): a dense layer's segment is the whole packed array, a block-sparse
    layer's holds ``density`` of it, and output block ``ob``'s blocks of input blocks
    ``j0:j1`` are one contiguous run (:meth:`start`, :meth:`count`). A layer compiled
    densely (zero blocks multiplied like any other) uses :meth:`dense` of its shape.
    """

    mask: np.ndarray            # bool (OB, J, kh, kw)

    def __post_init__(self) -> None:
        mask = np.ascontiguousarray(self.mask, dtype=bool)
        object.__setattr__(self, "mask", mask)
        # grid[ob, j]: packed index of ob's first block of input block j; j = J: its end.
        counts = mask.sum(axis=(2, 3), dtype=np.int64)
        ends = np.cumsum(counts.ravel()).reshape(counts.shape)
        grid = np.zeros((counts.shape[0], counts.shape[1] + 1), np.int64)
        grid[:, 1:] = ends
        grid[1:, 0] = ends[:-1, -1] if counts.shape[1] else 0
        object.__setattr__(self, "_starts", grid)
        object.__setattr__(self, "_key", (mask.shape, np.packbits(mask).tobytes()))
        object.__setattr__(self, "_hash", hash(self._key))

    @classmethod
    def of(cls, packed: np.ndarray) -> "WeightBlocks":
        """The non-zero blocks of packed weights ``(OB, J, kh, kw, co, ci)``."""
        return cls(np.any(np.asarray(packed) != 0, axis=(4, 5)))

    @classmethod
    def dense(cls, shape: tuple[int, int, int, int]) -> "WeightBlocks":
        """Every block of an ``(OB, J, kh, kw)`` layer present."""
        return cls(np.ones(shape, bool))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WeightBlocks) and self._key == other._key

    @property
    def is_dense(self) -> bool:
        return bool(self.mask.all())

    @property
    def nonzero(self) -> int:
        """Blocks the segment holds."""
        return int(self._starts[-1, -1])

    @property
    def density(self) -> float:
        return self.nonzero / self.mask.size if self.mask.size else 1.0

    def start(self, ob: int, j: int) -> int:
        """Packed index of output block ``ob``'s first block of input block ``j`` (or,
        for ``j = J``, of the block after its last)."""
        return int(self._starts[ob, j])

    def count(self, ob: int, j0: int, j1: int) -> int:
        """Blocks of output block ``ob`` over input blocks ``j0:j1``."""
        return int(self._starts[ob, j1] - self._starts[ob, j0])

    def taps(self, ob: int, j: int) -> np.ndarray:
        """Indices ``ky * kw + kx`` of the taps whose block ``(ob, j)`` holds a non-zero."""
        return np.flatnonzero(self.mask[ob, j])

    def pack(self, packed: np.ndarray) -> np.ndarray:
        """The DRAM segment: the non-zero blocks of ``packed`` in ``(ob, j, ky, kx)`` order."""
        return np.ascontiguousarray(np.asarray(packed)[self.mask])


def pack_conv_weights(w: np.ndarray, groups: int,
                      config: HwConfig) -> tuple[np.ndarray, GroupBlocks]:
    """``(O, I/groups, kh, kw)`` int8 -> ``(O/co, J, kh, kw, co, ci)`` and its :class:`GroupBlocks`.

    Weights of channels outside a block's groups (and padded channels) are zero.
    """
    w = np.asarray(w)
    o, icg, kh, kw = w.shape
    i = icg * groups
    bi, bo = config.block_in, config.block_out
    gb = GroupBlocks.of(i, o, groups, bi, bo)
    ob_count = ceil_div(o, bo)
    dtype = int_dtype(config.wgt_width)
    out = np.zeros((ob_count, gb.J, kh, kw, bo, bi), dtype=dtype)
    ocg = o // groups
    oc = np.arange(o)[:, None]
    ic = (oc // ocg) * icg + np.arange(icg)[None, :]
    ob, co = np.divmod(oc, bo)
    cb, ci = np.divmod(ic, bi)
    j = cb - np.asarray(gb.cb_lo)[ob]
    out[ob, j, :, :, co, ci] = w
    return out, gb


def unpack_conv_weights(packed: np.ndarray, gb: GroupBlocks, out_channels: int,
                        in_channels: int, groups: int) -> np.ndarray:
    """Inverse of :func:`pack_conv_weights`: ``(O, I/groups, kh, kw)``."""
    ob_count, J, kh, kw, bo, bi = packed.shape
    icg, ocg = in_channels // groups, out_channels // groups
    oc = np.arange(out_channels)[:, None]
    ic = (oc // ocg) * icg + np.arange(icg)[None, :]
    ob, co = np.divmod(oc, bo)
    cb, ci = np.divmod(ic, bi)
    w = packed[ob, cb - np.asarray(gb.cb_lo)[ob], :, :, co, ci]
    return w


def pack_weights(w: np.ndarray, config: HwConfig) -> np.ndarray:
    """Dense weights ``(O, I, kh, kw)`` or ``(O, I)`` -> ``(O/co, I/ci, kh, kw, co, ci)``."""
    w = np.asarray(w)
    if w.ndim == 2:
        w = w[:, :, None, None]
    return pack_conv_weights(w, 1, config)[0]


def unpack_weights(packed: np.ndarray, out_channels: int, in_channels: int) -> np.ndarray:
    """Inverse of :func:`pack_weights` (4-D result)."""
    gb = GroupBlocks(tuple([0] * packed.shape[0]), packed.shape[1], 0)
    return unpack_conv_weights(packed, gb, out_channels, in_channels, 1)
