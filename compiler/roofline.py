"""Roofline bounds of operators on a config (the benchmarks' yardstick).

``bound = max(MACs / MACs per cycle, DRAM time)``. The DRAM time counts the
bytes an operator must move at least -- the input pixels its windows touch,
its weights and output once, plus its per-channel parameters -- against the
DRAM system: every module
streams through its own port (``bus_bytes`` per cycle; the load module carries
inputs and weights, the store module outputs) and all ports share
``ddr_bytes_per_cycle``, so the DRAM time is the larger of the busiest port's
time and the total over the DDR rate.

The accelerator also spends tensor-ALU time on epilogues (a row of
``block_out`` values per operation, not counted by the roofline):
:func:`epilogue_floor` gives the per-row cycles of the cheapest lowering.
"""
from __future__ import annotations

from dataclasses import dataclass

from tessera.config import HwConfig

from .ops import Conv2d, Dense


@dataclass(frozen=True)
class Roofline:
    macs: int
    compute_cycles: float
    dram_bytes: int
    dram_cycles: float

    @property
    def bound(self) -> float:
        return max(self.compute_cycles, self.dram_cycles)

    @property
    def limit(self) -> str:
        return "compute" if self.compute_cycles >= self.dram_cycles else "DRAM"


def conv_roofline(op: Conv2d | Dense, in_shape: tuple[int, int, int, int],
                  config: HwConfig) -> Roofline:
    """The roofline of a convolution or dense layer on its logical (unpacked) shape."""
    conv = op.as_conv() if isinstance(op, Dense) else op
    n, c, h, w = in_shape
    _, o, oh, ow = conv.output_shape(in_shape)
    kh, kw = conv.weight.shape[2:]
    macs = n * o * oh * ow * (c // conv.groups) * kh * kw
    (sy, sx), (dy, dx), (t, l, _, _) = conv.stride, conv.dilation, conv.padding
    # Only input pixels some window touches must be read (a strided 1x1 kernel skips most).
    rows = {oy * sy + ky * dy - t for oy in range(oh) for ky in range(kh)} & set(range(h))
    cols = {ox * sx + kx * dx - l for ox in range(ow) for kx in range(kw)} & set(range(w))
    in_b = n * c * len(rows) * len(cols) * config.inp_width // 8
    w_b = conv.weight.size * config.wgt_width // 8
    out_b = n * o * oh * ow * config.out_width // 8
    par_b = 2 * o * config.acc_width // 8   # bias and scale per channel
    load_port = (in_b + w_b) / config.bus_bytes
    store_port = out_b / config.bus_bytes
    total = (in_b + w_b + out_b + par_b) / config.ddr_bytes_per_cycle
    return Roofline(macs, macs / config.peak_macs_per_cycle, in_b + w_b + out_b + par_b,
                    max(load_port, store_port, total))
