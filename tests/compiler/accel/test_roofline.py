"""Roofline bounds: figures worked out by hand for layers of ResNet-18's shapes on ``pynq``.

That every bound is a lower bound on the simulated cycles is checked for every
single-operator program the compiler tests simulate (``helpers.compile_and_run``).
"""
from __future__ import annotations

import numpy as np

from tessera.compiler import Conv2d, Eltwise, Pool2d
from tessera.compiler.accel.roofline import op_roofline

from tests.compiler.helpers import PYNQ, compile_and_run


def test_max_pool_roofline_and_how_close_the_alu_gets():
    op = Pool2d("pool", "x", "y", "max", 3, 2, 1)
    roof = op_roofline(op, {"x": (1, 64, 112, 112)}.__getitem__, PYNQ)
    # No MACs; 802,816 input bytes through the compute module's 8-byte port bound it.
    assert roof.macs == 0 and roof.limit == "DRAM"
    assert roof.dram_bytes == 64 * 112 * 112 + 64 * 56 * 56
    assert roof.dram_cycles == 64 * 112 * 112 / 8

    # What the compute module cannot avoid: 64 channels are 4 blocks of 16, so it loads
    # 4*112*112 = 50,176 entries of 16 int8 values (2 beats of 8 bytes each) and fills
    # 4*56*56 output entries. Output row 0 sees 2 valid input rows (the other is padding),
    # rows 1..55 see 3; columns likewise. Each output pixel takes one MOV (1 cycle) and a
    # MAX with a tensor operand (2 cycles) per further valid tap.
    taps = (2 + 55 * 3) ** 2                   # valid taps summed over the 56x56 pixels
    floor = 50_176 * 2 + 4 * (56 * 56 * 1 + (taps - 56 * 56) * 2)
    x = np.random.default_rng(0).integers(-128, 128, (1, 64, 112, 112), dtype=np.int8)
    _, result, _ = compile_and_run([op], {"x": x}, PYNQ)
    assert roof.bound <= floor <= result.stats.cycles < 1.1 * floor


def test_convolution_bound_counts_only_the_pixels_its_windows_touch():
    # A 1x1 stride-2 downsample of 1x64x56x56 to 128 channels reads 28x28 of the pixels.
    w = np.ones((128, 64, 1, 1), np.int8)
    op = Conv2d("down", "x", "y", w, stride=2)
    roof = op_roofline(op, {"x": (1, 64, 56, 56)}.__getitem__, PYNQ)
    macs = 128 * 28 * 28 * 64
    assert roof.macs == macs and roof.compute_cycles == macs / 256
    in_b, w_b, out_b = 64 * 28 * 28, 128 * 64, 128 * 28 * 28
    assert roof.dram_bytes == in_b + w_b + out_b + 2 * 128 * 4
    assert roof.dram_cycles == max((in_b + w_b) / 8, out_b / 8)


def test_elementwise_bound_counts_each_operand_once():
    op = Eltwise("add", "add", "a", "y", "b")
    roof = op_roofline(op, {"a": (1, 32, 7, 7), "b": (1, 32, 7, 7)}.__getitem__, PYNQ)
    # Both operands in through the compute module's port, the sum out through the store's.
    assert roof.dram_bytes == 3 * 32 * 49 and roof.dram_cycles == 2 * 32 * 49 / 8
    scalar = op_roofline(Eltwise("add", "add", "a", "y", 3), {"a": (1, 32, 7, 7)}.__getitem__,
                         PYNQ)
    assert scalar.dram_cycles == 32 * 49 / 8


def test_zcu104_weights_stream_over_both_load_ports():
    """layer4's 3x3 convolution at batch 1 (2.36 MB of weights, each used once): through
    one 16-byte load port its weights bound it above its compute; over the zcu104 preset's
    two load ports it is compute bound."""
    from tessera.config import PRESETS

    zcu = PRESETS["zcu104"]
    one = zcu.replace(name="zcu104-one-load-port", dram_ports=4, module_ports=(0, 1, 2, 3))
    w = np.ones((512, 512, 3, 3), np.int8)
    op = Conv2d("l4", "x", "y", w, padding=1)
    shape = {"x": (1, 512, 7, 7)}.__getitem__
    compute = 512 * 512 * 9 * 49 / 1024
    weights = 512 * 512 * 9
    slow, fast = op_roofline(op, shape, one), op_roofline(op, shape, zcu)
    assert slow.limit == "DRAM" and slow.dram_cycles > weights / 16 > compute
    assert fast.limit == "compute" and fast.bound == compute
    assert fast.dram_cycles < slow.dram_cycles / 2 + 1
