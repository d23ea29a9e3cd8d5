"""Magnitude pruning of one weight: the patterns of tessera.sparsity hold afterwards,
exactly the smallest units go, and the kept weights are untouched."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.compiler import zoo
from tessera.compress.layers import find_layers, weight_arrays
from tessera.compress.patterns import Pattern, prune_blocks, prune_nm
from tessera.sparsity import NM_PATTERNS, is_nm_sparse, nm_pattern, nonzero_blocks, weight_blocks

from .models import dense_chain

shapes = st.tuples(st.integers(1, 40), st.integers(1, 40),
                   st.sampled_from([(), (1,), (3,), (3, 3), (1, 2)]))


def _weight(seed: int, o: int, i: int, taps: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((o, i, *taps)).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(shapes, st.sampled_from([(4, 4), (16, 16), (8, 4)]), st.floats(0, 0.999),
       st.integers(0, 2**31))
def test_block_pruning_zeroes_exactly_the_weakest_blocks(shape, block, sparsity, seed):
    o, i, taps = shape
    w = _weight(seed, o, i, taps)
    pruned = prune_blocks(w, sparsity, *block)
    norms = np.linalg.norm(weight_blocks(w, *block), axis=(-2, -1))
    kept = nonzero_blocks(pruned, *block)
    # exactly round(s x blocks) blocks gone (random weights have no all-zero block)
    assert kept.size - kept.sum() == round(sparsity * kept.size)
    # every dropped block is no stronger than every kept one
    if kept.any() and not kept.all():
        assert norms[~kept].max() <= norms[kept].min()
    # kept blocks are unchanged, dropped ones all zero
    assert np.array_equal(pruned[pruned != 0], w[pruned != 0])
    assert pruned.shape == w.shape and pruned.dtype == w.dtype


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(NM_PATTERNS), st.integers(1, 12), st.integers(1, 6),
       st.sampled_from([(), (3, 3), (2,)]), st.integers(0, 2**31))
def test_nm_pruning_keeps_the_n_largest_of_each_group(nm, o, groups, taps, seed):
    n, m = nm
    w = _weight(seed, o, groups * m, taps)
    pruned = prune_nm(w, n, m)
    assert is_nm_sparse(pruned, n, m, axis=1)
    assert nm_pattern(pruned) is not None
    # per group: exactly n non-zeros, the largest magnitudes of the group
    g_w = np.moveaxis(np.abs(w), 1, -1).reshape(-1, m)
    g_p = np.moveaxis(pruned, 1, -1).reshape(-1, m)
    assert np.all(np.count_nonzero(g_p, axis=1) == n)
    kept_min = np.where(g_p != 0, g_w, np.inf).min(axis=1)
    dropped_max = np.where(g_p == 0, g_w, -np.inf).max(axis=1)
    assert np.all(dropped_max <= kept_min)
    assert np.array_equal(pruned[pruned != 0], w[pruned != 0])


def test_nm_candidates_need_the_reduction_axis_to_divide():
    p = Pattern("2:4", nm=(2, 4))
    assert p.candidates(np.ones((8, 16, 3, 3))) == (0.0, 0.5)
    assert p.candidates(np.ones((8, 3, 3, 3))) == (0.0,)      # an RGB stem stays dense
    assert p.density(prune_nm(np.ones((8, 16)), 2, 4)) == 0.5
    assert p.density(np.ones((8, 16))) == 1.0


def test_dense_layouts_are_oriented_as_out_in():
    """MatMul and Gemm transB=0 hold (K, N); the pruner sees (N, K) and N:M groups run
    along K in the file."""
    model = dense_chain()
    layers = {layer.node: layer for layer in find_layers(model)}
    assert [(n, layer.transposed, layer.macs) for n, layer in layers.items()] == [
        ("mm", True, 2 * 32 * 16), ("gemm_kn", True, 2 * 24 * 32), ("gemm_nk", False, 2 * 8 * 24)]
    w = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)   # (K, N)
    mm = layers["mm"]
    assert mm.oriented(w).shape == (32, 16)
    stored = mm.stored(prune_nm(mm.oriented(w), 2, 4))
    assert is_nm_sparse(stored, 2, 4, axis=0) and not is_nm_sparse(stored, 2, 4, axis=1)


@pytest.mark.parametrize("sparsity", [0.0, 0.5])
def test_pattern_prune_at_zero_is_a_copy(sparsity):
    w = _weight(0, 8, 8, ())
    out = Pattern("block", block=(4, 4)).prune(w, sparsity)
    assert out is not w
    assert np.array_equal(out, w) == (sparsity == 0)


def test_a_dense_layer_on_a_flattened_image_is_pruned_as_the_compiler_runs_it():
    """LeNet's first fc layer reads Flatten(16 x 5 x 5): the compiler runs it as a
    convolution over the image, so its blocks run along channels per pixel; pruned that
    way, the compiled layer has the zero blocks the pruner made."""
    import warnings

    import tessera
    from tessera.compress import prune

    model = zoo.lenet()
    fc = next(layer for layer in find_layers(model) if layer.op == "Gemm")
    assert fc.image is not None and len(fc.image) == 3
    w = weight_arrays(model, [fc])[fc.weight]
    assert fc.oriented(w).shape[1:] == fc.image
    assert np.array_equal(fc.stored(fc.oriented(w)), w)
    calibration = zoo.calibration_data(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pruned = prune(model, sparsity=0.75, strategy="uniform", calibration=calibration)
    compiled = tessera.compile(pruned.model, "pynq", calibration=calibration).compiled
    conv_of_fc = [p for p in compiled.placements if p.op == "QConv" and p.density is not None]
    assert len(conv_of_fc) >= 3
    assert max(p.density for p in conv_of_fc) <= 0.3

