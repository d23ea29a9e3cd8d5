"""The weight sparsity patterns Tessera's backends exploit, defined once.

Two patterns, each the unit of work one backend can skip:

* **Blocks** (the accelerator): a convolution or dense weight ``(O, I, *taps)`` is cut
  into ``block_out x block_in`` tiles per kernel tap -- the GEMM core's weight block.
  A tile of zeros is a GEMM operation the core need not run and 256 bytes it need not
  load. :func:`weight_blocks` views the weight as those tiles, :func:`nonzero_blocks` is
  their mask and :func:`block_density` the fraction kept.
* **N:M** (the CPU): along the reduction axis (a convolution's input channels, a dense
  layer's inputs), every group of ``m`` consecutive weights holds at most ``n``
  non-zeros (NVIDIA's 2:4). :func:`nm_groups` views the weight as those groups,
  :func:`is_nm_sparse` checks the pattern and :func:`nm_pattern` finds the sparsest of
  :data:`NM_PATTERNS` a weight meets.

The pruner (:mod:`tessera.compress`) makes weights of these patterns; the compiler
detects them from the weights alone, so a model pruned by any tool benefits.
numpy only.
"""
from __future__ import annotations

import numpy as np

#: The N:M patterns the CPU backend has kernels for, sparsest first.
NM_PATTERNS: tuple[tuple[int, int], ...] = ((1, 4), (2, 8), (2, 4), (4, 8))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def weight_blocks(w: np.ndarray, block_out: int, block_in: int) -> np.ndarray:
    """``(O, I, *taps)`` -> ``(OB, IB, *taps, block_out, block_in)``: the weight's GEMM
    blocks per tap, channels zero-padded to whole blocks (a 2-D dense weight has no taps)."""
    w = np.asarray(w)
    o, i = w.shape[:2]
    taps = w.shape[2:]
    ob, ib = _ceil_div(o, block_out), _ceil_div(i, block_in)
    padded = np.zeros((ob * block_out, ib * block_in, *taps), w.dtype)
    padded[:o, :i] = w
    blocks = padded.reshape(ob, block_out, ib, block_in, *taps)
    order = (0, 2, *range(4, 4 + len(taps)), 1, 3)
    return blocks.transpose(order)


def nonzero_blocks(w: np.ndarray, block_out: int, block_in: int) -> np.ndarray:
    """``(OB, IB, *taps)`` bool: which blocks of :func:`weight_blocks` hold a non-zero."""
    return np.any(weight_blocks(w, block_out, block_in) != 0, axis=(-2, -1))


def block_density(w: np.ndarray, block_out: int, block_in: int) -> float:
    """Fraction of the weight's GEMM blocks (per tap) that hold a non-zero."""
    mask = nonzero_blocks(w, block_out, block_in)
    return float(mask.mean()) if mask.size else 1.0


def nm_groups(w: np.ndarray, m: int, axis: int = 1) -> np.ndarray:
    """The weight with ``axis`` (the reduction axis) cut into groups of ``m``: shape
    ``(..., size // m, m)`` with ``axis`` moved last. ``size`` must divide by ``m``."""
    w = np.moveaxis(np.asarray(w), axis, -1)
    if w.shape[-1] % m:
        raise ValueError(f"reduction axis of {w.shape[-1]} is not a multiple of {m}")
    return w.reshape(*w.shape[:-1], w.shape[-1] // m, m)


def is_nm_sparse(w: np.ndarray, n: int, m: int, axis: int = 1) -> bool:
    """Every group of ``m`` consecutive weights along ``axis`` has at most ``n`` non-zeros
    (False when the axis does not divide into groups of ``m``)."""
    size = np.asarray(w).shape[axis]
    if size % m or size == 0:
        return False
    return bool(np.all(np.count_nonzero(nm_groups(w, m, axis), axis=-1) <= n))


def nm_pattern(w: np.ndarray, axis: int = 1) -> tuple[int, int] | None:
    """The sparsest pattern of :data:`NM_PATTERNS` the weight meets along ``axis``, or
    ``None`` (dense, or no pattern fits the axis)."""
    for n, m in NM_PATTERNS:
        if is_nm_sparse(w, n, m, axis):
            return n, m
    return None
