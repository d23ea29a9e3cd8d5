"""Roofline bounds of operators on a config (the benchmarks' yardstick).

``bound = max(MACs / MACs per cycle, DRAM time)``, the MACs (and weight bytes) of a
convolution only those of its weight blocks that hold a non-zero (the GEMM core skips the
rest). The DRAM time counts the
bytes an operator must move at least -- the input pixels its windows touch,
its weights and output once, plus its per-channel parameters -- against the
DRAM system: every module
streams through its own port (``bus_bytes`` per cycle; the load module carries
inputs and weights, over each of its ports when a config gives it several and the
LOAD splits, :func:`tessera.timing.load_ports`; the store module outputs) and all ports share
``ddr_bytes_per_cycle``, so the DRAM time is the larger of the busiest port's
time and the total over the DDR rate.

Pooling and elementwise operators have no MACs: :func:`alu_roofline` bounds
them by DRAM alone, their operands entering through the compute module's port
(``LOAD acc8``). Tensor-ALU time (pooling taps, epilogue stages) is not part
of any operator's roofline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from tessera import timing
from tessera.config import HwConfig
from tessera.isa import MemType
from tessera.sparsity import block_density

from .ops import Concat, Conv2d, ConvTranspose2d, Dense, Eltwise, Op, Pool2d


@dataclass(frozen=True)
class Roofline:
    """An operator's bound: ``macs`` of its dense form; ``compute_cycles`` and the weight
    bytes count only the ``density`` of weight blocks that hold a non-zero (the GEMM core
    skips the rest, :class:`~.layout.WeightBlocks`)."""

    macs: int
    compute_cycles: float
    dram_bytes: int
    dram_cycles: float
    density: float = 1.0

    @property
    def bound(self) -> float:
        return max(self.compute_cycles, self.dram_cycles)

    @property
    def limit(self) -> str:
        return "compute" if self.compute_cycles >= self.dram_cycles else "DRAM"


def _touched(n_out: int, k: int, stride: int, dilation: int, pad: int, size: int) -> int:
    """How many of ``size`` input positions some window touches (a stride larger than the
    kernel skips the rest, which need not be read)."""
    return len({o * stride + i * dilation - pad for o in range(n_out) for i in range(k)}
               & set(range(size)))


def conv_roofline(op: Conv2d | Dense, in_shape: tuple[int, int, int, int],
                  config: HwConfig) -> Roofline:
    """The roofline of a convolution or dense layer on its logical (unpacked) shape, its
    work and weights those of its non-zero weight blocks."""
    conv = op.as_conv() if isinstance(op, Dense) else op
    n, c, h, w = in_shape
    _, o, oh, ow = conv.output_shape(in_shape)
    kh, kw = conv.weight.shape[2:]
    macs = n * o * oh * ow * (c // conv.groups) * kh * kw
    density = block_density(conv.weight, config.block_out, config.block_in)
    (sy, sx), (dy, dx), (t, l, _, _) = conv.stride, conv.dilation, conv.padding
    in_b = (n * c * _touched(oh, kh, sy, dy, t, h) * _touched(ow, kw, sx, dx, l, w)
            * config.inp_width // 8)
    w_b = int(conv.weight.size * density) * config.wgt_width // 8
    out_b = n * o * oh * ow * config.out_width // 8
    par_b = 2 * o * config.acc_width // 8   # bias and scale per channel
    load_port = (in_b / timing.load_ports(config, MemType.INP)
                 + w_b / timing.load_ports(config, MemType.WGT)) / config.bus_bytes
    store_port = out_b / config.bus_bytes
    total = (in_b + w_b + out_b + par_b) / config.ddr_bytes_per_cycle
    return Roofline(macs, macs * density / config.peak_macs_per_cycle,
                    in_b + w_b + out_b + par_b, max(load_port, store_port, total), density)


def conv_transpose_roofline(op: ConvTranspose2d, in_shape: tuple[int, int, int, int],
                            config: HwConfig) -> Roofline:
    """The roofline of a transposed convolution as it runs: the sum of its sub-pixel
    phases' (:mod:`.convtranspose`), each reading the input and writing its share of the
    output."""
    from .convtranspose import conv_transpose_phases
    parts = [conv_roofline(p.conv, in_shape, config)
             for p in conv_transpose_phases(op, in_shape)]
    macs = sum(r.macs for r in parts)
    return Roofline(macs, sum(r.compute_cycles for r in parts),
                    sum(r.dram_bytes for r in parts), sum(r.dram_cycles for r in parts),
                    sum(r.macs * r.density for r in parts) / macs if macs else 1.0)


def alu_roofline(op: Pool2d | Eltwise, shapes: Mapping[str, tuple[int, int, int, int]],
                 config: HwConfig) -> Roofline:
    """The roofline of a pooling or elementwise operator (no MACs: DRAM bounds it);
    ``shapes`` gives the logical shape of each of its tensor inputs.

    Its operands reach the accumulator through the compute module's port (``LOAD acc8``;
    a pool reads only the pixels its windows touch), its output leaves through the
    store module's. The tensor-ALU work is not part of a roofline: run alone, a 3x3 max
    pool takes about three times this bound on ``pynq``, its MAX operations the rest
    (fused into its convolution's tiles, :mod:`.poolfuse`, it moves no bytes of its own).
    """
    def nbytes(shape: tuple[int, int, int, int]) -> int:
        return int(np.prod(shape)) * config.out_width // 8

    out_shape = op.output_shape(shapes[op.inputs[0]])
    in_shapes = [shapes[t] for t in op.inputs]
    if isinstance(op, Pool2d):
        (kh, kw), (sy, sx), (t, l, _, _) = op.kernel, op.stride, op.padding
        n, c, h, w = in_shapes[0]
        oh, ow = out_shape[2:]
        in_shapes[0] = (n, c, _touched(oh, kh, sy, 1, t, h), _touched(ow, kw, sx, 1, l, w))
    in_b = sum(nbytes(s) for s in in_shapes)
    out_b = nbytes(out_shape)
    dram = max(in_b / config.bus_bytes, out_b / config.bus_bytes,
               (in_b + out_b) / config.ddr_bytes_per_cycle)
    return Roofline(0, 0.0, in_b + out_b, dram)


def op_roofline(op: Op, shape_of: Callable[[str], Sequence[int]],
                config: HwConfig) -> Roofline:
    """The roofline of any accelerator operator; ``shape_of(tensor)`` gives the logical
    shape of each of its inputs (NCHW, or fewer dimensions padded with 1s)."""
    shapes = {t: tuple(int(v) for v in shape_of(t)) for t in op.inputs}
    shapes = {t: s + (1,) * (4 - len(s)) for t, s in shapes.items()}
    if isinstance(op, Concat):
        return Roofline(0, 0.0, 0, 0.0)         # no data moves (stored in place)
    if isinstance(op, ConvTranspose2d):
        return conv_transpose_roofline(op, shapes[op.inputs[0]], config)
    if isinstance(op, (Conv2d, Dense)):
        return conv_roofline(op, shapes[op.inputs[0]], config)  # type: ignore[arg-type]
    return alu_roofline(op, shapes, config)  # type: ignore[arg-type]
