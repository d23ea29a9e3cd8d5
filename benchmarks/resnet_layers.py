"""ResNet-18 conv layers C1-C11 compiled by tessera.compiler and run on the simulator.

Usage: python benchmarks/resnet_layers.py [--config pynq] [--layers C1,C2,...] [--no-check]

Each layer (shapes from the spec's references.md) gets a bias + per-channel
requantize + ReLU epilogue (onnxruntime's QLinearConv output stage, bit-exact
REQUANT). For every layer it prints the MACs, the roofline bound (compute vs
DRAM, see tessera.compiler.accel.roofline), the simulated cycles and cycles/bound
with two virtual threads and with one (no latency hiding), the minimum work of
the busier compute unit for the lowering (GEMM unit: GEMM operations; ALU
unit: rows x initiation interval of the bias init and the epilogue, which run
beside the GEMMs with two threads) and the compile time. Outputs are checked
bit-exactly against the numpy reference of tessera.compiler.golden.operators
(--no-check skips it).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from tessera.compiler import Conv2d, compile_ops, conv_roofline, requantize
from tessera.compiler.golden.operators import run_reference
from tessera.config import get_config
from tessera.isa import ALU_OPS, Alu, Gemm
from tessera.sim import simulate

#: name: (H=W, in channels, out channels, kernel, padding, stride) -- references.md.
LAYERS = {
    "C1": (224, 3, 64, 7, 3, 2), "C2": (56, 64, 64, 3, 1, 1), "C3": (56, 64, 128, 3, 1, 2),
    "C4": (56, 64, 128, 1, 0, 2), "C5": (28, 128, 128, 3, 1, 1), "C6": (28, 128, 256, 3, 1, 2),
    "C7": (28, 128, 256, 1, 0, 2), "C8": (14, 256, 256, 3, 1, 1), "C9": (14, 256, 512, 3, 1, 2),
    "C10": (14, 256, 512, 1, 0, 2), "C11": (7, 512, 512, 3, 1, 1),
}


def layer(name: str, rng: np.random.Generator) -> tuple[Conv2d, np.ndarray]:
    hw, ic, oc, k, pad, stride = LAYERS[name]
    w = rng.integers(-64, 64, (oc, ic, k, k), dtype=np.int8)
    x = rng.integers(-128, 128, (1, ic, hw, hw), dtype=np.int8)
    bias = rng.integers(-20000, 20000, oc)
    # Scales that keep the outputs spread over the int8 range.
    fan_in = ic * k * k
    scale = (rng.uniform(0.5, 1.5, oc) * 8 / (64 * 128 * np.sqrt(fan_in) / 4)).astype(np.float32)
    op = Conv2d(name, "x", "y", w, stride=stride, padding=pad,
                epilogue=requantize(scale, relu=True, bias=bias))
    return op, x


def unit_work(program) -> tuple[int, int]:
    """Cycles of each compute unit at its operations' initiation intervals (no drains):
    GEMM operations on the GEMM unit, ALU rows x ii on the ALU unit."""
    gemm = alu = 0
    for insn in program.instructions:
        if isinstance(insn, Gemm):
            gemm += insn.op_count
        elif isinstance(insn, Alu):
            ii = 1 if insn.reset else ALU_OPS.get(insn.alu_op).timing.ii(insn.use_imm)
            alu += insn.op_count * ii
    return gemm, alu


def compute_work(program) -> int:
    """Cycles of the busier compute unit (:func:`unit_work`)."""
    return max(unit_work(program))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="pynq")
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--no-check", action="store_true", help="skip the numpy bit-exact check")
    args = ap.parse_args()
    config = get_config(args.config)
    names = [n.strip() for n in args.layers.split(",") if n.strip()]
    print(f"ResNet-18 layers on config {config.name!r} ({config.batch}x{config.block_in}x"
          f"{config.block_out}, {config.peak_macs_per_cycle} MAC/cycle, {config.bus_bytes} B/cycle "
          f"per port, {config.ddr_bytes_per_cycle:g} B/cycle DDR), bias + requantize + ReLU")
    header = (f"{'layer':<6}{'MACs':>12}{'bound':>10}{'by':>8}{'2 threads':>11}{'x bound':>9}"
              f"{'1 thread':>11}{'x bound':>9}{'gain':>7}{'work/bnd':>10}{'compile s':>11}"
              f"{'exact':>7}")
    print(header)
    print("-" * len(header))
    total_compile = 0.0
    rng = np.random.default_rng(0)
    plans = []
    for name in names:
        op, x = layer(name, rng)
        roof = conv_roofline(op, x.shape, config)
        row = {}
        for threads in (2, 1):
            t0 = time.perf_counter()
            compiled = compile_ops([op], {"x": x.shape}, config, threads=threads)
            secs = time.perf_counter() - t0
            result = simulate(compiled.bind({"x": x}))
            row[threads] = (compiled, result, secs)
        compiled, result, secs = row[2]
        total_compile += secs
        exact = "-"
        if not args.no_check:
            ref = run_reference([op], {"x": x}, config.out_width)["y"]
            ok = all(np.array_equal(c.read(r, "y"), ref) for c, r, _ in row.values())
            exact = "yes" if ok else "NO"
        c2, c1 = row[2][1].stats.cycles, row[1][1].stats.cycles
        work = compute_work(compiled.program)
        print(f"{name:<6}{roof.macs:>12,}{roof.bound:>10,.0f}{roof.limit:>8}{c2:>11,}"
              f"{c2 / roof.bound:>9.3f}{c1:>11,}{c1 / roof.bound:>9.3f}{c1 / c2:>6.2f}x"
              f"{work / roof.bound:>10.3f}{secs:>11.2f}{exact:>7}")
        plans.append((name, compiled.plans[name].describe(config),
                      ", ".join(compiled.device_inputs)))
    print(f"\ncompile time, all {len(names)} layers (2 threads): {total_compile:.2f} s")
    print("\ntilings (2 threads):")
    for name, plan, inputs in plans:
        print(f"  {name:<5}{plan}" + (f"  [device input {inputs}: kernel positions packed]"
                                      if name == "C1" else ""))


if __name__ == "__main__":
    main()
