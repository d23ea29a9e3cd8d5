"""Magnitude pruning of one ``(O, I, *taps)`` weight to the patterns of
:mod:`tessera.sparsity`: the accelerator's GEMM weight blocks, or N:M groups.

A :class:`Pattern` says which sparsities a layer can take and prunes a weight to one; the
pattern itself (which weights form a block or a group) comes from :mod:`tessera.sparsity`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.config import HwConfig
from tessera.sparsity import NM_PATTERNS, block_density, is_nm_sparse, nm_groups, weight_blocks

__all__ = ["BLOCK_SPARSITIES", "Pattern", "block_pattern", "nm_pattern_named",
           "pattern_names"]

#: The block sparsities the DP chooses from per layer: halving the kept blocks from 1/2 on,
#: with 1/4 and 5/8 between, so that a layer can give a little without giving half.
BLOCK_SPARSITIES = (0.0, 0.25, 0.5, 0.625, 0.75, 0.875, 0.9375)


@dataclass(frozen=True)
class Pattern:
    """A pruning pattern: ``block_out x block_in`` blocks, or ``n:m`` groups."""

    name: str
    block: tuple[int, int] | None = None     #: (block_out, block_in) for blocks
    nm: tuple[int, int] | None = None        #: (n, m) for N:M

    def candidates(self, w: np.ndarray) -> tuple[float, ...]:
        """The sparsities an ``(O, I, *taps)`` weight can be pruned to (0 first)."""
        if self.block:
            return BLOCK_SPARSITIES
        n, m = self.nm
        return (0.0, 1 - n / m) if w.shape[1] % m == 0 else (0.0,)

    def prune(self, w: np.ndarray, sparsity: float) -> np.ndarray:
        """A copy of ``w`` (``(O, I, *taps)``) with the pattern's smallest units zeroed:
        ``round(sparsity x blocks)`` blocks of least L2 norm, or (any ``sparsity`` > 0)
        all but the ``n`` largest magnitudes of each group of ``m``."""
        if sparsity <= 0:
            return w.copy()
        if self.block:
            return prune_blocks(w, sparsity, *self.block)
        return prune_nm(w, *self.nm)

    def density(self, w: np.ndarray) -> float:
        """The fraction of the backend's work kept: the non-zero blocks, or ``n/m`` for a
        weight of the N:M pattern (the CPU kernel multiplies ``n`` of each ``m``)."""
        if self.block:
            return block_density(w, *self.block)
        n, m = self.nm
        return n / m if is_nm_sparse(w, n, m, axis=1) else 1.0


def pattern_names() -> tuple[str, ...]:
    """Every pattern name :func:`prune` takes."""
    return ("block", *(f"{n}:{m}" for n, m in NM_PATTERNS))


def block_pattern(config: HwConfig) -> Pattern:
    """The accelerator's weight blocks for ``config``."""
    return Pattern("block", block=(config.block_out, config.block_in))


def nm_pattern_named(name: str) -> Pattern | None:
    """The N:M pattern ``name`` (``"2:4"``), or None if it is not one of NM_PATTERNS."""
    for n, m in NM_PATTERNS:
        if name == f"{n}:{m}":
            return Pattern(name, nm=(n, m))
    return None


def prune_blocks(w: np.ndarray, sparsity: float, block_out: int, block_in: int) -> np.ndarray:
    """Zero the ``round(sparsity x count)`` blocks of least L2 norm (ties by position)."""
    blocks = weight_blocks(w, block_out, block_in)
    norms = np.sqrt(np.sum(np.square(blocks, dtype=np.float64), axis=(-2, -1)))
    drop = int(round(sparsity * norms.size))
    keep = np.ones(norms.size, bool)
    keep[np.argsort(norms, axis=None, kind="stable")[:drop]] = False
    keep = keep.reshape(norms.shape)                        # (OB, IB, *taps)
    # back to weight positions: each block's flag over its block_out x block_in weights
    per_weight = np.repeat(np.repeat(keep, block_out, axis=0), block_in, axis=1)
    o, i = w.shape[:2]
    return np.where(per_weight[:o, :i], w, np.zeros((), w.dtype))


def prune_nm(w: np.ndarray, n: int, m: int) -> np.ndarray:
    """Keep the ``n`` largest magnitudes of each group of ``m`` along axis 1 (ties by
    position)."""
    groups = nm_groups(w, m, axis=1)                        # (O, *taps, I // m, m)
    order = np.argsort(-np.abs(groups), axis=-1, kind="stable")
    keep = np.zeros(groups.shape, bool)
    np.put_along_axis(keep, order[..., :n], True, axis=-1)
    pruned = np.where(keep, groups, np.zeros((), w.dtype))
    flat = pruned.reshape(*groups.shape[:-2], -1)           # (O, *taps, I)
    return np.moveaxis(flat, -1, 1)
