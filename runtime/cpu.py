"""Run CPU fallback kernels: ``load_kernel(kernel)(*arrays)`` JIT-compiles a
``CpuKernel`` (cached, see ``tessera.runtime.jit``) and calls it on numpy arrays.

The CPython calling-convention glue (the compiled wrappers, the numpy layout probe,
the parallel dispatcher) is in :mod:`.cpu_abi`.
"""
from __future__ import annotations

import ctypes
import os
from functools import partial
from typing import Callable, Sequence

import numpy as np

from tessera.compiler.cpu.kernel import CpuKernel, TensorSpec
from tessera.errors import CpuKernelError
from tessera.runtime.jit import JitModule, get_jit, host_target

from . import cpu_abi as abi
from . import cpu_pool
from .aot import prebuilt_module

#: Most threads used by default (memory-bound kernels stop scaling well before this).
MAX_THREADS = 8
#: Most slices a call is split into, whatever ``threads`` asks: their contexts live on
#: the calling thread's stack (24 bytes each), and the pool has fewer workers anyway.
MAX_SLICES = 256
#: Each thread of an automatic call must have at least this many bytes to move
#: (inputs plus outputs). A float32 add on 1 / 2 threads of the pool (workers awake) on
#: the 2-core dev host: 0.7 MiB 10 / 7-12 us, 1.5 MiB 19-20 / 11-12, 2.9 MiB 35-36 / 22,
#: 11.4 MiB 158-162 / 72-85 (``benchmarks/cpu_kernels.py``, its thread lines); so two
#: threads from 1.5 MiB. (Starting a thread per call, the pool's predecessor, cost
#: ~50 us and set this at 16 MiB.)
BYTES_PER_THREAD = 768 * 1024
#: Each thread of an automatic call of a compute-bound kernel (``CpuKernel.macs``: the
#: float GEMM and conv) must have at least this many multiply-adds. A float MatMul
#: (64 x K x N) on 1 / 2 threads of the pool, workers awake: 24 / 18-19 us at 1.0 M
#: multiply-adds, 42-49 / 32-36 at 2.1 M, 97-98 / 62-63 at 4.2 M, 222-223 / 150 at
#: 8.4 M, 384-386 / 236 at 16.8 M, 725-762 / 393-417 at 37.7 M (each range packs its
#: own copy of the other operand); so two threads from 4.2 M.
MACS_PER_THREAD = 1 << 21


def _describe(a: np.ndarray) -> str:
    return f"{a.dtype} {tuple(a.shape)}"


def cpu_threads() -> int:
    """Threads a large parallel kernel may use: ``TESSERA_CPU_THREADS`` if set (1 turns
    the parallel path off), else the cores this process may run on, capped at
    ``MAX_THREADS`` (the kernels are memory-bound; more threads than that only add
    start-up cost)."""
    env = os.environ.get("TESSERA_CPU_THREADS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise CpuKernelError(f"TESSERA_CPU_THREADS must be a positive integer, "
                                 f"not {env!r}")
        return n
    return max(1, min(cpu_pool.usable_cores(), MAX_THREADS))


def auto_threads(kernel: CpuKernel, limit: int) -> int:
    """Threads an automatic call of ``kernel`` uses with at most ``limit``: one per
    ``MACS_PER_THREAD`` multiply-adds for a kernel that counts them (its ranges do not
    split the bytes: each packs its own copy of an operand), else one per
    ``BYTES_PER_THREAD`` it moves (inputs plus outputs); at most its parallel extent;
    1 for serial kernels."""
    if not kernel.parallel:
        return 1
    if kernel.macs:
        wanted = kernel.macs // MACS_PER_THREAD
    else:
        wanted = sum(s.nbytes for s in (*kernel.inputs, *kernel.outputs)) // BYTES_PER_THREAD
    return max(1, min(limit, kernel.parallel, wanted))


class LoadedKernel:
    """A compiled kernel, callable on numpy arrays. ``threads`` is how many threads an
    automatic call uses (see :func:`auto_threads`)."""

    def __init__(self, kernel: CpuKernel, fn: Callable[..., None], fast: bool,
                 keepalive: object = None, par_fn: Callable[..., None] | None = None,
                 threads: int = 1, checked_fn: Callable[..., object] | None = None) -> None:
        """``fn`` takes the arrays (``fast``) or their data addresses; ``par_fn`` the
        same plus a thread count (kernels with a parallel form); ``checked_fn`` the
        arrays, checked in compiled code (None if numpy's layout could not be
        verified): it returns None having run the kernel, else NotImplemented."""
        self.kernel = kernel
        self.threads = threads if par_fn is not None else 1
        self._fn = fn
        self._par_fn = par_fn
        self._fast = fast
        # Automatic calls on several threads go through the Python checks: at the
        # sizes that get threads, their microsecond is noise.
        self._checked_fn = checked_fn if self.threads == 1 else None
        self._keepalive = keepalive
        self._n_in = len(kernel.inputs)
        self._in_meta = [(s.shape, s.numpy_dtype, _c_strides(s)) for s in kernel.inputs]
        self._out_meta = [(s.shape, s.numpy_dtype) for s in kernel.outputs]
        # Nearly every kernel has one output: a partial allocates it without building
        # arguments or a comprehension in Python (~0.1 us of a ~0.6 us call).
        self._empty0 = partial(np.empty, *self._out_meta[0]) if len(self._out_meta) == 1 \
            else None

    def __repr__(self) -> str:
        return f"<LoadedKernel {self.kernel.name}>"

    def _error(self, kind: str, i: int, spec: TensorSpec, got: str) -> CpuKernelError:
        return CpuKernelError(f"{self.kernel.name}: {kind} {i} must be {spec.dtype} of "
                              f"shape {spec.shape}, not {got}")

    def _check_inputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        specs = self.kernel.inputs
        if len(inputs) != len(specs):
            raise CpuKernelError(f"{self.kernel.name}: takes {len(specs)} inputs, "
                                 f"got {len(inputs)}")
        arrays = list(inputs)
        for i, (shape, dt, _) in enumerate(self._in_meta):
            a = arrays[i]
            if not isinstance(a, np.ndarray):
                if not isinstance(a, np.generic):   # numpy scalars are 0-d arrays
                    raise self._error("input", i, specs[i], type(a).__name__)
                a = arrays[i] = np.asarray(a)
            if a.dtype != dt or a.shape != shape:
                raise self._error("input", i, specs[i], _describe(a))
            flags = a.flags
            if not (flags.c_contiguous and flags.aligned):
                arrays[i] = np.array(a, order="C")
        return arrays

    def _ready(self, inputs: Sequence[np.ndarray]) -> bool:
        """True if every input is an ndarray of the spec's shape and dtype, laid out as
        the kernel reads it (C strides, aligned): the common case, checked without
        building anything."""
        if len(inputs) != self._n_in:
            return False
        for a, (shape, dt, strides) in zip(inputs, self._in_meta):
            # Built-in dtypes are singletons, so identity is the cheap equality here.
            if not (type(a) is np.ndarray and a.dtype is dt and a.shape == shape
                    and a.strides == strides and a.flags.aligned):
                return False
        return True

    def _check_outputs(self, out: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> None:
        specs = self.kernel.outputs
        if len(out) != len(specs):
            raise CpuKernelError(f"{self.kernel.name}: has {len(specs)} outputs, "
                                 f"got {len(out)} in out=")
        for i, (a, spec, (shape, dt)) in enumerate(zip(out, specs, self._out_meta)):
            if not isinstance(a, np.ndarray):
                raise self._error("output", i, spec, type(a).__name__)
            if a.dtype != dt or a.shape != shape:
                raise self._error("output", i, spec, _describe(a))
            if not (a.flags.c_contiguous and a.flags.aligned and a.flags.writeable):
                raise CpuKernelError(f"{self.kernel.name}: output {i} must be a "
                                     "C-contiguous, aligned, writeable array")
            # The kernel's pointers are noalias: overlapping buffers give wrong results.
            others = [*inputs, *out[:i]]
            if any(np.may_share_memory(a, b) for b in others):
                raise CpuKernelError(f"{self.kernel.name}: output {i} overlaps another "
                                     "argument")

    def __call__(self, *inputs: np.ndarray, out: Sequence[np.ndarray] | None = None,
                 threads: int | None = None) -> tuple[np.ndarray, ...]:
        """Run the kernel. Inputs must match the specs' shapes and dtypes (numpy scalars
        count as 0-d arrays; non-contiguous inputs are copied); outputs are allocated
        unless ``out`` gives them. ``threads`` None uses ``self.threads``; a number
        runs the parallel form on up to that many threads whatever the size (at most
        the kernel's parallel extent; 1 is the serial kernel). Returns the outputs."""
        checked = self._checked_fn
        if checked is not None and threads is None:
            # The compiled checks cover everything but how the arguments split into
            # inputs and outputs, which only a caller-given ``out`` can get wrong.
            if out is None:
                if self._empty0 is not None:
                    outs = (self._empty0(),)
                else:
                    outs = tuple([np.empty(shape, dt) for shape, dt in self._out_meta])
                if checked(*inputs, *outs) is None:
                    return outs
            elif len(inputs) == self._n_in:
                out = tuple(out)    # once: ``out`` may be an iterator
                if checked(*inputs, *out) is None:
                    return out
            return self._call_checked(inputs, out, threads)
        if out is None and threads is None and self._fast and self._ready(inputs):
            # Without the compiled checks (or on several threads), the common call
            # is kept to a few attribute checks.
            outs = tuple([np.empty(shape, dt) for shape, dt in self._out_meta])
            if self.threads > 1:
                self._par_fn(*inputs, *outs, self.threads)
            else:
                self._fn(*inputs, *outs)
            return outs
        return self._call_checked(inputs, out, threads)

    def _call_checked(self, inputs: Sequence[np.ndarray], out: Sequence[np.ndarray] | None,
                      threads: int | None) -> tuple[np.ndarray, ...]:
        arrays = inputs if self._ready(inputs) else self._check_inputs(inputs)
        if out is None:
            outs = tuple([np.empty(shape, dt) for shape, dt in self._out_meta])
        else:
            outs = tuple(out)
            self._check_outputs(outs, arrays)
        n = self.threads if threads is None else self._clamp(threads)
        if not self._fast:
            arrays = [a.ctypes.data for a in arrays]
            outs_arg = [o.ctypes.data for o in outs]
        else:
            outs_arg = outs
        if n > 1:
            self._par_fn(*arrays, *outs_arg, n)
        else:
            self._fn(*arrays, *outs_arg)
        return outs

    def _clamp(self, threads: int) -> int:
        if threads < 1:
            raise CpuKernelError(f"{self.kernel.name}: threads must be >= 1, not {threads}")
        if self._par_fn is None:
            return 1
        return min(threads, self.kernel.parallel, MAX_SLICES)


def _c_strides(spec: TensorSpec) -> tuple[int, ...]:
    return np.empty(spec.shape, spec.numpy_dtype).strides if spec.size else \
        np.lib.stride_tricks.as_strided(np.empty(1, spec.numpy_dtype), spec.shape).strides


def load_kernel(kernel: CpuKernel) -> LoadedKernel:
    """``kernel`` ready to call: from the object compiled ahead of time for this host if
    it has one (see :mod:`.aot`: :func:`~.aot.prebuild`, or a loaded ``.tsr``'s), else
    JIT-compiled through the process-wide Jit (memory and disk cached). Kernels with a
    parallel form also get it, run on :func:`cpu_threads` threads when
    :func:`auto_threads` says the work pays for them."""
    module = prebuilt_module(kernel)
    if module is None:
        module = get_jit().compile(abi.module_ir(kernel, fast=abi.FAST_CALL,
                                                 checked=abi.NATIVE_CHECKS,
                                                 vector_bits=host_target().vector_bits))
    return _bind(kernel, module, auto_threads(kernel, cpu_threads()))


def _bind(kernel: CpuKernel, module: JitModule, threads: int) -> LoadedKernel:
    """The LoadedKernel calling ``module``'s functions (built by
    :func:`~.cpu_abi.module_ir`)."""
    n_args = len(kernel.inputs) + len(kernel.outputs)
    if kernel.parallel:
        cpu_pool.attach(module)
    if not abi.FAST_CALL:
        ptrs = [ctypes.c_void_p] * n_args
        fn = ctypes.CFUNCTYPE(None, *ptrs)(module.address(kernel.entry))
        par_fn = None
        if kernel.parallel:
            par_fn = ctypes.CFUNCTYPE(None, *ptrs, ctypes.c_int64)(module.address(abi.PAR_ENTRY))
        return LoadedKernel(kernel, fn, fast=False, keepalive=module, par_fn=par_fn,
                            threads=threads)
    specs = (*kernel.inputs, *kernel.outputs)
    fn, method = abi.builtin(module.address(abi.PY_ENTRY), kernel.name)
    par_fn = par_method = checked_fn = checked_method = None
    if kernel.parallel:
        par_fn, par_method = abi.builtin(module.address(abi.PY_PAR_ENTRY), kernel.name)
    if abi.NATIVE_CHECKS:
        expect = (ctypes.c_void_p * (n_args + 2)).from_address(module.global_address(abi.EXPECT))
        # The same values whenever a cached module is loaded again, so rewriting them
        # cannot disturb a call running on another thread.
        expect[:] = [id(np.ndarray), id(NotImplemented), *(id(s.numpy_dtype) for s in specs)]
        checked_fn, checked_method = abi.builtin(module.address(abi.CHECKED_ENTRY), kernel.name)
    # The machine code lives as long as its module: keep both with the kernel.
    return LoadedKernel(kernel, fn, fast=True,
                        keepalive=(method, par_method, checked_method, module),
                        par_fn=par_fn, threads=threads, checked_fn=checked_fn)


def run_cpu_step(step, kernel: LoadedKernel | None, env: dict[str, np.ndarray], *,
                 threads: int | None = None) -> None:
    """Run one :class:`~tessera.compiler.cpu.lower.CpuStep` with its loaded ``kernel``
    (``None`` for a view, which reshapes its input) on ``env`` (tensor name -> array),
    adding its outputs (fresh arrays: nothing the step reads is written). ``threads``
    caps the kernel's own threads (None: its automatic choice). Raises CpuKernelError
    for an input that is nowhere."""
    args = []
    for name in step.inputs:
        data = step.constants.get(name)
        if data is None:
            data = env.get(name)
        if data is None:
            raise CpuKernelError(f"CPU step {step.name!r} reads tensor {name!r}, which is "
                                 "neither a constant of the step nor computed yet")
        args.append(data)
    if kernel is None:
        env[step.outputs[0]] = np.reshape(args[0], step.shape)
        return
    result = kernel(*args, threads=threads)
    env.update(zip(step.outputs, result if isinstance(result, (tuple, list)) else (result,)))


def run_cpu_steps(steps: Sequence, env: dict[str, np.ndarray]) -> None:
    """Run CPU steps in order on ``env``, JIT-compiling each step's kernel."""
    for step in steps:
        run_cpu_step(step, None if step.kernel is None else load_kernel(step.kernel), env)
