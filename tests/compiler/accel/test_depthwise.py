"""Depthwise floors (tessera.compiler.accel.depthwise) against today's lowering on the
simulator and against figures worked out by hand for MobileNet-v1's shapes on ``pynq``."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tessera.compiler import Conv2d, requantize
from tessera.compiler.accel.depthwise import (depthwise_floors, is_depthwise,
                                              split_cycles_per_block, tap_alu_cycles)
from tessera.compiler.golden.operators import run_reference
from tessera.errors import CompileError
from tessera.isa import Alu, Gemm

from tests.compiler.helpers import PYNQ, compile_and_run


def _dw(channels: int, stride: int = 1, seed: int = 0) -> Conv2d:
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (channels, 1, 3, 3), dtype=np.int8)
    scale = rng.uniform(0.5, 1.5, channels).astype(np.float32) / 4096
    return Conv2d("dw", "x", "y", w, stride=stride, padding=1, groups=channels,
                  epilogue=requantize(scale, relu=True, bias=rng.integers(-500, 500, channels)))


def test_is_depthwise_only_for_one_channel_per_group():
    assert is_depthwise(_dw(32))
    w = np.ones((32, 2, 3, 3), np.int8)
    assert not is_depthwise(Conv2d("g", "x", "y", w, groups=32))      # 2 inputs per group
    assert not is_depthwise(Conv2d("c", "x", "y", np.ones((8, 8, 3, 3), np.int8)))
    with pytest.raises(CompileError, match="not a depthwise"):
        depthwise_floors(Conv2d("c", "x", "y", np.ones((8, 8, 1, 1), np.int8)),
                         (1, 8, 4, 4), PYNQ, 0.0)


def test_diagonal_floor_is_what_todays_lowering_does():
    # 32 channels (2 blocks) of 28x28: 1,568 pixel blocks, 9 GEMM operations each, and the
    # simulated run within 15% of that floor; the epilogue takes the ALU 4 cycles a block
    # (MOV of the bias row 1, REQUANT with a per-channel scale row 2, CLIP immediate 1).
    op = _dw(32)
    x = np.random.default_rng(1).integers(-128, 128, (1, 32, 28, 28), dtype=np.int8)
    outputs, result, compiled = compile_and_run([op], {"x": x}, PYNQ)
    assert np.array_equal(outputs["y"], run_reference([op], {"x": x}, 8)["y"])
    insns = compiled.program.instructions
    gemm = sum(i.op_count for i in insns if isinstance(i, Gemm))
    floors = depthwise_floors(op, x.shape, PYNQ, 4.0)
    assert floors.pixel_blocks == 2 * 28 * 28
    assert gemm == 9 * floors.pixel_blocks == floors.gemm_diagonal
    assert sum(i.op_count for i in insns if isinstance(i, Alu)) >= 3 * floors.pixel_blocks
    assert floors.gemm_diagonal <= result.stats.cycles <= 1.15 * floors.gemm_diagonal


def test_mobilenet_stride1_floors_by_hand():
    # 512x14x14 on pynq: the input (100,352 B) and weights (4,608 B) through the load
    # port's 8 B/cycle bound it: 13,120 cycles. Diagonal: 32 blocks x 196 pixels x 9.
    op = _dw(512)
    f = depthwise_floors(op, (1, 512, 14, 14), PYNQ, 4.0)
    assert f.roofline.bound == (100_352 + 4_608) / 8
    assert f.gemm_diagonal == 32 * 196 * 9
    # (b) a tap on the ALU is MOV 1 + MUL 2 + ADD 2 cycles a row; the ALU's 5 free cycles of
    # 9 take 5/54 of the blocks, each costing a 2-beat LOAD acc8 per input pixel.
    assert tap_alu_cycles() == 5
    share = 5 / 54
    assert f.alu_split == pytest.approx(32 * 196 * (9 * (1 - share) + 2 * share))
    # (a) pixel lanes: through the load port the input as weight tiles (100,352 B), its
    # transposed rows of 16 lanes (512 x 14 rows x 16), 3 Toeplitz blocks of 256 B per
    # channel and the pixel-lane output read back to transpose it (100,352 B).
    assert f.toeplitz == (100_352 + 512 * 14 * 16 + 512 * 3 * 256 + 100_352) / 8
    # line buffer: 3 operations per pixel block plus 2 to fill the window per row.
    assert f.line_buffer == 32 * 14 * 3 * (14 + 2)
    assert f.ratios()["line_buffer"] <= 2.0 < min(
        v for k, v in f.ratios().items() if k != "line_buffer")


def test_diagonal_weight_blocks_are_dram_traffic():
    # 1024x7x7: the roofline's 9,216 weight bytes become 64 channel blocks x 9 taps x
    # 256 B = 147,456 B of diagonal blocks; with the 50,176 input bytes on the load port
    # they hold any GEMM-diagonal lowering to 24,704 cycles, 3.3x the bound of 7,424.
    f = depthwise_floors(_dw(1024), (1, 1024, 7, 7), PYNQ, 4.0)
    assert f.roofline.bound == (50_176 + 9_216) / 8
    assert f.gemm_diagonal == 64 * 49 * 9
    assert f.alu_mac == (50_176 + 64 * 9 * 256) / 8
    # The line buffer loads one block per channel block (9 taps in 16 columns): 8,320
    # DRAM cycles, under its 64 x 7 rows x 3 kernel rows x (7 + 2) = 12,096 operations.
    assert f.line_buffer == 64 * 7 * 3 * 9 > (50_176 + 64 * 256) / 8


def test_pixel_lane_floors_need_stride_one():
    f = depthwise_floors(_dw(64, stride=2), (1, 64, 28, 28), PYNQ, 4.0)
    assert f.toeplitz is None and f.line_buffer is None
    assert f.ratios()["toeplitz"] is None and f.gemm_diagonal >= f.roofline.dram_cycles


@given(taps=st.integers(2, 49), epilogue=st.floats(0, 60), tap_cost=st.integers(1, 8),
       stall=st.floats(0, 1.9))
def test_split_balances_the_two_units(taps, epilogue, tap_cost, stall):
    v = split_cycles_per_block(taps, epilogue, tap_cost, stall)
    if epilogue >= taps:          # the ALU is full with the epilogue: nothing moves to it
        assert v == taps
        return
    share = (taps - v) / (taps - stall)
    assert 0 < share < 1
    gemm_busy = taps * (1 - share) + stall * share
    alu_busy = epilogue + taps * tap_cost * share + stall * share
    assert gemm_busy == pytest.approx(v) and alu_busy == pytest.approx(v)
