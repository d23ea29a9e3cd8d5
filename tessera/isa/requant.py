"""Bit-exact integer requantization, matching onnxruntime's float32 path.

onnxruntime requantizes an int32 accumulator of output channel ``c`` as::

    scale_c = f32(f32(x_scale * w_scale[c]) / y_scale)
    y = int(rint(clamp(f32(acc) * scale_c, qmin - y_zp, qmax - y_zp))) + y_zp

with float32 operations, round-half-to-even (RNE) and no fused multiply-add.
Every float32 step has an exact integer counterpart:

* ``f32(acc)`` is ``acc`` rounded to 24 significant bits (RNE); identity below
  ``2**24``.
* A float32 scale is ``M * 2**-shift`` with a 24-bit integer ``M``.
* ``f32(acc) * scale`` is the exact product ``acc' * M * 2**-shift`` rounded
  once to float32, i.e. ``acc' * M`` rounded to 24 significant bits with the
  power of two kept aside. This holds while the product is a normal float32
  (``>= 2**-126``); below that float32 rounds to a subnormal instead, but both
  values are far below 0.5 and end up as 0 after the final rounding.
* ``rint`` is an RNE right shift by ``shift``.

The clamp bounds are integers and RNE is monotonic, so clamping before or
after the final rounding gives the same integer. The accelerator therefore
splits the computation into ``REQUANT`` (scale and round, saturated to int32)
followed by separate ``CLIP`` and ``ADD`` ops (:func:`requantize_to_int8`
composes the three).

REQUANT is defined once, in integers (:func:`requantize_integer`: the RTL's
reference); :func:`requantize` computes the same integers with four float
array operations, which is several times faster (see its docstring for why it
is exact; tests/core/isa/test_requant_fast.py holds the two equal over the
whole parameter space).

A REQUANT parameter lane packs ``M | shift << 24`` into 32 bits
(:func:`pack_params`); ``M`` takes :data:`MANTISSA_BITS` bits and the unsigned
``shift`` the remaining :data:`SHIFT_BITS`.

This module depends on numpy and the standard library only.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "MANTISSA_BITS",
    "SHIFT_BITS",
    "INT32_MIN",
    "INT32_MAX",
    "requant_scale",
    "scale_to_params",
    "pack_params",
    "unpack_params",
    "round_to_significant",
    "rne_shift_right",
    "requantize",
    "requantize_integer",
    "requantize_packed",
    "onnxruntime_reference",
    "requantize_to_int8",
]

#: Bits of the scale mantissa ``M`` (float32 has a 24-bit significand).
MANTISSA_BITS = 24
#: Bits of the unsigned right shift in a packed parameter word.
SHIFT_BITS = 8

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

_M_LIMIT = 1 << MANTISSA_BITS
_SHIFT_MAX = (1 << SHIFT_BITS) - 1
_INT64_MAX = (1 << 63) - 1
_U1 = np.uint64(1)


# ---------------------------------------------------------------------------
# Internal helpers
# ---------------------------------------------------------------------------

def _where(mask: np.ndarray) -> str:
    """Name the first offending position of ``mask`` as a channel index."""
    idx = np.argwhere(np.atleast_1d(mask))[0]
    if mask.ndim <= 1:
        return f"channel {int(idx[0])}"
    return f"channel {tuple(int(i) for i in idx)}"


def _first(values: np.ndarray, mask: np.ndarray):
    return np.atleast_1d(values)[tuple(np.argwhere(np.atleast_1d(mask))[0])]


def _as_int64(x: npt.ArrayLike, name: str) -> np.ndarray:
    """Convert an integer array-like to int64, refusing anything lossy."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"{name} must be an integer array, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size \
            and int(arr.max()) > _INT64_MAX:
        raise ValueError(f"{name} has values above the int64 range")
    return arr.astype(np.int64)


def _check_range(arr: np.ndarray, lo: int, hi: int, name: str,
                 allowed: str) -> None:
    # min/max first: the mask is built only to name an offending channel.
    if arr.size == 0 or (arr.min() >= lo and arr.max() <= hi):
        return
    bad = (arr < lo) | (arr > hi)
    if np.any(bad):
        raise ValueError(
            f"{name} out of range at {_where(bad)}: {int(_first(arr, bad))}; "
            f"allowed: {allowed}")


def _magnitude(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """|x| as uint64 (exact even for -2**63) and the sign mask."""
    xu = x.astype(np.uint64)  # modular cast
    neg = x < 0
    return np.where(neg, ~xu + _U1, xu), neg


def _signed(mag: np.ndarray, neg: np.ndarray) -> np.ndarray:
    # Two's complement negation in uint64 then a modular cast, so a
    # magnitude of 2**63 with a minus sign lands on -2**63 without overflow.
    return np.where(neg, ~mag + _U1, mag).astype(np.int64)


def _bit_length(v: np.ndarray) -> np.ndarray:
    """Exact bit length of uint64 values (binary search, integer ops only).

    float64 estimates (np.frexp, np.log2) are off by one just below large
    powers of two, hence no floating point here.
    """
    v = v.astype(np.uint64)
    n = np.zeros(v.shape, dtype=np.int64)
    for s in (32, 16, 8, 4, 2, 1):
        t = v >> np.uint64(s)
        nz = t != 0
        v = np.where(nz, t, v)
        n += nz * s
    return n + (v != 0)


def _rne_shift_right_u(mag: np.ndarray, s: np.ndarray) -> np.ndarray:
    """RNE of ``mag / 2**s`` for uint64 ``mag`` and uint64 ``s`` in 0..63."""
    q = mag >> s
    rem = mag & ((_U1 << s) - _U1)
    half = _U1 << (np.maximum(s, _U1) - _U1)  # meaningless when s == 0
    up = (s > 0) & ((rem > half) | ((rem == half) & ((q & _U1) == _U1)))
    return q + up.astype(np.uint64)


# ---------------------------------------------------------------------------
# Scale parameters
# ---------------------------------------------------------------------------

def requant_scale(x_scale: float, w_scale: npt.ArrayLike,
                  y_scale: float) -> np.ndarray:
    """Per-channel requantization scale, computed exactly as onnxruntime does.

    ``f32(f32(x_scale * w_scale) / y_scale)`` with every operand first
    converted to float32 and every operation done in float32. The operation
    order matters: ``x_scale * (w_scale / y_scale)`` can differ in the last
    bit.

    Args:
        x_scale: input scale (per tensor).
        w_scale: weight scale, a scalar or one value per output channel.
        y_scale: output scale (per tensor).

    Returns:
        float32 array with the shape of ``w_scale`` (0-d for a scalar).
    """
    xs = np.float32(x_scale)
    ws = np.asarray(w_scale, dtype=np.float32)
    ys = np.float32(y_scale)
    prod = np.asarray(xs * ws, dtype=np.float32)
    return np.asarray(prod / ys, dtype=np.float32)


def scale_to_params(scale: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Split float32 scales into ``(M, shift)`` with ``scale == M * 2**-shift``.

    M and shift come from the float32 bit pattern, so the split is exact. Every
    nonzero scale, subnormals included, gets ``2**23 <= M < 2**24`` (a
    subnormal is normalised with a larger shift, at most 172). A zero scale
    (either sign) gives ``M = 0, shift = 0``.

    Args:
        scale: scale(s), one per channel. Non-float32 input is first rounded
            to float32, the precision onnxruntime stores scales in.

    Returns:
        ``(M, shift)`` as int64 arrays with the shape of ``scale``.

    Raises:
        ValueError: a scale is negative, NaN or infinite, or ``>= 2**24``
            (its shift would be negative; the shift field is unsigned 0..255).
    """
    raw = np.asarray(scale)
    if raw.dtype == np.float32:
        f = raw
    else:
        with np.errstate(over="ignore"):
            f = np.asarray(raw, dtype=np.float64).astype(np.float32)
    allowed = (f"allowed: finite scales with 0 <= scale < 2**{MANTISSA_BITS} "
               f"(= {float(_M_LIMIT):.0f})")
    bad = ~np.isfinite(f)
    if np.any(bad):
        raise ValueError(
            f"requantization scale at {_where(bad)} is {float(_first(raw, bad))!r}, "
            f"not finite; {allowed}")
    bad = f < 0
    if np.any(bad):
        raise ValueError(
            f"requantization scale at {_where(bad)} is {float(_first(raw, bad))!r}, "
            f"negative; {allowed}")
    bad = f >= np.float32(_M_LIMIT)
    if np.any(bad):
        raise ValueError(
            f"requantization scale at {_where(bad)} is {float(_first(raw, bad))!r}, "
            f"too large: it would need a negative shift; {allowed}")

    bits = np.ascontiguousarray(f).view(np.uint32).astype(np.int64)
    exp = (bits >> 23) & 0xFF
    frac = bits & 0x7FFFFF
    normal = exp > 0
    # Subnormal: value = frac * 2**-149; shift frac up to 24 bits instead.
    k = np.where(frac > 0, MANTISSA_BITS - _bit_length(frac.astype(np.uint64)), 0)
    m = np.where(normal, frac | (1 << 23), frac << k)
    shift = np.where(normal, 150 - exp, np.where(frac > 0, 149 + k, 0))
    return np.asarray(m, dtype=np.int64), np.asarray(shift, dtype=np.int64)


def pack_params(m: npt.ArrayLike, shift: npt.ArrayLike) -> np.ndarray:
    """Pack ``(M, shift)`` into 32-bit parameter lanes ``M | shift << 24``.

    The lanes are returned as int32 (the same bits, reinterpreted) because the
    accelerator's vector lanes are int32; a shift >= 128 makes the lane
    negative.

    Raises:
        ValueError: ``M`` outside ``0..2**24-1`` or ``shift`` outside 0..255.
    """
    m64 = _as_int64(m, "M")
    s64 = _as_int64(shift, "shift")
    _check_range(m64, 0, _M_LIMIT - 1, "M", f"0..{_M_LIMIT - 1}")
    _check_range(s64, 0, _SHIFT_MAX, "shift", f"0..{_SHIFT_MAX}")
    word = (m64 | (s64 << MANTISSA_BITS)).astype(np.uint32)
    return np.ascontiguousarray(word).view(np.int32)


def unpack_params(word: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pack_params`: ``(M, shift)`` int64 arrays.

    The word's 32 bits are read as unsigned, so int32 lanes (possibly
    negative) and uint32 words are both accepted.

    Raises:
        ValueError: a word outside ``-2**31 .. 2**32-1`` (not 32 bits).
    """
    w = _as_int64(word, "parameter word")
    _check_range(w, INT32_MIN, (1 << 32) - 1, "parameter word",
                 "32-bit values (-2**31 .. 2**32-1)")
    w &= 0xFFFFFFFF
    return w & (_M_LIMIT - 1), w >> MANTISSA_BITS


# ---------------------------------------------------------------------------
# Integer rounding primitives
# ---------------------------------------------------------------------------

def round_to_significant(x: np.ndarray, bits: int) -> np.ndarray:
    """Round ``|x|`` to ``bits`` significant bits, half to even, keeping the sign.

    This is the integer image of converting to a binary float with a
    ``bits``-bit significand (``bits=24``: float32). Values with
    ``|x| < 2**bits`` are returned unchanged.

    Args:
        x: integer array (converted to int64).
        bits: significant bits to keep, >= 1.

    Returns:
        int64 array.

    Raises:
        ValueError: ``bits < 1``, or a positive value rounds up to ``2**63``.
    """
    if int(bits) < 1:
        raise ValueError(f"bits must be >= 1, got {bits}")
    x64 = _as_int64(x, "x")
    mag, neg = _magnitude(x64)
    drop = np.maximum(_bit_length(mag) - int(bits), 0).astype(np.uint64)
    res = _rne_shift_right_u(mag, drop) << drop
    # Rounding up can carry into bit 63: fine for -2**63, not representable
    # for positive values.
    over = ~neg & (res > np.uint64(_INT64_MAX))
    if np.any(over):
        raise ValueError(
            f"round_to_significant overflow: {int(_first(x64, over))} rounds "
            f"to 2**63 with {bits} bits, outside int64")
    return np.asarray(_signed(res, neg), dtype=np.int64)


def rne_shift_right(x: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``x / 2**shift`` rounded half to even (like ``np.rint`` of the exact quotient).

    Symmetric for negative values (the magnitude is rounded). Any
    non-negative shift is accepted; shifts of 64 or more give 0.

    Args:
        x: integer array (converted to int64).
        shift: non-negative integer array, broadcastable against ``x``.

    Returns:
        int64 array of the broadcast shape.

    Raises:
        ValueError: a negative shift.
    """
    x64 = _as_int64(x, "x")
    s64 = _as_int64(shift, "shift")
    if np.any(s64 < 0):
        bad = s64 < 0
        raise ValueError(
            f"shift must be >= 0, got {int(_first(s64, bad))} at {_where(bad)}")
    x64, s64 = np.broadcast_arrays(x64, s64)
    mag, neg = _magnitude(x64)
    # uint64 shifts by >= 64 are undefined in C (x86 masks the count), so
    # shift by at most 63 and zero the rest: |x| <= 2**63 gives a quotient
    # <= 0.5, which rounds to 0 (a tie goes to even 0).
    res = _rne_shift_right_u(mag, np.minimum(s64, 63).astype(np.uint64))
    res = np.where(s64 >= 64, np.uint64(0), res)
    return np.asarray(_signed(res, neg), dtype=np.int64)


# ---------------------------------------------------------------------------
# REQUANT op and references
# ---------------------------------------------------------------------------

def _requant_operands(acc: npt.ArrayLike, m: npt.ArrayLike, shift: npt.ArrayLike
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """REQUANT's operands as int64 arrays, each checked against its field's range."""
    a = _as_int64(acc, "acc")
    m64 = _as_int64(m, "M")
    s64 = _as_int64(shift, "shift")
    _check_range(a, INT32_MIN, INT32_MAX, "acc", "int32 values")
    _check_range(m64, 0, _M_LIMIT - 1, "M", f"0..{_M_LIMIT - 1}")
    _check_range(s64, 0, _SHIFT_MAX, "shift", f"0..{_SHIFT_MAX}")
    return a, m64, s64


def requantize_integer(acc: npt.ArrayLike, m: npt.ArrayLike,
                       shift: npt.ArrayLike) -> np.ndarray:
    """The definition of the accelerator's REQUANT op, in integer operations only.

    ``rne_shift_right(round24(round24(acc) * M), shift)`` saturated to the
    int32 range, where ``round24`` is :func:`round_to_significant` with 24
    bits. For ``scale = M * 2**-shift`` (see :func:`scale_to_params`) this
    equals the float32 computation ``np.rint(np.float32(acc) * scale)``
    (saturated), including ties and accumulators >= 2**24 that float32 cannot
    hold exactly. No clamp to the output type and no zero point: those are the
    separate CLIP and ADD ops. :func:`requantize` computes the same integers
    faster; this form is the reference it is tested against (and the one an
    RTL implementation follows).

    Args:
        acc: int32-valued accumulators (any integer dtype).
        m: mantissas ``0..2**24-1``, broadcastable per lane.
        shift: shifts ``0..255``, broadcastable per lane.

    Returns:
        int64 array, values within ``[-2**31, 2**31-1]``.

    Raises:
        ValueError: ``acc`` outside int32, ``m`` or ``shift`` out of range.
        TypeError: non-integer inputs.
    """
    a, m64, s64 = _requant_operands(acc, m, shift)
    # |round24(acc)| <= 2**31 and M < 2**24, so the product stays below 2**55.
    prod = round_to_significant(a, MANTISSA_BITS) * m64
    y = rne_shift_right(round_to_significant(prod, MANTISSA_BITS), s64)
    return np.clip(y, INT32_MIN, INT32_MAX).astype(np.int64)


#: ``2**-shift`` for every shift the field holds: exact float64 powers of two
#: (the smallest, 2**-255, is far above float64's normal minimum 2**-1022).
_POW2_NEG = np.ldexp(1.0, -np.arange(_SHIFT_MAX + 1))


def requantize(acc: npt.ArrayLike, m: npt.ArrayLike,
               shift: npt.ArrayLike) -> np.ndarray:
    """The accelerator's REQUANT op: ``rint(f32(acc) * scale)``, bit-exact.

    Returns exactly :func:`requantize_integer` (the definition; same
    arguments, result and errors), computed in floating point, where each
    integer step has an exact float image:

    * ``round24(acc)``: int32 -> float64 is exact, float64 -> float32 is one
      RNE rounding to 24 significant bits (no overflow, no subnormals).
    * ``round24(acc) * M``: a 24-bit by a 24-bit significand is at most 48
      bits, exact in float64 (53 bits); ``|product| < 2**55``.
    * ``round24(...)`` of it: float64 -> float32, again one RNE rounding.
    * ``rne_shift_right(p, shift)``: ``p * 2**-shift`` is exact in float64
      (a nonzero ``|p| >= 1`` stays >= 2**-255, a normal float64) and
      ``np.rint`` rounds half to even, symmetric in the sign like the
      integer shift of the magnitude.

    ``|result| <= 2**55`` converts to int64 exactly before the int32
    saturation.
    """
    a, m64, s64 = _requant_operands(acc, m, shift)
    acc24 = a.astype(np.float64).astype(np.float32)
    prod24 = (acc24 * m64.astype(np.float64)).astype(np.float32)
    y = np.rint(prod24 * _POW2_NEG[s64])
    return np.clip(y, INT32_MIN, INT32_MAX).astype(np.int64)


def requantize_packed(acc: npt.ArrayLike, word: npt.ArrayLike) -> np.ndarray:
    """:func:`requantize` with packed ``M | shift << 24`` parameter lanes.

    This is the ALU form of REQUANT, whose second operand is a packed word
    (see :func:`pack_params`).
    """
    m, shift = unpack_params(word)
    return requantize(acc, m, shift)


def onnxruntime_reference(acc: npt.ArrayLike, scale: npt.ArrayLike,
                          y_zp: int, qmin: int = -128,
                          qmax: int = 127) -> np.ndarray:
    """Requantize as onnxruntime does, in float32 (the ground truth).

    ``rint(clamp(f32(acc) * scale, qmin - y_zp, qmax - y_zp)) + y_zp`` with
    one float32 multiply, float32 clamp bounds and RNE; no float64 anywhere.

    Args:
        acc: integer accumulators.
        scale: float32 scale(s), broadcastable against ``acc``.
        y_zp: output zero point.
        qmin, qmax: output type range (int8 by default).

    Returns:
        int64 array in ``[qmin, qmax]``.
    """
    a = np.asarray(acc).astype(np.float32)
    s = np.asarray(scale, dtype=np.float32)
    y = np.asarray(a * s, dtype=np.float32)
    lo = np.asarray(np.asarray(qmin) - np.asarray(y_zp)).astype(np.float32)
    hi = np.asarray(np.asarray(qmax) - np.asarray(y_zp)).astype(np.float32)
    y = np.minimum(np.maximum(y, lo), hi)
    return np.rint(y).astype(np.int64) + np.asarray(y_zp, dtype=np.int64)


def requantize_to_int8(acc: npt.ArrayLike, m: npt.ArrayLike,
                       shift: npt.ArrayLike, y_zp: int, qmin: int = -128,
                       qmax: int = 127) -> np.ndarray:
    """Full requantization as the accelerator runs it: REQUANT; CLIP; ADD.

    :func:`requantize`, then clip to ``[qmin - y_zp, qmax - y_zp]``, then add
    ``y_zp``. Equal to :func:`onnxruntime_reference` for
    ``scale == M * 2**-shift``: the clip bounds are integers and rounding is
    monotonic, so clipping after rounding matches onnxruntime's clamp before
    rounding, and REQUANT's int32 saturation never reaches the bounds.

    Returns:
        int64 array in ``[qmin, qmax]``.
    """
    y = requantize(acc, m, shift)
    zp = np.asarray(y_zp, dtype=np.int64)
    y = np.clip(y, np.asarray(qmin, dtype=np.int64) - zp,
                np.asarray(qmax, dtype=np.int64) - zp)
    return np.asarray(y + zp, dtype=np.int64)
