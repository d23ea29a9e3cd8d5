"""Byte-indexed table lookup as a CPU kernel: :func:`build_byte_lookup`.

``y[i] = table[byte(x[i])]`` for an 8-bit ``x`` (int8 or uint8) and a 256-entry
``table``: the kernel of ``QLookup`` (:mod:`..frontend.qlookup`), a whole quantized
activation in one load per element. The byte is the unsigned reading of the element
(int8 -1 is entry 255), so one table serves either input type.
"""
from __future__ import annotations

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module

__all__ = ["LOOKUP_INDEX_DTYPES", "build_byte_lookup"]

#: The input types a byte lookup takes.
LOOKUP_INDEX_DTYPES = ("int8", "uint8")


def build_byte_lookup(x: TensorSpec, out_dtype: str, name: str = "byte_lookup") -> CpuKernel:
    """Kernel ``entry(x, table[256] of out_dtype, y of out_dtype)`` with ``y`` shaped as
    ``x`` and ``y[i] = table[x[i] as an unsigned byte]``."""
    if x.dtype not in LOOKUP_INDEX_DTYPES:
        raise CpuKernelError(f"{name}: the input is {x.dtype}; a byte lookup takes "
                             f"{' or '.join(LOOKUP_INDEX_DTYPES)}")
    table, y = TensorSpec((256,), out_dtype), TensorSpec(x.shape, out_dtype)
    module = new_module(name)
    fn, b = kernel_function(module, "entry", [x, table], [y])
    xp, tp, yp = fn.args
    with U.for_range(b, x.size) as i:
        byte = b.zext(U.load(b, xp, i), ir.IntType(64))
        U.store(b, U.load(b, tp, byte), yp, i)
    b.ret_void()
    return CpuKernel(name, str(module), "entry", (x, table), (y,))
