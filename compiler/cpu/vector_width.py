"""The vector width CPU kernels are built for.

Kernel builders that tile by vector registers (the packed GEMM, the dot-product matmul,
the N:M sparse kernels) ask :func:`host_vector_bits`. It is this host's width, or, inside
:func:`building_for_vector_bits`, another CPU's: :func:`.lower.lower_node_to_cpu` lowers
a node again for each other width of :data:`VECTOR_WIDTHS` when its first lowering read
the width (:func:`noting_width_reads`) and keeps the IR as the kernel's variant
(:attr:`.kernel.CpuKernel.variants`). Objects for a CPU of another width (a board's
128-bit NEON, a portable ``x86-64-v3``'s AVX2, an AVX-512 server when compiled on an
AVX2 laptop) and a JIT on such a host compile that width's IR.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache

from tessera.errors import CpuKernelError

__all__ = ["STREAM_VECTOR_BITS", "VECTOR_WIDTHS", "building_for_vector_bits", "host_features",
           "host_vector_bits", "noting_width_reads", "vector_bits_of"]


@lru_cache(maxsize=None)
def host_features() -> dict:
    """This host's CPU features as LLVM sees them (name -> enabled)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    return dict(llvm.get_host_cpu_features())


#: The vector width kernels are being built for, when not this host's
#: (:func:`building_for_vector_bits`).
_BUILD_VECTOR_BITS: ContextVar[int | None] = ContextVar("tessera_build_vector_bits",
                                                        default=None)
#: Where :func:`host_vector_bits` notes that it was read (:func:`noting_width_reads`).
_WIDTH_READS: ContextVar[list | None] = ContextVar("tessera_width_reads", default=None)


#: The vector widths kernels are tiled for (:data:`.packed_gemm._TILES` has a tile each).
VECTOR_WIDTHS = (128, 256, 512)

#: The widest vectors a streaming loop (a few cheap ops per element loaded, so bound by
#: memory) is vectorised with (:func:`.kernel.prefer_vector_bits`). On this Zen 4 host
#: (AVX-512 executed as two 256-bit halves) such loops run faster with 256-bit vectors
#: than with 512-bit ones, aligned or not, on one thread: a float32 add of 1e6 elements
#: 1.05-1.10x, of 4e6 1.07-1.23x, ``x*1.5+y`` 1.02-1.13x; kernels of polynomials (exp
#: 0.61-0.72x at 256) or int8<->float32 conversions (quantize 0.90x) lose, and keep the
#: widest. Intel's AVX-512 CPUs already get 256 from LLVM's tuning; on CPUs of 256 bits
#: or fewer it changes nothing. ``benchmarks/cpu_kernels.py`` prints the comparison.
STREAM_VECTOR_BITS = 256


def vector_bits_of(features: Collection[str]) -> int:
    """Width of the widest vector registers of a CPU with ``features`` (LLVM names): 512
    with AVX-512 (F and BW), 256 with AVX2, else 128 (SSE, a board's NEON)."""
    if "avx512f" in features and "avx512bw" in features:
        return 512
    if "avx2" in features:
        return 256
    return 128


def host_vector_bits() -> int:
    """The vector width the kernels built now are tiled for: this host's
    (:func:`vector_bits_of` its features as LLVM sees them), or the width a
    :func:`building_for_vector_bits` block asks for."""
    reads = _WIDTH_READS.get()
    if reads is not None:
        reads.append(True)
    bits = _BUILD_VECTOR_BITS.get()
    return _own_vector_bits() if bits is None else bits


@contextmanager
def noting_width_reads() -> Iterator[list]:
    """A list that gets an entry each time :func:`host_vector_bits` is read inside the
    block: a kernel built without reading it is the same IR at every width."""
    reads: list = []
    token = _WIDTH_READS.set(reads)
    try:
        yield reads
    finally:
        _WIDTH_READS.reset(token)


@lru_cache(maxsize=None)
def _own_vector_bits() -> int:
    return vector_bits_of({name for name, on in host_features().items() if on})


@contextmanager
def building_for_vector_bits(bits: int) -> Iterator[None]:
    """Kernels built inside the block are tiled for ``bits``-wide vectors (a board's
    128-bit NEON, say) instead of this host's: the IR of the objects compiled for that
    CPU (:attr:`CpuKernel.variants`)."""
    if bits not in VECTOR_WIDTHS:
        raise CpuKernelError(f"vector width {bits} bits is not one of {VECTOR_WIDTHS}")
    token = _BUILD_VECTOR_BITS.set(bits)
    try:
        yield
    finally:
        _BUILD_VECTOR_BITS.reset(token)
