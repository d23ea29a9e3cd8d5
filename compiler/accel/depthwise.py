"""Depthwise convolution on the GEMM core: the cycle floor of each way to lower it.

A depthwise convolution (``groups == in_channels == out_channels``) runs today on the
GEMM core's diagonal (:class:`~.layout.GroupBlocks`: one ``block_out x block_in`` weight
block per channel block, only its diagonal non-zero): one GEMM operation per kernel tap
and *pixel block* (one output pixel of one channel block of ``batch`` images).

Why the diagonal is the most a channel-lane layout allows: a GEMM operation reads one
input row -- one pixel, each of its ``block_in`` channels once -- and writes one
accumulator row. A depthwise output lane needs its own channel only, so each output lane
finds exactly one useful input lane in the row: at most ``batch x block_out`` useful MACs
per operation (16 of 256 on ``pynq``) whatever the weight block or the lanes' order.
The ALU (the only unit the plug-in path extends) takes at most one tensor row every
``ii_tensor`` cycles through its two-operand hook ``op(acc[dst], acc[src])``, so a tap
``acc += w * x`` with a per-channel ``w`` costs it a MOV, a MUL and an ADD of rows; and the
ALU already spends part of every pixel block on the epilogue.

:func:`depthwise_floors` gives, per lowering, the cycles its busiest resource needs at
least (no drains, no token waits), so a benchmark can set each against the roofline:

* ``gemm_diagonal`` -- today's lowering: ``kh x kw`` GEMM operations per pixel block;
* ``alu_split`` -- (b) pixel blocks shared between the diagonal GEMMs and the tensor ALU
  (MOV, MUL, ADD per tap; the ALU-side inputs loaded with ``LOAD acc8``, which stops
  both units), balanced against the ALU's epilogue work;
* ``alu_mac`` -- (c) the same with a plug-in three-operand multiply-accumulate at
  ``ii_tensor`` per row, which the two-operand hook API cannot express: an upper bound
  on what any ALU intrinsic could add;
* ``toeplitz`` -- (a) pixels on the lanes (stride 1): each input row holds ``block_in``
  pixels of one image row of one channel with a ``kw - 1`` pixel halo (without it an
  output row segment needs two or three input rows per kernel row: 7 to 9 operations per
  16 outputs, as many as the diagonal's 9), one Toeplitz weight block per kernel row and
  channel (``kh`` blocks of ``block_out x block_in`` bytes per channel, DRAM traffic the
  roofline does not have), the layout changes to pixel lanes and back done by the layer
  (:func:`_toeplitz_cycles`: the DMA moves whole elements and the core cannot permute
  lanes, so each costs a trip through DRAM; a pointwise producer could emit pixel lanes by
  swapping its operands, but only in aligned groups of ``block_in`` pixels, without the
  halo);
* ``line_buffer`` -- a GEMM mode that keeps the last ``kw - 1`` input buffer rows (the
  pixels to the left along the image row) in registers so that one operation does a
  whole kernel row per lane, its weights from row ``c`` of a block for lane ``c`` (a
  change of the core's tensor pipeline and ISA, not an intrinsic; stride 1).

The GEMM-based floors pay the DRAM traffic of their weight blocks, not the roofline's
logical weights: the diagonal loads a whole block per tap and channel block (16 times
the weights on ``pynq``), which alone holds MobileNet's 7x7x1024 layer to 3.3x its
bound there.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.config import HwConfig
from tessera.errors import PYTHON, CompileError
from tessera.isa import ALU_OPS, Isa, MemType

from .layout import ceil_div
from .ops import Conv2d
from .roofline import Roofline, conv_roofline

#: The ALU ops of one tap ``acc += w * x`` with a per-channel weight row: a copy of the
#: input row, its product with the weight row, its sum into the accumulator.
ALU_TAP_OPS = ("MOV", "MUL", "ADD")


def is_depthwise(op: object) -> bool:
    """Whether ``op`` is a depthwise convolution (one input channel per group, channel
    multiplier 1)."""
    return (isinstance(op, Conv2d) and op.groups > 1
            and op.groups == op.in_channels == op.out_channels)


def pixel_blocks(op: Conv2d, in_shape: tuple[int, int, int, int], config: HwConfig) -> int:
    """Output pixels x channel blocks x image blocks of ``batch``: the units of work of the
    diagonal lowering (``kh x kw`` GEMM operations each)."""
    n, c = in_shape[:2]
    oh, ow = op.output_shape(in_shape)[2:]
    return ceil_div(n, config.batch) * ceil_div(c, config.block_out) * oh * ow


@dataclass(frozen=True)
class DepthwiseFloors:
    """Cycle floors of one depthwise layer's lowerings (module doc); ``None`` where a
    lowering does not apply (the pixel-lane ones need stride 1)."""

    roofline: Roofline
    pixel_blocks: int
    gemm_diagonal: float
    alu_split: float
    alu_mac: float
    toeplitz: float | None
    line_buffer: float | None

    def ratios(self) -> dict[str, float | None]:
        """Each lowering's floor over the roofline bound."""
        b = self.roofline.bound
        return {name: None if v is None else v / b for name, v in
                (("gemm_diagonal", self.gemm_diagonal), ("alu_split", self.alu_split),
                 ("alu_mac", self.alu_mac), ("toeplitz", self.toeplitz),
                 ("line_buffer", self.line_buffer))}


def tap_alu_cycles() -> int:
    """ALU cycles per row of one tap done on the ALU (:data:`ALU_TAP_OPS`, tensor form)."""
    return sum(ALU_OPS.by_name(name).timing.ii(False) for name in ALU_TAP_OPS)


def split_cycles_per_block(taps: int, epilogue: float, tap_cost: float,
                           load_stall: float) -> float:
    """Cycles per pixel block when a fraction of the blocks runs on the ALU: the GEMM unit
    does ``taps`` operations per GEMM-side block, the ALU ``tap_cost`` cycles per tap of
    an ALU-side block plus ``epilogue`` per block of either kind; ``load_stall`` (both
    units stopped by the ALU-side input loads) per ALU-side block. The fraction balances
    the two units' busy time (none when the epilogue alone fills the ALU)."""
    share = max(0.0, (taps - epilogue) / (taps * (1 + tap_cost)))
    return taps * (1 - share) + load_stall * share


@dataclass(frozen=True)
class _Traffic:
    """A layer's DRAM bytes by kind, priced by conv_roofline's port model: the load
    module's port carries inputs and weights, the store module's the outputs, all share
    the DDR rate."""

    config: HwConfig
    inputs: int
    outputs: int
    params: int

    @classmethod
    def of(cls, roof: Roofline, op: Conv2d, out_shape: tuple[int, ...],
           config: HwConfig) -> "_Traffic":
        """The roofline's own split (its inputs: the pixels some window touches)."""
        outputs = int(np.prod(out_shape)) * config.out_width // 8
        params = 2 * op.out_channels * config.acc_width // 8
        weights = int(op.weight.size * roof.density) * config.wgt_width // 8
        return cls(config, roof.dram_bytes - weights - outputs - params, outputs, params)

    def cycles(self, loaded: int, stored: int) -> float:
        """DRAM cycles of ``loaded`` bytes through the load port and ``stored`` through
        the store port, parameters besides."""
        c = self.config
        return max(loaded / c.bus_bytes, stored / c.bus_bytes,
                   (loaded + stored + self.params) / c.ddr_bytes_per_cycle)


def _toeplitz_cycles(op: Conv2d, in_shape: tuple[int, int, int, int],
                     traffic: _Traffic) -> float:
    """The pixel-lane lowering's floor, its layout changes done by the layer itself.

    GEMM operations: a Toeplitz one per kernel row, output row segment and channel; one
    per input row segment and channel to transpose the input (a channel-lane tile loaded
    as a weight block, a one-hot input row picking a channel: the core cannot permute
    lanes, so only a weight block's rows become an accumulator row's lanes); one per
    pixel block to transpose the output back. DRAM: the input read as weight tiles, its
    halo-overlapped transposed rows stored and read back as input rows (the accumulator
    reaches the input buffer only through DRAM), the Toeplitz blocks, the pixel-lane
    output stored and read back as weight tiles, the channel-lane output stored."""
    config = traffic.config
    n, c, h, _ = in_shape
    _, _, oh, ow = op.output_shape(in_shape)
    kh, kw = op.weight.shape[2:]
    lanes = config.block_in
    segments = ceil_div(ow, lanes - (kw - 1))
    images, blocks = ceil_div(n, config.batch), ceil_div(c, config.block_out)
    ops = images * c * segments * (oh * kh + h) + images * blocks * oh * ow
    rows = n * c * h * segments * lanes * config.inp_width // 8
    toeplitz = c * kh * config.wgt_entry_bytes
    out = traffic.outputs
    return max(float(ops), traffic.cycles(traffic.inputs + rows + toeplitz + out,
                                          rows + 2 * out))


def depthwise_floors(op: Conv2d, in_shape: tuple[int, int, int, int], config: HwConfig,
                     epilogue_alu_per_block: float) -> DepthwiseFloors:
    """The floors of :class:`DepthwiseFloors` for depthwise ``op`` on ``in_shape``;
    ``epilogue_alu_per_block``: the ALU cycles its epilogue takes per pixel block (the
    bias initialisation and the output stage; e.g. measured on the compiled program).
    The GEMM-based floors pay the diagonal's weight traffic: a whole ``block_out x
    block_in`` block per tap and channel block, of which only the diagonal is non-zero."""
    if not is_depthwise(op):
        raise CompileError(f"{getattr(op, 'name', op)!r} is not a depthwise convolution "
                           "(groups == in_channels == out_channels)",
                           fix={PYTHON: "pass a Conv2d whose groups equal its channels"})
    roof = conv_roofline(op, in_shape, config)
    out_shape = op.output_shape(in_shape)
    traffic = _Traffic.of(roof, op, out_shape, config)
    n, c, h, w = in_shape
    _, _, oh, ow = out_shape
    kh, kw = op.weight.shape[2:]
    images, channel_blocks = ceil_div(n, config.batch), ceil_div(c, config.block_out)
    blocks = pixel_blocks(op, in_shape, config)
    taps = kh * kw
    diagonal = traffic.cycles(traffic.inputs + channel_blocks * taps * config.wgt_entry_bytes,
                              traffic.outputs)
    # LOAD acc8 of an ALU-side block's input pixels (halo included) stops both units.
    acc8_cycles = Isa(config).elem_bytes(MemType.ACC8) / config.bus_bytes
    load_stall = acc8_cycles * (h * w) / (oh * ow)

    def split(tap_cost: float) -> float:
        per_block = split_cycles_per_block(taps, epilogue_alu_per_block, tap_cost, load_stall)
        return max(per_block * blocks, diagonal)

    stride_1 = tuple(op.stride) == (1, 1) and tuple(op.dilation) == (1, 1)
    # The line buffer's lane c takes its taps from row c of a block: all taps of a
    # channel block in ceil(taps / block_in) blocks.
    line_ops = images * channel_blocks * oh * kh * (ow + kw - 1)
    line_dram = traffic.cycles(traffic.inputs + channel_blocks * ceil_div(taps, config.block_in)
                               * config.wgt_entry_bytes, traffic.outputs)
    return DepthwiseFloors(
        roof, blocks, max(float(taps * blocks), diagonal), split(tap_alu_cycles()),
        split(ALU_OPS.by_name("MUL").timing.ii(False)),
        _toeplitz_cycles(op, in_shape, traffic) if stride_1 else None,
        max(float(line_ops), line_dram) if stride_1 else None)
