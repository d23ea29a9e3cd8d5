"""CPU kernels compiled ahead of time into the .tsr (tessera.runtime.aot): a loaded model
runs its first inference without the JIT on a host its objects are for; the boards'
objects are ELF objects for their CPUs; files without objects, objects this host cannot
run and damaged objects fall back to the JIT."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import tessera
from tessera.compiler import zoo
from tessera.compiler.cpu.kernel import CpuKernel
from tessera.compiler.cpu.objects import CpuObjects, attach_cpu_objects, cpu_objects
from tessera.errors import CLI, CpuKernelError
from tessera.hostmodel import get_host_model
from tessera.modelfile import ModelFile
from tessera.runtime import cpu_abi
from tessera.runtime.aot import prebuild, prebuilt_module, resolve_targets
from tessera.runtime.cpu import load_kernel
from tessera.runtime.jit import (PORTABLE_X86, CpuTarget, Jit, board_target, check_object,
                                 get_jit, host_target)

#: ELF e_machine values: ARM, AArch64, x86-64.
EM_ARM, EM_AARCH64, EM_X86_64 = 40, 183, 62
#: ARM ELF e_flags: EABI version 5.
EF_ARM_EABI_VER5 = 0x05000000
#: The ARM build attribute saying float arguments travel in VFP registers (hard float).
TAG_ABI_VFP_ARGS = 28


def _uleb(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _arm_attributes(obj: bytes) -> dict[int, int | bytes]:
    """The file-scope build attributes of a 32-bit ARM ELF object (``.ARM.attributes``)."""
    shoff, = struct.unpack_from("<I", obj, 32)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", obj, 46)
    sections = [struct.unpack_from("<IIIIII", obj, shoff + i * shentsize)
                for i in range(shnum)]
    names = sections[shstrndx][4]
    for name, _, _, _, offset, size in sections:
        if obj[names + name:obj.index(b"\0", names + name)] == b".ARM.attributes":
            data = obj[offset:offset + size]
            break
    else:
        raise AssertionError("no .ARM.attributes section")
    assert data[:1] == b"A" and data[5:11] == b"aeabi\0" and data[11] == 1   # Tag_File
    at, end, tags = 16, 11 + struct.unpack_from("<I", data, 12)[0], {}
    while at < end:
        tag, at = _uleb(data, at)
        if tag in (4, 5, 67) or (tag > 32 and tag % 2):   # NTBS-valued tags
            stop = data.index(b"\0", at)
            tags[tag], at = data[at:stop], stop + 1
        else:
            tags[tag], at = _uleb(data, at)
    return tags


def _elf_header(obj: bytes) -> dict:
    elf_class = obj[4]
    flags_at = 36 if elf_class == 1 else 48
    return {"magic": obj[:4], "class": elf_class, "little": obj[5] == 1,
            "type": struct.unpack_from("<H", obj, 16)[0],
            "machine": struct.unpack_from("<H", obj, 18)[0],
            "flags": struct.unpack_from("<I", obj, flags_at)[0]}


@pytest.fixture(scope="module")
def mlp():
    """An MLP placed wholly on the CPU (a board CPU 100x faster than a Cortex-A9 makes
    every node cheaper there): 8 CPU kernels, some with a parallel form."""
    net = zoo.ZOO["mlp"]()
    model = tessera.compile(net, "pynq", calibration=zoo.calibration_data(net),
                            host=get_host_model("cortex-a9").scaled(0.01))
    feed = zoo.calibration_data(net, 1, seed=7)[0]
    expected, _ = model.run(feed)          # JIT-compiled: the reference results
    return model, feed, expected


def _kernels(model):
    return [s.kernel for s in model.compiled.steps if getattr(s, "kernel", None) is not None]


@pytest.fixture(scope="module")
def saved(mlp, tmp_path_factory):
    """The MLP with objects for this host and the pynq boards' Cortex-A9, saved."""
    model, _, _ = mlp
    prebuild(model.compiled, ("host", "board", "zcu104"))
    return model.save(tmp_path_factory.mktemp("aot") / "mlp.tsr")


_FRESH_RUN = """
import sys
import numpy as np
import tessera
from tessera.runtime import jit

def refuse(*args, **kwargs):
    raise AssertionError("the JIT was called")

jit.Jit.compile = jit.Jit.emit_object = jit.Jit.optimize = refuse
model = tessera.load(sys.argv[1])
out, _ = model.run(np.load(sys.argv[2]))
np.save(sys.argv[3], out["logits"])
print(jit.get_jit().objects_loaded)
"""


def test_a_loaded_model_runs_its_first_inference_without_the_jit(mlp, saved, tmp_path):
    model, feed, expected = mlp
    np.save(tmp_path / "x.npy", feed["input"])
    env = {**os.environ, "TESSERA_CACHE": str(tmp_path / "cold-cache")}
    done = subprocess.run([sys.executable, "-c", _FRESH_RUN, str(saved),
                           str(tmp_path / "x.npy"), str(tmp_path / "out.npy")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len({id(k) for k in _kernels(model)})
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected["logits"])


def test_objects_load_in_process_with_the_parallel_form_and_the_checks(mlp, saved):
    _, feed, expected = mlp
    loaded = tessera.load(saved)
    for kernel in _kernels(loaded):
        assert prebuilt_module(kernel) is not None
    out, _ = loaded.run(feed)
    np.testing.assert_array_equal(out["logits"], expected["logits"])
    # Loaded once per process: a second copy of the model reuses the engines.
    before = get_jit().objects_loaded
    again, _ = tessera.load(saved).run(feed)
    assert get_jit().objects_loaded == before
    np.testing.assert_array_equal(again["logits"], expected["logits"])
    parallel = next(k for k in _kernels(loaded) if k.parallel > 1)
    fast = load_kernel(parallel)
    args = [np.random.default_rng(0).integers(-100, 100, s.shape).astype(s.numpy_dtype)
            for s in parallel.inputs]
    one, = fast(*args, threads=1)
    two, = fast(*args, threads=2)
    np.testing.assert_array_equal(one, two)
    if cpu_abi.NATIVE_CHECKS:
        # The compiled argument checks refuse a wrong dtype (the Python path then raises).
        with pytest.raises(CpuKernelError, match="must be"):
            fast(*[a.astype(np.float64) for a in args])


def test_without_the_fast_call_objects_are_called_through_ctypes(mlp, saved, monkeypatch):
    _, feed, expected = mlp
    monkeypatch.setattr(cpu_abi, "FAST_CALL", False)
    monkeypatch.setattr(Jit, "compile", lambda self, ir: pytest.fail("the JIT was called"))
    out, _ = tessera.load(saved).run(feed)
    np.testing.assert_array_equal(out["logits"], expected["logits"])


def test_the_file_holds_board_objects_for_their_cpus(mlp, saved):
    mf = ModelFile.load(saved)
    targets = mf.manifest["cpu_targets"]
    assert set(targets) == {host_target().name, "arm-cortex-a9", "aarch64-cortex-a53"}
    assert host_target().name.startswith(f"x86_64-{host_target().cpu}-") or \
        not host_target().triple.startswith("x86_64")
    by_target = {}
    for name, blob in mf.blobs.items():
        if name.startswith("cpuobj."):
            by_target.setdefault(name.rsplit(".", 1)[1], []).append(_elf_header(blob))
    kernels = {id(k) for k in _kernels(mlp[0])}
    assert all(len(headers) == len(kernels) for headers in by_target.values())
    for header in by_target["arm-cortex-a9"]:
        assert header["magic"] == b"\x7fELF" and header["class"] == 1 and header["little"]
        assert header["type"] == 1 and header["machine"] == EM_ARM
        assert header["flags"] & EF_ARM_EABI_VER5
    for name, blob in mf.blobs.items():
        if name.endswith(".arm-cortex-a9"):
            assert _arm_attributes(blob)[TAG_ABI_VFP_ARGS] == 1
    for header in by_target["aarch64-cortex-a53"]:
        assert (header["class"], header["type"], header["machine"]) == (2, 1, EM_AARCH64)
    assert targets["arm-cortex-a9"]["triple"] == "armv7-unknown-linux-gnueabihf"
    assert targets["arm-cortex-a9"]["abi"] == {"pointer": 4, "object_head": 8}


@pytest.mark.skipif(not cpu_abi.NATIVE_CHECKS, reason="the JIT builds a smaller module")
def test_host_objects_are_the_jits_own(mlp, tmp_path):
    # An object emitted for this host is what the JIT compiles here, under the same disk
    # cache key: prebuilding fills the JIT's cache, and a JIT-warm cache fills prebuild.
    kernel = _kernels(mlp[0])[0]
    Jit(tmp_path).object_for(cpu_abi.module_ir(kernel), host_target())
    jit = Jit(tmp_path)
    jit.compile(cpu_abi.module_ir(kernel, fast=cpu_abi.FAST_CALL, checked=True))
    assert jit.stats == {"memory_hits": 0, "disk_hits": 1, "compiled": 0}


def test_board_targets_follow_the_config_part():
    assert resolve_targets(["board"], tessera.get_config("pynq")) == [board_target("pynq-z1")]
    assert resolve_targets(["board"], tessera.get_config("zcu104")) == [board_target("zcu104")]
    assert board_target("pynq-z2") == board_target("pynq-z1")
    assert resolve_targets(["none"]) == []
    with pytest.raises(CpuKernelError, match="unknown CPU target 'sparc'") as err:
        resolve_targets(["sparc"])
    assert "--cpu-targets" in err.value.describe(CLI) and "zcu104" in err.value.describe(CLI)


def test_only_objects_this_host_can_run_are_loaded():
    here = host_target()
    assert here.runs_here() and here.exactly_here()
    assert not board_target("pynq-z1").runs_here() and not board_target("zcu104").runs_here()
    missing = CpuTarget(here.name, here.triple, here.cpu, here.features,
                        (*here.requires, "no-such-feature"), here.abi, True)
    assert not missing.runs_here()
    assert PORTABLE_X86.runs_here() == (here.triple.startswith("x86_64")
                                        and set(PORTABLE_X86.requires) <= set(here.requires))
    assert CpuTarget.from_dict(here.to_dict()) == here


def test_an_object_for_another_machine_never_reaches_llvm(saved):
    mf = ModelFile.load(saved)
    arm = next(b for n, b in mf.blobs.items() if n.endswith(".arm-cortex-a9"))
    with pytest.raises(CpuKernelError, match="machine 40"):
        check_object(arm)
    with pytest.raises(CpuKernelError, match="not an ELF object"):
        check_object(b"garbage" * 10)


def test_a_file_without_objects_loads_and_jits(mlp, saved, tmp_path):
    _, feed, expected = mlp
    mf = ModelFile.load(saved)
    mf.manifest.pop("cpu_targets")
    mf.blobs = {n: b for n, b in mf.blobs.items() if not n.startswith("cpuobj.")}
    mf.save(tmp_path / "old.tsr")
    old = tessera.load(tmp_path / "old.tsr")
    assert all(cpu_objects(k) is None for k in _kernels(old))
    out, _ = old.run(feed)
    np.testing.assert_array_equal(out["logits"], expected["logits"])


def test_a_damaged_object_warns_and_falls_back_to_the_jit(mlp, saved, tmp_path):
    _, feed, expected = mlp
    mf = ModelFile.load(saved)
    here = host_target().name
    for name in [n for n in mf.blobs if n.endswith("." + here)]:
        mf.blobs[name] = b"\x7fELF" + bytes(60)      # intact section, not an object
    mf.save(tmp_path / "bad.tsr")
    bad = tessera.load(tmp_path / "bad.tsr")
    with pytest.warns(RuntimeWarning, match=f"object for {here} .* cannot be loaded.*"
                                            "Recompile the model"):
        out, _ = bad.run(feed)
    np.testing.assert_array_equal(out["logits"], expected["logits"])


def test_an_object_missing_a_function_falls_back_to_the_jit(mlp, tmp_path):
    # An intact object of another kernel's module: it loads, but lacks this entry.
    model, feed, expected = mlp
    ks = _kernels(model)
    other = Jit(tmp_path).object_for(cpu_abi.module_ir(ks[1]), host_target())
    kernel = CpuKernel(ks[0].name, ks[0].ir, "no.such.entry", ks[0].inputs, ks[0].outputs,
                       ks[0].parallel)
    attach_cpu_objects(kernel, CpuObjects({host_target().name: host_target().to_dict()},
                                          {host_target().name: other}))
    with pytest.warns(RuntimeWarning, match="no function 'no.such.entry'"):
        assert prebuilt_module(kernel) is None


def test_wrapper_layouts_for_32_and_64_bit_hosts():
    for name, _ in cpu_abi.ARRAY_FIELDS:
        assert cpu_abi.NATIVE.field_offset(name) == getattr(cpu_abi._ArrayFields, name).offset
    arm = cpu_abi.Abi.for_pointer_bytes(4)
    assert [arm.field_offset(n) for n, _ in cpu_abi.ARRAY_FIELDS] == [8, 12, 16, 20, 24, 28, 32]
    assert (arm.ssize_t, arm.pthread_t, arm.type_offset) == ("i32", "i32", 4)


def test_tessera_compile_writes_the_objects_it_is_asked_for(tmp_path, capsys):
    import onnx

    from tessera.cli import main
    onnx.save(zoo.ZOO["mlp"](), tmp_path / "mlp.onnx")
    common = ["compile", str(tmp_path / "mlp.onnx"), "--random-calibration", "2", "-o"]
    assert main([*common, str(tmp_path / "default.tsr")]) == 0
    assert main([*common, str(tmp_path / "a53.tsr"), "--cpu-targets", "zcu104"]) == 0
    assert main([*common, str(tmp_path / "none.tsr"), "--cpu-targets", "none"]) == 0
    assert "CPU kernels compiled for" in capsys.readouterr().out
    targets = {name: set(ModelFile.load(tmp_path / f"{name}.tsr").manifest.get("cpu_targets", ()))
               for name in ("default", "a53", "none")}
    assert targets == {"default": {host_target().name, "arm-cortex-a9"},
                       "a53": {"aarch64-cortex-a53"}, "none": set()}
