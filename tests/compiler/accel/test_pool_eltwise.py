"""Pooling and elementwise operators on the tensor ALU: random shapes, bit-exact against numpy."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tessera.compiler import (AddConst, Bias, Clip, CompileError, Conv2d, Eltwise, Pool2d, Requant,
                              Shift, clip)

from tests.compiler.helpers import FEW, PYNQ, TINY, compile_and_run
from tests.compiler.reference import pool, rint_scale, sat8, wrap32

CONFIGS = pytest.mark.parametrize("config", [TINY, PYNQ], ids=["tiny", "pynq"])


@CONFIGS
@FEW
@given(data=st.data())
def test_pooling(config, data):
    kind = data.draw(st.sampled_from(["max", "avg"]))
    kh, kw = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    sy, sx = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    pads = tuple(data.draw(st.integers(0, k - 1)) for k in (kh, kw, kh, kw))
    n = data.draw(st.integers(1, 2))
    c = data.draw(st.integers(1, 40 if config is PYNQ else 9))
    h = data.draw(st.integers(max(1, kh - pads[0] - pads[2]), 10))
    w = data.draw(st.integers(max(1, kw - pads[1] - pads[3]), 10))
    cip = data.draw(st.booleans())
    scale = data.draw(st.sampled_from([1.0, 0.37, 1.9]))
    zp = data.draw(st.sampled_from([0, -3]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
    ep = (AddConst(zp),) if kind == "avg" and zp else ()
    op = Pool2d("pool", "x", "y", kind, (kh, kw), (sy, sx), pads, count_include_pad=cip,
                scale=scale, epilogue=ep)
    out, _, _ = compile_and_run([op], {"x": x}, config,
                                threads=data.draw(st.sampled_from([1, 2])))
    expected = pool(x, kind, (kh, kw), (sy, sx), pads, cip, scale)
    np.testing.assert_array_equal(out["y"], sat8(expected + (zp if kind == "avg" else 0)))


OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "min": np.minimum,
       "max": np.maximum}


@CONFIGS
@FEW
@given(data=st.data())
def test_eltwise_with_broadcast(config, data):
    name = data.draw(st.sampled_from(sorted(OPS)))
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 40 if config is PYNQ else 9))
    h, w = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    a = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
    kind = data.draw(st.sampled_from(["tensor", "bcast", "scalar", "big scalar", "channel",
                                      "full"]))
    inputs = {"a": a}
    if kind == "tensor":
        b = rng.integers(-128, 128, a.shape, dtype=np.int8)
        inputs["b"], bop = b, "b"
    elif kind == "bcast":
        shape = tuple(s if data.draw(st.booleans()) else 1 for s in (n, 1, h, w))
        shape = (shape[0], c, shape[2], shape[3])
        b = rng.integers(-128, 128, shape, dtype=np.int8)
        inputs["b"], bop = b, "b"
    elif kind == "scalar":
        b = bop = int(rng.integers(-100, 100))
    elif kind == "big scalar":
        b = bop = int(rng.integers(40000, 100000))
    elif kind == "channel":
        b = bop = rng.integers(-1000, 1000, (1, c, 1, 1))
    else:
        b = bop = rng.integers(-1000, 1000, (n, c, h, w))
    shift = data.draw(st.integers(0, 6))
    op = Eltwise("e", name, "a", "y", bop, epilogue=(Shift(shift, rounding=False), Clip(-60, 90)))
    out, _, _ = compile_and_run([op], inputs, config)
    v = OPS[name](a.astype(np.int64), np.asarray(b, dtype=np.int64))
    expected = np.clip(wrap32(v) >> shift, -60, 90)
    np.testing.assert_array_equal(out["y"], expected)


@CONFIGS
def test_elementwise_clip_and_requant_only(config):
    rng = np.random.default_rng(1)
    a = rng.integers(-128, 128, (1, 7, 5, 3), dtype=np.int8)
    out, _, _ = compile_and_run([clip("c", "a", "y", -5, 12)], {"a": a}, config)
    np.testing.assert_array_equal(out["y"], np.clip(a, -5, 12))
    scale = rng.uniform(0.5, 3, 7).astype(np.float32)
    op = Eltwise("r", "rescale", "a", "y", None, epilogue=(Requant(scale),))
    out, _, _ = compile_and_run([op], {"a": a}, config)
    np.testing.assert_array_equal(out["y"], sat8(rint_scale(a, scale)))


def test_tensor_broadcast_over_channels_is_refused():
    a = np.zeros((1, 8, 2, 2), np.int8)
    b = np.zeros((1, 1, 2, 2), np.int8)
    with pytest.raises(CompileError, match=r"eltwise 'e': b 'b' must have the 8 channels.*"
                                           r"pass a constant"):
        compile_and_run([Eltwise("e", "add", "a", "y", "b")], {"a": a, "b": b}, TINY)


@CONFIGS
@FEW
@given(data=st.data())
def test_sum_pool_equals_a_depthwise_convolution_of_ones(config, data):
    # The global average pool's two lowerings (tensor-ALU row adds, or a depthwise
    # convolution of ones when the plane does not fit) share the epilogue: the sums must
    # agree bit for bit, zero-point bias and requantization included.
    n = data.draw(st.integers(1, 2))
    c = data.draw(st.integers(1, 40 if config is PYNQ else 9))
    h, w = data.draw(st.integers(1, 7)), data.draw(st.integers(1, 7 if config is PYNQ else 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
    scale = np.float32(data.draw(st.sampled_from([0.37, 0.0123, 1.0 / (h * w)])))
    ep = (Bias(np.full(c, int(rng.integers(-128, 128)) * h * w, np.int64)), Requant(scale),
          AddConst(data.draw(st.integers(-20, 20))), Clip(-128, 127))
    pool = Pool2d("p", "x", "y", "sum", (h, w), epilogue=ep)
    conv = Conv2d("p", "x", "y", np.ones((c, 1, h, w), np.int8), groups=c, epilogue=ep)
    got, _, _ = compile_and_run([pool], {"x": x}, config)
    want, _, _ = compile_and_run([conv], {"x": x}, config)
    np.testing.assert_array_equal(got["y"], want["y"])
    acc = x.astype(np.int64).sum(axis=(2, 3), keepdims=True) + ep[0].values.reshape(1, c, 1, 1)
    expected = np.clip(rint_scale(acc, scale) + ep[2].value, -128, 127)
    np.testing.assert_array_equal(got["y"], expected)
