"""The hand-written blocked GEMM: bit-exact on every preset; two virtual threads beat one."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera.config import PRESETS
from tessera.errors import ProgramError
from tessera.kernels.gemm import (GemmPlan, blocked_layout, estimate_cycles, gemm_program,
                                  plan_gemm, read_result, unblocked)
from tessera.sim import simulate


def numpy_gemm(a, b, shift=0, relu=False):
    """Independent golden model: exact int GEMM, arithmetic shift, ReLU, int8 saturation."""
    acc = a.astype(np.int64) @ b.astype(np.int64).T
    acc >>= shift
    if relu:
        acc = np.maximum(acc, 0)
    return np.clip(acc, -128, 127).astype(np.int8)


def _random(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


@pytest.mark.parametrize("name, m, n, k", [("tiny", 8, 8, 8), ("tiny", 12, 16, 20),
                                           ("pynq", 32, 48, 64), ("zcu104", 16, 64, 64)])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_bit_exact(name, m, n, k, threads):
    config = PRESETS[name]
    rng = np.random.default_rng(m * n + k)
    a, b = _random(rng, (m, k)), _random(rng, (n, k))
    prog = gemm_program(config, a, b, epilogue=[("SHR", 7), ("MAX", 0)], threads=threads)
    result = simulate(prog)
    np.testing.assert_array_equal(read_result(config, result, prog, m, n),
                                  numpy_gemm(a, b, shift=7, relu=True))
    assert result.stats.gemm_ops == m * n * k // config.peak_macs_per_cycle
    assert result.stats.leftover_tokens == {}


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**32 - 1),
       st.sampled_from([1, 2]))
def test_gemm_random_shapes_on_tiny(mb, nb, kb, seed, threads):
    config = PRESETS["tiny"]
    m, n, k = mb * config.batch, nb * config.block_out, kb * config.block_in
    rng = np.random.default_rng(seed)
    a, b = _random(rng, (m, k)), _random(rng, (n, k))
    try:
        prog = gemm_program(config, a, b, epilogue=[("SHR", 5)], threads=threads)
    except ProgramError:
        return  # e.g. fewer than GEMM_LATENCY output blocks: no hazard-free tiling
    result = simulate(prog)
    np.testing.assert_array_equal(read_result(config, result, prog, m, n), numpy_gemm(a, b, 5))


def test_two_virtual_threads_are_faster_and_equal():
    config = PRESETS["pynq"]
    rng = np.random.default_rng(7)
    a, b = _random(rng, (128, 128)), _random(rng, (128, 128))
    runs = {}
    for vt in (1, 2):
        prog = gemm_program(config, a, b, epilogue=[("SHR", 8)], threads=vt,
                            plan=GemmPlan(32, 4, vt))
        result = simulate(prog)
        runs[vt] = (read_result(config, result, prog, 128, 128), result.stats)
    np.testing.assert_array_equal(runs[1][0], runs[2][0])
    np.testing.assert_array_equal(runs[2][0], numpy_gemm(a, b, 8))
    assert runs[2][1].cycles < 0.85 * runs[1][1].cycles
    # Overlap shows in the statistics: with one thread, compute waits on loads far longer.
    assert runs[1][1].modules["compute"].wait_token > 2 * runs[2][1].modules["compute"].wait_token


def test_planner_estimate_tracks_the_simulator():
    config = PRESETS["pynq"]
    rng = np.random.default_rng(3)
    a, b = _random(rng, (256, 256)), _random(rng, (256, 256))
    for plan in (GemmPlan(64, 4, 2), GemmPlan(16, 16, 2), GemmPlan(128, 16, 1)):
        sim = simulate(gemm_program(config, a, b, plan=plan)).stats.cycles
        est = estimate_cycles(config, plan, 256, 256, 256)
        assert abs(est - sim) / sim < 0.05, (plan, est, sim)
    assert plan_gemm(config, 256, 256, 256, 2) == GemmPlan(64, 4, 2)


def test_blocked_layout_round_trip():
    x = np.arange(8 * 12).reshape(8, 12)
    blocks = blocked_layout(x, 2, 4)
    assert blocks.shape == (4, 3, 2, 4)
    np.testing.assert_array_equal(blocks[1, 2], x[2:4, 8:12])
    np.testing.assert_array_equal(unblocked(blocks), x)


def test_bad_shapes_are_reported():
    config = PRESETS["pynq"]
    with pytest.raises(ProgramError, match="K=20 must be a multiple of 16"):
        gemm_program(config, np.zeros((16, 20), np.int8), np.zeros((16, 20), np.int8))
    with pytest.raises(ProgramError, match="inner dimensions differ"):
        gemm_program(config, np.zeros((16, 32), np.int8), np.zeros((16, 16), np.int8))
