"""The compiled argument checks of ``LoadedKernel.__call__`` (``tessera.pycall.checked``
in tessera.runtime.cpu): what they accept runs as the Python-checked path would, what
they reject falls back to it and gets its detailed errors, and a numpy layout that
cannot be verified turns them off."""
from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest

from tessera.compiler.cpu.elementwise import E, fused_elementwise
from tessera.compiler.cpu.kernel import TensorSpec
from tessera.errors import CpuKernelError
from tessera.runtime import cpu_abi
from tessera.runtime.cpu import load_kernel

pytestmark = pytest.mark.skipif(not cpu_abi.NATIVE_CHECKS,
                                reason="numpy's array layout is not verified here")


@pytest.fixture(scope="module")
def scale_add():
    """out = x * 2 + y over float32 (2, 3)."""
    spec = TensorSpec((2, 3), "float32")
    return load_kernel(fused_elementwise(E.input(0) * 2.0 + E.input(1), [spec, spec],
                                         name="scale_add"))


def _xy() -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    return x, np.full((2, 3), 0.5, np.float32)


def test_serial_kernels_get_the_checked_wrapper(scale_add):
    assert scale_add._checked_fn is not None


def test_wrapper_runs_on_matching_arrays_and_rejects_the_rest(scale_add):
    x, y = _xy()
    out = np.zeros((2, 3), np.float32)
    check = scale_add._checked_fn
    assert check(x, y, out) is None
    np.testing.assert_array_equal(out, x * 2 + y)
    untouched = out.copy()
    frozen = out.copy()
    frozen.flags.writeable = False
    bad_calls = [
        (x, y),                                       # too few arguments
        (x, y, out, out),                             # too many
        (x, y.astype(np.float64), out),               # dtype
        (x, y.astype(">f4"), out),                    # byte order
        (x, y.reshape(3, 2), out),                    # shape
        (x, y.reshape(1, 2, 3), out),                 # rank
        (x, np.zeros((2, 6), np.float32)[:, ::2], out),   # not contiguous
        (x, [[0.5] * 3] * 2, out),                    # not an ndarray
        (x, 0.5, out),                                # not even a sequence
        (x, y, frozen),                               # read-only output
        (x, y, x),                                    # output is an input
        (out, y, out),                                # ... in either position
    ]
    for args in bad_calls:
        assert check(*args) is NotImplemented, args
        np.testing.assert_array_equal(out, untouched)


def test_partial_overlap_is_rejected_and_disjoint_views_accepted():
    spec = TensorSpec((4,), "int32")
    kernel = load_kernel(fused_elementwise(E.input(0) + 1, [spec], name="inc"))
    buf = np.arange(8, dtype=np.int32)
    with pytest.raises(CpuKernelError, match="overlaps"):
        kernel(buf[:4], out=[buf[3:7]])
    (res,) = kernel(buf[:4], out=[buf[4:]])
    np.testing.assert_array_equal(res, [1, 2, 3, 4])
    np.testing.assert_array_equal(buf, [0, 1, 2, 3, 1, 2, 3, 4])


@pytest.mark.parametrize("bad, message", [
    (np.zeros((2, 3), np.float64), "input 1 must be float32 of shape (2, 3), not float64 (2, 3)"),
    (np.zeros((2, 3), ">f4"), "input 1 must be float32 of shape (2, 3), not >f4 (2, 3)"),
    (np.zeros((3, 2), np.float32), "input 1 must be float32 of shape (2, 3), not float32 (3, 2)"),
    (np.zeros(6, np.float32), "input 1 must be float32 of shape (2, 3), not float32 (6,)"),
    ([[0.0] * 3] * 2, "input 1 must be float32 of shape (2, 3), not list"),
])
def test_rejected_inputs_get_the_detailed_errors(scale_add, bad, message):
    x, _ = _xy()
    with pytest.raises(CpuKernelError) as exc:
        scale_add(x, bad)
    assert str(exc.value) == f"scale_add: {message}"


def test_bad_out_and_argument_counts_get_the_detailed_errors(scale_add):
    x, y = _xy()
    with pytest.raises(CpuKernelError, match="takes 2 inputs, got 1"):
        scale_add(x)
    with pytest.raises(CpuKernelError, match="takes 2 inputs, got 3"):
        scale_add(x, y, y)
    # Three arrays of the right kind, split the wrong way between inputs and out.
    with pytest.raises(CpuKernelError, match="takes 2 inputs, got 1"):
        scale_add(x, out=[y, np.empty_like(x)])
    frozen = np.zeros((2, 3), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(CpuKernelError, match="writeable"):
        scale_add(x, y, out=[frozen])
    with pytest.raises(CpuKernelError, match="overlaps"):
        scale_add(x, y, out=[y])


class _Sub(np.ndarray):
    pass


def _odd_inputs(x: np.ndarray) -> list[np.ndarray]:
    """Arrays equal to ``x`` that the compiled checks refuse but the Python path takes."""
    unaligned = np.frombuffer(bytearray(x.nbytes + 1), x.dtype, x.size, 1).reshape(x.shape)
    unaligned[...] = x
    fortran = np.asfortranarray(x)
    strided = np.repeat(x, 2, axis=-1)[..., ::2]
    tagged = x.view(np.dtype(x.dtype.name, metadata={"tag": 1}))    # equal, not the singleton
    return [unaligned, fortran, strided, x.view(_Sub), tagged]


def test_refused_but_valid_inputs_give_the_same_results(scale_add):
    x, y = _xy()
    want = scale_add(x, y, threads=1)[0]
    for odd in _odd_inputs(x):
        np.testing.assert_array_equal(scale_add(odd, y)[0], want)
        np.testing.assert_array_equal(scale_add(y * 0 + y, odd)[0], y * 2 + x)


def test_out_may_be_an_iterator_and_a_subclass(scale_add):
    x, y = _xy()
    out = np.zeros((2, 3), np.float32).view(_Sub)   # refused by the wrapper
    (res,) = scale_add(x, y, out=iter([out]))
    assert res is out
    np.testing.assert_array_equal(out, x * 2 + y)
    plain = np.zeros((2, 3), np.float32)
    (res,) = scale_add(x, y, out=iter([plain]))
    assert res is plain
    np.testing.assert_array_equal(plain, x * 2 + y)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "float32"])
@pytest.mark.parametrize("shape", [(), (0, 3), (7,), (2, 3, 5)])
def test_fast_path_equals_checked_path(dtype, shape):
    rng = np.random.default_rng(1)
    x = rng.integers(-100, 100, shape).astype(dtype)
    y = rng.integers(-100, 100, shape).astype(dtype)
    kernel = load_kernel(fused_elementwise(E.input(0) * 3 - E.input(1),
                                           [TensorSpec(shape, dtype)] * 2))
    (fast,) = kernel(x, y)
    (checked,) = kernel(x, y, threads=1)      # ``threads`` takes the Python checks
    assert fast.dtype == checked.dtype and fast.shape == checked.shape == shape
    np.testing.assert_array_equal(fast, checked)
    out = np.empty(shape, dtype)
    assert kernel(x, y, out=[out])[0] is out
    np.testing.assert_array_equal(out, checked)


def test_numpy_scalars_still_count_as_0d_arrays():
    kernel = load_kernel(fused_elementwise(E.input(0) + 1.5, [TensorSpec((), "float32")]))
    assert kernel(np.float32(2.0))[0] == np.float32(3.5)
    assert kernel(np.array(2.0, np.float32))[0] == np.float32(3.5)


def test_rejections_keep_reference_counts_balanced(scale_add):
    x, y = _xy()
    bad = y.astype(np.float64)
    before = sys.getrefcount(NotImplemented), sys.getrefcount(None), sys.getrefcount(x)
    for _ in range(2000):
        scale_add._checked_fn(x, bad, x)
        scale_add._checked_fn(x, y, np.empty_like(x))
    after = sys.getrefcount(NotImplemented), sys.getrefcount(None), sys.getrefcount(x)
    assert abs(after[0] - before[0]) < 50 and abs(after[1] - before[1]) < 50
    assert after[2] == before[2]


# -- the layout probe


class _SwappedFields(ctypes.Structure):
    """``_ArrayFields`` with ``nd`` and ``flags`` swapped: a layout that must not pass."""
    _fields_ = [(name, cpu_abi._ArrayFields._fields_[k][1]) for name, k in
                [("head", 0), ("data", 1), ("flags", 2), ("dimensions", 3), ("strides", 4),
                 ("base", 5), ("descr", 6), ("nd", 7)]]


def test_layout_probe_holds_and_catches_a_wrong_layout(monkeypatch):
    assert cpu_abi.array_layout_holds()
    monkeypatch.setattr(cpu_abi, "_ArrayFields", _SwappedFields)
    assert not cpu_abi.array_layout_holds()
    monkeypatch.undo()
    monkeypatch.setattr(cpu_abi, "_WRITEABLE", 0x800)
    assert not cpu_abi.array_layout_holds()
    monkeypatch.undo()
    monkeypatch.setattr(cpu_abi, "_TYPE_OFFSET", cpu_abi._TYPE_OFFSET - 8)
    assert not cpu_abi.array_layout_holds()


def test_failed_probe_falls_back_to_the_python_checks(monkeypatch):
    monkeypatch.setattr(cpu_abi, "NATIVE_CHECKS", False)
    spec = TensorSpec((2, 3), "float32")
    kernel = load_kernel(fused_elementwise(E.input(0) * 2.0 + E.input(1), [spec, spec],
                                           name="scale_add"))
    assert kernel._checked_fn is None and kernel._fast
    x, y = _xy()
    np.testing.assert_array_equal(kernel(x, y)[0], x * 2 + y)
    out = np.empty_like(x)
    assert kernel(x, y, out=[out])[0] is out
    np.testing.assert_array_equal(out, x * 2 + y)
    with pytest.raises(CpuKernelError, match="input 1 must be float32 of shape"):
        kernel(x, y.astype(np.float64))
    with pytest.raises(CpuKernelError, match="overlaps"):
        kernel(x, y, out=[x])
