"""Benchmark the llvmlite CPU fallback kernels against numpy on the same data.

    python benchmarks/cpu_kernels.py [--repeats 9] [--filter softmax] [--markdown]
                                     [--no-fail] [--user-cache]

Cases come from ``cpu_cases_math.py`` (elementwise, reductions, softmax, layer norm)
and ``cpu_cases_data.py`` (layout, pooling, resize, conv), each a list of
``cpu_case.Case``. For every case the kernel's result is first checked against numpy's
(allclose for floats, exact for integers), then both are timed in the same process in
``--repeats`` rounds, each a block of numpy calls then a block of kernel calls (each
block long enough to be measurable): the times shown are the rounds' medians, the ratio
the median of the rounds' numpy / kernel ratios (the two blocks of a round run back to
back, so a change of load on the shared host hits both alike). The JIT compile happens
in the case's setup and is reported separately.
By default kernels compile into a fresh temporary cache so the compile times are real;
``--user-cache`` uses the normal one.

Kernels that run on several threads (large work with a parallel form, see
``tessera.runtime.cpu``) are also timed forced onto one thread: the ``threads`` and
``1-thread ratio`` columns show which ratios come from parallelism. The target applies
to the default (automatic threads) ratio.

Target: numpy / kernel time >= 1.0 for every case, >= 2.0 for fused chains of three or
more elementwise ops (numpy makes a temporary per op, the kernel one pass). Exit status
1 if a target is missed or a result is wrong, unless ``--no-fail``.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from statistics import median
from typing import Callable

import numpy as np

from cpu_case import Case, KernelCall

CASE_MODULES = ("cpu_cases_math", "cpu_cases_data")
_BLOCK_SECONDS = 0.02     # each timed block of calls lasts at least this long
#: Untimed calls before each timed block of a case whose kernel runs on several
#: threads, for this long. numpy's BLAS (OpenBLAS) leaves its worker threads spinning
#: for ~0.1-0.2 s after a call, and a kernel block started in that window shares the
#: second core with them; a pause instead lets this VM's idle vCPUs fall into a state
#: they are slow to wake from. 64x768 @ 768x3072 on 2 threads here: 1.64 ms called in a
#: loop, 2.67 ms right after numpy's block, 3.37 ms after a 0.15 s pause, 1.66-1.71 ms
#: after 0.2 s of its own calls (numpy 1.93-2.25 ms after 0.2 s of its own).
_WARM_SECONDS = 0.2


@dataclass
class Row:
    case: Case
    numpy_us: float = float("nan")
    kernel_us: float = float("nan")
    compile_ms: float = float("nan")
    serial_us: float = float("nan")     # the kernel forced onto one thread
    ratio: float = float("nan")         # median over rounds of numpy / kernel
    serial_ratio: float = float("nan")
    threads: int = 1
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.ratio >= self.case.target


def load_cases(name_filter: str | None) -> tuple[list[Case], list[str]]:
    """All cases of the case modules that exist, and notes about missing modules."""
    cases, notes = [], []
    for mod in CASE_MODULES:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise
            notes.append(f"{mod}.py not found: its cases are skipped")
            continue
        cases += module.CASES
    if name_filter:
        cases = [c for c in cases if name_filter in f"{c.op} {c.shape} {c.dtype}"]
    return cases, notes


def _as_arrays(result: object) -> list[np.ndarray]:
    if isinstance(result, (tuple, list)):
        return [np.asarray(r) for r in result]
    return [np.asarray(result)]


def check_result(want: object, got: object) -> str:
    """'' if the kernel's result matches numpy's, else what differs."""
    want_l, got_l = _as_arrays(want), _as_arrays(got)
    if len(want_l) != len(got_l):
        return f"{len(got_l)} results, numpy gives {len(want_l)}"
    for w, g in zip(want_l, got_l):
        if w.shape != g.shape or w.dtype != g.dtype:
            return f"got {g.dtype}{g.shape}, numpy gives {w.dtype}{w.shape}"
        if w.dtype.kind == "f":
            # Absolute slack scaled by the output's magnitude: float sums are rounded
            # differently (pairwise vs vector partial sums) and results near 0 after
            # cancellation differ by more than a relative tolerance allows.
            finite = np.abs(w[np.isfinite(w)])
            atol = 1e-6 * max(1.0, float(finite.max(initial=0.0)))
            if not np.allclose(g, w, rtol=1e-5, atol=atol, equal_nan=True):
                return f"max abs error {np.nanmax(np.abs(g - w)):.3g}"
        elif not np.array_equal(g, w):
            return f"{np.count_nonzero(g != w)} elements differ"
    return ""


def _calls_per_block(fn: Callable[[], object]) -> int:
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    return max(1, int(_BLOCK_SECONDS / max(once, 1e-7)))


def _block_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def _warm(fn: Callable[[], object], seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()


def run_case(case: Case, repeats: int) -> Row:
    row = Row(case)
    start = time.perf_counter()
    try:
        numpy_fn, kernel_fn = case.setup()
    except Exception as exc:   # report the case, keep benchmarking the others
        row.error = f"setup failed: {type(exc).__name__}: {exc}"
        return row
    row.compile_ms = (time.perf_counter() - start) * 1e3
    with np.errstate(all="ignore"):
        row.error = check_result(numpy_fn(), kernel_fn())
        if row.error:
            return row
        for fn in (numpy_fn, kernel_fn, numpy_fn, kernel_fn):   # warm-up
            fn()
        row.threads = getattr(kernel_fn, "threads", 1)
        serial_fn = kernel_fn.serial() if row.threads > 1 else None
        fns = [numpy_fn, kernel_fn] + ([serial_fn] if serial_fn else [])
        calls = [_calls_per_block(fn) for fn in fns]
        times: list[list[float]] = [[] for _ in fns]
        for _ in range(repeats):   # interleaved, so background load hits all alike
            for k, (fn, n) in enumerate(zip(fns, calls)):
                if row.threads > 1:
                    _warm(fn, _WARM_SECONDS)
                times[k].append(_block_us(fn, n))
    serial = times[2] if serial_fn else times[1]
    row.numpy_us, row.kernel_us, row.serial_us = (median(t) for t in (times[0], times[1],
                                                                       serial))
    row.ratio = median(a / b for a, b in zip(times[0], times[1]))
    row.serial_ratio = median(a / b for a, b in zip(times[0], serial))
    return row


def call_overhead(repeats: int) -> str:
    """The fixed cost of one call, on a 10-element float32 add: numpy's ufunc against the
    kernel, allocating and with ``out=`` (no target; the figure docs/runtime.md quotes)."""
    from tessera.compiler.cpu import E, TensorSpec, fused_elementwise
    from tessera.runtime.cpu import load_kernel

    x, y, o = (np.ones(10, np.float32) for _ in range(3))
    kernel = load_kernel(fused_elementwise(E.input(0) + E.input(1),
                                           [TensorSpec((10,), "float32")] * 2))
    fns = {"numpy x + y": lambda: x + y, "kernel(x, y)": lambda: kernel(x, y),
           "numpy np.add(x, y, out=o)": lambda: np.add(x, y, out=o),
           "kernel(x, y, out=[o])": lambda: kernel(x, y, out=[o])}
    calls = {name: _calls_per_block(fn) for name, fn in fns.items()}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], _block_us(fn, calls[name]))
    lines = ["call overhead, 10-element float32 add (us per call):"]
    lines += [f"  {name:<28}{us:8.2f}" for name, us in best.items()]
    return "\n".join(lines)


def thread_scaling(repeats: int) -> str:
    """1e6-element float32 kernels with a parallel form forced onto 1, 2 and 4 threads:
    an add (memory-bound) and a tanh (compute-bound, ~0.3 ns an element here), what
    decides ``tessera.runtime.cpu.BYTES_PER_THREAD`` on this host and whether a
    kernel's arithmetic should count too (interleaved, best of ``repeats`` blocks)."""
    from tessera.compiler.cpu import E, TensorSpec, fused_elementwise
    from tessera.runtime.cpu import load_kernel

    n = 10**6
    x = E.input(0)
    lines = []
    for label, expr, n_inputs in (("add", x + E.input(1), 2), ("tanh", x.tanh(), 1)):
        arrays = [np.ones(n, np.float32) for _ in range(n_inputs)]
        kernel = load_kernel(fused_elementwise(expr, [TensorSpec((n,), "float32")]
                                               * n_inputs))
        fns = {k: (lambda k=k: kernel(*arrays, threads=k)) for k in (1, 2, 4)}
        calls = {k: _calls_per_block(fn) for k, fn in fns.items()}
        best = dict.fromkeys(fns, float("inf"))
        for _ in range(repeats):
            for k, fn in fns.items():
                best[k] = min(best[k], _block_us(fn, calls[k]))
        lines.append(f"parallel form, 1e6-element float32 {label} (us per call): "
                     + ", ".join(f"{k} thread{'s' if k > 1 else ''} {us:.1f}"
                                 for k, us in best.items()))
    return "\n".join(lines)


def stream_widths(repeats: int) -> str:
    """Float32 kernels vectorised 512 and 256 bits wide (``fused_elementwise``'s
    ``vector_bits``), on one thread on the same arrays: memory-bound ones, which
    ``STREAM_VECTOR_BITS`` gives 256 bits, and an exp, which keeps the widest (median
    over ``repeats`` rounds of the 512-bit / 256-bit time)."""
    from tessera.compiler.cpu import E, TensorSpec, fused_elementwise
    from tessera.runtime.cpu import load_kernel

    x, y = E.input(0), E.input(1)
    lines = ["vector width, float32 on one thread (us per call at 512 / 256 bits, ratio):"]
    for label, expr, n, n_inputs in (("add", x + y, 10**6, 2), ("add", x + y, 4 * 10**6, 2),
                                     ("x*1.5+y", x * 1.5 + y, 10**6, 2),
                                     ("exp", x.exp(), 10**6, 1)):
        arrays = [np.ones(n, np.float32) for _ in range(n_inputs)]
        specs = [TensorSpec((n,), "float32")] * n_inputs
        fns = [KernelCall(load_kernel(fused_elementwise(expr, specs, vector_bits=bits)),
                          *arrays).serial() for bits in (512, 256)]
        lines.append(f"  {label} {n:.0e}".replace("+0", "").ljust(18) + _paired(fns, repeats))
    return "\n".join(lines)


def _paired(fns: list[Callable[[], object]], repeats: int) -> str:
    """Two calls timed in ``repeats`` interleaved rounds: their median times (us) and the
    median over rounds of the first's time over the second's."""
    calls = [_calls_per_block(fn) for fn in fns]
    times: list[list[float]] = [[], []]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            times[k].append(_block_us(fn, calls[k]))
    ratio = median(a / b for a, b in zip(*times))
    return f"{median(times[0]):9.1f} {median(times[1]):9.1f}  {ratio:.2f}x"


def thread_thresholds(repeats: int) -> str:
    """What sets ``tessera.runtime.cpu.BYTES_PER_THREAD`` and ``MACS_PER_THREAD``: a
    float32 add of growing size and float MatMuls of growing work on 1 and 2 threads of
    the worker pool (awake), with the threads an automatic call of each picks."""
    from tessera.compiler.cpu import E, TensorSpec, build_matmul, fused_elementwise
    from tessera.runtime.cpu import load_kernel

    cases = []
    for rows in (64, 128, 256, 1000):
        spec = TensorSpec((rows, 1000), "float32")
        cases.append((f"add {12 * rows * 1000 / 2**20:.1f} MiB",
                      fused_elementwise(E.input(0) + E.input(1), [spec] * 2), [spec] * 2))
    for k, n in ((256, 256), (512, 256), (512, 512), (768, 768)):
        a, b = TensorSpec((64, k), "float32"), TensorSpec((k, n), "float32")
        cases.append((f"matmul {64 * k * n / 1e6:.1f} M MACs", build_matmul(a, b), [a, b]))
    lines = ["1 / 2 threads (us per call, ratio; auto: the threads an automatic call uses):"]
    for label, kernel, specs in cases:
        loaded = load_kernel(kernel)
        arrays = [np.ones(s.shape, np.float32) for s in specs]
        fns = [lambda t=t: loaded(*arrays, threads=t) for t in (1, 2)]
        lines.append(f"  {label:<22}{_paired(fns, repeats)}  auto {loaded.threads}")
    lines.append(f"  workers poll after a call for {_idle_ms(fns[1], repeats):.2f} ms, "
                 "then sleep (median)")
    return "\n".join(lines)


def _idle_ms(call: Callable[[], object], repeats: int) -> float:
    """How long the pool's workers keep polling after ``call`` (which uses them) before
    they all sleep (``tessera.runtime.cpu_pool.SPIN``)."""
    from tessera.runtime import cpu_pool

    state, spans = cpu_pool._POOL.state, []
    for _ in range(repeats):
        call()
        start = time.perf_counter()
        while state.sleepers < state.started and time.perf_counter() - start < 1.0:
            pass
        spans.append((time.perf_counter() - start) * 1e3)
    return median(spans)


HEADER = ("op", "shape", "dtype", "numpy us", "kernel us", "ratio", "target",
          "threads", "1-thread ratio", "compile ms", "ok")
_NUMERIC = {3, 4, 5, 6, 7, 8, 9}


def _cells(row: Row) -> tuple[str, ...]:
    c = row.case
    if row.error:
        status = f"FAIL ({row.error})"
        return (c.op, c.shape, c.dtype, "-", "-", "-", f"{c.target:.1f}x", "-", "-",
                f"{row.compile_ms:.0f}", status)
    return (c.op, c.shape, c.dtype, f"{row.numpy_us:.1f}", f"{row.kernel_us:.1f}",
            f"{row.ratio:.2f}x", f"{c.target:.1f}x", str(row.threads),
            f"{row.serial_ratio:.2f}x", f"{row.compile_ms:.0f}",
            "pass" if row.ok else "FAIL")


def format_table(rows: list[Row]) -> str:
    cells = [HEADER, *(_cells(r) for r in rows)]
    widths = [max(len(r[k]) for r in cells) for k in range(len(HEADER))]
    numeric = _NUMERIC
    lines = []
    for i, r in enumerate(cells):
        lines.append("  ".join(v.rjust(w) if k in numeric else v.ljust(w)
                               for k, (v, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |",
             "|" + "|".join("---:" if k in _NUMERIC else "---"
                            for k in range(len(HEADER))) + "|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9,
                    help="timed rounds (medians are reported)")
    ap.add_argument("--filter", help="only cases whose 'op shape dtype' contains this")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table")
    ap.add_argument("--no-fail", action="store_true", help="exit 0 even if targets are missed")
    ap.add_argument("--user-cache", action="store_true",
                    help="compile into the normal cache instead of a fresh temporary one")
    args = ap.parse_args(argv)

    tmp = None
    if not args.user_cache:
        tmp = tempfile.TemporaryDirectory(prefix="tessera-bench-")
        os.environ["TESSERA_CACHE"] = tmp.name
    cases, notes = load_cases(args.filter)
    rows = []
    for case in cases:
        rows.append(run_case(case, args.repeats))
        print(f"  {case.op} {case.shape} {case.dtype}: done", file=sys.stderr, flush=True)
    print(format_table(rows))
    if args.markdown:
        print()
        print(format_markdown(rows))
    print()
    print(call_overhead(args.repeats))
    print(thread_scaling(args.repeats))
    print(thread_thresholds(args.repeats))
    print(stream_widths(args.repeats))
    for note in notes:
        print(f"note: {note}")
    failed = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(failed)}/{len(rows)} cases meet their target")
    if tmp is not None:
        tmp.cleanup()
    return 1 if failed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
