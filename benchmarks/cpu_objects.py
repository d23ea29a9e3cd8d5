"""CPU kernels compiled ahead of time into the .tsr (``tessera.runtime.aot``): what the
objects cost at compile time and in the file, what they save at the first inference, and
how fast a portable x86-64-v3 object runs against one built for this host exactly.

    python benchmarks/cpu_objects.py [--models resnet18,resnet18-cpu,magika,common]
                                     [--repeats 21]

Per model (compiled for ``pynq``; ``resnet18-cpu`` is ResNet-18 placed wholly on the CPU,
a model of many CPU kernels; ``magika`` and ``common`` are published models, see
``tests/models/cases.py``): its distinct CPU kernels; the compile time; the time to emit
the objects per target from a cold cache (this host exactly, the pynq boards'
Cortex-A9, the zcu104's Cortex-A53, portable x86-64-v3); the .tsr size without and with
the default objects (host and board); the first load of every kernel by JIT (cold cache)
and from the objects; and the CPU kernels' run time with x86-64-v3 objects over the exact
host's (sum of per-kernel medians, one thread, calls alternating, same process).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# Every emission below starts from a cold JIT disk cache (set before the JIT exists).
os.environ["TESSERA_CACHE"] = tempfile.mkdtemp(prefix="tessera-aot-bench-")

import numpy as np  # noqa: E402

import tessera  # noqa: E402
from tessera.compiler import zoo  # noqa: E402
from tessera.compiler.cpu.objects import cpu_objects  # noqa: E402
from tessera.runtime import cpu_abi  # noqa: E402
from tessera.runtime.aot import DEFAULT_TARGETS, prebuild, resolve_targets  # noqa: E402
from tessera.runtime.cpu import _bind  # noqa: E402
from tessera.runtime.jit import PORTABLE_X86, Jit, get_jit, host_target  # noqa: E402

MODELS = ("resnet18", "resnet18-cpu", "magika", "common")
EXTRA = ("zcu104", "x86-64-v3")


def compile_model(name: str):
    if name.startswith("resnet18"):
        net = zoo.ZOO["resnet18"]()
        placement = "cpu" if name.endswith("-cpu") else "dp"
        return tessera.compile(net, "pynq", calibration=zoo.calibration_data(net, 2),
                               placement=placement)
    from tests.models.cases import MODELS as WHEELS
    case = next(c for c in WHEELS if c.name == name)
    return tessera.compile(str(case.path), "pynq", calibration=case.feeds().calibration,
                           input_shapes=dict(case.input_shapes))


def kernels(model) -> list:
    return list({id(s.kernel): s.kernel for s in model.compiled.steps
                 if getattr(s, "kernel", None) is not None}.values())


def first_loads(ks: list) -> tuple[float, float]:
    """Seconds to make every kernel callable by a cold-cache JIT, and from its objects."""
    jit = Jit(Path(tempfile.mkdtemp(prefix="tessera-aot-cold-")))
    t0 = time.perf_counter()
    for k in ks:
        jit.compile(cpu_abi.module_ir(k, fast=cpu_abi.FAST_CALL, checked=cpu_abi.NATIVE_CHECKS))
    jitted = time.perf_counter() - t0
    fresh = Jit(jit.cache_path)          # a new process's view: nothing in memory
    here = host_target().name
    t0 = time.perf_counter()
    for k in ks:
        fresh.load_object(cpu_objects(k).code[here])
    return jitted, time.perf_counter() - t0


def portable_over_exact(ks: list, repeats: int) -> float:
    """Sum over the kernels of the median time of one call (one thread, random inputs of
    their specs) with the x86-64-v3 objects, over the same with this host's exact
    objects; the two calls alternate so that both see the same machine load."""
    rng = np.random.default_rng(0)
    totals = {host_target().name: 0.0, PORTABLE_X86.name: 0.0}
    for k in ks:
        fns = {t: _bind(k, get_jit().load_object(cpu_objects(k).code[t]), 1) for t in totals}
        args = [(rng.standard_normal(s.shape) * 50).astype(s.numpy_dtype) for s in k.inputs]
        times: dict[str, list[float]] = {t: [] for t in totals}
        for _ in range(repeats + 1):
            for t, fn in fns.items():
                t0 = time.perf_counter()
                fn(*args)
                times[t].append(time.perf_counter() - t0)
        for t in totals:
            totals[t] += float(np.median(times[t][1:]))     # the first call warms up
    return totals[PORTABLE_X86.name] / totals[host_target().name]


def measure(name: str, repeats: int) -> dict:
    model = compile_model(name)
    ks = kernels(model)
    with tempfile.TemporaryDirectory() as tmp:
        bare = model.save(Path(tmp) / "bare.tsr").stat().st_size
        emit = prebuild(model.compiled, DEFAULT_TARGETS)
        with_objects = model.save(Path(tmp) / "aot.tsr").stat().st_size
    emit.update(prebuild(model.compiled, EXTRA))
    jitted, loaded = first_loads(ks)
    ratio = portable_over_exact(ks, repeats) if PORTABLE_X86.runs_here() else float("nan")
    return {"name": name, "kernels": len(ks), "compile": model.compiled.compile_seconds,
            "emit": emit, "bare": bare, "aot": with_objects, "jit": jitted, "load": loaded,
            "v3_ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args(argv)
    config = tessera.get_config("pynq")
    names = [t.name for t in resolve_targets([*DEFAULT_TARGETS, *EXTRA], config)]
    print("emit s: seconds to emit the objects for " + ", ".join(
        f"{chr(65 + i)} = {n}" for i, n in enumerate(names)) + " (cold cache)")
    print(f"{'model':<14}{'kernels':>8}{'compile s':>11}"
          + "".join(f"{'emit ' + chr(65 + i):>9}" for i in range(len(names)))
          + f"{'tsr bytes':>13}{'+objects':>10}{'JIT s':>8}{'load s':>8}{'v3/exact':>10}")
    for name in args.models.split(","):
        r = measure(name, args.repeats)
        growth = (r["aot"] - r["bare"]) / r["bare"]
        print(f"{r['name']:<14}{r['kernels']:>8}{r['compile']:>11.1f}"
              + "".join(f"{r['emit'].get(n, float('nan')):>9.2f}" for n in names)
              + f"{r['bare']:>13,}{growth:>+10.1%}{r['jit']:>8.2f}{r['load']:>8.3f}"
              + f"{r['v3_ratio']:>10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
