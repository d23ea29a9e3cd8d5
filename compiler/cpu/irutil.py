"""Helpers for writing CPU kernels with llvmlite.ir: loops, indexing, dtype-aware
arithmetic and casts, saturation and rounding, and vectorisable float32 math
(exp, log) written as polynomials because LLVM lowers ``llvm.exp.f32``
to a scalar libm call that blocks loop vectorisation (more in :mod:`.fmath`).

Conventions: indices are i64; ``dtype`` arguments are the strings of
``kernel.DTYPES`` (int8, uint8 and bool share the LLVM type i8, so signedness is passed
explicitly; a bool is 0 or 1). Loops are written in the plain counted form (phi, compare, body, latch)
that LLVM's loop passes recognise; with constant bounds they vectorise and unroll.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import llvmlite.ir as ir

from tessera.errors import CpuKernelError

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()

#: Fast-math flags for float reductions whose order we let LLVM change (reassociation
#: lets the loop vectoriser keep several partial sums; results change in the last bits).
REASSOC = ("reassoc", "contract")

_INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-(2**15), 2**15 - 1),
              "int32": (-(2**31), 2**31 - 1),
              "int64": (-(2**63), 2**63 - 1), "bool": (0, 1)}


# ---------------------------------------------------------------------------------
# Types and constants

def llvm_type(dtype: str) -> ir.Type:
    """The LLVM element type of ``dtype``."""
    return {"int8": I8, "uint8": I8, "int16": ir.IntType(16), "int32": I32, "int64": I64,
            "float32": F32, "bool": I8}[dtype]


def is_float(dtype: str) -> bool:
    return dtype == "float32"


def is_signed(dtype: str) -> bool:
    return dtype in ("int8", "int16", "int32", "int64")


def int_range(dtype: str) -> tuple[int, int]:
    """(min, max) of an integer dtype."""
    return _INT_RANGE[dtype]


def i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


def const(dtype: str, value: float | int) -> ir.Constant:
    """A constant of ``dtype``; integers wrap to the dtype's width like numpy casts."""
    if is_float(dtype):
        return ir.Constant(F32, float(value))
    bits = llvm_type(dtype).width
    return ir.Constant(llvm_type(dtype), int(value) & ((1 << bits) - 1))


def f32(value: float) -> ir.Constant:
    return ir.Constant(F32, float(value))


def as_value(v: ir.Value | int) -> ir.Value:
    """Lets helpers accept plain ints where an i64 is expected."""
    return i64(v) if isinstance(v, int) else v


# ---------------------------------------------------------------------------------
# Loops

class _Loop:
    """The blocks and phis of ``for (i = start; i < stop; i += step)`` with loop-carried
    values: :meth:`open` leaves the builder in the body, :meth:`close` after the loop."""

    def __init__(self, builder: ir.IRBuilder, start: int | ir.Value, stop: int | ir.Value,
                 name: str, inits: Sequence[ir.Value] = ()) -> None:
        pre = builder.block
        header = builder.append_basic_block(f"{name}.head")
        body = builder.append_basic_block(f"{name}.body")
        self.exit = builder.append_basic_block(f"{name}.end")
        self.header = header
        self.name = name
        builder.branch(header)
        builder.position_at_end(header)
        self.idx = builder.phi(I64, name=name)
        self.idx.add_incoming(as_value(start), pre)
        self.accs = []
        for k, v in enumerate(inits):
            phi = builder.phi(v.type, name=f"{name}.acc{k}")
            phi.add_incoming(v, pre)
            self.accs.append(phi)
        builder.cbranch(builder.icmp_signed("<", self.idx, as_value(stop)), body, self.exit)
        builder.position_at_end(body)

    def close(self, builder: ir.IRBuilder, step: int, new: Sequence[ir.Value] = ()) -> None:
        latch = builder.block
        nxt = builder.add(self.idx, i64(step), name=f"{self.name}.next", flags=["nuw", "nsw"])
        self.idx.add_incoming(nxt, latch)
        for phi, v in zip(self.accs, new):
            phi.add_incoming(v, latch)
        builder.branch(self.header)
        builder.position_at_end(self.exit)


@contextmanager
def for_range(
    builder: ir.IRBuilder, stop: int | ir.Value, start: int | ir.Value = 0,
    step: int = 1, name: str = "i",
) -> Iterator[ir.Value]:
    """``with for_range(b, n) as i:`` emits ``for (i = start; i < stop; i += step)``
    around the code written in the with-block (signed i64 compare). The builder is left
    after the loop. Constant bounds let LLVM vectorise and fully unroll short loops."""
    loop = _Loop(builder, start, stop, name)
    yield loop.idx
    loop.close(builder, step)


@contextmanager
def nested_range(
    builder: ir.IRBuilder, shape: Sequence[int], name: str = "d",
) -> Iterator[tuple[ir.Value, ...]]:
    """Loops over every index of ``shape`` in C order (outermost first); yields the
    tuple of i64 indices. An empty shape yields ``()`` once (a scalar)."""
    with _nest(builder, list(shape), name, ()) as idx:
        yield idx


@contextmanager
def _nest(builder, shape, name, outer):
    if not shape:
        yield outer
        return
    with for_range(builder, shape[0], name=f"{name}{len(outer)}") as i:
        with _nest(builder, shape[1:], name, (*outer, i)) as idx:
            yield idx


def reduce_range(
    builder: ir.IRBuilder, stop: int | ir.Value, init, body, start: int | ir.Value = 0,
    step: int = 1, name: str = "r",
):
    """A loop with loop-carried values: ``acc = init; for i in range(start, stop, step):
    acc = body(builder, i, acc)``; returns the final ``acc``. ``init`` may be one value
    or a tuple of values (``body`` then takes and returns a tuple). The accumulators are
    phi nodes, which is what LLVM's reduction vectoriser looks for (float sums need
    ``REASSOC`` flags on the adds to vectorise)."""
    multi = isinstance(init, (tuple, list))
    loop = _Loop(builder, start, stop, name, list(init) if multi else [init])
    new = body(builder, loop.idx, tuple(loop.accs) if multi else loop.accs[0])
    loop.close(builder, step, list(new) if multi else [new])
    return tuple(loop.accs) if multi else loop.accs[0]


def for_range_fn(builder: ir.IRBuilder, stop: int | ir.Value, body, start: int = 0,
                 step: int = 1, name: str = "i") -> None:
    """Callback form of :func:`for_range`: ``body(builder, i)`` emits the loop body."""
    with for_range(builder, stop, start, step, name) as i:
        body(builder, i)


# ---------------------------------------------------------------------------------
# Indexing, loads and stores

def c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """C-order strides in elements."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-contiguous ``shape`` read as ``out_shape`` under numpy
    broadcasting (0 where the dimension is broadcast). Raises CpuKernelError if the
    shapes do not broadcast."""
    if len(shape) > len(out_shape):
        raise CpuKernelError(f"shape {tuple(shape)} does not broadcast to {tuple(out_shape)}")
    pad = len(out_shape) - len(shape)
    own = c_strides(shape)
    strides = [0] * pad
    for d, s, o in zip(shape, own, out_shape[pad:]):
        if d == o:
            strides.append(s if d != 1 else 0)
        elif d == 1:
            strides.append(0)
        else:
            raise CpuKernelError(
                f"shape {tuple(shape)} does not broadcast to {tuple(out_shape)}")
    return tuple(strides)


def linear_index(builder: ir.IRBuilder, indices: Sequence[ir.Value],
                 strides: Sequence[int], offset: int | ir.Value = 0) -> ir.Value:
    """``offset + sum(indices[k] * strides[k])`` as i64 (zero strides are skipped, so
    broadcast dimensions cost nothing)."""
    acc = as_value(offset)
    for idx, s in zip(indices, strides):
        if s == 0:
            continue
        term = idx if s == 1 else builder.mul(idx, i64(s), flags=["nuw", "nsw"])
        acc = term if (isinstance(acc, ir.Constant) and acc.constant == 0) else \
            builder.add(acc, term, flags=["nuw", "nsw"])
    return acc


def element_ptr(builder: ir.IRBuilder, ptr: ir.Value, index: int | ir.Value) -> ir.Value:
    """Address of ``ptr[index]`` (inbounds GEP)."""
    return builder.gep(ptr, [as_value(index)], inbounds=True)


def load(builder: ir.IRBuilder, ptr: ir.Value, index: int | ir.Value) -> ir.Value:
    """``ptr[index]``."""
    return builder.load(element_ptr(builder, ptr, index))


def store(builder: ir.IRBuilder, value: ir.Value, ptr: ir.Value,
          index: int | ir.Value) -> None:
    """``ptr[index] = value``."""
    builder.store(value, element_ptr(builder, ptr, index))


def alloca_array(builder: ir.IRBuilder, ty: ir.Type, n: int, name: str = "buf") -> ir.Value:
    """A stack array of ``n`` elements, allocated in the function's entry block (so it
    is allocated once, not per loop iteration); returns a pointer to element 0."""
    fn = builder.function
    with builder.goto_block(fn.entry_basic_block):
        entry = fn.entry_basic_block
        if entry.instructions:
            builder.position_before(entry.instructions[0])
        arr = builder.alloca(ir.ArrayType(ty, n), name=name)
        arr.align = 32
    return builder.gep(arr, [i64(0), i64(0)], inbounds=True)


def fill(builder: ir.IRBuilder, ptr: ir.Value, n: int, value: ir.Value) -> None:
    """``ptr[0:n] = value`` (a loop LLVM turns into memset or vector stores)."""
    with for_range(builder, n, name="fill") as i:
        store(builder, value, ptr, i)


# ---------------------------------------------------------------------------------
# Intrinsics

def call_intrinsic(builder: ir.IRBuilder, name: str, args: Sequence[ir.Value],
                   ret: ir.Type | None = None, overload: Sequence[ir.Type] | None = None,
                   flags: Sequence[str] = ()) -> ir.Value:
    """Call LLVM intrinsic ``name`` (e.g. ``"llvm.maxnum"``), declaring it on first use.
    The name is mangled with ``overload`` (default: the first argument's type), the
    return type defaults to the first argument's type: ``call_intrinsic(b,
    "llvm.fptosi.sat", [x], ret=I32, overload=[I32, F32])``."""
    ret = ret if ret is not None else args[0].type
    tys = list(overload) if overload is not None else [args[0].type]
    full = ".".join([name, *(t.intrinsic_name for t in tys)])
    fnty = ir.FunctionType(ret, [a.type for a in args])
    module = builder.module
    fn = module.globals.get(full) or ir.Function(module, fnty, name=full)
    return builder.call(fn, list(args), fastmath=tuple(flags))


# ---------------------------------------------------------------------------------
# Dtype-aware arithmetic (numpy semantics: integers wrap)

def add(builder, a, b, dtype: str, flags=()):
    return builder.fadd(a, b, flags=flags) if is_float(dtype) else builder.add(a, b)


def sub(builder, a, b, dtype: str, flags=()):
    return builder.fsub(a, b, flags=flags) if is_float(dtype) else builder.sub(a, b)


def mul(builder, a, b, dtype: str, flags=()):
    return builder.fmul(a, b, flags=flags) if is_float(dtype) else builder.mul(a, b)


def neg(builder, a, dtype: str):
    return builder.fneg(a) if is_float(dtype) else builder.neg(a)


def minimum(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
    """``np.minimum``: for floats NaN in either operand gives NaN."""
    if not is_float(dtype):
        return call_intrinsic(builder, "llvm.smin" if is_signed(dtype) else "llvm.umin", [a, b])
    m = builder.select(builder.fcmp_ordered("<", a, b), a, b)
    return builder.select(builder.fcmp_unordered("uno", a, a), a, m)


def maximum(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
    """``np.maximum``: for floats NaN in either operand gives NaN."""
    if not is_float(dtype):
        return call_intrinsic(builder, "llvm.smax" if is_signed(dtype) else "llvm.umax", [a, b])
    m = builder.select(builder.fcmp_ordered(">", a, b), a, b)
    return builder.select(builder.fcmp_unordered("uno", a, a), a, m)


def reduce_maximum(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
    """max for reduction loops: NaN-propagating like ``np.max``, but the sign of a zero
    result is unspecified (``nsz``), which lets LLVM vectorise it to bare ``vmaxps``
    plus a NaN fix-up (numpy does not order -0.0 and 0.0 either)."""
    if not is_float(dtype):
        return maximum(builder, a, b, dtype)
    return call_intrinsic(builder, "llvm.maximum", [a, b], flags=("nsz",))


def reduce_minimum(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
    """min for reduction loops (see :func:`reduce_maximum`)."""
    if not is_float(dtype):
        return minimum(builder, a, b, dtype)
    return call_intrinsic(builder, "llvm.minimum", [a, b], flags=("nsz",))


def absolute(builder: ir.IRBuilder, a: ir.Value, dtype: str) -> ir.Value:
    """``np.abs`` (int8 -128 stays -128, as in numpy; uint8 is unchanged)."""
    if is_float(dtype):
        return call_intrinsic(builder, "llvm.fabs", [a])
    if not is_signed(dtype):
        return a
    return builder.select(builder.icmp_signed("<", a, ir.Constant(a.type, 0)),
                          builder.neg(a), a)


def clamp(builder: ir.IRBuilder, x: ir.Value, lo: ir.Value, hi: ir.Value,
          dtype: str) -> ir.Value:
    """``np.clip(x, lo, hi)`` = min(max(x, lo), hi); NaN stays NaN."""
    return minimum(builder, maximum(builder, x, lo, dtype), hi, dtype)


def divide(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
    """``a / b``: IEEE for floats; for integers C's division truncating toward zero
    (onnxruntime's Div), wrapping (int8 -128 / -1 is -128), and 0 for a zero divisor
    (as numpy's ``//``; the hardware instruction would trap)."""
    if is_float(dtype):
        return builder.fdiv(a, b)
    # In int32 (int64 for int64): the quotient of 8-bit values may need 9 bits.
    work, name = (I64, "int64") if dtype == "int64" else (I32, "int32")
    wa, wb = widen(builder, a, dtype, work), widen(builder, b, dtype, work)
    zero = builder.icmp_signed("==", wb, ir.Constant(work, 0))
    if not is_signed(dtype):
        q = builder.udiv(wa, builder.select(zero, ir.Constant(work, 1), wb))
    else:
        # MIN / -1 traps too: divide by -1 as a (wrapping) negation instead.
        minus_one = builder.icmp_signed("==", wb, ir.Constant(work, -1))
        safe = builder.select(builder.or_(zero, minus_one), ir.Constant(work, 1), wb)
        q = builder.select(minus_one, builder.neg(wa), builder.sdiv(wa, safe))
    q = builder.select(zero, ir.Constant(work, 0), q)
    return widen(builder, q, name, llvm_type(dtype))


def sign(builder: ir.IRBuilder, a: ir.Value, dtype: str) -> ir.Value:
    """-1, 0 or 1 by the sign of ``a`` (``np.sign``; NaN stays NaN, -0.0 gives 0.0 as in
    onnxruntime)."""
    one, minus_one, zero = const(dtype, 1), const(dtype, -1), const(dtype, 0)
    if is_float(dtype):
        s = builder.select(builder.fcmp_ordered(">", a, zero), one,
                           builder.select(builder.fcmp_ordered("<", a, zero), minus_one, zero))
        return builder.select(builder.fcmp_unordered("uno", a, a), a, s)
    if not is_signed(dtype):
        return builder.zext(builder.icmp_unsigned("!=", a, zero), a.type)
    return builder.select(builder.icmp_signed(">", a, zero), one,
                          builder.select(builder.icmp_signed("<", a, zero), minus_one, zero))


def compare(builder: ir.IRBuilder, op: str, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
    """``a op b`` (op one of ``== < <= > >=``) as a bool (i8 0 or 1); float comparisons
    are ordered (false with a NaN operand), integer ones signed or unsigned by ``dtype``."""
    if is_float(dtype):
        bit = builder.fcmp_ordered(op, a, b)
    elif is_signed(dtype):
        bit = builder.icmp_signed(op, a, b)
    else:
        bit = builder.icmp_unsigned(op, a, b)
    return builder.zext(bit, I8)


# ---------------------------------------------------------------------------------
# Casts, rounding, saturation

def to_float(builder: ir.IRBuilder, v: ir.Value, dtype: str) -> ir.Value:
    """Convert a value of ``dtype`` to float32 (exact for 8-bit, rounded for int32)."""
    if is_float(dtype):
        return v
    return builder.sitofp(v, F32) if is_signed(dtype) else builder.uitofp(v, F32)


def widen(builder: ir.IRBuilder, v: ir.Value, dtype: str, ty: ir.Type = I32) -> ir.Value:
    """Sign- or zero-extend an integer of ``dtype`` to ``ty`` (no-op if same width)."""
    if v.type.width == ty.width:
        return v
    if v.type.width > ty.width:
        return builder.trunc(v, ty)
    return builder.sext(v, ty) if is_signed(dtype) else builder.zext(v, ty)


def cast(builder: ir.IRBuilder, v: ir.Value, src: str, dst: str) -> ir.Value:
    """numpy ``astype``: int->int wraps (truncate / extend); int->float rounds to
    nearest; float->int truncates toward zero through int32, like C and numpy on x86
    (to int64 directly; values outside the target's range are undefined, as in numpy);
    to bool is ``!= 0``
    (NaN is true), from bool 0 or 1."""
    if src == dst:
        return v
    if dst == "bool":
        nonzero = builder.fcmp_unordered("!=", v, f32(0.0)) if is_float(src) else \
            builder.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        return builder.zext(nonzero, I8)
    if is_float(dst):
        return to_float(builder, v, src)
    if is_float(src):
        if dst == "int64":
            return builder.fptosi(v, I64)
        return widen(builder, builder.fptosi(v, I32), "int32", llvm_type(dst))
    return widen(builder, v, src, llvm_type(dst))


def round_half_even(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Round a float32 to the nearest integer, ties to even (``np.rint``; one
    ``vroundps`` on x86)."""
    return call_intrinsic(builder, "llvm.roundeven", [x])


def float_to_int_sat(builder: ir.IRBuilder, x: ir.Value, dtype: str) -> ir.Value:
    """Convert an integral-valued float32 to integer ``dtype``, saturating to its range
    (NaN gives the dtype's minimum for int8/uint8 and 0 for int32)."""
    if dtype == "int32":
        return call_intrinsic(builder, "llvm.fptosi.sat", [x], ret=I32, overload=[I32, F32])
    lo, hi = int_range(dtype)
    # maxnum/minnum return the non-NaN operand, so NaN saturates to lo: defined, and
    # it keeps the clamp a plain vmaxps/vminps.
    c = call_intrinsic(builder, "llvm.maxnum", [x, f32(lo)])
    c = call_intrinsic(builder, "llvm.minnum", [c, f32(hi)])
    return builder.trunc(builder.fptosi(c, I32), I8)


def saturate_int(builder: ir.IRBuilder, v: ir.Value, src: str, dst: str) -> ir.Value:
    """Clamp an integer value (i32 holding a ``src`` value) to ``dst``'s range and
    narrow it (e.g. an int32 accumulator to int8)."""
    lo, hi = int_range(dst)
    w = widen(builder, v, src, I32)
    w = builder.select(builder.icmp_signed("<", w, ir.Constant(I32, lo)),
                       ir.Constant(I32, lo), w)
    w = builder.select(builder.icmp_signed(">", w, ir.Constant(I32, hi)),
                       ir.Constant(I32, hi), w)
    return widen(builder, w, "int32", llvm_type(dst))


def bitcast_f32(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    return builder.bitcast(bits, F32)


# ---------------------------------------------------------------------------------
# Vectorisable float32 math

_LOG2E = 1.44269504088896341
# ln2 split so n*LN2_HI is exact for |n| <= 2**9 (Cody-Waite).
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
# Cephes expf minimax polynomial for e**r - 1 - r on [-ln2/2, ln2/2] (~1 ulp).
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
             4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# Beyond these e**x is +inf / 0 in float32 (the lower bound is below the smallest
# subnormal, so results round to 0 there); clamping keeps 2**n constructible.
_EXP_HI = 89.0
_EXP_LO = -104.0


def _fma(builder, a, b, c):
    # fmuladd, not fma: fused where the target has FMA (x86 with FMA3, ARMv8), a
    # multiply and an add elsewhere, instead of a slow libm fma() call.
    return call_intrinsic(builder, "llvm.fmuladd", [a, b, c])


def _pow2i(builder: ir.IRBuilder, n: ir.Value) -> ir.Value:
    """2**n as float32 for an i32 n in [-126, 127] (builds the exponent bits)."""
    bits = builder.shl(builder.add(n, ir.Constant(I32, 127)), ir.Constant(I32, 23))
    return bitcast_f32(builder, bits)


def exp_f32(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e**x in float32, vectorisable (no libm call), within 2 ulp of the correctly
    rounded result (1.3 measured; numpy's float32 exp: 2.4), subnormal results
    included; overflow gives +inf, underflow 0, NaN stays NaN, -inf gives 0.

    Cody-Waite reduction x = n*ln2 + r, |r| <= ln2/2; e**r by a degree-6 polynomial;
    2**n applied as two factors 2**(n//2) * 2**(n - n//2) so n down to -150 (subnormal
    results) and up to 128 (overflow to inf) never leaves the normal exponent range."""
    xc = call_intrinsic(builder, "llvm.maxnum", [x, f32(_EXP_LO)])
    xc = call_intrinsic(builder, "llvm.minnum", [xc, f32(_EXP_HI)])
    nf = round_half_even(builder, builder.fmul(xc, f32(_LOG2E)))
    r = _fma(builder, nf, f32(-_LN2_HI), xc)
    r = _fma(builder, nf, f32(-_LN2_LO), r)
    p = f32(_EXP_POLY[0])
    for c in _EXP_POLY[1:]:
        p = _fma(builder, p, r, f32(c))
    r2 = builder.fmul(r, r)
    y = _fma(builder, p, r2, builder.fadd(r, f32(1.0)))
    n = builder.fptosi(nf, I32)
    n1 = builder.ashr(n, ir.Constant(I32, 1))
    n2 = builder.sub(n, n1)
    y = builder.fmul(builder.fmul(y, _pow2i(builder, n1)), _pow2i(builder, n2))
    return builder.select(builder.fcmp_unordered("uno", x, x), x, y)


# Cephes logf: log(1 + m) - m + m**2/2 = m**3 * P(m) for m in [sqrt(1/2) - 1, sqrt(2) - 1].
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
             1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
             3.3333331174e-1)
_SQRT_HALF = 0.707106781186547524


def log_f32(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Natural log in float32, vectorisable, within 1 ulp (0.77 measured, subnormal
    inputs included); log(0) is -inf, log(x < 0) NaN, log(inf) inf, NaN stays NaN.

    x = 2**e * f with f in [sqrt(1/2), sqrt(2)) from the exponent bits (subnormals are
    first scaled by 2**23); log(f) = m - m**2/2 + m**3 * P(m) with m = f - 1; e*ln2 added
    in two parts (Cody-Waite) so that it is exact."""
    tiny = builder.fcmp_ordered("<", x, f32(2.0 ** -126))
    xs = builder.select(tiny, builder.fmul(x, f32(2.0 ** 23)), x)
    bits = builder.bitcast(xs, I32)
    e = builder.sub(builder.lshr(bits, ir.Constant(I32, 23)), ir.Constant(I32, 126))
    e = builder.sub(e, builder.select(tiny, ir.Constant(I32, 23), ir.Constant(I32, 0)))
    # f in [0.5, 1); below sqrt(1/2) it is doubled (and e lowered) to centre m on 0.
    f = bitcast_f32(builder, builder.or_(builder.and_(bits, ir.Constant(I32, 0x007FFFFF)),
                                         ir.Constant(I32, 0x3F000000)))
    low = builder.fcmp_ordered("<", f, f32(_SQRT_HALF))
    e = builder.sub(e, builder.zext(low, I32))
    m = builder.fsub(builder.select(low, builder.fadd(f, f), f), f32(1.0))
    p = f32(_LOG_POLY[0])
    for c in _LOG_POLY[1:]:
        p = _fma(builder, p, m, f32(c))
    z = builder.fmul(m, m)
    ef = builder.sitofp(e, F32)
    y = _fma(builder, builder.fmul(p, z), m, builder.fmul(ef, f32(_LN2_LO)))
    y = _fma(builder, z, f32(-0.5), y)
    y = _fma(builder, ef, f32(_LN2_HI), builder.fadd(m, y))
    y = builder.select(builder.fcmp_ordered("==", x, f32(0.0)), f32(float("-inf")), y)
    y = builder.select(builder.fcmp_ordered("==", x, f32(float("inf"))), x, y)
    nan = builder.fcmp_unordered("<", x, f32(0.0))       # x < 0 or NaN
    return builder.select(nan, f32(float("nan")), y)


def sqrt_f32(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Correctly rounded square root (vectorises to ``vsqrtps``)."""
    return call_intrinsic(builder, "llvm.sqrt", [x])
