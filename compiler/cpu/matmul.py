"""float32 tensor contractions: ONNX MatMul (batched, broadcasting, 1-D operands), Gemm
(transA, transB, alpha, beta, a broadcast C) and Einsum (any equation of float32
operands: matmuls, transposes, sums over an index, diagonals, ``...``).

All three are one loop nest, :func:`_emit_contraction`: ``out[o] = sum_r prod_k
op_k[o, r]`` where each operand reads the output and reduced indices through its own
element strides (0 where it does not have the index or broadcasts it). The output is
zeroed, then the loops run over the output indices but the last, all reduced indices,
and the last output index innermost: ``out[..., j] += a * b[..., j]``, a contiguous
loop that LLVM vectorises when the operands' last-index strides are 0 or 1 (MatMul's
``A[i, k] * B[k, j]``), the products fused into FMAs where the host has them.

From :data:`.packed_gemm.PACKED_MIN_MACS` multiply-adds on, float MatMul and Gemm run
instead (:func:`_float_form` decides) as :mod:`.packed_gemm`'s blocked, packed GEMM
(which operand is packed is :func:`_vector_side`'s choice: ``x @ W.T`` packs ``x.T``,
the weight is read in place), or, for ``x @ W.T`` with fewer rows than a panel, as
vector dot products along k (:func:`_dots_kernel`); a few rows times a ``W`` contiguous
along its columns stay in the nest.

Results differ from onnxruntime (MLAS's blocked SGEMM) in the last bits: the sums are
added in another order. :func:`build_matmul_integer` is the same nest in int32 on
int8/uint8 operands minus their zero points (exact); the int8 weight GEMM of the fused
dense layers is :func:`.conv.build_matmul_int8`.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

from . import irutil as U
from .irutil import F32
from .kernel import CpuKernel, TensorSpec, kernel_function, new_module, range_function
from .layout_ops import Scratch
from .packed_gemm import (PACKED_MIN_MACS, ROW_BLOCK, PackedGemm, Rows, declare,
                          emit_groups, emit_packed_gemm, item_span, share, strided_pack)
from .vector_width import VECTOR_WIDTHS, building_for_vector_bits, host_vector_bits

__all__ = ["build_einsum", "build_gemm", "build_matmul", "build_matmul_integer",
           "einsum_output_shape", "matmul_output_shape"]

#: FMA contraction allowed on the accumulation (one rounding instead of two).
_CONTRACT = ("contract",)


@dataclass(frozen=True)
class _Operand:
    """One factor of the product: its pointer index among the kernel's inputs and its
    element strides along every output index, then every reduced index."""

    arg: int
    out_strides: tuple[int, ...]
    red_strides: tuple[int, ...]
    dtype: str = "float32"
    zero_point: int = 0           # integer operands: subtracted after widening to int32


# ---------------------------------------------------------------------------- MatMul
def matmul_output_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """numpy.matmul's output shape (1-D operands promoted, then their axis dropped);
    CpuKernelError if the shapes do not fit."""
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    if len(a2) < 2 or len(b2) < 2 or a2[-1] != b2[-2]:
        raise CpuKernelError(f"MatMul: shapes {list(a)} and {list(b)} do not fit "
                             "(A's last dimension must equal B's second-to-last)")
    batch = _broadcast_shape(a2[:-2], b2[:-2])
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def build_matmul(a: TensorSpec, b: TensorSpec, name: str = "matmul") -> CpuKernel:
    """float32 ``numpy.matmul(a, b)``: batch dimensions broadcast, a 1-D ``a`` is a row
    and a 1-D ``b`` a column (their axis dropped from the output)."""
    _require_float("MatMul", a, b)
    return _matmul_kernel(name, a, b, "float32", (0, 0))


def build_matmul_integer(a: TensorSpec, b: TensorSpec, a_zero_point: int = 0,
                         b_zero_point: int = 0, name: str = "matmul_integer") -> CpuKernel:
    """int32 ``numpy.matmul(a - a_zero_point, b - b_zero_point)`` of int8/uint8 operands
    (broadcasting as :func:`build_matmul`; sums wrap in int32): ONNX MatMulInteger, and
    the accumulators of a QLinearMatMul of two activations."""
    bad = [s for s in (a, b) if s.dtype not in ("int8", "uint8")]
    if bad:
        raise CpuKernelError(f"MatMulInteger: operands must be int8 or uint8, not {bad[0]}")
    return _matmul_kernel(name, a, b, "int32", (int(a_zero_point), int(b_zero_point)))


def _matmul_kernel(name: str, a: TensorSpec, b: TensorSpec, acc: str,
                   zero_points: tuple[int, int]) -> CpuKernel:
    out = TensorSpec(matmul_output_shape(a.shape, b.shape), acc)
    a2 = (1, *a.shape) if a.ndim == 1 else a.shape
    b2 = (*b.shape, 1) if b.ndim == 1 else b.shape
    batch = _broadcast_shape(a2[:-2], b2[:-2])
    m, k, n = a2[-2], a2[-1], b2[-1]
    full = (*batch, m, n)
    sa = U.broadcast_strides(a2[:-2], batch) if batch else ()
    sb = U.broadcast_strides(b2[:-2], batch) if batch else ()
    macs = prod(batch) * m * n * k if acc == "float32" else 0
    if acc == "float32" and _float_form(m, n, k, (k, 1), (n, 1)) == "packed":
        return _packed_kernel(name, (a, b), out, batch,
                              (tuple(s * m * k for s in sa), tuple(s * k * n for s in sb)),
                              (m, n, k), (k, 1), (n, 1),
                              extent=_parallel_extent(m, n, k, (k, 1), (n, 1), {"packed"}))
    ops = [_Operand(0, (*(s * m * k for s in sa), k if m > 1 else 0, 0), (1,), a.dtype,
                    zero_points[0]),
           _Operand(1, (*(s * k * n for s in sb), 0, 1 if n > 1 else 0), (n,), b.dtype,
                    zero_points[1])]
    return _contraction_kernel(name, (a, b), out, full, (k,), ops, macs=macs)


# ------------------------------------------------------------------------------ Gemm
def build_gemm(a: TensorSpec, b: TensorSpec, c: TensorSpec | None = None,
               trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0,
               beta: float = 1.0, name: str = "gemm") -> CpuKernel:
    """float32 ONNX Gemm ``alpha * A' @ B' + beta * C`` (``A'`` is ``A.T`` if
    ``trans_a``, ``B'`` likewise), ``C`` broadcast to ``[M, N]`` (a scalar, ``[N]``,
    ``[M, 1]``, ...). alpha scales the finished sum and beta ``C``, as onnxruntime does."""
    _require_float("Gemm", a, b, *(() if c is None else (c,)))
    if a.ndim != 2 or b.ndim != 2:
        raise CpuKernelError(f"Gemm: A and B must be 2-D, got {a} and {b}")
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    k2, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != k2:
        raise CpuKernelError(f"Gemm: inner dimensions differ: A' is {m}x{k}, B' {k2}x{n}")
    out = TensorSpec((m, n), "float32")
    epilogue = None
    if c is not None or alpha != 1.0:
        cs = U.broadcast_strides(c.shape, (m, n)) if c is not None else None
        epilogue = _GemmEpilogue(float(alpha), float(beta), cs)
    inputs = (a, b) if c is None else (a, b, c)
    a_str, b_str = (1, m) if trans_a else (k, 1), (1, k) if trans_b else (n, 1)
    form = _float_form(m, n, k, a_str, b_str)
    extent = _parallel_extent(m, n, k, a_str, b_str, {"packed", "dots"})
    if form == "packed":
        return _packed_kernel(name, inputs, out, (), ((), ()), (m, n, k), a_str, b_str,
                              epilogue, extent)
    if form == "dots":
        return _dots_kernel(name, inputs, out, (m, n, k), epilogue, extent)
    ops = [_Operand(0, (1, 0) if trans_a else (k, 0), (m,) if trans_a else (1,)),
           _Operand(1, (0, k) if trans_b else (0, 1), (1,) if trans_b else (n,))]
    return _contraction_kernel(name, inputs, out, (m, n), (k,), ops, epilogue, m * n * k)


@dataclass(frozen=True)
class _GemmEpilogue:
    """``out = alpha * out + beta * C[i, j]`` (C's strides None: no C)."""

    alpha: float
    beta: float
    c_strides: tuple[int, int] | None

    def emit(self, b: ir.IRBuilder, args: Sequence[ir.Value], out: ir.Value,
             shape: tuple[int, int], spans: tuple[tuple[ir.Value, ir.Value], ...] | None
             = None) -> None:
        """On the ``[M, N]`` output ``out``, or its rows and columns in ``spans``
        (``[start, stop)`` each)."""
        m, n = shape
        (i0, i1), (j0, j1) = spans or ((0, m), (0, n))
        with U.for_range(b, i1, start=i0, name="ei") as i, \
                U.for_range(b, j1, start=j0, name="ej") as j:
            o = b.add(b.mul(i, U.i64(n)), j)
            v = U.load(b, out, o)
            if self.alpha != 1.0:
                v = b.fmul(v, U.f32(self.alpha))
            if self.c_strides is not None:
                si, sj = self.c_strides
                cv = U.load(b, args[2], b.add(b.mul(i, U.i64(si)), b.mul(j, U.i64(sj))))
                if self.beta != 1.0:
                    cv = b.fmul(cv, U.f32(self.beta))
                v = b.fadd(v, cv)
            U.store(b, v, out, o)


# ---------------------------------------------------------------------------- Einsum
def _parse_einsum(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """Each operand's labels and the output's, ``...`` expanded to one label per
    broadcast dimension (characters from U+0100, which cannot clash with the
    equation's letters), right-aligned across operands as numpy does."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise CpuKernelError(f"Einsum: equation {equation!r} has {len(terms)} operands, "
                             f"the node {len(ranks)}")
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t),
              default=0)
    dots = "".join(chr(0x100 + i) for i in range(ell))   # one non-letter label per dim
    labels = []
    for t, r in zip(terms, ranks):
        own = r - len(t.replace("...", "")) if "..." in t else 0
        lab = t.replace("...", dots[ell - own:])
        if len(lab) != r or not all(ch.isalpha() or ord(ch) >= 0x100 for ch in lab):
            raise CpuKernelError(f"Einsum: term {t!r} of {equation!r} does not fit an "
                                 f"operand of rank {r}")
        labels.append(lab)
    if not arrow:   # implicit output: the labels used once, sorted, after the "..." dims
        counts = "".join(labels)
        rhs = dots + "".join(sorted(ch for ch in set(counts) if ch.isalpha()
                                    and counts.count(ch) == 1))
    else:
        rhs = rhs.replace("...", dots)
    return labels, rhs


def _einsum_sizes(labels: Sequence[str], shapes: Sequence[Sequence[int]],
                  equation: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for lab, shape in zip(labels, shapes):
        for ch, d in zip(lab, shape):
            if sizes.get(ch, 1) not in (1, d) and d != 1:
                raise CpuKernelError(f"Einsum: index {ch!r} of {equation!r} has sizes "
                                     f"{sizes[ch]} and {d}")
            sizes[ch] = max(sizes.get(ch, d), d)
    return sizes


def einsum_output_shape(equation: str, shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The output shape of ONNX Einsum ``equation`` on operands of ``shapes``."""
    labels, rhs = _parse_einsum(equation, [len(s) for s in shapes])
    sizes = _einsum_sizes(labels, shapes, equation)
    missing = [ch for ch in rhs if ch not in sizes]
    if missing or len(set(rhs)) != len(rhs):
        raise CpuKernelError(f"Einsum: output {rhs!r} of {equation!r} names an index "
                             "twice or one no operand has")
    return tuple(sizes[ch] for ch in rhs)


def build_einsum(equation: str, inputs: Sequence[TensorSpec],
                 name: str = "einsum") -> CpuKernel:
    """float32 ONNX Einsum: the product of the operands summed over every index the
    output does not name (a repeated index in one operand reads its diagonal)."""
    _require_float("Einsum", *inputs)
    labels, rhs = _parse_einsum(equation, [s.ndim for s in inputs])
    sizes = _einsum_sizes(labels, [s.shape for s in inputs], equation)
    out = TensorSpec(einsum_output_shape(equation, [s.shape for s in inputs]), "float32")
    reduced = [ch for ch in dict.fromkeys("".join(labels)) if ch not in rhs]
    ops = []
    for k, (lab, spec) in enumerate(zip(labels, inputs)):
        own = U.c_strides(spec.shape)
        stride = {ch: 0 for ch in sizes}
        for ch, d, s in zip(lab, spec.shape, own):
            stride[ch] += s if d > 1 else 0     # a repeated index: the diagonal's stride
        ops.append(_Operand(k, tuple(stride[ch] for ch in rhs),
                            tuple(stride[ch] for ch in reduced)))
    return _contraction_kernel(name, tuple(inputs), out, out.shape,
                               tuple(sizes[ch] for ch in reduced), ops)


# ----------------------------------------------------------------------- the nest
def _contraction_kernel(name: str, inputs: Sequence[TensorSpec], out: TensorSpec,
                        shape: Sequence[int], red_shape: Sequence[int],
                        ops: Sequence[_Operand], epilogue: _GemmEpilogue | None = None,
                        macs: int = 0) -> CpuKernel:
    """The kernel of ``out = sum over red_shape of the operands' product`` over the
    output index space ``shape`` (``out``'s shape, or the same elements with MatMul's
    dropped 1-D axes kept). ``macs``: :attr:`CpuKernel.macs` (a float MatMul's or
    Gemm's, whatever form it takes at a vector width: the variants must agree)."""
    module = new_module(name)
    fn, b = kernel_function(module, "entry", inputs, (out,))
    args, dst = fn.args[:len(inputs)], fn.args[len(inputs)]
    U.fill(b, dst, out.size, U.const(out.dtype, 0))
    if out.size and prod(red_shape):
        _emit_contraction(b, args, dst, tuple(shape) or (1,), tuple(red_shape), ops,
                          out.dtype)
    if epilogue is not None and out.size:
        epilogue.emit(b, args, dst, tuple(shape))
    b.ret_void()
    return CpuKernel(name, str(module), "entry", tuple(inputs), (out,), macs=macs)


def _emit_contraction(b: ir.IRBuilder, args: Sequence[ir.Value], dst: ir.Value,
                      shape: tuple[int, ...], red_shape: tuple[int, ...],
                      ops: Sequence[_Operand], acc: str) -> None:
    """Loops: output indices but the last, reduced indices, the last output index;
    products and sums in ``acc`` (float32, or int32 wrapping)."""
    rank = len(shape)
    ops = [_Operand(o.arg, o.out_strides or (0,), o.red_strides, o.dtype, o.zero_point)
           for o in ops]
    out_strides = U.c_strides(shape)
    with U.nested_range(b, shape[:-1], name="o") as outer, \
            U.nested_range(b, red_shape, name="r") as red:
        base_out = _offset(b, outer, out_strides[:-1])
        bases = [b.add(_offset(b, outer, o.out_strides[:rank - 1]),
                       _offset(b, red, o.red_strides)) for o in ops]
        with U.for_range(b, shape[-1], name="j") as j:
            prod_v = None
            for o, base in zip(ops, bases):
                v = U.load(b, args[o.arg], b.add(base, b.mul(j, U.i64(o.out_strides[-1]))))
                if acc != "float32":
                    v = b.sub(U.widen(b, v, o.dtype, U.I32), U.const("int32", o.zero_point))
                prod_v = v if prod_v is None else U.mul(b, prod_v, v, acc, flags=_CONTRACT)
            idx = b.add(base_out, j)
            U.store(b, U.add(b, U.load(b, dst, idx), prod_v, acc, flags=_CONTRACT), dst, idx)


def _offset(b: ir.IRBuilder, idx: Sequence[ir.Value], strides: Sequence[int]) -> ir.Value:
    total: ir.Value = U.i64(0)
    for i, s in zip(idx, strides):
        if s:
            total = b.add(total, b.mul(i, U.i64(s)))
    return total


def _packed_kernel(name: str, inputs: Sequence[TensorSpec], out: TensorSpec,
                   batch: tuple[int, ...], batch_strides: tuple[tuple[int, ...], ...],
                   mnk: tuple[int, int, int], a_str: tuple[int, int],
                   b_str: tuple[int, int], epilogue: _GemmEpilogue | None = None,
                   extent: int = 0) -> CpuKernel:
    """``out[batch] = A'[batch] @ B'[batch]`` by :func:`emit_packed_gemm`: ``A'[i, k]``
    at ``a_str = (i, k)`` element strides, ``B'[k, j]`` at ``b_str``; the batch index's
    strides in A and B in ``batch_strides``. The vector side (packed operand) is
    :func:`_vector_side`'s. With an ``extent`` (:func:`_parallel_extent`), the parallel
    form splits the broadcast operand's rows in that many shares."""
    m, n, k = mnk
    if _vector_side(m, n, a_str, b_str) == "n":
        packed = _Packed(PackedGemm(m, n, k, a_str, (n, 1)), 0, b_str, batch, batch_strides,
                         epilogue)
    else:   # out.T = B'.T @ A'.T: B' broadcast, A' packed
        packed = _Packed(PackedGemm(n, m, k, b_str[::-1], (1, n)), 1, a_str[::-1], batch,
                         batch_strides, epilogue)
    module = new_module(name)
    fn, b = kernel_function(module, "entry", inputs, (out,))
    packed.emit(b, fn.args[:len(inputs)], fn.args[len(inputs)], None)
    if extent:
        fn, b, begin, end = range_function(module, "entry", inputs, (out,))
        packed.emit(b, fn.args[:len(inputs)], fn.args[len(inputs)],
                    share(b, (begin, end), extent, packed.g.row_blocks))
    return CpuKernel(name, str(module), "entry", tuple(inputs), (out,), parallel=extent,
                     macs=prod(batch) * m * n * k)


@dataclass(frozen=True)
class _Packed:
    """What :func:`_packed_kernel` emits: GEMM ``g`` with argument ``p_arg`` (0: A, 1: B)
    broadcast and the other packed (read at ``q_str``), per batch index."""

    g: PackedGemm
    p_arg: int
    q_str: tuple[int, int]
    batch: tuple[int, ...]
    batch_strides: tuple[tuple[int, ...], ...]
    epilogue: _GemmEpilogue | None

    def emit(self, b: ir.IRBuilder, args: Sequence[ir.Value], dst: ir.Value,
             blocks: Rows) -> None:
        """The function's body for the rows of P in ``blocks`` (None: all)."""
        g = self.g
        scratch = Scratch(b)
        panel = scratch.alloc(F32, g.panel_floats, name="panel")
        mn = g.rows * g.cols
        with U.nested_range(b, self.batch, name="bt") as idx:
            offs = [_offset(b, idx, s) for s in self.batch_strides]
            ptrs = [U.element_ptr(b, ptr, off) for ptr, off in zip(args[:2], offs)]
            o = U.element_ptr(b, dst, _offset(b, idx, U.c_strides((*self.batch, mn))[:-1]))
            emit_packed_gemm(b, g, ptrs[self.p_arg],
                             strided_pack(ptrs[1 - self.p_arg], self.q_str, g.panel), o,
                             panel, blocks)
        scratch.release()
        if self.epilogue is not None:
            spans = None
            if blocks is not None:   # P's rows are the output's rows, or (A packed) columns
                rows, every = g.row_span(b, blocks), (U.i64(0), U.i64(g.cols))
                spans = (rows, every) if self.p_arg == 0 else (every, rows)
            shape = (g.rows, g.cols) if self.p_arg == 0 else (g.cols, g.rows)
            self.epilogue.emit(b, args, dst, shape, spans)
        b.ret_void()


def _parallel_extent(m: int, n: int, k: int, a_str: tuple[int, int],
                     b_str: tuple[int, int], forms: set[str]) -> int:
    """The parallel extent of a float product's kernel: the larger of M and N in
    :data:`.packed_gemm.ROW_BLOCK`s, if :func:`_float_form` picks one of ``forms`` (those
    with a parallel form) at every vector width, else 0. (Which form runs, and which
    operand a packed one packs, depends on the width; one kernel's variants must split
    alike, each mapping the shares onto its own loop, :func:`.packed_gemm.share`.)"""
    extent = -(-max(m, n) // ROW_BLOCK)
    for bits in VECTOR_WIDTHS:
        with building_for_vector_bits(bits):
            if _float_form(m, n, k, a_str, b_str) not in forms:
                return 0
    return extent if extent > 1 else 0


def _float_form(m: int, n: int, k: int, a_str: tuple[int, int],
                b_str: tuple[int, int]) -> str:
    """Which float kernel computes ``A' @ B'`` (element strides ``(i, k)`` and ``(k,
    j)``): "dots" when both run along k and A' has fewer rows than a packed panel's
    columns (a dense layer ``x @ W.T`` at a small batch: packing would transpose all of
    W), "nest" for little work or a few rows times a B' contiguous along j (the loop
    nest vectorises along j, streaming B' once per row, with no packing), else
    "packed". (Measured on the Zen 5 dev host, x @ W.T with W 768x768: dots 0.2 ms at
    16 rows, packed with W transposed 0.7 ms.)"""
    g = PackedGemm(m, n, k, a_str, (n, 1))
    if m * n * k < PACKED_MIN_MACS:
        return "nest"
    if a_str[1] == 1 and b_str[0] == 1 and m < g.panel:
        return "dots"
    if m < g.tile[0] and b_str[1] == 1:
        return "nest"
    return "packed"


def _vector_side(m: int, n: int, a_str: tuple[int, int], b_str: tuple[int, int]) -> str:
    """"n" to pack B' (vectors along the output's rows), "m" to pack A'.T: the side
    that fills the panel's vectors, then the cheaper packing (a transposing copy,
    strided reads, counts double)."""
    panel = PackedGemm(m, n, 1, (0, 0), (0, 0)).panel
    if (n >= panel) != (m >= panel):
        return "n" if n >= panel else "m"
    if m < panel:
        return "n" if n >= m else "m"
    cost_n = n * (1 if b_str[1] == 1 else 2)
    cost_m = m * (1 if a_str[0] == 1 else 2)
    return "n" if cost_n <= cost_m else "m"


# ------------------------------------------------------------- dot-product form
#: Rows of A by rows of B one dot-product tile computes (16 vector accumulators).
_DOT_TILE = (4, 4)


def _dots_kernel(name: str, inputs: Sequence[TensorSpec], out: TensorSpec,
                 mnk: tuple[int, int, int], epilogue: _GemmEpilogue | None,
                 extent: int = 0) -> CpuKernel:
    """``out[i, j] = dot(A[i, :], B[j, :])`` for ``A [M, K]`` and ``B [N, K]`` (Gemm
    with transB): tiles of :data:`_DOT_TILE` rows of each, a vector accumulator per
    pair running along k, summed across its lanes at the end; no operand is copied.
    With an ``extent``, the parallel form splits B's rows (the output's columns) in
    that many shares."""
    m, n, k = mnk
    module = new_module(name)
    fn, b = kernel_function(module, "entry", inputs, (out,))
    _emit_dots(b, fn.args[:len(inputs) + 1], mnk, epilogue, None)
    if extent:
        fn, b, begin, end = range_function(module, "entry", inputs, (out,))
        groups = -(-n // _DOT_TILE[1])
        _emit_dots(b, fn.args[:len(inputs) + 1], mnk, epilogue,
                   share(b, (begin, end), extent, groups))
    return CpuKernel(name, str(module), "entry", tuple(inputs), (out,), parallel=extent,
                     macs=m * n * k)


def _emit_dots(b: ir.IRBuilder, args: Sequence[ir.Value], mnk: tuple[int, int, int],
               epilogue: _GemmEpilogue | None, blocks: Rows) -> None:
    """The body of :func:`_dots_kernel` for the groups of B's rows in ``blocks``
    (None: all); ``args`` are the inputs then the output."""
    m, n, _ = mnk
    ri, rj = _DOT_TILE
    gi, rest_i = divmod(m, ri)

    def b_rows(j0: ir.Value, nj: int) -> None:
        """Every row of A (the small operand, which stays in cache) against these rows
        of B, so B is read from memory once."""
        if gi:
            with U.for_range(b, gi, name="ig") as ig:
                _emit_dot_tile(b, args, (b.mul(ig, U.i64(ri)), j0), (ri, nj), mnk)
        if rest_i:
            _emit_dot_tile(b, args, (U.i64(gi * ri), j0), (rest_i, nj), mnk)

    emit_groups(b, n // rj, rj, n % rj, blocks, 1, b_rows, "jg")
    if epilogue is not None:
        spans = None
        if blocks is not None:
            spans = ((U.i64(0), U.i64(m)), item_span(b, blocks, rj, n))
        epilogue.emit(b, args, args[-1], (m, n), spans)
    b.ret_void()


def _emit_dot_tile(b: ir.IRBuilder, args, at: tuple[ir.Value, ir.Value],
                   size: tuple[int, int], mnk: tuple[int, int, int]) -> None:
    """Dot products of rows ``at[0]..+size[0]`` of A with rows ``at[1]..+size[1]`` of
    B: whole vectors along k, then the ``k % lanes`` rest one element at a time."""
    (_, n, k), (ni, nj) = mnk, size
    a, bm, dst = args[0], args[1], args[-1]
    lanes = host_vector_bits() // 32
    vt = ir.VectorType(F32, lanes)
    rows = [[b.mul(b.add(at[s], U.i64(r)), U.i64(k)) for r in range(size[s])]
            for s in (0, 1)]
    fmuladd = declare(b, f"llvm.fmuladd.v{lanes}f32", vt, [vt] * 3)
    reduce = declare(b, f"llvm.vector.reduce.fadd.v{lanes}f32", F32, [F32, vt])

    def vload(ptr: ir.Value, off: ir.Value) -> ir.Value:
        return b.load(b.bitcast(U.element_ptr(b, ptr, off), vt.as_pointer()), align=4)

    def step(b: ir.IRBuilder, t: ir.Value, accs):
        off = b.mul(t, U.i64(lanes))
        av = [vload(a, b.add(r, off)) for r in rows[0]]
        bv = [vload(bm, b.add(r, off)) for r in rows[1]]
        return tuple(b.call(fmuladd, [x, y, accs[i * nj + j]])
                     for i, x in enumerate(av) for j, y in enumerate(bv))

    zero = ir.Constant(vt, [0.0] * lanes)
    accs = U.reduce_range(b, k // lanes, (zero,) * (ni * nj), step, name="kv")
    for i in range(ni):
        for j in range(nj):
            total = b.call(reduce, [U.f32(-0.0), accs[i * nj + j]], fastmath=("reassoc",))
            if k % lanes:
                total = U.reduce_range(b, k, total, lambda b, kk, s: U.call_intrinsic(
                    b, "llvm.fmuladd", [U.load(b, a, b.add(rows[0][i], kk)),
                                        U.load(b, bm, b.add(rows[1][j], kk)), s]),
                    start=k - k % lanes, name="kt")
            U.store(b, total, dst, b.add(b.mul(b.add(at[0], U.i64(i)), U.i64(n)),
                                         b.add(at[1], U.i64(j))))


# ---------------------------------------------------------------------------- checks
def _broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise CpuKernelError(f"MatMul: batch dimensions {list(a)} and {list(b)} do not "
                                 "broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


def _require_float(op: str, *specs: TensorSpec) -> None:
    bad = [s for s in specs if s.dtype != "float32"]
    if bad:
        raise CpuKernelError(f"{op}: the CPU kernel takes float32 operands, not {bad[0]}")
