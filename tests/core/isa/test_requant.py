"""Tests of tessera.isa.requant against an independent float32 reference.

The reference below is written here with plain numpy float32 operations (the
way onnxruntime requantizes) and deliberately shares no code with the module.
"""
from __future__ import annotations

import importlib.util
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

try:
    from tessera.isa import requant as rq
except ImportError:
    # The package may not be importable as a whole yet; the module itself
    # only needs numpy.
    _spec = importlib.util.spec_from_file_location(
        "tessera_isa_requant",
        Path(__file__).parents[3] / "tessera" / "isa" / "requant.py")
    rq = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(rq)

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
SETTINGS = settings(max_examples=100, deadline=None)


# ---------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------

def f32_requant(acc, scale):
    """rint(f32(acc) * scale) in float32, saturated to int32 (REQUANT)."""
    y = np.asarray(acc).astype(np.float32) * np.asarray(scale, dtype=np.float32)
    assert y.dtype == np.float32
    return np.clip(np.rint(y).astype(np.int64), I32_MIN, I32_MAX)


def f32_full(acc, scale, y_zp, qmin=-128, qmax=127):
    """Clamp-then-round float32 requantization, as onnxruntime's MLAS does."""
    y = np.asarray(acc).astype(np.float32) * np.asarray(scale, dtype=np.float32)
    zp = np.asarray(y_zp)
    y = np.clip(y, (qmin - zp).astype(np.float32), (qmax - zp).astype(np.float32))
    assert y.dtype == np.float32
    return np.rint(y).astype(np.int64) + zp


def params(scale):
    m, s = rq.scale_to_params(np.asarray(scale, dtype=np.float32))
    return m, s


def check_requant(acc, scale):
    acc = np.asarray(acc, dtype=np.int64)
    scale = np.asarray(scale, dtype=np.float32)
    m, s = params(scale)
    got = rq.requantize(acc, m, s)
    want = f32_requant(acc, scale)
    bad = np.flatnonzero(np.broadcast_to(got != want, np.broadcast(acc, scale).shape))
    if bad.size:
        a, sc = np.broadcast_arrays(acc, scale)
        i = bad[0]
        pytest.fail(f"{bad.size} mismatches, e.g. acc={a.flat[i]} "
                    f"scale={sc.flat[i]!r} got={got.flat[i]} want={want.flat[i]}")
    np.testing.assert_array_equal(
        rq.requantize_packed(acc, rq.pack_params(m, s)), want)
    return got


def log_uniform_scales(rng, n, lo, hi):
    return np.exp(rng.uniform(np.log(lo), np.log(hi), n)).astype(np.float32)


# ---------------------------------------------------------------------------
# Bulk bit-exactness
# ---------------------------------------------------------------------------

def test_random_million_bit_exact():
    rng = np.random.default_rng(1234)
    n = 1 << 18
    accs = [
        rng.integers(I32_MIN, I32_MAX, n, endpoint=True),        # full int32
        rng.integers(-(2**15) + 1, 2**15, n),                    # small
        rng.integers(I32_MIN, I32_MAX, n, endpoint=True),
        rng.integers(-(2**15) + 1, 2**15, n),
    ]
    scales = [
        log_uniform_scales(rng, n, 1e-6, 1.0),
        log_uniform_scales(rng, n, 1e-6, 1.0),
        log_uniform_scales(rng, n, 1.0, 1000.0),                  # > 1, saturates
        log_uniform_scales(rng, n, 1e-3, 1000.0),
    ]
    total = 0
    for acc, scale in zip(accs, scales):
        check_requant(acc, scale)
        total += acc.size
    assert total >= 1_000_000


def test_per_channel_int8_matches_reference():
    rng = np.random.default_rng(7)
    for trial in range(20):
        c = int(rng.integers(1, 65))
        x_scale = float(log_uniform_scales(rng, 1, 1e-4, 1.0)[0])
        y_scale = float(log_uniform_scales(rng, 1, 1e-3, 10.0)[0])
        w_scale = log_uniform_scales(rng, c, 1e-5, 1e-1)
        scale = rq.requant_scale(x_scale, w_scale, y_scale)
        # onnxruntime: (x_scale * w_scale[c]) / y_scale, each step in float32.
        want_scale = ((np.float32(x_scale) * w_scale).astype(np.float32)
                      / np.float32(y_scale)).astype(np.float32)
        assert scale.dtype == np.float32 and scale.shape == (c,)
        np.testing.assert_array_equal(scale.view(np.uint32), want_scale.view(np.uint32))
        zp = int(rng.integers(-128, 128))
        # Accumulators that land around the int8 range and past it.
        span = np.minimum(400.0 / scale.astype(np.float64), 2.0**31 - 1)
        acc = (rng.uniform(-1, 1, (256, c)) * span).astype(np.int64)
        m, s = rq.scale_to_params(scale)
        got = rq.requantize_to_int8(acc, m, s, zp)
        np.testing.assert_array_equal(got, f32_full(acc, scale, zp))
        np.testing.assert_array_equal(got, rq.onnxruntime_reference(acc, scale, zp))
        assert got.min() >= -128 and got.max() <= 127
    # uint8-style range and a per-channel zero point go through the same path.
    acc = rng.integers(-(2**20), 2**20, (100, 4))
    scale = np.float32([1e-4, 3e-4, 7.7e-5, 2.5e-4])
    zp = np.array([0, 17, 128, 255])
    m, s = rq.scale_to_params(scale)
    np.testing.assert_array_equal(
        rq.requantize_to_int8(acc, m, s, zp, qmin=0, qmax=255),
        f32_full(acc, scale, zp, 0, 255))


def test_requant_scale_scalar_and_order():
    s = rq.requant_scale(0.1, 0.3, 0.7)
    assert s.dtype == np.float32 and s.shape == ()
    assert s == (np.float32(np.float32(0.1) * np.float32(0.3)) / np.float32(0.7))
    # The two association orders differ for some inputs; we must use ORT's.
    rng = np.random.default_rng(3)
    x, y = np.float32(0.0123), np.float32(0.377)
    w = rng.uniform(1e-3, 1, 10_000).astype(np.float32)
    other = (x * (w / y).astype(np.float32)).astype(np.float32)
    ours = rq.requant_scale(x, w, y)
    assert np.any(ours != other)
    np.testing.assert_array_equal(ours, ((x * w).astype(np.float32) / y).astype(np.float32))


# ---------------------------------------------------------------------------
# Ties and edge cases
# ---------------------------------------------------------------------------

def test_exact_ties_power_of_two_scale():
    rng = np.random.default_rng(11)
    accs, scales = [], []
    for k in range(1, 32):
        jmax = (2**31 - 2**(k - 1)) // 2**k
        j = rng.integers(-jmax, jmax, 2000, endpoint=True)
        j = np.concatenate([j, np.arange(-3, 4)])
        base = (2 * j + 1) * 2**(k - 1)                          # (j + 0.5) * 2**k
        base = base[(base >= I32_MIN) & (base <= I32_MAX)]
        for d in (-1, 0, 1):
            a = np.clip(base + d, I32_MIN, I32_MAX)
            accs.append(a)
            scales.append(np.full(a.shape, 2.0**-k, np.float32))
    got = check_requant(np.concatenate(accs), np.concatenate(scales))
    assert got.size > 100_000
    # Sanity: exact ties were present (where float32 holds acc exactly) and
    # went to even.
    acc = np.concatenate(accs[1::3])
    sc = np.concatenate(scales[1::3])
    exact = acc.astype(np.float32).astype(np.int64) == acc
    assert np.count_nonzero(exact) > 50_000
    y = rq.requantize(acc, *params(sc))
    assert np.all(y[exact] % 2 == 0)


def test_near_ties_odd_mantissa_and_double_rounding():
    """acc * scale within an ulp of x.5, including double-rounding cases.

    When acc * M has more than 24 significant bits, the float32 product can
    round onto x.5 exactly even though the exact product is not a tie; the
    result must follow float32, not the exact value.
    """
    rng = np.random.default_rng(5)
    n = 4000
    m = rng.integers(2**22, 2**23, n) * 2 + 1                    # odd, 24 bits
    shift = rng.integers(24, 56, n)
    scale = (m.astype(np.float64) * np.exp2(-shift.astype(np.float64))).astype(np.float32)
    ms, ss = params(scale)
    np.testing.assert_array_equal(ms, m)
    np.testing.assert_array_equal(ss, shift)
    # Target values (t + 0.5) spread up to the int32 limit of acc.
    vmax = np.minimum(2.0**31 * scale.astype(np.float64), 2.0**24)
    t = np.floor(rng.uniform(-1, 1, n) * vmax)
    center = np.round((t + 0.5) / scale.astype(np.float64))
    offs = np.arange(-8, 9)
    acc = np.clip(center[:, None] + offs[None, :], I32_MIN, I32_MAX).astype(np.int64)
    sc = np.broadcast_to(scale[:, None], acc.shape)
    check_requant(acc, sc)
    # Prove double-rounding cases were exercised: float32 product is exactly
    # x.5 while the exact product acc * M * 2**-shift is not.
    prod32 = acc.astype(np.float32) * sc
    f32_tie = (prod32 - np.floor(prod32)) == 0.5
    exact = rq.round_to_significant(acc, 24) * m[:, None]
    sh = np.broadcast_to(shift[:, None], acc.shape)
    frac = exact & ((np.int64(1) << sh) - 1)
    exact_tie = frac == (np.int64(1) << (sh - 1))
    assert np.count_nonzero(f32_tie & ~exact_tie) > 50
    # Exact ties with an odd mantissa: acc = odd * 2**(shift - 1), shift <= 31.
    k = rng.integers(24, 32, n)
    scale = (m.astype(np.float64) * np.exp2(-k.astype(np.float64))).astype(np.float32)
    jmax = (2**31 - 2**(k - 1)) // 2**k
    j = np.floor(rng.uniform(-1, 1, n) * (jmax + 1)).astype(np.int64).clip(-jmax, jmax)
    acc = (2 * j + 1) * 2**(k - 1)
    got = check_requant(acc[:, None] + np.arange(-1, 2)[None, :], scale[:, None])
    assert np.all(got[:, 1] % 2 == 0)


def test_acc_above_2_24_rounds_like_float32():
    base = np.concatenate([
        np.arange(2**24 - 8, 2**24 + 80),
        np.arange(2**25 - 8, 2**25 + 80),
        np.arange(3 * 2**24 - 40, 3 * 2**24 + 40),
        np.arange(2**30 - 300, 2**30 + 300),
    ])
    acc = np.concatenate([base, -base])
    a_f32 = acc.astype(np.float32).astype(np.int64)
    np.testing.assert_array_equal(rq.round_to_significant(acc, 24), a_f32)
    assert np.any(a_f32 != acc)
    scales = np.float32([1.0, 0.5, 0.25, 2**-7, 2**-24, 2**-25, 0.1, 1 / 3,
                         0.999999, 1.0000001, 3.0, 1e-7, 0.75])
    check_requant(acc[:, None], scales[None, :])


def test_int32_extremes_and_saturation():
    ends = np.concatenate([np.arange(I32_MIN, I32_MIN + 70),
                           np.arange(I32_MAX - 70, I32_MAX + 1),
                           np.arange(-70, 71)])
    rng = np.random.default_rng(9)
    scales = np.concatenate([
        np.float32([0, 1e-45, 2**-149, 2**-126, 1e-38, 2**-32, 2**-31, 2**-30,
                    0.5, 1.0, 1.5, 2.0, 1000.0, 2**24 - 1, np.nextafter(np.float32(2**24), np.float32(0))]),
        log_uniform_scales(rng, 50, 1e-9, 1e6),
    ]).astype(np.float32)
    got = check_requant(ends[:, None], scales[None, :])
    assert got.max() == I32_MAX and got.min() == I32_MIN


def test_subnormal_and_tiny_scales():
    rng = np.random.default_rng(4)
    sub = rng.integers(1, 2**23, 300, dtype=np.int64).astype(np.uint32).view(np.float32)
    tiny = log_uniform_scales(rng, 300, 1e-38, 1e-20)
    scales = np.concatenate([sub, tiny, np.float32([0.0, -0.0])])
    m, s = params(scales)
    nz = scales != 0
    assert np.all((m[nz] >= 2**23) & (m[nz] < 2**24)) and np.all(s <= 255)
    assert np.all(m[~nz] == 0) and np.all(s[~nz] == 0)
    acc = np.array([I32_MIN, I32_MAX, -1, 1, 12345, 0])
    got = check_requant(acc[:, None], scales[None, :])
    assert np.all(got == 0)


# ---------------------------------------------------------------------------
# Property tests against exact Python arithmetic
# ---------------------------------------------------------------------------

def near_powers_of_two(lo_exp, hi_exp, limit):
    return st.builds(
        lambda e, d, neg: max(-limit, min(limit, (2**e + d) * (-1 if neg else 1))),
        st.integers(lo_exp, hi_exp), st.integers(-4, 4), st.booleans())


def py_round_sig(x: int, bits: int) -> int:
    a = abs(x)
    d = max(a.bit_length() - bits, 0)
    q = round(Fraction(a, 2**d))          # round() on Fraction is half-even
    return (q << d) * (-1 if x < 0 else 1)


int62 = st.one_of(st.integers(-(2**62), 2**62), near_powers_of_two(0, 62, 2**62))


@SETTINGS
@given(st.lists(int62, min_size=1, max_size=40), st.integers(1, 62))
def test_round_to_significant_matches_bigint(xs, bits):
    got = rq.round_to_significant(np.array(xs, dtype=np.int64), bits)
    assert got.dtype == np.int64
    assert [int(v) for v in got] == [py_round_sig(x, bits) for x in xs]


int64s = st.one_of(st.integers(-(2**63), 2**63 - 1), near_powers_of_two(0, 62, 2**63 - 1))


@SETTINGS
@given(st.lists(st.tuples(int64s, st.integers(0, 80)), min_size=1, max_size=40))
def test_rne_shift_right_matches_fraction(pairs):
    xs = np.array([p[0] for p in pairs], dtype=np.int64)
    ss = np.array([p[1] for p in pairs], dtype=np.int64)
    got = rq.rne_shift_right(xs, ss)
    assert [int(v) for v in got] == [round(Fraction(x, 2**s)) for x, s in pairs]


def test_rne_shift_right_boundaries():
    x = np.array([2**62, 2**62 + 1, 3 * 2**61, -(2**62), -(2**62) - 1, -(2**63),
                  -(2**63), -(2**63), 2**63 - 1, 2**63 - 1, 5, -5, 7])
    s = np.array([63, 63, 63, 63, 63, 63, 62, 64, 63, 255, 0, 1, 200])
    want = [round(Fraction(int(a), 2**int(b))) for a, b in zip(x, s)]
    assert [int(v) for v in rq.rne_shift_right(x, s)] == want


pos_f32 = st.floats(min_value=0.0, max_value=2.0**24, exclude_max=True, width=32,
                    allow_subnormal=True, allow_nan=False, allow_infinity=False)


@SETTINGS
@given(st.lists(pos_f32, min_size=1, max_size=30))
def test_scale_to_params_exact_round_trip(values):
    scale = np.array(values, dtype=np.float32)
    m, s = rq.scale_to_params(scale)
    assert m.dtype == np.int64 and s.dtype == np.int64
    for v, mi, si in zip(scale, m, s):
        assert 0 <= si <= 255 and 0 <= mi < 2**24
        assert Fraction(int(mi), 2**int(si)) == Fraction(float(v))
        if v != 0:
            assert 2**23 <= mi
    m2, s2 = rq.unpack_params(rq.pack_params(m, s))
    np.testing.assert_array_equal(m2, m)
    np.testing.assert_array_equal(s2, s)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 2**24 - 1), st.integers(0, 255)),
                min_size=1, max_size=30))
def test_pack_unpack_round_trip(pairs):
    m = np.array([p[0] for p in pairs])
    s = np.array([p[1] for p in pairs])
    w = rq.pack_params(m, s)
    assert w.dtype == np.int32
    assert [int(v) & 0xFFFFFFFF for v in w] == [a | b << 24 for a, b in pairs]
    m2, s2 = rq.unpack_params(w)
    np.testing.assert_array_equal(m2, m)
    np.testing.assert_array_equal(s2, s)
    # Unsigned words decode the same.
    m3, s3 = rq.unpack_params(w.view(np.uint32))
    np.testing.assert_array_equal(m3, m)
    np.testing.assert_array_equal(s3, s)


@SETTINGS
@given(st.lists(st.integers(I32_MIN, I32_MAX), min_size=1, max_size=20),
       st.lists(pos_f32, min_size=1, max_size=20))
def test_requantize_property(accs, scales):
    check_requant(np.array(accs)[:, None], np.array(scales, dtype=np.float32)[None, :])


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad, text", [
    (-0.5, "-0.5"),
    (float("nan"), "nan"),
    (float("inf"), "inf"),
    (float("-inf"), "-inf"),
    (2.0**24, "16777216.0"),
    (1e30, "1e+30"),
])
def test_scale_errors_name_channel_and_value(bad, text):
    scale = np.array([0.1, 0.2, bad, 0.3], dtype=np.float64)
    with pytest.raises(ValueError) as info:
        rq.scale_to_params(scale)
    msg = str(info.value)
    assert "channel 2" in msg and text in msg and "allowed" in msg


def test_other_errors():
    with pytest.raises(ValueError, match="channel 1"):
        rq.pack_params([1, 2**24], [0, 0])
    with pytest.raises(ValueError, match="shift"):
        rq.pack_params([1], [256])
    with pytest.raises(ValueError, match="shift"):
        rq.rne_shift_right(np.array([4]), np.array([-1]))
    with pytest.raises(ValueError, match="acc"):
        rq.requantize(np.array([2**31]), 2**23, 24)
    with pytest.raises(ValueError):
        rq.round_to_significant(np.array([2**63 - 1]), 24)
    with pytest.raises(TypeError):
        rq.requantize(np.array([1.5]), 2**23, 24)
    # -2**63 stays representable.
    assert rq.round_to_significant(np.array([-(2**63)]), 24)[0] == -(2**63)


# ---------------------------------------------------------------------------
# onnxruntime itself (optional)
# ---------------------------------------------------------------------------

def _ort_session(model):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdqisint8allowed", "1")
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def test_onnxruntime_qlinear_ops_match():
    """int8 QLinearMatMul (per tensor) and QLinearConv (per channel) vs ORT."""
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2024)
    M, K, N = 16, 128, 32

    # QLinearMatMul with the scales and zero points as graph inputs, so one
    # session covers many scale choices.
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    b_zp = np.array(-3, np.int8)
    names = ["a", "a_s", "a_zp", "b", "b_s", "b_zp", "y_s", "y_zp"]
    inputs = [helper.make_tensor_value_info("a", TensorProto.INT8, [M, K]),
              helper.make_tensor_value_info("a_s", TensorProto.FLOAT, []),
              helper.make_tensor_value_info("a_zp", TensorProto.INT8, []),
              helper.make_tensor_value_info("b_s", TensorProto.FLOAT, []),
              helper.make_tensor_value_info("y_s", TensorProto.FLOAT, []),
              helper.make_tensor_value_info("y_zp", TensorProto.INT8, [])]
    graph = helper.make_graph(
        [helper.make_node("QLinearMatMul", names, ["y"])], "mm", inputs,
        [helper.make_tensor_value_info("y", TensorProto.INT8, [M, N])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(b_zp, "b_zp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    sess = _ort_session(model)
    checked = 0
    for trial in range(60):
        a = rng.integers(-128, 128, (M, K), dtype=np.int8)
        a_zp = np.int8(rng.integers(-20, 21))
        y_zp = np.int8(rng.integers(-128, 128))
        if trial % 3 == 0:
            # Power-of-two overall scale: many exact x.5 ties.
            a_s, b_s, y_s = np.float32(2.0**-6), np.float32(2.0**-6), np.float32(2.0**rng.integers(-5, 2))
        else:
            a_s, b_s = log_uniform_scales(rng, 2, 1e-3, 1e-1)
            y_s = log_uniform_scales(rng, 1, 1e-2, 1.0)[0]
        feed = {"a": a, "a_s": np.array(a_s, np.float32), "a_zp": np.array(a_zp, np.int8),
                "b_s": np.array(b_s, np.float32), "y_s": np.array(y_s, np.float32),
                "y_zp": np.array(y_zp, np.int8)}
        out = sess.run(None, feed)[0].astype(np.int64)
        acc = (a.astype(np.int32) - a_zp) @ (b.astype(np.int32) - b_zp)
        scale = rq.requant_scale(a_s, b_s, y_s)
        m, s = rq.scale_to_params(scale)
        np.testing.assert_array_equal(rq.requantize_to_int8(acc, m, s, int(y_zp)), out)
        checked += out.size

    # QLinearConv, 1x1 kernel, per-channel weight scales (constant inputs).
    C, OC, H = 64, 16, 6
    w = rng.integers(-127, 128, (OC, C, 1, 1), dtype=np.int8)
    w_s = log_uniform_scales(rng, OC, 1e-4, 1e-2)
    x_s, x_zp = np.float32(0.037), np.int8(5)
    y_s, y_zp = np.float32(0.21), np.int8(-11)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w_s, "w_s"),
             numpy_helper.from_array(np.zeros(OC, np.int8), "w_zp"),
             numpy_helper.from_array(np.array(x_s, np.float32), "x_s"),
             numpy_helper.from_array(np.array(x_zp, np.int8), "x_zp"),
             numpy_helper.from_array(np.array(y_s, np.float32), "y_s"),
             numpy_helper.from_array(np.array(y_zp, np.int8), "y_zp")]
    graph = helper.make_graph(
        [helper.make_node("QLinearConv", ["x", "x_s", "x_zp", "w", "w_s", "w_zp",
                                          "y_s", "y_zp"], ["y"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.INT8, [1, C, H, H])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [1, OC, H, H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    sess = _ort_session(model)
    scale = rq.requant_scale(x_s, w_s, y_s)
    m, s = rq.scale_to_params(scale)
    for _ in range(10):
        x = rng.integers(-128, 128, (1, C, H, H), dtype=np.int8)
        out = sess.run(None, {"x": x})[0].astype(np.int64)
        acc = np.einsum("chw,oc->ohw", x[0].astype(np.int64) - x_zp,
                        w[:, :, 0, 0].astype(np.int64))
        want = rq.requantize_to_int8(acc, m[:, None, None], s[:, None, None], int(y_zp))
        np.testing.assert_array_equal(want, out[0])
        checked += out.size
    assert checked > 30_000
