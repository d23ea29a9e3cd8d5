"""onnxruntime's arithmetic of the fused integer nodes that are not a requantization: the
one definition the golden model (:mod:`..golden.quantized`) and both backends' lowerings
(:mod:`..accel.lower`, :mod:`..cpu`) share. (Requantization is :mod:`tessera.isa.requant`,
in the core, because the accelerator's REQUANT instruction implements it.)

``QAdd`` (QLinearAdd, MLAS ``qladd_avx2.cpp``) is computed in float32 with FMAs:
``rA = f32(a_scale / y_scale)``, ``rB = f32(b_scale / y_scale)``, ``fixed =
f32(y_zp - fma(rA, a_zp, f32(rB * b_zp)))``, ``t = fma(b, rB, fixed)``,
``t = fma(a, rA, t)``, ``y = saturate(rint(t))``.

The source writes ``fixed`` as ``y_zp - (rA * a_zp + rB * b_zp)``; the compiler that built
onnxruntime's wheel contracted the inner sum into an FMA on ``rA * a_zp``. That is not
visible in the source, only in the results: over 150 random parameter sets x all 65,536
operand pairs, this form matches onnxruntime 1.31.1 everywhere, the uncontracted form
differs in 6 sets and the FMA on ``rB * b_zp`` in 5 (``tests/compiler/frontend/
test_qlinear.py``). The kernel is the x86 one: MLAS dispatches the AVX2 kernel on AVX2
and on AVX-512 CPUs alike (no AVX-512 QLinearAdd). On ARM, MLAS computes QLinearAdd in
fixed point (NEON, ``MlasCalcQLinearAddParameters``), which this does not emulate.

``QMul`` (QLinearMul, MLAS ``qlmul.cpp``) multiplies the centred operands exactly in
int32, then requantizes in float32 without FMA: ``ratio = f32(f32(a_scale * b_scale) /
y_scale)``, ``t = f32(f32(f32((a - a_zp) * (b - b_zp)) * ratio) + y_zp)``, ``y =
saturate(rint(t))``. That kernel is MLAS's SSE2 one, the only x86 QLinearMul (no AVX2 or
AVX-512 variant: every x86 CPU computes this), and a scalar ``b`` takes the same
arithmetic. Over 60 random parameter sets x all 65,536 operand pairs, and the sets where
an FMA would change a result, this form matches onnxruntime 1.31.1 on an AVX-512 CPU;
the FMA form does not (``tests/compiler/frontend/test_qlinear_mul.py``). MLAS's NEON
kernel (ARM64) writes the same multiply then add with ``vcvtnq`` (ties to even); its
ARM32 kernel rounds ties away from zero, which this does not emulate.

``QMatMul`` (a ``DequantizeLinear -> MatMul -> QuantizeLinear`` group of two
activations, which onnxruntime runs as QLinearMatMul: MLAS's integer GEMM, exact, then
``MlasRequantizeOutput``) is ``acc = sum (a - a_zp) * (b - b_zp)`` in int32, then
:func:`tessera.isa.requant.onnxruntime_reference` with the scale ``f32(f32(a_scale *
b_scale) / y_scale)`` (:func:`~tessera.isa.requant.requant_scale`): one float32
multiply, clamp, round to even. The integer part is the same on every CPU; the
requantization is plain float32 (no FMA to contract), so AVX2, AVX-512 and NEON agree.
"""
from __future__ import annotations

import numpy as np

from tessera.isa.requant import onnxruntime_reference, requant_scale

__all__ = ["qlinear_add_coefficients", "qlinear_add_reference", "qlinear_matmul_reference",
           "qlinear_mul_ratio", "qlinear_mul_reference"]


def qlinear_add_coefficients(a_scale: float, a_zero_point: int, b_scale: float,
                             b_zero_point: int, y_scale: float, y_zero_point: int
                             ) -> tuple[np.float32, np.float32, np.float32]:
    """MLAS's float32 ``rA = a_scale / y_scale``, ``rB = b_scale / y_scale`` and ``fixed =
    y_zp - (rA * a_zp + rB * b_zp)`` (its inner sum an FMA, module doc):
    ``y = rint(a*rA + b*rB + fixed)``."""
    f32 = np.float32
    y_scale = f32(y_scale)
    ra, rb = f32(f32(a_scale) / y_scale), f32(f32(b_scale) / y_scale)
    za, zb = f32(a_zero_point), f32(b_zero_point)
    return ra, rb, f32(f32(y_zero_point) - _fma(ra, za, f32(rb * zb)))


def qlinear_add_reference(a: np.ndarray, b: np.ndarray, a_scale: float, a_zero_point: int,
                          b_scale: float, b_zero_point: int, y_scale: float, y_zero_point: int,
                          y_min: int, y_max: int) -> np.ndarray:
    """QLinearAdd of stored ``a`` and ``b`` as MLAS computes it (float32 FMAs, module doc),
    saturated to the operands' type and clamped to ``[y_min, y_max]``; int64 result."""
    f32 = np.float32
    ra, rb, fixed = qlinear_add_coefficients(a_scale, a_zero_point, b_scale, b_zero_point,
                                             y_scale, y_zero_point)
    t = _fma(b.astype(f32), rb, np.full(b.shape, fixed, f32))
    t = _fma(a.astype(f32), ra, t)
    info = np.iinfo(a.dtype)
    y = np.clip(np.rint(t), info.min, info.max).astype(np.int64)
    return np.clip(y, y_min, y_max)


def qlinear_mul_ratio(a_scale: float, b_scale: float, y_scale: float) -> np.float32:
    """MLAS's float32 ``a_scale * b_scale / y_scale`` (left to right, each rounded)."""
    f32 = np.float32
    return f32(f32(f32(a_scale) * f32(b_scale)) / f32(y_scale))


def qlinear_mul_reference(a: np.ndarray, b: np.ndarray, a_scale: float, a_zero_point: int,
                          b_scale: float, b_zero_point: int, y_scale: float, y_zero_point: int,
                          y_min: int, y_max: int) -> np.ndarray:
    """QLinearMul of stored ``a`` and ``b`` (broadcast) as MLAS computes it on x86 (module
    doc), saturated to the operands' type and clamped to ``[y_min, y_max]``; int64."""
    f32 = np.float32
    product = (a.astype(np.int32) - a_zero_point) * (b.astype(np.int32) - b_zero_point)
    t = f32(product.astype(f32) * qlinear_mul_ratio(a_scale, b_scale, y_scale)) \
        + f32(y_zero_point)
    info = np.iinfo(a.dtype)
    y = np.clip(np.rint(t), info.min, info.max).astype(np.int64)
    return np.clip(y, y_min, y_max)


def qlinear_matmul_reference(a: np.ndarray, b: np.ndarray, a_scale: float, a_zero_point: int,
                             b_scale: float, b_zero_point: int, y_scale: float,
                             y_zero_point: int, y_min: int, y_max: int) -> np.ndarray:
    """QLinearMatMul of stored ``a`` and ``b`` (numpy matmul broadcasting) as onnxruntime
    computes it (module doc), clamped to ``[y_min, y_max]``; int64."""
    acc = np.matmul(a.astype(np.int64) - a_zero_point, b.astype(np.int64) - b_zero_point)
    acc = (acc + 2**31) % 2**32 - 2**31       # int32 accumulators wrap
    return onnxruntime_reference(acc, requant_scale(a_scale, b_scale, y_scale), y_zero_point,
                                 y_min, y_max)


def _fma(a: np.ndarray | np.float32, b: np.ndarray | np.float32,
         c: np.ndarray | np.float32) -> np.ndarray:
    """float32 fused multiply-add ``a * b + c`` with one rounding, as x86's VFMADD.

    The float32 product is exact in float64; the float64 sum may round, and rounding it
    again to float32 can then differ from one rounding (double rounding) only when the
    float64 sum lands exactly on a float32 midpoint: there, step it one float64 ulp
    towards the exact value (the sign of the TwoSum error) first.
    """
    a64, b64, c64 = (np.asarray(v, np.float64) for v in (a, b, c))
    product = a64 * b64
    total = product + c64
    # TwoSum: the exact rounding error of total = product + c.
    virtual = total - product
    error = (product - (total - virtual)) + (c64 - virtual)
    as32 = total.astype(np.float32).astype(np.float64)
    neighbour = np.nextafter(total.astype(np.float32), np.where(
        total > as32, np.float32(np.inf), np.float32(-np.inf))).astype(np.float64)
    on_midpoint = (as32 != total) & (np.abs(total - as32) == np.abs(neighbour - total))
    nudged = np.where(on_midpoint & (error != 0), np.nextafter(total, total + error), total)
    return np.asarray(nudged.astype(np.float32))
