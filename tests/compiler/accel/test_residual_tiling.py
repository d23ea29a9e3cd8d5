"""Tiling of a convolution with a residual add: the cost model follows the residual load
(a compute-module LOAD that holds both units) where the emitter puts it, so the plan search
ranks such layers by their real cycles, at batch 1 and batch 2."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler import (AddConst, Bias, Clip, Conv2d, ConvGeom, ConvPlan, Requant,
                              Residual, Shift, compile_ops, conv_roofline,
                              estimate_conv_cycles, plan_epilogue)
from tessera.compiler.accel.ops import Mul
from tessera.compiler.accel.conv import acc_bound
from tessera.compiler.accel.convcost import ConvCostModel, interleave
from tessera.compiler.accel.convsteps import step_terms
from tessera.compiler.accel.convplan import schedule
from tessera.compiler.golden.operators import run_reference
from tessera.isa import Gemm

from tests.compiler.helpers import PYNQ


def _resnet_tail(n: int, c: int = 64, hw: int = 28, seed: int = 0):
    """A 3x3 convolution with ResNet-18's quantized block tail (onnxruntime's QLinearAdd
    folded into the epilogue: requantize, clamp, zero point, scale, the residual scaled,
    rounding constant, shift, clamp), its input, residual and epilogue plan on pynq."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-64, 64, (c, c, 3, 3), dtype=np.int8)
    epilogue = (Bias(rng.integers(-100000, 100000, c)),
                Requant(rng.uniform(6e-4, 1.2e-3, c).astype(np.float32)),
                Clip(-129, 126), AddConst(1), Mul(6037280), Residual("r", 3005261),
                AddConst(-156137620), Shift(22), Clip(-128, 127))
    op = Conv2d("c", "x", "y", w, padding=1, epilogue=epilogue)
    x = rng.integers(-128, 128, (n, c, hw, hw), dtype=np.int8)
    r = rng.integers(-128, 128, (n, c, hw, hw), dtype=np.int8)
    ep = plan_epilogue(op.epilogue, channels=c, config=PYNQ, acc_range=acc_bound(w, PYNQ),
                       init_bias=True, where="c")
    return op, {"x": x, "r": r}, ConvGeom.of(op, x.shape, PYNQ), ep


def test_interleave_lets_a_load_holding_both_units_delay_the_gemms():
    gemm, side = [100, 100, 100], [30, 80, 50, 50]
    # Without it the load is thought to run beside the first GEMM; it really starts once
    # that GEMM ends (cycle 180 when done), so the next ALU op goes before the next GEMM.
    assert interleave(gemm, side) == [(0, 0), (1, 0), (1, 1), (0, 1), (1, 2), (1, 3), (0, 2)]
    assert interleave(gemm, side, [False, True, False, False]) == \
        [(0, 0), (1, 0), (1, 1), (1, 2), (0, 1), (1, 3), (0, 2)]


@pytest.mark.parametrize("plan", [ConvPlan(1, 1, 7, 28, 2, 2, "channel", ramp=1),
                                  ConvPlan(1, 1, 4, 28, 1, 2, "spatial")],
                         ids=["two-steps-per-tile", "spatial"])
def test_cost_model_tracks_a_residual_epilogue(plan):
    op, feeds, g, ep = _resnet_tail(2)
    compiled = compile_ops([op], {k: v.shape for k, v in feeds.items()}, PYNQ,
                           plans={"c": plan})
    out, result = compiled.run(feeds)
    np.testing.assert_array_equal(out["y"], run_reference([op], feeds, 8)["y"])
    est = estimate_conv_cycles(g, compiled.plans["c"], PYNQ, ep)
    assert abs(est - result.stats.cycles) / result.stats.cycles < 0.02, (est, result.stats)


def test_batch_two_residual_layer_stays_near_its_bound():
    """The search's own choice at batch 2: the residual load costs about two cycles per
    accumulator row on top of the GEMMs (a 3x3 conv of 64 channels: 36 GEMM ops per row),
    nothing more."""
    op, feeds, _, _ = _resnet_tail(2)
    compiled = compile_ops([op], {k: v.shape for k, v in feeds.items()}, PYNQ)
    out, result = compiled.run(feeds)
    np.testing.assert_array_equal(out["y"], run_reference([op], feeds, 8)["y"])
    bound = conv_roofline(op, feeds["x"].shape, PYNQ).bound
    assert result.stats.cycles <= 1.10 * bound, (result.stats.cycles, bound,
                                                 compiled.plans["c"])


@pytest.mark.parametrize("plan", [ConvPlan(1, 1, 7, 28, 2, 2, "channel", ramp=2),
                                  ConvPlan(1, 2, 4, 14, 2, 2, "spatial", ramp=1)],
                         ids=["ramp2", "two-blocks"])
def test_cost_model_counts_the_uops_of_every_gemm_kernel(plan):
    """The uop LOAD that starts an operator holds both compute units for a cycle per uop:
    the cost model sizes each step's GEMM kernel by the nest the tensorizer maps, so plans
    with many kernels (slot combinations, tile shapes) pay for them."""
    op, feeds, g, ep = _resnet_tail(1)
    compiled = compile_ops([op], {k: v.shape for k, v in feeds.items()}, PYNQ,
                           plans={"c": plan})
    used = compiled.plans["c"]
    model = ConvCostModel(g, PYNQ, ep)
    expected = []
    for s in schedule(g, used):
        terms = step_terms(g, s.tile, s.j0, s.j1, s.intile)
        expected.append(model.kernel_uops(s.tile, s.intile, s.j1 - s.j0, terms))
    gemms = [i for i in compiled.program.instructions if isinstance(i, Gemm)]
    assert [i.uop_end - i.uop_begin for i in gemms] == expected
    assert len(set(expected)) > 1       # tile shapes whose kernels differ
