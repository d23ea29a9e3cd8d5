"""Block-sparse convolution and dense layers: weight blocks of zeros are neither stored,
loaded nor multiplied, and the results are those of the dense layer, bit for bit."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera.compiler import Conv2d, Dense, compile_ops, conv_roofline, requantize
from tessera.compiler.accel.convweights import interleave_terms, step_weights, terms_interleave
from tessera.compiler.accel.convplan import ConvGeom
from tessera.compiler.accel.layout import WeightBlocks, pack_conv_weights
from tessera.compiler.accel.nest import dim, explicit_dim, map_nest
from tessera.compiler.golden.operators import run_reference
from tessera.config import get_config
from tessera.isa import Gemm, Load, MemType, get_isa
from tessera.sim import simulate
from tessera.sparsity import block_density, weight_blocks

from tests.programs import BACKENDS, assert_device_agrees

TINY, PYNQ = get_config("tiny"), get_config("pynq")


def zero_blocks(w: np.ndarray, density: float, config, seed: int = 0) -> np.ndarray:
    """``w`` with a random ``1 - density`` of its GEMM blocks (per tap) set to zero."""
    bo, bi = config.block_out, config.block_in
    blocks = weight_blocks(w, bo, bi).copy()
    keep = np.random.default_rng(seed).random(blocks.shape[:-2]) < density
    blocks[~keep] = 0
    ob, ib = blocks.shape[:2]
    full = blocks.transpose(0, 4, 1, 5, 2, 3).reshape(ob * bo, ib * bi, *w.shape[2:])
    return np.ascontiguousarray(full[:w.shape[0], :w.shape[1]])


def conv_case(config, ic: int, oc: int, k: int, hw: int, density: float, stride: int = 1,
              seed: int = 0) -> tuple[Conv2d, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = zero_blocks(rng.integers(-64, 64, (oc, ic, k, k)).astype(np.int8), density, config,
                    seed)
    x = rng.integers(-128, 128, (1, ic, hw, hw)).astype(np.int8)
    scale = np.full(oc, 1.0 / (64 * 16 * k * np.sqrt(ic)), np.float32)
    op = Conv2d("conv", "x", "y", w, stride=stride, padding=k // 2,
                epilogue=requantize(scale, relu=True, bias=rng.integers(-500, 500, oc)))
    return op, x


def run(op, x, config, skip_zero_blocks=True):
    prog = compile_ops([op], {"x": x.shape}, config, skip_zero_blocks=skip_zero_blocks,
                       verify=True)
    out, result = prog.run({"x": x})
    return prog, out["y"], result.stats.cycles


def gemm_ops(prog) -> int:
    return sum(i.op_count for i in prog.program.instructions if isinstance(i, Gemm))


# ------------------------------------------------------------------ the packed weights
masks = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3),
                  st.integers(0, 2 ** 31 - 1), st.floats(0, 1)).map(
    lambda a: np.random.default_rng(a[3]).random((a[0], a[1], a[2], a[2])) < a[4])


@given(masks)
def test_weight_blocks_index_the_packed_runs(mask):
    b = WeightBlocks(mask)
    flat = mask.reshape(mask.shape[0], -1)
    k = mask[0, 0].size
    for ob in range(mask.shape[0]):
        for j0, j1 in itertools.combinations_with_replacement(range(mask.shape[1] + 1), 2):
            assert b.count(ob, j0, j1) == mask[ob, j0:j1].sum()
            assert b.start(ob, j0) == flat[:ob].sum() + flat[ob, :j0 * k].sum()
    assert b.nonzero == mask.sum() and b == WeightBlocks(mask.copy())
    assert hash(b) == hash(WeightBlocks(mask.copy()))
    assert b.is_dense == bool(mask.all())


@settings(max_examples=60)
@given(masks, st.data())
def test_step_weight_dmas_fill_the_slot_in_packed_order(mask, data):
    """Running a step's weight DMAs on the packed segment gives each output block's
    non-zero blocks of the step in order, at the offsets the kernel terms use."""
    OB, J = mask.shape[:2]
    op = Conv2d("c", "x", "y", np.zeros((OB * 4, J * 4, *mask.shape[2:]), np.int8))
    g = ConvGeom.of(op, (1, J * 4, 6, 6), TINY, WeightBlocks(mask))
    ob0 = data.draw(st.integers(0, OB - 1))
    ob1 = data.draw(st.integers(ob0 + 1, OB))
    j0 = data.draw(st.integers(0, J - 1))
    j1 = data.draw(st.integers(j0 + 1, J))
    ids = np.arange(mask.size).reshape(mask.shape)       # each block named by its index
    segment = ids[mask]
    sw = step_weights(g, ob0, ob1, j0, j1)
    slot = np.full(mask.size, -1)
    for r in sw.runs:
        for y in range(r.obs):
            slot[r.sram + y * r.count:r.sram + (y + 1) * r.count] = \
                segment[r.dram + y * r.stride:r.dram + y * r.stride + r.count]
    expected = [ids[ob, j0:j1][mask[ob, j0:j1]] for ob in range(ob0, ob1)]
    for k, want in enumerate(expected):
        got = slot[sw.offsets[k]:sw.offsets[k] + want.size]
        np.testing.assert_array_equal(got, want)
    if mask.all():
        assert len(sw.runs) == 1          # a dense tile is one DMA of ob_n rows


# ------------------------------------------------------------------ kernel term order
@given(st.lists(st.integers(0, 6), min_size=1, max_size=5), st.integers(1, 4))
def test_interleaved_terms_keep_each_block_apart_when_the_bound_allows(counts, d):
    per_ob = [[(k, i) for i in range(n)] for k, n in enumerate(counts)]
    order = interleave_terms(per_ob, d)
    assert sorted(order) == sorted(t for q in per_ob for t in q)
    for k in range(len(counts)):                       # each block's terms keep their order
        assert [t for t in order if t[0] == k] == per_ob[k]
    gaps_ok = all(order[a][0] != order[b][0] for a in range(len(order))
                  for b in range(a + 1, min(len(order), a + d)))
    assert gaps_ok == terms_interleave(counts, d)


@pytest.mark.parametrize("counts", [c for n in range(1, 4)
                                    for c in itertools.product(range(4), repeat=n)])
def test_interleave_bound_is_exact(counts):
    """Some order keeps one block's terms 3 apart exactly when the bound says so."""
    terms = [k for k, n in enumerate(counts) for _ in range(n)]
    possible = any(all(p[a] != p[b] for a in range(len(p)) for b in range(a + 1, a + 3)
                       if b < len(p)) for p in set(itertools.permutations(terms)))
    assert possible == terms_interleave(list(counts), 3)


def test_a_one_index_explicit_dimension_keeps_its_offset():
    """A step with a single kernel term still reads and writes where that term says."""
    nest = map_nest([dim("ox", 5, dst=1, src=1), explicit_dim("term", [7], [3], [2])],
                    (10, 20, 30), kind="gemm", isa=get_isa(TINY), distance=3)
    assert {(u.dst, u.src, u.wgt) for u in nest.uops} == {(17, 23, 32)}


# ------------------------------------------------------------------ compiled layers
@pytest.mark.parametrize("config, ic, oc, k, hw, stride, density", [
    (TINY, 8, 12, 3, 6, 1, 0.4), (TINY, 12, 20, 1, 6, 2, 0.3), (TINY, 16, 16, 3, 6, 1, 0.0),
    (TINY, 8, 4, 3, 6, 1, 0.5),          # one output block: no other block's terms between
    (PYNQ, 64, 64, 3, 14, 1, 0.25), (PYNQ, 128, 64, 1, 7, 1, 0.1)])
def test_sparse_layers_equal_the_dense_layer_and_skip_its_zero_blocks(
        config, ic, oc, k, hw, stride, density):
    op, x = conv_case(config, ic, oc, k, hw, density, stride)
    dense_prog, dense_y, dense_cycles = run(op, x, config, skip_zero_blocks=False)
    prog, y, cycles = run(op, x, config)
    np.testing.assert_array_equal(y, dense_y)
    np.testing.assert_array_equal(y, run_reference([op], {"x": x})["y"])
    wp, _ = pack_conv_weights(op.weight, 1, config)
    blocks = WeightBlocks.of(wp)
    block_bytes = config.block_in * config.block_out * config.wgt_width // 8
    assert prog.program.segment("conv.w").data.nbytes == blocks.nonzero * block_bytes
    assert dense_prog.program.segment("conv.w").data.nbytes == wp.nbytes
    pixels = x.shape[0] * (hw // stride) ** 2
    assert gemm_ops(prog) == blocks.nonzero * pixels
    assert gemm_ops(dense_prog) == blocks.mask.size * pixels
    if density <= 0.5:
        assert cycles < dense_cycles
    assert prog.plans["conv"].density == pytest.approx(blocks.density)


def test_a_layer_whose_sparse_kernels_overflow_runs_densely():
    """tiny's 128 uops hold no sparse tiling of this layer (a kernel per output-block
    range and slot combination): it runs densely, with the same results."""
    op, x = conv_case(TINY, 16, 16, 3, 8, 0.5)
    prog, y, _ = run(op, x, TINY)
    np.testing.assert_array_equal(y, run_reference([op], {"x": x})["y"])
    assert prog.plans["conv"].density == 1.0
    assert prog.program.segment("conv.w").data.nbytes == op.weight.size


def test_dense_layers_skip_zero_blocks_too():
    rng = np.random.default_rng(3)
    w = zero_blocks(rng.integers(-64, 64, (24, 32, 1, 1)).astype(np.int8), 0.4, TINY,
                    3)[:, :, 0, 0]
    op = Dense("fc", "x", "y", w, epilogue=requantize(np.full(24, 1e-3, np.float32)))
    x = rng.integers(-128, 128, (3, 32)).astype(np.int8)
    prog = compile_ops([op], {"x": x.shape}, TINY, verify=True)
    out, _ = prog.run({"x": x})
    np.testing.assert_array_equal(out["y"], run_reference([op], {"x": x})["y"])
    assert prog.program.segment("fc.w").data.nbytes < w.size


def test_weight_loads_carry_only_the_nonzero_blocks():
    op, x = conv_case(PYNQ, 64, 64, 3, 14, 0.25)
    prog = compile_ops([op], {"x": x.shape}, PYNQ)
    loaded = sum(i.y_size * i.x_size for i in prog.program.instructions
                 if isinstance(i, Load) and i.mem == MemType.WGT)
    wp, _ = pack_conv_weights(op.weight, 1, PYNQ)
    assert loaded >= WeightBlocks.of(wp).nonzero
    assert loaded < wp.shape[0] * wp.shape[1] * 9 // 2


def test_roofline_counts_only_the_nonzero_blocks():
    op, _ = conv_case(PYNQ, 64, 64, 3, 14, 0.25)
    dense = conv_roofline(Conv2d("d", "x", "y", np.ones_like(op.weight), padding=1),
                          (1, 64, 14, 14), PYNQ)
    sparse = conv_roofline(op, (1, 64, 14, 14), PYNQ)
    d = block_density(op.weight, 16, 16)
    assert sparse.density == pytest.approx(d) and 0 < d < 0.5
    assert sparse.compute_cycles == pytest.approx(d * dense.compute_cycles)
    assert sparse.macs == dense.macs and sparse.dram_bytes < dense.dram_bytes


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_layer_runs_alike_on_every_backend(backend):
    """sim = RTL (= the simulated PYNQ board) in data and cycles on a block-sparse layer."""
    op, x = conv_case(TINY, 8, 12, 3, 6, 0.4, seed=5)
    prog = compile_ops([op], {"x": x.shape}, TINY)
    assert prog.plans["conv"].density < 1
    program = prog.bind({"x": x})
    assert_device_agrees(program, simulate(program), backend)
