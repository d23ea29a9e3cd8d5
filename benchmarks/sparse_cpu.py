"""Benchmark the N:M sparse CPU kernels against their dense forms and numpy.

    python benchmarks/sparse_cpu.py [--quick] [--markdown] [--no-fail] [--repeats 7]

Layers: ResNet-18's 3x3 convolutions C2, C5, C8, C11 (references.md; batch 1, pads 1)
and dense layers (512 -> 1000 and 768 -> 3072 on 8 rows, 768 -> 3072 on 64), in int8
(int32 sums; dense kernels ``build_conv_int8`` / ``build_matmul_int8``) and float32
(``build_conv_float`` / ``build_gemm`` with transB), at 2:4 and 4:8 (and 1:4 without
``--quick``). The weights are random, magnitude-pruned to the pattern.

Per row: the dense kernel, the sparse kernel (its default threads, and forced onto one
thread: the ``thr`` and ``1-thr x`` columns), the speedup sparse / dense, numpy's time
(float: ``np.matmul`` on an im2col view for convs, ``a @ w.T`` for dense layers; int8:
the same in int32, which is what numpy does with integers) and the sparse kernel's
speedup over it (numpy's float matmul is its BLAS, OpenBLAS here, on up to 2 threads;
the kernels run on one). ``lowering``: the kernel the CPU lowering picks for the layer
(``sparse_lower.nm_matmul_kernel``; a few int8 rows get the pair kernel of
``compiler/cpu/sparse_pairs.py``), which is the sparse kernel timed. Timing: blocks of
calls, interleaved, median of ``--repeats`` blocks. ``ok``: int8 sparse results equal
the dense kernel's bit for bit, float ones numpy's (allclose). Target: 2:4 rows >= 1.5x
their dense kernel (issue 19); exit status 1 if one misses it or a result is wrong,
unless ``--no-fail``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tessera.compiler.cpu import (TensorSpec, build_conv_float, build_conv_int8, build_gemm,
                                  build_matmul_int8)
from tessera.compiler.cpu.sparse import build_conv_nm, build_matmul_nm
from tessera.compiler.cpu.sparse_layout import host_byte_dots, nm_layout
from tessera.compiler.cpu.vector_width import host_vector_bits
from tessera.compiler.cpu.sparse_lower import nm_matmul_kernel
from tessera.runtime.cpu import load_kernel

TARGET = 1.5
_BLOCK_SECONDS = 0.02
#: (name, (C_in, C_out, H=W)) of ResNet-18's 3x3 stride-1 convolutions.
CONVS = (("C2", (64, 64, 56)), ("C5", (128, 128, 28)), ("C8", (256, 256, 14)),
         ("C11", (512, 512, 7)))
#: (name, (K, N, rows)) of dense layers: a few rows (a small batch) and a sequence's worth.
DENSE = (("fc512x1000 M=8", (512, 1000, 8)), ("fc768x3072 M=8", (768, 3072, 8)),
         ("fc768x3072 M=64", (768, 3072, 64)))


@dataclass
class Row:
    layer: str
    dtype: str
    pattern: tuple[int, int]
    dense_us: float = float("nan")
    sparse_us: float = float("nan")
    serial_us: float = float("nan")
    numpy_us: float = float("nan")
    threads: int = 1
    lowered: str = "sparse"     # the kernel the CPU lowering picks for this layer
    error: str = ""

    @property
    def speedup(self) -> float:
        return self.dense_us / self.sparse_us

    @property
    def ok(self) -> bool:
        return not self.error and (self.pattern != (2, 4) or self.speedup >= TARGET)


def prune(w: np.ndarray, n: int, m: int) -> np.ndarray:
    """Magnitude pruning to n:m along axis 1 (the reduction axis of both weights)."""
    g = np.moveaxis(w, 1, -1).copy()
    groups = g.reshape(*g.shape[:-1], -1, m)
    np.put_along_axis(groups, np.argsort(-np.abs(groups), axis=-1)[..., n:], 0, axis=-1)
    return np.ascontiguousarray(np.moveaxis(groups.reshape(g.shape), -1, 1))


def _data(rng: np.random.Generator, kind: str, shape) -> np.ndarray:
    if kind == "int8":
        return rng.integers(-128, 128, shape, dtype=np.int8)
    return rng.standard_normal(shape).astype(np.float32)


def _im2col(x: np.ndarray) -> np.ndarray:
    """(C*9, H*W) patches of a 3x3 pad-1 stride-1 conv of one image."""
    c, h, w = x.shape[1:]
    xp = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(1, 2))
    return win.transpose(0, 3, 4, 1, 2).reshape(c * 9, h * w)


def conv_case(dims, kind: str, pattern, rng) -> tuple[Callable, Callable, Callable]:
    c, o, hw = dims
    x = _data(rng, kind, (1, c, hw, hw))
    w = prune(_data(rng, kind, (o, c, 3, 3)), *pattern)
    xs, ws = TensorSpec(x.shape, kind), TensorSpec(w.shape, kind)
    lay = nm_layout(w, pattern, hw * hw, kind, taps=9)
    sparse = load_kernel(build_conv_nm(xs, lay, (3, 3), False, (1, 1), (1, 1, 1, 1)))
    if kind == "int8":
        dense = load_kernel(build_conv_int8(xs, ws, False, (1, 1), (1, 1, 1, 1)))
    else:
        dense = load_kernel(build_conv_float(xs, ws, None, [1, 1], [1, 1, 1, 1], [1, 1]))
    acc = np.int32 if kind == "int8" else np.float32
    w2 = w.reshape(o, -1).astype(acc)

    def numpy_fn():
        return (w2 @ _im2col(x).astype(acc)).reshape(1, o, hw, hw)
    return (lambda: dense(x, w)[0], _Sparse(sparse, x, lay), numpy_fn)


def dense_case(dims, kind: str, pattern, rng) -> tuple[Callable, Callable, Callable]:
    """A dense layer ``a [rows, K] @ w.T``; the sparse kernel is the one the lowering
    picks (``sparse_lower.nm_matmul_kernel``: the column kernel, or for a few int8 rows
    the pair kernel), the column kernel where the lowering keeps the dense one."""
    k, n, rows = dims
    a = _data(rng, kind, (rows, k))
    w = prune(_data(rng, kind, (n, k)), *pattern)
    spec = TensorSpec(a.shape, kind)
    build, lay = nm_matmul_kernel(spec, w) or _column_kernel(spec, w, pattern)
    sparse = _Sparse(load_kernel(build()), a, lay)
    if kind == "int8":
        wt = np.ascontiguousarray(w.T)
        dense_k = load_kernel(build_matmul_int8(spec, TensorSpec(wt.shape, kind)))
        w32 = wt.astype(np.int32)
        return lambda: dense_k(a, wt)[0], sparse, lambda: a.astype(np.int32) @ w32
    dense_k = load_kernel(build_gemm(spec, TensorSpec(w.shape, kind), None, False, True))
    return lambda: dense_k(a, w)[0], sparse, lambda: a @ w.T


def _column_kernel(spec: TensorSpec, w: np.ndarray, pattern):
    lay = nm_layout(w, pattern, spec.shape[0], spec.dtype)
    return (lambda: build_matmul_nm(spec, lay)), lay


class _Sparse:
    """The sparse kernel's call on fixed arrays; ``serial()`` forced onto one thread."""

    def __init__(self, loaded, x: np.ndarray, lay, threads: int | None = None) -> None:
        self.loaded, self.x, self.lay, self.forced = loaded, x, lay, threads
        self.threads = loaded.threads if threads is None else threads

    def __call__(self) -> np.ndarray:
        return self.loaded(self.x, self.lay.values, self.lay.offsets, threads=self.forced)[0]

    def serial(self) -> "_Sparse":
        return _Sparse(self.loaded, self.x, self.lay, 1)


def _lowered(case, dims, kind: str, pattern) -> str:
    """The kernel the CPU lowering picks for the layer with an n:m weight."""
    if case is conv_case:
        return "conv_nm"
    n, m = pattern
    w = (np.arange(dims[0]) % m < n).astype(kind)[None, :].repeat(4, axis=0)
    chosen = nm_matmul_kernel(TensorSpec((dims[2], dims[0]), kind), w)
    return "dense" if chosen is None else chosen[0]().name


def check(kind: str, dense: np.ndarray, sparse: np.ndarray, reference: np.ndarray) -> str:
    """'' if right: int8 bit-identical to the dense kernel (and numpy), float close."""
    if kind == "int8":
        if not np.array_equal(sparse, dense) or not np.array_equal(sparse, reference):
            return f"{np.count_nonzero(sparse != dense)} elements differ from dense"
        return ""
    scale = max(1.0, float(np.abs(reference).max()))
    if not np.allclose(sparse, reference, rtol=1e-4, atol=1e-5 * scale):
        return f"max abs error {np.abs(sparse - reference).max():.3g}"
    return ""


def _calls_per_block(fn: Callable) -> int:
    start = time.perf_counter()
    fn()
    return max(1, int(_BLOCK_SECONDS / max(time.perf_counter() - start, 1e-7)))


def _block_us(fn: Callable, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def run_row(row: Row, fns: tuple[Callable, Callable, Callable], repeats: int) -> Row:
    dense_fn, sparse_fn, numpy_fn = fns
    row.error = check(row.dtype, dense_fn(), sparse_fn(), numpy_fn())
    if row.error:
        return row
    row.threads = sparse_fn.threads
    timed = [dense_fn, sparse_fn, sparse_fn.serial(), numpy_fn]
    calls = [_calls_per_block(fn) for fn in timed]
    samples: list[list[float]] = [[] for _ in timed]
    for _ in range(repeats):     # interleaved, so background load hits all alike
        for k, (fn, n) in enumerate(zip(timed, calls)):
            samples[k].append(_block_us(fn, n))
    row.dense_us, row.sparse_us, row.serial_us, row.numpy_us = (
        statistics.median(s) for s in samples)
    return row


HEADER = ("layer", "dtype", "N:M", "dense us", "sparse us", "sparse/dense", "thr",
          "1-thr x", "numpy us", "vs numpy", "lowering", "ok")


def _cells(r: Row) -> tuple[str, ...]:
    nm = f"{r.pattern[0]}:{r.pattern[1]}"
    if r.error:
        return (r.layer, r.dtype, nm, *["-"] * 7, r.lowered, f"FAIL ({r.error})")
    return (r.layer, r.dtype, nm, f"{r.dense_us:.0f}", f"{r.sparse_us:.0f}",
            f"{r.speedup:.2f}x", str(r.threads), f"{r.dense_us / r.serial_us:.2f}x",
            f"{r.numpy_us:.0f}", f"{r.numpy_us / r.sparse_us:.2f}x", r.lowered,
            "pass" if r.ok else ("FAIL" if r.pattern == (2, 4) else "-"))


def format_table(rows: list[Row], markdown: bool) -> str:
    cells = [HEADER, *(_cells(r) for r in rows)]
    if markdown:
        lines = ["| " + " | ".join(c) + " |" for c in cells]
        lines.insert(1, "|" + "|".join("---:" if 3 <= k <= 9 else "---"
                                       for k in range(len(HEADER))) + "|")
        return "\n".join(lines)
    widths = [max(len(c[k]) for c in cells) for k in range(len(HEADER))]
    lines = ["  ".join(v.rjust(w) if 3 <= k <= 9 else v.ljust(w)
                       for k, (v, w) in enumerate(zip(c, widths))) for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2:4 and 4:8 only, 3 repeats")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--no-fail", action="store_true", help="exit 0 even if a target is missed")
    ap.add_argument("--repeats", type=int, default=7, help="timed blocks per kernel (median)")
    args = ap.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    patterns = ((2, 4), (4, 8)) if args.quick else ((2, 4), (4, 8), (1, 4))
    rng = np.random.default_rng(0)
    rows = []
    for kind in ("int8", "float32"):
        for layers, case in ((CONVS, conv_case), (DENSE, dense_case)):
            for name, dims in layers:
                for pattern in patterns:
                    row = Row(name, kind, pattern, lowered=_lowered(case, dims, kind, pattern))
                    row = run_row(row, case(dims, kind, pattern, rng), repeats)
                    rows.append(row)
                    print(f"  {name} {kind} {pattern}: done", file=sys.stderr, flush=True)
    print(f"host vectors: {host_vector_bits()} bits; int8 byte dot products (AVX512-VNNI): "
          f"{'yes' if host_byte_dots() else 'no'}")
    print(format_table(rows, args.markdown))
    failed = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(failed)}/{len(rows)} rows right and on target "
          f"(2:4 >= {TARGET}x dense)")
    return 1 if failed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
