"""The compressed weight layout of the N:M sparse CPU kernels (:mod:`.sparse`), computed
at compile time in numpy.

A weight is seen as an ``(O, K)`` matrix of output rows by reduction index (a
convolution's ``k = c * taps + tap``, the order of ``w.reshape(O, -1)``; a dense layer's
inputs), cut into N:M groups exactly as :mod:`tessera.sparsity` defines them: ``m``
consecutive input channels for each output channel and tap. Each group keeps ``n``
*slots* (its non-zeros, then zero-valued slots if it has fewer), so every row has the
same number of slots ``S = K * n / m`` and the kernel's loops have constant bounds.
Per row the slots are sorted by ``k``, so the rows of the input matrix they read come in
memory order.

* ``offsets``: each slot's ``k`` (int16 when ``K <= 32768``, else int32), the row of the
  kernel's input matrix ``X`` it multiplies.
* ``values``: float32 per slot; for int8 the slots paired (``S`` rounded up to even),
  one int32 per pair holding the two weights as int16 (low half first), which the
  kernel broadcasts as one 32-bit value to feed ``pmaddwd``-style pair products.

A slot thus costs 4 bytes of constant data (int8: 2 of index, 2 of value), 2 bytes per
dense weight at 2:4: the stream the kernel reads once per tile of columns.

**Chunks.** The reduction runs in chunks of whole pairs of groups (input channels
``[j * Cc, (j + 1) * Cc)``, every tap) whose rows of one tile of ``X`` fit
:data:`L1_BUDGET`: the kernel runs every output row over one chunk before the next (the
partial sums wait in a scratch buffer), so the rows of ``X`` they read come from L1.
Slots sorted by ``k`` make each chunk's slots one contiguous range of ``chunk_slots``
per row (the last chunk has the rest). Both arrays are stored flat, chunk-major (chunk
by chunk, row by row inside one): the order the kernel reads them.

**Vector width.** The host's (:func:`host_vector_bits`, LLVM's view of its features)
sets how many columns (output pixels, or a dense layer's rows) one vector holds
(:func:`vector_lanes`) and so the *tile*, the columns one output row accumulates in
registers, :data:`TILE_VECTORS` vectors: float32 4 x 16 = 64 columns with AVX-512, 4 x 8
= 32 with AVX2, 4 x 4 = 16 with a 128-bit NEON board CPU; int8 (columns as int16) 4 x 32
= 128, 4 x 16 = 64, 4 x 8 = 32. With few columns the vectors narrow to what they fill
(down to 128 bits). The layout depends on the width only through ``lanes`` and the
chunking, and the kernel is correct on any host (LLVM splits wider vectors).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tessera.errors import CpuKernelError
from tessera.sparsity import nm_groups

__all__ = ["L1_BUDGET", "NMLayout", "ROW_BLOCK", "TILE_VECTORS", "host_vector_bits",
           "nm_layout", "nm_slots", "vector_lanes"]

#: Vectors of columns one output row accumulates at a time (the register tile). With
#: :data:`ROW_BLOCK` rows at once, 8 independent accumulator chains hide the
#: multiply-add latency (int8: two int32 accumulators per vector) and fit AVX2's 16
#: registers with the operands. (Measured on the Zen 5 dev host: int8 4 x 1 row and 2 x
#: 2 rows within noise of each other, 4 x 1 slightly ahead.)
TILE_VECTORS = {"float32": 4, "int8": 4}
#: Output rows computed together (each its own slots, the same count).
ROW_BLOCK = {"float32": 2, "int8": 1}
#: Bytes of the input matrix one reduction chunk of one tile may span: the rows all
#: output rows read in turn stay in L1 (32 KiB on Zen 4 and a Cortex-A9, 48 on Zen 5).
L1_BUDGET = 24 * 1024


@lru_cache(maxsize=None)
def host_vector_bits() -> int:
    """Width of the host's widest vector registers as LLVM sees them: 512 with
    AVX-512 (F and BW), 256 with AVX2, else 128 (SSE, a board's NEON)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    features = llvm.get_host_cpu_features()
    if features.get("avx512f") and features.get("avx512bw"):
        return 512
    if features.get("avx2"):
        return 256
    return 128


def vector_lanes(kind: str, vector_bits: int) -> int:
    """Columns one vector holds: float32 lanes, or int16 lanes for the int8 kernels
    (inputs widened to int16 so pairs of products sum in int32)."""
    return vector_bits // (32 if kind == "float32" else 16)


@dataclass(frozen=True)
class NMLayout:
    """One weight in the kernels' compressed layout (see the module docstring)."""

    kind: str                  # "float32" or "int8"
    pattern: tuple[int, int]   # (n, m)
    rows: int                  # O
    reduction: int             # K
    slots: int                 # S per row (even for int8)
    lanes: int                 # columns per vector (see vector_lanes)
    chunk_slots: int           # slots per reduction chunk (all but the last chunk)
    chunks: int                # reduction chunks (see the module docstring)
    values: np.ndarray
    offsets: np.ndarray

    @property
    def tile(self) -> int:
        """Columns per tile: the register tile of one output row."""
        return TILE_VECTORS[self.kind] * self.lanes

    @property
    def density(self) -> float:
        """Multiply-adds kept per dense one."""
        return self.slots / self.reduction

    def row_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """``(k, value)``, each ``(O, S)``: every row's slots in order (the layout read
        back, for checks and tools)."""
        values = self.values if self.kind == "float32" else self.values.view(np.int16)
        out = []
        for flat in (self.offsets, values):
            parts, at = [], 0
            for first in range(0, self.slots, self.chunk_slots):
                count = min(self.chunk_slots, self.slots - first)
                parts.append(flat[at:at + self.rows * count].reshape(self.rows, count))
                at += self.rows * count
            out.append(np.concatenate(parts, axis=1).astype(flat.dtype))
        return out[0], out[1]


def nm_layout(w: np.ndarray, pattern: tuple[int, int], pixels: int, kind: str,
              taps: int = 1, vector_bits: int | None = None) -> NMLayout:
    """The layout of weight ``w`` (``(O, C, *kernel)`` with ``taps`` = the kernel's size,
    or ``(O, K)`` with ``taps`` 1), whose groups of ``m`` along axis 1 hold at most ``n``
    non-zeros, for an input matrix of ``pixels`` columns (output pixels per image, or
    a dense layer's rows) in vectors of ``vector_bits`` (default: the host's; narrower
    for few columns). ``kind`` "int8" pairs the slots (``w`` must hold int8 values)."""
    n, m = pattern
    lanes = _lanes(kind, vector_bits or host_vector_bits(), pixels)
    tile = TILE_VECTORS[kind] * lanes
    o = w.shape[0]
    w3 = np.asarray(w).reshape(o, -1, taps)
    c = w3.shape[1]
    vals, k = nm_slots(w3, n, m)
    # Channels per chunk: whole pairs of groups (even slot counts for int8 pairs) whose
    # rows of X fit the L1 budget.
    element = 4 if kind == "float32" else 2
    per_chunk = max(2 * m, L1_BUDGET // (tile * element * taps) // (2 * m) * (2 * m))
    chunks = max(1, -(-c // per_chunk))
    chunk_slots = per_chunk * taps * n // m if chunks > 1 else k.shape[1]
    index = np.int16 if c * taps <= 2**15 else np.int32
    return NMLayout(kind, (n, m), o, c * taps, k.shape[1], lanes, chunk_slots,
                    chunks, _pack_values(_chunk_major(vals, chunk_slots), kind),
                    _chunk_major(k, chunk_slots).astype(index))


def _chunk_major(a: np.ndarray, chunk_slots: int) -> np.ndarray:
    """``(O, S)`` slots as one array, chunk by chunk, each chunk row by row: the order
    the kernel reads them (a sequential stream)."""
    parts = [a[:, i:i + chunk_slots].reshape(-1) for i in range(0, a.shape[1], chunk_slots)]
    return np.ascontiguousarray(np.concatenate(parts) if parts else a.reshape(-1))


def _lanes(kind: str, bits: int, pixels: int) -> int:
    # Few columns (a dense layer's rows): vectors no wider than they fill (128 bits
    # at least), so no lanes are wasted.
    while bits > 128 and vector_lanes(kind, bits) >= 2 * max(pixels, 1):
        bits //= 2
    return vector_lanes(kind, bits)


def nm_slots(w3: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Values and reduction indices ``k`` (both ``(O, S)``, sorted by ``k``) of the slots
    of ``w3 (O, C, taps)``: ``n`` per group, its non-zeros first, zeros after."""
    o, c, taps = w3.shape
    if c % m:
        raise CpuKernelError(f"N:M kernel: {c} input channels do not divide into groups "
                             f"of {m}")
    groups = nm_groups(w3, m, axis=1)                       # (O, taps, C/m, m)
    if np.any(np.count_nonzero(groups, axis=-1) > n):
        raise CpuKernelError(f"N:M kernel: the weight has a group of {m} with more than "
                             f"{n} non-zeros")
    pos = np.argsort(groups == 0, axis=-1, kind="stable")[..., :n]
    vals = np.take_along_axis(groups, pos, axis=-1)
    chan = np.arange(c // m)[None, None, :, None] * m + pos
    k = chan * taps + np.arange(taps)[None, :, None, None]
    vals, k = vals.reshape(o, -1), k.reshape(o, -1)
    order = np.argsort(k, axis=1, kind="stable")
    vals, k = np.take_along_axis(vals, order, 1), np.take_along_axis(k, order, 1)
    if w3.dtype == np.int8 and vals.shape[1] % 2:   # int8 slots go in pairs
        vals = np.concatenate([vals, np.zeros((o, 1), vals.dtype)], axis=1)
        k = np.concatenate([k, k[:, -1:]], axis=1)
    return vals, k


def _pack_values(vals: np.ndarray, kind: str) -> np.ndarray:
    if kind == "float32":
        return np.ascontiguousarray(vals, np.float32)
    if np.any((vals < -128) | (vals > 127)):
        raise CpuKernelError("N:M kernel: int8 weights must lie in [-128, 127]")
    halves = vals.astype(np.int16).view(np.uint16).astype(np.uint32)
    pairs = halves[0::2] | (halves[1::2] << 16)             # little-endian int16 pairs
    return np.ascontiguousarray(pairs.view(np.int32))
