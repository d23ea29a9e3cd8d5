"""The float fast path of REQUANT (``requantize``) against its integer definition
(``requantize_integer``), over the whole parameter space the ISA allows.

The operands are an int32 accumulator, a ``MANTISSA_BITS``-bit mantissa and a
``SHIFT_BITS``-bit shift (the fields of a packed parameter lane). The space has
2**64 points, so the checks are: every shift against a grid of boundary values of
the other two fields, every exact tie the two roundings can meet, random triples
weighted to where rounding decides the result, and hypothesis over the full ranges.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera.isa import requant as rq

M_MAX = (1 << rq.MANTISSA_BITS) - 1
SHIFT_MAX = (1 << rq.SHIFT_BITS) - 1
SHIFTS = np.arange(SHIFT_MAX + 1)


def assert_same(acc, m, shift) -> None:
    """``requantize`` equals ``requantize_integer`` element by element (named on failure)."""
    acc, m, shift = np.broadcast_arrays(np.asarray(acc, dtype=np.int64),
                                        np.asarray(m, dtype=np.int64),
                                        np.asarray(shift, dtype=np.int64))
    fast = rq.requantize(acc, m, shift)
    ref = rq.requantize_integer(acc, m, shift)
    assert fast.dtype == ref.dtype == np.int64 and fast.shape == ref.shape
    bad = np.flatnonzero(fast != ref)
    if bad.size:
        i = bad[0]
        pytest.fail(f"{bad.size} mismatches, e.g. acc={acc.flat[i]} M={m.flat[i]} "
                    f"shift={shift.flat[i]}: fast {fast.flat[i]}, integer {ref.flat[i]}")


def boundary_values(bits: int, signed: bool) -> np.ndarray:
    """0, +-1 and every power of two below the field's width, each +-0..1, and the
    field's extremes: where significands gain a bit and roundings change."""
    pow2 = 1 << np.arange(bits, dtype=np.int64)
    mags = np.unique(np.concatenate([[0, 1, 2, 3], (pow2[:, None] + np.arange(-1, 2)).ravel()]))
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    vals = np.concatenate([mags, -mags, [lo, hi, lo + 1, hi - 1]]) if signed else \
        np.concatenate([mags, [hi, hi - 1]])
    return np.unique(vals[(vals >= lo) & (vals <= hi)])


def test_every_shift_on_a_boundary_grid():
    acc = boundary_values(32, signed=True)
    # Mantissas with many set bits, where the second rounding discards most.
    m = np.unique(np.concatenate([boundary_values(rq.MANTISSA_BITS, signed=False),
                                  [0xAAAAAA, 0x555555, 0xFFFFFE, 0x800001, 0xC00001]]))
    assert acc.min() == rq.INT32_MIN and acc.max() == rq.INT32_MAX and m.max() == M_MAX
    assert_same(acc[:, None, None], m[None, :, None], SHIFTS[None, None, :])


def test_every_exact_tie_of_the_final_rounding():
    # acc * 2**t with acc odd and |acc| < 2**24 is exact, so shift t + 1 leaves acc / 2:
    # a tie, which goes to the even neighbour (both signs, every power-of-two M).
    odd = np.arange(-(1 << 12) + 1, 1 << 12, 2)
    odd = np.concatenate([odd, [M_MAX, -M_MAX, (1 << 23) + 1, -(1 << 23) - 1]])
    t = np.arange(rq.MANTISSA_BITS)
    assert_same(odd[:, None], (1 << t)[None, :], (t + 1)[None, :])
    # The same ties reached through the first rounding: acc = odd * 2**8 above 2**24.
    big = np.arange(1 << 15, 1 << 22, 4099) * 2 + 1     # odd, 17..23 bits: exact
    assert big.max() << 8 <= rq.INT32_MAX
    assert_same(np.concatenate([big, -big])[:, None] << 8, (1 << t)[None, :], (t + 9)[None, :])


def test_ties_of_both_24_bit_roundings():
    # acc with 25 significant bits ending in 1: halfway between two float32 values.
    k = np.arange(1 << 12)
    acc = ((1 << 24) + 2 * k + 1) * np.array([[1], [-1]])
    assert_same(acc.ravel()[:, None], np.array([1, 3, M_MAX, 1 << 23])[None, :],
                np.array([0, 1, 24, 25, 47])[:, None, None])
    # Products with a 25th significant bit exactly half an ulp: M = 2**24 - 1, acc = 2**k + 1.
    assert_same((1 << np.arange(1, 31)) + 1, M_MAX, SHIFTS[:, None])


def test_random_triples_where_rounding_decides():
    rng = np.random.default_rng(20)
    n = 400_000
    bits = rng.integers(0, 32, n)
    acc = rng.integers(0, 1 << 62, n) >> (62 - bits)
    acc = np.where(rng.random(n) < 0.5, -acc, acc)
    m = rng.integers(0, M_MAX + 1, n) >> rng.integers(0, rq.MANTISSA_BITS + 1, n)
    # Shifts that leave a result of 0..~2**16: the product's bit length minus 0..17.
    plen = bits + np.ceil(np.log2(m + 1)).astype(np.int64)
    shift = np.clip(plen - rng.integers(-2, 18, n), 0, SHIFT_MAX)
    assert_same(acc, m, shift)


def test_packed_lanes_and_input_dtypes():
    rng = np.random.default_rng(7)
    acc32 = rng.integers(rq.INT32_MIN, rq.INT32_MAX, 10_000, dtype=np.int64, endpoint=True)
    words = rng.integers(0, 1 << 32, 10_000, dtype=np.int64)
    m, shift = rq.unpack_params(words)
    want = rq.requantize_integer(acc32, m, shift)
    np.testing.assert_array_equal(rq.requantize_packed(acc32, words), want)
    np.testing.assert_array_equal(rq.requantize_packed(acc32.astype(np.int32),
                                                       words.astype(np.uint32)), want)
    assert rq.requantize(np.int32(-7), 1 << 23, 24).shape == ()
    assert int(rq.requantize(np.int32(-7), 1 << 23, 24)) == -4  # -3.5 to even


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(rq.INT32_MIN, rq.INT32_MAX), st.integers(0, M_MAX),
                          st.integers(0, SHIFT_MAX)), min_size=1, max_size=64))
def test_full_ranges_property(triples):
    acc, m, shift = (np.array(col, dtype=np.int64) for col in zip(*triples))
    assert_same(acc, m, shift)


@pytest.mark.parametrize("args", [
    ([rq.INT32_MAX + 1], 1, 0), ([rq.INT32_MIN - 1], 1, 0), ([5], M_MAX + 1, 0),
    ([5], -1, 0), ([5], 1, SHIFT_MAX + 1), ([5], 1, -1)])
def test_out_of_range_operands_raise_alike(args):
    for fn in (rq.requantize, rq.requantize_integer):
        with pytest.raises(ValueError, match="out of range"):
            fn(*args)
