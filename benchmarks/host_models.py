"""Generate the board CPUs' host cost models (``tessera/hostmodels/<cpu>.json``) from the
kernels' own code analysed for that CPU.

    python benchmarks/host_models.py [--only cortex-a9] [--out tessera/hostmodels] [--dry-run]

Method, per representative kernel call (``tessera.runtime.calibrate.representatives``,
the same set ``tessera calibrate-host`` times):

1. The kernel's LLVM IR, built for the board CPU's vector width (the IR variant its
   objects are compiled from, ``CpuKernel.ir_for``), is optimised for the board's target
   (``tessera.runtime.jit.board_target``: triple, CPU and features, the ones its objects
   are compiled for) by the runtime's own pipeline (``Jit.optimize``): the code the board
   runs.
2. Dynamic block counts: a copy of the optimised IR with a counter per basic block is
   retargeted to this machine, JIT-compiled and run on random inputs of the call's shapes.
3. Cycles per block execution: the optimised IR with an inline-asm marker at the start of
   every block is compiled to the board's assembly; each block's instructions (from its
   marker to the next one) go through ``llvm-mca -mcpu=<cpu>`` (steady state: total
   cycles / iterations, L1 hits assumed).
4. Compute time = sum over blocks of count x cycles, at the board's clock. Memory floor =
   the call's bytes / the DRAM traffic rate the CPU reaches (a published memcpy
   measurement, read + write); the modelled time is the larger (a roofline).

Per kernel kind the coefficients are fitted to the modelled times by
``tessera.runtime.calibrate.fit_kernel_cost`` (NNLS on relative errors). Launch, copy and
cache-flush figures come from published measurements (``FIGURES`` below, each with its
source). Prints a progress line per kernel, the coefficients and the per-kind check.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import llvmlite
import llvmlite.binding as llvm
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tessera.compiler.cpu.vector_width import building_for_vector_bits  # noqa: E402
from tessera.hostmodel import HostModel, Work                       # noqa: E402
from tessera.runtime.calibrate import (Representative, time_call,   # noqa: E402
                                       describe, fit_kernel_cost, representatives)
from tessera.runtime.jit import (CpuTarget, Jit, _target_machine,  # noqa: E402
                                 board_target)

MCA = "/usr/bin/llvm-mca"
MCA_ITERATIONS = 200


@dataclass(frozen=True)
class BoardCpu:
    """A board CPU: how to compile for it, analyse it, and its published figures."""

    name: str
    cpu: str
    cores: int
    hz: float
    target: CpuTarget                 # what its kernels are compiled for
    comment: str                      # the assembly's comment leader
    dram_bytes_per_second: float      # DRAM traffic (read + write) the CPU reaches
    copy_bytes_per_second: float
    flush_bytes_per_second: float
    launch_seconds: float
    #: A CPU kernel call from the runtime (Python to native): one Python MMIO access's time.
    dispatch_seconds: float
    sources: dict

    @property
    def mca_args(self) -> tuple[str, ...]:
        return mca_args(self.target)


def mca_args(target: CpuTarget) -> tuple[str, ...]:
    """llvm-mca's options for code compiled for ``target``."""
    return (f"-mtriple={target.triple}", f"-mcpu={target.cpu}",
            *([f"-mattr={target.features}"] if target.features else []))


#: PYNQ MMIO from Python: 5,600 ``MMIO.write`` calls in 150-200 ms on a PYNQ-Z1 (27-36 us
#: each, loop included): https://discuss.pynq.io/t/mmio-write-is-too-slow/389 . A segment's
#: launch as runtime/device.py does it: 3 register writes (address, count, start), at
#: least one STATUS read and two cycle-counter reads: 6 MMIO accesses.
_MMIO_A9 = 32e-6
_LAUNCH_ACCESSES = 6
#: CPU memcpy on a Zynq-7020 (Zedboard, Linux, cached buffers): ~256 MB/s copied
#: (https://github.com/bmartini/zynq-xdma/issues/10); on a Zynq UltraScale+ (Cortex-A53):
#: 800 MB/s copying a cached DMA buffer with NEON load/store-pair code
#: (https://github.com/ikwzm/udmabuf/issues/16). A copy moves each byte twice (read and write).
_A9_MEMCPY, _A53_MEMCPY = 256e6, 800e6
#: The boards' CPU clocks (the A53's MMIO, launch and dispatch figures are the A9's scaled
#: by their ratio).
_A9_HZ, _A53_HZ = 650e6, 1.2e9

FIGURES = {
    "cortex-a9": BoardCpu(
        "cortex-a9", "2x ARM Cortex-A9 at 650 MHz, NEON (PYNQ-Z1/Z2, Zynq-7020)", 2, _A9_HZ,
        board_target("pynq-z2"), "@",
        2 * _A9_MEMCPY, _A9_MEMCPY, 2 * _A9_MEMCPY, _LAUNCH_ACCESSES * _MMIO_A9, _MMIO_A9,
        {"memcpy": "https://github.com/bmartini/zynq-xdma/issues/10 (Zedboard, Zynq-7020: "
                   "memcpy ~256 MB/s)",
         "mmio": "https://discuss.pynq.io/t/mmio-write-is-too-slow/389 (PYNQ-Z1: 5,600 "
                 "MMIO.write in 150-200 ms, ~32 us each)",
         "ddr_peak": "references.md: PYNQ DDR3 16-bit at 1050 Mb/s, 2.1 GB/s peak (the "
                     "CPU reaches about a quarter of it)"}),
    "cortex-a53": BoardCpu(
        "cortex-a53", "4x ARM Cortex-A53 at 1.2 GHz, NEON (ZCU104, Zynq UltraScale+)", 4,
        _A53_HZ, board_target("zcu104"), "//",
        2 * _A53_MEMCPY, _A53_MEMCPY, 2 * _A53_MEMCPY,
        _LAUNCH_ACCESSES * _MMIO_A9 * _A9_HZ / _A53_HZ, _MMIO_A9 * _A9_HZ / _A53_HZ,
        {"memcpy": "https://github.com/ikwzm/udmabuf/issues/16 (Zynq UltraScale+: cached "
                   "DMA-buffer copy 800 MB/s)",
         "mmio": "the PYNQ-Z1 Python MMIO figure (discuss.pynq.io/t/389) scaled by the clock "
                 "ratio 650 MHz / 1.2 GHz: an estimate, not a measurement"}),
}


# --------------------------------------------------------------- the IR rewrites
_LABEL = re.compile(r'^(?:"[^"]+"|[-\w.$]+):')
_SKIP_AT_TOP = re.compile(r"^\s+%\S+ = (?:phi|landingpad) ")


def _insert_per_block(ir: str, make: Callable[[int], list[str]]) -> tuple[str, int]:
    """``ir`` with ``make(i)``'s lines inserted at the top of every basic block (after
    its label and phis) of every defined function, blocks numbered over the module; and
    how many blocks there are."""
    out, n, pending = [], 0, False
    for line in ir.splitlines():
        body = line.strip()
        if pending and body and not body.startswith(";") and not _LABEL.match(line) \
                and not _SKIP_AT_TOP.match(line):
            out.extend(make(n))
            n, pending = n + 1, False
        out.append(line)
        if line.startswith("define ") or (_LABEL.match(line) and not line.startswith("@")):
            pending = True
    return "\n".join(out) + "\n", n


def counted(ir: str) -> tuple[str, int]:
    """The IR with a counter per basic block (``@__tcount[i]`` += 1 on entry)."""
    def make(i: int) -> list[str]:
        slot = f"getelementptr inbounds ([{{N}} x i64], ptr @__tcount, i32 0, i32 {i})"
        return [f"  %__tc{i} = load i64, ptr {slot}",
                f"  %__tc{i}n = add i64 %__tc{i}, 1",
                f"  store i64 %__tc{i}n, ptr {slot}"]
    text, n = _insert_per_block(ir, make)
    text = text.replace("{N}", str(n))
    return text + f"@__tcount = global [{n} x i64] zeroinitializer\n", n


_MD = 1 << 20          # first metadata number of ours (the optimiser's are small)


def located(ir: str) -> str:
    """The IR with a debug location on every instruction whose line is its block's
    number + 1, so the assembly's ``.loc`` directives say which block each machine
    instruction comes from (line tables only: the code is unchanged)."""
    out, block, functions, entry_open, in_table = [], -1, 0, False, False
    for line in ir.splitlines():
        if in_table or line.rstrip().endswith("["):      # a switch's case table
            in_table = line.strip() != "]"
            out.append(line + (f", !dbg !{_MD + 1000 + block}" if not in_table else ""))
            continue
        if line.startswith("define ") and line.rstrip().endswith("{"):
            functions += 1
            out.append(line.rstrip()[:-1] + f"!dbg !{_MD + 10 + functions} {{")
            block += 1                                  # the entry block
            entry_open = True
            continue
        if _LABEL.match(line) and not line.startswith("@"):
            if not entry_open:
                block += 1
            entry_open = False
        elif line.startswith("  ") and not line.lstrip().startswith(";") and functions:
            entry_open = False
            line += f", !dbg !{_MD + 1000 + block}"
        elif line.startswith("}"):
            entry_open = False
        out.append(line)
    meta = [f"!llvm.dbg.cu = !{{!{_MD + 1}}}",
            f"!llvm.module.flags = !{{!{_MD}}}",
            f'!{_MD} = !{{i32 2, !"Debug Info Version", i32 3}}',
            f"!{_MD + 1} = distinct !DICompileUnit(language: DW_LANG_C99, file: !{_MD + 2}, "
            'producer: "tessera", isOptimized: true, runtimeVersion: 0, '
            "emissionKind: LineTablesOnly)",
            f'!{_MD + 2} = !DIFile(filename: "kernel.c", directory: "/")',
            f"!{_MD + 3} = !DISubroutineType(types: !{{}})"]
    meta += [f'!{_MD + 10 + f} = distinct !DISubprogram(name: "f{f}", scope: !{_MD + 2}, '
             f"file: !{_MD + 2}, line: 1, type: !{_MD + 3}, spFlags: DISPFlagDefinition | "
             f"DISPFlagOptimized, unit: !{_MD + 1})" for f in range(1, functions + 1)]
    scopes = _block_scopes(ir)
    meta += [f"!{_MD + 1000 + b} = !DILocation(line: {b + 1}, scope: !{_MD + 10 + f})"
             for b, f in enumerate(scopes)]
    return "\n".join(out) + "\n" + "\n".join(meta) + "\n"


def _block_scopes(ir: str) -> list[int]:
    """The function number (from 1) of every basic block, in module order (numbered as
    :func:`_insert_per_block` and :func:`located` number them)."""
    text, _ = _insert_per_block(ir, lambda i: [f"  ;BLOCK {i}"])
    scopes, fn = [], 0
    for line in text.splitlines():
        if line.startswith("define "):
            fn += 1
        elif line.startswith("  ;BLOCK "):
            scopes.append(fn)
    return scopes


# ------------------------------------------------------------------ analysis
class BoardJit(Jit):
    """The runtime's JIT pipeline (``Jit.optimize``) for a board's target."""

    def __init__(self, board: BoardCpu) -> None:        # no cache, no host engine
        self.target = board.target
        self._tm = _target_machine(board.target)

    def optimize(self, ir: str, target: CpuTarget | None = None) -> llvm.ModuleRef:
        return super().optimize(ir, target or self.target)


def _on_this_machine(ir: str, tm: llvm.TargetMachine, rep: Representative
                     ) -> tuple[llvm.ExecutionEngine, "ctypes._CFuncPtr", list[np.ndarray]]:
    """``ir`` (optimised already) compiled for this machine with ``tm``, its entry, and
    random arguments of ``rep``'s shapes (keep the engine alive while calling)."""
    ir = re.sub(r'target datalayout = "[^"]*"', f'target datalayout = "{tm.target_data}"', ir)
    ir = re.sub(r'target triple = "[^"]*"', f'target triple = "{tm.triple}"', ir)
    module = llvm.parse_assembly(ir)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, tm)
    engine.finalize_object()
    rng = np.random.default_rng(0)
    args = [rng.integers(-100, 100, s.shape).astype(s.numpy_dtype) for s in rep.kernel.inputs]
    args += [np.zeros(s.shape, s.numpy_dtype) for s in rep.kernel.outputs]
    fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(args))(
        engine.get_function_address(rep.kernel.entry))
    return engine, fn, args


def block_counts(rep: Representative, optimised: str) -> np.ndarray:
    """How often each block of ``optimised`` runs in one call of ``rep``'s entry, run
    retargeted to this machine on random inputs."""
    text, n = counted(optimised)
    tm = llvm.Target.from_default_triple().create_target_machine(opt=0)
    engine, fn, args = _on_this_machine(text, tm, rep)
    fn(*[a.ctypes.data for a in args])
    counts = (ctypes.c_int64 * n).from_address(engine.get_global_value_address("__tcount"))
    return np.array(counts[:], dtype=np.int64)


def block_instructions(asm: str, comment: str, entry: str) -> dict[int, list[str]]:
    """Each block's machine instructions in the assembly of function ``entry``, by the
    ``.loc`` line before them (line 0, code of no block, belongs to the block before)."""
    start = asm.index(f"\n{entry}:")
    end = asm.index(".Lfunc_end", start)
    blocks: dict[int, list[str]] = {}
    current = None
    for line in asm[start:end].splitlines()[1:]:
        text = line.split(comment, 1)[0].strip()
        loc = re.match(r"\.loc\s+\d+\s+(\d+)", text)
        if loc:
            if int(loc.group(1)):
                current = int(loc.group(1)) - 1
                blocks.setdefault(current, [])
        elif text and not text.startswith(".") and not text.endswith(":") \
                and current is not None:
            blocks[current].append(text)
    return blocks


#: Cycles of a library call the kernels' board code makes (llvm-mca times the branch, not
#: the callee): libm's fmaxf/roundevenf/fmaf (the Cortex-A9's VFPv3 has no vmaxnm, vrint or
#: fused multiply-add, so LLVM calls libm) estimated at 30 cycles; memcpy's bytes are in the
#: memory floor. An estimate, not a measurement.
CALL_CYCLES = {"": 30.0, "memcpy": 0.0, "memmove": 0.0, "memset": 0.0}

#: Instructions llvm-mca (14) cannot time on a CPU: with the Cortex-A9's itinerary model
#: it aborts on some sequences (each instruction alone times fine). A block it aborts on is
#: timed in halves, recursively (their sum: a little overlap lost); a single instruction
#: it cannot time costs a cycle and is listed in the model's details.
UNTIMED: dict[tuple[str, ...], set[str]] = {}
SPLIT_BLOCKS: dict[tuple[str, ...], int] = {}


def _mca(mca_args: tuple[str, ...], code: str) -> float | None:
    run = subprocess.run([MCA, *mca_args, f"-iterations={MCA_ITERATIONS}"],
                         input=code + "\n", capture_output=True, text=True, check=False)
    found = re.search(r"Total Cycles:\s+(\d+)", run.stdout)
    return int(found.group(1)) / MCA_ITERATIONS if run.returncode == 0 and found else None


@lru_cache(maxsize=None)
def mca_cycles(mca_args: tuple[str, ...], code: str) -> float:
    """llvm-mca's steady-state cycles per execution of ``code`` (for the CPU
    ``mca_args`` name); see ``UNTIMED`` for code it aborts on."""
    cycles = _mca(mca_args, code)
    if cycles is not None:
        return cycles
    lines = code.splitlines()
    if len(lines) == 1:
        UNTIMED.setdefault(mca_args, set()).add(lines[0].split()[0])
        return 1.0
    SPLIT_BLOCKS[mca_args] = SPLIT_BLOCKS.get(mca_args, 0) + 1
    half = len(lines) // 2
    return (mca_cycles(mca_args, "\n".join(lines[:half]))
            + mca_cycles(mca_args, "\n".join(lines[half:])))


def modelled_seconds(rep: Representative, board: BoardCpu, jit: BoardJit) -> dict:
    """The call's modelled time on ``board``: compute (blocks' counts x llvm-mca cycles)
    and the DRAM floor, the larger of the two."""
    optimised = str(jit.optimize(rep.kernel.ir))
    counts = block_counts(rep, optimised)
    asm = jit._tm.emit_assembly(llvm.parse_assembly(located(optimised)))
    blocks = block_instructions(asm, board.comment, rep.kernel.entry)
    cycles = calls = 0.0
    called = set()
    for i, lines in blocks.items():
        if lines and counts[i]:
            cycles += int(counts[i]) * mca_cycles(board.mca_args, "\n".join(lines))
            targets = [ln.split()[1] for ln in lines if ln.split()[0] in ("bl", "blx")]
            calls += int(counts[i]) * sum(CALL_CYCLES.get(t, CALL_CYCLES[""]) for t in targets)
            called.update(targets)
    compute = (cycles + calls) / board.hz
    memory = rep.work.bytes / board.dram_bytes_per_second
    return {"seconds": board.dispatch_seconds + max(compute, memory), "compute": compute,
            "memory": memory, "cycles": cycles, "call_cycles": calls,
            "calls": sorted(called)}


# ---------------------------------------------------------------------- driver
def tool_versions() -> dict:
    mca = subprocess.run([MCA, "--version"], capture_output=True, text=True).stdout
    return {"llvm-mca": " ".join(mca.split()[:4]), "llvmlite": llvmlite.__version__,
            "llvmlite LLVM": ".".join(map(str, llvm.llvm_version_info))}


def build_model(board: BoardCpu, quick: bool = False) -> HostModel:
    """Analyse every representative for ``board`` and fit each kind."""
    jit = BoardJit(board)
    kernels, kinds = {}, {}
    with building_for_vector_bits(board.target.vector_bits):
        calls = representatives(quick)
    for kind, reps in calls.items():
        results = []
        for rep in reps:
            r = modelled_seconds(rep, board, jit)
            bound = "memory" if r["memory"] > r["compute"] else "compute"
            print(f"  {board.name} {kind:<15} {rep.label:<32} {r['seconds'] * 1e6:10.1f} us "
                  f"({bound}{', calls ' + ','.join(r['calls']) if r['calls'] else ''})",
                  flush=True)
            results.append(r)
        kernels[kind], residual = fit_kernel_cost([r.work for r in reps],
                                                  [r["seconds"] for r in results])
        kinds[kind] = {**residual, "calls": [
            {"label": rep.label, "work": rep.work.to_dict(),
             **{k: v for k, v in r.items() if k != "calls"}}
            for rep, r in zip(reps, results)]}
    source = ("llvm-mca analysis of the CPU kernels' code for this CPU (benchmarks/"
              f"host_models.py): {board.target.triple} -mcpu={board.target.cpu}, the "
              f"runtime's O3 pipeline on IR for {board.target.vector_bits}-bit vectors; "
              "per-block dynamic counts from an instrumented run, cycles per block "
              "from llvm-mca, max with a DRAM floor at the CPU's published memcpy rate; NNLS "
              "fit per kind. Launch, copy and flush from published measurements "
              "(details.sources)")
    details = {"kinds": kinds, "tools": tool_versions(),
               "untimed_instructions": sorted(UNTIMED.get(board.mca_args, ())),
               "blocks_timed_in_parts": SPLIT_BLOCKS.get(board.mca_args, 0), "sources": board.sources,
               "clock_hz": board.hz, "dram_bytes_per_second": board.dram_bytes_per_second,
               "launch": f"{_LAUNCH_ACCESSES} MMIO accesses per segment",
               "dispatch_seconds": board.dispatch_seconds,
               "dispatch": "each modelled call includes the runtime's Python-to-native call, "
                           "priced as one Python MMIO access (details.sources.mmio)",
               "call_cycles": CALL_CYCLES,
               "flush": "cache clean/invalidate priced as writing the bytes back at the "
                        "CPU's DRAM traffic rate (an assumption: no published figure)"}
    return HostModel(board.name, board.cpu, board.cores, kernels, board.launch_seconds,
                     board.copy_bytes_per_second, board.flush_bytes_per_second, source,
                     details)


def check_table(model: HostModel) -> str:
    """Per kind and call: the modelled time against the fitted regression's."""
    lines = [f"{'kind':<15}{'call':<34}{'modelled us':>12}{'fitted us':>11}{'ratio':>7}"]
    for kind, info in model.details["kinds"].items():
        for call in info["calls"]:
            fitted = model.kernels[kind].seconds(Work.from_dict(call["work"]))
            lines.append(f"{kind:<15}{call['label']:<34}{call['seconds'] * 1e6:>12.1f}"
                         f"{fitted * 1e6:>11.1f}{fitted / call['seconds']:>7.2f}")
    return "\n".join(lines)


def _cpu_mhz() -> float:
    """This machine's nominal clock (``/proc/cpuinfo``), in MHz."""
    text = Path("/proc/cpuinfo").read_text()
    return float(re.search(r"cpu MHz\s*:\s*([\d.]+)", text).group(1))


def validate_on_this_machine(quick: bool) -> None:
    """The method checked where it can be measured: every representative compiled for
    znver3 (which llvm-mca 14 models), its time modelled as for a board (no memory floor,
    no dispatch) and measured here by calling the same machine code."""
    znver3 = CpuTarget("znver3", llvm.get_process_triple(), "znver3", "+avx2,+fma")
    host = BoardCpu("this machine", "", 1, _cpu_mhz() * 1e6, znver3, "#",
                    float("inf"), 1.0, 1.0, 0.0, 0.0, {})
    jit = BoardJit(host)
    print(f"method check on this machine (znver3 code, {host.hz / 1e6:.0f} MHz nominal)")
    print(f"{'kind':<15}{'call':<34}{'modelled us':>12}{'measured us':>12}{'ratio':>7}")
    ratios = []
    with building_for_vector_bits(znver3.vector_bits):
        calls = representatives(quick)
    for kind, reps in calls.items():
        for rep in reps:
            model = modelled_seconds(rep, host, jit)["seconds"]
            fresh = BoardJit(host)._tm            # the engine takes its target machine
            engine, fn, args = _on_this_machine(str(jit.optimize(rep.kernel.ir)), fresh, rep)
            ptrs = [a.ctypes.data for a in args]
            measured = time_call(lambda: fn(*ptrs), 5, 0.005)
            del engine
            ratios.append(model / measured)
            print(f"{kind:<15}{rep.label:<34}{model * 1e6:>12.1f}{measured * 1e6:>12.1f}"
                  f"{model / measured:>7.2f}", flush=True)
    r = np.array(ratios)
    print(f"modelled / measured: median {np.median(r):.2f}, geometric mean "
          f"{np.exp(np.mean(np.log(r))):.2f}, range {r.min():.2f}-{r.max():.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(FIGURES), help="one board CPU")
    ap.add_argument("--out", default=os.path.join(ROOT, "tessera", "hostmodels"))
    ap.add_argument("--quick", action="store_true", help="2 small sizes per kernel")
    ap.add_argument("--dry-run", action="store_true", help="print, write nothing")
    ap.add_argument("--validate", action="store_true",
                    help="check the method against measurements on this machine, and stop")
    args = ap.parse_args()
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    if args.validate:
        validate_on_this_machine(args.quick)
        return
    for name in [args.only] if args.only else sorted(FIGURES):
        print(f"analysing the kernels for {name} ...", flush=True)
        model = build_model(FIGURES[name], args.quick)
        print(describe(model))
        print(check_table(model))
        if not args.dry_run:
            print("wrote", model.save(Path(args.out) / f"{name}.json"))


if __name__ == "__main__":
    main()
