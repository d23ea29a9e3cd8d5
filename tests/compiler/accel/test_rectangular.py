"""Cores whose GEMM reads a different channel block than it stores (``block_in !=
block_out``): layers chain on the accelerator through sub-block DMAs, bit-exact."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler import Conv2d, Eltwise, Pool2d, compile_ops, requantize
from tessera.compiler.accel.ops import Concat, ConvTranspose2d
from tessera.errors import CompileError
from tessera.isa import Load, MemType, Store
from tessera.sim import simulate

from tests.compiler.accel.test_build import _reference, _resnet_block
from tests.compiler.helpers import TINY, compile_and_run
from tests.programs import TINY_4X8, TINY_8X4, assert_device_agrees

#: Reads wider blocks than it stores (tensors the GEMM reads are stored in blocks of 8, the
#: stores write sub-blocks of 4), and the other way round (the GEMM reads sub-blocks).
WIDE_IN, WIDE_OUT = TINY_8X4, TINY_4X8
RECTANGULAR = [WIDE_IN, WIDE_OUT]


def _strided(compiled, kind, mem) -> int:
    """The program's DMAs of ``mem`` that move single elements two apart (sub-blocks)."""
    return sum(isinstance(i, kind) and i.mem == mem and i.x_size == 1 and i.x_stride == 2
               for i in compiled.program.instructions)


@pytest.mark.parametrize("config", RECTANGULAR, ids=[c.name for c in RECTANGULAR])
def test_a_resnet_block_chains_on_the_accelerator(config):
    """Convolutions, max pool, a residual, global average pool and a dense layer in one
    program: equal to the reference, with the sub-block DMAs on the side that needs them."""
    rng = np.random.default_rng(21)
    ops, p = _resnet_block(rng)
    x = rng.integers(-128, 128, (1, 3, 16, 16), dtype=np.int8)
    out, _, compiled = compile_and_run(ops, {"x": x}, config)
    np.testing.assert_array_equal(out["y"][:, :, 0, 0], _reference(x, p))
    blocks = {name: t.layout.block for name, t in compiled.tensors.items()}
    assert blocks["t2"] == blocks["t3"] == 8            # read by a GEMM and stored
    if config is WIDE_IN:
        assert _strided(compiled, Store, MemType.OUT) and _strided(compiled, Load, MemType.ACC8)
        assert not _strided(compiled, Load, MemType.INP)
    else:
        assert _strided(compiled, Load, MemType.INP) and not _strided(compiled, Store,
                                                                        MemType.OUT)


def _mixed_chain(rng):
    def w(o, i, k):
        return rng.integers(-128, 128, (o, i, k, k), dtype=np.int8)

    def ep(o):
        return requantize(rng.uniform(1e-4, 2e-3, o).astype(np.float32), 3, relu=True)
    return [Conv2d("c1", "x", "a", w(16, 6, 3), padding=1, epilogue=ep(16)),
            Conv2d("dw", "a", "b", w(16, 1, 3), padding=1, groups=16, epilogue=ep(16)),
            Eltwise("add", "add", "b", "c", "a"),
            ConvTranspose2d("up", "c", "d", w(16, 12, 3), stride=2, padding=1,
                            epilogue=ep(12)),
            Conv2d("c2", "d", "y", w(10, 12, 1), stride=2, epilogue=ep(10))]


@pytest.mark.parametrize("config", RECTANGULAR, ids=[c.name for c in RECTANGULAR])
def test_depthwise_eltwise_and_transposed_convs_equal_the_square_core(config):
    """A depthwise convolution, an add of two stored tensors and a transposed convolution
    (stores of one phase, pixels apart) give what the square core gives."""
    x = np.random.default_rng(5).integers(-128, 128, (1, 6, 7, 9), dtype=np.int8)
    expected, _, _ = compile_and_run(_mixed_chain(np.random.default_rng(1)), {"x": x}, TINY)
    out, _, _ = compile_and_run(_mixed_chain(np.random.default_rng(1)), {"x": x}, config)
    np.testing.assert_array_equal(out["y"], expected["y"])


def _concat_ops(rng):
    convs = [Conv2d(f"c{i}", "x", f"p{i}", rng.integers(-128, 128, (8, 4, 3, 3), np.int8),
                    padding=1, epilogue=requantize(np.float32(1e-3))) for i in range(2)]
    after = Conv2d("after", "cat", "y", rng.integers(-128, 128, (4, 16, 1, 1), np.int8),
                   epilogue=requantize(np.float32(1e-3)))
    return [*convs, Concat("cat", ("p0", "p1"), "cat", (8, 8)), after]


def test_a_concat_is_stored_in_place_when_the_gemm_reads_sub_blocks():
    x = np.random.default_rng(3).integers(-128, 128, (1, 4, 5, 5), dtype=np.int8)
    expected, _, _ = compile_and_run(_concat_ops(np.random.default_rng(2)), {"x": x}, TINY)
    out, _, _ = compile_and_run(_concat_ops(np.random.default_rng(2)), {"x": x}, WIDE_OUT)
    np.testing.assert_array_equal(out["y"], expected["y"])
    with pytest.raises(CompileError, match="concat 'cat': a core whose GEMM reads wider"):
        compile_ops(_concat_ops(np.random.default_rng(2)), {"x": x.shape}, WIDE_IN)


def test_two_images_per_entry_do_not_chain_on_a_rectangular_core():
    """With two images per entry a sub-block is not contiguous: still a compile error."""
    ops, _ = _resnet_block(np.random.default_rng(21))
    config = WIDE_IN.replace(name="tiny-8x4-b2", batch=2)
    with pytest.raises(CompileError, match="'c2' reads 't2'.*cannot be chained"):
        compile_ops(ops, {"x": (2, 3, 16, 16)}, config)


def test_sub_block_stores_never_fill_the_token_queue():
    """A tile's sub-block stores are many small instructions, each read by a later tile:
    with tiny's 8-deep token queues, tokens from every one of them would deadlock (the
    verifier in compile_and_run runs the program with the queue depths)."""
    rng = np.random.default_rng(0)

    def w(o, i, k):
        return rng.integers(-128, 128, (o, i, k, k), dtype=np.int8)

    def ep(o):
        return requantize(rng.uniform(1e-4, 2e-3, o).astype(np.float32), 1, relu=True)
    ops = [Conv2d("c1", "x", "a", w(16, 8, 3), padding=1, epilogue=ep(16)),
           Pool2d("p", "a", "b", "max", 2, 2, 0),
           Conv2d("c2", "b", "c", w(16, 16, 3), padding=1, epilogue=ep(16)),
           Conv2d("c3", "c", "d", w(16, 16, 1), epilogue=ep(16)),
           Eltwise("e", "add", "d", "e", "b"),
           Conv2d("c4", "e", "f", w(12, 16, 3), stride=2, padding=1, epilogue=ep(12)),
           Conv2d("c5", "f", "y", w(6, 12, 1), epilogue=ep(6))]
    x = rng.integers(-128, 128, (1, 8, 9, 10), dtype=np.int8)
    expected, _, _ = compile_and_run(ops, {"x": x}, TINY)
    out, _, compiled = compile_and_run(ops, {"x": x}, WIDE_IN)
    np.testing.assert_array_equal(out["y"], expected["y"])
    assert compiled.program.config.token_queue_depth == 8


@pytest.mark.parametrize("config", RECTANGULAR, ids=[c.name for c in RECTANGULAR])
@pytest.mark.parametrize("chain", ["resnet-block", "mixed"])
def test_the_rtl_agrees_on_sub_block_dmas(config, chain):
    """The compiled programs on the Verilator model: DRAM bit-identical and cycles equal
    (uncontended DDR, so no tolerance)."""
    if chain == "resnet-block":
        rng = np.random.default_rng(21)
        ops, _ = _resnet_block(rng)
        x = rng.integers(-128, 128, (1, 3, 16, 16), dtype=np.int8)
    else:
        ops = _mixed_chain(np.random.default_rng(1))
        x = np.random.default_rng(5).integers(-128, 128, (1, 6, 7, 9), dtype=np.int8)
    program = compile_ops(ops, {"x": x.shape}, config).bind({"x": x})
    sim = simulate(program)
    assert not sim.stats.dram_contended
    assert_device_agrees(program, sim, "rtl")


def test_an_input_stored_as_in_its_model():
    """``input_blocks``: a layer compiled alone reads its input as stored in its model (the
    simulator-checked tiling times it so, compiler/accel/simtune.py): sub-block loads,
    the same result."""
    rng = np.random.default_rng(4)
    conv = Conv2d("c", "x", "y", rng.integers(-128, 128, (8, 8, 3, 3), np.int8), padding=1,
                  epilogue=requantize(np.float32(1e-3)))
    x = rng.integers(-128, 128, (1, 8, 6, 6), dtype=np.int8)
    native, _, alone = compile_and_run([conv], {"x": x}, WIDE_OUT)
    stored, _, in_model = compile_and_run([conv], {"x": x}, WIDE_OUT, input_blocks={"x": 8})
    np.testing.assert_array_equal(stored["y"], native["y"])
    assert in_model.tensors["x"].layout.block == 8 and alone.tensors["x"].layout.block == 4
    assert _strided(in_model, Load, MemType.INP) and not _strided(alone, Load, MemType.INP)


@pytest.mark.parametrize("pads", [0, 1, 2])
def test_the_cost_model_prices_a_sub_block_input_tile_row_by_row(pads):
    """The tiling cost model (convsteps.input_load_cycles) prices a GEMM input read as
    sub-blocks as a DMA per tile row plus the padding bands, as it is emitted, not as one
    DMA per plane."""
    from tessera.compiler.accel.convplan import ConvGeom, Tile, input_tile
    from tessera.compiler.accel.convsteps import input_load_cycles
    conv = Conv2d("c", "x", "y", np.ones((8, 8, 3, 3), np.int8), padding=pads)
    shape = (1, 8, 9, 7)
    whole, sub = (ConvGeom.of(conv, shape, WIDE_OUT, in_stride=s) for s in (1, 2))
    tile = Tile(0, 1, 0, 1, 0, sub.oh, 0, sub.ow)
    it = input_tile(sub, tile, 0, sub.J)
    (c1, n1), (c2, n2) = (input_load_cycles(WIDE_OUT, g, it) for g in (whole, sub))
    planes = it.c1 - it.c0
    rows = it.rows - it.pads[0] - it.pads[1]
    assert n1 == planes and n2 == planes * (rows + (it.pads[0] > 0) + (it.pads[1] > 0))
    assert c2 > c1
