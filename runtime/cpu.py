"""Run CPU fallback kernels: ``load_kernel(kernel)(*arrays)`` JIT-compiles a
``CpuKernel`` (cached, see ``tessera.runtime.jit``) and calls it on numpy arrays.

Call overhead matters: memory-bound kernels on 1e6 elements take ~40-200 us, a 1x1000
softmax ~3 us, and a ctypes call with ``ndarray.ctypes.data`` costs ~5 us here. So each
kernel is compiled together with a small wrapper, ``tessera.pycall``, which is a Python
builtin function in its own right (CPython ``METH_FASTCALL`` calling convention): it
takes the ndarray objects, reads each buffer pointer from the object (numpy keeps it
right after the object header), releases the GIL around the kernel like a numpy ufunc,
and returns None. It is wrapped with ``PyCFunction_NewEx``; a call then costs ~0.1 us.
The header layout is verified once at import on a probe array; if it does not hold,
calls go through ctypes with addresses.

Checking the arguments in Python costs more than numpy's whole ``x + y`` on a small
array (~1 us for two inputs vs ~0.6 us), so each kernel also gets
``tessera.pycall.checked``, used by calls on one thread, which checks them itself from
numpy's ``PyArrayObject`` fields (type, dtype, shape, flags, output overlap; the layout
is numpy's ABI, verified at import on probe arrays, see :func:`_array_layout_holds`).
A call then costs ~0.8 us (0.7 with ``out=``), from ~2 (~4.5). On any mismatch it runs
nothing and returns ``NotImplemented``; the Python checks then copy what can be copied
or raise the detailed error. The process addresses it compares against (the ndarray
type, the dtype singletons, ``NotImplemented``) are written into a global of the
compiled module after loading, so the IR text (a disk cache key) holds none.

Kernels with a parallel form (``CpuKernel.parallel``) also get ``tessera.parallel``,
which splits the parallel loop into near-equal slices, runs slice 0 on the calling
thread and the rest on threads made with ``pthread_create`` (libc, resolved by MCJIT in
the process), and joins them before returning. There is no persistent pool: nothing to
leak, to lock between Python threads, or to rebuild after ``fork``; the price is
~50 us per call for thread start-up, so only large kernels use it (``auto_threads``).
"""
from __future__ import annotations

import ctypes
import os
from functools import partial
from typing import Callable, Sequence

import numpy as np

from tessera.compiler.cpu.kernel import CpuKernel, TensorSpec
from tessera.errors import CpuKernelError
from tessera.runtime.jit import get_jit

_PY_ENTRY = "tessera.pycall"
_PY_PAR_ENTRY = "tessera.pycall.parallel"
_PAR_ENTRY = "tessera.parallel"
#: Most threads used by default (memory-bound kernels stop scaling well before this).
MAX_THREADS = 8
#: Each thread of an automatic call must have at least this many bytes to move
#: (inputs plus outputs). Measured on the 2-core dev host (shared with other jobs):
#: starting and joining a thread costs ~50 us, and a 2-thread float32 add was slower
#: than 1 thread at every size tried (1.2 MiB: 71 vs 24 us; 11 MiB: 248 vs 187 us;
#: 183 MiB: 9.2 vs 8.4 ms), so the bar is set above the L3-resident sizes; hosts with
#: idle cores can lower it with TESSERA_CPU_THREADS / this constant after measuring.
BYTES_PER_THREAD = 16 * 1024 * 1024
_DATA_OFFSET = object.__basicsize__    # PyArrayObject: PyObject_HEAD, then char *data
_METH_FASTCALL = 0x0080
#: C types the wrappers pass to CPython and libc, sized for this host: a PYNQ-Z1/Z2
#: runs 32-bit ARM Linux, where both are 32 bits.
_SSIZE_T = f"i{8 * ctypes.sizeof(ctypes.c_ssize_t)}"     # Py_ssize_t
_PTHREAD_T = f"i{8 * ctypes.sizeof(ctypes.c_ulong)}"     # pthread_t on Linux


class _PyMethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


class _ArrayFields(ctypes.Structure):
    """numpy's ``PyArrayObject_fields``: what its C macros (``PyArray_DATA``,
    ``PyArray_NDIM``, ...) read in compiled extensions, so a stable part of its ABI."""
    _fields_ = [("head", ctypes.c_byte * object.__basicsize__), ("data", ctypes.c_void_p),
                ("nd", ctypes.c_int), ("dimensions", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("base", ctypes.c_void_p),
                ("descr", ctypes.c_void_p), ("flags", ctypes.c_int)]


_PTR_SIZE = ctypes.sizeof(ctypes.c_void_p)
_TYPE_OFFSET = object.__basicsize__ - _PTR_SIZE     # ob_type ends PyObject_HEAD
_C_CONTIGUOUS, _ALIGNED, _WRITEABLE = 0x1, 0x100, 0x400     # NPY_ARRAY_* flags
_CHECKED_ENTRY = "tessera.pycall.checked"
_EXPECT = "tessera.expect"


def _fields_match(a: np.ndarray) -> bool:
    """True if ``_ArrayFields`` read from ``a``'s object agree with what numpy reports."""
    f = _ArrayFields.from_address(id(a))
    if ctypes.c_void_p.from_address(id(a) + _TYPE_OFFSET).value != id(type(a)):
        return False
    shape = strides = ()
    if a.ndim:
        shape = tuple((ctypes.c_ssize_t * a.ndim).from_address(f.dimensions))
        strides = tuple((ctypes.c_ssize_t * a.ndim).from_address(f.strides))
    base = id(a.base) if a.base is not None else None
    return (f.data == a.ctypes.data and f.nd == a.ndim and shape == a.shape
            and strides == a.strides and f.base == base and f.descr == id(a.dtype)
            and f.flags == a.flags.num)


def _array_layout_holds() -> bool:
    """True if ndarray objects are laid out as ``_ArrayFields`` says and the flag bits
    are the ones the checked wrapper tests, on probes that differ in every field."""
    owner = np.arange(12, dtype=np.float32).reshape(3, 4)
    frozen = np.zeros(5, np.int32)
    frozen.flags.writeable = False
    probes = [owner, owner.T, owner[::2, 1:], np.zeros((), np.int8), frozen]
    if not all(_fields_match(a) for a in probes):
        return False
    want = _C_CONTIGUOUS | _ALIGNED | _WRITEABLE
    unaligned = np.frombuffer(bytearray(9), np.int32, 2, 1)
    return (owner.flags.num & want == want and owner.T.flags.num & _C_CONTIGUOUS == 0
            and frozen.flags.num & _WRITEABLE == 0 and unaligned.flags.num & _ALIGNED == 0)


def _fast_call_available() -> bool:
    probe = np.arange(3.0)
    if ctypes.c_void_p.from_address(id(probe) + _DATA_OFFSET).value != probe.ctypes.data:
        return False
    return all(hasattr(ctypes.pythonapi, f) for f in
               ("PyCFunction_NewEx", "PyEval_SaveThread", "PyEval_RestoreThread", "Py_IncRef"))


_FAST_CALL = _fast_call_available()
_NATIVE_CHECKS = _FAST_CALL and _array_layout_holds()


def _data_pointers(n_args: int) -> list[str]:
    """IR loading the data pointer of array ``args[i]`` into ``%d{i}``."""
    body = []
    for i in range(n_args):
        body += [f"  %p{i} = getelementptr inbounds ptr, ptr %args, i64 {i}",
                 f"  %a{i} = load ptr, ptr %p{i}, align 8",
                 f"  %g{i} = getelementptr inbounds i8, ptr %a{i}, i64 {_DATA_OFFSET}",
                 f"  %d{i} = load ptr, ptr %g{i}, align 8"]
    return body


def _pycall_ir(name: str, callee: str, n_args: int, threads_arg: bool) -> str:
    """IR of ``PyObject *name(PyObject *self, PyObject *const *args, Py_ssize_t
    nargs)``: calls ``callee`` with the data pointers of the ``n_args`` arrays in
    ``args`` (checked by the caller) without the GIL; returns ``self`` (None) as a new
    reference. With ``threads_arg``, ``args[n_args]`` is a Python int passed on as a
    trailing i64 (the thread count)."""
    body = _data_pointers(n_args)
    args = [f"ptr %d{i}" for i in range(n_args)]
    if threads_arg:
        body += [f"  %pn = getelementptr inbounds ptr, ptr %args, i64 {n_args}",
                 "  %an = load ptr, ptr %pn, align 8",
                 f"  %nt = call {_SSIZE_T} @PyLong_AsSsize_t(ptr %an)"]
        if _SSIZE_T != "i64":
            body.append(f"  %nt64 = sext {_SSIZE_T} %nt to i64")
        args.append("i64 %nt64" if _SSIZE_T != "i64" else "i64 %nt")
    return "\n".join([
        f'define ptr @"{name}"(ptr %self, ptr %args, {_SSIZE_T} %nargs) {{',
        *body,
        "  %ts = call ptr @PyEval_SaveThread()",
        f'  call void @"{callee}"({", ".join(args)})',
        "  call void @PyEval_RestoreThread(ptr %ts)",
        "  call void @Py_IncRef(ptr %self)",
        "  ret ptr %self",
        "}", ""])


def _field(a: str, field: str, ty: str, out: str) -> list[str]:
    """IR loading ``_ArrayFields.<field>`` (of LLVM type ``ty``) of object ``%a`` into
    ``%out`` (aligned as an int: every field is at least that)."""
    offset = getattr(_ArrayFields, field).offset
    return [f"  %{out}.p = getelementptr inbounds i8, ptr %{a}, i64 {offset}",
            f"  %{out} = load {ty}, ptr %{out}.p, align {ctypes.sizeof(ctypes.c_int)}"]


def _checked_pycall_ir(name: str, callee: str, specs: Sequence[TensorSpec],
                       n_in: int) -> str:
    """IR of a METH_FASTCALL function like :func:`_pycall_ir`'s that first checks its
    arguments against ``specs`` (inputs, then outputs): exactly ``len(specs)`` of them,
    each an exact ndarray with the spec's dtype singleton and shape, C-contiguous and
    aligned (outputs also writeable), no output's bytes overlapping another argument's
    (the kernel's pointers are noalias). If all hold it runs ``callee`` without the GIL
    and returns None; otherwise it returns ``NotImplemented`` having touched nothing.
    The expected object addresses come from the global ``tessera.expect``: ndarray,
    NotImplemented, then each argument's dtype (filled in by :func:`load_kernel`)."""
    n = len(specs)
    slots = f"[{n + 2} x ptr]"
    lines = [f'@"{_EXPECT}" = global {slots} zeroinitializer',
             f'define ptr @"{name}"(ptr %self, ptr %args, {_SSIZE_T} %nargs) {{',
             "entry:",
             f"  %nargs.ok = icmp eq {_SSIZE_T} %nargs, {n}",
             f'  %ndarray = load ptr, ptr @"{_EXPECT}", align {_PTR_SIZE}',
             "  br i1 %nargs.ok, label %arg0, label %reject"]
    for i, spec in enumerate(specs):
        flags = _C_CONTIGUOUS | _ALIGNED | (_WRITEABLE if i >= n_in else 0)
        after = f"arg{i + 1}" if i + 1 < n else "disjoint"
        # Blocks in order, each reading only what the previous one proved is there:
        # the type (any object has one), the fixed fields, the dimensions array.
        lines += [f"arg{i}:",
                  f"  %a{i}.p = getelementptr inbounds ptr, ptr %args, i64 {i}",
                  f"  %a{i} = load ptr, ptr %a{i}.p, align {_PTR_SIZE}",
                  f"  %a{i}.t.p = getelementptr inbounds i8, ptr %a{i}, i64 {_TYPE_OFFSET}",
                  f"  %a{i}.t = load ptr, ptr %a{i}.t.p, align {_PTR_SIZE}",
                  f"  %a{i}.t.ok = icmp eq ptr %a{i}.t, %ndarray",
                  f"  br i1 %a{i}.t.ok, label %arg{i}.fields, label %reject",
                  f"arg{i}.fields:",
                  *_field(f"a{i}", "nd", "i32", f"a{i}.nd"),
                  *_field(f"a{i}", "descr", "ptr", f"a{i}.dt"),
                  *_field(f"a{i}", "flags", "i32", f"a{i}.fl"),
                  f"  %a{i}.dt.e.p = getelementptr inbounds {slots}, ptr @\"{_EXPECT}\", "
                  f"i64 0, i64 {i + 2}",
                  f"  %a{i}.dt.e = load ptr, ptr %a{i}.dt.e.p, align {_PTR_SIZE}",
                  f"  %a{i}.nd.ok = icmp eq i32 %a{i}.nd, {spec.ndim}",
                  f"  %a{i}.dt.ok = icmp eq ptr %a{i}.dt, %a{i}.dt.e",
                  f"  %a{i}.fl.m = and i32 %a{i}.fl, {flags}",
                  f"  %a{i}.fl.ok = icmp eq i32 %a{i}.fl.m, {flags}",
                  f"  %a{i}.ok0 = and i1 %a{i}.nd.ok, %a{i}.dt.ok",
                  f"  %a{i}.ok1 = and i1 %a{i}.ok0, %a{i}.fl.ok",
                  f"  br i1 %a{i}.ok1, label %arg{i}.shape, label %reject",
                  f"arg{i}.shape:",
                  *_field(f"a{i}", "data", "ptr", f"d{i}")]
        if not spec.ndim:
            lines.append(f"  br label %{after}")
            continue
        lines += _field(f"a{i}", "dimensions", "ptr", f"a{i}.dims")
        ok = "true"
        for k, d in enumerate(spec.shape):
            lines += [f"  %a{i}.d{k}.p = getelementptr inbounds {_SSIZE_T}, "
                      f"ptr %a{i}.dims, i64 {k}",
                      f"  %a{i}.d{k} = load {_SSIZE_T}, ptr %a{i}.d{k}.p, align {_PTR_SIZE}",
                      f"  %a{i}.d{k}.ok = icmp eq {_SSIZE_T} %a{i}.d{k}, {d}",
                      f"  %a{i}.s{k} = and i1 {ok}, %a{i}.d{k}.ok"]
            ok = f"%a{i}.s{k}"
        lines.append(f"  br i1 {ok}, label %{after}, label %reject")
    # Two contiguous buffers overlap iff their byte ranges intersect; empty ones hold
    # no bytes. Inputs may overlap each other (the kernel only reads them).
    lines += ["disjoint:"]
    lo = {i: f"%d{i}.lo" for i, sp in enumerate(specs) if sp.nbytes}
    for i in lo:
        lines += [f"  %d{i}.lo = ptrtoint ptr %d{i} to {_SSIZE_T}",
                  f"  %d{i}.hi = add {_SSIZE_T} %d{i}.lo, {specs[i].nbytes}"]
    clash = "false"
    for j in (j for j in lo if j >= n_in):
        for i in (i for i in lo if i < j):
            lines += [f"  %o{i}.{j}.a = icmp ult {_SSIZE_T} %d{i}.lo, %d{j}.hi",
                      f"  %o{i}.{j}.b = icmp ult {_SSIZE_T} %d{j}.lo, %d{i}.hi",
                      f"  %o{i}.{j} = and i1 %o{i}.{j}.a, %o{i}.{j}.b",
                      f"  %c{i}.{j} = or i1 {clash}, %o{i}.{j}"]
            clash = f"%c{i}.{j}"
    args = ", ".join(f"ptr %d{i}" for i in range(n))
    lines += [f"  br i1 {clash}, label %reject, label %run",
              "run:",
              "  %ts = call ptr @PyEval_SaveThread()",
              f'  call void @"{callee}"({args})',
              "  call void @PyEval_RestoreThread(ptr %ts)",
              "  call void @Py_IncRef(ptr %self)",
              "  ret ptr %self",
              "reject:",
              f'  %ni.p = getelementptr inbounds {slots}, ptr @"{_EXPECT}", i64 0, i64 1',
              f"  %ni = load ptr, ptr %ni.p, align {_PTR_SIZE}",
              "  call void @Py_IncRef(ptr %ni)",
              "  ret ptr %ni",
              "}", ""]
    return "\n".join(lines)


_PY_DECLS = "\n".join(["declare ptr @PyEval_SaveThread()",
                       "declare void @PyEval_RestoreThread(ptr)",
                       "declare void @Py_IncRef(ptr)",
                       f"declare {_SSIZE_T} @PyLong_AsSsize_t(ptr)", ""])


def _parallel_ir(kernel: CpuKernel, n_args: int) -> str:
    """IR of ``void tessera.parallel(ptr d0, ..., i64 n)``: runs ``<entry>.range`` on
    ``n`` (1 <= n <= extent) near-equal slices of the kernel's parallel loop, slice 0
    on the calling thread and the others on threads made with ``pthread_create``
    (joined before returning; a slice whose thread cannot be made runs on the calling
    thread). ``tessera.slice`` is the thread body: it reads the pointers and its
    ``[begin, end)`` from a ``{ptr args, i64 begin, i64 end}`` context."""
    extent = kernel.parallel
    loads, ptrs = [], []
    for i in range(n_args):
        loads += [f"  %q{i} = getelementptr inbounds ptr, ptr %argv, i64 {i}",
                  f"  %v{i} = load ptr, ptr %q{i}, align 8"]
        ptrs.append(f"ptr %v{i}")
    stores = []
    for i in range(n_args):
        stores += [f"  %w{i} = getelementptr inbounds ptr, ptr %argv, i64 {i}",
                   f"  store ptr %d{i}, ptr %w{i}, align 8"]
    params = ", ".join(f"ptr %d{i}" for i in range(n_args))
    return "\n".join([
        "declare i32 @pthread_create(ptr, ptr, ptr, ptr)",
        f"declare i32 @pthread_join({_PTHREAD_T}, ptr)",
        'define internal ptr @"tessera.slice"(ptr %ctx) {',
        "  %argv = load ptr, ptr %ctx, align 8",
        "  %pb = getelementptr inbounds { ptr, i64, i64 }, ptr %ctx, i64 0, i32 1",
        "  %begin = load i64, ptr %pb, align 8",
        "  %pe = getelementptr inbounds { ptr, i64, i64 }, ptr %ctx, i64 0, i32 2",
        "  %end = load i64, ptr %pe, align 8",
        *loads,
        f'  call void @"{kernel.range_entry}"({", ".join(ptrs)}, i64 %begin, i64 %end)',
        "  ret ptr null",
        "}",
        f'define void @"{_PAR_ENTRY}"({params}, i64 %n) {{',
        "entry:",
        f"  %argv = alloca ptr, i64 {n_args}, align 8",
        *stores,
        "  %ctxs = alloca { ptr, i64, i64 }, i64 %n, align 8",
        f"  %tids = alloca {_PTHREAD_T}, i64 %n, align 8",
        "  %made = alloca i8, i64 %n, align 1",
        "  br label %fill",
        # Slice t is [extent*t/n, extent*(t+1)/n): sizes differ by at most one.
        "fill:",
        "  %t = phi i64 [ 0, %entry ], [ %t1, %fill ]",
        "  %t1 = add nuw nsw i64 %t, 1",
        f"  %lo.m = mul nuw nsw i64 %t, {extent}",
        "  %lo = udiv i64 %lo.m, %n",
        f"  %hi.m = mul nuw nsw i64 %t1, {extent}",
        "  %hi = udiv i64 %hi.m, %n",
        "  %c = getelementptr inbounds { ptr, i64, i64 }, ptr %ctxs, i64 %t",
        "  store ptr %argv, ptr %c, align 8",
        "  %cb = getelementptr inbounds { ptr, i64, i64 }, ptr %ctxs, i64 %t, i32 1",
        "  store i64 %lo, ptr %cb, align 8",
        "  %ce = getelementptr inbounds { ptr, i64, i64 }, ptr %ctxs, i64 %t, i32 2",
        "  store i64 %hi, ptr %ce, align 8",
        "  %more = icmp ult i64 %t1, %n",
        "  br i1 %more, label %fill, label %spawn.head",
        "spawn.head:",
        "  br label %spawn",
        "spawn:",
        "  %s = phi i64 [ 1, %spawn.head ], [ %s1, %spawn.next ]",
        "  %go = icmp ult i64 %s, %n",
        "  br i1 %go, label %spawn.body, label %run0",
        "spawn.body:",
        "  %sc = getelementptr inbounds { ptr, i64, i64 }, ptr %ctxs, i64 %s",
        f"  %st = getelementptr inbounds {_PTHREAD_T}, ptr %tids, i64 %s",
        '  %rc = call i32 @pthread_create(ptr %st, ptr null, ptr @"tessera.slice", ptr %sc)',
        "  %ok = icmp eq i32 %rc, 0",
        "  %sm = getelementptr inbounds i8, ptr %made, i64 %s",
        "  %okb = zext i1 %ok to i8",
        "  store i8 %okb, ptr %sm, align 1",
        "  br i1 %ok, label %spawn.next, label %spawn.inline",
        "spawn.inline:",
        '  %r.inline = call ptr @"tessera.slice"(ptr %sc)',
        "  br label %spawn.next",
        "spawn.next:",
        "  %s1 = add nuw nsw i64 %s, 1",
        "  br label %spawn",
        "run0:",
        '  %r0 = call ptr @"tessera.slice"(ptr %ctxs)',
        "  br label %join",
        "join:",
        "  %j = phi i64 [ 1, %run0 ], [ %j1, %join.next ]",
        "  %jgo = icmp ult i64 %j, %n",
        "  br i1 %jgo, label %join.body, label %done",
        "join.body:",
        "  %jm = getelementptr inbounds i8, ptr %made, i64 %j",
        "  %jmade = load i8, ptr %jm, align 1",
        "  %jok = icmp ne i8 %jmade, 0",
        "  br i1 %jok, label %join.call, label %join.next",
        "join.call:",
        f"  %jt = getelementptr inbounds {_PTHREAD_T}, ptr %tids, i64 %j",
        f"  %tid = load {_PTHREAD_T}, ptr %jt",
        f"  %jr = call i32 @pthread_join({_PTHREAD_T} %tid, ptr null)",
        "  br label %join.next",
        "join.next:",
        "  %j1 = add nuw nsw i64 %j, 1",
        "  br label %join",
        "done:",
        "  ret void",
        "}", ""])


def _builtin(address: int, name: str) -> tuple[Callable[..., None], _PyMethodDef]:
    """A Python builtin function for the METH_FASTCALL function at ``address``, and
    the method definition it points to (keep it alive as long as the function)."""
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.POINTER(_PyMethodDef), ctypes.py_object, ctypes.py_object]
    method = _PyMethodDef(name.encode(), address, _METH_FASTCALL, None)
    return new(ctypes.byref(method), None, None), method


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
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_THREADS))


def auto_threads(kernel: CpuKernel, limit: int) -> int:
    """Threads an automatic call of ``kernel`` uses with at most ``limit``: one per
    ``BYTES_PER_THREAD`` the kernel moves (inputs plus outputs), at most its parallel
    extent; 1 for serial kernels."""
    if not kernel.parallel:
        return 1
    moved = sum(s.nbytes for s in (*kernel.inputs, *kernel.outputs))
    return max(1, min(limit, kernel.parallel, moved // BYTES_PER_THREAD))


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
        return min(threads, self.kernel.parallel)


def _c_strides(spec: TensorSpec) -> tuple[int, ...]:
    return np.empty(spec.shape, spec.numpy_dtype).strides if spec.size else \
        np.lib.stride_tricks.as_strided(np.empty(1, spec.numpy_dtype), spec.shape).strides


def load_kernel(kernel: CpuKernel) -> LoadedKernel:
    """JIT-compile ``kernel`` through the process-wide Jit (memory and disk cached).
    Kernels with a parallel form also get it, run on :func:`cpu_threads` threads when
    :func:`auto_threads` says the work pays for them."""
    n_args = len(kernel.inputs) + len(kernel.outputs)
    ir_text = kernel.ir
    if kernel.parallel:
        ir_text += "\n" + _parallel_ir(kernel, n_args)
    threads = auto_threads(kernel, cpu_threads())
    if not _FAST_CALL:
        module = get_jit().compile(ir_text)
        ptrs = [ctypes.c_void_p] * n_args
        fn = ctypes.CFUNCTYPE(None, *ptrs)(module.address(kernel.entry))
        par_fn = None
        if kernel.parallel:
            par_fn = ctypes.CFUNCTYPE(None, *ptrs, ctypes.c_int64)(module.address(_PAR_ENTRY))
        return LoadedKernel(kernel, fn, fast=False, keepalive=module, par_fn=par_fn,
                            threads=threads)
    specs = (*kernel.inputs, *kernel.outputs)
    wrappers = [_PY_DECLS, _pycall_ir(_PY_ENTRY, kernel.entry, n_args, False)]
    if _NATIVE_CHECKS:
        wrappers.append(_checked_pycall_ir(_CHECKED_ENTRY, kernel.entry, specs,
                                           len(kernel.inputs)))
    if kernel.parallel:
        wrappers.append(_pycall_ir(_PY_PAR_ENTRY, _PAR_ENTRY, n_args, True))
    module = get_jit().compile(ir_text + "\n" + "\n".join(wrappers))
    fn, method = _builtin(module.address(_PY_ENTRY), kernel.name)
    par_fn = par_method = checked_fn = checked_method = None
    if kernel.parallel:
        par_fn, par_method = _builtin(module.address(_PY_PAR_ENTRY), kernel.name)
    if _NATIVE_CHECKS:
        expect = (ctypes.c_void_p * (n_args + 2)).from_address(module.global_address(_EXPECT))
        # The same values whenever a cached module is loaded again, so rewriting them
        # cannot disturb a call running on another thread.
        expect[:] = [id(np.ndarray), id(NotImplemented), *(id(s.numpy_dtype) for s in specs)]
        checked_fn, checked_method = _builtin(module.address(_CHECKED_ENTRY), kernel.name)
    # The machine code lives as long as its module: keep both with the kernel.
    return LoadedKernel(kernel, fn, fast=True,
                        keepalive=(method, par_method, checked_method, module),
                        par_fn=par_fn, threads=threads, checked_fn=checked_fn)
