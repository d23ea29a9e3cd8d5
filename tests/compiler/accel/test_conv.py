"""conv2d and dense: random shapes and epilogues, simulator output against numpy, bit-exact."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tessera.compiler import (AddConst, Bias, Clip, Conv2d, Dense, Requant, Residual, Shift,
                              requantize)

from tessera.config import PRESETS

from tests.compiler.helpers import FEW, PYNQ, TINY, compile_and_run
from tests.compiler.reference import conv, ort_requant, rint_scale, sat8, wrap32


@st.composite
def conv_case(draw, config):
    """A random convolution that fits ``config`` (small on tiny, more blocks on pynq)."""
    big = config is PYNQ
    n = draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sy, sx = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dy, dx = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = tuple(draw(st.integers(0, min(2, k - 1))) for k in (kh, kw, kh, kw))
    h = draw(st.integers(max(1, dy * (kh - 1) + 1 - pads[0] - pads[2]), 9))
    w = draw(st.integers(max(1, dx * (kw - 1) + 1 - pads[1] - pads[3]), 9))
    groups = draw(st.sampled_from([1, 1, 2, 3, "dw"]))
    cmax = 40 if big else 10
    if groups == "dw":
        c = o = draw(st.integers(1, cmax))
        groups = c
    else:
        c = groups * draw(st.integers(1, cmax // groups))
        o = groups * draw(st.integers(1, cmax // groups))
    seed = draw(st.integers(0, 2**32 - 1))
    return dict(n=n, c=c, h=h, w=w, o=o, k=(kh, kw), stride=(sy, sx), dil=(dy, dx),
                pads=(pads[0], pads[1], pads[2], pads[3]), groups=groups, seed=seed)


def _data(case):
    rng = np.random.default_rng(case["seed"])
    x = rng.integers(-128, 128, (case["n"], case["c"], case["h"], case["w"]), dtype=np.int8)
    w = rng.integers(-128, 128, (case["o"], case["c"] // case["groups"], *case["k"]),
                     dtype=np.int8)
    return rng, x, w


def _conv_op(case, w, epilogue, **kw):
    return Conv2d("conv", "x", "y", w, stride=case["stride"], padding=case["pads"],
                  dilation=case["dil"], groups=case["groups"], epilogue=epilogue, **kw)


def _acc(case, x, w):
    return conv(x, w, case["stride"], case["pads"], case["dil"], case["groups"])


@pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])
@FEW
@given(data=st.data())
def test_conv_requantize_per_channel(config, data):
    """Bias + per-channel REQUANT + zero point (+ ReLU): onnxruntime's QLinearConv output."""
    case = data.draw(conv_case(config))
    rng, x, w = _data(case)
    o = case["o"]
    bias = rng.integers(-30000, 30000, o)
    if data.draw(st.booleans()):
        bias = rng.integers(-2**24, 2**24, o)   # too large to fold into one GEMM operation
    scale = rng.uniform(1e-4, 5e-3, o).astype(np.float32)
    zp = data.draw(st.sampled_from([0, -128, 5]))
    relu = data.draw(st.booleans())
    threads = data.draw(st.sampled_from([1, 2]))
    op = _conv_op(case, w, requantize(scale, zp, relu=relu, bias=bias))
    out, _, _ = compile_and_run([op], {"x": x}, config, threads=threads)
    expected = ort_requant(_acc(case, x, w) + bias[None, :, None, None], scale, zp, relu)
    np.testing.assert_array_equal(out["y"], expected)


@pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])
@FEW
@given(data=st.data())
def test_conv_per_tensor_scale_and_shift_modes(config, data):
    """Per-tensor REQUANT (immediate on tiny's 32-bit field, a parameter row on pynq) and the
    power-of-two shift mode (with and without rounding), with clamps."""
    case = data.draw(conv_case(config))
    rng, x, w = _data(case)
    acc = _acc(case, x, w)
    if data.draw(st.booleans()):
        scale = float(rng.uniform(1e-4, 5e-3))
        lo, hi = sorted(int(v) for v in rng.integers(-100, 100, 2))
        op = _conv_op(case, w, (Requant(scale), Clip(lo, hi)))
        expected = np.clip(rint_scale(acc, np.float32(scale)), lo, hi)
    else:
        n = data.draw(st.integers(1, 14))
        rounding = data.draw(st.booleans())
        op = _conv_op(case, w, (Shift(n, rounding), Clip(-50, None), AddConst(3)))
        v = wrap32(acc + (1 << (n - 1) if rounding else 0)) >> n
        expected = np.maximum(v, -50) + 3
    out, _, _ = compile_and_run([op], {"x": x}, config)
    np.testing.assert_array_equal(out["y"], sat8(expected))


@pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])
@FEW
@given(data=st.data())
def test_conv_residual_add(config, data):
    """conv + bias + REQUANT + residual tensor + ReLU clamp (a ResNet block's tail)."""
    case = data.draw(conv_case(config))
    rng, x, w = _data(case)
    o = case["o"]
    bias = rng.integers(-3000, 3000, o)
    scale = rng.uniform(1e-4, 3e-3, o).astype(np.float32)
    oshape = _acc(case, x, w).shape
    r = rng.integers(-128, 128, oshape, dtype=np.int8)
    op = _conv_op(case, w, (Bias(bias), Requant(scale), Residual("r"), Clip(0, 127)))
    out, _, _ = compile_and_run([op], {"x": x, "r": r}, config)
    acc = _acc(case, x, w) + bias[None, :, None, None]
    expected = np.clip(rint_scale(acc, scale) + r, 0, 127)
    np.testing.assert_array_equal(out["y"], expected)


@pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])
@FEW
@given(n=st.integers(1, 5), k=st.integers(1, 70), o=st.integers(1, 40),
       seed=st.integers(0, 2**32 - 1), threads=st.sampled_from([1, 2]))
def test_dense(config, n, k, o, seed, threads):
    """Dense / matmul with bias and requantize, including one-row outputs (replica rows)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (n, k), dtype=np.int8)
    w = rng.integers(-128, 128, (o, k), dtype=np.int8)
    bias = rng.integers(-20000, 20000, o)
    scale = rng.uniform(1e-4, 4e-3, o).astype(np.float32)
    op = Dense("fc", "x", "y", w, epilogue=requantize(scale, 7, bias=bias))
    out, _, _ = compile_and_run([op], {"x": x}, config, threads=threads)
    acc = x.astype(np.int64) @ w.astype(np.int64).T + bias
    expected = ort_requant(acc, scale, 7, ndim=2)
    np.testing.assert_array_equal(out["y"][:, :, 0, 0], expected)


def test_conv_raw_accumulator_saturates_on_store():
    """No epilogue: the int32 accumulator is stored saturated to int8 (no silent truncation)."""
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, 20, 5, 5), dtype=np.int8)
    w = rng.integers(-128, 128, (18, 20, 3, 3), dtype=np.int8)
    out, _, _ = compile_and_run([Conv2d("c", "x", "y", w, padding=1)], {"x": x}, PYNQ)
    acc = conv(x, w, pads=(1, 1, 1, 1))
    np.testing.assert_array_equal(out["y"], sat8(acc))
    assert np.abs(acc).max() > 127  # the saturation is exercised


@pytest.mark.parametrize("shape, o, k, stride, pad", [
    ((1, 3, 23, 21), 8, 7, 2, 3),     # C1-like: 3 channels, 7x7 stride 2 (im2col packing)
    ((1, 1, 9, 9), 5, 3, 1, 1),
    ((2, 2, 8, 7), 4, (5, 1), (1, 2), (2, 0, 2, 0)),
])
def test_small_channel_convs_pack_kernel_positions(shape, o, k, stride, pad):
    """Few input channels: kernel positions move into the channel block (host-side packing of
    the input), cutting the GEMM operations; the result is unchanged."""
    rng = np.random.default_rng(sum(shape))
    x = rng.integers(-128, 128, shape, dtype=np.int8)
    kk = (k, k) if isinstance(k, int) else k
    w = rng.integers(-128, 128, (o, shape[1], *kk), dtype=np.int8)
    scale = rng.uniform(1e-4, 4e-3, o).astype(np.float32)
    op = Conv2d("c1", "x", "y", w, stride=stride, padding=pad, epilogue=requantize(scale))
    out, res, compiled = compile_and_run([op], {"x": x}, TINY)
    plain, res_plain, _ = compile_and_run([op], {"x": x}, TINY, pack_small_channels=False)
    ss = (stride, stride) if isinstance(stride, int) else stride
    pp = (pad,) * 4 if isinstance(pad, int) else pad
    expected = ort_requant(conv(x, w, ss, pp), scale)
    np.testing.assert_array_equal(out["y"], expected)
    np.testing.assert_array_equal(plain["y"], expected)
    packed = compiled.tensors[compiled.device_inputs[0]].layout.shape
    assert packed[1] > shape[1]                      # positions packed into channels
    assert res.stats.gemm_ops < res_plain.stats.gemm_ops


OTHER_CONFIGS = [PRESETS["zcu104"], TINY.replace(name="tiny-b2", batch=2),
                 TINY.replace(name="tiny-8x4", block_in=8, block_out=4),
                 TINY.replace(name="tiny-4x8", block_in=4, block_out=8, acc_depth=256,
                              out_depth=256)]


@pytest.mark.parametrize("config", OTHER_CONFIGS, ids=[c.name for c in OTHER_CONFIGS])
@pytest.mark.parametrize("shape, o, k, stride, pad, groups", [
    ((3, 10, 7, 6), 9, 3, 1, 1, 1), ((2, 6, 5, 5), 6, 3, 2, 1, 6), ((3, 40, 1, 1), 20, 1, 1, 0, 1)])
def test_conv_on_other_configs(config, shape, o, k, stride, pad, groups):
    """Any HwConfig: a 32x32 core, two images per entry, input and output blocks that differ."""
    rng = np.random.default_rng(o * k)
    x = rng.integers(-128, 128, shape, dtype=np.int8)
    w = rng.integers(-128, 128, (o, shape[1] // groups, k, k), dtype=np.int8)
    scale = rng.uniform(1e-4, 3e-3, o).astype(np.float32)
    bias = rng.integers(-3000, 3000, o)
    op = Conv2d("c", "x", "y", w, stride=stride, padding=pad, groups=groups,
                epilogue=requantize(scale, 2, relu=True, bias=bias))
    out, _, _ = compile_and_run([op], {"x": x}, config)
    acc = conv(x, w, (stride,) * 2, (pad,) * 4, (1, 1), groups) + bias[None, :, None, None]
    np.testing.assert_array_equal(out["y"], ort_requant(acc, scale, 2, True))
