"""Transposed convolutions on the GEMM core: sub-pixel decomposition.

A :class:`~.ops.ConvTranspose2d` with strides ``(sy, sx)`` is ``sy * sx`` ordinary
convolutions, one per output *phase* ``(a, b)``: the output pixels ``(sy*i + a, sx*j + b)``
receive only the kernel taps ``k`` with ``k = (a + pad_top) mod sy`` (mod ``sy``) along
the rows (likewise along the columns), so each phase is a stride-1 convolution of the
input with those taps, flipped, and each phase conv stores its pixels straight into
their places in the output (:attr:`~.emit.TensorInfo.view`: rows ``sy`` apart, pixels
``sx`` apart; a strided DMA costs the same beats as a contiguous one). No zero-stuffed
input is built and no interleave pass runs.

Why not a convolution over the zero-stuffed input: it multiplies the ``sy*sx - 1`` zeros
of every ``sy x sx`` cell too, ``sy * sx`` times the MACs of the phases together, and
writes and reads a stuffed input ``sy * sx`` times the input's size; the phases read the
input once each, the same bytes as the stuffed one once. The roofline
(:func:`~.roofline.conv_transpose_roofline`) is the phases' sum.

Along one axis (stride ``s``, kernel ``K``, crop ``p`` at the start, input length
``L``): phase ``a`` has ``Q = ceil((out - a) / s)`` outputs; its taps are ``k0 + t*s``
(``k0 = (a + p) mod s``), ``T`` of them; output ``q`` reads input ``q + e - t``
(``e = (a + p) // s``), i.e. a stride-1 correlation with the flipped taps and
``T - 1 - e`` padding at the start. Padding holds the input zero point, and each
phase's bias is folded with its own taps (``- zero_point * sum(w_phase)``), so every
output is ``sum((x - zp) * w) + bias`` exactly, as onnxruntime computes it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tessera.errors import CompileError

from ..frontend.qdq_convtranspose import AxisPhase, subpixel_axis_phase
from .emit import Emitter, TensorInfo
from .ops import Bias, Conv2d, ConvTranspose2d

__all__ = ["Phase", "conv_transpose_phases", "tensorize_conv_transpose2d"]


@dataclass(frozen=True)
class Phase:
    """One output phase: the stride-1 convolution computing it and where it goes."""

    conv: Conv2d
    view: tuple[int, int, int, int]          # (sy, sx, ay, ax), see TensorInfo.view


def conv_transpose_phases(op: ConvTranspose2d, in_shape: tuple[int, int, int, int]
                          ) -> list[Phase]:
    """The stride-1 convolutions of ``op``'s sub-pixel decomposition (module doc);
    raises :class:`CompileError` naming the phase that cannot be one."""
    _, _, h, w = in_shape
    _, _, oh, ow = op.output_shape(in_shape)
    (sy, sx), (t, l, _, _) = op.stride, op.padding
    kh, kw = op.weight.shape[2:]
    out = []
    for a in range(sy):
        rows = subpixel_axis_phase(a, sy, t, kh, h, oh)
        for b in range(sx):
            cols = subpixel_axis_phase(b, sx, l, kw, w, ow)
            why = rows if isinstance(rows, str) else cols
            if isinstance(why, str):
                raise CompileError(f"conv_transpose2d {op.name!r}: {why}", op=op.name)
            if rows is None or cols is None:
                continue
            out.append(Phase(_phase_conv(op, rows, cols, f"{op.name}.phase{a}{b}"),
                             (sy, sx, a, b)))
    return out


def _phase_conv(op: ConvTranspose2d, rows: AxisPhase, cols: AxisPhase, name: str) -> Conv2d:
    """The stride-1 convolution of one phase: its taps as an ``(O, C/g, T_y, T_x)``
    weight (an all-zero 1x1 when an axis has none), its bias folded."""
    c, og = op.weight.shape[:2]
    cg, g = c // op.groups, op.groups
    if rows.taps and cols.taps:
        taps = op.weight[:, :, list(rows.taps), :][:, :, :, list(cols.taps)]
    else:                   # an axis without taps: zeros, one tap wide along it
        taps = np.zeros((c, og, max(1, len(rows.taps)), max(1, len(cols.taps))),
                        op.weight.dtype)
    # (C, O/g, Ty, Tx) -> (g, C/g, O/g, ...) -> (g, O/g, C/g, ...) -> (O, C/g, Ty, Tx)
    weight = taps.reshape(g, cg, og, *taps.shape[2:]).transpose(0, 2, 1, 3, 4).reshape(
        g * og, cg, *taps.shape[2:])
    fold = -int(op.pad_value) * weight.reshape(weight.shape[0], -1).astype(np.int64).sum(axis=1)
    return Conv2d(name, op.input, op.output, weight, stride=1,
                  padding=(rows.begin, cols.begin, rows.end, cols.end), groups=op.groups,
                  epilogue=_folded_epilogue(op.epilogue, fold), pad_value=op.pad_value)


def _folded_epilogue(epilogue: tuple, fold: np.ndarray) -> tuple:
    """``epilogue`` with ``fold`` added to its leading bias (one put first if none)."""
    if not np.any(fold):
        return epilogue
    if epilogue and isinstance(epilogue[0], Bias):
        total = np.asarray(epilogue[0].values, np.int64) + fold
        return (Bias(((total + (1 << 31)) % (1 << 32)) - (1 << 31)), *epilogue[1:])
    return (Bias(fold), *epilogue)


def tensorize_conv_transpose2d(em: Emitter, op: ConvTranspose2d, inp: TensorInfo,
                               out: TensorInfo, residuals: dict[str, TensorInfo], *,
                               threads: int = 2, plan=None,
                               skip_zero_blocks: bool = True) -> dict[str, object]:
    """Emit ``op`` as its phase convolutions, each storing into ``out`` through a view;
    returns each phase's tiling by phase name (``plan``: a tiling forced on every
    phase)."""
    from .conv import tensorize_conv2d
    plans = {}
    for phase in conv_transpose_phases(op, inp.layout.shape):
        plans[phase.conv.name] = tensorize_conv2d(
            em, phase.conv, inp, replace(out, view=phase.view), residuals, threads=threads,
            plan=plan, skip_zero_blocks=skip_zero_blocks)
    return plans
