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
* ``values``: float32 per slot; for int8 the slots go in *groups* of ``group`` (``S``
  rounded up to a multiple), one int32 per group, which the kernel broadcasts as one
  32-bit value to feed its dot products: with byte dot products (``group`` 4,
  :func:`host_byte_dots`: x86 ``vpdpbusd``) the four weights as int8, else (``group``
  2, ``pmaddwd``-style pair products) the two weights as int16 (low half first). With
  byte dot products the kernel's inputs are unsigned bytes ``x + 128``, so each row's
  sum is off by ``128 * sum(w)``: the ``rows`` int32 after the groups hold
  ``-128 * sum(w)`` per row.

A slot thus costs 3 to 4 bytes of constant data (int8: 2 of index, 1 or 2 of value),
about 2 bytes per dense weight at 2:4: the stream the kernel reads once per tile of
columns.

**Chunks.** The reduction runs in chunks of whole pairs (fours for byte dot products)
of groups (input channels ``[j * Cc, (j + 1) * Cc)``, every tap) whose rows of one
tile of ``X`` fit :data:`L1_BUDGET`: the kernel runs every output row over one chunk
before the next (the partial sums wait in a scratch buffer), so the rows of ``X`` they
read come from L1. Slots sorted by ``k`` make each chunk's slots one contiguous range
of ``chunk_slots`` per row (the last chunk has the rest). Both arrays are stored flat,
chunk-major (chunk by chunk, row by row inside one): the order the kernel reads them.

**Vector width.** The width kernels are built for (:func:`.vector_width.host_vector_bits`:
the host's, or another CPU's when its IR variant is built) sets how many
columns (output pixels, or a dense layer's rows) one vector holds (:func:`vector_lanes`)
and so the *tile*, the columns one output row accumulates in
registers, :data:`TILE_VECTORS` vectors: float32 4 x 16 = 64 columns with AVX-512, 4 x 8
= 32 with AVX2, 4 x 4 = 16 with a 128-bit NEON board CPU; int8 pairs (columns as int16)
4 x 32 = 128, 4 x 16 = 64, 4 x 8 = 32; int8 byte dot products (columns as bytes) 2 x 64
= 128. With few columns the vectors narrow to what they fill (down to 128 bits). The
layout depends on the width only through ``lanes`` and the chunking, and the kernel is
correct on any host (LLVM splits wider vectors), layouts in fours too: their kernel IR
does its byte dot products in plain arithmetic, which the JIT replaces by ``vpdpbusd``
on a host with AVX512-VNNI (:mod:`.sparse_dots`; LLVM does not form it from plain IR);
elsewhere they stay correct, slower than pairs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.errors import CpuKernelError
from tessera.sparsity import nm_groups

from .vector_width import host_features, host_vector_bits

__all__ = ["L1_BUDGET", "NMLayout", "ROW_BLOCK", "TILE_VECTORS", "host_byte_dots", "nm_layout",
           "nm_slots", "vector_lanes"]

#: Vectors of columns one output row accumulates at a time (the register tile), by
#: slots per value word (float32 1, int8 pairs 2, int8 byte dot products 4). With
#: :data:`ROW_BLOCK` rows at once, 8 independent accumulator chains hide the
#: multiply-add latency (int8: ``group`` int32 accumulators per vector) and fit AVX2's
#: 16 registers with the operands. (Measured on the Zen 5 dev host: int8 pairs 4 x 1 row
#: and 2 x 2 rows within noise of each other, 4 x 1 slightly ahead.)
TILE_VECTORS = {1: 4, 2: 4, 4: 2}
#: Output rows computed together (each its own slots, the same count).
ROW_BLOCK = {"float32": 2, "int8": 1}
#: Bytes of the input matrix one reduction chunk of one tile may span: the rows all
#: output rows read in turn stay in L1 (32 KiB on Zen 4 and a Cortex-A9, 48 on Zen 5).
L1_BUDGET = 24 * 1024


def host_byte_dots() -> bool:
    """Whether the host has dot products of bytes into int32 at every vector width
    (AVX512-VNNI with VL): the int8 layouts then take the slots in fours, and the JIT
    compiles their byte dot products to ``vpdpbusd`` (:mod:`.sparse_dots`)."""
    f = host_features()
    return all(f.get(name) for name in ("avx512vnni", "avx512vl", "avx512bw"))


def vector_lanes(kind: str, vector_bits: int, group: int = 2) -> int:
    """Columns one vector holds: float32 lanes; for the int8 kernels int16 lanes
    (``group`` 2: inputs widened to int16 so pairs of products sum in int32) or bytes
    (``group`` 4: byte dot products)."""
    return vector_bits // 32 * (1 if kind == "float32" else group)


@dataclass(frozen=True)
class NMLayout:
    """One weight in the kernels' compressed layout (see the module docstring)."""

    kind: str                  # "float32" or "int8"
    pattern: tuple[int, int]   # (n, m)
    rows: int                  # O
    reduction: int             # K
    slots: int                 # S per row (a multiple of group)
    lanes: int                 # columns per vector (see vector_lanes)
    group: int                 # slots per value word: 1 (float32), 2 or 4 (int8)
    chunk_slots: int           # slots per reduction chunk (all but the last chunk)
    chunks: int                # reduction chunks (see the module docstring)
    values: np.ndarray
    offsets: np.ndarray

    @property
    def tile_vectors(self) -> int:
        """Vectors of columns per tile (:data:`TILE_VECTORS`)."""
        return TILE_VECTORS[self.group]

    @property
    def tile(self) -> int:
        """Columns per tile: the register tile of one output row."""
        return self.tile_vectors * self.lanes

    @property
    def density(self) -> float:
        """Multiply-adds kept per dense one."""
        return self.slots / self.reduction

    def row_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """``(k, value)``, each ``(O, S)``: every row's slots in order (the layout read
        back, for checks and tools)."""
        values = self.values
        if self.group > 1:
            words = self.rows * self.slots // self.group
            values = values[:words].view(np.int8 if self.group == 4 else np.int16)
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
              taps: int = 1, vector_bits: int | None = None,
              byte_dots: bool | None = None) -> NMLayout:
    """The layout of weight ``w`` (``(O, C, *kernel)`` with ``taps`` = the kernel's size,
    or ``(O, K)`` with ``taps`` 1), whose groups of ``m`` along axis 1 hold at most ``n``
    non-zeros, for an input matrix of ``pixels`` columns (output pixels per image, or
    a dense layer's rows) in vectors of ``vector_bits`` (default: the host's; narrower
    for few columns). ``kind`` "int8" groups the slots (``w`` must hold int8 values):
    in fours for byte dot products if ``byte_dots``, else in pairs; by default in fours
    where the host has them (:func:`host_byte_dots`) and the columns fill its widest
    byte vectors (:func:`_byte_dots_pay`)."""
    n, m = pattern
    bits = vector_bits or host_vector_bits()
    if byte_dots is None:
        byte_dots = host_byte_dots() and _byte_dots_pay(bits, pixels)
    group = 1 if kind == "float32" else 4 if byte_dots else 2
    lanes = _lanes(kind, bits, pixels, group)
    tile = TILE_VECTORS[group] * lanes
    o = w.shape[0]
    w3 = np.asarray(w).reshape(o, -1, taps)
    c = w3.shape[1]
    vals, k = nm_slots(w3, n, m, group)
    # Channels per chunk: whole runs of ``group`` groups (slot counts a multiple of
    # ``group``) whose rows of X (4 / group bytes per element) fit the L1 budget.
    run = group * m if group > 1 else 2 * m
    per_chunk = max(run, L1_BUDGET * group // (4 * tile * taps) // run * run)
    chunks = max(1, -(-c // per_chunk))
    chunk_slots = per_chunk * taps * n // m if chunks > 1 else k.shape[1]
    index = np.int16 if c * taps <= 2**15 else np.int32
    return NMLayout(kind, (n, m), o, c * taps, k.shape[1], lanes, group, chunk_slots,
                    chunks, _pack_values(_chunk_major(vals, chunk_slots), group, vals),
                    _chunk_major(k, chunk_slots).astype(index))


def _chunk_major(a: np.ndarray, chunk_slots: int) -> np.ndarray:
    """``(O, S)`` slots as one array, chunk by chunk, each chunk row by row: the order
    the kernel reads them (a sequential stream)."""
    parts = [a[:, i:i + chunk_slots].reshape(-1) for i in range(0, a.shape[1], chunk_slots)]
    return np.ascontiguousarray(np.concatenate(parts) if parts else a.reshape(-1))


def _byte_dots_pay(bits: int, pixels: int) -> bool:
    """Whether byte dot products beat int16 pairs: only on vectors as wide as the
    host's. With fewer columns the bytes would take narrower vectors than int16 pairs
    do, for no fewer instructions per column. (Measured on the dev host, int8 2:4 over
    the dense kernel, 768 x 3072: 16 rows pairs 1.42x / fours 1.00x, 32 rows 1.82x /
    1.57x, 48 rows 1.41x / 1.84x, 64 rows 1.84x / 2.31x.)"""
    return _lanes("int8", bits, pixels, 4) == vector_lanes("int8", bits, 4)


def _lanes(kind: str, bits: int, pixels: int, group: int) -> int:
    # Few columns (a dense layer's rows): vectors no wider than they fill (128 bits
    # at least), so no lanes are wasted.
    while bits > 128 and vector_lanes(kind, bits, group) >= 2 * max(pixels, 1):
        bits //= 2
    return vector_lanes(kind, bits, group)


def nm_slots(w3: np.ndarray, n: int, m: int,
             group: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Values and reduction indices ``k`` (both ``(O, S)``, sorted by ``k``) of the slots
    of ``w3 (O, C, taps)``: ``n`` per group, its non-zeros first, zeros after; ``S``
    padded (zero weights) to a multiple of ``group`` (default: 2 for int8, else 1)."""
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
    group = group or (2 if w3.dtype == np.int8 else 1)
    extra = -vals.shape[1] % group                     # int8 slots go in pairs or fours
    if extra:
        vals = np.concatenate([vals, np.zeros((o, extra), vals.dtype)], axis=1)
        k = np.concatenate([k, k[:, -1:].repeat(extra, axis=1)], axis=1)
    return vals, k


def _pack_values(flat: np.ndarray, group: int, rows: np.ndarray) -> np.ndarray:
    """The value words of the chunk-major slots ``flat``; for byte dot products, then
    the row corrections ``-128 * sum(w)`` of ``rows`` (``(O, S)``)."""
    if group == 1:
        return np.ascontiguousarray(flat, np.float32)
    if np.any((flat < -128) | (flat > 127)):
        raise CpuKernelError("N:M kernel: int8 weights must lie in [-128, 127]")
    if group == 4:
        words = flat.astype(np.int8).view(np.int32)          # four int8, low byte first
        fix = (-128 * rows.sum(axis=1, dtype=np.int64)).astype(np.int32)   # wraps
        return np.ascontiguousarray(np.concatenate([words, fix]))
    halves = flat.astype(np.int16).view(np.uint16).astype(np.uint32)
    pairs = halves[0::2] | (halves[1::2] << 16)             # little-endian int16 pairs
    return np.ascontiguousarray(pairs.view(np.int32))
