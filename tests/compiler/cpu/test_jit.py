"""The llvmlite JIT, its caches, and the kernel calling convention (tessera.runtime.jit,
tessera.runtime.cpu, tessera.compiler.cpu.kernel)."""
from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

from tessera.compiler.cpu.elementwise import E, fused_elementwise
from tessera.compiler.cpu.kernel import CpuKernel, TensorSpec
from tessera.errors import CpuKernelError
from tessera.runtime import jit as jitmod
from tessera.runtime.cpu import load_kernel
from tessera.runtime.jit import Jit, get_jit, host_cpu

# A hand-written module, so these tests do not depend on the kernel builders.
AXPY_IR = """
define i32 @axpy(i32 %a, i32 %x, i32 %y) {
  %m = mul i32 %a, %x
  %s = add i32 %m, %y
  ret i32 %s
}
"""
AXPY = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)


def call_axpy(module, a, x, y):
    return AXPY(module.address("axpy"))(a, x, y)


def test_host_cpu_names_a_cpu_and_features():
    name, features = host_cpu()
    assert name and name != "generic"
    assert all(f[0] in "+-" for f in features.split(","))


def test_compiled_function_runs(tmp_path):
    jit = Jit(tmp_path)
    assert call_axpy(jit.compile(AXPY_IR), 3, 4, 5) == 17
    assert call_axpy(jit.compile(AXPY_IR), -2, 7, 1) == -13


def test_memory_cache_returns_the_same_module(tmp_path):
    jit = Jit(tmp_path)
    first = jit.compile(AXPY_IR)
    second = jit.compile(AXPY_IR)
    assert second is first
    assert jit.stats == {"memory_hits": 1, "disk_hits": 0, "compiled": 1}


def test_disk_cache_is_reused_by_a_fresh_jit(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path))
    Jit().compile(AXPY_IR)
    files = list((tmp_path / "llvm").glob("*.o"))
    assert len(files) == 1
    fresh = Jit()
    assert call_axpy(fresh.compile(AXPY_IR), 2, 3, 4) == 10
    assert fresh.stats == {"memory_hits": 0, "disk_hits": 1, "compiled": 0}


def test_different_ir_gets_a_different_cache_entry(tmp_path):
    jit = Jit(tmp_path)
    jit.compile(AXPY_IR)
    jit.compile(AXPY_IR.replace("add i32", "sub i32"))
    assert jit.stats["compiled"] == 2
    assert len(list(tmp_path.glob("*.o"))) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "empty"])
def test_corrupt_cache_file_is_ignored_and_rebuilt(tmp_path, damage):
    Jit(tmp_path).compile(AXPY_IR)
    (path,) = tmp_path.glob("*.o")
    data = path.read_bytes()
    damaged = {
        "garbage": b"\x7fELF" + b"\xff" * 200,
        "truncated": data[: len(data) // 2],
        "flipped": data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:],
        "empty": b"",
    }[damage]
    path.write_bytes(damaged)
    jit = Jit(tmp_path)
    assert call_axpy(jit.compile(AXPY_IR), 5, 5, 5) == 30
    assert jit.stats["compiled"] == 1 and jit.stats["disk_hits"] == 0
    # The rebuilt file is valid again.
    again = Jit(tmp_path)
    again.compile(AXPY_IR)
    assert again.stats["disk_hits"] == 1


def test_unwritable_cache_folder_does_not_fail_the_compile(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    jit = Jit(blocker / "llvm")
    assert call_axpy(jit.compile(AXPY_IR), 1, 1, 1) == 2


def test_invalid_ir_raises_cpu_kernel_error_with_llvm_message(tmp_path):
    with pytest.raises(CpuKernelError, match="(?s)invalid LLVM IR.*undefined value"):
        Jit(tmp_path).compile("define i32 @f() {\n  ret i32 %nope\n}\n")


def test_missing_function_raises(tmp_path):
    with pytest.raises(CpuKernelError, match="no function 'other'"):
        Jit(tmp_path).compile(AXPY_IR).address("other")


def test_get_jit_is_process_wide():
    assert get_jit() is get_jit()


def test_get_jit_caches_under_tessera_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path))
    monkeypatch.setattr(jitmod, "_jit", None)
    assert get_jit().cache_path == tmp_path / "llvm"


@pytest.mark.skipif("+avx2" not in host_cpu()[1], reason="host has no AVX2")
def test_loops_are_vectorised_for_the_host():
    spec = TensorSpec((4096,), "float32")
    kernel = fused_elementwise(E.input(0) + E.input(1), [spec, spec])
    asm = get_jit().emit_assembly(kernel.ir)
    assert "vaddps" in asm and "ymm" in asm


# -- the kernel calling convention (tessera.runtime.cpu)


@pytest.fixture(scope="module")
def scale_add():
    """out = x * 2 + y over float32 (2, 3)."""
    spec = TensorSpec((2, 3), "float32")
    return load_kernel(fused_elementwise(E.input(0) * 2.0 + E.input(1), [spec, spec],
                                         name="scale_add"))


def test_kernel_call_allocates_outputs(scale_add):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.full((2, 3), 0.5, np.float32)
    (out,) = scale_add(x, y)
    np.testing.assert_array_equal(out, x * 2 + 0.5)
    assert out.dtype == np.float32 and out.shape == (2, 3)


def test_kernel_call_writes_into_out(scale_add):
    x = np.ones((2, 3), np.float32)
    out = np.zeros((2, 3), np.float32)
    (res,) = scale_add(x, x, out=[out])
    assert res is out
    np.testing.assert_array_equal(out, np.full((2, 3), 3.0))


def test_non_contiguous_inputs_are_copied(scale_add):
    big = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = big[::2, ::2]
    y = np.asfortranarray(np.ones((2, 3), np.float32) * 7)
    (out,) = scale_add(x, y)
    np.testing.assert_array_equal(out, x * 2 + 7)


def test_wrong_dtype_names_the_argument(scale_add):
    good = np.zeros((2, 3), np.float32)
    with pytest.raises(CpuKernelError) as exc:
        scale_add(good, np.zeros((2, 3), np.float64))
    assert str(exc.value) == ("scale_add: input 1 must be float32 of shape (2, 3), "
                              "not float64 (2, 3)")


def test_wrong_shape_names_the_argument():
    kernel = load_kernel(fused_elementwise(E.input(0).exp(), [TensorSpec((1, 1000), "float32")],
                                           name="softmax(axis=-1)"))
    with pytest.raises(CpuKernelError) as exc:
        kernel(np.zeros((2, 1000), np.float64))
    assert str(exc.value) == ("softmax(axis=-1): input 0 must be float32 of shape (1, 1000), "
                              "not float64 (2, 1000)")


def test_wrong_argument_count_and_type(scale_add):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(CpuKernelError, match="takes 2 inputs, got 1"):
        scale_add(x)
    with pytest.raises(CpuKernelError, match="input 1 must be .* not list"):
        scale_add(x, [[0.0] * 3] * 2)


def test_bad_out_arrays_are_rejected(scale_add):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(CpuKernelError, match="output 0 must be float32 of shape"):
        scale_add(x, x, out=[np.zeros((3, 2), np.float32)])
    with pytest.raises(CpuKernelError, match="has 1 outputs, got 2"):
        scale_add(x, x, out=[x.copy(), x.copy()])
    with pytest.raises(CpuKernelError, match="C-contiguous"):
        scale_add(x, x, out=[np.zeros((3, 2), np.float32).T])
    with pytest.raises(CpuKernelError, match="overlaps"):
        scale_add(x, x.copy(), out=[x])


def test_kernel_round_trips_through_json(scale_add):
    record = json.loads(json.dumps(scale_add.kernel.to_dict()))
    kernel = CpuKernel.from_dict(record)
    assert kernel == scale_add.kernel
    x = np.full((2, 3), 1.5, np.float32)
    np.testing.assert_array_equal(load_kernel(kernel)(x, x)[0], np.full((2, 3), 4.5))


def test_malformed_kernel_record_raises():
    with pytest.raises(CpuKernelError, match="malformed"):
        CpuKernel.from_dict({"name": "x", "ir": ""})


def test_tensor_spec_validates_and_describes():
    spec = TensorSpec([2, 3], "int8")
    assert spec.shape == (2, 3) and spec.size == 6 and spec.nbytes == 6
    assert spec.numpy_dtype == np.int8 and str(spec.llvm_type) == "i8"
    assert TensorSpec((), "float32").size == 1
    with pytest.raises(CpuKernelError, match="float64"):
        TensorSpec((2,), "float64")
    with pytest.raises(CpuKernelError, match="negative"):
        TensorSpec((2, -1), "int32")


def test_ctypes_fallback_path_gives_the_same_results(monkeypatch):
    from tessera.runtime import cpu_abi
    monkeypatch.setattr(cpu_abi, "FAST_CALL", False)
    spec = TensorSpec((5,), "int8")
    kernel = load_kernel(fused_elementwise(E.input(0) * 3 - 1, [spec]))
    assert not kernel._fast
    x = np.array([-128, -1, 0, 5, 127], np.int8)
    np.testing.assert_array_equal(kernel(x)[0], x * np.int8(3) - np.int8(1))


def test_fast_call_keeps_reference_counts_balanced(scale_add):
    import sys
    x = np.ones((2, 3), np.float32)
    before = sys.getrefcount(None), sys.getrefcount(x)
    for _ in range(2000):
        scale_add(x, x)
    after = sys.getrefcount(None), sys.getrefcount(x)
    assert abs(after[0] - before[0]) < 50 and after[1] == before[1]
