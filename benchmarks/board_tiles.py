"""The packed float GEMM's inner loop on the boards' CPUs, by LLVM's scheduling models:
built from this host's IR (tiles of its vector width) against the IR variant for the
board's width that a compiled model now carries (``CpuKernel.variants``).

Usage: python benchmarks/board_tiles.py [--shape 64x768x3072] [--iterations 100]

Per board CPU (``tessera.runtime.jit.cpu_target("board", ...)`` of each preset): builds
``tessera.compiler.cpu.matmul.build_matmul`` for an ``M x K @ K x N`` float32 product at
this host's vector width and at the board's (``building_for_vector_bits``), compiles each
for the board (the objects' path, ``Jit.optimize`` + the board's target machine), takes
the basic block with the most vector multiply-adds (the register tile's k loop) and runs
``llvm-mca -mcpu=<board cpu>`` on it. Prints the block's instructions, its multiply-adds,
the cycles per iteration and the MACs per cycle, and the variant's speedup. llvm-mca
cannot time ARM's multi-register loads and stores (``vldm``/``vstm``: the reloads of
spilled accumulators, the host tiles' on a Cortex-A9); they are dropped and counted, so
the host tile's figure is an upper bound. Needs ``llvm-mca`` on PATH (Debian's ``llvm``).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tessera.compiler.cpu import TensorSpec  # noqa: E402
from tessera.compiler.cpu.matmul import build_matmul  # noqa: E402
from tessera.compiler.cpu.sparse_layout import (building_for_vector_bits,  # noqa: E402
                                                host_vector_bits)
from tessera.config import PRESETS  # noqa: E402
from tessera.runtime.jit import _target_machine, cpu_target, get_jit  # noqa: E402

#: A vector multiply-add of 4 float32 lanes (ARM NEON: vmla/vfma on q registers; AArch64:
#: fmla on .4s).
_FMA = re.compile(r"\b(vmla\.f32|vfma\.f32|fmla)\b")
#: What llvm-mca cannot schedule on these cores (dropped, counted).
_UNTIMED = re.compile(r"\b(vldm\w*|vstm\w*|vpop|vpush|pop|push|bx|ret)\b")


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


def mca_cycles(block: list[str], target, iterations: int) -> float:
    """llvm-mca's cycles per iteration of ``block`` on ``target``'s CPU."""
    with tempfile.NamedTemporaryFile("w", suffix=".s") as f:
        f.write("\n".join(block) + "\n")
        f.flush()
        out = subprocess.run(["llvm-mca", f"-mtriple={target.triple}", f"-mcpu={target.cpu}",
                              f"-mattr={target.features}", f"-iterations={iterations}", f.name],
                             capture_output=True, text=True, check=True).stdout
    return int(re.search(r"Total Cycles:\s+(\d+)", out).group(1)) / iterations


def measure(target, shape: tuple[int, int, int], bits: int, iterations: int) -> dict:
    m, k, n = shape
    with building_for_vector_bits(bits):
        kernel = build_matmul(TensorSpec((m, k), "float32"), TensorSpec((k, n), "float32"))
    asm = _target_machine(target).emit_assembly(get_jit().optimize(kernel.ir, target))
    block = hot_block(asm)
    timed = [x for x in block if not _UNTIMED.search(x)]
    fmas = sum(bool(_FMA.search(x)) for x in block)
    cycles = mca_cycles(timed, target, iterations)
    return {"instructions": len(block), "untimed": len(block) - len(timed), "fmas": fmas,
            "cycles": cycles, "macs_per_cycle": 4 * fmas / cycles}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="64x768x3072", help="M x K x N of the product")
    ap.add_argument("--iterations", type=int, default=100)
    args = ap.parse_args()
    if shutil.which("llvm-mca") is None:
        print("llvm-mca is not on PATH (Debian: apt install llvm)")
        return 1
    shape = tuple(int(d) for d in args.shape.split("x"))
    targets = {t.name: t for c in PRESETS.values() for t in cpu_target("board", c)}
    host = host_vector_bits()
    print(f"packed GEMM {args.shape} float32, inner block by llvm-mca ({args.iterations} "
          f"iterations); this host's vectors: {host} bits")
    print(f"{'board CPU':<20}{'IR tiles':>9}{'instr':>7}{'untimed':>9}{'FMAs':>6}"
          f"{'cycles':>9}{'MAC/cycle':>11}{'speedup':>9}")
    for target in targets.values():
        rows = {bits: measure(target, shape, bits, args.iterations)
                for bits in dict.fromkeys((host, target.vector_bits))}
        for bits, r in rows.items():
            gain = r["macs_per_cycle"] / rows[host]["macs_per_cycle"]
            print(f"{target.cpu:<20}{bits:>6}-bit{r['instructions']:>7}{r['untimed']:>9}"
                  f"{r['fmas']:>6}{r['cycles']:>9.1f}{r['macs_per_cycle']:>11.2f}"
                  f"{gain:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
