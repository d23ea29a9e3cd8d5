"""When the CPU lowerings use the N:M sparse kernels (:mod:`.sparse`), and the step
that runs one: a QConv/QGemm/Conv/Gemm/MatMul whose weight is a constant meeting one of
:data:`tessera.sparsity.NM_PATTERNS` (:func:`tessera.sparsity.nm_pattern` along its
reduction axis) gets the sparse kernel, its compressed weights (values and offsets,
:func:`.sparse_layout.nm_layout`) passed as constants of the step; any other weight
keeps the dense kernel. Grouped and non-2-D convolutions stay dense; an int8 matmul of
few rows takes :mod:`.sparse_pairs`' kernel, or the dense one (:data:`INT8_MIN_ROWS`).
"""
from __future__ import annotations

from math import prod
from typing import Callable, Sequence

import numpy as np

from tessera.sparsity import nm_pattern

from .kernel import CpuKernel, TensorSpec
from .lower_plan import NodeLowering, Plan
from .sparse import build_conv_nm, build_matmul_nm, conv_output_hw
from .sparse_layout import NMLayout, nm_layout
from .sparse_pairs import PairLayout, build_matmul_nm_pairs, nm_pair_layout

__all__ = ["INT8_MIN_ROWS", "PAIR_MIN_ROWS", "nm_conv_step", "nm_matmul_kernel",
           "nm_matmul_step"]

#: An int8 matmul on fewer rows does not use :mod:`.sparse`'s column kernel, which pays
#: an index load and an interleave per kept weight over too few columns; from
#: :data:`PAIR_MIN_ROWS` rows (and an even ``n``) it uses :mod:`.sparse_pairs`' kernel,
#: below that the dense one. Measured on the Zen 5 dev host, 2:4 speed over the dense
#: kernel, 512 x 1000 / 768 x 3072: column kernel 1 row 0.42x / 0.45x, 4 rows 0.72x /
#: 0.64x, 8 rows 0.92x / 0.88x, 16 rows 1.46x / 1.46x, 32 rows 1.81x / 1.96x; pair
#: kernel 1 row 0.91x / 0.83x, 4 rows 1.32x / 1.19x, 8 rows 1.72x / 1.55x, 16 rows
#: 1.70x / 1.35x; at 1:4 the column kernel on 8 rows 1.9x / 2.2x (half the slots), hence
#: the threshold scales with the density. (float32: the column kernel wins at every
#: size, 7.6x on one row.)
INT8_MIN_ROWS = 16
PAIR_MIN_ROWS = 4


def nm_conv_step(low: NodeLowering, suffix: str | None, x_name: str, x: TensorSpec,
                 w: np.ndarray, out_name: str, geometry: dict,
                 bias: tuple[str, np.ndarray] | None = None) -> Plan | None:
    """The step computing ``out_name`` as the N:M sparse convolution of ``x`` by the
    constant ``w`` (``geometry``: strides, pads (top, left, bottom, right), dilations,
    group), or None when ``w`` is not N:M sparse or the conv is not a 2-D group-1
    one. ``bias``: (tensor name, its constant data or None for a computed one)."""
    if x.ndim != 4 or w.ndim != 4 or int(geometry.get("group", 1)) != 1:
        return None
    pattern = nm_pattern(w, axis=1)
    if pattern is None:
        return None
    kind = "float32" if x.dtype == "float32" else "int8"
    kernel = w.shape[2:]
    attrs = {k: [int(v) for v in geometry[k]] for k in ("strides", "pads", "dilations")}
    oh, ow = conv_output_hw(x.shape[2:], kernel, **attrs)
    layout = nm_layout(w, pattern, oh * ow, kind, taps=prod(kernel))
    return _step(low, suffix, x_name, layout, out_name, bias,
                 lambda: build_conv_nm(x, layout, kernel, bias is not None, **attrs))


def nm_matmul_kernel(a: TensorSpec, w: np.ndarray, bias: bool = False
                     ) -> tuple[Callable[[], CpuKernel], NMLayout | PairLayout] | None:
    """The sparse kernel for ``a @ w.T (+ bias)`` with the constant ``w (O, K)``, as
    (builder, its compressed layout), or None for the dense kernel: ``w`` not N:M sparse
    along K, or an int8 ``a`` of too few rows (:data:`INT8_MIN_ROWS` at density 1/2,
    scaled by the density; below, the pair kernel of :mod:`.sparse_pairs` from
    :data:`PAIR_MIN_ROWS` rows for even ``n``, else dense)."""
    if a.ndim < 2 or w.ndim != 2:
        return None
    pattern = nm_pattern(w, axis=1)
    if pattern is None:
        return None
    rows = prod(a.shape[:-1])
    # The column kernel's cost is per kept weight: at density 1/4 half as many rows pay.
    if a.dtype == "float32" or rows * pattern[1] >= INT8_MIN_ROWS * 2 * pattern[0]:
        layout = nm_layout(w, pattern, rows, "float32" if a.dtype == "float32" else "int8")
        return (lambda: build_matmul_nm(a, layout, bias)), layout
    if a.ndim == 2 and rows >= PAIR_MIN_ROWS and pattern[0] % 2 == 0 and not bias:
        pairs = nm_pair_layout(w, pattern, rows)
        return (lambda: build_matmul_nm_pairs(a, pairs)), pairs
    return None


def nm_matmul_step(low: NodeLowering, suffix: str | None, a_name: str, a: TensorSpec,
                   w: np.ndarray, out_name: str,
                   bias: tuple[str, np.ndarray] | None = None) -> Plan | None:
    """The step computing ``out_name = a @ w.T (+ bias)`` for the constant ``w (O, K)``
    with the N:M sparse kernel of :func:`nm_matmul_kernel`, or None (the dense one)."""
    chosen = nm_matmul_kernel(a, w, bias is not None)
    if chosen is None:
        return None
    build, layout = chosen
    return _step(low, suffix, a_name, layout, out_name, bias, build)


def _step(low: NodeLowering, suffix: str | None, x_name: str, layout, out_name: str,
          bias: tuple[str, np.ndarray] | None, build) -> Plan:
    tag = suffix or "nm"
    values, offsets = low.tmp(f"{tag}_nm_values"), low.tmp(f"{tag}_nm_offsets")
    inputs: Sequence[str] = (x_name, values, offsets)
    constants = {values: layout.values, offsets: layout.offsets}
    if bias is not None:
        inputs = (*inputs, bias[0])
        if bias[1] is not None:
            constants[bias[0]] = bias[1]
    return Plan(suffix, tuple(inputs), (out_name,), build, constants)
