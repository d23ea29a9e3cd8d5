"""Tiling: analytic legality, the cost model against the simulator, errors that explain."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler import (CompileError, Conv2d, ConvGeom, ConvPlan, Pool2d,
                              compile_ops, estimate_conv_cycles, plan_conv_tiles,
                              plan_epilogue, requantize)
from tessera.compiler.accel.conv import acc_bound
from tessera.compiler.accel.convplan import conv_plan_fits
from tessera.config import PRESETS

from tests.compiler.helpers import PYNQ, TINY


def _geom(shape, o, k, stride=1, pad=1, config=PYNQ):
    w = np.random.default_rng(0).integers(-128, 128, (o, shape[1], k, k), dtype=np.int8)
    op = Conv2d("c", "x", "y", w, stride=stride, padding=pad,
                epilogue=requantize(np.full(o, 1e-3, np.float32), relu=True,
                                    bias=np.arange(o)))
    g = ConvGeom.of(op, shape, config)
    ep = plan_epilogue(op.epilogue, channels=o, config=config, acc_range=acc_bound(w, config),
                       init_bias=True, where="c")
    return op, g, ep


@pytest.mark.parametrize("shape, o, k, stride", [((1, 64, 56, 56), 64, 3, 1),
                                                  ((1, 128, 28, 28), 256, 1, 2),
                                                  ((1, 512, 7, 7), 512, 3, 1)])
def test_chosen_tilings_fit_every_buffer(shape, o, k, stride):
    _, g, ep = _geom(shape, o, k, stride, pad=k // 2)
    for threads in (1, 2):
        for plan in plan_conv_tiles(g, PYNQ, ep, threads, top=5):
            budget = conv_plan_fits(g, plan, PYNQ, ep)
            assert not isinstance(budget, str)
            assert budget.inp <= PYNQ.inp_depth and budget.wgt <= PYNQ.wgt_depth
            assert budget.acc <= PYNQ.acc_depth and plan.threads == threads


def test_cost_model_tracks_the_simulator():
    op, g, ep = _geom((1, 32, 20, 20), 48, 3)
    x = np.random.default_rng(1).integers(-128, 128, (1, 32, 20, 20), dtype=np.int8)
    # pipelined (epilogue beside the GEMMs), two slots without (its tiles are too large for
    # four accumulator regions), one thread
    for plan, pipelined in [(ConvPlan(1, 3, 5, 20, 2, 2), True),
                            (ConvPlan(1, 1, 5, 20, 1, 2, ramp=1), True),
                            (ConvPlan(1, 3, 10, 20, 2, 2), False),
                            (ConvPlan(1, 3, 20, 20, 1, 1), False)]:
        compiled = compile_ops([op], {"x": x.shape}, PYNQ, plans={"c": plan})
        used = compiled.plans["c"]
        assert used.pipelined == pipelined
        _, result = compiled.run({"x": x})
        est = estimate_conv_cycles(g, used, PYNQ, ep)
        assert abs(est - result.stats.cycles) / result.stats.cycles < 0.05, (used, est)


def test_two_virtual_threads_hide_latency():
    op, _, _ = _geom((1, 64, 28, 28), 64, 3)
    x = np.random.default_rng(2).integers(-128, 128, (1, 64, 28, 28), dtype=np.int8)
    runs = {}
    for threads in (1, 2):
        compiled = compile_ops([op], {"x": x.shape}, PYNQ, threads=threads)
        out, result = compiled.run({"x": x})
        runs[threads] = (out["y"], result.stats)
    np.testing.assert_array_equal(runs[1][0], runs[2][0])
    assert runs[2][1].cycles < 0.95 * runs[1][1].cycles
    assert runs[1][1].modules["compute"].wait_token > 3 * runs[2][1].modules["compute"].wait_token


def test_a_layer_too_big_for_the_buffers_is_explained():
    small = PRESETS["tiny"].replace(name="small", wgt_depth=16)
    w = np.ones((4, 4, 5, 5), np.int8)     # (all zeros would need no weight buffer at all)
    with pytest.raises(CompileError, match=r"conv2d 'big': no tiling fits config 'small'.*"
                                           r"weight tile of 1 output block\(s\) x 1 input "
                                           r"block\(s\) x 25 taps needs 25 entries.*weight "
                                           r"buffer has 16"):
        compile_ops([Conv2d("big", "x", "y", w)], {"x": (1, 4, 8, 8)}, small,
                    pack_small_channels=False)


def test_forced_tiling_that_does_not_fit_is_explained():
    w = np.zeros((16, 16, 3, 3), np.int8)
    with pytest.raises(CompileError, match=r"conv2d 'c': the tiling 16ch x 40x40px tiles.* does "
                                           r"not fit: the input tile needs 1764 entries per "
                                           r"thread \(3528 with 2 thread\(s\)\) but the input "
                                           r"buffer has 2048"):
        compile_ops([Conv2d("c", "x", "y", w, padding=1)], {"x": (1, 16, 40, 40)}, PYNQ,
                    plans={"c": ConvPlan(1, 1, 40, 40, 1, 2)})


def test_padding_beyond_the_dma_is_explained():
    w = np.zeros((4, 4, 3, 3), np.int8)
    with pytest.raises(CompileError, match="padding 16 exceeds the load DMA's 15"):
        compile_ops([Conv2d("c", "x", "y", w, padding=16)], {"x": (1, 4, 4, 4)}, TINY,
                    pack_small_channels=False)


def test_pool_that_cannot_fit_is_explained():
    small = PRESETS["tiny"].replace(name="small", acc_depth=32, out_depth=32)
    with pytest.raises(CompileError, match=r"pool 'p': even a one-pixel tile needs 26 "
                                           r"accumulator rows per thread"):
        compile_ops([Pool2d("p", "x", "y", "max", 5, 1)], {"x": (1, 4, 9, 9)}, small,
                    threads=2)
