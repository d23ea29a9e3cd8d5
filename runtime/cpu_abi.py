"""How compiled kernels are called from Python: the CPython calling-convention glue of
:mod:`tessera.runtime.cpu`.

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
is numpy's ABI, verified at import on probe arrays, see :func:`array_layout_holds`).
A call then costs ~0.8 us (0.7 with ``out=``), from ~2 (~4.5). On any mismatch it runs
nothing and returns ``NotImplemented``; the Python checks then copy what can be copied
or raise the detailed error. The process addresses it compares against (the ndarray
type, the dtype singletons, ``NotImplemented``) are written into a global of the
compiled module after loading, so the IR text (a disk cache key) holds none.

Kernels with a parallel form (``CpuKernel.parallel``) also get ``tessera.parallel``,
which splits the parallel loop into near-equal slices and runs them on the process's
pool of worker threads (:mod:`.cpu_pool`, whose IR each such module carries), slice 0
on the calling thread. The workers stay awake ~0.7 ms after a call, so a model's next
kernel finds them ready (a thread started per call cost ~50 us here).

The layouts all this IR bakes in (pointer and ``Py_ssize_t`` sizes, where numpy's fields
sit) are an :class:`Abi`: this process's (:data:`NATIVE`) for the JIT, another host's
for a kernel's module compiled ahead of time for it (:func:`module_ir`,
:mod:`tessera.runtime.aot`).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tessera.compiler.cpu.kernel import CpuKernel, TensorSpec

from .cpu_pool import CTX, POOL, POOL_RUN, pool_ir

PY_ENTRY = "tessera.pycall"
PY_PAR_ENTRY = "tessera.pycall.parallel"
PAR_ENTRY = "tessera.parallel"
_METH_FASTCALL = 0x0080


@dataclass(frozen=True)
class Abi:
    """The layouts the wrappers' IR bakes in, for one kind of host: the size of a pointer
    (also ``Py_ssize_t`` and Linux's ``pthread_t``, an ``unsigned long``, on the LP64
    and ILP32 Linux hosts Tessera runs on: a PYNQ-Z1/Z2 runs 32-bit ARM Linux) and of
    CPython's ``PyObject_HEAD`` (reference count, type pointer), after which numpy's
    ``PyArrayObject_fields`` follow (:data:`ARRAY_FIELDS`, C alignment rules).
    :data:`NATIVE` is this process's; :meth:`for_pointer_bytes` a non-debug CPython's on
    another host (objects compiled ahead of time for a board)."""

    pointer: int
    object_head: int

    @classmethod
    def for_pointer_bytes(cls, pointer: int) -> "Abi":
        """A non-debug CPython's layout on a host with ``pointer``-byte pointers."""
        return cls(pointer, 2 * pointer)

    @property
    def ssize_t(self) -> str:
        """LLVM type of ``Py_ssize_t``."""
        return f"i{8 * self.pointer}"

    @property
    def pthread_t(self) -> str:
        """LLVM type of ``pthread_t`` on Linux."""
        return f"i{8 * self.pointer}"

    @property
    def type_offset(self) -> int:
        """Offset of ``ob_type``, which ends ``PyObject_HEAD``."""
        return self.object_head - self.pointer

    def field_offset(self, name: str) -> int:
        """Offset of numpy's ``PyArrayObject_fields.<name>`` (``data`` right after the
        object header; each field aligned to its size, as a C compiler lays it out)."""
        offset = self.object_head
        for field, size in ARRAY_FIELDS:
            size = size or self.pointer
            offset = -(-offset // size) * size
            if field == name:
                return offset
            offset += size
        raise KeyError(name)

    def to_dict(self) -> dict[str, int]:
        return {"pointer": self.pointer, "object_head": self.object_head}

    @classmethod
    def from_dict(cls, d: dict) -> "Abi":
        return cls(int(d["pointer"]), int(d["object_head"]))


#: numpy's ``PyArrayObject_fields`` up to ``flags``: (name, size in bytes; 0: a pointer).
ARRAY_FIELDS = (("data", 0), ("nd", 4), ("dimensions", 0), ("strides", 0), ("base", 0),
                ("descr", 0), ("flags", 4))
#: This process's layouts (``Py_ssize_t`` and ``unsigned long`` are pointer-sized on the
#: Linux hosts Tessera supports; :data:`FAST_CALL` checks the header on a probe).
NATIVE = Abi(ctypes.sizeof(ctypes.c_void_p), object.__basicsize__)


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


_TYPE_OFFSET = NATIVE.type_offset
_C_CONTIGUOUS, _ALIGNED, _WRITEABLE = 0x1, 0x100, 0x400     # NPY_ARRAY_* flags
CHECKED_ENTRY = "tessera.pycall.checked"
EXPECT = "tessera.expect"


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


def array_layout_holds() -> bool:
    """True if ndarray objects are laid out as ``_ArrayFields`` says and the flag bits
    are the ones the checked wrapper tests, on probes that differ in every field, and
    :data:`NATIVE` places the fields where ``_ArrayFields`` does."""
    if any(getattr(_ArrayFields, name).offset != NATIVE.field_offset(name)
           for name, _ in ARRAY_FIELDS):
        return False
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
    if ctypes.c_void_p.from_address(id(probe) + NATIVE.field_offset("data")).value != probe.ctypes.data:
        return False
    return all(hasattr(ctypes.pythonapi, f) for f in
               ("PyCFunction_NewEx", "PyEval_SaveThread", "PyEval_RestoreThread", "Py_IncRef"))


FAST_CALL = _fast_call_available()
NATIVE_CHECKS = FAST_CALL and array_layout_holds()


def _data_pointers(n_args: int, abi: Abi) -> list[str]:
    """IR loading the data pointer of array ``args[i]`` into ``%d{i}``."""
    body = []
    for i in range(n_args):
        body += [f"  %p{i} = getelementptr inbounds ptr, ptr %args, i64 {i}",
                 f"  %a{i} = load ptr, ptr %p{i}, align {abi.pointer}",
                 f"  %g{i} = getelementptr inbounds i8, ptr %a{i}, i64 "
                 f"{abi.field_offset('data')}",
                 f"  %d{i} = load ptr, ptr %g{i}, align {abi.pointer}"]
    return body


def pycall_ir(name: str, callee: str, n_args: int, threads_arg: bool,
              abi: Abi = NATIVE) -> str:
    """IR of ``PyObject *name(PyObject *self, PyObject *const *args, Py_ssize_t
    nargs)``: calls ``callee`` with the data pointers of the ``n_args`` arrays in
    ``args`` (checked by the caller) without the GIL; returns ``self`` (None) as a new
    reference. With ``threads_arg``, ``args[n_args]`` is a Python int passed on as a
    trailing i64 (the thread count). ``abi``: the layouts of the host it runs on."""
    body = _data_pointers(n_args, abi)
    ssize_t = abi.ssize_t
    args = [f"ptr %d{i}" for i in range(n_args)]
    if threads_arg:
        body += [f"  %pn = getelementptr inbounds ptr, ptr %args, i64 {n_args}",
                 f"  %an = load ptr, ptr %pn, align {abi.pointer}",
                 f"  %nt = call {ssize_t} @PyLong_AsSsize_t(ptr %an)"]
        if ssize_t != "i64":
            body.append(f"  %nt64 = sext {ssize_t} %nt to i64")
        args.append("i64 %nt64" if ssize_t != "i64" else "i64 %nt")
    return "\n".join([
        f'define ptr @"{name}"(ptr %self, ptr %args, {ssize_t} %nargs) {{',
        *body,
        "  %ts = call ptr @PyEval_SaveThread()",
        f'  call void @"{callee}"({", ".join(args)})',
        "  call void @PyEval_RestoreThread(ptr %ts)",
        "  call void @Py_IncRef(ptr %self)",
        "  ret ptr %self",
        "}", ""])


def _field(a: str, field: str, ty: str, out: str, abi: Abi) -> list[str]:
    """IR loading numpy's ``<field>`` (of LLVM type ``ty``) of object ``%a`` into
    ``%out`` (aligned as an int: every field is at least that)."""
    offset = abi.field_offset(field)
    return [f"  %{out}.p = getelementptr inbounds i8, ptr %{a}, i64 {offset}",
            f"  %{out} = load {ty}, ptr %{out}.p, align {ctypes.sizeof(ctypes.c_int)}"]


def checked_pycall_ir(name: str, callee: str, specs: Sequence[TensorSpec],
                       n_in: int, abi: Abi = NATIVE) -> str:
    """IR of a METH_FASTCALL function like :func:`pycall_ir`'s that first checks its
    arguments against ``specs`` (inputs, then outputs): exactly ``len(specs)`` of them,
    each an exact ndarray with the spec's dtype singleton and shape, C-contiguous and
    aligned (outputs also writeable), no output's bytes overlapping another argument's
    (the kernel's pointers are noalias). If all hold it runs ``callee`` without the GIL
    and returns None; otherwise it returns ``NotImplemented`` having touched nothing.
    The expected object addresses come from the global ``tessera.expect``: ndarray,
    NotImplemented, then each argument's dtype (filled in by :func:`load_kernel`).
    ``abi``: the layouts of the host it runs on."""
    n = len(specs)
    ssize_t = abi.ssize_t
    slots = f"[{n + 2} x ptr]"
    lines = [f'@"{EXPECT}" = global {slots} zeroinitializer',
             f'define ptr @"{name}"(ptr %self, ptr %args, {ssize_t} %nargs) {{',
             "entry:",
             f"  %nargs.ok = icmp eq {ssize_t} %nargs, {n}",
             f'  %ndarray = load ptr, ptr @"{EXPECT}", align {abi.pointer}',
             "  br i1 %nargs.ok, label %arg0, label %reject"]
    for i, spec in enumerate(specs):
        after = f"arg{i + 1}" if i + 1 < n else "disjoint"
        lines += _argument_check_ir(i, spec, i >= n_in, slots, after, abi)
    lines += ["disjoint:", *_disjoint_ir(specs, n_in, abi)]
    args = ", ".join(f"ptr %d{i}" for i in range(n))
    lines += ["run:",
              "  %ts = call ptr @PyEval_SaveThread()",
              f'  call void @"{callee}"({args})',
              "  call void @PyEval_RestoreThread(ptr %ts)",
              "  call void @Py_IncRef(ptr %self)",
              "  ret ptr %self",
              "reject:",
              f'  %ni.p = getelementptr inbounds {slots}, ptr @"{EXPECT}", i64 0, i64 1',
              f"  %ni = load ptr, ptr %ni.p, align {abi.pointer}",
              "  call void @Py_IncRef(ptr %ni)",
              "  ret ptr %ni",
              "}", ""]
    return "\n".join(lines)


def _argument_check_ir(i: int, spec: TensorSpec, output: bool, slots: str,
                       after: str, abi: Abi) -> list[str]:
    """Blocks ``arg<i>...`` of :func:`checked_pycall_ir`: argument ``i`` is an ndarray
    matching ``spec`` (writeable if an ``output``), its data pointer left in ``%d<i>``;
    on success they branch to block ``after``, else to ``reject``."""
    flags = _C_CONTIGUOUS | _ALIGNED | (_WRITEABLE if output else 0)
    ptr, ssize_t = abi.pointer, abi.ssize_t
    # Blocks in order, each reading only what the previous one proved is there:
    # the type (any object has one), the fixed fields, the dimensions array.
    lines = [f"arg{i}:",
             f"  %a{i}.p = getelementptr inbounds ptr, ptr %args, i64 {i}",
             f"  %a{i} = load ptr, ptr %a{i}.p, align {ptr}",
             f"  %a{i}.t.p = getelementptr inbounds i8, ptr %a{i}, i64 {abi.type_offset}",
             f"  %a{i}.t = load ptr, ptr %a{i}.t.p, align {ptr}",
             f"  %a{i}.t.ok = icmp eq ptr %a{i}.t, %ndarray",
             f"  br i1 %a{i}.t.ok, label %arg{i}.fields, label %reject",
             f"arg{i}.fields:",
             *_field(f"a{i}", "nd", "i32", f"a{i}.nd", abi),
             *_field(f"a{i}", "descr", "ptr", f"a{i}.dt", abi),
             *_field(f"a{i}", "flags", "i32", f"a{i}.fl", abi),
             f"  %a{i}.dt.e.p = getelementptr inbounds {slots}, ptr @\"{EXPECT}\", "
             f"i64 0, i64 {i + 2}",
             f"  %a{i}.dt.e = load ptr, ptr %a{i}.dt.e.p, align {ptr}",
             f"  %a{i}.nd.ok = icmp eq i32 %a{i}.nd, {spec.ndim}",
             f"  %a{i}.dt.ok = icmp eq ptr %a{i}.dt, %a{i}.dt.e",
             f"  %a{i}.fl.m = and i32 %a{i}.fl, {flags}",
             f"  %a{i}.fl.ok = icmp eq i32 %a{i}.fl.m, {flags}",
             f"  %a{i}.ok0 = and i1 %a{i}.nd.ok, %a{i}.dt.ok",
             f"  %a{i}.ok1 = and i1 %a{i}.ok0, %a{i}.fl.ok",
             f"  br i1 %a{i}.ok1, label %arg{i}.shape, label %reject",
             f"arg{i}.shape:",
             *_field(f"a{i}", "data", "ptr", f"d{i}", abi)]
    if not spec.ndim:
        return lines + [f"  br label %{after}"]
    lines += _field(f"a{i}", "dimensions", "ptr", f"a{i}.dims", abi)
    ok = "true"
    for k, d in enumerate(spec.shape):
        lines += [f"  %a{i}.d{k}.p = getelementptr inbounds {ssize_t}, "
                  f"ptr %a{i}.dims, i64 {k}",
                  f"  %a{i}.d{k} = load {ssize_t}, ptr %a{i}.d{k}.p, align {ptr}",
                  f"  %a{i}.d{k}.ok = icmp eq {ssize_t} %a{i}.d{k}, {d}",
                  f"  %a{i}.s{k} = and i1 {ok}, %a{i}.d{k}.ok"]
        ok = f"%a{i}.s{k}"
    return lines + [f"  br i1 {ok}, label %{after}, label %reject"]


def _disjoint_ir(specs: Sequence[TensorSpec], n_in: int, abi: Abi) -> list[str]:
    """Body of :func:`checked_pycall_ir`'s ``disjoint`` block: to ``reject`` if an
    output's bytes overlap another argument's, else to ``run``."""
    # Two contiguous buffers overlap iff their byte ranges intersect; empty ones hold
    # no bytes. Inputs may overlap each other (the kernel only reads them).
    lines = []
    filled = [i for i, sp in enumerate(specs) if sp.nbytes]
    ssize_t = abi.ssize_t
    for i in filled:
        lines += [f"  %d{i}.lo = ptrtoint ptr %d{i} to {ssize_t}",
                  f"  %d{i}.hi = add {ssize_t} %d{i}.lo, {specs[i].nbytes}"]
    clash = "false"
    for j in (j for j in filled if j >= n_in):
        for i in (i for i in filled if i < j):
            lines += [f"  %o{i}.{j}.a = icmp ult {ssize_t} %d{i}.lo, %d{j}.hi",
                      f"  %o{i}.{j}.b = icmp ult {ssize_t} %d{j}.lo, %d{i}.hi",
                      f"  %o{i}.{j} = and i1 %o{i}.{j}.a, %o{i}.{j}.b",
                      f"  %c{i}.{j} = or i1 {clash}, %o{i}.{j}"]
            clash = f"%c{i}.{j}"
    return lines + [f"  br i1 {clash}, label %reject, label %run"]


def py_decls(abi: Abi = NATIVE) -> str:
    """Declarations of the CPython functions the wrappers call."""
    return "\n".join(["declare ptr @PyEval_SaveThread()",
                      "declare void @PyEval_RestoreThread(ptr)",
                      "declare void @Py_IncRef(ptr)",
                      f"declare {abi.ssize_t} @PyLong_AsSsize_t(ptr)", ""])


def parallel_ir(kernel: CpuKernel, n_args: int, abi: Abi = NATIVE) -> str:
    """IR of ``void tessera.parallel(ptr d0, ..., i64 n)``: runs ``<entry>.range`` on
    ``n`` (1 <= n <= extent) near-equal slices of the kernel's parallel loop, on the
    process's pool of threads (:mod:`.cpu_pool`; slice 0 on the calling thread), or all
    on the calling thread if the pool is not attached or busy with another call.
    ``tessera.slice`` runs one: it reads the pointers and its ``[begin, end)`` from a
    ``{ptr args, i64 begin, i64 end}`` context. ``abi``: the layouts of the host it
    runs on."""
    stores = []
    for i in range(n_args):
        stores += [f"  %w{i} = getelementptr inbounds ptr, ptr %argv, i64 {i}",
                   f"  store ptr %d{i}, ptr %w{i}, align {abi.pointer}"]
    params = ", ".join(f"ptr %d{i}" for i in range(n_args))
    return "\n".join([
        pool_ir(abi.pthread_t),
        *_slice_ir(kernel.range_entry, n_args, abi),
        f'define void @"{PAR_ENTRY}"({params}, i64 %n) {{',
        "entry:",
        f"  %argv = alloca ptr, i64 {n_args}, align 8",
        *stores,
        f"  %ctxs = alloca {CTX}, i64 %n, align 8",
        "  br label %fill",
        *_fill_slices_ir(kernel.parallel),
        "run:",
        f'  %pool = load ptr, ptr @"{POOL}"',
        "  %attached = icmp ne ptr %pool, null",
        "  br i1 %attached, label %pooled, label %inline",
        "pooled:",
        f'  %ran = call i1 @"{POOL_RUN}"(ptr %pool, ptr @"tessera.slice", ptr %ctxs, i64 %n)',
        "  br i1 %ran, label %done, label %inline",
        "inline:",
        "  %t.i = phi i64 [ 0, %run ], [ 0, %pooled ], [ %t.i1, %inline.body ]",
        "  %t.more = icmp ult i64 %t.i, %n",
        "  br i1 %t.more, label %inline.body, label %done",
        "inline.body:",
        f"  %t.c = getelementptr inbounds {CTX}, ptr %ctxs, i64 %t.i",
        '  %t.r = call ptr @"tessera.slice"(ptr %t.c)',
        "  %t.i1 = add nuw nsw i64 %t.i, 1",
        "  br label %inline",
        "done:",
        "  ret void",
        "}", ""])


def _slice_ir(range_entry: str, n_args: int, abi: Abi) -> list[str]:
    """``tessera.slice(ptr ctx)``, one slice of :func:`parallel_ir`: calls
    ``range_entry`` with the context's ``n_args`` pointers and ``[begin, end)``."""
    loads, ptrs = [], []
    for i in range(n_args):
        loads += [f"  %q{i} = getelementptr inbounds ptr, ptr %argv, i64 {i}",
                  f"  %v{i} = load ptr, ptr %q{i}, align {abi.pointer}"]
        ptrs.append(f"ptr %v{i}")
    return [
        'define internal ptr @"tessera.slice"(ptr %ctx) {',
        f"  %argv = load ptr, ptr %ctx, align {abi.pointer}",
        f"  %pb = getelementptr inbounds {CTX}, ptr %ctx, i64 0, i32 1",
        "  %begin = load i64, ptr %pb, align 8",
        f"  %pe = getelementptr inbounds {CTX}, ptr %ctx, i64 0, i32 2",
        "  %end = load i64, ptr %pe, align 8",
        *loads,
        f'  call void @"{range_entry}"({", ".join(ptrs)}, i64 %begin, i64 %end)',
        "  ret ptr null",
        "}"]


def _fill_slices_ir(extent: int) -> list[str]:
    """Block ``fill`` of :func:`parallel_ir`: the ``n`` slice contexts over ``extent``,
    then on to ``run``."""
    # Slice t is [extent*t/n, extent*(t+1)/n): sizes differ by at most one.
    return [
        "fill:",
        "  %t = phi i64 [ 0, %entry ], [ %t1, %fill ]",
        "  %t1 = add nuw nsw i64 %t, 1",
        f"  %lo.m = mul nuw nsw i64 %t, {extent}",
        "  %lo = udiv i64 %lo.m, %n",
        f"  %hi.m = mul nuw nsw i64 %t1, {extent}",
        "  %hi = udiv i64 %hi.m, %n",
        f"  %c = getelementptr inbounds {CTX}, ptr %ctxs, i64 %t",
        "  store ptr %argv, ptr %c, align 8",
        f"  %cb = getelementptr inbounds {CTX}, ptr %ctxs, i64 %t, i32 1",
        "  store i64 %lo, ptr %cb, align 8",
        f"  %ce = getelementptr inbounds {CTX}, ptr %ctxs, i64 %t, i32 2",
        "  store i64 %hi, ptr %ce, align 8",
        "  %more = icmp ult i64 %t1, %n",
        "  br i1 %more, label %fill, label %run"]


def builtin(address: int, name: str) -> tuple[Callable[..., None], _PyMethodDef]:
    """A Python builtin function for the METH_FASTCALL function at ``address``, and
    the method definition it points to (keep it alive as long as the function)."""
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.POINTER(_PyMethodDef), ctypes.py_object, ctypes.py_object]
    method = _PyMethodDef(name.encode(), address, _METH_FASTCALL, None)
    return new(ctypes.byref(method), None, None), method


def module_functions(kernel: CpuKernel, *, fast: bool = True,
                     checked: bool = True) -> list[str]:
    """The functions :func:`module_ir` defines for ``kernel`` that callers look up."""
    names = [kernel.entry] + ([PAR_ENTRY] if kernel.parallel else [])
    if fast:
        names += [PY_ENTRY] + ([CHECKED_ENTRY] if checked else []) \
            + ([PY_PAR_ENTRY] if kernel.parallel else [])
    return names


def module_ir(kernel: CpuKernel, layout: Abi = NATIVE, *, fast: bool = True,
              checked: bool = True, vector_bits: int | None = None) -> str:
    """The module compiled for ``kernel``: its IR (the variant for ``vector_bits``-wide
    vectors if it has one, :meth:`CpuKernel.ir_for`), its parallel dispatcher (if it has
    a parallel form) and, with ``fast``, the Python-call wrappers (the checked one with
    ``checked``), laid out for ``layout``. Objects compiled ahead of time have them all:
    the host loading one picks what it can use."""
    n_args = len(kernel.inputs) + len(kernel.outputs)
    parts = [kernel.ir if vector_bits is None else kernel.ir_for(vector_bits)]
    if kernel.parallel:
        parts.append(parallel_ir(kernel, n_args, layout))
    if fast:
        parts += [py_decls(layout),
                  pycall_ir(PY_ENTRY, kernel.entry, n_args, False, layout)]
        if checked:
            parts.append(checked_pycall_ir(CHECKED_ENTRY, kernel.entry,
                                           (*kernel.inputs, *kernel.outputs),
                                           len(kernel.inputs), layout))
        if kernel.parallel:
            parts.append(pycall_ir(PY_PAR_ENTRY, PAR_ENTRY, n_args, True, layout))
    return "\n".join(parts)
