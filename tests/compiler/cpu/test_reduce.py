"""Reductions (tessera.compiler.cpu.reduce) against numpy."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.compiler.cpu.kernel import TensorSpec
from tessera.compiler.cpu.reduce import (reduce_max, reduce_mean, reduce_min, reduce_sum,
                                         reduction)
from tessera.errors import CpuKernelError
from tessera.runtime.cpu import load_kernel

RNG = np.random.default_rng(7)


def run(kernel, x):
    (out,) = load_kernel(kernel)(x)
    return out


def numpy_reduce(op, x, axes, keepdims):
    ax = None if not axes else tuple(axes)
    if op == "sum":
        return np.sum(x, axis=ax, keepdims=keepdims,
                      dtype=np.float32 if x.dtype == np.float32 else np.int32)
    with np.errstate(all="ignore"):
        return getattr(np, op)(x, axis=ax, keepdims=keepdims)


def check(op, x, axes, keepdims=True):
    got = run(reduction(op, TensorSpec(x.shape, x.dtype.name), axes, keepdims), x)
    want = numpy_reduce(op, x, axes, keepdims)
    assert got.shape == want.shape and got.dtype == want.dtype
    if op in ("sum", "mean") and x.dtype == np.float32:
        # Reassociated float sums: compare against the float64 sum's magnitude.
        scale = np.sum(np.abs(x.astype(np.float64)), axis=None if not axes else tuple(axes),
                       keepdims=keepdims)
        if op == "mean":
            scale = scale / max(1, x.size // max(1, want.size))
        assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-30)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, axes", [
    ((1, 16, 28, 28), (2, 3)),      # global pooling: innermost axes reduced
    ((1, 197, 64), (1,)),           # outer axis reduced, contiguous lanes kept
    ((1, 197, 64), (-1,)),
    ((3, 4, 5, 6), (0, 2)),         # alternating kept / reduced groups
    ((3, 4, 5, 6), (1, 3)),
    ((10_000,), None),              # everything, one long row
    ((7, 1, 3), (1,)),              # size-1 axis
    ((), None),                     # scalar
])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_float_reductions_match_numpy(shape, axes, op):
    x = RNG.standard_normal(shape).astype(np.float32)
    check(op, x, axes)
    check(op, x, axes, keepdims=False)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32"])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_integer_reductions(dtype, op):
    info = np.iinfo(dtype)
    x = RNG.integers(max(info.min, -2**20), min(info.max, 2**20), (4, 30, 50), dtype=dtype)
    for axes in [(1,), (0, 2), None]:
        check(op, x, axes)


def test_int8_sum_accumulates_in_int32():
    x = np.full((3, 1000), 127, np.int8)
    got = run(reduce_sum(TensorSpec(x.shape, "int8"), axes=[1]), x)
    np.testing.assert_array_equal(got, np.full((3, 1), 127_000, np.int32))


def test_int32_sum_wraps_like_numpy():
    x = np.array([2**31 - 1, 1, 5], np.int32)
    got = run(reduce_sum(TensorSpec(x.shape, "int32")), x)
    np.testing.assert_array_equal(got, np.array([np.int32(-(2**31)) + 5], np.int32))


def test_long_float_sum_is_accurate():
    x = (RNG.random(1_000_003) + 1.0).astype(np.float32)
    got = run(reduce_sum(TensorSpec(x.shape, "float32"), keepdims=False), x)
    assert abs(float(got) - x.astype(np.float64).sum()) <= 2e-6 * x.size * 1.5


def test_max_and_min_propagate_nan():
    x = RNG.standard_normal((4, 50)).astype(np.float32)
    x[1, 17] = np.nan
    x[3, 0] = np.inf
    for op in ("max", "min"):
        for axes in [(1,), (0,)]:
            check(op, x, axes)


def test_empty_reductions():
    x = np.zeros((2, 0, 3), np.float32)
    np.testing.assert_array_equal(run(reduce_sum(TensorSpec(x.shape, "float32"), [1]), x),
                                  np.zeros((2, 1, 3), np.float32))
    assert np.isnan(run(reduce_mean(TensorSpec(x.shape, "float32"), [1]), x)).all()
    with pytest.raises(CpuKernelError, match="no identity"):
        reduce_max(TensorSpec(x.shape, "float32"), [1])
    # An empty output needs no identity.
    empty = reduce_min(TensorSpec(x.shape, "float32"), [0])
    assert empty.outputs[0].shape == (1, 0, 3)


def test_invalid_reductions_raise():
    spec = TensorSpec((2, 3), "int8")
    with pytest.raises(CpuKernelError, match="mean needs float32"):
        reduce_mean(spec)
    with pytest.raises(CpuKernelError, match="out of range"):
        reduce_sum(spec, [2])
    with pytest.raises(CpuKernelError, match="not one of"):
        reduction("median", spec)


def test_kernel_names_its_axes():
    k = reduce_mean(TensorSpec((1, 8, 4, 4), "float32"), [-1, 2], keepdims=False)
    assert k.name == "reduce_mean(axes=[2, 3], keepdims=0)"
    assert k.outputs == (TensorSpec((1, 8), "float32"),)


@st.composite
def shapes_and_axes(draw):
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=4)))
    axes = draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape)))
    return shape, axes


@settings(max_examples=30, deadline=None)
@given(sa=shapes_and_axes(), op=st.sampled_from(["sum", "mean", "max", "min"]),
       dtype=st.sampled_from(["float32", "int8"]), keepdims=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_random_reductions_match_numpy(sa, op, dtype, keepdims, seed):
    shape, axes = sa
    if op == "mean" and dtype == "int8":
        dtype = "float32"
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 50).astype(dtype)
    check(op, x, sorted({a % len(shape) for a in axes}), keepdims)
