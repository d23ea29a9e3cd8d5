"""Measure this machine's host cost model (``tessera calibrate-host``), and the pieces the
board models' generator (``benchmarks/host_models.py``) shares with it: the
representative kernels of every kernel kind and the fit of a kind's coefficients.

One kernel set, one fit: :func:`representatives` builds, per kind of
:data:`~tessera.hostmodel.KINDS`, the CPU kernels the compiler's CPU backend emits for
that kind's typical nodes (through the same builders) at several sizes, each with its
:class:`~tessera.hostmodel.Work` (the features the placement's ``node_work`` gives the
equivalent graph node; ``tests/runtime/test_calibrate.py`` checks they agree).
:func:`fit_kernel_cost` fits a kind's :class:`~tessera.hostmodel.KernelCost` to
(work, seconds) pairs by non-negative least squares on relative errors, so small calls
weigh as much as large ones. :func:`calibrate_host` times the kernels here (JIT through
:func:`tessera.runtime.cpu.load_kernel`, one thread, median of repeats), the host copy
into a device-like buffer, the cache maintenance and an accelerator launch.
"""
from __future__ import annotations

import itertools
import platform
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

import numpy as np

from tessera.compiler.cpu import (E, CpuKernel, TensorSpec, build_byte_lookup, build_concat,
                                  build_conv_float, build_conv_int8,
                                  build_global_average_pool, build_matmul,
                                  build_matmul_int8, build_max_pool, build_transpose,
                                  fused_elementwise, maximum, reduce_sum)
from tessera.hostmodel import KINDS, HostModel, KernelCost, Work

from .cpu_pool import usable_cores

__all__ = ["Representative", "calibrate_host", "describe", "fit_kernel_cost", "measure_kernel",
           "representatives", "time_call"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Representative:
    """One kernel call standing for its kind: the kernel and the call's features."""

    kind: str
    label: str
    kernel: CpuKernel
    work: Work


def _rep(kind: str, label: str, kernel: CpuKernel, ops: int = 0) -> Representative:
    """A representative whose elements and bytes are its kernel's (outputs; every
    argument read or written), as ``node_work`` counts them for the node."""
    elements = sum(s.size for s in kernel.outputs)
    nbytes = sum(s.nbytes for s in (*kernel.inputs, *kernel.outputs))
    return Representative(kind, label, kernel, Work(kind, int(ops), elements, nbytes))


# ------------------------------------------------------------- the kernel set
def _conv_size(n: int) -> tuple[int, int]:
    """(channels, height = width) of a convolution representative of size index ``n``."""
    return 4 * 2 ** n, 6 + 4 * n


def _gemm(kind: str, dtype: str, build_conv, build_mm, n: int) -> list[Representative]:
    """A 3x3 convolution and a matrix product of size index ``n`` in ``dtype``."""
    c, hw = _conv_size(n)
    x, w = TensorSpec((1, c, hw, hw), dtype), TensorSpec((c, c, 3, 3), dtype)
    conv = build_conv(x, w, pads=(1, 1, 1, 1))
    m, k = 4 + 12 * n, 32 * (n + 1)
    mm = build_mm(TensorSpec((m, k), dtype), TensorSpec((k, k), dtype))
    short = "int8" if dtype == "int8" else "f32"
    return [_rep(kind, f"conv3x3 {short} {c}x{hw}x{hw}", conv, c * hw * hw * c * 9),
            _rep(kind, f"matmul {short} {m}x{k}x{k}", mm, m * k * k)]


_gemm_int8 = partial(_gemm, "gemm_int8", "int8", build_conv_int8, build_matmul_int8)
_gemm_float = partial(_gemm, "gemm_float", "float32", build_conv_float, build_matmul)


def _pool(n: int) -> list[Representative]:
    c, hw = 8 * (n + 1), 8 * (n + 1)
    x = TensorSpec((1, c, 2 * hw + 1, 2 * hw + 1), "float32")
    mp = build_max_pool(x, (3, 3), strides=(2, 2))
    gap = build_global_average_pool(TensorSpec((1, 2 * c, hw, hw), "int8"))
    out = mp.outputs[0].size
    return [_rep("pool", f"maxpool3x3/2 f32 {c}x{2 * hw + 1}", mp, out * 9),
            _rep("pool", f"globalavgpool int8 {2 * c}x{hw}", gap, 2 * c * hw * hw)]


def _sizes(n: int) -> int:
    """Elements of an elementwise-like representative of size index ``n``."""
    return 1024 * 4 ** n


def _elementwise(n: int) -> list[Representative]:
    s = TensorSpec((_sizes(n),), "float32")
    add = fused_elementwise(E.input(0) + E.input(1), [s, s])
    i8 = TensorSpec((2 * _sizes(n),), "int8")
    relu = fused_elementwise(maximum(E.input(0), 0), [i8])
    return [_rep("elementwise", f"add f32 {s.size}", add),
            _rep("elementwise", f"relu int8 {i8.size}", relu)]


def _transcendental(n: int) -> list[Representative]:
    s = TensorSpec((_sizes(n) // 2,), "float32")
    return [_rep("transcendental", f"tanh f32 {s.size}", fused_elementwise(E.input(0).tanh(), [s])),
            _rep("transcendental", f"sigmoid f32 {s.size}",
                 fused_elementwise(E.input(0).sigmoid(), [s]))]


def _lookup(n: int) -> list[Representative]:
    s = TensorSpec((2 * _sizes(n),), "int8")
    return [_rep("lookup", f"lookup int8 {s.size}", build_byte_lookup(s, "int8"))]


def _movement(n: int) -> list[Representative]:
    c, hw = 8 * (n + 1), 8 * (n + 1)
    x = TensorSpec((c, hw, hw), "float32")
    half = TensorSpec((1, c // 2, hw, hw), "int8")
    return [_rep("movement", f"transpose f32 {c}x{hw}x{hw}", build_transpose(x, (1, 2, 0))),
            _rep("movement", f"concat int8 2x{c // 2}x{hw}x{hw}", build_concat([half, half], 1))]


def _reduce(n: int) -> list[Representative]:
    rows = 16 * 2 ** n
    x = TensorSpec((rows, 64 * 2 ** n), "float32")
    return [_rep("reduce", f"reducesum f32 {x.shape[0]}x{x.shape[1]}",
                 reduce_sum(x, (1,)), x.size)]


_BUILDERS: dict[str, Callable[[int], list[Representative]]] = {
    "gemm_int8": _gemm_int8, "gemm_float": _gemm_float, "pool": _pool,
    "elementwise": _elementwise, "transcendental": _transcendental, "lookup": _lookup,
    "movement": _movement, "reduce": _reduce,
}


def representatives(quick: bool = False) -> dict[str, list[Representative]]:
    """Per kernel kind, its representative kernel calls: a few kernels at 4 sizes (2
    small ones if ``quick``)."""
    sizes = range(2) if quick else range(4)
    return {kind: [r for n in sizes for r in _BUILDERS[kind](n)] for kind in KINDS}


# ---------------------------------------------------------------------- the fit
def _features(work: Work) -> np.ndarray:
    return np.array([1.0, work.ops, work.elements, work.bytes])


def fit_kernel_cost(works: Sequence[Work], seconds: Sequence[float]
                    ) -> tuple[KernelCost, dict[str, float]]:
    """The non-negative coefficients (fixed, per op, per element, per byte) minimising
    the squared *relative* error over the calls, and the fit's residuals
    (``max_rel``, ``rms_rel``). Exact NNLS: with four features, the least-squares
    solution of every subset of them, the best one whose coefficients are all >= 0
    (the NNLS optimum is the unconstrained optimum on its support)."""
    t = np.asarray(seconds, dtype=float)
    if len(works) != len(t) or not len(t) or np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("fit_kernel_cost needs one positive, finite time per work item")
    a = np.array([_features(w) for w in works]) / t[:, None]   # rows weighted by 1/t
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)
    a = a / scale
    b = np.ones(len(t))
    best, best_err = np.zeros(4), float(len(t))                 # all-zero: error 1 per row
    for k in range(1, 5):
        for cols in itertools.combinations(range(4), k):
            if not np.any(a[:, cols]):
                continue
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(sol < 0):
                continue
            err = float(np.sum((a[:, cols] @ sol - b) ** 2))
            if err < best_err - 1e-12:
                best, best_err = np.zeros(4), err
                best[list(cols)] = sol
    coef = best / scale
    cost = KernelCost(*(float(c) for c in coef))
    rel = np.array([cost.seconds(w) for w in works]) / t - 1.0
    return cost, {"max_rel": float(np.abs(rel).max()),
                  "rms_rel": float(np.sqrt(np.mean(rel ** 2)))}


# ----------------------------------------------------------------- measuring
def time_call(fn: Callable[[], object], repeats: int, block: float) -> float:
    """Median over ``repeats`` blocks of the time of one ``fn()`` (each block runs it
    until ``block`` seconds have passed, so short calls are timed in bulk)."""
    fn()                                                        # warm-up (and compile)
    times = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= block:
                break
        times.append(elapsed / calls)
    return float(np.median(times))


def _random(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    if spec.dtype == "float32":
        return rng.standard_normal(spec.shape).astype(np.float32)
    info = np.iinfo(spec.numpy_dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100) + 1, spec.shape,
                        dtype=spec.numpy_dtype)


def measure_kernel(rep: Representative, repeats: int = 5, block: float = 0.002) -> float:
    """Seconds of one call of ``rep``'s kernel here, on one thread (median of repeats),
    called as the runtime's CPU steps call it (outputs allocated per call)."""
    from .cpu import load_kernel
    kernel = load_kernel(rep.kernel)
    rng = np.random.default_rng(0)
    inputs = [_random(s, rng) for s in rep.kernel.inputs]
    if kernel.threads == 1:
        return time_call(lambda: kernel(*inputs), repeats, block)
    return time_call(lambda: kernel(*inputs, threads=1), repeats, block)


def _copy_bytes_per_second(nbytes: int, repeats: int) -> float:
    """numpy copying a host array into a contiguous buffer (what writing a device buffer
    does before the cache maintenance)."""
    src = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)

    def copy() -> None:
        dst[:] = src
    return nbytes / time_call(copy, repeats, 0.01)


def _flush_bytes_per_second(backend: str, nbytes: int, repeats: int) -> tuple[float, str]:
    """Cache clean + invalidate of a device buffer: on a board (``backend`` "pynq"),
    pynq's ``flush`` and ``invalidate`` of a ``pynq.allocate`` buffer, timed; elsewhere
    the devices are simulated in host memory (and x86 DMA is cache-coherent), so there is
    no cache maintenance and the rate is infinite (its cost 0)."""
    if backend != "pynq":
        return float("inf"), (f"no cache maintenance: the {backend} backend's buffers are "
                              f"host memory ({platform.machine()}): flush costs 0")
    import pynq                                                 # type: ignore
    buf = pynq.allocate(shape=(nbytes,), dtype=np.uint8)
    try:
        def clean() -> None:
            buf.flush()
            buf.invalidate()
        return nbytes / time_call(clean, repeats, 0.01), \
            f"pynq buffer flush()+invalidate() of {nbytes} bytes, median"
    finally:
        buf.freebuffer()


def _launch_seconds(backend: str, config: str | None, repeats: int) -> tuple[float, str]:
    """Host time of one accelerator segment run as the runtime does it (write, launch,
    wait, read back) for a minimal program: one FINISH and a 64-byte segment."""
    from tessera.isa import Finish, Program

    from . import open_device
    device = open_device(backend, config)
    try:
        program = Program(device.config, [Finish()])
        program.add_segment("data", np.zeros(64, np.uint8))
        loaded = device.load(program)
        try:
            data = {"data": np.ones(64, np.uint8)}
            seconds = time_call(lambda: loaded.run(data), repeats, 0.02)
        finally:
            loaded.free()
    finally:
        device.close()
    what = ("a board's" if backend == "pynq" else
            f"the {backend} backend's host-side overhead (a simulator's, not a board's)")
    return seconds, f"{what}: load once, then run a FINISH-only program, median"


def _cpu_name() -> str:
    from .jit import host_cpu
    return f"{usable_cores()}x {platform.machine()} ({host_cpu()[0]})"


def calibrate_host(*, name: str | None = None, quick: bool = False,
                   progress: Progress | None = None, backend: str = "sim",
                   config: str | None = None) -> HostModel:
    """Measure this machine's :class:`~tessera.hostmodel.HostModel`: every kind's
    representative kernels timed and fitted (:func:`fit_kernel_cost`), the copy and cache
    maintenance rates, and the launch of a minimal accelerator segment on ``backend``
    (``"pynq"`` on a board). ``quick`` uses 2 small sizes and fewer repeats (seconds, for
    tests). Writes nothing; ``progress(line)`` gets a line per step."""
    say = progress or (lambda line: None)
    repeats, block = (3, 0.0005) if quick else (7, 0.005)
    kernels, details = {}, {"kinds": {}}
    for kind, reps in representatives(quick).items():
        seconds = [measure_kernel(r, repeats, block) for r in reps]
        kernels[kind], residual = fit_kernel_cost([r.work for r in reps], seconds)
        details["kinds"][kind] = {**residual, "calls": [
            {"label": r.label, "work": r.work.to_dict(), "seconds": s}
            for r, s in zip(reps, seconds)]}
        say(f"{kind:<15} {len(reps)} calls, fit within {residual['max_rel']:.0%}")
    copy = _copy_bytes_per_second(1 << (20 if quick else 24), repeats)
    flush, flush_how = _flush_bytes_per_second(backend, 1 << 20, repeats)
    launch, launch_how = _launch_seconds(backend, config, repeats)
    say(f"copy {copy / 1e9:.2f} GB/s, launch {launch * 1e6:.0f} us ({backend})")
    details.update(copy="numpy copy into a contiguous buffer, median", flush=flush_how,
                   launch=launch_how, quick=quick)
    return HostModel(name or platform.node() or "local", _cpu_name(), usable_cores(),
                     kernels, launch, copy, flush,
                     source="measured on this machine by tessera calibrate-host "
                            "(runtime/calibrate.py): per kind, representative CPU kernels "
                            "timed on one thread (median of repeats), coefficients by NNLS "
                            "on relative errors", details=details)


def describe(model: HostModel) -> str:
    """A table of ``model``'s coefficients and accelerator-driving costs."""
    lines = [f"host model {model.name}: {model.cpu}, {model.cores} cores",
             f"  {'kind':<15}{'fixed us':>10}{'ns/op':>10}{'ns/elem':>10}{'ns/byte':>10}"
             f"{'fit max err':>13}"]
    kinds = model.details.get("kinds", {}) if isinstance(model.details, dict) else {}
    for kind, c in model.kernels.items():
        err = kinds.get(kind, {}).get("max_rel")
        lines.append(f"  {kind:<15}{c.fixed * 1e6:>10.2f}{c.per_op * 1e9:>10.4f}"
                     f"{c.per_element * 1e9:>10.4f}{c.per_byte * 1e9:>10.4f}"
                     f"{'' if err is None else f'{err:.0%}':>13}")
    flush = ("free (coherent)" if model.flush_bytes_per_second == float("inf")
             else f"{model.flush_bytes_per_second / 1e9:.2f} GB/s")
    lines.append(f"  launch {model.launch_seconds * 1e6:.1f} us, copy "
                 f"{model.copy_bytes_per_second / 1e9:.2f} GB/s, cache flush {flush}")
    if model.source:
        lines.append(f"  source: {model.source}")
    return "\n".join(lines)
