"""Packed layouts: round trips and the element order the DMA sees."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tessera.compiler import (ActLayout, pack_activation, pack_conv_weights, pack_weights,
                              unpack_activation, unpack_conv_weights, unpack_weights)
from tessera.config import PRESETS
from tessera.errors import CompileError

from tests.compiler.helpers import FEW

TINY_B2 = PRESETS["tiny"].replace(batch=2, name="tiny-b2")


@FEW
@given(st.integers(1, 5), st.integers(1, 11), st.integers(1, 4), st.integers(1, 4),
       st.sampled_from([PRESETS["tiny"], TINY_B2, PRESETS["pynq"]]), st.integers(0, 2**31))
def test_activation_round_trip_and_order(n, c, h, w, config, seed):
    x = np.random.default_rng(seed).integers(-128, 128, (n, c, h, w), dtype=np.int8)
    layout = ActLayout.of(x.shape, config)
    packed = pack_activation(x, layout)
    nn, cc = config.batch, config.block_in
    assert packed.shape == (-(-n // nn), -(-c // cc), h, w, nn, cc)
    np.testing.assert_array_equal(unpack_activation(packed, layout), x)
    flat = packed.reshape(-1, nn, cc)
    for (i, j, y, v) in [(0, 0, 0, 0), (n - 1, c - 1, h - 1, w - 1), (n // 2, c // 2, h // 2, 0)]:
        entry = layout.entry(i // nn, j // cc, y, v)
        assert flat[entry, i % nn, j % cc] == x[i, j, y, v]
    assert layout.entries == flat.shape[0]
    # Padded channels and images are zero.
    assert np.count_nonzero(packed) == np.count_nonzero(x)


@FEW
@given(st.integers(1, 3), st.integers(1, 40), st.integers(1, 4), st.integers(1, 5),
       st.sampled_from([(8, 4), (16, 4), (16, 8), (4, 4)]), st.integers(0, 2**31))
def test_a_sub_block_view_addresses_the_same_values(n, c, h, w, blocks, seed):
    """A view in sub-blocks of ``unit`` channels: element ``entry(nb, cb, y, x)`` (of ``unit``
    values) holds channels ``cb*unit..`` of pixel (y, x), a pixel's next sub-block is
    ``pixel_stride`` elements on, and sizes stay those of the stored blocks."""
    block, unit = blocks
    x = np.random.default_rng(seed).integers(-128, 128, (n, c, h, w), dtype=np.int8)
    layout = ActLayout.of(x.shape, PRESETS["tiny"], block)
    view = layout.view(unit)
    flat = pack_activation(x, layout).reshape(-1, unit)
    assert view.pixel_stride == block // unit and view.row_stride == w * block // unit
    assert view.cb == -(-c // unit) and (view.entries, view.values) == (layout.entries,
                                                                          layout.values)
    for i, j, y, v in [(0, 0, 0, 0), (n - 1, c - 1, h - 1, w - 1), (n // 2, c // 2, h // 2, 0)]:
        e = view.entry(i, j // unit, y, v)
        assert flat[e, j % unit] == x[i, j, y, v]
        if v + 1 < w:
            assert view.entry(i, j // unit, y, v + 1) == e + view.pixel_stride


@pytest.mark.parametrize("layout, unit, why", [
    (ActLayout((1, 24, 2, 2), 1, 12), 8, "8 does not divide 12"),
    (ActLayout((2, 16, 2, 2), 2, 16), 8, "with 2 images per entry")])
def test_a_view_needs_whole_sub_blocks(layout, unit, why):
    """A sub-block must divide the block, and be contiguous: not across the images of an
    entry."""
    with pytest.raises(CompileError, match=why):
        layout.view(unit)


@FEW
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3),
       st.integers(0, 2**31))
def test_grouped_weights_round_trip(g_in, g_out, groups, k, seed):
    config = PRESETS["tiny"]
    c, o = g_in * groups, g_out * groups
    w = np.random.default_rng(seed).integers(-128, 128, (o, g_in, k, k), dtype=np.int8)
    packed, gb = pack_conv_weights(w, groups, config)
    np.testing.assert_array_equal(unpack_conv_weights(packed, gb, o, c, groups), w)
    # Every weight of channel oc, input ic sits at block (oc // bo, ic // bi - cb_lo).
    bi, bo = config.block_in, config.block_out
    for oc in range(o):
        for kk in range(g_in):
            ic = (oc // g_out) * g_in + kk
            ob, cb = oc // bo, ic // bi
            np.testing.assert_array_equal(packed[ob, cb - gb.cb_lo[ob], :, :, oc % bo, ic % bi],
                                          w[oc, kk])


def test_dense_weight_layout_is_o_i_blocks():
    config = PRESETS["tiny"]
    w = np.arange(8 * 12).reshape(8, 12).astype(np.int8)
    packed = pack_weights(w, config)
    assert packed.shape == (2, 3, 1, 1, 4, 4)
    np.testing.assert_array_equal(packed[1, 2, 0, 0], w[4:8, 8:12])
    np.testing.assert_array_equal(unpack_weights(packed, 8, 12)[:, :, 0, 0], w)
