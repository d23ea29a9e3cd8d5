"""The packed float GEMM's inner loop on the boards' CPUs, by LLVM's scheduling models:
built from this host's IR (tiles of its vector width) against the IR variant for the
board's width that a compiled model now carries (``CpuKernel.variants``).

Usage: python benchmarks/board_tiles.py [--shape 64x768x3072]

Per board CPU (``tessera.runtime.jit.cpu_target("board", ...)`` of each preset): builds
``tessera.compiler.cpu.matmul.build_matmul`` for an ``M x K @ K x N`` float32 product at
this host's vector width and at the board's (``building_for_vector_bits``), compiles each
for the board (the objects' path: ``Jit.emit_assembly(ir, target)``), takes the basic
block with the most vector multiply-adds (the register tile's k loop) and times it with
``benchmarks/host_models.py``'s ``mca_cycles`` (``llvm-mca -mcpu=<board cpu>``; a
sequence llvm-mca cannot time is timed in halves, an instruction it cannot time at all,
such as the Cortex-A9's multi-register reloads of spilled accumulators, costs a cycle).
Prints the block's instructions, its multiply-adds, the cycles per iteration, the MACs
per cycle and the variant's speedup. Needs ``llvm-mca`` (Debian's ``llvm``).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tessera.compiler.cpu import TensorSpec  # noqa: E402
from tessera.compiler.cpu.matmul import build_matmul  # noqa: E402
from tessera.compiler.cpu.vector_width import (building_for_vector_bits,  # noqa: E402
                                               host_vector_bits)
from tessera.config import PRESETS  # noqa: E402
from tessera.runtime.jit import cpu_target, get_jit  # noqa: E402
from host_models import MCA, mca_cycles  # noqa: E402

#: A vector multiply-add of 4 float32 lanes (ARM NEON: vmla/vfma on q registers; AArch64:
#: fmla on .4s).
_FMA = re.compile(r"\b(vmla\.f32|vfma\.f32|fmla)\b")


def hot_block(asm: str) -> list[str]:
    """The instructions of the basic block with the most vector multiply-adds."""
    blocks, current = [], []
    for line in asm.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            blocks.append(current)
            current = []
        elif line.strip() and not line.strip().startswith((".", "@", "//")):
            current.append(line)
    blocks.append(current)
    return max(blocks, key=lambda b: sum(bool(_FMA.search(x)) for x in b))


def measure(target, shape: tuple[int, int, int], bits: int) -> dict:
    """The hot block of the ``bits``-tiled packed GEMM compiled for ``target``, timed."""
    m, k, n = shape
    with building_for_vector_bits(bits):
        kernel = build_matmul(TensorSpec((m, k), "float32"), TensorSpec((k, n), "float32"))
    block = hot_block(get_jit().emit_assembly(kernel.ir, target))
    fmas = sum(bool(_FMA.search(x)) for x in block)
    cpu = (f"-mtriple={target.triple}", f"-mcpu={target.cpu}", f"-mattr={target.features}")
    cycles = mca_cycles(cpu, "\n".join(block))
    return {"instructions": len(block), "fmas": fmas, "cycles": cycles,
            "macs_per_cycle": 4 * fmas / cycles}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="64x768x3072", help="M x K x N of the product")
    args = ap.parse_args()
    if not Path(MCA).is_file():
        print(f"{MCA} is missing (Debian: apt install llvm)")
        return 1
    shape = tuple(int(d) for d in args.shape.split("x"))
    targets = {t.name: t for c in PRESETS.values() for t in cpu_target("board", c)}
    host = host_vector_bits()
    print(f"packed GEMM {args.shape} float32, inner block by llvm-mca; this host's vectors: "
          f"{host} bits")
    print(f"{'board CPU':<20}{'IR tiles':>9}{'instr':>7}{'FMAs':>6}{'cycles':>9}"
          f"{'MAC/cycle':>11}{'speedup':>9}")
    for target in targets.values():
        rows = {bits: measure(target, shape, bits)
                for bits in dict.fromkeys((host, target.vector_bits))}
        for bits, r in rows.items():
            gain = r["macs_per_cycle"] / rows[host]["macs_per_cycle"]
            print(f"{target.cpu:<20}{bits:>6}-bit{r['instructions']:>7}{r['fmas']:>6}"
                  f"{r['cycles']:>9.1f}{r['macs_per_cycle']:>11.2f}"
                  f"{gain:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
