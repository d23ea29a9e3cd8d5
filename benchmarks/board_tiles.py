"""The packed float GEMM's inner loop on the boards' CPUs and the portable ``x86-64-v3``,
by LLVM's scheduling models: built from this host's IR (tiles of its vector width)
against the IR variant for the target's width that a compiled model now carries
(``CpuKernel.variants``); a target this host runs is also timed running.

Usage: python benchmarks/board_tiles.py [--shape 64x768x3072]

Per target (``tessera.runtime.jit.cpu_target("board", ...)`` of each preset, and
``"x86-64-v3"``): builds
``tessera.compiler.cpu.matmul.build_matmul`` for an ``M x K @ K x N`` float32 product at
this host's vector width and at the target's (``building_for_vector_bits``), compiles
each for the target (the objects' path: ``Jit.emit_assembly(ir, target)``), takes the basic
block with the most vector multiply-adds (the register tile's k loop) and times it with
``benchmarks/host_models.py``'s ``mca_cycles`` (``llvm-mca`` for the target's CPU; a
sequence llvm-mca cannot time is timed in halves, an instruction it cannot time at all,
such as the Cortex-A9's multi-register reloads of spilled accumulators, costs a cycle).
Prints the block's instructions, its multiply-adds, the cycles per iteration, the MACs
per cycle and the variant's speedup. A target this host runs (``x86-64-v3`` on an AVX2
or AVX-512 machine) then runs the product from its object (``runtime.aot.prebuild`` for
that target alone, ``load_kernel``), from either IR: medians of ``--repeat`` runs,
interleaved. Needs ``llvm-mca`` (Debian's ``llvm``).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tessera.compiler.cpu import TensorSpec  # noqa: E402
from tessera.compiler.cpu.lower import CpuStep  # noqa: E402
from tessera.compiler.cpu.matmul import build_matmul  # noqa: E402
from tessera.compiler.cpu.vector_width import (building_for_vector_bits,  # noqa: E402
                                               host_vector_bits)
from tessera.config import PRESETS  # noqa: E402
from tessera.runtime import aot  # noqa: E402
from tessera.runtime.cpu import load_kernel  # noqa: E402
from tessera.runtime.jit import cpu_target, get_jit  # noqa: E402
from host_models import MCA, mca_args, mca_cycles  # noqa: E402

#: A vector float32 multiply-add (ARM NEON: vmla/vfma on q registers; AArch64: fmla on
#: .4s; x86: vfmadd on xmm/ymm/zmm).
_FMA = re.compile(r"\b(vmla\.f32|vfma\.f32|fmla|vfmadd\w*ps)\b")
#: float32 lanes of an FMA's registers (ARM's q and .4s: 4).
_LANES = {"zmm": 16, "ymm": 8, "xmm": 4}
#: A branch ends a basic block (x86 j*, ARM b/b<cond>/bx/cbz, AArch64 b.<cond>/cbz/tbz/ret).
_BRANCH = re.compile(r"^(j[a-z]+|b|bl|bx|b\.?(eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le)"
                     r"|cbn?z|tbn?z|ret)$")


def fma_lanes(line: str) -> int:
    """The float32 multiply-adds of one instruction (0 unless a vector FMA)."""
    if not _FMA.search(line):
        return 0
    return next((n for reg, n in _LANES.items() if f"%{reg}" in line), 4)


def hot_block(asm: str) -> list[str]:
    """The instructions of the basic block (label or branch to branch) with the most
    vector multiply-adds: the register tile's k loop, without the tile's stores."""
    blocks, current = [], []
    for line in asm.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            blocks.append(current)
            current = []
        elif line.strip() and not line.strip().startswith((".", "@", "//", "#")):
            current.append(line)
            if _BRANCH.match(line.split()[0]):
                blocks.append(current)
                current = []
    blocks.append(current)
    return max(blocks, key=lambda b: sum(map(fma_lanes, b)))


def packed_gemm(shape: tuple[int, int, int], bits: int):
    """The packed GEMM kernel of an ``M x K @ K x N`` float32 product, tiled for ``bits``."""
    m, k, n = shape
    with building_for_vector_bits(bits):
        return build_matmul(TensorSpec((m, k), "float32"), TensorSpec((k, n), "float32"))


def measure(target, shape: tuple[int, int, int], bits: int) -> dict:
    """The hot block of the ``bits``-tiled packed GEMM compiled for ``target``, timed."""
    kernel = packed_gemm(shape, bits)
    block = hot_block(get_jit().emit_assembly(kernel.ir, target))
    macs = sum(map(fma_lanes, block))
    cycles = mca_cycles(mca_args(target), "\n".join(block))
    return {"instructions": len(block), "fmas": sum(bool(_FMA.search(x)) for x in block),
            "cycles": cycles, "macs_per_cycle": macs / cycles}


def run_here(target, shape: tuple[int, int, int], widths: list[int],
             repeat: int) -> dict[int, float]:
    """Median seconds of the product run here from ``target``'s object compiled from
    each width's IR (the host's IR as the kernel's own, the other as its variant)."""
    m, k, n = shape
    host = packed_gemm(shape, host_vector_bits())
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    loaded = {}
    for bits in widths:
        kernel = replace(host, variants=() if bits == host_vector_bits()
                         else ((bits, packed_gemm(shape, bits).ir),))
        step = CpuStep("mm", "MatMul", kernel, ("a", "b"), ("y",), {}, None)
        aot.prebuild(SimpleNamespace(steps=[step], config=PRESETS["pynq"]), (target,))
        assert aot.prebuilt_module(kernel) is not None, "the object was not loaded"
        loaded[bits] = load_kernel(kernel)
        np.testing.assert_allclose(loaded[bits](a, b)[0], a @ b, rtol=1e-3, atol=1e-3)
    seconds: dict[int, list[float]] = {bits: [] for bits in loaded}
    for _ in range(repeat):
        for bits, fn in loaded.items():
            t0 = time.perf_counter()
            fn(a, b)
            seconds[bits].append(time.perf_counter() - t0)
    return {bits: statistics.median(t) for bits, t in seconds.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="64x768x3072", help="M x K x N of the product")
    ap.add_argument("--repeat", type=int, default=15, help="runs per IR of a target run here")
    args = ap.parse_args()
    if not Path(MCA).is_file():
        print(f"{MCA} is missing (Debian: apt install llvm)")
        return 1
    shape = tuple(int(d) for d in args.shape.split("x"))
    targets = {t.name: t for c in PRESETS.values()
               for t in (*cpu_target("board", c), *cpu_target("x86-64-v3", c))}
    host = host_vector_bits()
    print(f"packed GEMM {args.shape} float32, inner block by llvm-mca; this host's vectors: "
          f"{host} bits")
    print(f"{'CPU':<20}{'IR tiles':>9}{'instr':>7}{'FMAs':>6}{'cycles':>9}"
          f"{'MAC/cycle':>11}{'speedup':>9}")
    for target in targets.values():
        rows = {bits: measure(target, shape, bits)
                for bits in dict.fromkeys((host, target.vector_bits))}
        for bits, r in rows.items():
            gain = r["macs_per_cycle"] / rows[host]["macs_per_cycle"]
            print(f"{target.cpu:<20}{bits:>6}-bit{r['instructions']:>7}{r['fmas']:>6}"
                  f"{r['cycles']:>9.1f}{r['macs_per_cycle']:>11.2f}"
                  f"{gain:>8.2f}x")
    for target in targets.values():
        if not target.runs_here() or target.vector_bits == host:
            continue
        widths = [host, target.vector_bits]
        secs = run_here(target, shape, widths, args.repeat)
        flops = 2 * shape[0] * shape[1] * shape[2]
        print(f"\n{target.cpu} objects run here (medians of {args.repeat}): "
              + ", ".join(f"{bits}-bit IR {secs[bits] * 1e3:.2f} ms "
                          f"({flops / secs[bits] / 1e9:.1f} GFLOP/s)" for bits in widths)
              + f"; {secs[host] / secs[target.vector_bits]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
