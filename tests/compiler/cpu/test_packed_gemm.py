"""The packed float GEMM (:func:`tessera.compiler.cpu.packed_gemm.emit_packed_gemm`) behind
Gemm, MatMul and Conv from ``PACKED_MIN_MACS`` multiply-adds on, and the dot-product
form of ``x @ W.T`` at few rows: against float64 numpy on shapes that hit every edge of
their loops (a ragged last panel, row group, tile or vector along k, several k blocks,
both vector sides, batches, grouped / strided / dilated / 1-D / 3-D convs).

Tolerance: the float32 sums differ from the exact ones by rounding only; the measured
error is ~1e-6 of the output's largest magnitude, the bound checked 1e-5 of it plus
1e-4 relative (a wrong or missing product is off by ~1e-2 or more)."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler.cpu.conv_float import build_conv_float
from tessera.compiler.cpu.kernel import TensorSpec
from tessera.compiler.cpu.matmul import _float_form, _vector_side, build_gemm, build_matmul
from tessera.compiler.cpu.packed_gemm import DEPTH_BLOCK, PackedGemm
from tessera.runtime.cpu import load_kernel


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _spec(a: np.ndarray) -> TensorSpec:
    return TensorSpec(a.shape, "float32")


def _assert_vector_tiles(kernel) -> None:
    """The kernel is the packed GEMM or the dot products (their register tiles' vector
    multiply-adds), not the loop nest."""
    assert "llvm.fmuladd.v" in kernel.ir


def _close(got: np.ndarray, want64: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want64.shape
    np.testing.assert_allclose(got, want64, rtol=1e-4, atol=1e-5 * np.abs(want64).max())


PANEL = PackedGemm(1, 1, 1, (0, 0), (0, 0)).panel


@pytest.mark.parametrize("m,k,n,trans_a,trans_b,form", [
    (70, 50, 130, 0, 1, "packed"),       # both sides >= a panel: A'.T packed (transB)
    (70, 50, 130, 0, 0, "packed"),       # B' packed
    (70, 50, 130, 1, 1, "packed"), (70, 50, 130, 1, 0, "packed"),
    (300, 40, 5, 1, 0, "packed"),        # few columns: A'.T packed
    (13, DEPTH_BLOCK + 76, 70, 0, 0, "packed"),    # two k blocks
    (5, 300, 301, 0, 1, "dots"),         # x @ W.T, few rows: dot products along k
    (1, 512, 1000, 0, 1, "dots"), (14, 100, 70, 0, 1, "dots"),
    (3, 500, 700, 0, 0, "nest"),         # few rows, W contiguous along n
])
def test_gemm_matches_float64(m, k, n, trans_a, trans_b, form):
    a = _rand(*((k, m) if trans_a else (m, k)))
    b = _rand(*((n, k) if trans_b else (k, n)), seed=1)
    c = _rand(n, seed=2)
    a_str, b_str = (1, m) if trans_a else (k, 1), (1, k) if trans_b else (n, 1)
    assert _float_form(m, n, k, a_str, b_str) == form
    kernel = build_gemm(_spec(a), _spec(b), _spec(c), bool(trans_a), bool(trans_b),
                        alpha=0.5, beta=2.0)
    if form != "nest":
        _assert_vector_tiles(kernel)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = 0.5 * ((a64.T if trans_a else a64) @ (b64.T if trans_b else b64)) + 2.0 * c
    _close(load_kernel(kernel)(a, b, c)[0], want)


def test_both_vector_sides_are_chosen():
    """With both sides a panel or more, the cheaper packing: A'.T (64 x 768) rather than
    B' (768 x 3072), transposing or not; B' when it is the smaller."""
    assert _vector_side(64, 3072, (768, 1), (1, 768)) == "m"
    assert _vector_side(64, 3072, (768, 1), (3072, 1)) == "m"
    assert _vector_side(3072, 64, (768, 1), (64, 1)) == "n"
    assert _vector_side(1, 1000, (512, 1), (1, 512)) == "n"     # one row: vectors along n
    assert _vector_side(PANEL * 4, 3, (1, PANEL * 4), (1, 3)) == "m"


def test_batched_matmul_broadcasts():
    a, b = _rand(3, 1, 40, 50), _rand(4, 50, 70, seed=1)
    kernel = build_matmul(_spec(a), _spec(b))
    _assert_vector_tiles(kernel)
    _close(load_kernel(kernel)(a, b)[0], a.astype(np.float64) @ b)


def _conv64(x, w, bias, strides, pads, dilations, group):
    """Direct float64 convolution, any rank (1-D to 3-D): a sum over taps of strided
    slices of the padded input."""
    sp = x.ndim - 2
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] +
                [(pads[i], pads[i + sp]) for i in range(sp)])
    ksize = w.shape[2:]
    out_sp = [(xp.shape[2 + i] - (ksize[i] - 1) * dilations[i] - 1) // strides[i] + 1
              for i in range(sp)]
    cg, mg = x.shape[1] // group, w.shape[0] // group
    out = np.zeros((x.shape[0], w.shape[0], *out_sp))
    for tap in np.ndindex(*ksize):
        sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                   for t, d, o, s in zip(tap, dilations, out_sp, strides))
        for g in range(group):
            patch = xp[(slice(None), slice(g * cg, (g + 1) * cg), *sl)]
            wt = w[(slice(g * mg, (g + 1) * mg), slice(None), *tap)].astype(np.float64)
            out[:, g * mg:(g + 1) * mg] += np.einsum("nc...,mc->nm...", patch, wt)
    return out + bias.reshape(1, -1, *[1] * sp)


@pytest.mark.parametrize("x_shape,w_shape,strides,pads,dilations,group", [
    ((1, 16, 13, 11), (70, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 8, 30, 33), (12, 4, 3, 3), (2, 2), (1, 0, 2, 1), (1, 2), 2),
    ((1, 64, 9, 9), (30, 64, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((1, 3, 32, 32), (16, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),
    ((1, 32, 100), (8, 32, 5), (3,), (2, 1), (2,), 1),                       # 1-D
    ((1, 4, 6, 9, 9), (8, 4, 2, 3, 3), (1, 1, 1), (0, 1, 1, 1, 1, 0), (1, 1, 1), 1),
])
def test_conv_as_gemm_matches_float64(x_shape, w_shape, strides, pads, dilations, group):
    x, w, bias = _rand(*x_shape), _rand(*w_shape, seed=1), _rand(w_shape[0], seed=2)
    kernel = build_conv_float(_spec(x), _spec(w), _spec(bias), list(strides), list(pads),
                              list(dilations), group)
    _assert_vector_tiles(kernel)
    _close(load_kernel(kernel)(x, w, bias)[0],
           _conv64(x, w, bias, strides, pads, dilations, group))
