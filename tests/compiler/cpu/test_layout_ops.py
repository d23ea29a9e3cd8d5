"""Pad, Transpose, Concat (tessera.compiler.cpu.layout_ops) against numpy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.compiler.cpu.kernel import TensorSpec
from tessera.compiler.cpu.layout_ops import build_concat, build_pad, build_transpose
from tessera.errors import CpuKernelError
from tessera.runtime.cpu import load_kernel

RNG = np.random.default_rng(11)
DTYPES = ["int8", "uint8", "int32", "float32"]


def data(shape, dtype):
    if dtype == "float32":
        return RNG.standard_normal(shape).astype(np.float32)
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    return RNG.integers(lo, hi, shape).astype(dtype)


def spec(a: np.ndarray) -> TensorSpec:
    return TensorSpec(a.shape, a.dtype.name)


def run(kernel, *arrays):
    (out,) = load_kernel(kernel)(*arrays)
    return out


SMALL_SHAPES = st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple)


# --- Transpose ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("shape, perm", [
    ((1, 64, 56, 56), (0, 2, 3, 1)),     # NCHW -> NHWC: full tiles and cache blocks
    ((1, 56, 56, 64), (0, 3, 1, 2)),     # NHWC -> NCHW
    ((2, 37, 19, 23), (0, 2, 3, 1)),     # ragged tiles in both directions
    ((130, 70), (1, 0)),                 # 2-D, blocks with a shorter last block
    ((3, 5, 7, 11), (3, 1, 0, 2)),       # general 4-D permutation
    ((4, 33, 3), (2, 0, 1)),             # small last axis
])
def test_transpose_matches_numpy(shape, perm, dtype):
    x = data(shape, dtype)
    np.testing.assert_array_equal(run(build_transpose(spec(x), perm), x), x.transpose(perm))


@settings(max_examples=25, deadline=None)
@given(shape=SMALL_SHAPES, dtype=st.sampled_from(DTYPES), data_=st.data())
def test_transpose_any_permutation(shape, dtype, data_):
    perm = data_.draw(st.permutations(range(len(shape))))
    x = data(shape, dtype)
    np.testing.assert_array_equal(run(build_transpose(spec(x), perm), x), x.transpose(perm))


def test_transpose_default_reverses_axes():
    x = data((2, 3, 4), "int32")
    np.testing.assert_array_equal(run(build_transpose(spec(x)), x), x.T)


@pytest.mark.parametrize("perm", [(0, 0, 1), (0, 1, 3), (1, 0), (0, 1, 2, 3)])
def test_transpose_rejects_non_permutation(perm):
    with pytest.raises(CpuKernelError, match="Transpose: perm"):
        build_transpose(TensorSpec((2, 3, 4), "float32"), perm)


# --- Pad ---------------------------------------------------------------------------

def numpy_pad(x, pads, mode, value):
    rank = x.ndim
    width = list(zip(pads[:rank], pads[rank:]))
    if mode == "constant":
        return np.pad(x, width, constant_values=np.array(value).astype(x.dtype))
    return np.pad(x, width, mode=mode)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, pads", [
    ((1, 64, 56, 56), [0, 0, 1, 1, 0, 0, 1, 1]),     # the usual spatial pad
    ((1, 3, 5, 7), [0, 2, 0, 3, 0, 1, 4, 0]),        # asymmetric, channels too
    ((2, 5, 6, 3), [0, 1, 2, 0, 0, 1, 2, 0]),        # NHWC: unpadded C folds into W
    ((4, 6), [3, 0, 0, 5]),
])
def test_pad_constant_matches_numpy(shape, pads, dtype):
    x = data(shape, dtype)
    value = -3 if dtype != "uint8" else 7
    got = run(build_pad(spec(x), pads, "constant", value), x)
    np.testing.assert_array_equal(got, numpy_pad(x, pads, "constant", value))


@settings(max_examples=25, deadline=None)
@given(shape=SMALL_SHAPES, dtype=st.sampled_from(DTYPES),
       mode=st.sampled_from(["constant", "edge", "reflect"]), data_=st.data())
def test_pad_random(shape, dtype, mode, data_):
    limit = [n - 1 if mode == "reflect" else 4 for n in shape]
    begins = [data_.draw(st.integers(0, lim)) for lim in limit]
    ends = [data_.draw(st.integers(0, lim)) for lim in limit]
    x = data(shape, dtype)
    got = run(build_pad(spec(x), begins + ends, mode, 1.5 if dtype == "float32" else 5), x)
    np.testing.assert_array_equal(got, numpy_pad(x, begins + ends, mode,
                                                 1.5 if dtype == "float32" else 5))


@pytest.mark.parametrize("pads, mode, match", [
    ([0, -1, 0, 0], "constant", r"Pad: pads for axis 1 \(-1, 0\) are negative"),
    ([0, 0, 1], "constant", "Pad: pads needs 4 values"),
    ([0, 3, 0, 0], "reflect", "Pad: reflect pads"),
    ([0, 0, 0, 0], "wrap", "Pad: mode 'wrap'"),
])
def test_pad_rejects_bad_parameters(pads, mode, match):
    with pytest.raises(CpuKernelError, match=match):
        build_pad(TensorSpec((2, 3), "float32"), pads, mode)


# --- Concat ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("shapes, axis", [
    ([(1, 64, 56, 56)] * 2, 1),                     # channels of NCHW: two big copies
    ([(1, 56, 56, 64), (1, 56, 56, 32)], -1),       # channels of NHWC: a copy per pixel
    ([(2, 3, 4), (2, 1, 4), (2, 5, 4)], 1),
    ([(3, 2), (4, 2), (1, 2), (2, 2)], 0),
    ([(2, 0, 3), (2, 4, 3)], 1),                    # an empty input
])
def test_concat_matches_numpy(shapes, axis, dtype):
    xs = [data(s, dtype) for s in shapes]
    got = run(build_concat([spec(x) for x in xs], axis), *xs)
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=axis))


@settings(max_examples=20, deadline=None)
@given(shape=SMALL_SHAPES, n=st.integers(1, 4), dtype=st.sampled_from(DTYPES),
       data_=st.data())
def test_concat_random(shape, n, dtype, data_):
    axis = data_.draw(st.integers(-len(shape), len(shape) - 1))
    shapes = []
    for _ in range(n):
        s = list(shape)
        s[axis] = data_.draw(st.integers(0, 4))
        shapes.append(tuple(s))
    xs = [data(s, dtype) for s in shapes]
    got = run(build_concat([spec(x) for x in xs], axis), *xs)
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=axis))


@pytest.mark.parametrize("specs, axis, match", [
    ([TensorSpec((2, 3), "int8"), TensorSpec((3, 3), "int8")], 1, "Concat: input 1"),
    ([TensorSpec((2, 3), "int8"), TensorSpec((2, 3), "float32")], 0, "Concat: input 1"),
    ([TensorSpec((2, 3), "int8"), TensorSpec((2, 3, 1), "int8")], 0, "Concat: input 1"),
    ([TensorSpec((2, 3), "int8")], 2, "Concat: axis 2 is out of range"),
    ([], 0, "Concat: needs at least one input"),
])
def test_concat_rejects_mismatched_inputs(specs, axis, match):
    with pytest.raises(CpuKernelError, match=match):
        build_concat(specs, axis)


def test_output_specs():
    k = build_pad(TensorSpec((1, 2, 3, 4), "int8"), [0, 0, 1, 2, 0, 0, 3, 4])
    assert k.outputs == (TensorSpec((1, 2, 7, 10), "int8"),)
    k = build_transpose(TensorSpec((1, 2, 3, 4), "float32"), (0, 2, 3, 1))
    assert k.outputs == (TensorSpec((1, 3, 4, 2), "float32"),)
    k = build_concat([TensorSpec((1, 2, 3), "int32")] * 3, 1)
    assert k.outputs == (TensorSpec((1, 6, 3), "int32"),)


def test_transpose_simplification_keeps_every_rank_correct():
    # Size-1 axes and axes that stay adjacent are merged before code generation.
    x = data((1, 2, 1, 3, 4), "int8")
    for perm in itertools.permutations(range(5)):
        if perm[0] != 0:
            continue
        np.testing.assert_array_equal(run(build_transpose(spec(x), perm), x),
                                      x.transpose(perm))
