"""The parallel form of CPU kernels (``CpuKernel.parallel``, ``<entry>.range``) and the
runtime's threaded dispatch (tessera.runtime.cpu): results equal the serial kernel's
bit for bit, on every split."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.compiler.cpu.elementwise import E, fused_elementwise
from tessera.compiler.cpu.kernel import CpuKernel, TensorSpec
from tessera.compiler.cpu.layout_ops import build_concat, build_pad, build_transpose
from tessera.compiler.cpu.reduce import reduce_sum
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
