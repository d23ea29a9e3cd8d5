"""More vectorisable float32 math for CPU kernels (beyond :mod:`.irutil`'s exp and log):
tanh, log1p, erf and pow, written as range-reduced polynomials so that loops over them
vectorise (LLVM lowers ``llvm.pow.f32`` and libm's erff to scalar calls); and MLAS's
logistic and tanh, onnxruntime's own rational approximations, for the results that must
be onnxruntime's to the bit (its Sigmoid, its recurrent kernels' activations).

Each is within the error stated in its docstring of the correctly rounded result,
measured over dense sweeps in ``tests/compiler/cpu/test_math_ops.py``; they follow C99's
special values (NaN, infinities, signed zeros), as onnxruntime's kernels do.
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from . import irutil as U
from .irutil import F32, I32, f32

F64 = ir.DoubleType()
I64 = ir.IntType(64)


def _f64(value: float) -> ir.Constant:
    return ir.Constant(F64, float(value))


def _poly(builder: ir.IRBuilder, x: ir.Value, coeffs, const=f32) -> ir.Value:
    """Horner's ``coeffs[0] * x**n + ... + coeffs[n]`` with fused multiply-adds."""
    p = const(coeffs[0])
    for c in coeffs[1:]:
        p = U.call_intrinsic(builder, "llvm.fmuladd", [p, x, const(c)])
    return p


def log1p_f32(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1 + x) in float32 within 3 ulp (2.4 measured), also for tiny x where
    log(1 + x) would lose every digit: with u = 1 + x rounded, log1p(x) = log(u) * x /
    (u - 1) (the ratio corrects the rounding of u); x itself where u == 1. -1 gives -inf,
    x < -1 NaN, inf inf."""
    u = builder.fadd(x, f32(1.0))
    ratio = builder.fmul(U.log_f32(builder, u), builder.fdiv(x, builder.fsub(u, f32(1.0))))
    y = builder.select(builder.fcmp_ordered("==", u, f32(1.0)), x, ratio)
    # inf / inf above is NaN; u == 0 (x == -1) gives -inf * -1/-1 = -inf, as it should.
    return builder.select(builder.fcmp_ordered("==", x, f32(float("inf"))), x, y)


# tanh(|x|) = h / (1 + h) with h = expm1(2|x|) / 2, one expm1 and one division for
# every x (no second polynomial for small x, as Cephes needs: h keeps its relative
# accuracy down to 0). expm1(2t) = 2**n * (1 + p) - 1 with p = expm1(2r), r = t - n ln2/2
# by one fused multiply-add (ln2's float32 error, n * 1e-9, is below what matters here),
# and n = round(2t log2(e) - 1/4): r lies in [-ln2/8, 3 ln2/8], so that where n = 1,
# 2**n * (1 + p) - 1 cancels little (p >= -0.16). p = 2r + r**2 P(r), P a near-minimax
# fit (Lawson's iteration) of (e**(2r) - 1 - 2r) / r**2 weighted for p's relative error,
# its coefficients rounded to float32 one at a time from the highest power, refitting
# the rest (0.26 of 2**-24 relative error at most). 2**(n-1) comes from the bits of the
# float that rounds n (adding 1.5 * 2**23 + 126 leaves n + 126 in its low bits); |x| is
# clamped to 9.1 (tanh rounds to 1 from 9.0109), so n <= 26 needs no further care, and
# a NaN runs through the arithmetic (the clamp is a select that keeps it).
_TANH_CLAMP = 9.1
_TANH_BIAS = 1.5 * 2.0 ** 23 + 126
_TANH_LOG2E_2 = 2.88539              # 2 log2(e) in float32
_TANH_LN2_2 = 0.6931472 / 2          # float32(ln 2) / 2, exact
_TANH_EXPM1 = (0.10251461, 0.26501268, 0.6665999, 1.3333465, 2.0)


def tanh_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """tanh in float32, vectorisable and branch-free, within 2 ulp where multiply-adds
    fuse (x86-64 with FMA3, AArch64): 1.77 at worst over every float32, against float64
    (numpy's own float32 tanh: 1.37); 2.11 where they do not (armv7's VFPv3; measured
    compiling for this host without FMA). From h = expm1(2|x|) / 2 (see above),
    tanh|x| = h / (1 + h) in the form that does not cancel: below h = 1 (tanh < 1/2)
    ``h - h * (h / (1 + h))``, where the roundings of 1 + h and of the quotient are
    damped by h; above, ``1 - 1 / (1 + h)``. Both are ``num - num * (num / (1 + h))``
    with num = min(h, 1): one division, no branch. +-inf give +-1, NaN stays NaN, -0
    stays -0."""
    ax = U.call_intrinsic(b, "llvm.fabs", [x])
    t = b.select(b.fcmp_ordered(">", ax, f32(_TANH_CLAMP)), f32(_TANH_CLAMP), ax)
    k = b.fadd(U._fma(b, t, f32(_TANH_LOG2E_2), f32(-0.25)), f32(_TANH_BIAS))
    r = U._fma(b, b.fsub(k, f32(_TANH_BIAS)), f32(-_TANH_LN2_2), t)
    p = U._fma(b, b.fmul(r, r), _poly(b, r, _TANH_EXPM1), b.fadd(r, r))
    half_scale = b.bitcast(b.shl(b.bitcast(k, I32), ir.Constant(I32, 23)), F32)
    h = U._fma(b, p, half_scale, b.fsub(half_scale, f32(0.5)))
    num = b.select(b.fcmp_ordered("<", h, f32(1.0)), h, f32(1.0))
    q = b.fdiv(num, b.fadd(h, f32(1.0)))
    return U.call_intrinsic(b, "llvm.copysign", [U._fma(b, b.fneg(num), q, num), x])


# erf(x) = x + x * P(x**2) for |x| <= 0.921875 and 1 - exp(Q(|x|)) above, a faithfully
# rounded float32 erf (N. Juffa's minimax coefficients; onnxruntime's MLAS erf is built
# on the same algorithm).
_ERF_SPLIT = 0.921875
_ERF_SMALL = (-5.96761703e-4, 4.99119423e-3, -2.67681349e-2, 1.12819925e-1,
              -3.76125336e-1, 1.28379166e-1)
_ERF_BIG = (-1.72853470e-5, 3.83197126e-4, -3.88396438e-3, 2.42546219e-2,
            -1.06777877e-1, -6.34846687e-1, -1.28717512e-1)


def erf_f32(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The error function in float32, vectorisable, within 1 ulp (0.97 measured on a
    host with FMA; without, the multiply-adds round twice); odd, +-inf give +-1, NaN
    stays NaN. Both branches are computed, then selected, so the
    loop stays branch-free (the large branch's exp is clamped, never overflows)."""
    ax = U.call_intrinsic(builder, "llvm.fabs", [x])
    s = builder.fmul(x, x)
    small = U.call_intrinsic(builder, "llvm.fmuladd", [_poly(builder, s, _ERF_SMALL), x, x])
    # For |x| >= ~3.92 erf rounds to 1: clamp so that Q and exp stay finite (inf*0 = NaN).
    t = U.call_intrinsic(builder, "llvm.minnum", [ax, f32(4.0)])
    q = _poly(builder, t, _ERF_BIG)
    q = U.call_intrinsic(builder, "llvm.fmuladd", [q, t, builder.fneg(t)])
    big = builder.fsub(f32(1.0), U.exp_f32(builder, q))
    big = U.call_intrinsic(builder, "llvm.copysign", [big, x])
    y = builder.select(builder.fcmp_ordered("<=", ax, f32(_ERF_SPLIT)), small, big)
    return builder.select(builder.fcmp_unordered("uno", x, x), x, y)


# ------------------------------------------------------------- MLAS's logistic and tanh
# MLAS's logistic and tanh (onnxruntime/core/mlas/lib/logistic.cpp, tanh.cpp): Eigen's
# rational approximations, evaluated with fused multiply-adds as the FMA3 kernels do.
_LOGISTIC_P = (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
               8.51377133304701e-03, 2.48287947061529e-01)
_LOGISTIC_Q = (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
               1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01)
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
           5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
           4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
           4.89352518554385e-03)


def _fused(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    return U.call_intrinsic(b, "llvm.fma", [x, y, z])


def _rational(b: ir.IRBuilder, x: ir.Value, bound: float, p_coeffs, q_coeffs):
    """``(x * P(x**2), Q(x**2))`` for x clamped to [-bound, bound], Horner with FMA."""
    x = U.call_intrinsic(b, "llvm.maxnum", [x, U.f32(-bound)])
    x = U.call_intrinsic(b, "llvm.minnum", [x, U.f32(bound)])
    x2 = b.fmul(x, x)
    p = _fused(b, x2, U.f32(p_coeffs[0]), U.f32(p_coeffs[1]))
    for c in p_coeffs[2:]:
        p = _fused(b, x2, p, U.f32(c))
    q = _fused(b, x2, U.f32(q_coeffs[0]), U.f32(q_coeffs[1]))
    for c in q_coeffs[2:]:
        q = _fused(b, x2, q, U.f32(c))
    return b.fmul(x, p), q


def mlas_logistic(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """MLAS's logistic (its FMA3 kernel): ``max(P/Q + 0.5, 0)``, |x| clamped to 18."""
    p, q = _rational(b, x, 18.0, _LOGISTIC_P, _LOGISTIC_Q)
    y = b.fadd(b.fdiv(p, q), U.f32(0.5))
    return U.call_intrinsic(b, "llvm.maxnum", [y, U.f32(0.0)])


def mlas_tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """MLAS's tanh (its FMA3 kernel): ``P/Q``, |x| clamped to 9."""
    p, q = _rational(b, x, 9.0, _TANH_P, _TANH_Q)
    return b.fdiv(p, q)


def sigmoid_f32(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """onnxruntime's Sigmoid (``MlasComputeLogistic``): :func:`mlas_logistic`, NaN kept.

    Bit-identical to onnxruntime on an x86 CPU with FMA3 rather than correctly rounded:
    dynamically quantized models re-quantize every activation from its measured range,
    so an ulp of difference in a swish moves a scale and then whole int8 tensors. It is
    within 2e-7 of 1 / (1 + e**-x), absolute (P/Q + 0.5 loses the relative accuracy of
    tiny results: from x = -18 down it is 0, as onnxruntime's)."""
    y = mlas_logistic(builder, x)
    return builder.select(builder.fcmp_unordered("uno", x, x), x, y)


# ------------------------------------------------------------------------------ pow
# pow goes through float64: log2|x| and 2**t to ~1e-13 relative error, so that the only
# error that matters is the final rounding to float32 (as in onnxruntime, which computes
# float pow in double). Taylor coefficients: 2*atanh(s) = log((1 + s)/(1 - s)) for
# |s| <= 0.1716, and e**z for |z| <= ln2/2.
_ATANH = tuple(2.0 / k for k in range(15, 0, -2))
_EXP_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(12, -1, -1))
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


def _log2_f64(builder: ir.IRBuilder, a: ir.Value) -> ir.Value:
    """log2(a) for a float64 ``a`` > 0 that came from a float32 (so it is normal and
    finite here; 0, inf and NaN are the caller's)."""
    bits = builder.bitcast(a, I64)
    e = builder.trunc(builder.lshr(bits, ir.Constant(I64, 52)), I32)
    e = builder.sub(e, ir.Constant(I32, 1023))
    mant = builder.or_(builder.and_(bits, ir.Constant(I64, (1 << 52) - 1)),
                       ir.Constant(I64, 1023 << 52))
    m = builder.bitcast(mant, F64)                        # [1, 2)
    high = builder.fcmp_ordered(">", m, _f64(2.0 ** 0.5))
    m = builder.select(high, builder.fmul(m, _f64(0.5)), m)
    e = builder.add(e, builder.zext(high, I32))
    s = builder.fdiv(builder.fsub(m, _f64(1.0)), builder.fadd(m, _f64(1.0)))
    ln_m = builder.fmul(s, _poly(builder, builder.fmul(s, s), _ATANH, _f64))
    return builder.fadd(builder.sitofp(e, F64), builder.fmul(ln_m, _f64(_LOG2E)))


def _exp2_f64_to_f32(builder: ir.IRBuilder, t: ir.Value) -> ir.Value:
    """2**t for a float64 ``t``, rounded to float32 (overflow to inf, underflow through
    the subnormals to 0). NaN is the caller's."""
    t = U.call_intrinsic(builder, "llvm.maxnum", [t, _f64(-160.0)])
    t = U.call_intrinsic(builder, "llvm.minnum", [t, _f64(140.0)])
    n = U.call_intrinsic(builder, "llvm.roundeven", [t])
    z = builder.fmul(builder.fsub(t, n), _f64(_LN2))
    p = _poly(builder, z, _EXP_TAYLOR, _f64)
    n64 = builder.add(builder.sext(builder.fptosi(n, I32), I64), ir.Constant(I64, 1023))
    scale = builder.bitcast(builder.shl(n64, ir.Constant(I64, 52)), F64)
    return builder.fptrunc(builder.fmul(p, scale), F32)


def pow_f32(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """x**y in float32, vectorisable, within 0.5 ulp plus ~1e-9 of the exact result
    (so it is the correctly rounded float except in rare double-rounding ties), with
    C99 ``pow``'s special values: pow(x, +-0) = 1 and pow(1, y) = 1 even for NaN; a
    negative finite x with a non-integer y is NaN; an odd integer y keeps x's sign
    (-0 and -inf included); pow(-1, +-inf) = 1."""
    ax = U.call_intrinsic(builder, "llvm.fabs", [x])
    a = builder.fpext(ax, F64)
    l2 = _log2_f64(builder, a)
    l2 = builder.select(builder.fcmp_ordered("==", ax, f32(0.0)), _f64(float("-inf")), l2)
    # inf and NaN (an unordered compare is true for NaN) are their own log2.
    l2 = builder.select(builder.fcmp_unordered("==", ax, f32(float("inf"))), a, l2)
    t = builder.fmul(builder.fpext(y, F64), l2)
    r = _exp2_f64_to_f32(builder, t)
    r = builder.select(builder.fcmp_unordered("uno", t, t), f32(float("nan")), r)
    # The sign of a negative base: odd integer exponents keep it, non-integers are NaN.
    # fptosi.sat is defined for every input (plain fptosi of inf or NaN is poison,
    # which would poison the whole condition); above 2**24 every float is even.
    y_int = builder.fcmp_ordered("==", U.round_half_even(builder, y), y)
    y_low_bit = builder.trunc(U.call_intrinsic(builder, "llvm.fptosi.sat", [y], ret=I32,
                                               overload=[I32, F32]), ir.IntType(1))
    y_small = builder.fcmp_ordered("<", U.call_intrinsic(builder, "llvm.fabs", [y]),
                                   f32(2.0 ** 24))
    y_odd = builder.and_(builder.and_(y_int, y_small), y_low_bit)
    x_neg = builder.icmp_signed("<", builder.bitcast(x, I32), ir.Constant(I32, 0))
    r = builder.select(builder.and_(x_neg, y_odd), builder.fneg(r), r)
    finite_neg = builder.and_(builder.fcmp_ordered("<", x, f32(0.0)),
                              builder.fcmp_ordered(">", x, f32(float("-inf"))))
    r = builder.select(builder.and_(finite_neg, builder.not_(y_int)), f32(float("nan")), r)
    one = builder.or_(builder.fcmp_ordered("==", y, f32(0.0)),
                      builder.fcmp_ordered("==", x, f32(1.0)))
    one = builder.or_(one, builder.and_(builder.fcmp_ordered("==", ax, f32(1.0)),
                                        builder.fcmp_ordered("==", U.call_intrinsic(
                                            builder, "llvm.fabs", [y]), f32(float("inf")))))
    return builder.select(one, f32(1.0), r)
