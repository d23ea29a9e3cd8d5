"""The parallel form of CPU kernels (``CpuKernel.parallel``, ``<entry>.range``) and the
runtime's threaded dispatch (tessera.runtime.cpu): results equal the serial kernel's
bit for bit, on every split."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler.cpu.conv_float import build_conv_float
from tessera.compiler.cpu.elementwise import E, fused_elementwise
from tessera.compiler.cpu.kernel import CpuKernel, TensorSpec
from tessera.compiler.cpu.layout_ops import build_concat, build_pad, build_transpose
from tessera.compiler.cpu.matmul import build_gemm, build_matmul
from tessera.compiler.cpu.packed_gemm import ROW_BLOCK
from tessera.compiler.cpu.reduce import reduce_sum
from tessera.compiler.cpu.vector_width import VECTOR_WIDTHS, building_for_vector_bits
from tessera.errors import CpuKernelError
from tessera.runtime import cpu
from tessera.runtime.cpu import auto_threads, cpu_threads, load_kernel

_RNG = np.random.default_rng(7)


def _data(shape, dtype):
    if dtype == "float32":
        return _RNG.standard_normal(shape).astype(np.float32)
    return _RNG.integers(-128, 128, shape, dtype=np.int8)


def _same_all_threads(kernel: CpuKernel, *arrays: np.ndarray) -> None:
    loaded = load_kernel(kernel)
    want = loaded(*arrays, threads=1)
    for n in (2, 3, 4, 7, max(1, kernel.parallel), kernel.parallel + 5):
        got = loaded(*arrays, threads=n)
        for w, g in zip(want, got):
            assert w.dtype == g.dtype and w.shape == g.shape
            assert w.tobytes() == g.tobytes(), f"{n} threads"


@pytest.mark.parametrize("shape", [(1,), (2,), (3,), (7,), (1001,), (5, 3), (3, 13, 7)])
def test_elementwise_splits_bit_identically(shape):
    x, y = _data(shape, "float32"), _data(shape, "float32")
    k = fused_elementwise((E.input(0) * 0.5 + E.input(1)).tanh(),
                          [TensorSpec(shape, "float32")] * 2)
    size = int(np.prod(shape))       # contiguous operands collapse to one loop
    assert k.parallel == (size if size > 1 else 0)
    _same_all_threads(k, x, y)


def test_elementwise_with_broadcast_and_int8():
    a, b = _data((3, 5, 9), "int8"), _data((3, 1, 9), "int8")
    k = fused_elementwise(E.input(0) + E.input(1),
                          [TensorSpec(a.shape, "int8"), TensorSpec(b.shape, "int8")])
    assert k.parallel == 3
    _same_all_threads(k, a, b)
    np.testing.assert_array_equal(load_kernel(k)(a, b, threads=2)[0], a + b)


def test_scalar_kernel_has_no_parallel_form():
    k = fused_elementwise(E.input(0) + 1.0, [TensorSpec((), "float32")])
    assert k.parallel == 0
    x = np.float32(2.0)
    assert load_kernel(k)(x, threads=4)[0] == 3.0


@pytest.mark.parametrize("shapes,axis,parallel", [
    ([(1, 3, 5, 7), (1, 4, 5, 7)], 1, 0),        # two short copies: not worth splitting
    ([(1, 64, 9, 9), (1, 64, 9, 9)], 1, 5),      # outer 1: chunks split into pieces
    ([(3, 2, 5), (3, 1, 5), (3, 4, 5)], 1, 3),
    ([(5, 7, 3), (5, 7, 2)], 2, 35),
    ([(2, 0, 3), (2, 4, 3)], 1, 2),
])
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_concat_splits_bit_identically(shapes, axis, parallel, dtype):
    xs = [_data(s, dtype) for s in shapes]
    k = build_concat([TensorSpec(s, dtype) for s in shapes], axis)
    assert k.parallel == parallel
    _same_all_threads(k, *xs)
    np.testing.assert_array_equal(load_kernel(k)(*xs, threads=3)[0],
                                  np.concatenate(xs, axis=axis))


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_splits_on_unpadded_outer_axis(mode):
    x = _data((1, 5, 6, 7), "float32")
    k = build_pad(TensorSpec(x.shape, "float32"), [0, 0, 2, 1, 0, 0, 1, 2], mode)
    assert k.parallel == 5
    _same_all_threads(k, x)
    np.testing.assert_array_equal(load_kernel(k)(x, threads=2)[0],
                                  np.pad(x, ((0, 0), (0, 0), (2, 1), (1, 2)), mode=mode))


def test_pad_of_outer_axis_stays_serial():
    k = build_pad(TensorSpec((4, 5), "int8"), [1, 0, 1, 0])
    assert k.parallel == 0


def test_serial_only_kernels_ignore_threads():
    x = _data((4, 6), "float32")
    for k in (reduce_sum(TensorSpec(x.shape, "float32"), (1,)),
              build_transpose(TensorSpec(x.shape, "float32"))):
        assert k.parallel == 0
        loaded = load_kernel(k)
        assert loaded.threads == 1
        np.testing.assert_array_equal(loaded(x, threads=4)[0], loaded(x)[0])


def test_huge_thread_counts_are_capped():
    x = _data((10**6,), "float32")
    k = load_kernel(fused_elementwise(E.input(0) + 1.0, [TensorSpec(x.shape, "float32")]))
    assert k.kernel.parallel == 10**6 > cpu.MAX_SLICES
    # A slice per element would be 24 MB of slice contexts on the calling thread's stack.
    assert k(x, threads=10**6)[0].tobytes() == k(x, threads=1)[0].tobytes()


def test_threads_must_be_positive():
    k = fused_elementwise(E.input(0) + 1.0, [TensorSpec((8,), "float32")])
    with pytest.raises(CpuKernelError, match="threads must be >= 1"):
        load_kernel(k)(np.zeros(8, np.float32), threads=0)


def test_out_arrays_and_parallel():
    x = _data((9, 4), "float32")
    k = fused_elementwise(E.input(0) * 2.0, [TensorSpec(x.shape, "float32")])
    out = np.empty_like(x)
    res = load_kernel(k)(x, out=(out,), threads=4)
    assert res[0] is out
    np.testing.assert_array_equal(out, x * 2)


# --- the packed float GEMM: MatMul, Gemm, Conv ----------------------------------------

def _f32(*shape):
    return _data(shape, "float32")


def _spec(a: np.ndarray) -> TensorSpec:
    return TensorSpec(a.shape, a.dtype.name)


# (m, k, n): both packed sides, row counts off the tile and block sizes, a B' of fewer
# columns than a panel (A packed at some widths, B at others).
@pytest.mark.parametrize("mkn", [(100, 40, 50), (29, 64, 130), (13, 33, 200), (70, 9, 70)])
@pytest.mark.parametrize("bits", VECTOR_WIDTHS)
def test_matmul_splits_bit_identically_at_every_width(mkn, bits):
    m, k, n = mkn
    a, b = _f32(m, k), _f32(k, n)
    with building_for_vector_bits(bits):
        kern = build_matmul(_spec(a), _spec(b))
    # The extent must not depend on the width (one per kernel, whatever variant runs).
    assert kern.parallel == -(-max(m, n) // ROW_BLOCK)
    assert kern.macs == m * k * n
    _same_all_threads(kern, a, b)
    np.testing.assert_allclose(load_kernel(kern)(a, b, threads=3)[0], a @ b,
                               rtol=1e-5, atol=1e-4)


def test_batched_matmul_splits_each_product():
    a, b = _f32(3, 1, 26, 40), _f32(2, 40, 90)
    kern = build_matmul(_spec(a), _spec(b))
    assert kern.parallel == 8 and kern.macs == 6 * 26 * 40 * 90
    _same_all_threads(kern, a, b)
    np.testing.assert_allclose(load_kernel(kern)(a, b, threads=2)[0], a @ b,
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_epilogue_covers_only_its_slice(trans_b):
    """alpha and a broadcast C are applied once per element whichever operand is packed
    (x @ W.T packs x: the slices are the output's columns)."""
    a, w, c = _f32(70, 48), _f32(130, 48), _f32(130)
    b = w if trans_b else np.ascontiguousarray(w.T)
    kern = build_gemm(_spec(a), _spec(b), _spec(c), trans_b=trans_b, alpha=0.5, beta=2.0)
    assert kern.parallel > 1
    _same_all_threads(kern, a, b, c)
    np.testing.assert_allclose(load_kernel(kern)(a, b, c, threads=4)[0],
                               0.5 * (a @ w.T) + 2.0 * c, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m", [5, 16, 40])
@pytest.mark.parametrize("bits", VECTOR_WIDTHS)
def test_dot_product_gemm_splits_like_the_packed_one(m, bits):
    """x @ W.T with few rows runs as dot products at some widths and packed at others
    (16 rows: dots at 512 bits, packed below); every variant splits the same extent."""
    a, w, c = _f32(m, 64), _f32(150, 64), _f32(150)
    with building_for_vector_bits(bits):
        kern = build_gemm(_spec(a), _spec(w), _spec(c), trans_b=True, alpha=1.5)
    assert kern.parallel == -(-150 // ROW_BLOCK) and kern.macs == m * 64 * 150
    _same_all_threads(kern, a, w, c)
    np.testing.assert_allclose(load_kernel(kern)(a, w, c, threads=2)[0],
                               1.5 * (a @ w.T) + c, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m", [3, 5])
def test_products_that_stay_in_the_loop_nest_at_some_width_are_serial(m):
    """A few rows times a B contiguous along j: the loop nest (no parallel form) at
    some width, so no width's kernel splits; the work is still counted alike."""
    a, b = TensorSpec((m, 300), "float32"), TensorSpec((300, 200), "float32")
    for bits in VECTOR_WIDTHS:
        with building_for_vector_bits(bits):
            kern = build_gemm(a, b)
        assert (kern.parallel, kern.macs) == (0, m * 300 * 200)


@pytest.mark.parametrize("group,bias", [(1, True), (2, True), (1, False)])
def test_conv_gemm_splits_output_channels(group, bias):
    x, w = _f32(2, 16, 9, 9), _f32(40, 16 // group, 3, 3)
    b = _f32(40)
    specs = [_spec(x), _spec(w)] + ([_spec(b)] if bias else [])
    kern = build_conv_float(*specs, pads=[1, 1, 1, 1], group=group)
    assert kern.parallel == -(-(40 // group) // ROW_BLOCK)
    assert kern.macs == 2 * 40 * (16 // group) * 9 * 81
    arrays = (x, w, b) if bias else (x, w)
    _same_all_threads(kern, *arrays)
    serial = load_kernel(kern)(*arrays, threads=1)[0]
    np.testing.assert_array_equal(load_kernel(kern)(*arrays, threads=2)[0], serial)


def test_small_convs_stay_serial():
    kern = build_conv_float(TensorSpec((1, 4, 5, 5), "float32"),
                            TensorSpec((4, 4, 3, 3), "float32"))
    assert (kern.parallel, kern.macs) == (0, 0)     # the loop nest, not the GEMM


# --- thread count and threshold ----------------------------------------------------

def test_env_var_sets_thread_count(monkeypatch):
    monkeypatch.setenv("TESSERA_CPU_THREADS", "3")
    assert cpu_threads() == 3
    monkeypatch.setenv("TESSERA_CPU_THREADS", "1")
    assert cpu_threads() == 1
    monkeypatch.delenv("TESSERA_CPU_THREADS")
    assert 1 <= cpu_threads() <= cpu.MAX_THREADS


@pytest.mark.parametrize("bad", ["0", "-2", "many"])
def test_env_var_rejects_nonsense(monkeypatch, bad):
    monkeypatch.setenv("TESSERA_CPU_THREADS", bad)
    with pytest.raises(CpuKernelError, match="TESSERA_CPU_THREADS"):
        cpu_threads()


def test_threshold_is_respected(monkeypatch):
    per = cpu.BYTES_PER_THREAD
    # float32 add: 12 bytes moved per element.
    small = fused_elementwise(E.input(0) + E.input(1), [TensorSpec((per // 12,), "float32")] * 2)
    big = fused_elementwise(E.input(0) + E.input(1),
                            [TensorSpec((2 * per // 12 + 12,), "float32")] * 2)
    assert auto_threads(small, 8) == 1
    assert auto_threads(big, 8) == 2
    assert auto_threads(big, 1) == 1
    monkeypatch.setattr(cpu, "BYTES_PER_THREAD", 4)
    tiny = fused_elementwise(E.input(0) + 1.0, [TensorSpec((3,), "float32")])
    assert auto_threads(tiny, 8) == 3       # never more than the parallel extent
    assert auto_threads(reduce_sum(TensorSpec((64, 64), "float32"), (1,)), 8) == 1


def test_compute_bound_kernels_get_threads_by_multiply_adds(monkeypatch):
    per = cpu.MACS_PER_THREAD
    a, b = TensorSpec((64, 768), "float32"), TensorSpec((768, 3072), "float32")
    big = build_matmul(a, b)
    assert big.macs >= 2 * per      # the benchmark's GEMM gets a second thread here
    assert auto_threads(big, 8) == min(big.macs // per, big.parallel, 8)
    assert auto_threads(big, 1) == 1
    small = build_matmul(TensorSpec((64, 64), "float32"), TensorSpec((64, 64), "float32"))
    assert small.macs < per and small.parallel >= 3 and auto_threads(small, 8) == 1
    monkeypatch.setattr(cpu, "BYTES_PER_THREAD", 1)
    assert auto_threads(small, 8) == 1      # by its work, not its bytes
    monkeypatch.setattr(cpu, "MACS_PER_THREAD", small.macs // 3)
    assert auto_threads(small, 8) == 3


def test_threads_one_turns_the_parallel_path_off(monkeypatch):
    monkeypatch.setattr(cpu, "BYTES_PER_THREAD", 64)
    x = _data((50, 8), "float32")
    k = fused_elementwise(E.input(0) - 1.0, [TensorSpec(x.shape, "float32")])
    monkeypatch.setenv("TESSERA_CPU_THREADS", "1")
    assert load_kernel(k).threads == 1
    monkeypatch.setenv("TESSERA_CPU_THREADS", "4")
    loaded = load_kernel(k)
    assert loaded.threads == 4
    np.testing.assert_array_equal(loaded(x)[0], x - 1)


# --- serialisation -----------------------------------------------------------------

def test_parallel_round_trips_through_dict():
    k = build_concat([TensorSpec((4, 8, 4), "int8")] * 2, 1)
    d = k.to_dict()
    assert d["parallel"] == k.parallel > 0
    assert CpuKernel.from_dict(d) == k


def test_old_records_without_parallel_load_serial():
    k = fused_elementwise(E.input(0) + 1.0, [TensorSpec((16,), "float32")])
    d = k.to_dict()
    del d["parallel"]
    old = CpuKernel.from_dict(d)
    assert old.parallel == 0
    loaded = load_kernel(old)
    assert loaded.threads == 1
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(loaded(x, threads=4)[0], x + 1)


def test_bad_parallel_extent_is_rejected():
    with pytest.raises(CpuKernelError, match="parallel extent"):
        CpuKernel("k", "", "entry", (), (), parallel=-1)
    with pytest.raises(CpuKernelError, match="macs"):
        CpuKernel("k", "", "entry", (), (), macs=-1)


def test_macs_round_trip_and_default_to_zero():
    k = build_matmul(TensorSpec((40, 30), "float32"), TensorSpec((30, 50), "float32"))
    d = k.to_dict()
    assert d["macs"] == 40 * 30 * 50 and CpuKernel.from_dict(d) == k
    del d["macs"]                    # a record from before the field
    assert CpuKernel.from_dict(d).macs == 0
