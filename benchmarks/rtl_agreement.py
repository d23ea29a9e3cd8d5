"""Simulator vs RTL (Verilator): cycle agreement, bit-exactness and RTL simulation speed.

Three parts, each printing a table:

1. the instruction-level suite (tests/sim/test_sim_semantics.py) on the ``pynq``
   preset through Verilator: per program, simulator and RTL cycles;
2. a 256x256x256 int8 GEMM (the blocked kernel, 2 virtual threads) on
   ``pynq``: bit-exactness, cycles, and RTL simulation speed in cycles/s;
3. compiled ResNet-18 layers (the compiler's double-buffered programs, GEMM
   and ALU units overlapped) on ``pynq``: bit-exactness and cycles;
4. the differential fuzzer on ``tiny`` with many more programs than the test run.

Usage: python benchmarks/rtl_agreement.py [--fuzz N] [--skip-suite] [--skip-gemm] [--layers C4,C7]
The first run builds the Verilator models (minutes for pynq; cached afterwards).
"""
from __future__ import annotations

import argparse
import json
import os
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
    args = ap.parse_args()
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
