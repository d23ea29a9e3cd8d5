"""CPU fallback kernels: what they take (``TensorSpec``) and what a builder returns
(``CpuKernel``: LLVM IR text plus the signature of its entry function).

A kernel is generated for one static shape, like the accelerator programs, so loop
bounds are constants and LLVM can vectorise and unroll them. The entry function takes
one pointer per input, then one per output, each a contiguous C-order buffer of the
spec's dtype that aliases no other argument, and returns void.

A kernel whose work splits along an outer loop also has a parallel form: ``parallel``
is that loop's extent, and the IR defines ``<entry>.range`` (see
:func:`range_function`), which takes the same pointers plus ``i64 begin, i64 end`` and
does iterations ``[begin, end)`` of it. Calls over disjoint ranges write disjoint
output bytes and together do exactly what ``entry`` does, so the runtime may run them
on several threads with results bit-identical to the serial call.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Sequence

import llvmlite.ir as ir
import numpy as np

from tessera.errors import CpuKernelError

#: Element dtypes of kernel arguments. ``bool`` is numpy's: one byte holding 0 or 1
#: (comparison outputs, Where conditions); kernels only test it, never do arithmetic on it.
DTYPES = ("int8", "uint8", "int16", "int32", "int64", "float32", "bool")

_LLVM_TYPES: dict[str, ir.Type] = {
    "int8": ir.IntType(8),
    "uint8": ir.IntType(8),
    "int16": ir.IntType(16),
    "int32": ir.IntType(32),
    "int64": ir.IntType(64),
    "float32": ir.FloatType(),
    "bool": ir.IntType(8),
}


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one kernel argument (a contiguous C-order buffer)."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise CpuKernelError(f"negative dimension in shape {shape}")
        if self.dtype not in DTYPES:
            raise CpuKernelError(f"dtype {self.dtype!r} is not one of {DTYPES}")
        object.__setattr__(self, "shape", shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.numpy_dtype.itemsize

    @property
    def llvm_type(self) -> ir.Type:
        """llvmlite type of one element (int8, uint8 and bool are all i8: signedness
        and truth live in the operations)."""
        return _LLVM_TYPES[self.dtype]

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorSpec":
        return cls(tuple(d["shape"]), d["dtype"])


@dataclass(frozen=True)
class CpuKernel:
    """One CPU kernel: LLVM IR (text) whose function `entry` takes one pointer per input,
    then one per output (contiguous C-order buffers, noalias), and returns void.
    ``parallel`` > 0 says the IR also defines ``<entry>.range`` over an outer loop of
    that extent (see the module docstring); 0 means serial only. ``variants``: the same
    kernel's IR tiled for other vector widths, ``(bits, ir)`` pairs (a board's 128-bit
    NEON, when ``ir`` was built for this host's AVX-512): what :meth:`ir_for` gives the
    objects and JIT of a CPU with that width. ``macs``: the multiply-adds of one call,
    for kernels whose time is their arithmetic rather than their bytes (the float GEMM
    and conv), so that the runtime gives them threads by work
    (:func:`tessera.runtime.cpu.auto_threads`); 0 for the others."""

    name: str
    ir: str
    entry: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parallel: int = 0
    variants: tuple[tuple[int, str], ...] = ()
    macs: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        if not isinstance(self.parallel, int) or self.parallel < 0:
            raise CpuKernelError(f"{self.name}: parallel extent must be an int >= 0, "
                                 f"not {self.parallel!r}")
        if not isinstance(self.macs, int) or self.macs < 0:
            raise CpuKernelError(f"{self.name}: macs must be an int >= 0, not {self.macs!r}")

    def ir_for(self, vector_bits: int) -> str:
        """The IR to compile for a CPU with ``vector_bits``-wide vectors: its variant, if
        the kernel has one (its tiles fit that CPU's registers), else :attr:`ir`."""
        return dict(self.variants).get(vector_bits, self.ir)

    @property
    def range_entry(self) -> str:
        """Name of the function doing part of the parallel loop (if ``parallel``)."""
        return f"{self.entry}.range"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (the compiled model file stores kernels this way)."""
        return {
            "name": self.name,
            "ir": self.ir,
            "entry": self.entry,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "parallel": self.parallel,
            **({"macs": self.macs} if self.macs else {}),
            **({"variants": {str(bits): ir for bits, ir in self.variants}}
               if self.variants else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CpuKernel":
        try:
            return cls(
                name=d["name"],
                ir=d["ir"],
                entry=d["entry"],
                inputs=tuple(TensorSpec.from_dict(s) for s in d["inputs"]),
                outputs=tuple(TensorSpec.from_dict(s) for s in d["outputs"]),
                # Records written before the parallel form existed have no such key.
                parallel=d.get("parallel", 0),
                variants=tuple((int(bits), ir) for bits, ir in d.get("variants", {}).items()),
                macs=d.get("macs", 0),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CpuKernelError(f"malformed CPU kernel record: {exc!r}") from exc


def new_module(name: str) -> ir.Module:
    """An empty module for one kernel. The JIT sets the host triple and data layout."""
    return ir.Module(name=name)


def kernel_function(
    module: ir.Module,
    entry: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    extra: Sequence[str] = (),
) -> tuple[ir.Function, ir.IRBuilder]:
    """Declare ``void entry(in0*, ..., out0*, ...)`` in ``module`` and return it with an
    IRBuilder positioned in its (empty) entry block.

    Pointer arguments are ``noalias`` (the caller passes distinct buffers, which is what
    lets LLVM vectorise without runtime overlap checks), ``captures(none)``, ``nofree``,
    ``align`` (element size) and ``dereferenceable(nbytes)`` (so loads may be
    speculated). The function is ``nounwind norecurse``. ``extra`` names trailing i64
    arguments (after the pointers)."""
    specs = [*inputs, *outputs]
    fnty = ir.FunctionType(ir.VoidType(), [ir.PointerType(s.llvm_type) for s in specs]
                           + [ir.IntType(64)] * len(extra))
    fn = ir.Function(module, fnty, name=entry)
    fn.attributes.add("nounwind")
    fn.attributes.add("norecurse")
    n_in = len(inputs)
    for i, (arg, spec) in enumerate(zip(fn.args, specs)):
        arg.name = f"in{i}" if i < n_in else f"out{i - n_in}"
        for attr in ("noalias", "captures(none)", "nofree"):
            arg.add_attribute(attr)
        arg.attributes.align = spec.numpy_dtype.itemsize
        if spec.nbytes:
            arg.add_attribute("nonnull")
            arg.attributes.dereferenceable = spec.nbytes
    for arg, name in zip(fn.args[len(specs):], extra):
        arg.name = name
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    return fn, builder


def prefer_vector_bits(fn: ir.Function, bits: int) -> None:
    """Have LLVM vectorise ``fn`` with vectors of at most ``bits`` bits (the x86
    backend's ``"prefer-vector-width"`` attribute; other targets ignore it), and keep it
    out of its callers: the Python-call wrappers it would be inlined into are compiled
    with the CPU's own preference."""
    # llvmlite's FunctionAttributes validates enum attributes only; a string attribute
    # is written into the IR the same way (sorted among them).
    set.add(fn.attributes, f'"prefer-vector-width"="{bits}"')
    fn.attributes.add("noinline")


def range_function(
    module: ir.Module,
    entry: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> tuple[ir.Function, ir.IRBuilder, ir.Value, ir.Value]:
    """Declare ``void <entry>.range(in0*, ..., out0*, ..., i64 begin, i64 end)`` (the
    parallel form, see the module docstring; pointers as in :func:`kernel_function`)
    and return it, an IRBuilder in its entry block, and ``begin`` and ``end``."""
    fn, b = kernel_function(module, f"{entry}.range", inputs, outputs, ("begin", "end"))
    return fn, b, fn.args[-2], fn.args[-1]
