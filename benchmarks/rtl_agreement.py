"""Simulator vs RTL (Verilator): cycle agreement, bit-exactness and RTL simulation speed.

Three parts, each printing a table:

1. the instruction-level suite (tests/sim/test_sim_semantics.py) on the ``pynq``
   preset through Verilator: per program, simulator and RTL cycles;
2. a 256x256x256 int8 GEMM (the blocked kernel, 2 virtual threads) on
   ``pynq``: bit-exactness, cycles, and RTL simulation speed in cycles/s;
3. compiled ResNet-18 layers (the compiler's double-buffered programs, GEMM
   and ALU units overlapped) on ``pynq``: bit-exactness and cycles;
4. the differential fuzzer on ``tiny`` with many more programs than the test run;
5. with ``--speed``: RTL simulation speed on ``pynq`` -- the time a fresh process takes to
   open the cached model, and cycles/s on the GEMM and compiled layers (medians of
   repeated runs, CPU time, the steadier figure on a shared machine: of the stepping loop,
   and of the whole run with its power-on reset and DRAM image), with, interleaved in the
   same process, the model evaluated at every falling edge and the model g++ builds
   (``--baseline-cxx``).

Usage: python benchmarks/rtl_agreement.py [--fuzz N] [--skip-suite] [--skip-gemm] [--layers C4,C7]
       python benchmarks/rtl_agreement.py --speed [--repeat 5] [--baseline-cxx g++]
       (the speed table only)
The first run builds the Verilator models (minutes for pynq; cached afterwards).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tessera.config import PRESETS  # noqa: E402
from tessera.hw.harness.rtlsim import RtlSim, run_program  # noqa: E402
from tessera.kernels.gemm import gemm_program  # noqa: E402
from tessera.sim import simulate  # noqa: E402

TOLERANCE = 0.02


def _agrees(sim_cycles: int, rtl_cycles: int, contended: bool) -> bool:
    if contended:
        return abs(rtl_cycles - sim_cycles) <= TOLERANCE * sim_cycles
    return rtl_cycles == sim_cycles


def suite_on(config_name: str) -> bool:
    """Run the instruction-level suite with the rtl backend on ``config_name``."""
    print(f"\n== instruction-level suite on {config_name!r}: simulator vs RTL (Verilator) ==")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        env = dict(os.environ, TESSERA_RTL_CONFIGS=config_name, TESSERA_RTL_REPORT=str(report))
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "tests/sim/test_sim_semantics.py", "-k", f"rtl and {config_name}"],
            cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        rows = [json.loads(line) for line in report.read_text().splitlines()] \
            if report.exists() else []
    print(f"{'program':<62}{'insns':>6}{'sim':>9}{'rtl':>9}{'diff':>8}  contended  dram")
    for r in rows:
        diff = (r["rtl_cycles"] - r["sim_cycles"]) / r["sim_cycles"]
        name = r["test"].split("::")[-1]
        print(f"{name[:61]:<62}{r['instructions']:>6}{r['sim_cycles']:>9}{r['rtl_cycles']:>9}"
              f"{diff:>+8.2%}  {'yes' if r['contended'] else 'no':<9}  "
              f"{'equal' if r['dram_equal'] else 'DIFFERS'}")
    exact = sum(r["rtl_cycles"] == r["sim_cycles"] for r in rows)
    worst = max((abs(r["rtl_cycles"] - r["sim_cycles"]) / r["sim_cycles"] for r in rows),
                default=0.0)
    ok = proc.returncode == 0 and all(
        r["dram_equal"] and _agrees(r["sim_cycles"], r["rtl_cycles"], r["contended"]) for r in rows)
    print(f"{len(rows)} programs, {exact} with identical cycle counts, worst difference "
          f"{worst:.2%}; pytest {'passed' if proc.returncode == 0 else 'FAILED'} "
          f"({wall:.0f} s including the build)")
    if proc.returncode != 0:
        print(proc.stdout[-3000:])
    return ok


def _sim_vs_rtl(program) -> tuple[dict, bool]:
    """Run ``program`` on the simulator and on a fresh Verilator model; a table row."""
    t0 = time.perf_counter()
    sim = simulate(program)
    sim_wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = RtlSim(program.config, dram_bytes=program.dram_image().size + (1 << 16))
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    rtl = run_program(program, model)
    rtl_wall = time.perf_counter() - t0
    exact = bool(np.array_equal(rtl.dram, sim.dram)) and rtl.error == 0
    row = {"sim": sim.stats.cycles, "sim_wall": sim_wall, "rtl": rtl.cycles,
           "rtl_wall": rtl_wall, "rtl_rate": rtl.sim_cycles / rtl_wall, "build": build,
           "diff": (rtl.cycles - sim.stats.cycles) / sim.stats.cycles,
           "contended": sim.stats.dram_contended, "exact": exact,
           "insns": len(program.instructions)}
    return row, exact and _agrees(sim.stats.cycles, rtl.cycles, sim.stats.dram_contended)


def gemm_on(config_name: str, size: int = 256) -> bool:
    config = PRESETS[config_name]
    print(f"\n== {size}x{size}x{size} int8 GEMM on {config_name!r}, 2 virtual threads ==")
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (size, size), dtype=np.int8)
    b = rng.integers(-128, 128, (size, size), dtype=np.int8)
    r, ok = _sim_vs_rtl(gemm_program(config, a, b, epilogue=[("SHR", 8)], threads=2))
    print(f"{'':<22}{'cycles':>10}{'wall s':>9}{'cycles/s':>12}")
    print(f"{'simulator':<22}{r['sim']:>10}{r['sim_wall']:>9.2f}{r['sim'] / r['sim_wall']:>12,.0f}")
    print(f"{'RTL (Verilator)':<22}{r['rtl']:>10}{r['rtl_wall']:>9.2f}{r['rtl_rate']:>12,.0f}")
    print(f"RTL vs simulator: {r['diff']:+.3%} cycles (DRAM contended: {r['contended']}), "
          f"output {'bit-exact' if r['exact'] else 'DIFFERS'}; model load/build {r['build']:.0f} s")
    return ok


def layers_on(config_name: str, names: list[str]) -> bool:
    """Compiled ResNet-18 layers (double-buffered, GEMM and ALU overlapped) on the RTL."""
    from benchmarks.resnet_layers import layer
    from tessera.compiler import compile_ops

    config = PRESETS[config_name]
    print(f"\n== compiled ResNet-18 layers on {config_name!r}: simulator vs RTL ==")
    print(f"{'layer':<8}{'insns':>7}{'sim':>10}{'rtl':>10}{'diff':>9}  contended  "
          f"{'rtl cycles/s':>12}  dram")
    ok = True
    rng = np.random.default_rng(0)
    for name in names:
        op, x = layer(name, rng)
        compiled = compile_ops([op], {"x": x.shape}, config, threads=2)
        r, good = _sim_vs_rtl(compiled.bind({"x": x}))
        ok &= good
        print(f"{name:<8}{r['insns']:>7}{r['sim']:>10}{r['rtl']:>10}{r['diff']:>+9.3%}  "
              f"{'yes' if r['contended'] else 'no':<9}  {r['rtl_rate']:>12,.0f}  "
              f"{'equal' if r['exact'] else 'DIFFERS'}")
    return ok


def _open_seconds(config_name: str) -> float:
    """Seconds a fresh Python process takes to open the (cached) model of ``config_name``."""
    code = ("import time; t = time.perf_counter(); from tessera.config import PRESETS; "
            "from tessera.hw.harness.rtlsim import RtlSim; "
            f"m = RtlSim(PRESETS[{config_name!r}], dram_bytes=1 << 20); "
            "assert not m.built, 'not cached'; print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.split()[-1])


def _speed_programs(config, layers: list[str]) -> dict:
    """The 256^3 GEMM and compiled ResNet-18 layers, by name."""
    from benchmarks.resnet_layers import layer
    from tessera.compiler import compile_ops

    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (256, 256), dtype=np.int8)
    b = rng.integers(-128, 128, (256, 256), dtype=np.int8)
    programs = {"GEMM 256^3": gemm_program(config, a, b, epilogue=[("SHR", 8)], threads=2)}
    for name in layers:
        op, x = layer(name, rng)
        programs[name] = compile_ops([op], {"x": x.shape}, config, threads=2).bind({"x": x})
    return programs


def speed_on(config_name: str, layers: list[str], repeat: int, baseline_cxx: str) -> bool:
    """RTL cycles/s (medians of ``repeat`` runs of :func:`run_program`) and the cached
    model's opening time, against the acceptance figures of issue 20. Interleaved in the
    same process, the same model evaluated at every falling edge (``settle every``) and
    the model built by ``baseline_cxx`` (``''``: none): ratios of CPU-time medians."""
    config = PRESETS[config_name]
    print(f"\n== RTL simulation speed on {config_name!r} (medians of {repeat} runs) ==")
    RtlSim(config, quiet=False, dram_bytes=1 << 20).close()     # build once if needed
    opened = statistics.median(_open_seconds(config_name) for _ in range(3))
    print(f"cached model opens in {opened:.2f} s in a fresh process (target < 2 s)")
    programs = _speed_programs(config, layers)
    size = max(p.dram_image().size for p in programs.values()) + (1 << 16)
    ok = opened < 2.0
    models = {"": RtlSim(config, dram_bytes=size, quiet=True)}
    if baseline_cxx:
        models[baseline_cxx] = RtlSim(config, dram_bytes=size, quiet=False, cxx=baseline_cxx)
    print(f"model: {models[''].library.parent.name} ({_compiler(models[''])}); baseline: "
          + (f"{_compiler(models[baseline_cxx])}" if baseline_cxx else "none"))
    print(f"{'program':<12}{'sim cycles':>11}{'rtl cycles':>11}{'sim c/s':>12}{'rtl c/s':>10}"
          f"{'per run':>10}{'settled':>9}{'x every':>9}{'x base':>8}  agreement")
    stepping = {key: _time_stepping(m) for key, m in models.items()}
    try:
        for name, program in programs.items():
            ok &= _speed_row(name, program, models, stepping, repeat)
    finally:
        for model in models.values():
            model.close()
    print("(acceptance: >= 500,000 RTL cycles/s on pynq, goal 1,000,000. CPU time. rtl c/s: "
          "the stepping loop; per run: all of run_program, with its power-on reset and DRAM "
          "image; settled: cycles that evaluate the falling edge; x every: rtl c/s over "
          "settling every cycle; x base: over the baseline compiler's model)")
    return ok


def _compiler(model: RtlSim) -> str:
    """The compiler a model was built with, from its build record."""
    record = json.loads((model.library.parent / "build.json").read_text())
    return record.get("toolchain", {}).get("cxx", "?")


def _time_stepping(model: RtlSim) -> list[float]:
    """Record the CPU seconds of each ``run_until_interrupt`` of ``model``: the stepping
    loop, without what :func:`run_program` adds per run (the power-on reset, the DRAM
    image in and out, register reads: ~1 ms of a 56 ms C4 run on ``pynq``)."""
    spent: list[float] = []
    step = model.run_until_interrupt

    def timed(max_cycles: int) -> int:
        c0 = time.process_time()
        try:
            return step(max_cycles)
        finally:
            spent.append(time.process_time() - c0)

    model.run_until_interrupt = timed
    return spent


def _speed_row(name: str, program, models: dict[str, RtlSim], stepping: dict[str, list[float]],
               repeat: int) -> bool:
    """One row of the speed table: the simulator's rate, then ``repeat`` interleaved runs of
    the default model (key ``''``), the same settling every cycle, and the baseline
    compiler's model (the other key, if any); ``stepping`` from :func:`_time_stepping`."""
    t0 = time.perf_counter()
    sim = simulate(program)
    sim_rate = sim.stats.cycles / (time.perf_counter() - t0)
    variants = {"default": ("", False), "every": ("", True)}
    variants.update({"base": (key, False) for key in models if key})
    step: dict[str, list[float]] = {v: [] for v in variants}
    whole: list[float] = []
    results = {}
    for _ in range(repeat):
        for v, (key, every) in variants.items():
            models[key].settle_every_cycle(every)
            c0 = time.process_time()
            results[v] = r = run_program(program, models[key])
            step[v].append(r.sim_cycles / max(stepping[key][-1], 1e-9))
            if v == "default":
                whole.append(r.sim_cycles / max(time.process_time() - c0, 1e-9))
                settled = models[key].settled_cycles / max(models[key].cycle, 1)
    models[""].settle_every_cycle(False)
    rtl = results["default"]
    good = (all(np.array_equal(r.dram, sim.dram) and r.error == 0 and r.cycles == rtl.cycles
                for r in results.values())
            and _agrees(sim.stats.cycles, rtl.cycles, sim.stats.dram_contended))
    verdict = ("DIFFERS" if not good else "exact" if rtl.cycles == sim.stats.cycles
               else f"{(rtl.cycles - sim.stats.cycles) / sim.stats.cycles:+.3%}, contended")
    rate = statistics.median(step["default"])
    base = f"{rate / statistics.median(step['base']):>8.2f}" if "base" in step else f"{'-':>8}"
    print(f"{name:<12}{sim.stats.cycles:>11}{rtl.cycles:>11}{sim_rate:>12,.0f}{rate:>10,.0f}"
          f"{statistics.median(whole):>10,.0f}{settled:>9.0%}"
          f"{rate / statistics.median(step['every']):>9.2f}{base}  {verdict}")
    return bool(good)


def fuzz_on(config_name: str, count: int) -> bool:
    from tests.fuzz_programs import random_program

    config = PRESETS[config_name]
    print(f"\n== differential fuzzer on {config_name!r}: {count} random programs ==")
    stats = {"exact": 0, "contended": 0, "worst": 0.0, "bad": []}
    t0 = time.perf_counter()
    for seed in range(count):
        program, sim = random_program(config, seed)
        with RtlSim(config, dram_bytes=program.dram_image().size + (1 << 16), quiet=True) as m:
            rtl = run_program(program, m)
        same = bool(np.array_equal(rtl.dram, sim.dram)) and rtl.error == 0
        d = abs(rtl.cycles - sim.stats.cycles) / sim.stats.cycles
        stats["exact"] += rtl.cycles == sim.stats.cycles
        stats["contended"] += sim.stats.dram_contended
        stats["worst"] = max(stats["worst"], d)
        if not (same and _agrees(sim.stats.cycles, rtl.cycles, sim.stats.dram_contended)):
            stats["bad"].append(seed)
    wall = time.perf_counter() - t0
    print(f"{'programs':<28}{count:>8}")
    print(f"{'DRAM contended':<28}{stats['contended']:>8}")
    print(f"{'identical cycle counts':<28}{stats['exact']:>8}")
    print(f"{'worst cycle difference':<28}{stats['worst']:>8.2%}")
    print(f"{'disagreeing seeds':<28}{len(stats['bad']):>8}  {stats['bad'][:10]}")
    print(f"({wall:.0f} s)")
    return not stats["bad"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="pynq", help="config of the suite and the GEMM")
    ap.add_argument("--fuzz", type=int, default=1000, help="fuzzer programs on tiny")
    ap.add_argument("--skip-suite", action="store_true")
    ap.add_argument("--skip-gemm", action="store_true")
    ap.add_argument("--layers", default="C4,C7,C10",
                    help="compiled ResNet-18 layers to compare ('' for none)")
    ap.add_argument("--speed", action="store_true",
                    help="only the RTL speed table (cached open time, cycles/s)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per program of --speed")
    ap.add_argument("--baseline-cxx", default="g++" if shutil.which("g++") else "",
                    help="--speed: also time the model this C++ compiler builds ('' for none)")
    args = ap.parse_args()
    if args.speed:
        ok = speed_on(args.config, [n for n in args.layers.split(",") if n], args.repeat,
                      args.baseline_cxx)
        print("\nspeed table done" if ok else "\nSPEED TABLE: a check failed, see above")
        return 0 if ok else 1
    ok = True
    if not args.skip_suite:
        ok &= suite_on(args.config)
    if not args.skip_gemm:
        ok &= gemm_on(args.config)
    if args.layers:
        ok &= layers_on(args.config, args.layers.split(","))
    if args.fuzz:
        ok &= fuzz_on("tiny", args.fuzz)
    print("\nall agree" if ok else "\nDISAGREEMENT: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
