"""256x256x256 int8 GEMM on the simulator: wall time, cycles and GEMM utilisation.

Usage: python benchmarks/gemm.py [--config pynq] [--size 256] [--repeat 3]

Prints one row per variant: one virtual thread (serialised), two virtual
threads, and two threads with a SHR requantization epilogue; the speed-up
column is against the one-thread run of the same process.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from tessera.config import get_config
from tessera.kernels.gemm import gemm_program, plan_gemm, read_result, reference_gemm
from tessera.sim import simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="pynq")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant; best wall time shown")
    args = ap.parse_args()
    config = get_config(args.config)
    m = n = k = args.size
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    variants = [("1 thread", 1, []), ("2 threads", 2, []), ("2 threads + SHR 8", 2, [("SHR", 8)])]
    print(f"int8 GEMM {m}x{n}x{k} on config {config.name!r} "
          f"({config.batch}x{config.block_in}x{config.block_out}, {config.clock_mhz:g} MHz, "
          f"{config.bus_bytes * 8}-bit ports, {config.ddr_bytes_per_cycle:g} B/cycle DDR)")
    header = (f"{'variant':<20}{'tiles':>9}{'insns':>7}{'cycles':>10}{'GEMM util':>11}"
              f"{'speed-up':>10}{'sim wall s':>12}{'bit-exact':>11}")
    print(header)
    print("-" * len(header))
    base = None
    for label, threads, epilogue in variants:
        plan = plan_gemm(config, m, n, k, threads, len(epilogue))
        program = gemm_program(config, a, b, epilogue=epilogue, threads=threads, plan=plan)
        walls = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = simulate(program)
            walls.append(time.perf_counter() - t0)
        exact = np.array_equal(read_result(config, result, program, m, n),
                               reference_gemm(config, a, b, epilogue))
        cycles = result.stats.cycles
        base = base or cycles
        tiles = f"{plan.tile_m * config.batch}x{plan.tile_n * config.block_out}"
        print(f"{label:<20}{tiles:>9}{len(program.instructions):>7}{cycles:>10,}"
              f"{100 * result.stats.gemm_utilisation:>10.1f}%{base / cycles:>9.2f}x"
              f"{min(walls):>12.3f}{'yes' if exact else 'NO':>11}")


if __name__ == "__main__":
    main()
