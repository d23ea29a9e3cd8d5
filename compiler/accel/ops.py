"""The operators the compiler lowers, and the epilogue stages that fuse onto them.

Tensors are named; an operator reads named tensors and writes one. Values
are the integers the accelerator stores (int8 activations for the presets);
zero points of inputs are the frontend's business (folded into biases), the
ops here compute on the stored integers.

Integer semantics, which the accelerator reproduces bit-exactly:

* :class:`Conv2d` / :class:`Dense`: ``acc = sum(x * w)`` in int32 (wrapping),
  then the epilogue stages in order, then the store saturates to the output
  width. :class:`ConvTranspose2d`: ``acc = conv_transpose(x - pad_value, w)``, then
  the same.
* :class:`Pool2d`: ``max`` over the valid (unpadded) window positions, or the
  sum of the valid positions (``sum``), followed by a rescale (``avg``, see
  :class:`Pool2d`).
* :class:`Eltwise`: ``op(a, b)`` on the values widened to int32 (``b`` may
  broadcast, or be a constant), then the epilogue stages.

Epilogue stages act on the int32 accumulator of each output value:

* :class:`Bias` ``acc += bias[c]``;
* :class:`Requant` ``acc = rint(f32(acc) * scale[c])`` (onnxruntime's float32
  formula, bit-exact, saturated to int32; per tensor or per channel);
* :class:`Shift` ``acc = acc >> n`` (arithmetic; with ``rounding`` it adds
  ``2**(n-1)`` first: round half up) -- the power-of-two requantization;
* :class:`Residual` ``acc += scale * r`` for a second tensor ``r`` of the output's shape;
* :class:`Mul` ``acc *= value`` (wrapping; per tensor or per channel);
* :class:`Clip` ``acc = min(max(acc, lo), hi)``; :func:`relu` is ``Clip(0, None)``;
* :class:`AddConst` ``acc += value`` (an output zero point);
* :class:`Apply` ``acc = OP(acc, value)`` with any registered ALU intrinsic (a plug-in's
  lookup table, say), the stage the intrinsics' compiler patterns produce.

:func:`requantize` builds onnxruntime's QLinear output stage from these.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

from tessera.errors import CompileError
from tessera.isa.encoding import PAD_VALUE_BITS

from .relu_sum import ReluSum

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


# ------------------------------------------------------------------ epilogue
@dataclass(frozen=True, eq=False)
class Bias:
    """``acc += values[c]`` (int32, one value per output channel)."""

    values: np.ndarray


@dataclass(frozen=True, eq=False)
class Requant:
    """``acc = rint(f32(acc) * scale[c])``: the REQUANT intrinsic (scalar or per channel)."""

    scale: Union[float, np.ndarray]

    @property
    def per_channel(self) -> bool:
        return np.ndim(self.scale) > 0


@dataclass(frozen=True)
class Shift:
    """``acc = (acc + (2**(amount-1) if rounding else 0)) >> amount`` (arithmetic)."""

    amount: int
    rounding: bool = True


@dataclass(frozen=True)
class Residual:
    """``acc += scale * tensor`` (element by element, same shape as the output).

    A ``scale`` other than 1 lets two quantized tensors with different scales be added
    in fixed point (see :func:`qlinear_add`).
    """

    tensor: str
    scale: int = 1


@dataclass(frozen=True, eq=False)
class Mul:
    """``acc = acc * value`` (int32, wrapping; a scalar or one value per channel)."""

    value: Union[int, np.ndarray]


@dataclass(frozen=True)
class Clip:
    """``acc = min(max(acc, lo), hi)``; ``None`` leaves a side open."""

    lo: int | None = None
    hi: int | None = None


@dataclass(frozen=True)
class AddConst:
    """``acc += value`` (the same value for every channel, e.g. an output zero point)."""

    value: int


@dataclass(frozen=True, eq=False)
class Apply:
    """``acc = OP(acc, value)`` with the registered ALU intrinsic ``op``.

    ``table``: ``op`` reads the ALU table memory; the table (int8 entries) is loaded with
    the operator and ``value`` is added to its first entry's index (the operand the op
    gets). ``out_range``: bounds of the result when known (a table's smallest and largest
    entry), for the epilogue's range reasoning; ``None``: any int32. ``saturates``: the op
    reads its input clamped to this range (the LUT looks up the int8 value), so a clamp
    just before it need not reach those bounds.
    """

    op: str
    value: int = 0
    table: np.ndarray | None = None
    out_range: tuple[int, int] | None = None
    saturates: tuple[int, int] | None = None


Stage = Union[Bias, Requant, Shift, Residual, Clip, AddConst, Mul, Apply, ReluSum]


def relu() -> Clip:
    """ReLU on the accumulator: ``max(acc, 0)``."""
    return Clip(0, None)


def requantize(scale: Union[float, np.ndarray], zero_point: int = 0, *, relu: bool = False,
               bias: np.ndarray | None = None, qmin: int = -128, qmax: int = 127,
               ) -> tuple[Stage, ...]:
    """onnxruntime's QLinearConv/QGemm output stage as epilogue stages.

    ``y = clip(rint(f32(acc + bias) * scale), qmin - zp, qmax - zp) + zp``;
    with ``relu`` the lower bound is the quantized zero (``max(qmin, zp)``), as
    a fused ReLU is in QDQ models.
    """
    lo = qmin - zero_point
    if relu:
        lo = max(lo, 0)
    stages: list[Stage] = []
    if bias is not None:
        stages.append(Bias(np.asarray(bias, dtype=np.int64)))
    stages += [Requant(scale), Clip(lo, qmax - zero_point)]
    if zero_point:
        stages.append(AddConst(zero_point))
    return tuple(stages)


# ------------------------------------------------------------------ operators
def _pair(v: int | Sequence[int], what: str, op: str) -> tuple[int, int]:
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    v = tuple(int(a) for a in v)
    if len(v) != 2:
        raise CompileError(f"{op!r}: {what} must be an int or a pair, not {v}", op=op)
    return v  # type: ignore[return-value]


def _pads(v: int | Sequence[int], op: str) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from an int, (pad_h, pad_w) or the 4-tuple."""
    if isinstance(v, (int, np.integer)):
        return (int(v),) * 4  # type: ignore[return-value]
    v = tuple(int(a) for a in v)
    if len(v) == 2:
        return (v[0], v[1], v[0], v[1])
    if len(v) == 4:
        return v  # type: ignore[return-value]
    raise CompileError(f"{op!r}: padding must be an int, (h, w) or (top, left, bottom, right), "
                       f"not {v}", op=op)


@dataclass(eq=False)
class Conv2d:
    """2-D convolution ``output = epilogue(conv(input, weight))``.

    ``weight`` is ``(O, I/groups, kh, kw)`` integers; ``padding`` is an int,
    ``(pad_h, pad_w)`` or ``(top, left, bottom, right)``. The padding holds
    ``pad_value`` (an input's zero point, so a zero point folded into the bias is
    exact at the borders too). ``pool``: a max pool of the convolution's output that the
    compiler fused into its tiles (:mod:`.poolfuse`; the max of the epilogue's values,
    saturated by the store, equals the max of the saturated ones); ``output`` is then the
    pooled tensor (``output_shape`` stays the convolution's).
    """

    name: str
    input: str
    output: str
    weight: np.ndarray
    stride: int | tuple[int, int] = 1
    padding: int | tuple[int, ...] = 0
    dilation: int | tuple[int, int] = 1
    groups: int = 1
    epilogue: tuple[Stage, ...] = ()
    pad_value: int = 0
    pool: "Pool2d | None" = None

    def __post_init__(self) -> None:
        self.weight = np.asarray(self.weight)
        lim = 1 << (PAD_VALUE_BITS - 1)
        if not -lim <= int(self.pad_value) < lim:
            raise CompileError(f"conv2d {self.name!r}: pad_value must be a signed "
                               f"{PAD_VALUE_BITS}-bit value, not {self.pad_value}", op=self.name)
        if self.weight.ndim != 4:
            raise CompileError(f"conv2d {self.name!r}: weight must be (O, I/groups, kh, kw), "
                               f"not shape {self.weight.shape}", op=self.name)
        self.stride = _pair(self.stride, "stride", self.name)
        self.dilation = _pair(self.dilation, "dilation", self.name)
        self.padding = _pads(self.padding, self.name)
        self.epilogue = tuple(self.epilogue)
        o = self.weight.shape[0]
        if self.groups < 1 or o % self.groups:
            raise CompileError(f"conv2d {self.name!r}: {o} output channels are not divisible "
                               f"into {self.groups} groups", op=self.name)
        if min(self.stride) < 1 or min(self.dilation) < 1 or min(self.padding) < 0:
            raise CompileError(f"conv2d {self.name!r}: stride and dilation must be >= 1 and "
                               f"padding >= 0 (stride {self.stride}, dilation {self.dilation}, "
                               f"padding {self.padding})", op=self.name)

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,) + tuple(s.tensor for s in self.epilogue if isinstance(s, Residual))

    @property
    def in_channels(self) -> int:
        return self.weight.shape[1] * self.groups

    @property
    def out_channels(self) -> int:
        return self.weight.shape[0]

    def output_shape(self, in_shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        n, c, h, w = in_shape
        if c != self.in_channels:
            raise CompileError(f"conv2d {self.name!r}: input {self.input!r} has {c} channels but "
                               f"the weight expects {self.in_channels}", op=self.name)
        kh, kw = self.weight.shape[2:]
        (sy, sx), (dy, dx), (t, l, b, r) = self.stride, self.dilation, self.padding
        oh = (h + t + b - dy * (kh - 1) - 1) // sy + 1
        ow = (w + l + r - dx * (kw - 1) - 1) // sx + 1
        if oh < 1 or ow < 1:
            raise CompileError(f"conv2d {self.name!r}: the {kh}x{kw} kernel (dilation "
                               f"{self.dilation}) does not fit the padded {h}x{w} input",
                               op=self.name)
        return (n, self.out_channels, oh, ow)


@dataclass(eq=False)
class ConvTranspose2d(Conv2d):
    """2-D transposed convolution ``output = epilogue(conv_transpose(input - zero_point, w))``.

    ``weight`` is ONNX's ``(C, O/groups, kh, kw)``; ``padding`` crops ``(top, left,
    bottom, right)`` off the full output and ``output_padding`` adds rows and columns at
    its end, as in ONNX (``pad_value`` is the input's zero point, subtracted from every
    input value). The accelerator runs it by sub-pixel decomposition
    (:mod:`.convtranspose`): one :class:`Conv2d` per output phase ``(a, b)`` computes the
    pixels ``(stride*i + a, stride*j + b)``, storing them straight to those places.
    """

    output_padding: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.output_padding = _pair(self.output_padding, "output_padding", self.name)
        if self.dilation != (1, 1) or any(p >= s for p, s in zip(self.output_padding,
                                                                self.stride)):
            raise CompileError(f"conv_transpose2d {self.name!r}: dilation {self.dilation} "
                               f"must be 1 and output_padding {self.output_padding} below the "
                               f"stride {self.stride}", op=self.name)

    @property
    def in_channels(self) -> int:
        return self.weight.shape[0]

    @property
    def out_channels(self) -> int:
        return self.weight.shape[1] * self.groups

    def output_shape(self, in_shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        n, c, h, w = in_shape
        if c != self.in_channels:
            raise CompileError(f"conv_transpose2d {self.name!r}: input {self.input!r} has {c} "
                               f"channels but the weight expects {self.in_channels}",
                               op=self.name)
        kh, kw = self.weight.shape[2:]
        (sy, sx), (t, l, b, r), (py, px) = self.stride, self.padding, self.output_padding
        oh, ow = (h - 1) * sy + kh + py - t - b, (w - 1) * sx + kw + px - l - r
        if oh < 1 or ow < 1:
            raise CompileError(f"conv_transpose2d {self.name!r}: padding {self.padding} "
                               f"leaves no output of the {h}x{w} input", op=self.name)
        return (n, self.out_channels, oh, ow)


@dataclass(eq=False)
class Dense:
    """Fully connected layer / matmul: ``output[N, O] = epilogue(input[N, K] @ weight[O, K].T)``."""

    name: str
    input: str
    output: str
    weight: np.ndarray
    epilogue: tuple[Stage, ...] = ()

    def __post_init__(self) -> None:
        self.weight = np.asarray(self.weight)
        if self.weight.ndim != 2:
            raise CompileError(f"dense {self.name!r}: weight must be (O, K), not shape "
                               f"{self.weight.shape}", op=self.name)
        self.epilogue = tuple(self.epilogue)

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,) + tuple(s.tensor for s in self.epilogue if isinstance(s, Residual))

    def output_shape(self, in_shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        n, k, h, w = in_shape
        if (h, w) != (1, 1) or k != self.weight.shape[1]:
            raise CompileError(f"dense {self.name!r}: input {self.input!r} of shape {in_shape} "
                               f"is not (N, {self.weight.shape[1]}) (flatten it first)",
                               op=self.name)
        return (n, self.weight.shape[0], 1, 1)

    def as_conv(self) -> Conv2d:
        """The same layer as a 1x1 convolution over ``N`` images of one pixel."""
        return Conv2d(self.name, self.input, self.output, self.weight[:, :, None, None],
                      epilogue=self.epilogue)


@dataclass(eq=False)
class Pool2d:
    """Max or average pooling over ``kernel`` windows.

    Padded positions never take part: ``max`` is over the valid positions of
    each window, ``avg`` sums the valid positions and rescales the sum by
    ``scale / count`` with onnxruntime's float32 rounding (``count`` = valid
    positions, or the full window with ``count_include_pad``): ``acc =
    rint(f32(sum) * f32(f32(scale) / count))``. ``scale`` is ``x_scale /
    y_scale`` of a quantized pool (1.0 keeps the input scale). ``sum`` keeps the
    int32 sum of the valid positions (``scale`` unused): the global average pool,
    whose zero-point correction comes before its rescale, does both in the
    epilogue. The epilogue stages (e.g. :class:`AddConst` for a zero point,
    :class:`Clip`) follow.
    """

    name: str
    input: str
    output: str
    kind: str
    kernel: int | tuple[int, int]
    stride: int | tuple[int, int] | None = None
    padding: int | tuple[int, ...] = 0
    count_include_pad: bool = False
    scale: float = 1.0
    epilogue: tuple[Stage, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("max", "avg", "sum"):
            raise CompileError(f"pool {self.name!r}: kind must be 'max', 'avg' or 'sum', not "
                               f"{self.kind!r}", op=self.name)
        self.kernel = _pair(self.kernel, "kernel", self.name)
        self.stride = _pair(self.kernel if self.stride is None else self.stride, "stride",
                            self.name)
        self.padding = _pads(self.padding, self.name)
        self.epilogue = tuple(self.epilogue)
        if any(p >= k for p, k in zip(self.padding, self.kernel * 2)):
            raise CompileError(f"pool {self.name!r}: padding {self.padding} must be smaller than "
                               f"the kernel {self.kernel} (a window would see only padding)",
                               op=self.name)

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,) + tuple(s.tensor for s in self.epilogue if isinstance(s, Residual))

    def output_shape(self, in_shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        n, c, h, w = in_shape
        (kh, kw), (sy, sx), (t, l, b, r) = self.kernel, self.stride, self.padding
        oh, ow = (h + t + b - kh) // sy + 1, (w + l + r - kw) // sx + 1
        if oh < 1 or ow < 1:
            raise CompileError(f"pool {self.name!r}: the {kh}x{kw} window does not fit the "
                               f"padded {h}x{w} input", op=self.name)
        return (n, c, oh, ow)


ELTWISE_OPS = {"add": "ADD", "sub": "SUB", "mul": "MUL", "min": "MIN", "max": "MAX"}


@dataclass(eq=False)
class Eltwise:
    """``output = epilogue(op(a, b))`` element by element (int32 arithmetic, wrapping).

    ``op`` is ``add``, ``sub``, ``mul``, ``min`` or ``max``; ``b`` is a tensor
    name (its shape may broadcast over N, H and W: size 1 there) or a constant
    array broadcastable to the output's ``(N, C, H, W)`` (a scalar, a per-channel
    vector ``(1, C, 1, 1)``, ...). ``b=None`` applies only the epilogue (e.g. a
    :class:`Clip`: the elementwise clip).
    """

    name: str
    op: str
    a: str
    output: str
    b: str | np.ndarray | int | None = None
    epilogue: tuple[Stage, ...] = ()

    def __post_init__(self) -> None:
        if self.b is not None and self.op not in ELTWISE_OPS:
            raise CompileError(f"eltwise {self.name!r}: op must be one of "
                               f"{sorted(ELTWISE_OPS)}, not {self.op!r}", op=self.name)
        if self.b is not None and not isinstance(self.b, str):
            self.b = np.asarray(self.b, dtype=np.int64)
        self.epilogue = tuple(self.epilogue)

    @property
    def inputs(self) -> tuple[str, ...]:
        extra = (self.b,) if isinstance(self.b, str) else ()
        return (self.a,) + extra + tuple(s.tensor for s in self.epilogue
                                         if isinstance(s, Residual))

    def output_shape(self, in_shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        return in_shape


@dataclass(eq=False)
class Concat:
    """``output = concat(parts, axis=1)``: channel blocks side by side, no instructions.

    Each part is the output of an earlier operator of the program that stores it straight
    into its place in the concat's buffer (:mod:`.dram`), so every part but the last
    must fill whole channel blocks, and the tensors hold one image block. ``channels``
    gives each part's channel count.
    """

    name: str
    parts: tuple[str, ...]
    output: str
    channels: tuple[int, ...]

    #: What the per-layer summary calls it.
    op = "concat"

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(self.parts)

    def output_shape(self, in_shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        n, _, h, w = in_shape
        return (n, sum(self.channels), h, w)


def clip(name: str, a: str, output: str, lo: int | None, hi: int | None) -> Eltwise:
    """Elementwise clip of tensor ``a`` to ``[lo, hi]``."""
    return Eltwise(name, "clip", a, output, None, (Clip(lo, hi),))


Op = Union[Conv2d, ConvTranspose2d, Dense, Pool2d, Eltwise, Concat]
